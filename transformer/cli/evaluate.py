"""--mode=evaluate: loss / perplexity / accuracy (+ sacreBLEU, chrF) of a checkpoint on a split;
--by_position=W: by bucket of W token positions.

The loss comes from the training loop's own eval step (training/trainer.py's Scorer,
built for the loaded parameters alone: no optimizer); translations through
inference/text.py. The result is printed and written as JSON (--output, default
`<workdir>/eval_<split>_step<N>.json`).

A long-context check: `--by_position=W` adds the loss, perplexity and accuracy of a
decoder LM per bucket of W token positions (a table, the JSON's "by_position" and a
PNG beside the JSON), at any evaluation length `--config.data.seq_len` the model's
positions allow, with its RoPE scaling changed for the command if asked
(`--config.model.rope_scaling=linear --config.model.rope_scaling_factor=4`; see
inference/loaded.py for the model fields a reading mode may change).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping, Sequence, TextIO

import jax
import ml_collections
from absl import flags

from transformer.cli import common
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.data import pipeline
from transformer.data import sources
from transformer.data.corpus import for_config
from transformer.data.datasets import catalog
from transformer.inference import loaded
from transformer.inference import text
from transformer.reports import long_context
from transformer.training import metrics as metrics_lib
from transformer.training import trainer as trainer_lib
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import progress as progress_lib

SPLIT = flags.DEFINE_string("split", "", "evaluate: the split (default data.eval_split).")
MAX_EXAMPLES = flags.DEFINE_integer(
    "max_examples", 0, "evaluate: score only the split's first N examples (0: all).")
BY_POSITION = flags.DEFINE_integer(
    "by_position", 0, "evaluate: also loss and perplexity by token position, in buckets "
    "of this many positions (a decoder LM; 0: off): a table, the JSON's by_position and "
    "a PNG beside the JSON.")
STARTS_JAX = True
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("output", "overwrite", "seed", *common.LOADING_FLAGS)


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=evaluate."""
  evaluate(workdir, split=SPLIT.value, max_examples=MAX_EXAMPLES.value,
           by_position=BY_POSITION.value, output=common.OUTPUT.value, overwrite=common.OVERWRITE.value,
           seed=common.SEED.value, **common.loading_flags(config))


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

  @property
  def features(self) -> Any:
    """The source's features, where it has them (a labelled text's class names)."""
    return getattr(self._source, "features", None)


def result_path(workdir: str, split: str, steps: Sequence[int], max_examples: int = 0,
                variant: Mapping[str, Any] | None = None) -> str:
  """`<workdir>/eval_<split>_step<step>[_avg<N>][_first<M>][_<key>-<value>...].json`.

  `variant`: what this evaluation changes of the run, {"len": 1024, "rope_scaling":
  "linear", ...}, so that evaluations of one checkpoint at several lengths or scalings
  each keep a file of their own.
  """
  name = f"eval_{split.replace('/', '_')}_step{steps[-1]}"
  if len(steps) > 1:
    name += f"_avg{len(steps)}"
  if max_examples > 0:
    name += f"_first{max_examples}"  # A quick look is never mistaken for the full split.
  for key, value in (variant or {}).items():
    name += f"_{key}-{value}"
  return os.path.join(workdir, name + ".json")


def _variant(workdir: str, config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What the evaluated setting changes of the run: a seq_len, model fields (result_path)."""
  variant: dict[str, Any] = {}
  if config.data.seq_len != loaded.load_config(workdir).data.seq_len:
    variant["len"] = config.data.seq_len
  return variant | loaded.changed_model_fields(workdir, config)


def _text_split(config: ml_collections.ConfigDict, split: str, given_split: bool, workdir: str,
                given_config: ml_collections.ConfigDict | None) -> tuple[Any, str]:
  """The TFDS split to evaluate (after its features and the run's data are checked) and
  the dataset's full name."""
  try:
    builder = catalog.load_builder(config.data)  # Also checks that the split exists.
  except ConfigError as e:
    named = f"config.data.eval_split={split!r}"
    if not given_split or named not in str(e):
      raise
    # The user named the split with --split, not with the config key.
    raise ConfigError(str(e).replace(named, f"--split={split!r}")) from None
  sources.check_features(config, builder)
  loaded.check_run_data(workdir, given_config, sources.dataset_record(builder), "evaluate")
  return catalog.data_source(builder, split), builder.info.full_name


def evaluate(workdir: str, *, config: ml_collections.ConfigDict | None = None,
             split: str = "", checkpoint_step: int | None = None, average_last: int = 0,
             decode_overrides: Mapping[str, Any] | None = None,
             model_overrides: Mapping[str, Any] | None = None, max_examples: int = 0,
             by_position: int = 0, output: str = "", overwrite: bool = False,
             seed: int | None = None, stdout: TextIO | None = None) -> dict[str, Any]:
  """Scores a checkpoint on a whole split; prints the result and writes it as JSON.

  Loss, perplexity and token accuracy with the training loop's own eval step over
  every batch of the split (for a classifier, accuracy is per example); for a
  translation run also sacreBLEU and chrF of the decoded split (decode.*, beam search
  by default) against the raw reference texts.

  Args:
    workdir: the run's workdir.
    config, checkpoint_step, average_last, decode_overrides, model_overrides, seed: as
      for `generate`.
    split: the split to score; "" means data.eval_split.
    max_examples: > 0 scores only the split's first examples (a quick look).
    by_position: > 0 (a decoder LM): also the metrics per bucket of this many token
      positions (the model's position ids), in the record's "by_position" and a PNG
      `<JSON path without .json>_by_position.png`.
    output: the JSON path; "" means `result_path` in the workdir.
    overwrite: allow replacing an existing result file.
    stdout: where the readable result goes (default sys.stdout).

  Returns:
    The JSON record: metrics, checkpoint steps, dataset, split, decoding settings and
    sacreBLEU signatures.
  """
  run = loaded.load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                        average_last=average_last, decode_overrides=decode_overrides,
                        model_overrides=model_overrides)
  given_config, config = config, run.config
  given_split = bool(split)
  config.data.eval_split = split or config.data.eval_split
  split = config.data.eval_split
  objective = objective_lib.resolve(config.model)
  if by_position < 0 or (by_position and not objective.generates):
    raise ConfigError(f"--by_position={by_position}: expected a bucket width >= 1 (0: off) "
                      "for a decoder LM" + ("" if by_position < 0 else
                      f"; {workdir} holds a {objective.name} model"))
  variant = _variant(workdir, config)
  path = output or result_path(workdir, split, run.steps, max_examples, variant)
  common.check_output(path, overwrite, given=bool(output))
  config.train.eval_batches = -1  # The whole split.
  source, dataset_name = _split_source(config, split, given_split, workdir, given_config)
  if max_examples > 0:
    source = _FirstExamples(source, max_examples)
  metrics, sums = _score_split(run, objective, source, split, by_position)
  record: dict[str, Any] = {
      "workdir": os.path.abspath(workdir), "dataset": dataset_name,
      "split": split, "examples": len(source), "objective": objective.name,
      "checkpoint_steps": run.steps, "metrics": metrics}
  if max_examples > 0:
    record["max_examples"] = max_examples
  if variant or by_position:
    record["seq_len"] = config.data.seq_len
  if variant:
    record["changed"] = variant  # What this evaluation changes of the run (result_path).
  if by_position:
    record["by_position"] = {"bucket": by_position, "plot": position_plot_path(path),
                             "rows": metrics_lib.by_position_rows(sums, by_position)}
  if objective.translates and sources.is_translation(config.data):
    record.update(_translation_scores(run, source, split, seed, metrics))
  elif objective.answers_labels and config.data.label_key:
    record.update(_label_word_accuracy(run, source, split, seed, metrics))
  averaged = os.path.join(workdir, layout.AVERAGED)
  if os.path.exists(averaged):
    with open(averaged, encoding="utf-8") as f:
      record["averaged"] = json.load(f)
  if jax.process_index() == 0:
    common.check_output(path, overwrite, given=bool(output))
    _write_result(record, run, path, workdir, overwrite)
    _print_result(record, run, path, stdout or sys.stdout)
  return record


def _split_source(config: ml_collections.ConfigDict, split: str, given_split: bool,
                  workdir: str, given_config: ml_collections.ConfigDict | None
                  ) -> tuple[Any, str]:
  """The examples of the split to evaluate and the dataset's name: a prepared corpus's
  token ids, or a TFDS split (each checked against the run's data)."""
  if config.data.name == "corpus":  # Token ids prepared by --mode=prepare.
    prepared, _ = for_config.open_for_training(config, workdir)
    loaded.check_run_data(workdir, given_config, prepared.record(), "evaluate")
    return prepared.split(split), prepared.record()["name"]
  return _text_split(config, split, given_split, workdir, given_config)


def _score_split(run: loaded.LoadedRun, objective: objective_lib.Objective, source: Any,
                 split: str, by_position: int) -> tuple[dict[str, Any], Any]:
  """(the summary metrics, the raw sums) of the eval step over every batch of `source`."""
  config = run.config
  share = trainer_lib.batch_share(config, run.mesh)
  local_batch_size = share.rows
  dataset = pipeline.make_dataset(config, objective, source, run.tokenizer, train=False,
                                  split=split, batch_size=local_batch_size,
                                  process_index=share.index, process_count=share.count)
  # The eval step alone, for the loaded parameters' shardings; scorer.config is `config`,
  # whose train.eval_batches (-1: set by `evaluate`) evaluate_split reads.
  scorer = trainer_lib.Scorer.create(config, run.mesh, run.param_shardings,
                                     position_bucket=by_position)
  # Batches, not examples: packed LM rows are not counted before they are built. The
  # first batch's time includes compiling the eval step.
  scoring = progress_lib.Progress(f"evaluate {split}", unit="batches")
  progress_lib.say(f"evaluate {split}: scoring {len(source)} examples in batches of "
                   f"{config.data.batch_size} (the first also compiles the eval step) ...")
  with scorer.context():
    sums = trainer_lib.sum_split(scorer, run.params, dataset, local_batch_size, scoring)
  scoring.finish(f"{len(source)} examples scored")
  metrics = metrics_lib.summarize(sums)
  if objective.classifies:  # One weight per example; perplexity means little.
    metrics["examples"] = metrics.pop("tokens")
    metrics.pop("perplexity", None)
  return metrics, sums


def _translation_scores(run: loaded.LoadedRun, source: Any, split: str, seed: int | None,
                        metrics: dict[str, Any]) -> dict[str, Any]:
  """Decodes the split's source sentences, adds BLEU and chrF to `metrics`; returns the
  record's "decoding" and "sacrebleu" entries."""
  config = run.config
  texts, references = text.source_and_reference_texts(config.data, source)
  policy = text.source_policy(config, config.decode.overlong)
  translating = progress_lib.Progress(f"evaluate {split}: translating", len(texts),
                                      "sentences")
  with run.context():
    outputs = text.translate_texts(
        run.model_config, run.params, run.tokenizer, texts, config.decode, policy,
        names=[f"{split}[{i}]" for i in range(len(texts))], rng=run.sampling_rng(seed),
        progress=translating)
  translating.finish()
  scores = text.corpus_scores(outputs, references)
  metrics.update(bleu=scores["bleu"], chrf=scores["chrf"])
  decoding = dict(text.describe_search(config.decode),
                  max_length_offset=config.decode.max_length_offset,
                  source_context=text.source_context(config))
  if config.decode.temperature > 0:
    decoding["seed"] = config.seed if seed is None else seed
  return {"decoding": decoding,
          "sacrebleu": {k: scores[k] for k in ("bleu_detail", "bleu_signature",
                                               "chrf_signature")}}


def _label_word_accuracy(run: loaded.LoadedRun, source: Any, split: str, seed: int | None,
                         metrics: dict[str, Any]) -> dict[str, Any]:
  """A labelled text trained text-to-text ("text -> label word", data.label_key):
  decodes each text and adds `label_accuracy`, the share whose output is exactly its
  label's name (surrounding spaces aside), and `label_unknown`, the share whose output
  is no class name at all; returns the record's "decoding" and "labels" entries."""
  config = run.config
  names = sources.label_names(source, config.data.label_key)
  texts, labels = text.labelled_texts(config.data, source, names)
  answering = progress_lib.Progress(f"evaluate {split}: answering", len(texts), "texts")
  with run.context():
    outputs = text.translate_texts(
        run.model_config, run.params, run.tokenizer, texts, config.decode,
        text.source_policy(config, config.decode.overlong),
        names=[f"{split}[{i}]" for i in range(len(texts))], rng=run.sampling_rng(seed),
        progress=answering)
  answering.finish()
  metrics.update(text.label_scores(outputs, labels, names))
  decoding = dict(text.describe_search(config.decode),
                  max_length_offset=config.decode.max_length_offset)
  return {"decoding": decoding, "labels": list(names)}


def _write_result(record: dict[str, Any], run: loaded.LoadedRun, path: str,
                  workdir: str, overwrite: bool) -> None:
  """The JSON record, and with by_position its PNG: both or neither (files.write_together)."""
  written = [(path, json.dumps(record, indent=2) + "\n")]
  if "by_position" in record:
    written.insert(0, (record["by_position"]["plot"], long_context.position_plot_png(
        record["by_position"]["rows"], _plot_title(record, run),
        trained_len=loaded.load_config(workdir).data.seq_len)))
  files.write_together(written, flag="--output", keep_existing=() if overwrite else (path,))


def position_plot_path(path: str) -> str:
  """The PNG of --by_position beside the JSON at `path`: `<path without .json>_by_position.png`."""
  return path.removesuffix(".json") + "_by_position.png"


def _plot_title(record: dict[str, Any], run: loaded.LoadedRun) -> str:
  changed = ", ".join(f"{k} {v}" for k, v in record.get("changed", {}).items())
  return (f"{os.path.basename(os.path.normpath(record['workdir']))} step {run.step}, "
          f"{record['split']} at {record['seq_len']} tokens" + (f" ({changed})" if changed
                                                                  else ""))


def _print_result(record: dict[str, Any], run: loaded.LoadedRun, path: str, out: TextIO) -> None:
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
  loss_of = "loss" + metrics_lib.GROUP_SEPARATOR  # A UL2 run's loss per denoiser.
  for key in sorted(k for k in metrics if k.startswith(loss_of)):
    name = key[len(loss_of):]
    tokens = metrics["tokens" + metrics_lib.GROUP_SEPARATOR + name]
    lines.append(f"  {'loss ' + name:<11}{metrics[key]:.6g} ({tokens:.0f} tokens)")
  if "bleu" in metrics:
    search = ", ".join(f"{k} {v}" for k, v in record["decoding"].items())
    lines += [f"  {'BLEU':<11}{metrics['bleu']:<8.2f}{record['sacrebleu']['bleu_signature']}",
              f"  {'chrF':<11}{metrics['chrf']:<8.2f}{record['sacrebleu']['chrf_signature']}",
              f"  {record['sacrebleu']['bleu_detail']}", f"  decoding: {search}"]
  if "label_accuracy" in metrics:
    search = ", ".join(f"{k} {v}" for k, v in record["decoding"].items())
    lines += [f"  {'label acc.':<11}{metrics['label_accuracy']:.6g} (the generated word is "
              f"the label's name; {metrics['label_unknown']:.3g} named no class of "
              f"{record['labels']})", f"  decoding: {search}"]
  if "by_position" in record:
    lines.append(f"  by position (buckets of {record['by_position']['bucket']} positions, "
                 f"at {record['seq_len']} tokens a row):")
    lines += long_context.position_table(record["by_position"]["rows"])
    lines.append(f"Wrote {record['by_position']['plot']}")
  lines.append(f"Wrote {path}")
  out.write("\n".join(lines) + "\n")
  out.flush()
