"""A run's metrics.jsonl (one JSON row per step) and its TensorBoard events.

`MetricWriter` appends rows and scalars (process 0 only), makes them durable before a
checkpoint, and on resume drops what a stopped run wrote past its checkpoint;
`read_rows` reads the file back (reports, sweeps, a finished run's result). With
train.wandb_project set, each row it writes also goes to a Weights & Biases run
(wandb_run.py), started once the run's restore succeeded (`resume`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

import ml_collections
from absl import logging

from transformer.workdir import layout
from transformer.workdir import wandb_run

# Metric name prefix of each expert's share of the assignments: moe_load_0, moe_load_1, ...
# The writer also draws such rows as one TensorBoard histogram.
MOE_LOAD_PREFIX = "moe_load_"
# Series logged beside a metric <key> for its figure (train.benchmarks' accuracies):
# <key>_ci95_low, <key>_ci95_high (its 95% interval) and <key>_chance (its chance level).
# reports/plots.py draws them on <key>'s figure, never on figures of their own.
CI95_LOW, CI95_HIGH, CHANCE = "_ci95_low", "_ci95_high", "_chance"
BESIDE = (CI95_LOW, CI95_HIGH, CHANCE)
# <key>/<group>: <key> over one group of the tokens (eval_loss/R, eval_tokens/R: a UL2
# run's loss per denoiser). reports/ draws such a series on <key>'s figure and lists it
# beside <key>, never as a metric of its own; TensorBoard and W&B group by the "/".
GROUP_SEPARATOR = "/"


def read_rows(path: str) -> tuple[list[dict[str, Any]], int]:
  """The rows of a metrics.jsonl file, and how many lines were unreadable (a torn write)."""
  rows, unreadable = [], 0
  if not os.path.exists(path):
    return rows, unreadable
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        row = json.loads(line)
      except ValueError:
        unreadable += 1
        continue
      if isinstance(row, dict) and "step" in row:
        rows.append(row)
      else:
        unreadable += 1
  return rows, unreadable


class MetricWriter:
  """Writes metrics to `<workdir>/metrics.jsonl` and TensorBoard (process 0 only)."""

  def __init__(self, workdir: str, enabled: bool = True,
               config: ml_collections.ConfigDict | None = None):
    """`config`: the run's, whose train.wandb_* say whether rows also go to W&B."""
    self.enabled = enabled
    self._wandb_config, self._wandb = config, None
    self._workdir = workdir
    if not enabled:
      return
    self._path = os.path.join(workdir, layout.METRICS)
    self._logdir = os.path.join(workdir, layout.TENSORBOARD)
    self._jsonl = open(self._path, "a", encoding="utf-8")
    self._tb_writer = None  # Opened on first use, after `resume` has set the purge step.
    self._purge_step = None

  @property
  def _tb(self):
    if self._tb_writer is None:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      # The file name holds the time in seconds; the suffix keeps a second writer
      # started within the same second from truncating the first one's file.
      self._tb_writer = SummaryWriter(logdir=self._logdir, purge_step=self._purge_step,
                                      filename_suffix=f".{time.time_ns()}")
      self._purge_step = None  # Only the first file after a resume purges.
    return self._tb_writer

  def sync(self) -> None:
    """Makes everything written so far durable; call before saving a checkpoint.

    The rows up to a checkpoint's step must survive a crash, since a resumed run
    does not write them again. tensorboardX writes events from a background queue
    that its flush() does not drain, so the events file is closed; the next write
    opens a new one.
    """
    if not self.enabled:
      return
    self._jsonl.flush()
    os.fsync(self._jsonl.fileno())
    if self._tb_writer is not None:
      self._tb_writer.close()
      self._tb_writer = None

  def resume(self, step: int) -> list[dict[str, Any]]:
    """Forgets what a run that stopped after checkpoint `step` wrote past it.

    That run's rows with a step > `step` (and torn lines) are dropped from
    metrics.jsonl, which is rewritten atomically (temp file, fsync, rename), so that
    the resumed run writes each step exactly once; the TensorBoard events from
    step + 1 on are purged by a new events file that starts with a purge marker.
    Call before the first write; `step=-1` (a start from scratch) drops every row.

    Args:
      step: the step the run resumes from (its checkpoint's), or -1.

    Returns:
      The rows kept, in file order.
    """
    if not self.enabled:
      return []
    rows, unreadable = read_rows(self._path)
    kept = [row for row in rows if row["step"] <= step]
    dropped = len(rows) - len(kept) + unreadable
    if dropped:
      self._jsonl.close()
      temporary = self._path + ".tmp"
      with open(temporary, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in kept)
        f.flush()
        os.fsync(f.fileno())
      os.replace(temporary, self._path)
      self._jsonl = open(self._path, "a", encoding="utf-8")
      if step < 0:  # A start from scratch: no step to name.
        logging.warning("metrics.jsonl: dropped %d rows (%d unreadable) of an earlier start "
                        "that left no usable checkpoint; this run starts at step 0 and "
                        "writes its own", dropped, unreadable)
      else:
        logging.warning("metrics.jsonl: dropped %d rows written after step %d by the run "
                        "that stopped there (%d unreadable); the resumed run writes them "
                        "again", dropped, step, unreadable)
    if self._tb_writer is not None:  # Written already: start a new events file.
      self._tb_writer.close()
      self._tb_writer = None
    # A TensorBoard events file that starts with purge step s hides events of steps >= s
    # from earlier files. Only needed when another run wrote here before.
    self._purge_step = step + 1 if os.path.isdir(self._logdir) else None
    if self._wandb is None and self._wandb_config is not None:
      self._wandb = wandb_run.start(self._wandb_config, self._workdir, self.enabled)
    return kept

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    """Appends one JSON line {"step": step, **metrics} and one TensorBoard scalar each."""
    if not self.enabled:
      return
    self._jsonl.write(json.dumps({"step": int(step), **metrics}) + "\n")
    self._jsonl.flush()
    if self._wandb is not None:
      self._wandb.log(step, metrics)
    for name, value in metrics.items():
      self._tb.add_scalar(name, value, int(step))
    self._expert_load_histogram(step, metrics)
    self._tb.flush()

  def _expert_load_histogram(self, step: int, metrics: Mapping[str, float]) -> None:
    """`moe_load_<e>` rows (a MoE model's share of assignments per expert) also as one
    TensorBoard histogram, `moe_expert_load`: bucket e holds expert e's share, so the
    Histograms tab shows the load spreading or collapsing over the steps."""
    loads = sorted((int(name[len(MOE_LOAD_PREFIX):]), float(value))
                   for name, value in metrics.items() if name.startswith(MOE_LOAD_PREFIX))
    if not loads:
      return
    experts = [e for e, _ in loads]
    shares = [share for _, share in loads]
    self._tb.add_histogram_raw(
        "moe_expert_load", min=experts[0], max=experts[-1], num=sum(shares),
        sum=sum(e * share for e, share in loads),
        sum_squares=sum(e * e * share for e, share in loads),
        bucket_limits=[e + 0.5 for e in experts], bucket_counts=shares,
        global_step=int(step))

  def write_text(self, step: int, tag: str, text: str) -> None:
    """Adds `text` (Markdown) under `tag` to TensorBoard's Text tab; metrics.jsonl stays numeric."""
    if not self.enabled:
      return
    self._tb.add_text(tag, text, int(step))
    self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      if self._tb_writer is not None:
        self._tb_writer.close()
      if self._wandb is not None:
        self._wandb.finish()
        self._wandb = None


def latest_values(workdir: str) -> dict[str, float]:
  """The newest value of every metric in the run's metrics.jsonl (a finished run's result)."""
  rows, _ = read_rows(os.path.join(workdir, layout.METRICS))
  latest: dict[str, float] = {}
  for row in sorted(rows, key=lambda r: r["step"]):
    latest.update({k: float(v) for k, v in row.items() if k != "step"})
  return latest
