"""--mode=train: train_and_evaluate(--config, --workdir), the default mode; rerunning resumes.

After the loop (finished, or stopped by a signal and saved) process 0 draws the curves
of metrics.jsonl into `<workdir>/plots/` and prints a summary: the step reached, the
wall time, the final and best evaluation, and where the outputs are. Reporting is
called from here, above the loop, so training never imports the reports.

Exit status (launch.py): 0 finished (or already complete), 130 / 143 stopped by
Ctrl-C / SIGTERM after saving (128 + the signal; rerun to resume); a second signal
stops at once, with the status of its own signal (training/signals.py).
"""

from __future__ import annotations

import os
import signal
import time

import jax
import ml_collections
from absl import logging

from transformer import sharding
from transformer.cli import common
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.reports import plots
from transformer.training import fine_tune
from transformer.training import loop
from transformer.training import signals
from transformer.training.trainer import batch_share, check_divisible
from transformer.workdir import checkpointing
from transformer.workdir import layout
from transformer.workdir import run_record
from transformer.workdir.console import format_duration

STARTS_JAX = True
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ()


def check_config(config: ml_collections.ConfigDict, workdir: str = "") -> None:
  """What can be checked before the workdir is touched: keys, values, the mesh, the batch,
  that every weight divides over its mesh axes, and that init_from's parameters fit.

  With config.init_from, the source run's model and tokenizer keys replace the preset's
  first (in place; the command line's --config.x keys stay: training/fine_tune.py).
  launch.py calls it first, so a config that fails creates nothing (not even log.txt).
  """
  fine_tune.take_source_model(config, common.config_overrides(), workdir)
  validate(config)
  mesh = sharding.make_mesh(config.mesh)
  batch_share(config, mesh)
  if config.model.vocab_size:  # 0: the tokenizer's size; Trainer.create checks it then.
    check_divisible(config, mesh)
  fine_tune.check_parameters_fit(config, workdir)


def summary(workdir: str, num_steps: int, session_seconds: float,
            interrupted: signals.Interrupted | None = None,
            sessions_before: list | None = None) -> str:
  """The end-of-run lines: step reached, wall time, final and best eval_loss, the outputs.

  `sessions_before`: run.json's sessions when this session started; "all sessions" is
  the earlier ones plus this one (run_record.total_seconds).
  """
  step = checkpointing.newest_complete_step(workdir)
  state = ("finished" if step is not None and step >= num_steps else
           f"stopped by {signal.Signals(interrupted.signum).name}" if interrupted
           else "unfinished")
  total = run_record.total_seconds(workdir, sessions_before or [], session_seconds)
  lines = [f"Run summary: step {step}/{num_steps} ({state}); this session "
           f"{format_duration(session_seconds)}"
           + (f", all sessions {format_duration(total)} (run.json)"
              if total is not None else "")]
  try:
    eval_loss = plots.read_series(workdir).get("eval_loss")
  except ConfigError:  # No metrics.jsonl rows yet.
    eval_loss = None
  if eval_loss is not None:
    best = int(eval_loss.values.argmin())
    lines.append(f"  eval_loss: final {eval_loss.values[-1]:.4g} (step {eval_loss.steps[-1]}), "
                 f"best {eval_loss.values[best]:.4g} (step {eval_loss.steps[best]})")
  lines.append(f"  outputs in {os.path.abspath(workdir)}: {layout.CHECKPOINTS}/, "
               f"{layout.METRICS}, {layout.PLOTS}/, {layout.LOG}, {layout.CONFIG}")
  return "\n".join(lines)


def main(config: ml_collections.ConfigDict, workdir: str) -> int:
  """launch.py --mode=train; returns the exit status (see the module docstring)."""
  started = time.perf_counter()
  sessions_before = run_record.sessions(workdir)
  interrupted = None
  try:
    loop.train_and_evaluate(config, workdir)
  except signals.Interrupted as e:  # The plots and the summary still come.
    interrupted = e
  if jax.process_index() == 0:
    plots.write_plots_after_training(workdir)
    logging.info("%s", summary(workdir, config.train.num_steps,
                               time.perf_counter() - started, interrupted,
                               sessions_before))
  if interrupted is not None:
    logging.warning("%s (exit status %d)", interrupted, interrupted.exit_status)
    return interrupted.exit_status
  return 0
