"""Plots from metrics.jsonl (restarts, missing metrics, no file) and the run record."""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from transformer.reports import plots
from transformer.workdir import run_record
from transformer.cli import train
from transformer.config.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
  """A real PNG: signature, nonzero size, and an image matplotlib can read back."""
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    assert f.read(8) == PNG_SIGNATURE, path
  assert os.path.getsize(path) > 1000, path
  height, width, _ = matplotlib.image.imread(path).shape
  assert height > 100 and width > 100, path


def _write(workdir, rows, batch_size=4, seq_len=8):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)
    f.write('{"step": 9, "lo')  # A torn last line is skipped, as MetricWriter does.
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump({"model": {"arch": "decoder"},
               "data": {"batch_size": batch_size, "seq_len": seq_len}}, f)


def _train(step, loss, **extra):
  return {"step": step, "loss": loss, "accuracy": 0.1 * step, "learning_rate": 1e-3 * step,
          "seconds_per_step": 0.5, **extra}


# A run that evaluated at 0 and 4, was killed after step 5, and restarted from its
# checkpoint at step 2 (a file from before MetricWriter.resume dropped such rows): the
# old rows of steps 3, 4, 5 (eval at 4 included) are superseded; then a duplicate row.
RESTARTED = [
    {"step": 0, "eval_loss": 5.0, "eval_accuracy": 0.0, "eval_tokens": 64.0},
    _train(1, 4.0), _train(2, 3.5), _train(3, 9.0), _train(4, 9.0),
    {"step": 4, "eval_loss": 9.0, "eval_accuracy": 0.9, "eval_bleu": 1.0},
    _train(5, 9.0),
    _train(3, 3.0), _train(4, 2.5), _train(5, 2.0), _train(6, 7.0), _train(6, 1.5),
    {"step": 6, "eval_loss": 2.2, "eval_accuracy": 0.5, "eval_bleu": 12.0},
]


def test_read_series_takes_the_restart_and_the_last_row_per_step(tmp_path):
  workdir = str(tmp_path / "run")
  _write(workdir, RESTARTED)
  series = plots.read_series(workdir)
  np.testing.assert_array_equal(series["loss"].steps, [1, 2, 3, 4, 5, 6])
  np.testing.assert_array_equal(series["loss"].values, [4.0, 3.5, 3.0, 2.5, 2.0, 1.5])
  # The dead run's evaluation at step 4 is gone although the restart did not redo it.
  np.testing.assert_array_equal(series["eval_loss"].steps, [0, 6])
  np.testing.assert_array_equal(series["eval_bleu"].steps, [6])
  # 4 rows x 8 tokens / 0.5 s: tokens/s from config.json and seconds_per_step ...
  np.testing.assert_array_equal(series["tokens_per_second"].values, [64.0] * 6)
  # ... for runs older than the recorded rate; a recorded one is taken as it is.
  _write(workdir, [_train(1, 4.0, tokens_per_second=50.0)])
  np.testing.assert_array_equal(plots.read_series(workdir)["tokens_per_second"].values, [50.0])


def test_figures_have_one_line_per_series_and_skip_missing_metrics(tmp_path):
  workdir = str(tmp_path / "run")
  _write(workdir, RESTARTED)
  figures = plots.run_figures(plots.read_series(workdir), "run")
  # No grad_norm in these rows: no grad_norm figure; perplexity/tokens never get one.
  assert sorted(figures) == ["accuracy", "bleu", "learning_rate", "loss", "tokens_per_second"]

  def lines(stem):
    return {line.get_label(): list(line.get_xdata())
            for line in figures[stem].axes[0].get_lines()}

  assert lines("loss") == {"train": [1, 2, 3, 4, 5, 6], "eval": [0, 6]}
  assert lines("accuracy") == {"train": [1, 2, 3, 4, 5, 6], "eval": [0, 6]}
  assert lines("bleu") == {"eval": [6]}
  for stem in figures:  # Steps only increase: no zig-zag after the restart.
    for xdata in lines(stem).values():
      assert xdata == sorted(set(xdata))


def test_write_plots_writes_valid_pngs(tmp_path):
  workdir = str(tmp_path / "run")
  _write(workdir, RESTARTED)
  paths = plots.write_plots(workdir, log_steps=True)
  assert sorted(os.path.basename(p) for p in paths) == [
      "accuracy.png", "bleu.png", "learning_rate.png", "loss.png", "tokens_per_second.png"]
  assert sorted(os.listdir(os.path.join(workdir, "plots"))) == sorted(
      os.path.basename(p) for p in paths)  # No temporary files left.
  for path in paths:
    assert_png(path)


def test_no_metrics_is_an_error_naming_the_path(tmp_path):
  path = os.path.join(str(tmp_path), "metrics.jsonl")
  with pytest.raises(ConfigError, match=f"{path} does not exist"):
    plots.read_series(str(tmp_path))
  with open(path, "w", encoding="utf-8") as f:
    f.write("")
  with pytest.raises(ConfigError, match=f"{path} holds no metric rows"):
    plots.write_plots(str(tmp_path))
  assert not os.path.exists(os.path.join(str(tmp_path), "plots"))
  plots.write_plots_after_training(str(tmp_path))  # At the end of a run: logged, not raised.


def test_plot_mode_of_launch(tmp_path):
  """--mode=plot needs no --config; a workdir without metrics exits 2 naming the file."""
  workdir = str(tmp_path / "run")
  _write(workdir, RESTARTED)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), "--mode=plot",
                           f"--workdir={workdir}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == [os.path.join(workdir, "plots", f"{stem}.png") for stem in
                                   ("loss", "learning_rate", "tokens_per_second",
                                    "accuracy", "bleu")]
  empty = str(tmp_path / "empty")
  os.makedirs(empty)
  result = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), "--mode=plot",
                           f"--workdir={empty}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 2
  assert f"ConfigError: {os.path.join(empty, 'metrics.jsonl')} does not exist" in result.stderr
  assert "Traceback" not in result.stderr


def test_run_record_sums_sessions_and_restarts_at_step_zero(tmp_path, monkeypatch):
  clock = iter([0.0, 10.0, 25.0, 100.0, 104.0, 150.0, 200.0, 201.0])
  monkeypatch.setattr(run_record, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
  workdir = str(tmp_path)
  record = run_record.RunRecord(workdir)  # t=0
  record.update(0, parameters=1234)  # t=10
  record.update(3)  # t=25: a checkpoint at step 3; the session then dies.
  record = run_record.RunRecord(workdir)  # t=100: resumed from 3.
  record.update(3, parameters=1234)  # t=104
  assert run_record.read_record(workdir)["wall_seconds"] == 29.0
  assert run_record.read_record(workdir)["sessions"] == [
      {"start_step": 0, "end_step": 3, "seconds": 25.0},
      {"start_step": 3, "end_step": 3, "seconds": 4.0}]
  run_record.RunRecord(workdir, enabled=False).update(6)  # Not process 0: writes nothing.
  record = run_record.RunRecord(workdir)  # t=200: a start from scratch forgets the rest.
  record.update(0, parameters=99)  # t=201
  assert run_record.read_record(workdir) == {
      "sessions": [{"start_step": 0, "end_step": 0, "seconds": 1.0}], "parameters": 99,
      "wall_seconds": 1.0}


def test_all_sessions_include_this_one_measured_whole(tmp_path, monkeypatch):
  """The summary's "all sessions" is never less than "this session" (once 4m10s < 4m28s:
  run.json's sessions leave out the data build)."""
  clock = iter([0.0, 10.0, 100.0, 150.0])
  monkeypatch.setattr(run_record, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
  workdir = str(tmp_path)
  assert run_record.total_seconds(workdir, [], 5.0) is None  # Nothing trained, ever.
  run_record.RunRecord(workdir).update(0)  # An earlier session: 10 s.
  before = run_record.sessions(workdir)
  assert run_record.total_seconds(workdir, before, 3.0) == 13.0  # This one trained nothing.
  run_record.RunRecord(workdir).update(3)  # This session: 50 s in run.json, 58 s whole.
  assert run_record.total_seconds(workdir, before, 58.0) == 68.0
  assert "this session 0m58s, all sessions 1m08s (run.json)" in train.summary(
      workdir, 6, 58.0, sessions_before=before)


def test_benchmark_accuracy_is_drawn_with_its_interval_and_chance(tmp_path):
  """train.benchmarks' rows (benchmark.training_metrics): the accuracy's figure has the
  95% interval as a band and the chance level as a dashed line, in the run's plots and
  in --mode=compare's overlay; the interval and chance series get no figure of their own."""
  from transformer.evaluation import benchmark  # pylint: disable=g-import-not-at-top
  from transformer.reports import compare  # pylint: disable=g-import-not-at-top
  results = {"piqa": {"kind": "multiple_choice", "chance": 0.5,
                      "metrics": {"acc_norm": 0.6, "acc_norm_stderr": 0.05}},
             "arc": {"kind": "multiple_choice", "chance": 0.25,
                     "metrics": {"acc_norm": 0.3, "acc_norm_stderr": 0.04}}}
  row = benchmark.training_metrics(results)
  assert row["eval_piqa_acc_norm_ci95_low"] == pytest.approx(0.6 - 1.959964 * 0.05)
  assert row["eval_benchmark_acc_chance"] == pytest.approx(0.375)
  assert row["eval_benchmark_acc_ci95_high"] == pytest.approx(
      0.45 + 1.959964 * np.hypot(0.05, 0.04) / 2)
  workdir = str(tmp_path / "run")
  _write(workdir, [_train(1, 4.0), {"step": 2, "eval_loss": 3.0, **row},
                   {"step": 4, "eval_loss": 2.0, **row}])
  series = plots.read_series(workdir)
  figures = plots.run_figures(series, "run")
  assert {"piqa_acc_norm", "arc_acc_norm", "benchmark_acc"} <= set(figures)
  assert not [s for s in figures if s.endswith(("_ci95_low", "_ci95_high", "_chance"))]
  run = compare.RunSummary(name="run", workdir=workdir, config={}, series=series, record={})
  overlay = compare.overlay_figures([run])["compare_eval_piqa_acc_norm"]
  for figure in (figures["piqa_acc_norm"], overlay):
    axes = figure.axes[0]
    bands = [c for c in axes.collections if "95% interval" in c.get_label()]
    assert len(bands) == 1
    low, high = bands[0].get_paths()[0].get_extents().intervaly
    assert (low, high) == pytest.approx((0.6 - 1.959964 * 0.05, 0.6 + 1.959964 * 0.05))
    chance = [line for line in axes.get_lines() if line.get_label() == "chance 0.500"]
    assert len(chance) == 1 and list(chance[0].get_ydata()) == [0.5, 0.5]
    assert chance[0].get_linestyle() == "--"


def test_a_ul2_runs_loss_per_denoiser_is_drawn_beside_eval_loss_and_compared(tmp_path):
  """eval_loss/R, /S, /X (a UL2 run's evaluation): lines beside eval on loss.png, no
  figure of their own (nor for eval_tokens/R), and --mode=compare's table lists them
  after eval_loss with their own overlay (a file name, not a folder)."""
  from transformer.reports import compare  # pylint: disable=g-import-not-at-top
  per_kind = lambda scale: {f"eval_{m}/{k}": scale * v for k, v in (("R", 3.0), ("S", 2.0),
                                                                    ("X", 4.0))
                            for m in ("loss", "tokens")}
  workdir = str(tmp_path / "ul2")
  _write(workdir, [{"step": 0, "eval_loss": 3.0, "eval_tokens": 90.0, **per_kind(1.0)},
                   _train(1, 2.5), {"step": 2, "eval_loss": 1.5, "eval_tokens": 90.0,
                                    **per_kind(0.5)}])
  series = plots.read_series(workdir)
  figures = plots.run_figures(series, "run")
  assert sorted(figures) == ["learning_rate", "loss", "tokens_per_second"]
  labels = [line.get_label() for line in figures["loss"].axes[0].get_lines()]
  assert labels == ["train", "eval", "eval R", "eval S", "eval X"]
  run = compare.RunSummary(name="ul2", workdir=workdir, config={}, series=series, record={})
  assert compare.listed_metrics([run]) == ["eval_loss", "eval_loss/R", "eval_loss/S",
                                           "eval_loss/X"]
  header = compare.table([run]).splitlines()[0]
  assert "eval_loss/S final | eval_loss/S best (step)" in header
  row = compare.table([run]).splitlines()[2]
  assert "| 1 | 1 (2) |" in row  # eval_loss/S: 2.0 at step 0, 1.0 at step 2.
  assert "compare_eval_loss_R" in compare.overlay_figures([run])
  assert "compare_eval_tokens_R" not in compare.overlay_figures([run])
  plots.write_plots(workdir)
  assert not [d for d in os.listdir(os.path.join(workdir, "plots")) if not d.endswith(".png")]
