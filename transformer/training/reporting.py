"""What a training run reports: a row per `train.log_every` steps, the progress line,
the non-finite guard, and a hint about train.steps_per_call.

The loop hands each compiled call's metrics over one call late (`DispatchedCall`,
fetched while the next call runs); `Reporter.report_call` checks each of its steps
with the `NonFiniteGuard` and adds it to the sums of the next row.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import jax
import ml_collections
from absl import logging

from transformer.config import objective as objective_lib
from transformer.config.model import ModelConfig
from transformer.data.corpus import mixture
from transformer.training import flops
from transformer.training import metrics as metrics_lib
from transformer.workdir import metrics_file


@dataclasses.dataclass(frozen=True)
class DispatchedCall:
  """A compiled call of `count` steps ending at `last_step`, its metrics still on the device."""
  last_step: int
  count: int
  metrics: Any  # Each value has a leading axis of the call's steps when count > 1.
  shown: bool  # Its last step gets a row whatever train.log_every says.


class NonFiniteGuard:
  """Stops at a non-finite step; with optimizer.skip_nonfinite=N, at N skipped in a row.

  Fed every step's fetched metrics in order; the loop checks a step before it
  evaluates or saves its state, so a non-finite state never reaches a checkpoint.
  """

  def __init__(self, limit: int, total: int = 0):
    self.limit = limit  # 0: stop at the first; else skipping is on (see train_step).
    self.total = total  # Skipped updates in the whole run (restored from metrics.jsonl).
    self.streak: list[int] = []  # Steps skipped in a row, up to the latest.

  def check(self, step: int, host: dict[str, Any]) -> None:
    """Raises FloatingPointError naming the step(s) when the run must stop."""
    if float(host.get("skipped_updates", 0.0)) > 0:
      self.streak.append(step)
      self.total += 1
      logging.warning("Step %d: non-finite loss or gradients, update skipped (%d in a row "
                      "of at most optimizer.skip_nonfinite=%d; %d in the run)", step,
                      len(self.streak), self.limit, self.total)
      if len(self.streak) >= self.limit:
        raise FloatingPointError(
            f"Non-finite loss or gradients at {len(self.streak)} steps in a row (steps "
            f"{', '.join(map(str, self.streak))}), optimizer.skip_nonfinite={self.limit}: "
            "stopping. Their updates were skipped; the newest checkpoint holds finite "
            "parameters. Lower the learning rate or check the data at these steps.")
      return
    self.streak = []
    loss = float(host["loss_sum"]) / max(float(host["weight_sum"]), 1.0)
    grad_norm = float(host.get("grad_norm", 0.0))
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
      raise FloatingPointError(
          f"Non-finite training loss {loss} or gradient norm {grad_norm} at step {step}; "
          "the state after it was not saved (the newest checkpoint is from before it). "
          f"Metrics: {json.dumps({k: float(v) for k, v in host.items()})}. Lower the "
          "learning rate, or set optimizer.skip_nonfinite=N to skip such updates.")


class Reporter:
  """Turns fetched training metrics into metrics.jsonl rows and progress lines."""

  def __init__(self, config: ml_collections.ConfigDict,
               writer: metrics_file.MetricWriter | None,
               progress: metrics_lib.TrainProgress | None, local_rows: int,
               guard: NonFiniteGuard | None = None):
    """`local_rows`: the rows this process reads a step, its input share of the batch
    (trainer.batch_share's rows: batch_size // sharding.input_shard's count), not
    batch_size // the process count: processes across a tensor or context axis read
    the same rows. Each share mixes its own rows by the same rule (data/corpus/mixture.py)."""
    self.config = config
    self.writer = writer
    self.progress = progress
    self.guard = guard or NonFiniteGuard(config.optimizer.skip_nonfinite)
    self.local_rows = local_rows

  def report_call(self, call: DispatchedCall, sums: dict[str, Any] | None
                  ) -> tuple[dict[str, Any] | None, dict[str, float] | None]:
    """Fetches one call's metrics and reports each of its steps in order.

    Args:
      call: the call, dispatched earlier.
      sums: the training sums since the last row (None: none yet).

    Returns:
      (sums, summary): the sums since the last row after this call (None when its
      last step wrote one), and the newest row the call wrote, if any.
    """
    host = jax.device_get(call.metrics)
    # The clock is per call: its steps share its time (the first call only starts it).
    self.progress.update(call.last_step)
    summary = None
    for i in range(call.count):
      # A call of several steps returns each metric with a leading axis of its steps.
      one = host if call.count == 1 else {k: v[i] for k, v in host.items()}
      step = call.last_step - call.count + 1 + i
      sums, row = self.report_step(step, one, sums,
                                   force=call.shown and step == call.last_step)
      summary = row or summary
    return sums, summary

  def report_step(self, step: int, host: dict[str, Any], sums: dict[str, Any] | None,
                  force: bool = False
                  ) -> tuple[dict[str, Any] | None, dict[str, float] | None]:
    """Checks a finished step's loss and gradient norm; logs every `train.log_every` steps.

    Args:
      step: the step.
      host: that step's metrics on the host (`report_call` fetched them and updated
        the progress clock, once per call).
      sums: the training sums since the last row.
      force: write a row whatever train.log_every says.

    Returns:
      (sums, row): the sums after this step (None once a row took them) and the row
      written, if any.
    """
    config = self.config
    host = dict(host)  # Popped below; the caller's dict stays whole.
    self.guard.check(step, host)
    # Norms and the learning rate are per-step values: keep the latest, not a sum.
    per_step = {k: host.pop(k) for k in ("learning_rate", "grad_norm", "param_norm",
                                         "update_norm")}
    host.pop("objective_sum")
    sums = metrics_lib.add_sums(sums, host)
    if step % config.train.log_every and not force and step != config.train.num_steps:
      return sums, None
    summary = metrics_lib.summarize(sums)
    summary.update({k: float(v) for k, v in per_step.items()})
    summary.update(self.progress.rates())  # seconds_per_step, tokens_per_second, mfu.
    # data.mixture: each corpus's share of the rows so far (exact: data/corpus/mixture.py).
    mixed = mixture.realised(config, step * self.local_rows)
    summary.update(mixed)
    line = self.progress.line(step, summary)
    if mixed:
      line += " | " + mixture.describe(mixed)
    if self.guard.limit:
      summary["skipped_total"] = float(self.guard.total)
      line += f" | skipped {summary['skipped_updates']:.0f} ({self.guard.total} in the run)"
    logging.info("%s", line)
    self.writer.write(step, summary)
    return None, summary


def hint_steps_per_call(config: ml_collections.ConfigDict) -> None:
  """On a CPU, says when several steps per call would run the same updates faster.

  XLA:CPU allocates a step's temporaries at every call (fresh pages from the OS above
  glibc's mmap threshold); a call of k steps pays that once (docs/performance.md).
  """
  if config.train.steps_per_call != 1 or jax.devices()[0].platform != "cpu":
    return
  cadence = math.gcd(config.train.log_every, config.train.eval_every, config.checkpoint.every)
  per_call = max(d for d in range(1, 11) if cadence % d == 0)
  if per_call > 1:
    logging.info("On a CPU, --config.train.steps_per_call=%d runs the same updates faster "
                 "(%d steps per compiled call; docs/performance.md)", per_call, per_call)


def format_metrics(metrics: dict[str, float]) -> str:
  """'eval_loss 2.345 | eval_accuracy 0.4321': a log line's metrics."""
  return " | ".join(f"{k} {v:.4g}" for k, v in metrics.items())


def make_progress(config: ml_collections.ConfigDict, workdir: str, model_config: ModelConfig,
                  objective: objective_lib.Objective,
                  start_step: int) -> metrics_lib.TrainProgress:
  """The progress clock of a (re)start at `start_step`, with the model FLOPs and the peak."""
  # Tokens the model reads per step (both sides for seq2seq).
  sides = objective.sides  # Tokens the model reads per step: both sides for seq2seq.
  model_flops = flops.train_flops_per_step(model_config, config.data.batch_size,
                                           config.data.seq_len)
  peak, peak_source = flops.peak_flops(workdir)
  logging.info("Model FLOPs per step %.4g (flops.py); MFU is against %.4g FLOP/s, the %s",
               model_flops, peak, peak_source)
  return metrics_lib.TrainProgress(start_step, config.train.num_steps,
                                   sides * config.data.batch_size * config.data.seq_len,
                                   model_flops, peak)
