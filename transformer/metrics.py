"""Metrics as sums plus a denominator, and where they go: progress line, JSONL, TensorBoard.

Token-weighted sums stay exact when added across devices, batches and steps; a
mean is taken only when a metric is reported.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

# Keys that are sums to be divided by `weight_sum` when reported.
SUM_KEYS = ("loss_sum", "correct_sum")


def loss_sums(logits_BLV: jax.Array, targets_BL: jax.Array, weights_BL: jax.Array,
              label_smoothing: float = 0.0) -> dict[str, jax.Array]:
  """Token-weighted sums for the objective and the reported metrics.

  Returns:
    `objective_sum` (with label smoothing), `loss_sum` (plain NLL), `correct_sum`
    (argmax hits) and `weight_sum` (number of real target tokens).
  """
  logits_BLV = logits_BLV.astype(jnp.float32)
  nll_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLV, targets_BL)
  objective_BL = nll_BL
  if label_smoothing > 0:
    # (1 - eps) * NLL + eps * mean over the vocabulary of -log p.
    mean_neg_logp_BL = -jnp.mean(jax.nn.log_softmax(logits_BLV), axis=-1)
    objective_BL = (1.0 - label_smoothing) * nll_BL + label_smoothing * mean_neg_logp_BL
  correct_BL = (jnp.argmax(logits_BLV, axis=-1) == targets_BL).astype(jnp.float32)
  return {
      "objective_sum": jnp.sum(objective_BL * weights_BL),
      "loss_sum": jnp.sum(nll_BL * weights_BL),
      "correct_sum": jnp.sum(correct_BL * weights_BL),
      "weight_sum": jnp.sum(weights_BL),
  }


def summarize(sums: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """Turns accumulated sums into loss, perplexity and accuracy; copies other scalars."""
  weight = float(sums["weight_sum"])
  out = {}
  if weight > 0:
    loss = float(sums["loss_sum"]) / weight
    out[prefix + "loss"] = loss
    out[prefix + "perplexity"] = math.exp(min(loss, 50.0))
    out[prefix + "accuracy"] = float(sums["correct_sum"]) / weight
  out[prefix + "tokens"] = weight
  for key, value in sums.items():
    if key not in SUM_KEYS + ("weight_sum", "objective_sum"):
      out[prefix + key] = float(value)
  return out


def add_sums(total: dict[str, Any] | None, sums: Mapping[str, Any]) -> dict[str, Any]:
  """Adds sums of one batch to a running total (None starts a new total)."""
  sums = {k: np.asarray(v, np.float64) for k, v in sums.items()}
  if total is None:
    return sums
  return {k: total[k] + sums[k] for k in total}


class MetricWriter:
  """Writes metrics to `<workdir>/metrics.jsonl` and TensorBoard (process 0 only)."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")
    self._tb = SummaryWriter(logdir=os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    """Appends one JSON line {"step": step, **metrics} and one TensorBoard scalar each."""
    if not self.enabled:
      return
    self._jsonl.write(json.dumps({"step": int(step), **metrics}) + "\n")
    self._jsonl.flush()
    for name, value in metrics.items():
      self._tb.add_scalar(name, value, int(step))
    self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def format_duration(seconds: float) -> str:
  """12345 -> '3h25m45s'."""
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
  """Step timing, throughput and ETA for the progress line (the first step's compile excluded)."""

  def __init__(self, start_step: int, num_steps: int, tokens_per_step: int):
    self.num_steps = num_steps
    self.tokens_per_step = tokens_per_step
    self._mark_step = start_step
    self._mark_time = time.perf_counter()
    self._started = False
    self.seconds_per_step = float("nan")

  def update(self, step: int) -> None:
    """Call after `step` is complete; the first call only starts the clock."""
    now = time.perf_counter()
    if self._started and step > self._mark_step:
      self.seconds_per_step = (now - self._mark_time) / (step - self._mark_step)
    self._started = True
    self._mark_step, self._mark_time = step, now

  def line(self, step: int, metrics: Mapping[str, float]) -> str:
    """'step 120/1000 (12%) | loss 2.345 | lr 3.0e-04 | 15.2k tok/s | ETA 4m03s'."""
    sps = self.seconds_per_step
    known = not math.isnan(sps) and sps > 0
    rate = f"{self.tokens_per_step / sps / 1e3:.1f}k tok/s" if known else "-- tok/s"
    eta = format_duration((self.num_steps - step) * sps) if known else "--"
    return (f"step {step}/{self.num_steps} ({100 * step / self.num_steps:.0f}%) | "
            f"loss {metrics.get('loss', float('nan')):.4f} | "
            f"lr {metrics.get('learning_rate', float('nan')):.2e} | "
            f"grad_norm {metrics.get('grad_norm', float('nan')):.3f} | {rate} | ETA {eta}")


def log_parameter_count(params: Any) -> int:
  """Logs and returns the number of parameters."""
  count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  logging.info("Model parameters: %s (%.1fM)", f"{count:,}", count / 1e6)
  return count
