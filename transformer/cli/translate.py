"""--mode=translate: --input (or stdin), one sentence a line -> --output (or stdout).

Needs a run trained on pairs in --workdir: an encoder-decoder, or a decoder trained as
a prefix LM on them (model.objective="prefix_lm"; the source is its prompt) (inference/loaded.py says what comes from
where); the decode flags (cli/common.py) set single decode.* fields.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping, TextIO

import jax
import ml_collections
from absl import logging

from transformer.cli import common
from transformer.inference import loaded
from transformer.inference import text
from transformer.workdir import progress as progress_lib

STARTS_JAX = True
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("input", "output", "overwrite", "seed", *common.LOADING_FLAGS)


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=translate."""
  translate(workdir, input_path=common.INPUT.value, output_path=common.OUTPUT.value,
            overwrite=common.OVERWRITE.value, seed=common.SEED.value,
            **common.loading_flags(config))


def translate(workdir: str, *, input_path: str = "", output_path: str = "",
              overwrite: bool = False, config: ml_collections.ConfigDict | None = None,
              checkpoint_step: int | None = None, average_last: int = 0,
              decode_overrides: Mapping[str, Any] | None = None,
              model_overrides: Mapping[str, Any] | None = None, seed: int | None = None,
              stdin: TextIO | None = None, stdout: TextIO | None = None) -> list[str]:
  """Translates one sentence per line with a model trained on pairs.

  Sources are ids + [eos] as in training (a decoder's prompt [bos] ids [eos]), at most
  min(data.seq_len, model.max_len) tokens (half of it for a decoder): a longer line is truncated with a warning naming it, or stops the command
  (decode.overlong). Beam search by default (decode.beam_size 4, alpha 0.6, output
  length at most source + decode.max_length_offset). Lines are decoded in
  length-sorted batches of decode.batch_size and written back in input order; an
  empty line gives an empty line.

  Args:
    workdir: the run's workdir.
    input_path: a UTF-8 file (or pipe), one sentence per line; "" reads stdin. A
      leading byte-order mark is dropped (common.read_lines).
    output_path: where translations go, one per line; "" prints them. Never the
      input; an existing file only with `overwrite`. Written at the end, atomically.
    overwrite: allow replacing an existing output file.
    config, checkpoint_step, average_last, decode_overrides, model_overrides, seed: as
      for `generate`.
    stdin, stdout: the streams for "" paths (default sys.stdin / sys.stdout).

  Returns:
    The translations, in input order.

  Raises:
    ConfigError: a model not trained on pairs, a missing input, an output that exists (or
      is the input), or an overlong line with decode.overlong='error'.
  """
  if output_path:
    common.check_output(output_path, overwrite, [input_path])
  # Read (and checked: UTF-8, naming a bad line and byte) before the model loads.
  lines = common.read_lines(input_path, stdin or sys.stdin)
  run = loaded.load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                 average_last=average_last, decode_overrides=decode_overrides,
                 model_overrides=model_overrides)
  run.require("translate", lambda o: o.translates, "translates sentences")
  policy = text.source_policy(run.config, run.config.decode.overlong)
  progress = progress_lib.Progress("translate", len(lines), "sentences") if input_path else None
  logging.info("Translating %d lines (%s; batches of %d)", len(lines),
               ", ".join(f"{k} {v}" for k, v in
                         text.describe_search(run.config.decode).items()),
               run.config.decode.batch_size)
  with run.context():
    outputs = text.translate_texts(
        run.model_config, run.params, run.tokenizer, lines, run.config.decode, policy,
        names=[f"line {i + 1}" for i in range(len(lines))], rng=run.sampling_rng(seed),
        progress=progress)
  if progress:
    progress.finish()
  if jax.process_index() == 0:
    # One line per input line, whatever the model emits (byte and character models can
    # produce a newline).
    result = "".join(line.replace("\r", " ").replace("\n", " ") + "\n" for line in outputs)
    common.write_result(result, len(outputs), "translations", output_path, overwrite, input_path,
                        stdout)
  return outputs
