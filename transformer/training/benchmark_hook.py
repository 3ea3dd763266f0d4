"""Downstream benchmarks at a training run's evaluations (train.benchmarks), a hook.

Every train.benchmark_every steps (0: at every evaluation; always at the last), the
first train.benchmark_documents documents of each task are scored with the current
parameters through --mode=benchmark's own path (transformer/evaluation/: the same
requests, packing and metrics), and each task's primary score joins the evaluation's
row as eval_<task>_<metric> (multiple choice: acc_norm; LAMBADA: acc; a text:
bits_per_byte), with eval_benchmark_acc the mean accuracy over the tasks. From the row
they reach metrics.jsonl, TensorBoard, the run's plots and --mode=compare's table, so
a sweep's arms rank by downstream accuracy too. The tasks are read and encoded when
the run starts (an unknown task or a bad file stops it before anything compiles).
"""

from __future__ import annotations

import time
from typing import Any

import ml_collections
from absl import logging

from transformer.data.tokenizers import vocabularies
from transformer.evaluation import benchmark
from transformer.evaluation import requests as requests_lib
from transformer.evaluation import scoring
from transformer.evaluation import tasks as tasks_lib
from transformer.inference import text
from transformer.training import hooks
from transformer.workdir import metrics_file

FLAG = "config.train.benchmarks"


class BenchmarkAtEvaluation(hooks.Hook):
  """The loop's after_eval hook that adds the benchmark scores to the evaluation's row."""

  def __init__(self, config: ml_collections.ConfigDict,
               encoded: list[benchmark.EncodedTask]):
    self.config, self.encoded = config, encoded
    self.scorer: scoring.LogLikelihoodScorer | None = None

  def start(self, trainer: Any) -> None:
    """Builds the scorer for the trainer's mesh and parameter placement (compiled later)."""
    self.scorer = scoring.LogLikelihoodScorer.create(
        self.config, trainer.mesh, trainer.state_shardings.params, mode="train")

  def due(self, step: int) -> bool:
    every = self.config.train.benchmark_every
    return not every or step % every == 0 or step == self.config.train.num_steps

  def after_eval(self, step: int, state: Any, metrics: dict[str, float]) -> None:
    if self.scorer is None or not self.due(step):
      return
    start = time.perf_counter()
    results = benchmark.score_tasks(self.scorer, state.params, self.encoded, say=False)
    row = benchmark.training_metrics(results)
    metrics.update(row)
    requests = sum(r["requests"] for r in results.values())
    logging.info("benchmarks at step %d (%d requests, %.1f s): %s", step, requests,
                 time.perf_counter() - start,
                 ", ".join(f"{k.removeprefix('eval_')} {v:.4f}" for k, v in row.items()
                           if not k.endswith(metrics_file.BESIDE)))


def make_hook(config: ml_collections.ConfigDict,
              tokenizer: vocabularies.Tokenizer) -> BenchmarkAtEvaluation | None:
  """The hook of train.benchmarks (None when off), its tasks read and checked now.

  Raises:
    ConfigError: an unknown task (the known ones listed), a missing package or file, a
      tokenizer that cannot encode a task's text.
    DataError: a task file line in the wrong format (file:line).
  """
  names = tasks_lib.names_of(config.train.benchmarks)
  if not names:
    return None
  tasks = [tasks_lib.load_task(name, config.train.benchmark_documents, FLAG)
           for name in tasks_lib.check_names(names, FLAG)]
  # Encoded once, now: a text the run's vocabulary cannot encode stops it before compiling.
  encoding = requests_lib.Encoding(tokenizer, scoring.is_seq2seq(config))
  encoded = [benchmark.task_requests(task, encoding, text.source_context(config))
             for task in tasks]
  logging.info("train.benchmarks: %s", encoding.sentence())
  for task in encoded:
    if task.excluded_documents:
      logging.warning("train.benchmarks %s: %d documents scored%s", task.task.name,
                      len(task.task.documents), benchmark.excluded_note(task))
  return BenchmarkAtEvaluation(config, encoded)
