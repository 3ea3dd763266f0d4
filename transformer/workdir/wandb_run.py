"""Weights & Biases beside metrics.jsonl: the run's rows also logged to a W&B run.

`--config.train.wandb_project=NAME` (configs/base.py's train.wandb_*): the metric
writer (metrics_file.MetricWriter, process 0 only) hands every row it writes to
metrics.jsonl (training, evaluation, benchmarks: one home, so W&B gets exactly the
file's scalars) to `WandbRun.log`. The W&B run is named after the workdir, carries the
resolved config, and its id is kept in `<workdir>/wandb_run.json` (layout.WANDB_RUN),
so that a resume continues the same W&B run. Rows use the run's own `step` as their
x-axis (`define_metric`): a resume that rewrites rows past its checkpoint logs them
again at their steps, whatever W&B's internal counter says.

wandb is imported only here, and only when a project is set; without the package the
config check stops the run first (config/train.py: `pip install wandb`).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Mapping

import ml_collections
from absl import logging

from transformer.workdir import files
from transformer.workdir import layout


def _run_id(workdir: str) -> tuple[str, bool]:
  """The W&B run id of this workdir (kept in wandb_run.json), and whether it is new."""
  path = os.path.join(workdir, layout.WANDB_RUN)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return str(json.load(f)["id"]), False
  run_id = uuid.uuid4().hex[:12]  # W&B ids: letters and digits.
  files.write_atomically(path, json.dumps({"id": run_id}, indent=2))
  return run_id, True


class WandbRun:
  """One W&B run for one training session; `log` takes metrics.jsonl's rows."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    import wandb  # pylint: disable=g-import-not-at-top
    train = config.train
    run_id, new = _run_id(workdir)
    name = os.path.basename(os.path.normpath(os.path.abspath(workdir)))
    # W&B's files go to the workdir (its wandb/), unless the user points WANDB_DIR elsewhere.
    directory = os.environ.get("WANDB_DIR") or workdir
    os.makedirs(directory, exist_ok=True)
    self._run = wandb.init(
        project=train.wandb_project, entity=train.wandb_entity or None,
        mode=train.wandb_mode or None, id=run_id, resume="allow", name=name,
        dir=directory, config=config.to_dict(), settings=wandb.Settings(silent=True, console="off"))
    self._run.define_metric("step")
    self._run.define_metric("*", step_metric="step")
    logging.info("Weights & Biases: %s run %s (%s, id %s, %s)",
                 "new" if new else "continuing", name,
                 train.wandb_project if not train.wandb_entity
                 else f"{train.wandb_entity}/{train.wandb_project}", run_id,
                 self._run.settings.mode)

  def log(self, step: int, metrics: Mapping[str, Any]) -> None:
    """One metrics.jsonl row: its scalars at `step`."""
    self._run.log({"step": int(step), **{k: float(v) for k, v in metrics.items()}})

  def finish(self) -> None:
    self._run.finish()


def start(config: ml_collections.ConfigDict, workdir: str, enabled: bool) -> WandbRun | None:
  """The W&B run of this session, or None when train.wandb_project is "" (or not process 0)."""
  if not enabled or not config.train.wandb_project:
    return None
  return WandbRun(config, workdir)
