"""PNG curves of a run's metrics.jsonl: `python launch.py --mode=plot --workdir=DIR`.

A training run also writes them when it ends (or stops on SIGINT/SIGTERM), into
`<workdir>/plots/`: loss.png (train and eval; a UL2 run's eval loss per denoiser,
eval_loss/R, /S, /X, beside them), learning_rate.png, grad_norm.png,
tokens_per_second.png, mfu.png (when the run knew its peak FLOP/s), and one figure
per other eval metric (accuracy.png with the train accuracy beside it, bleu.png, ...).
A benchmark accuracy (train.benchmarks: eval_<task>_acc_norm, eval_benchmark_acc, ...)
is drawn with its 95% interval, a band from the `<key>_ci95_low` / `<key>_ci95_high`
series the run logs beside it, and its chance level, a dashed line at the last
`<key>_chance`: with the 100 documents a task is scored on by default the interval is
about +-0.1, so a difference inside it is noise.
A figure whose metrics the run did not log is not drawn. Matplotlib's Figure API
draws on the Agg (PNG) canvas: no display and no pyplot state.

Reading the rows (shared with reports/compare.py): a row whose step is below
the previous row's is a restart from an earlier checkpoint, so the rows before it
at that step or later are dropped; of several values of one metric at one step the
last wins. A resumed run's curves therefore never zig-zag, even in a file written
before MetricWriter.resume rewrote superseded rows itself.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Any, Sequence

import numpy as np
from absl import logging

from transformer.config.errors import ConfigError
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir.metrics_file import BESIDE, CHANCE, CI95_HIGH, CI95_LOW
from transformer.workdir.metrics_file import GROUP_SEPARATOR, read_rows

# Eval metrics with no figure of their own: perplexity is exp(loss), tokens a count.
NOT_PLOTTED = ("eval_loss", "eval_perplexity", "eval_tokens")


@dataclasses.dataclass(frozen=True)
class Series:
  """One metric over steps, steps increasing."""

  steps: np.ndarray
  values: np.ndarray


def effective_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """The rows left once each restart has superseded what was written after its step."""
  kept: list[dict[str, Any]] = []
  for row in rows:
    if kept and row["step"] < kept[-1]["step"]:
      kept = [r for r in kept if r["step"] < row["step"]]
    kept.append(row)
  return kept


def tokens_per_step(workdir: str) -> int | None:
  """Tokens the model reads per step, from config.json (as the training loop's progress line counts)."""
  try:
    with open(os.path.join(workdir, layout.CONFIG), encoding="utf-8") as f:
      config = json.load(f)
    sides = 2 if config["model"]["arch"] == "encoder_decoder" else 1  # Source and target.
    return sides * int(config["data"]["batch_size"]) * int(config["data"]["seq_len"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def read_series(workdir: str) -> dict[str, Series]:
  """Every numeric metric of `<workdir>/metrics.jsonl` (tokens_per_second derived if missing).

  Raises:
    ConfigError: naming the path, when the file is missing or holds no rows.
  """
  path = os.path.join(workdir, layout.METRICS)
  if not os.path.isfile(path):
    raise ConfigError(f"{path} does not exist: --workdir must be the workdir of a training "
                      "run (its metrics.jsonl holds the curves)")
  rows, unreadable = read_rows(path)
  if unreadable:
    logging.warning("%s: skipped %d unreadable lines", path, unreadable)
  if not rows:
    raise ConfigError(f"{path} holds no metric rows yet: nothing to plot")
  by_key: dict[str, dict[int, float]] = {}
  for row in effective_rows(rows):
    for key, value in row.items():
      if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
        by_key.setdefault(key, {})[int(row["step"])] = float(value)
  tokens = tokens_per_step(workdir)
  # Runs since the training loop records tokens_per_second have it; older ones get it here.
  if "tokens_per_second" not in by_key and tokens and "seconds_per_step" in by_key:
    by_key["tokens_per_second"] = {step: tokens / seconds for step, seconds
                                   in by_key["seconds_per_step"].items() if seconds > 0}
  series = {}
  for key, values in by_key.items():
    steps = sorted(values)
    series[key] = Series(np.asarray(steps), np.asarray([values[s] for s in steps]))
  return series


@dataclasses.dataclass(frozen=True)
class Interval:
  """A metric's 95% interval over steps, and its chance level (None: none logged)."""

  low: Series
  high: Series
  chance: float | None = None


def interval_of(series: dict[str, Series], key: str) -> Interval | None:
  """The interval logged beside metric `key` (`<key>_ci95_low/high`, `<key>_chance`)."""
  if key + CI95_LOW not in series or key + CI95_HIGH not in series:
    return None
  chance = series.get(key + CHANCE)
  return Interval(series[key + CI95_LOW], series[key + CI95_HIGH],
                  None if chance is None else float(chance.values[-1]))


def line_figure(title: str, ylabel: str, lines: Sequence[tuple[str, Series]],
                log_steps: bool = False, zoom: bool = False,
                intervals: Sequence[Interval | None] = ()):
  """A matplotlib Figure with one line per (label, series), step on the x axis.

  With `zoom`, a second panel shows the last three quarters of the steps with its own
  y range, where runs that differ by a few percent are told apart (the first panel's
  range is set by the untrained model's loss). `intervals` (one per line, or None):
  each line's 95% interval as a band in its colour, and its chance level dashed.
  """
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figure = Figure(figsize=(11.0 if zoom else 6.4, 4.0), dpi=100)
  # Fixed margins: a layout engine costs more than the drawing at the end of every run.
  figure.subplots_adjust(left=0.08 if zoom else 0.12, right=0.98 if zoom else 0.97,
                         bottom=0.12, top=0.9, wspace=0.2)
  panels = figure.subplots(1, 2 if zoom else 1, squeeze=False)[0]
  last_step = max(int(series.steps[-1]) for _, series in lines)
  for index, axes in enumerate(panels):
    first_step = last_step // 4 if index else 0
    chances = set()
    for (label, series), interval in zip(lines, list(intervals) + [None] * len(lines)):
      keep = series.steps >= first_step
      sparse = len(series.steps) <= 40  # Evaluations: show each point.
      line, = axes.plot(series.steps[keep], series.values[keep], label=label,
                        marker="o" if sparse else None, markersize=3)
      if interval is not None:
        band = interval.low.steps >= first_step
        axes.fill_between(interval.low.steps[band], interval.low.values[band],
                          interval.high.values[band], color=line.get_color(), alpha=0.2,
                          label=f"{label} 95% interval")
        if interval.chance is not None and interval.chance not in chances:
          chances.add(interval.chance)
          axes.axhline(interval.chance, color="grey", linestyle="--", linewidth=1,
                       label=f"chance {interval.chance:.3f}")
    if log_steps:  # symlog keeps step 0 (the evaluation before training) on the axis.
      axes.set_xscale("symlog", linthresh=1)
    axes.set_title(f"{title}: steps >= {first_step}" if index else title)
    axes.set_xlabel("step")
    axes.grid(True, alpha=0.3)
  panels[0].set_ylabel(ylabel)
  if len(lines) > 1 or any(i is not None for i in intervals):
    panels[0].legend()
  return figure


def eval_metric_names(series_keys) -> list[str]:
  """Eval metrics that get a figure: eval_accuracy, eval_bleu, ... (not loss, perplexity,
  nor an interval or chance level, nor a group's series such as eval_loss/R: those are
  drawn on their metric's figure)."""
  return sorted(k for k in series_keys if k.startswith("eval_") and k not in NOT_PLOTTED
                and not k.endswith(BESIDE) and GROUP_SEPARATOR not in k)


def group_keys(series_keys, key: str) -> list[str]:
  """The series of `key` over groups of the tokens, `<key>/<group>` (a UL2 run's
  eval_loss/R, /S, /X: metrics_file.GROUP_SEPARATOR), in name order."""
  return sorted(k for k in series_keys if k.startswith(key + GROUP_SEPARATOR))


def _with_groups(series_keys, key: str, label: str) -> list[tuple[str, str]]:
  """(key, label) and each of its groups' series beside it: ("eval_loss/R", "eval R")."""
  return [(key, label)] + [(group, f"{label} {group.split(GROUP_SEPARATOR, 1)[1]}")
                           for group in group_keys(series_keys, key)]


def run_figures(series: dict[str, Series], run: str, log_steps: bool = False) -> dict[str, Any]:
  """{file stem: Figure} for one run's series; metrics the run lacks are left out."""
  # (file stem, title, y label, [(series key, legend label)]).
  specs = [("loss", "loss", "cross-entropy (nats/token)",
            [("loss", "train"), ("eval_loss", "eval")]),
           ("learning_rate", "learning rate", "learning rate",
            [("learning_rate", "learning rate")]),
           ("grad_norm", "gradient norm (before clipping)", "global norm",
            [("grad_norm", "gradient norm")]),
           ("tokens_per_second", "throughput", "tokens/s (model inputs)",
            [("tokens_per_second", "tokens/s")]),
           ("mfu", "model FLOPs utilisation", "MFU", [("mfu", "MFU")])]
  for key in eval_metric_names(series):
    name = key[len("eval_"):]
    specs.append((name, name, name, [(name, "train"), (key, "eval")]))
  figures = {}
  for stem, title, ylabel, wanted in specs:
    wanted = [line for key, label in wanted for line in _with_groups(series, key, label)]
    lines = [(label, series[key]) for key, label in wanted if key in series]
    if lines:
      intervals = [interval_of(series, key) for key, _ in wanted if key in series]
      figures[stem] = line_figure(f"{run}: {title}", ylabel, lines, log_steps,
                                  intervals=intervals)
  return figures


def png_bytes(figure) -> bytes:
  """`figure` drawn as a PNG (Agg), in memory: a mode writes it with its other files."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  FigureCanvasAgg(figure)
  png = io.BytesIO()
  figure.savefig(png, format="png")
  return png.getvalue()


def save_figure(figure, path: str) -> None:
  """Writes `figure` as a PNG (Agg) through the one atomic write: no reader sees half an
  image, and a failure (a full disk) leaves no temporary file. Hosts of a pod sweep may
  write the same file: each write has a temporary name of its own."""
  files.write_atomically(path, png_bytes(figure))


def write_plots(workdir: str, log_steps: bool = False) -> list[str]:
  """Writes `<workdir>/plots/<metric>.png` for the metrics the run logged.

  Args:
    workdir: a training run's workdir.
    log_steps: a log-scaled step axis (symlog, so step 0 stays).

  Returns:
    The paths written.

  Raises:
    ConfigError: naming the path, when the workdir has no metrics.jsonl or no rows.
  """
  series = read_series(workdir)
  figures = run_figures(series, os.path.basename(os.path.normpath(workdir)), log_steps)
  directory = os.path.join(workdir, layout.PLOTS)
  os.makedirs(directory, exist_ok=True)
  paths = []
  for stem, figure in figures.items():
    paths.append(os.path.join(directory, stem + ".png"))
    save_figure(figure, paths[-1])
  logging.info("Plots of %s: %s", workdir, ", ".join(os.path.basename(p) for p in paths))
  return paths


def write_plots_after_training(workdir: str) -> None:
  """write_plots at the end of a run; a failure is logged, never fails the finished run."""
  try:
    write_plots(workdir)
  except Exception as e:  # pylint: disable=broad-except
    # The checkpoint and metrics are safe already; plots can be redrawn with --mode=plot.
    logging.warning("Could not write the plots of %s (%s: %s); rerun "
                    "`python launch.py --mode=plot --workdir=%s`", workdir,
                    type(e).__name__, e, workdir)

