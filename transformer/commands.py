"""From a workdir to a number: launch.py's evaluate, translate, generate and average modes.

What comes from where:
  - `<workdir>/config.json` (written resolved by train_and_evaluate): model.* and
    everything else, with configs/base.py's defaults for keys the run predates; its
    mesh.* too, unless its fixed sizes do not fit the devices here (then all devices
    go data-parallel);
  - `<workdir>/tokenizer.json` and the vocabulary file it names: the tokenizer, always;
  - `<workdir>/checkpoints/<step>/state`: the parameters only, of the newest step, the
    one asked for, or the mean of the newest N (`average_last`, the paper's averaging);
  - an optional config (launch.py --config): its data.* (another dataset or split,
    batch size, seq_len; not the tokenizer fields) and decode.* replace the run's;
  - `decode_overrides` (launch.py's --beam_size, ...): single decode.* fields, over either.

Nothing in the workdir is overwritten or deleted; only `evaluate` adds a file there,
its result, and it refuses to replace an existing one without `overwrite`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Mapping, Sequence, TextIO

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from configs import base
from transformer import checkpointing
from transformer import evaluation
from transformer import sharding
from transformer import train
from transformer.configuration import ConfigError, objective_of, validate, validate_decode
from transformer.data import catalog
from transformer.data import pipeline
from transformer.data import sources
from transformer.data import tokenizers

CONFIG_FILE = "config.json"
AVERAGE_RECORD = "averaged.json"  # In a workdir written by `average`: where its params came from.
# data.* fields that make the tokenizer; a run's own vocabulary always wins over them.
TOKENIZER_FIELDS = ("tokenizer", "spm_vocab_size", "spm_model_type", "spm_train_sentences")


# ---------------------------------------------------------------- a run from its workdir


def _as_tuples(value: Any, like: Any) -> Any:
  """JSON lists back to the tuples the base config declares (mesh.shape, mesh.rules)."""
  if isinstance(like, tuple) and isinstance(value, list):
    return tuple(_as_tuples(v, ()) if isinstance(v, list) else v for v in value)
  return value


def load_config(workdir: str,
                config: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """The run's config from `<workdir>/config.json`, with `config`'s data.* and decode.*.

  Keys config.json lacks (a run older than a key) take configs/base.py's default.

  Args:
    workdir: a run's workdir.
    config: optional: its data.* (except the tokenizer fields) and decode.* replace
      the run's.

  Returns:
    A validated, locked ConfigDict.

  Raises:
    ConfigError: no config.json, a key configs/base.py does not declare, an invalid value.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise ConfigError(f"{os.path.abspath(workdir)} has no {CONFIG_FILE}: expected the workdir "
                      "of a training run (python launch.py --config=... --workdir=DIR writes "
                      "it at start)")
  try:
    with open(path, encoding="utf-8") as f:
      stored = json.load(f)
  except ValueError as e:
    raise ConfigError(f"{path} is not valid JSON ({e}); training writes it whole at every "
                      "start, so it was edited or damaged: restore it (e.g. rerun the "
                      "training command with --config)") from e
  if not isinstance(stored, dict):
    raise ConfigError(f"{path} holds a {type(stored).__name__}, expected the JSON object "
                      "training writes")
  result = base.get_config()
  for section, values in stored.items():
    if section not in result:
      raise ConfigError(f"{path}: key {section!r} is not declared in configs/base.py")
    if not isinstance(values, dict):
      result[section] = values
      continue
    for key, value in values.items():
      if key not in result[section]:
        raise ConfigError(f"{path}: key {section}.{key} is not declared in configs/base.py")
      result[section][key] = _as_tuples(value, result[section][key])
  if config is not None:
    logging.info("Using the given config's data.* and decode.*; the model and everything "
                 "else come from %s", path)
    run_tokenizer = {k: result.data[k] for k in TOKENIZER_FIELDS}
    result.data.update(config.data.to_dict())
    result.decode.update(config.decode.to_dict())
    for key, value in run_tokenizer.items():
      if result.data[key] != value:
        logging.warning("config.data.%s=%r ignored: the run's vocabulary (%r) is used",
                        key, result.data[key], value)
      result.data[key] = value
  if not result.model.vocab_size:
    raise ConfigError(f"{path} has model.vocab_size=0; train_and_evaluate writes it "
                      "resolved, so this file was not written by a training run")
  validate(result)  # decode.* included.
  return result


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps of the complete checkpoints under `<workdir>/checkpoints`, oldest first."""
  directory = epath.Path(os.path.abspath(workdir)) / "checkpoints"
  if not directory.is_dir():
    return []
  # Finalised steps only: a save still in flight (or killed) has a temporary name.
  return sorted(ocp.utils.step_from_checkpoint_name(p.name)
                for p in ocp.utils.checkpoint_steps_paths(directory))


def select_steps(workdir: str, steps: Sequence[int], checkpoint_step: int | None,
                 average_last: int, checkpoint: ml_collections.ConfigDict) -> list[int]:
  """The checkpoint steps to use: the newest (or `checkpoint_step`) and the N - 1 before it.

  Args:
    workdir: for messages.
    steps: the steps that exist (`checkpoint_steps`).
    checkpoint_step: the step to use (or to end the average at); None: the newest.
    average_last: N > 1 averages N checkpoints; 0 or 1: one checkpoint.
    checkpoint: the run's checkpoint.* (keep bounds how many exist; every spaces them).

  Returns:
    The selected steps, oldest first.

  Raises:
    ConfigError: no checkpoints, an unknown step, or fewer than `average_last`.
  """
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  if not steps:
    raise ConfigError(f"{directory} holds no complete checkpoint: train first (a run saves "
                      "every checkpoint.every steps and at its end)")
  listed = ", ".join(map(str, steps))
  if checkpoint_step is None:
    end = len(steps)
  elif checkpoint_step in steps:
    end = steps.index(checkpoint_step) + 1
  else:
    raise ConfigError(f"--checkpoint_step={checkpoint_step}: {directory} has no such "
                      f"checkpoint; its steps are {listed}")
  if average_last < 0:
    raise ConfigError(f"--average_last={average_last} must be >= 0 (0 or 1: no averaging)")
  count = max(average_last, 1)
  if count > end:
    upto = "" if checkpoint_step is None else f" up to step {checkpoint_step}"
    if len(steps) >= checkpoint.keep:
      why = (f"a run keeps only its newest checkpoint.keep={checkpoint.keep}. Train with "
             f"--config.checkpoint.keep={count} (or more) to keep enough")
    else:
      why = (f"the run saved no more (one every checkpoint.every={checkpoint.every} steps and "
             f"at its end; checkpoint.keep={checkpoint.keep} would keep {checkpoint.keep})")
    raise ConfigError(
        f"--average_last={average_last} needs {count} checkpoints but {directory} holds "
        f"{end}{upto} (steps {', '.join(map(str, steps[:end]))}): {why}. Average at most "
        f"{end}.")
  return list(steps[end - count:end])


def _make_mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """The run's mesh; all devices data-parallel when its fixed sizes do not fit here."""
  try:
    return sharding.make_mesh(config.mesh)
  except ConfigError as e:
    logging.warning("%s; using the %d devices here data-parallel instead", e,
                    jax.device_count())
    config.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))
    return sharding.make_mesh(config.mesh)


@dataclasses.dataclass
class LoadedRun:
  """A trained model ready to use: config, compiled pieces, parameters and tokenizer."""

  workdir: str
  config: ml_collections.ConfigDict
  trainer: train.Trainer
  params: Any
  tokenizer: tokenizers.Tokenizer
  steps: list[int]  # The checkpoint(s) the params come from (several: their mean).

  @property
  def step(self) -> int:
    return self.steps[-1]

  def checkpoint_label(self) -> str:
    """'checkpoint 400' or 'mean of checkpoints 200, 300, 400'."""
    if len(self.steps) == 1:
      return f"checkpoint {self.step}"
    return f"mean of checkpoints {', '.join(map(str, self.steps))}"


def load_run(workdir: str, *, config: ml_collections.ConfigDict | None = None,
             checkpoint_step: int | None = None, average_last: int = 0,
             decode_overrides: Mapping[str, Any] | None = None) -> LoadedRun:
  """Reads a run's config, tokenizer and parameters (see the module docstring for which from where).

  Args:
    workdir: the run's workdir.
    config: optional config whose data.* and decode.* replace the run's.
    checkpoint_step: the checkpoint to use; None: the newest.
    average_last: N > 1: the mean of the newest N checkpoints (up to checkpoint_step).
    decode_overrides: decode.* fields to set (launch.py's --beam_size, ...); None
      values are ignored.

  Returns:
    The LoadedRun, its parameters in the model's shardings.

  Raises:
    ConfigError: a missing config.json, tokenizer or checkpoint, an unknown step,
      too few checkpoints to average, or a checkpoint that does not fit the model.
  """
  config = load_config(workdir, config)
  overrides = {k: v for k, v in (decode_overrides or {}).items() if v is not None}
  if (overrides.get("temperature", 0) > 0 and overrides.get("beam_size", 1) > 1):
    raise ConfigError(f"--beam_size={overrides['beam_size']} with --temperature="
                      f"{overrides['temperature']}: beam search does not sample; give one")
  for key, value in overrides.items():
    if key not in config.decode:
      raise ConfigError(f"decode override {key!r} is not a decode.* field; valid: "
                        f"{sorted(config.decode)}")
    config.decode[key] = type(config.decode[key])(value)
  validate_decode(config)
  if config.decode.temperature > 0 and config.decode.beam_size > 1:
    logging.info("Sampling at temperature %s: decode.beam_size=%d is not used",
                 config.decode.temperature, config.decode.beam_size)
  steps = select_steps(workdir, checkpoint_steps(workdir), checkpoint_step, average_last,
                       config.checkpoint)
  tokenizer = sources.load_workdir_tokenizer(workdir)
  mesh = _make_mesh(config)
  trainer = train.Trainer.create(config, mesh)
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  for step in steps:  # Damage that shows without reading arrays (see checkpointing.py).
    problem = checkpointing.checkpoint_problem(os.path.join(directory, str(step)), ("state",))
    if problem:
      others = [s for s in checkpoint_steps(workdir) if s != step]
      raise ConfigError(f"checkpoint {step} in {directory} is damaged: {problem[1]}. Use "
                        "another one with --checkpoint_step=N"
                        + (f" (the others: {', '.join(map(str, others))})" if others else
                           " (there is no other)"))
  with trainer.context():
    params = checkpointing.average_params(
        [os.path.join(directory, str(step), "state") for step in steps],
        trainer.abstract_state.params, os.path.join(workdir, CONFIG_FILE))
  run = LoadedRun(workdir=workdir, config=config, trainer=trainer, params=params,
                  tokenizer=tokenizer, steps=steps)
  logging.info("Loaded %s of %s (%s, arch %s)", run.checkpoint_label(), workdir,
               objective_of(config.model.arch, config.model.head), config.model.arch)
  return run


def _require(run: LoadedRun, arch: str, head: str, mode: str, instead: str) -> None:
  model = run.config.model
  if (model.arch, model.head) != (arch, head):
    raise ConfigError(f"--mode={mode} needs a model with arch={arch!r}, head={head!r}; "
                      f"{run.workdir} holds arch={model.arch!r}, head={model.head!r}. "
                      f"{instead}")


def _rng(run: LoadedRun, seed: int | None) -> jax.Array | None:
  """The sampling key: --seed, else the run's config.seed; None when not sampling."""
  if run.config.decode.temperature <= 0:
    return None
  return jax.random.PRNGKey(run.config.seed if seed is None else seed)


def _read_lines(path: str, stream: TextIO) -> list[str]:
  """Lines of a UTF-8 file (or `stream` for ""), without line ends; '\\n'-separated only."""
  if path:
    if not os.path.isfile(path):
      raise ConfigError(f"--input={path!r} is not a file")
    with open(path, encoding="utf-8", newline="") as f:
      text = f.read()
  else:
    text = stream.read()
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # The final newline ends the last line; it does not start another.
  return [line[:-1] if line.endswith("\r") else line for line in lines]


def _check_output(path: str, overwrite: bool, inputs: Sequence[str] = ()) -> None:
  """Refuses to write over an input, or over an existing file without `overwrite`."""
  for other in inputs:
    if other and os.path.exists(path) and os.path.samefile(path, other):
      raise ConfigError(f"--output={path!r} is the input file; write elsewhere (the input is "
                        "never overwritten)")
  if os.path.exists(path) and not overwrite:
    raise ConfigError(f"--output={path!r} exists; pass --overwrite to replace it, or choose "
                      "another path")


def _write_atomically(path: str, text: str) -> None:
  """Writes `text` to `path` through a temporary file: no half-written result on a crash."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp_" + os.path.basename(path))
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would make results unreadable to others.
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


# ---------------------------------------------------------------- generate


def generate(workdir: str, prompts: Sequence[str] | None = None, *,
             config: ml_collections.ConfigDict | None = None,
             checkpoint_step: int | None = None, average_last: int = 0,
             decode_overrides: Mapping[str, Any] | None = None, seed: int | None = None,
             stdin: TextIO | None = None, stdout: TextIO | None = None) -> list[str]:
  """Continues prompts with a decoder LM and prints each continuation.

  Each prompt is [bos] + its ids, as training documents begin. The search follows
  decode.* (see evaluation.search_options): greedy for beam_size 1 at temperature 0,
  beam search for beam_size > 1, sampling (temperature, top_k, top_p) for
  temperature > 0; decode.max_new_tokens tokens at most.

  Args:
    workdir: the run's workdir.
    prompts: the texts to continue; None reads stdin, one prompt per line.
    config, checkpoint_step, average_last, decode_overrides: as for `load_run`.
    seed: the sampling seed; None: the run's config.seed.
    stdin: where prompts are read when `prompts` is None (default sys.stdin).
    stdout: where continuations are printed, one after another, each followed by a
      newline (default sys.stdout).

  Returns:
    The continuations, in prompt order.

  Raises:
    ConfigError: not a decoder LM, an empty prompt, or (decode.overlong='error') a
      prompt that does not fit the context with max_new_tokens.
  """
  run = load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                 average_last=average_last, decode_overrides=decode_overrides)
  _require(run, "decoder", "lm", "generate",
           "Use --mode=translate for an encoder-decoder.")
  if prompts is None:
    prompts = _read_lines("", stdin or sys.stdin)
    names = [f"stdin line {i + 1}" for i in range(len(prompts))]
  else:
    names = ["--prompt"] if len(prompts) == 1 else [f"prompt {i + 1}"
                                                     for i in range(len(prompts))]
  if not prompts:
    raise ConfigError("no prompt: give --prompt=TEXT or lines on stdin")
  decode = run.config.decode
  policy = evaluation.prompt_policy(run.config, decode.max_new_tokens, decode.overlong)
  with run.trainer.context():
    continuations = evaluation.continue_texts(
        run.trainer.model_config, run.params, run.tokenizer, prompts, decode, policy,
        max_new_tokens=decode.max_new_tokens, names=names, rng=_rng(run, seed))
  out = stdout or sys.stdout
  if jax.process_index() == 0:
    for continuation in continuations:
      out.write(continuation + "\n")
    out.flush()
  return continuations


# ---------------------------------------------------------------- translate


def translate(workdir: str, *, input_path: str = "", output_path: str = "",
              overwrite: bool = False, config: ml_collections.ConfigDict | None = None,
              checkpoint_step: int | None = None, average_last: int = 0,
              decode_overrides: Mapping[str, Any] | None = None, seed: int | None = None,
              stdin: TextIO | None = None, stdout: TextIO | None = None) -> list[str]:
  """Translates one sentence per line with an encoder-decoder.

  Sources are ids + [eos] as in training, at most min(data.seq_len, model.max_len)
  tokens: a longer line is truncated with a warning naming it, or stops the command
  (decode.overlong). Beam search by default (decode.beam_size 4, alpha 0.6, output
  length at most source + decode.max_length_offset). Lines are decoded in
  length-sorted batches of decode.batch_size and written back in input order; an
  empty line gives an empty line.

  Args:
    workdir: the run's workdir.
    input_path: a UTF-8 file, one sentence per line; "" reads stdin.
    output_path: where translations go, one per line; "" prints them. Never the
      input; an existing file only with `overwrite`. Written at the end, atomically.
    overwrite: allow replacing an existing output file.
    config, checkpoint_step, average_last, decode_overrides, seed: as for `generate`.
    stdin, stdout: the streams for "" paths (default sys.stdin / sys.stdout).

  Returns:
    The translations, in input order.

  Raises:
    ConfigError: not an encoder-decoder, a missing input, an output that exists (or
      is the input), or an overlong line with decode.overlong='error'.
  """
  if input_path and not os.path.isfile(input_path):
    raise ConfigError(f"--input={input_path!r} is not a file")
  if output_path:
    _check_output(output_path, overwrite, [input_path])
  run = load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                 average_last=average_last, decode_overrides=decode_overrides)
  _require(run, "encoder_decoder", "lm", "translate",
           "Use --mode=generate for a decoder LM.")
  lines = _read_lines(input_path, stdin or sys.stdin)
  limit = evaluation.source_context(run.config)
  policy = evaluation.LengthPolicy(run.config.decode.overlong, limit, "source",
                                   "min(data.seq_len, model.max_len), eos included")
  progress = evaluation.Progress(len(lines), "translate") if input_path else None
  logging.info("Translating %d lines (%s; batches of %d)", len(lines),
               ", ".join(f"{k} {v}" for k, v in
                         evaluation.describe_search(run.config.decode).items()),
               run.config.decode.batch_size)
  with run.trainer.context():
    outputs = evaluation.translate_texts(
        run.trainer.model_config, run.params, run.tokenizer, lines, run.config.decode, policy,
        names=[f"line {i + 1}" for i in range(len(lines))], rng=_rng(run, seed),
        progress=progress)
  if jax.process_index() == 0:
    # One line per input line, whatever the model emits (byte and character models can
    # produce a newline).
    text = "".join(line.replace("\r", " ").replace("\n", " ") + "\n" for line in outputs)
    if output_path:
      _check_output(output_path, overwrite, [input_path])  # None appeared meanwhile.
      _write_atomically(output_path, text)
      logging.info("Wrote %d translations to %s", len(outputs), output_path)
    else:
      out = stdout or sys.stdout
      out.write(text)
      out.flush()
  return outputs


# ---------------------------------------------------------------- evaluate


class _FirstExamples:
  """The first `count` examples of a random-access source (for --max_examples)."""

  def __init__(self, source: Any, count: int):
    self._source = source
    self._count = min(count, len(source))

  def __len__(self) -> int:
    return self._count

  def __getitem__(self, index: int) -> Any:
    if not 0 <= index < self._count:
      raise IndexError(index)
    return self._source[index]


def result_path(workdir: str, split: str, steps: Sequence[int], max_examples: int = 0) -> str:
  """`<workdir>/eval_<split>_step<step>[_avg<N>][_first<M>].json`."""
  name = f"eval_{split.replace('/', '_')}_step{steps[-1]}"
  if len(steps) > 1:
    name += f"_avg{len(steps)}"
  if max_examples > 0:
    name += f"_first{max_examples}"  # A quick look is never mistaken for the full split.
  return os.path.join(workdir, name + ".json")


def evaluate(workdir: str, *, config: ml_collections.ConfigDict | None = None,
             split: str = "", checkpoint_step: int | None = None, average_last: int = 0,
             decode_overrides: Mapping[str, Any] | None = None, max_examples: int = 0,
             output: str = "", overwrite: bool = False, seed: int | None = None,
             stdout: TextIO | None = None) -> dict[str, Any]:
  """Scores a checkpoint on a whole split; prints the result and writes it as JSON.

  Loss, perplexity and token accuracy with the training loop's own eval step over
  every batch of the split (for a classifier, accuracy is per example); for a
  translation run also sacreBLEU and chrF of the decoded split (decode.*, beam search
  by default) against the raw reference texts.

  Args:
    workdir: the run's workdir.
    config, checkpoint_step, average_last, decode_overrides, seed: as for `generate`.
    split: the split to score; "" means data.eval_split.
    max_examples: > 0 scores only the split's first examples (a quick look).
    output: the JSON path; "" means `result_path` in the workdir.
    overwrite: allow replacing an existing result file.
    stdout: where the readable result goes (default sys.stdout).

  Returns:
    The JSON record: metrics, checkpoint steps, dataset, split, decoding settings and
    sacreBLEU signatures.
  """
  run = load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                 average_last=average_last, decode_overrides=decode_overrides)
  config = run.config
  config.data.eval_split = split or config.data.eval_split
  split = config.data.eval_split
  path = output or result_path(workdir, split, run.steps, max_examples)
  _check_output(path, overwrite)
  config.train.eval_batches = -1  # The whole split.
  builder = catalog.load_builder(config.data)  # Also checks that the split exists.
  sources.check_features(config, builder)
  objective = objective_of(config.model.arch, config.model.head)
  source = builder.as_data_source(split=split)
  if max_examples > 0:
    source = _FirstExamples(source, max_examples)
  local_batch_size = train.check_batch_size(config, run.trainer.mesh)
  dataset = pipeline.make_dataset(config, objective, source, run.tokenizer, train=False,
                                  split=split, batch_size=local_batch_size,
                                  process_index=jax.process_index(),
                                  process_count=jax.process_count())
  trainer = run.trainer  # trainer.config is `config`: evaluate reads eval_batches there.
  with trainer.context():
    sums = train.evaluate(trainer, run.params, dataset, local_batch_size)
  metrics = {k.removeprefix("eval_"): v for k, v in sums.items()}
  if objective == "classification":  # One weight per example; perplexity means little.
    metrics["examples"] = metrics.pop("tokens")
    metrics.pop("perplexity", None)
  record: dict[str, Any] = {
      "workdir": os.path.abspath(workdir), "dataset": builder.info.full_name,
      "split": split, "examples": len(source), "objective": objective,
      "checkpoint_steps": run.steps, "metrics": metrics}
  if max_examples > 0:
    record["max_examples"] = max_examples
  if objective == "seq2seq" and sources.is_translation(config.data):
    texts, references = evaluation.translation_pairs(config.data, source)
    policy = evaluation.LengthPolicy(config.decode.overlong, evaluation.source_context(config),
                                     "source", "min(data.seq_len, model.max_len), eos included")
    with trainer.context():
      outputs = evaluation.translate_texts(
          trainer.model_config, run.params, run.tokenizer, texts, config.decode, policy,
          names=[f"{split}[{i}]" for i in range(len(texts))], rng=_rng(run, seed),
          progress=evaluation.Progress(len(texts), f"evaluate {split}"))
    scores = evaluation.corpus_scores(outputs, references)
    metrics.update(bleu=scores["bleu"], chrf=scores["chrf"])
    record["decoding"] = dict(evaluation.describe_search(config.decode),
                              max_length_offset=config.decode.max_length_offset,
                              source_context=evaluation.source_context(config))
    if config.decode.temperature > 0:
      record["decoding"]["seed"] = config.seed if seed is None else seed
    record["sacrebleu"] = {k: scores[k] for k in ("bleu_detail", "bleu_signature",
                                                  "chrf_signature")}
  averaged = os.path.join(workdir, AVERAGE_RECORD)
  if os.path.exists(averaged):
    with open(averaged, encoding="utf-8") as f:
      record["averaged"] = json.load(f)
  if jax.process_index() == 0:
    _check_output(path, overwrite)
    _write_atomically(path, json.dumps(record, indent=2) + "\n")
    _print_result(record, run, path, stdout or sys.stdout)
  return record


def _print_result(record: dict[str, Any], run: LoadedRun, path: str, out: TextIO) -> None:
  metrics = record["metrics"]
  origin = ""
  if "averaged" in record:  # A workdir written by `average`.
    origin = (f" (the mean of steps {', '.join(map(str, record['averaged']['steps']))} of "
              f"{record['averaged']['source']})")
  lines = [f"{record['dataset']} {record['split']} ({record['examples']} examples), "
           f"{run.checkpoint_label()} of {record['workdir']}{origin}:"]
  for key in ("loss", "perplexity", "accuracy", "tokens", "examples"):
    if key in metrics:
      lines.append(f"  {key:<11}{metrics[key]:.6g}")
  if "bleu" in metrics:
    search = ", ".join(f"{k} {v}" for k, v in record["decoding"].items())
    lines += [f"  {'BLEU':<11}{metrics['bleu']:<8.2f}{record['sacrebleu']['bleu_signature']}",
              f"  {'chrF':<11}{metrics['chrf']:<8.2f}{record['sacrebleu']['chrf_signature']}",
              f"  {record['sacrebleu']['bleu_detail']}", f"  decoding: {search}"]
  lines.append(f"Wrote {path}")
  out.write("\n".join(lines) + "\n")
  out.flush()


# ---------------------------------------------------------------- average


def average(workdir: str, output: str, *, average_last: int,
            checkpoint_step: int | None = None) -> str:
  """Writes the mean of the newest `average_last` checkpoints' parameters as a new run.

  The new workdir holds config.json, the tokenizer files, `averaged.json` (the source
  run and steps) and one checkpoint, `checkpoints/<newest averaged step>/state`, with
  only the parameters: the other modes and `config.init_from` read it; it cannot
  resume training (no optimizer state). The source workdir is only read.

  Args:
    workdir: the run to average.
    output: the new workdir; must not exist or be empty.
    average_last: N >= 1 checkpoints (the paper: 5 for base, 20 for big).
    checkpoint_step: the newest checkpoint of the average; None: the run's newest.

  Returns:
    The path of the new checkpoint directory.

  Raises:
    ConfigError: output is the source or not empty, or there are too few checkpoints.
  """
  if not output:
    raise ConfigError("--mode=average needs --output=DIR, the new workdir to write")
  source, target = os.path.abspath(workdir), os.path.abspath(output)
  if target == source or target.startswith(source + os.sep):
    raise ConfigError(f"--output={output!r} is inside the source workdir {source}, which "
                      "is never modified; choose another directory")
  if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
    raise ConfigError(f"--output={output!r} exists and is not an empty directory; choose a "
                      "new one (nothing is overwritten)")
  if average_last < 1:
    raise ConfigError(f"--average_last={average_last}: say how many checkpoints to average "
                      "(>= 1; the paper averages 5 for base, 20 for big)")
  run = load_run(workdir, checkpoint_step=checkpoint_step, average_last=average_last)
  step = run.step
  if jax.process_index() == 0:
    os.makedirs(target, exist_ok=True)
    for name in (CONFIG_FILE, sources.TOKENIZER_RECORD):
      shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
    with open(os.path.join(source, sources.TOKENIZER_RECORD), encoding="utf-8") as f:
      vocabulary = json.load(f).get("file")
    if vocabulary:
      shutil.copyfile(os.path.join(source, vocabulary), os.path.join(target, vocabulary))
    with open(os.path.join(target, AVERAGE_RECORD), "w", encoding="utf-8") as f:
      json.dump({"source": source, "steps": run.steps}, f, indent=2)
  # Every process writes its shards of the parameters.
  manager = ocp.CheckpointManager(
      os.path.join(target, "checkpoints"),
      options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False))
  try:
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": run.params})))
  finally:
    manager.close()
  path = os.path.join(target, "checkpoints", str(step))
  logging.info("Wrote the %s of %s to %s", run.checkpoint_label(), source, path)
  if jax.process_index() == 0:
    print(f"Wrote the {run.checkpoint_label()} of {source} to {path}", flush=True)
  return path
