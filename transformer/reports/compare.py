"""Compares runs: `python launch.py --mode=compare --workdir=DIR [--compare_dirs=a,b,c]`.

Writes `DIR/compare.md` (also printed) and `DIR/compare_*.png`; the end of a sweep
runs it on the sweep's runs. The runs are `--compare_dirs` when given, else the runs
of the sweep in DIR (its sweep.json, in sweep order), else DIR's subfolders that hold
a metrics.jsonl.

Where each column comes from:
  - the config keys whose values differ between the runs: each run's config.json;
  - parameters and wall time: run.json (transformer/workdir/run_record.py; "—" for runs
    older than it);
  - status (a sweep's runs): the sweep.json of the folder above the run: finished,
    failed, diverged, stopped, running, pending, or "in use by PID N on HOST" (another
    command held its workdir), with the reason under the table;
  - MFU: metrics.jsonl's mfu x the run's own measured peak (peak_flops.json), over one
    peak for all runs (the largest measured), so runs compare as their FLOP/s do;
  - steps, final and best eval metrics (a UL2 run's eval_loss/R, /S, /X after
    eval_loss), tokens/s: metrics.jsonl, read as the plots
    read it (transformer/reports/plots.py: a restart supersedes the rows after its step);
    a run with train.benchmarks has its downstream scores among them
    (eval_<task>_acc_norm, eval_benchmark_acc, ...), so a sweep's arms rank by them too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import numpy as np

from transformer.config.errors import ConfigError
from transformer.reports import plots
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import run_record
from transformer.workdir.console import format_duration

MAX_KEY_COLUMNS = 8  # More differing keys than this are listed under the table.
# Metrics whose best is the lowest, by the end of their name: eval_loss, and a
# benchmark's eval_<task>_bits_per_byte (train.benchmarks); accuracies, BLEU, ... highest.
LOWER_IS_BETTER = ("loss", "perplexity", "bits_per_byte")


@dataclasses.dataclass
class RunSummary:
  """What the table and the overlaid curves read of one workdir."""

  name: str
  workdir: str
  config: dict[str, Any]  # Flattened config.json: {"model.norm": "pre", ...}; {} if none.
  series: dict[str, plots.Series]  # {} for a run that logged nothing yet.
  record: dict[str, Any]  # run.json; {} if none.
  peak: float | None = None  # The FLOP/s its MFU was divided by (peak_flops.json), if measured.
  outcome: dict[str, Any] = dataclasses.field(default_factory=dict)  # Its sweep's record.


def sweep_runs(directory: str) -> list[dict[str, Any]]:
  """The runs a sweep recorded in `directory`'s sweep.json ([] if there is none)."""
  try:
    with open(os.path.join(directory, layout.SWEEP_RECORD), encoding="utf-8") as f:
      return list(json.load(f)["runs"])
  except (OSError, ValueError, KeyError, TypeError):
    return []


@dataclasses.dataclass(frozen=True)
class MissingRun:
  """A run a sweep recorded as started whose folder is gone (deleted, moved)."""

  name: str
  folder: str  # Where the sweep put it: <sweep dir>/<name>.
  outcome: dict[str, Any]  # Its sweep.json entry's status, step, reason.

  def describe(self) -> str:
    """"norm=post (finished at step 20; expected folder runs/x/norm=post)"."""
    status = self.outcome.get("status", "?")
    if self.outcome.get("step") is not None:
      status += f" at step {self.outcome['step']}"
    return f"{self.name} ({status} in {layout.SWEEP_RECORD}; expected folder {self.folder})"


def missing_runs(directory: str) -> list[MissingRun]:
  """The runs `directory`'s sweep.json records as started (any status but pending:
  finished, failed, stopped, ...) whose folder is not there, in sweep order."""
  return [MissingRun(run["name"], os.path.join(directory, run["name"]),
                     {k: run[k] for k in ("status", "step", "reason") if k in run})
          for run in sweep_runs(directory)
          if isinstance(run, dict) and "name" in run
          and run.get("status", "pending") != "pending"
          and not os.path.isdir(os.path.join(directory, run["name"]))]


def missing_line(missing: Sequence[MissingRun]) -> str:
  """The one line --mode=compare ends with (exit 1) when a sweep's runs are missing."""
  return (f"{len(missing)} run(s) that {layout.SWEEP_RECORD} records are missing, so "
          f"{layout.COMPARE} compares the others and lists these as missing: "
          + "; ".join(run.describe() for run in missing)
          + "; restore the folders, or rerun the sweep to train them again")


def find_runs(directory: str) -> list[str]:
  """The workdirs to compare in `directory`: its sweep's runs, else subfolders with metrics.

  A sweep's runs whose folders are gone are not among them (`missing_runs` names those).
  """
  if not os.path.isdir(directory):
    raise ConfigError(f"--workdir={directory} is not a directory")
  # A sweep's runs in its order; those not started yet have no row.
  recorded = [os.path.join(directory, run["name"]) for run in sweep_runs(directory)]
  if any(os.path.isdir(path) for path in recorded):
    return [path for path in recorded if os.path.isdir(path)]
  missing = missing_runs(directory)
  if missing:
    raise ConfigError(f"{directory} holds no runs to compare: {missing_line(missing)}")
  found = sorted(os.path.join(directory, name) for name in os.listdir(directory)
                 if os.path.isfile(os.path.join(directory, name, layout.METRICS)))
  if not found:
    raise ConfigError(f"{directory} holds no runs to compare: no {layout.SWEEP_RECORD} and no "
                      f"subfolder with a {layout.METRICS}; name the runs with "
                      "--compare_dirs=DIR1,DIR2,...")
  return found


def read_summary(workdir: str, name: str) -> RunSummary:
  """Reads what exists of a run; a run that has not logged yet gets an empty row."""
  if not os.path.isdir(workdir):
    raise ConfigError(f"{workdir} (a run to compare) is not a directory")
  config = {}
  try:
    with open(os.path.join(workdir, layout.CONFIG), encoding="utf-8") as f:
      config = run_record.flatten(json.load(f))
  except (OSError, ValueError):
    pass
  try:
    series = plots.read_series(workdir)
  except ConfigError:  # No metrics.jsonl or no rows yet.
    series = {}
  return RunSummary(name, workdir, config, series, run_record.read_record(workdir),
                    _measured_peak(workdir), sweep_outcome(workdir))


def _measured_peak(workdir: str) -> float | None:
  """The measured matmul rate a run divided its MFU by (peak_flops.json), or None.

  None for a run on an accelerator with a published peak (nothing is measured then).
  """
  try:
    with open(os.path.join(workdir, layout.PEAK_FLOPS), encoding="utf-8") as f:
      return float(json.load(f)["flops_per_second"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def common_peak(runs: Sequence[RunSummary]) -> tuple[float | None, str]:
  """One peak for every run's MFU: the largest measured one, and whose it is.

  Each run measured its own matmul rate under its own load, so MFU against its own
  peak can order two runs opposite to their FLOP/s. Against one peak the order is the
  achieved FLOP/s order. (None when no run measured one: they all used published peaks.)
  """
  measured = [(run.peak, run.name) for run in runs if run.peak]
  if not measured:
    return None, ""
  peak, name = max(measured)
  return peak, name


def sweep_outcome(workdir: str) -> dict[str, Any]:
  """{status, step, reason, current} the sweep that ran `workdir` recorded ({} if none
  did); current is False for a run of an earlier --sweep list of that folder.

  Looked up in the sweep.json of the folder above (cli/sweep.py writes it), so a run
  compared through --compare_dirs shows its status too.
  """
  name = os.path.basename(os.path.normpath(workdir))
  parent = os.path.dirname(os.path.abspath(os.path.normpath(workdir)))
  for run in sweep_runs(parent):
    if isinstance(run, dict) and run.get("name") == name and "status" in run:
      return {k: run[k] for k in ("status", "step", "reason", "current") if k in run}
  return {}


def _names(workdirs: Sequence[str]) -> list[str]:
  """Folder names, or the paths as given where two runs share a folder name."""
  names = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  return [n if names.count(n) == 1 else w for n, w in zip(names, workdirs)]


def differing_keys(runs: Sequence[RunSummary], first: Sequence[str] = ()) -> list[str]:
  """Config keys whose value is not the same in every run; `first`'s order, then sorted.

  Only keys every run's config.json holds are compared: a key some lack was added to
  configs/base.py after those runs.
  """
  configs = [run.config for run in runs if run.config]
  keys = set.intersection(*(set(c) for c in configs)) if configs else set()
  differ = {key for key in keys
            if len({json.dumps(c[key], sort_keys=True) for c in configs}) > 1}
  return [k for k in first if k in differ] + sorted(differ - set(first))


def _format_value(value: Any) -> str:
  if value is None:
    return "—"
  if isinstance(value, float):
    return f"{value:.4g}" if math.isfinite(value) else str(value)
  if isinstance(value, (list, tuple, dict)):
    return json.dumps(value)
  return str(value)


def _best(name: str, series: plots.Series) -> tuple[float, int]:
  # A group's series (eval_loss/R) is better as its metric (eval_loss) is.
  lower = name.split(plots.GROUP_SEPARATOR, 1)[0].endswith(LOWER_IS_BETTER)
  index = int(np.argmin(series.values) if lower else np.argmax(series.values))
  return float(series.values[index]), int(series.steps[index])


def _status_cell(run: RunSummary) -> str:
  """A run's status column: what the sweep recorded, failures in bold with their step."""
  status = run.outcome.get("status", "—")
  if status == "in use":  # Another command trains it: "in use by PID N on HOST".
    status = run.outcome.get("reason", status)
  elif status in ("failed", "diverged", "stopped") and run.outcome.get("step") is not None:
    status += f" (step {run.outcome['step']})"
  if run.outcome.get("current") is False:
    status += " (earlier --sweep list)"
  return f"**{status}**" if status.startswith(("failed", "diverged")) else status


def table(runs: Sequence[RunSummary], first_keys: Sequence[str] = ()) -> str:
  """The Markdown comparison: one row per run, then notes on the columns."""
  keys = differing_keys(runs, first_keys)
  shown, hidden = keys[:MAX_KEY_COLUMNS], keys[MAX_KEY_COLUMNS:]
  metrics = listed_metrics(runs)
  with_mfu = any("mfu" in run.series for run in runs)
  peak, peak_run = common_peak(runs)
  with_status = any(run.outcome for run in runs)
  header = (["run"] + ["status"] * with_status + shown + ["parameters", "steps"] +
            [f"{m} {kind}" for m in metrics for kind in ("final", "best (step)")] +
            ["tokens/s"] + ["MFU"] * with_mfu + ["wall"])
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for run in runs:
    cells = [run.name]
    if with_status:
      cells.append(_status_cell(run))
    cells += [_format_value(run.config.get(key)) for key in shown]
    parameters = run.record.get("parameters")
    cells.append(f"{parameters:,}" if isinstance(parameters, int) else "—")
    num_steps = run.config.get("train.num_steps")
    last = max((int(s.steps[-1]) for s in run.series.values()), default=None)
    steps = f"{_format_value(last)}/{_format_value(num_steps)}"
    if last is None or num_steps is None or last < num_steps:
      steps += " (unfinished)"
    cells.append(steps)
    for metric in metrics:
      series = run.series.get(metric)
      if series is None:
        cells += ["—", "—"]
        continue
      best, at = _best(metric, series)
      cells += [_format_value(float(series.values[-1])), f"{_format_value(best)} ({at})"]
    rate = run.series.get("tokens_per_second")
    cells.append(f"{np.median(rate.values):,.0f}" if rate is not None else "—")
    if with_mfu:
      mfu = run.series.get("mfu")
      if mfu is None:
        cells.append("—")
      else:
        value = float(np.median(mfu.values))
        if peak and run.peak:  # Its achieved FLOP/s (MFU x its own peak) over the one peak.
          value *= run.peak / peak
        cells.append(f"{100 * value:.1f}%" + (" (above the peak)" if value > 1 else ""))
    wall = run.record.get("wall_seconds")
    cells.append(format_duration(wall) if isinstance(wall, (int, float)) else "—")
    lines.append("| " + " | ".join(cells) + " |")
  notes = [""]
  for run in runs:
    if run.outcome.get("status") in ("failed", "diverged", "stopped"):
      notes.append(f"{run.name} {run.outcome['status']}"
                   + (f" (last logged step {run.outcome['step']})"
                      if run.outcome.get("step") is not None else "")
                   + f": {run.outcome.get('reason', 'no reason recorded')}")
  if with_status:
    notes.append("status: what the sweep recorded in sweep.json (a failed or diverged run "
                 "does not stop the sweep; rerunning the sweep retries it)"
                 + ("; earlier --sweep list: a run a previous --sweep of this folder ran "
                    "that the current list does not have (kept, not rerun)."
                    if any(run.outcome.get("current") is False for run in runs) else "."))
  if hidden:
    notes.append(f"Also differing between the runs: {', '.join(hidden)}.")
  if with_mfu and peak:
    notes.append(f"MFU: every run's achieved FLOP/s (its logged MFU x the peak it measured, "
                 f"{layout.PEAK_FLOPS}) over one peak, {peak:.4g} FLOP/s (the largest "
                 f"measured, {peak_run}'s), so the column orders the runs as their speed "
                 "does; above 100% means a step beat that measured matmul rate.")
  notes.append(
      "final: the last evaluation; best: the lowest loss, perplexity or bits per byte "
      "(highest accuracy, BLEU, benchmark score, ...) over the evaluations, with its "
      "step. tokens/s (and MFU): the median over the logged rows; tokens are those a step reads (batch x seq_len, both sides for "
      "seq2seq). wall: the training loop's time summed over sessions (compiling and "
      "evaluating included, dataset preparation excluded; run.json).")
  return "\n".join(lines + notes)


def overlay_figures(runs: Sequence[RunSummary], log_steps: bool = False) -> dict[str, Any]:
  """{file stem: Figure}: eval loss, train loss and each eval metric, one line per run."""
  metrics = listed_metrics(runs)
  keys = metrics[:1] + ["loss"] + metrics[1:]
  figures = {}
  for key in keys:
    lines = [(run.name, run.series[key]) for run in runs if key in run.series]
    if lines:
      title = key.replace("eval_", "eval ") if key != "loss" else "train loss"
      # A benchmark accuracy: each run's 95% interval and the chance level (plots.py).
      intervals = [plots.interval_of(run.series, key) for run in runs if key in run.series]
      # eval_loss/R -> compare_eval_loss_R.png: a file name, not a folder.
      stem = "compare_" + key.replace(plots.GROUP_SEPARATOR, "_")
      figures[stem] = plots.line_figure(title, key, lines, log_steps, zoom=True,
                                        intervals=intervals)
  return figures


def listed_metrics(runs: Sequence[RunSummary]) -> list[str]:
  """The eval metrics the table and the curves show: eval_loss first, each metric
  followed by its groups' (a UL2 run's eval_loss/R, /S, /X: plots.group_keys)."""
  keys = set().union(*(run.series for run in runs))
  names = ["eval_loss"] + [k for k in plots.eval_metric_names(keys) if k != "eval_loss"]
  return [k for name in names for k in [name] + plots.group_keys(keys, name)]


def compare(workdirs: Sequence[str], output_dir: str, log_steps: bool = False,
            missing: Sequence[MissingRun] = ()) -> str:
  """Writes `output_dir/compare.md` and `output_dir/compare_*.png`; returns the Markdown.

  Args:
    workdirs: the runs, in table order.
    output_dir: where compare.md and the PNGs go (created if needed).
    log_steps: a log-scaled step axis on the curves.
    missing: a sweep's runs whose folders are gone (`missing_runs`): listed under
      the table and in its title, never left out silently.

  Raises:
    ConfigError: no runs, or a run that is not a directory.
  """
  if not workdirs:
    raise ConfigError("no runs to compare: pass --compare_dirs=DIR1,DIR2,...")
  runs = [read_summary(w, n) for w, n in zip(workdirs, _names(workdirs))]
  swept = [key for run in sweep_runs(output_dir) for key in run.get("overrides", {})]
  os.makedirs(output_dir, exist_ok=True)
  images = []
  for stem, figure in overlay_figures(runs, log_steps).items():
    plots.save_figure(figure, os.path.join(output_dir, stem + ".png"))
    images.append(f"![{stem}]({stem}.png)")
  title = f"# {len(runs)} runs compared" + (f", {len(missing)} missing" if missing else "")
  gone = "".join(f"\n- **missing**: {run.describe()}" for run in missing)
  if gone:
    gone = (f"\n\n## Missing runs\n\n{layout.SWEEP_RECORD} records these runs as started, "
            f"but their folders are gone:{gone}")
  text = (f"{title}\n\n{table(runs, list(dict.fromkeys(swept)))}{gone}\n\n" +
          "\n".join(images) + "\n")
  files.write_atomically(os.path.join(output_dir, layout.COMPARE), text)  # Whole or old.
  return text
