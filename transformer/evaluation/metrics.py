"""A task's scores from its requests' log-likelihoods, as lm-evaluation-harness defines them.

  multiple_choice  acc: the choice of highest log-likelihood is the gold one;
                   acc_norm: the highest log-likelihood per character of the choice
                   (lm-eval's acc_norm; OLMo's acc_per_char);
  completion       acc: the continuation is what greedy decoding gives, every token
                   (lm-eval's LAMBADA accuracy); perplexity: exp(-mean log-likelihood)
                   over documents; bits_per_byte of the continuations;
  text             bits_per_byte, byte_perplexity, word_perplexity over the whole texts.

An accuracy's standard error is lm-eval's: the sample standard deviation of the
per-document 0/1 scores over sqrt(n); the 95% interval is the mean +- 1.96 of them
(clipped to [0, 1]).
Ties go to the first choice (numpy's argmax, lm-eval's too).
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np

from transformer.evaluation import tasks as tasks_lib

Z95 = 1.959963984540054  # The normal quantile of a two-sided 95% interval.


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float | None]:
  """The mean and lm-eval's standard error of it (None below 2 values)."""
  array = np.asarray(values, np.float64)
  if len(array) < 2:
    return float(array.mean()) if len(array) else math.nan, None
  return float(array.mean()), float(array.std(ddof=1) / math.sqrt(len(array)))


def _accuracy(name: str, correct: Sequence[float]) -> dict[str, Any]:
  mean, stderr = mean_and_stderr(correct)
  out: dict[str, Any] = {name: mean, f"{name}_stderr": stderr}
  if stderr is not None:
    # The normal approximation, as lm-eval's stderr is; an accuracy stays in [0, 1].
    out[f"{name}_ci95"] = [max(0.0, mean - Z95 * stderr), min(1.0, mean + Z95 * stderr)]
  return out


def task_metrics(task: tasks_lib.Task, loglik: Sequence[Sequence[float]],
                 greedy: Sequence[Sequence[bool]]) -> dict[str, Any]:
  """The metrics of `task` from each document's request log-likelihoods and greediness
  (one per choice; one for a completion; one per rolling window of a text)."""
  docs = task.documents
  if task.kind == "multiple_choice":
    acc, acc_norm = [], []
    for doc, lls in zip(docs, loglik):
      lls = np.asarray(lls, np.float64)
      chars = np.asarray([float(len(c)) for c in doc.choices])
      acc.append(float(np.argmax(lls) == doc.gold))
      acc_norm.append(float(np.argmax(lls / np.maximum(chars, 1.0)) == doc.gold))
    return {**_accuracy("acc", acc), **_accuracy("acc_norm", acc_norm)}
  if task.kind == "completion":
    lls = np.asarray([sum(ll) for ll in loglik], np.float64)
    nbytes = sum(len(d.continuations[0].encode("utf-8")) for d in docs)
    return {**_accuracy("acc", [float(all(g)) for g in greedy]),
            "perplexity": math.exp(min(-float(lls.mean()), 700.0)),
            "bits_per_byte": -float(lls.sum()) / max(nbytes, 1) / math.log(2)}
  total = float(sum(sum(ll) for ll in loglik))
  nbytes = sum(len(d.text.encode("utf-8")) for d in docs)
  words = sum(len(re.split(r"\s+", d.text)) for d in docs)
  return {"bits_per_byte": -total / max(nbytes, 1) / math.log(2),
          "byte_perplexity": math.exp(min(-total / max(nbytes, 1), 700.0)),
          "word_perplexity": math.exp(min(-total / max(words, 1), 700.0))}


# What a training run logs of each task (train.benchmarks): one score a task, so that
# --mode=compare's table stays readable (eval_<task>_<metric>).
PRIMARY = {"multiple_choice": "acc_norm", "completion": "acc", "text": "bits_per_byte"}


def primary(kind: str) -> str:
  """The metric a task of `kind` is ranked by in training (PRIMARY)."""
  return PRIMARY[kind]
