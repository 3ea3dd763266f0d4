"""--mode=passkey: passkey retrieval of a decoder LM at --passkey_lengths x --passkey_depths
-> a table, JSON and a heat map PNG.

The prompts and the scoring are inference/passkey.py's (synthetic, generated offline
from the run's tokenizer, deterministic in --seed; greedy decoding of the key, computed
by teacher forcing). Prints a table (a row per length, a column per depth, the
fraction of keys retrieved) and writes the JSON (--output, default
`<workdir>/passkey_step<N>[_<key>-<value>...].json`) and a heat map PNG beside it.
The model may be evaluated with its RoPE scaling changed for the command
(--config=... --config.model.rope_scaling=linear --config.model.rope_scaling_factor=4,
inference/loaded.py's model overrides).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping, Sequence, TextIO

import jax
import ml_collections
from absl import flags
from absl import logging

from transformer.cli import common
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.inference import loaded
from transformer.inference import passkey
from transformer.reports import long_context
from transformer.workdir import files
from transformer.workdir import progress as progress_lib

LENGTHS = flags.DEFINE_list(
    "passkey_lengths", [], "passkey: the context lengths to test, in tokens the model "
    "reads, e.g. 256,512,1024.")
DEPTHS = flags.DEFINE_list(
    "passkey_depths", ["0", "0.25", "0.5", "0.75", "1"], "passkey: where the key sits in "
    "the filler, each in [0, 1] (0: first, 1: last).")
TRIALS = flags.DEFINE_integer("passkey_trials", 10, "passkey: prompts (keys) per length "
                              "and depth.")
DIGITS = flags.DEFINE_integer("passkey_digits", 5, "passkey: characters in a key.")
ALPHABET = flags.DEFINE_string(
    "passkey_alphabet", passkey.DIGITS, "passkey: the characters keys are drawn from (each "
    "must have a token in the run's vocabulary; a character model of Tiny Shakespeare "
    "has no digits but '3': use letters).")
STARTS_JAX = True
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("output", "overwrite", "seed", "checkpoint_step", "average_last",
                "decode_batch_size")


def _numbers(values: Sequence[str], flag: str, kind: type) -> list[Any]:
  try:
    return [kind(v) for v in values]
  except ValueError:
    raise ConfigError(f"{flag}={','.join(values)!r}: expected comma-separated "
                      f"{'integers' if kind is int else 'numbers'}") from None


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=passkey."""
  run_passkey(workdir, lengths=_numbers(LENGTHS.value, "--passkey_lengths", int),
              depths=_numbers(DEPTHS.value, "--passkey_depths", float),
              trials=TRIALS.value, digits=DIGITS.value, alphabet=ALPHABET.value,
              output=common.OUTPUT.value, overwrite=common.OVERWRITE.value,
              seed=common.SEED.value, **common.loading_flags(config))


def result_path(workdir: str, steps: Sequence[int], variant: Mapping[str, Any]) -> str:
  """`<workdir>/passkey_step<step>[_avg<N>][_<key>-<value>...].json`."""
  name = f"passkey_step{steps[-1]}" + (f"_avg{len(steps)}" if len(steps) > 1 else "")
  for key, value in variant.items():
    name += f"_{key}-{value}"
  return os.path.join(workdir, name + ".json")


def heatmap_path(path: str) -> str:
  """The heat map PNG beside the JSON at `path`."""
  return path.removesuffix(".json") + ".png"


def run_passkey(workdir: str, *, lengths: Sequence[int], depths: Sequence[float],
                trials: int = 10, digits: int = 5, alphabet: str = passkey.DIGITS,
                config: ml_collections.ConfigDict | None = None,
                checkpoint_step: int | None = None, average_last: int = 0,
                decode_overrides: Mapping[str, Any] | None = None,
                model_overrides: Mapping[str, Any] | None = None, output: str = "",
                overwrite: bool = False, seed: int | None = None,
                stdout: TextIO | None = None) -> dict[str, Any]:
  """Scores passkey retrieval over lengths x depths; prints the table, writes JSON and PNG.

  Args:
    workdir: a decoder LM's workdir (a training run or an import).
    lengths: context lengths in tokens (what the model reads, as data.seq_len).
    depths: where the needle goes in the filler, each in [0, 1].
    trials: prompts (keys) per (length, depth).
    digits, alphabet: each key is `digits` characters drawn from `alphabet`.
    config, checkpoint_step, average_last, decode_overrides, model_overrides: as for
      loaded.load_run (decode.batch_size is the rows scored together).
    output: the JSON path; "" means `result_path` in the workdir.
    overwrite: allow replacing an existing result.
    seed: the keys' seed; None: the run's config.seed.
    stdout: where the table goes (default sys.stdout).

  Returns:
    The JSON record: settings, the scoring method and one cell per (length, depth).
  """
  # The settings first, against the model's config alone: a bad flag costs no loading.
  passkey.check_settings(lengths, depths, trials, digits,
                         loaded.load_config(workdir, config, model_overrides).model)
  run = loaded.load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                        average_last=average_last, decode_overrides=decode_overrides,
                        model_overrides=model_overrides)
  objective = objective_lib.resolve(run.config.model)
  if not objective.generates:
    raise ConfigError(f"--mode=passkey needs a decoder LM (model.arch='decoder', "
                      f"head='lm'); {workdir} holds a {objective.name} model")
  passkey.check_alphabet(run.tokenizer, alphabet, "--passkey_alphabet")
  variant = loaded.changed_model_fields(workdir, run.config)
  path = output or result_path(workdir, run.steps, variant)
  common.check_output(path, overwrite, given=bool(output))
  seed = run.config.seed if seed is None else seed
  prompts = passkey.make_prompts(run.tokenizer, lengths, depths, trials, seed, digits,
                                 alphabet)
  trained = loaded.load_config(workdir).data.seq_len
  if max(lengths) > trained:
    logging.info("Lengths past the %d tokens %s trained on: the model extrapolates there",
                 trained, workdir)
  progress = progress_lib.Progress("passkey", len(prompts), "prompts")
  with run.context():
    scorer = passkey.make_scorer(run.model_config, max(p.key_tokens for p in prompts))
    results = passkey.score_prompts(scorer, run.params, prompts, run.config.decode.batch_size,
                                    progress)
  progress.finish()
  cells = passkey.summarize_cells(prompts, results)
  record = {
      "workdir": os.path.abspath(workdir), "checkpoint_steps": run.steps,
      "scoring": "greedy: a key is retrieved when every one of its tokens is the argmax "
                 "given the prompt and the key's earlier tokens; key_logprob is log p of "
                 "the whole key (nats)",
      "seed": seed, "trials": trials, "digits": digits, "alphabet": alphabet,
      "lengths": list(lengths), "depths": list(depths), "trained_len": trained,
      "accuracy": sum(r[0] for r in results) / len(results), "cells": cells,
      "heatmap": heatmap_path(path)}
  if variant:
    record["changed"] = variant
  if jax.process_index() == 0:
    common.check_output(path, overwrite, given=bool(output))
    changed = ", ".join(f"{k} {v}" for k, v in variant.items())
    heatmap = long_context.passkey_heatmap_png(
        cells, f"passkey: {os.path.basename(os.path.normpath(workdir))} "
        f"step {run.step}" + (f" ({changed})" if changed else ""))
    # Both or neither: a full disk at the PNG left the JSON, and the rerun "exists".
    files.write_together([(record["heatmap"], heatmap),
                          (path, json.dumps(record, indent=2) + "\n")], flag="--output",
                         keep_existing=() if overwrite else (path,))
    _print_result(record, run, path, stdout or sys.stdout)
  return record


def _print_result(record: dict[str, Any], run: loaded.LoadedRun, path: str,
                  out: TextIO) -> None:
  changed = "".join(f", {k}={v}" for k, v in record.get("changed", {}).items())
  lines = [f"passkey retrieval, {run.checkpoint_label()} of {record['workdir']}{changed} "
           f"(trained at {record['trained_len']} tokens; {record['trials']} keys of "
           f"{record['digits']} characters a cell, greedy):"]
  lines += long_context.passkey_table(record["cells"])
  lines += [f"  overall accuracy {record['accuracy']:.3f}", f"Wrote {record['heatmap']}",
            f"Wrote {path}"]
  out.write("\n".join(lines) + "\n")
  out.flush()

