"""Benchmarks on a model: tasks -> requests -> scores -> metrics, for --mode=benchmark and training.

`run_tasks` is the one path: each task's documents become token requests as
lm-eval 0.4.13's HF backend makes them (`task_requests` with requests.Encoding; a text
the tokenizer cannot encode stops with one line naming the task and document; a
document holding a request lm-eval refuses is left out and counted), the scorer
scores them all (packed, batched, sharded), and metrics.py turns the scored
documents into the task's scores. --mode=benchmark (cli/benchmark.py)
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
from transformer.workdir import metrics_file
from transformer.workdir import progress as progress_lib


@dataclasses.dataclass
class EncodedTask:
  """A task's scored documents' requests as token ids, which document each belongs to,
  and the documents left out (a request lm-eval refuses: requests.REFUSALS)."""
  task: tasks_lib.Task  # Its documents: the scored ones.
  requests: list[requests_lib.Request]
  document: np.ndarray  # Per request: its document's index in `task.documents`.
  unknown: int  # Requests with an unknown-token id (characters the vocabulary lacks).
  excluded: dict[str, int] = dataclasses.field(default_factory=dict)  # Requests by reason.
  excluded_documents: int = 0
  encoding: dict[str, Any] = dataclasses.field(default_factory=dict)  # Encoding.describe().


def task_requests(task: tasks_lib.Task, encoding: requests_lib.Encoding,
                  length: int) -> EncodedTask:
  """Every request of `task`'s documents, in document order (choices in order), for a
  window of `length` tokens; a document with a request lm-eval refuses is left out.

  Raises:
    ConfigError: the tokenizer cannot encode a document's text, or a continuation
      encodes to no token; the task and the document's file:line named.
  """
  requests, document, kept = [], [], []
  excluded = {key: 0 for key in requests_lib.REFUSALS}
  for index, doc in enumerate(task.documents):
    try:
      if doc.kind == "text":
        pairs = encoding.rolling(doc.text, length)
      else:
        pairs = [encoding.pair(context, continuation)
                 for context, continuation in zip(doc.contexts, doc.continuations)]
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f"task {task.name}, document {index} ({doc.where}): the run's "
                        f"tokenizer cannot encode it: {str(e).splitlines()[0]}") from None
    for pair in pairs:
      if not pair[1]:
        raise ConfigError(f"task {task.name}, document {index} ({doc.where}): a "
                          "continuation encodes to no token with the run's tokenizer")
    refused = [why for why in (requests_lib.refusal(p, length) for p in pairs) if why]
    if refused:  # Scored whole or not at all: a choice cannot be compared in part.
      for why in refused:
        excluded[why] += 1
      continue
    requests += pairs
    document += [len(kept)] * len(pairs)
    kept.append(doc)
  unknown = sum(1 for context, continuation in requests
                if vocabularies.UNK_ID in context or vocabularies.UNK_ID in continuation)
  return EncodedTask(dataclasses.replace(task, documents=tuple(kept)), requests,
                     np.asarray(document, np.int64), unknown, excluded,
                     len(task.documents) - len(kept), encoding.describe())


def run_tasks(scorer: scoring.LogLikelihoodScorer, params: Any,
              encoding: requests_lib.Encoding, tasks: Sequence[tasks_lib.Task],
              per_request: bool = False, say: bool = True) -> dict[str, dict[str, Any]]:
  """{task name: its result} (kind, counts, metrics, chance, time), in task order.

  encoding: the run's requests.Encoding (its tokenizer, and the scorer's seq2seq).
  per_request: also each request's document, log-likelihood, greediness and truncation
  under "requests_scored". say: progress lines (off inside training: the run says one).
  """
  encoded = [task_requests(task, encoding, scorer.length) for task in tasks]
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
                      f"{scorer.length} tokens" + excluded_note(task))
    results[name] = _result(task, scores, seconds, scorer.length, per_request)
  return results


def excluded_note(task: EncodedTask) -> str:
  """", N documents left out (...)" when some were, else ""."""
  if not task.excluded_documents:
    return ""
  why = "; ".join(f"{n} requests: {requests_lib.REFUSALS[k]}"
                  for k, n in task.excluded.items() if n)
  return (f"; {task.excluded_documents} documents left out, as lm-eval refuses them "
          f"({why})")


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
      "excluded_documents": encoded.excluded_documents,
      "excluded_requests": dict(encoded.excluded),
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
  accuracies (eval_benchmark_acc) when there are several tasks with one.

  Beside each accuracy, for its plot (reports/plots.py): its 95% interval
  (`<key>_ci95_low`, `<key>_ci95_high`) and, where the task has one, its chance level
  (`<key>_chance`). eval_benchmark_acc's interval takes the tasks as independent
  (standard error sqrt(sum se^2) / k); its chance is the mean of the tasks' chance
  levels, a task without one (LAMBADA's open vocabulary) counting 0.
  """
  row: dict[str, float] = {}
  accuracies, errors, chances = [], [], []
  for name, result in results.items():
    key = metrics_lib.primary(result["kind"])
    value = result["metrics"].get(key)
    if value is None:
      continue
    row[f"eval_{name}_{key}"] = float(value)
    if key.startswith("acc"):
      accuracies.append(float(value))
      errors.append(result["metrics"].get(f"{key}_stderr"))
      chances.append(result["chance"] or 0.0)
      _interval(row, f"eval_{name}_{key}", float(value), errors[-1], result["chance"])
  if len(accuracies) > 1:
    mean = float(np.mean(accuracies))
    row["eval_benchmark_acc"] = mean
    stderr = (None if None in errors
              else float(np.sqrt(np.sum(np.square(errors)))) / len(errors))
    _interval(row, "eval_benchmark_acc", mean, stderr, float(np.mean(chances)))
  return row


def _interval(row: dict[str, float], key: str, value: float, stderr: float | None,
              chance: float | None) -> None:
  """Adds `key`'s 95% interval (clipped to [0, 1]) and chance level to `row`."""
  if stderr is not None:
    row[key + metrics_file.CI95_LOW] = max(0.0, value - metrics_lib.Z95 * stderr)
    row[key + metrics_file.CI95_HIGH] = min(1.0, value + metrics_lib.Z95 * stderr)
  if chance is not None:
    row[key + metrics_file.CHANCE] = float(chance)


def table(results: dict[str, dict[str, Any]]) -> list[str]:
  """Markdown rows: task, documents scored, the scores with their 95% interval, chance,
  documents truncated, documents left out (a request lm-eval refuses)."""
  lines = ["| task | documents | acc (95% CI) | acc_norm (95% CI) | other | chance | "
           "truncated | left out |", "|---|---|---|---|---|---|---|---|"]
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
                 f"{result['truncated_documents']} | {result['excluded_documents']} |")
  return lines
