"""Benchmarks on a model: tasks -> requests -> scores -> metrics, for --mode=benchmark and training.

`run_tasks` is the one path: each task's documents become token requests with the
run's tokenizer (`task_requests`; a text it cannot encode stops with one line naming
the task and document), the scorer scores them all (packed, batched, sharded), and
metrics.py turns them into the task's scores. --mode=benchmark (cli/benchmark.py)
prints and writes them; a training run logs each task's primary score at its
evaluations (training/benchmark_hook.py); lm-eval's harness drives the same scorer
(harness.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies
from transformer.evaluation import metrics as metrics_lib
from transformer.evaluation import requests as requests_lib
from transformer.evaluation import scoring
from transformer.evaluation import tasks as tasks_lib
from transformer.workdir import progress as progress_lib


@dataclasses.dataclass
class EncodedTask:
  """A task's requests as token ids, and which document each belongs to."""
  task: tasks_lib.Task
  requests: list[requests_lib.Request]
  document: np.ndarray  # Per request: its document's index.
  unknown: int  # Requests with an unknown-token id (characters the vocabulary lacks).


def task_requests(task: tasks_lib.Task, tokenizer: vocabularies.Tokenizer,
                  length: int) -> EncodedTask:
  """Every request of `task`'s documents, in document order (choices in order).

  Raises:
    ConfigError: the tokenizer cannot encode a document's text, or a continuation
      encodes to no token; the task and the document's file:line named.
  """
  requests, document = [], []
  for index, doc in enumerate(task.documents):
    try:
      if doc.kind == "text":
        pairs = requests_lib.rolling_windows(tokenizer.encode(doc.text), length)
      else:
        pairs = [requests_lib.encode_pair(tokenizer, context, continuation)
                 for context, continuation in zip(doc.contexts, doc.continuations)]
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f"task {task.name}, document {index} ({doc.where}): the run's "
                        f"tokenizer cannot encode it: {str(e).splitlines()[0]}") from None
    for pair in pairs:
      if not pair[1]:
        raise ConfigError(f"task {task.name}, document {index} ({doc.where}): a "
                          "continuation encodes to no token with the run's tokenizer")
    requests += pairs
    document += [index] * len(pairs)
  unknown = sum(1 for context, continuation in requests
                if vocabularies.UNK_ID in context or vocabularies.UNK_ID in continuation)
  return EncodedTask(task, requests, np.asarray(document, np.int64), unknown)


def run_tasks(scorer: scoring.LogLikelihoodScorer, params: Any,
              tokenizer: vocabularies.Tokenizer, tasks: Sequence[tasks_lib.Task],
              per_request: bool = False, say: bool = True) -> dict[str, dict[str, Any]]:
  """{task name: its result} (kind, counts, metrics, chance, time), in task order.

  per_request: also each request's document, log-likelihood, greediness and truncation
  under "requests_scored". say: progress lines (off inside training: the run says one).
  """
  encoded = [task_requests(task, tokenizer, scorer.length) for task in tasks]
  return score_tasks(scorer, params, encoded, per_request, say)


def score_tasks(scorer: scoring.LogLikelihoodScorer, params: Any,
                encoded: Sequence[EncodedTask], per_request: bool = False,
                say: bool = True) -> dict[str, dict[str, Any]]:
  """`run_tasks` of tasks already encoded (a training run encodes its tasks once)."""
  results = {}
  for task in encoded:
    name = task.task.name
    progress = (progress_lib.Progress(f"benchmark {name}", len(task.requests), "requests")
                if say else None)
    start = time.perf_counter()
    scores = scorer.score(params, task.requests, progress)
    seconds = time.perf_counter() - start
    if progress is not None:
      progress.finish(f"{scores.segments} segments in {scores.rows} rows of "
                      f"{scorer.length} tokens")
    results[name] = _result(task, scores, seconds, scorer.length, per_request)
  return results


def _result(encoded: EncodedTask, scores: scoring.Scores, seconds: float, length: int,
            per_request: bool) -> dict[str, Any]:
  task = encoded.task
  by_doc: list[list[int]] = [[] for _ in task.documents]
  for request, doc in enumerate(encoded.document):
    by_doc[doc].append(request)
  loglik = [[float(scores.loglik[r]) for r in rs] for rs in by_doc]
  greedy = [[bool(scores.greedy[r]) for r in rs] for rs in by_doc]
  truncated = scores.truncated
  result: dict[str, Any] = {
      "kind": task.kind, "source": task.source, "documents": len(task.documents),
      "requests": len(encoded.requests), "segments": scores.segments,
      "context_tokens": length,
      "truncated_requests": int(truncated.sum()),
      "truncated_documents": int(len({int(d) for d in encoded.document[truncated]})),
      "unknown_token_requests": encoded.unknown,
      "chance": task.chance,
      "metrics": metrics_lib.task_metrics(task, loglik, greedy) if task.documents else {},
      "seconds": seconds,
      "seconds_per_1000_requests": 1000 * seconds / max(1, len(encoded.requests)),
  }
  if per_request:
    result["requests_scored"] = [
        {"document": int(d), "loglikelihood": float(scores.loglik[r]),
         "greedy": bool(scores.greedy[r]), "truncated": bool(truncated[r]),
         "continuation_tokens": len(encoded.requests[r][1])}
        for r, d in enumerate(encoded.document)]
  return result


def training_metrics(results: dict[str, dict[str, Any]]) -> dict[str, float]:
  """What a training row gets: eval_<task>_<primary metric> a task, and the mean of the
  accuracies (eval_benchmark_acc) when there are several tasks with one."""
  row, accuracies = {}, []
  for name, result in results.items():
    key = metrics_lib.primary(result["kind"])
    value = result["metrics"].get(key)
    if value is None:
      continue
    row[f"eval_{name}_{key}"] = float(value)
    if key.startswith("acc"):
      accuracies.append(float(value))
  if len(accuracies) > 1:
    row["eval_benchmark_acc"] = float(np.mean(accuracies))
  return row


def table(results: dict[str, dict[str, Any]]) -> list[str]:
  """Markdown rows: task, documents, the scores with their 95% interval, chance, truncated."""
  lines = ["| task | documents | acc (95% CI) | acc_norm (95% CI) | other | chance | "
           "truncated |", "|---|---|---|---|---|---|---|"]
  for name, result in results.items():
    m = result["metrics"]

    def interval(key: str) -> str:
      if key not in m:
        return "—"
      ci = m.get(f"{key}_ci95")
      return f"{m[key]:.4f}" + (f" ({ci[0]:.3f}–{ci[1]:.3f})" if ci else "")

    other = ", ".join(f"{k} {m[k]:.4g}" for k in ("perplexity", "bits_per_byte",
                                                    "word_perplexity") if k in m)
    chance = "—" if result["chance"] is None else f"{result['chance']:.3f}"
    lines.append(f"| {name} | {result['documents']} | {interval('acc')} | "
                 f"{interval('acc_norm')} | {other or '—'} | {chance} | "
                 f"{result['truncated_documents']} |")
  return lines
