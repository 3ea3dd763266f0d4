"""Sweeps: spec parsing and validation, an end-to-end two-run sweep with resume, compare."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from configs import gpt_small
from test_plots import assert_png
from tiny import make_tiny_config, subprocess_env
from transformer.reports import compare
from transformer.reports import plots
from transformer.cli import sweep
from transformer.config.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------- specs, before any run


def test_grid_is_the_cartesian_product_first_key_slowest(tiny_config):
  runs = sweep.build_runs(tiny_config, " model.norm=pre,post ; model.position=learned,rope,"
                          "alibi;model.use_bias=false")
  assert [run.label for run in runs[:4]] == [
      "model.norm=pre,model.position=learned,model.use_bias=false",
      "model.norm=pre,model.position=rope,model.use_bias=false",
      "model.norm=pre,model.position=alibi,model.use_bias=false",
      "model.norm=post,model.position=learned,model.use_bias=false"]
  assert len(runs) == 6
  assert runs[4].name == "norm=post+position=rope+use_bias=false"
  assert (runs[4].config.model.norm, runs[4].config.model.position) == ("post", "rope")
  assert runs[4].config.model.use_bias is False
  assert tiny_config.model.norm == "pre"  # The base config is not touched.


def test_json_list_of_runs_types_values_and_clashing_names(tiny_config, tmp_path):
  path = str(tmp_path / "runs.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump([{"model.num_layers": 1, "optimizer.learning_rate": 1},
               {"model.num_layers": 3, "train.num_steps": 4,
                "mesh.shape": [["data", 2], ["fsdp", 1], ["tensor", -1]]}], f)
  first, second = sweep.build_runs(tiny_config, path)
  assert first.overrides == {"model.num_layers": "1", "optimizer.learning_rate": "1.0"}
  assert first.config.optimizer.learning_rate == 1.0
  assert second.config.mesh.shape == (("data", 2), ("fsdp", 1), ("tensor", -1))
  assert second.overrides["mesh.shape"] == "(('data', 2), ('fsdp', 1), ('tensor', -1))"
  assert second.name == "num_layers=3+num_steps=4+shape=data_2_fsdp_1_tensor_-1"
  path = str(tmp_path / "grid.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"model.dropout_x": [0.1]}, f)
  with pytest.raises(ConfigError, match=r"config\.model\.dropout_x is not a config key"):
    sweep.build_runs(tiny_config, path)
  with open(path, "w", encoding="utf-8") as f:  # Last parts collide: full keys name them.
    json.dump({"data.batch_size": [8], "decode.batch_size": [4, 8], "train.num_steps": [4]}, f)
  assert [run.name for run in sweep.build_runs(tiny_config, path)] == [
      "data.batch_size=8+decode.batch_size=4+num_steps=4",
      "data.batch_size=8+decode.batch_size=8+num_steps=4"]


@pytest.mark.parametrize("spec, message", [
    ("model.nrom=pre,post",
     r"config\.model\.nrom is not a config key; the keys of config\.model are: .*\bnorm\b"),
    ("modle.norm=pre", r"config\.modle\.norm is not a config key; the keys of config are: "),
    ("model=pre", r"config\.model is a group of keys \(.*\); sweep one of them"),
    ("model.num_layers=2,two", r"config\.model\.num_layers='two' is invalid: expected an "
     r"integer, the type of its value 2"),
    ("model.use_bias=maybe", r"config\.model\.use_bias='maybe' is invalid: expected true or"),
    ("optimizer.learning_rate=fast", r"expected a number"),
    ("mesh.shape=1", r"config\.mesh\.shape='1' is invalid: expected a tuple, written as a "
     r"JSON list in a JSON sweep file"),
    ("model.norm=", r"config\.model\.norm has an empty value"),
    ("model.norm=pre,,post", r"config\.model\.norm has an empty value"),
    ("model.norm=pre,pre", r"config\.model\.norm lists pre twice"),
    ("model.norm=pre;model.norm=post", r"config\.model\.norm appears twice"),
    ("model.norm", r"'model\.norm' is not key=value1,value2"),
    ("", r"empty; expected e\.g\."),
    # Parsed fine, rejected by validate(): the run and the key are named.
    ("model.norm=pre,mid", r"--sweep run 2/2 \(model\.norm=mid\): config\.model\.norm='mid' is "
     r"invalid: valid values are 'pre', 'post'"),
    ("model.num_heads=2,3", r"run 2/2 \(model\.num_heads=3\): config\.model\.num_heads=3 is "
     r"invalid: must divide model\.d_model=32"),
    ("data.seq_len=8;train.log_every=0", r"config\.train\.log_every=0 is invalid"),
])
def test_bad_specs_stop_before_any_run(spec, message, tiny_config, tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  with pytest.raises(ConfigError, match=message):
    sweep.run_sweep(tiny_config, "tests/tiny.py", sweep_dir, spec)
  assert not os.path.exists(sweep_dir)  # Nothing written, nothing started.


def test_bad_json_specs(tiny_config, tmp_path):
  path = str(tmp_path / "spec.json")
  for content, message in [("{\"model.norm\": []}", r"config\.model\.norm needs a non-empty "
                                                     r"list of values"),
                           ("[]", r"must hold a grid"), ("{not json", r"cannot read the JSON"),
                           ("[{\"model.norm\": 1}]", r"config\.model\.norm=1 is invalid: "
                                                     r"expected a string")]:
    with open(path, "w", encoding="utf-8") as f:
      f.write(content)
    with pytest.raises(ConfigError, match=message):
      sweep.build_runs(tiny_config, path)
  with pytest.raises(ConfigError, match=r"config\.model\.norm is both swept and set by "
                     r"--config\.model\.norm; drop one"):
    sweep.build_runs(tiny_config, "model.norm=pre,post", fixed={"model.norm": "pre"})


# ---------------------------------------------------------------- compare on synthetic runs


def _fake_run(workdir, norm, eval_losses, num_steps=4, parameters=None, extra=None):
  os.makedirs(workdir)
  config = {"model": {"arch": "decoder", "norm": norm}, "train": {"num_steps": num_steps},
            "data": {"batch_size": 2, "seq_len": 5}, **(extra or {})}
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f)
  rows = [{"step": s, "loss": 3.0 - 0.1 * s, "seconds_per_step": 0.25} for s in range(1, 5)]
  rows += [{"step": s, "eval_loss": v, "eval_accuracy": 0.1 * s} for s, v in eval_losses]
  with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"]))
  if parameters:
    with open(os.path.join(workdir, "run.json"), "w", encoding="utf-8") as f:
      json.dump({"parameters": parameters, "wall_seconds": 75.0}, f)


def _table_rows(text):
  """The Markdown table of compare.md as a list of dicts (header -> cell)."""
  lines = [line for line in text.splitlines() if line.startswith("| ")]
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  return header, [dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
                  for line in lines[1:]]


def test_compare_table_of_given_dirs(tmp_path):
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  _fake_run(a, "pre", [(0, 5.0), (2, 2.0), (4, 2.5)], parameters=1234)
  # b predates a config key (extra): a key only some runs have is not a difference.
  _fake_run(b, "post", [(0, 5.0), (2, 2.4)], extra={"decode": {"beam_size": 4}})
  text = compare.compare([a, b], str(tmp_path / "out"))
  header, rows = _table_rows(text)
  assert header == ["run", "model.norm", "parameters", "steps", "eval_loss final",
                    "eval_loss best (step)", "eval_accuracy final",
                    "eval_accuracy best (step)", "tokens/s", "wall"]
  assert rows[0] == {"run": "a", "model.norm": "pre", "parameters": "1,234", "steps": "4/4",
                     "eval_loss final": "2.5", "eval_loss best (step)": "2 (2)",
                     "eval_accuracy final": "0.4", "eval_accuracy best (step)": "0.4 (4)",
                     "tokens/s": "40", "wall": "1m15s"}
  assert rows[1]["parameters"] == rows[1]["wall"] == "—"  # No run.json: older than it.
  assert rows[1]["steps"] == "4/4"  # Train rows reach step 4 though the last eval is at 2.
  with open(str(tmp_path / "out" / "compare.md"), encoding="utf-8") as f:
    assert f.read() == text
  for stem in ("compare_eval_loss", "compare_loss", "compare_eval_accuracy"):
    assert_png(str(tmp_path / "out" / f"{stem}.png"))
  with pytest.raises(ConfigError, match="holds no runs to compare"):
    compare.find_runs(str(tmp_path / "out"))
  # A sweep's folder: its runs in sweep order, those not started yet left out.
  with open(str(tmp_path / "sweep.json"), "w", encoding="utf-8") as f:
    json.dump({"runs": [{"name": n, "overrides": {}} for n in ("b", "not_started", "a")]}, f)
  assert compare.find_runs(str(tmp_path)) == [b, a]


def test_compare_names_a_sweeps_run_whose_folder_is_gone_and_exits_1(tmp_path, capsys):
  """A finished run's folder deleted: compare.md compares the rest and lists it as
  missing, and --mode=compare ends with one line naming it and its folder (exit 1); a
  run not started yet (pending) has no folder and is not missing."""
  from transformer.cli import compare as compare_mode  # pylint: disable=g-import-not-at-top
  sweep_dir = tmp_path / "sweep"
  for name, norm in (("norm=pre", "pre"), ("norm=post", "post")):
    _fake_run(str(sweep_dir / name), norm, [(2, 2.0), (4, 2.5)])
  with open(sweep_dir / "sweep.json", "w", encoding="utf-8") as f:
    json.dump({"runs": [{"name": "norm=pre", "status": "finished", "step": 4},
                        {"name": "norm=post", "status": "finished", "step": 4},
                        {"name": "norm=rms", "status": "pending"}]}, f)
  assert compare_mode.run([], str(sweep_dir)) == 0
  shutil.rmtree(sweep_dir / "norm=post")
  capsys.readouterr()
  assert compare_mode.run([], str(sweep_dir)) == 1
  out, err = capsys.readouterr()
  assert err == (
      "compare: 1 run(s) that sweep.json records are missing, so compare.md compares the "
      f"others and lists these as missing: norm=post (finished at step 4 in sweep.json; "
      f"expected folder {sweep_dir / 'norm=post'}); restore the folders, or rerun the sweep "
      "to train them again\n")
  text = (sweep_dir / "compare.md").read_text(encoding="utf-8")
  assert out.strip() == text.strip() and text.startswith("# 1 runs compared, 1 missing\n")
  assert [row["run"] for row in _table_rows(text)[1]] == ["norm=pre"]
  assert f"- **missing**: norm=post (finished at step 4 in sweep.json; expected folder " \
         f"{sweep_dir / 'norm=post'})" in text
  shutil.rmtree(sweep_dir / "norm=pre")
  with pytest.raises(ConfigError, match="holds no runs to compare: 2 run.s. that sweep.json "
                     "records are missing"):
    compare_mode.run([], str(sweep_dir))


def test_compare_puts_every_run_on_one_peak(tmp_path):
  """Equal FLOPs per step: MFU must order the runs as tokens/s does, whatever each measured."""
  runs = {}
  # fast: 0.2 s/step, measured a high peak (2e9); slow: 0.4 s/step, measured a low one (5e8).
  for name, seconds, peak in (("fast", 0.2, 2e9), ("slow", 0.4, 5e8)):
    workdir = str(tmp_path / name)
    _fake_run(workdir, name, [(4, 2.0)])
    flops_per_step = 1e8
    with open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8") as f:
      f.write(json.dumps({"step": 4, "seconds_per_step": seconds,
                          "tokens_per_second": 10 / seconds,
                          "mfu": flops_per_step / seconds / peak}) + "\n")
    with open(os.path.join(workdir, "peak_flops.json"), "w", encoding="utf-8") as f:
      json.dump({"flops_per_second": peak, "source": "measured"}, f)
    runs[name] = workdir
  text = compare.compare([runs["fast"], runs["slow"]], str(tmp_path / "out"))
  _, rows = _table_rows(text)
  # Own peaks would say fast 25.0%, slow 50.0%; on one peak (2e9): 25.0% and 12.5%.
  assert [r["MFU"] for r in rows] == ["25.0%", "12.5%"]
  assert "over one peak, 2e+09 FLOP/s (the largest measured, fast's)" in text


# ---------------------------------------------------------------- end to end


def _flat(tree, prefix=""):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _flat(value, f"{prefix}{key}.")
    else:
      yield prefix + key, value


def _tiny_flags(data_dir):
  """--config.x flags that turn configs/gpt_small.py:local into tests/tiny.py's config."""
  base = dict(_flat(gpt_small.get_config("local").to_dict()))
  tiny = dict(_flat(make_tiny_config(data_dir).to_dict()))
  tiny["checkpoint.async_save"] = False  # Checkpoint 3 is complete when step 4 is killed.
  return [f"--config.{key}={str(value).lower() if isinstance(value, bool) else value}"
          for key, value in tiny.items() if value != base[key]]


def _sweep(sweep_dir, data_dir, kill_at=None, spec="model.position=learned,rope", extra=()):
  env = subprocess_env()
  env.pop("TRANSFORMER_TEST_KILL_AT", None)
  if kill_at:  # Every run of the sweep inherits it: the first one dies there.
    env["TRANSFORMER_TEST_KILL_AT"] = kill_at
  command = [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=sweep",
             "--config=configs/gpt_small.py:local", f"--workdir={sweep_dir}",
             f"--sweep={spec}"] + [
                 flag for flag in _tiny_flags(data_dir)  # The swept keys are the spec's.
                 if flag.split("=")[0].removeprefix("--config.") not in spec] + list(extra)
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800, check=False)  # A hang guard only.
  return result.returncode, result.stdout + result.stderr


def test_two_run_sweep_resumes_skips_and_compares(tfds_data_dir, tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  learned, rope = (os.path.join(sweep_dir, n) for n in ("position=learned", "position=rope"))

  # 1. Each run is killed after step 4 (checkpoint 3 saved), as by the OOM killer: a
  # failed run is recorded and the sweep goes on to the next; it exits 1.
  code, output = _sweep(sweep_dir, tfds_data_dir, kill_at="after_step:4")
  assert code == 1, output[-3000:]
  assert "run 1/2 model.position=learned: starting in" in output
  assert "run 1/2 model.position=learned failed: was killed by signal 9" in output
  assert "run 2/2 model.position=rope: starting in" in output
  assert "not finished: position=learned, position=rope" in output
  assert [sweep.finished_step(w) for w in (learned, rope)] == [3, 3]
  assert [(r["status"], r["step"], r["reason"]) for r in compare.sweep_runs(sweep_dir)] == [
      ("failed", 3, "the run was killed by signal 9")] * 2  # Step 4's row was never written.

  # 2. The same command: both runs resume from their checkpoints.
  code, output = _sweep(sweep_dir, tfds_data_dir)
  assert code == 0, output[-3000:]
  assert "run 1/2 model.position=learned: resuming from step 3/6" in output
  assert "Resumed from checkpoint 3" in output
  assert "run 2/2 model.position=rope: resuming from step 3/6" in output
  assert "run 2/2 model.position=rope: finished in" in output
  assert [sweep.finished_step(w) for w in (learned, rope)] == [6, 6]
  assert [r["status"] for r in compare.sweep_runs(sweep_dir)] == ["finished"] * 2

  # 3. Again: both finished, skipped without starting a run.
  code, output = _sweep(sweep_dir, tfds_data_dir)
  assert code == 0, output[-3000:]
  assert output.count("finished (checkpoint 6/6), skipped: eval_loss") == 2
  assert "starting" not in output and "Resumed" not in output

  # The comparison: one row per run, the swept key the only differing column.
  with open(os.path.join(sweep_dir, "compare.md"), encoding="utf-8") as f:
    header, rows = _table_rows(f.read())
  assert header[:5] == ["run", "status", "model.position", "parameters", "steps"]
  assert [(r["run"], r["status"], r["model.position"], r["steps"]) for r in rows] == [
      ("position=learned", "finished", "learned", "6/6"),
      ("position=rope", "finished", "rope", "6/6")]
  parameters = [int(r["parameters"].replace(",", "")) for r in rows]
  assert parameters[0] - parameters[1] == 32 * 32  # The learned table: max_len x d_model.
  eval_loss = plots.read_series(learned)["eval_loss"]
  assert list(eval_loss.steps) == [0, 3, 6]  # One evaluation per step despite the kill.
  assert rows[0]["eval_loss final"] == f"{eval_loss.values[-1]:.4g}"
  assert all(r["wall"] != "—" and r["tokens/s"] != "—" for r in rows)
  runs = [compare.read_summary(w, os.path.basename(w)) for w in (learned, rope)]
  figures = compare.overlay_figures(runs)
  assert [line.get_label() for line in figures["compare_eval_loss"].axes[0].get_lines()] == [
      "position=learned", "position=rope"]
  for stem in ("compare_eval_loss", "compare_loss", "compare_eval_accuracy"):
    assert_png(os.path.join(sweep_dir, f"{stem}.png"))
  for workdir in (learned, rope):  # Each run drew its own curves when it ended.
    for stem in ("loss", "learning_rate", "grad_norm", "tokens_per_second", "accuracy"):
      assert_png(os.path.join(workdir, "plots", f"{stem}.png"))


@pytest.mark.slow  # A second two-run sweep (~18 s); the resume-and-compare one stays default.
def test_a_diverged_run_is_recorded_and_the_sweep_goes_on(tfds_data_dir, tmp_path):
  """Issue 19 row 3: status, step and reason in sweep.json and compare.md; a rerun retries it."""
  sweep_dir = str(tmp_path / "sweep")
  spec = "optimizer.learning_rate=1e30,0.003"  # 1e30: parameters overflow at once.
  code, output = _sweep(sweep_dir, tfds_data_dir, spec=spec)
  assert code == 1, output[-3000:]
  assert "run 1/2 optimizer.learning_rate=1e+30 diverged: exited with status 1" in output
  assert "run 2/2 optimizer.learning_rate=0.003: finished in" in output
  assert "Traceback" not in output  # The diverged run's error is one line.
  diverged, finished = compare.sweep_runs(sweep_dir)
  assert diverged["status"] == "diverged" and finished["status"] == "finished"
  assert diverged["reason"].startswith("FloatingPointError: Non-finite training loss")
  assert isinstance(diverged["step"], int) and finished["step"] == 6
  with open(os.path.join(sweep_dir, "compare.md"), encoding="utf-8") as f:
    text = f.read()
  _, rows = _table_rows(text)
  assert rows[0]["status"] == f"**diverged (step {diverged['step']})**"
  assert rows[1]["status"] == "finished"
  assert f"learning_rate=1e_30 diverged (last logged step {diverged['step']}): " \
         "FloatingPointError: Non-finite" in text
  # --mode=compare on the folder shows the same.
  assert "**diverged" in compare.compare(compare.find_runs(sweep_dir), str(tmp_path / "c"))

  # Rerunning retries only what did not finish.
  code, output = _sweep(sweep_dir, tfds_data_dir, spec=spec)
  assert code == 1, output[-3000:]
  assert "run 1/2 optimizer.learning_rate=1e+30: starting" in output
  assert "run 2/2 optimizer.learning_rate=0.003: finished (checkpoint 6/6), skipped" in output


# ---------------------------------------------------------------- reruns that cannot lie


def _finished_runs(tiny_config, sweep_dir: str, spec: str, monkeypatch) -> list:
  """The runs of `spec` as training leaves them finished (config.json with vocab_size
  resolved, one metrics row); checkpoints as far as the sweep and the resume check
  look, and no run may start."""
  from unittest import mock  # pylint: disable=import-outside-toplevel
  from transformer.workdir import checkpointing  # pylint: disable=import-outside-toplevel

  tiny_config.model.vocab_size = 0  # The tokenizer's size, which the runs recorded resolved.
  runs = sweep.build_runs(tiny_config, spec)
  for run in runs:
    workdir = os.path.join(sweep_dir, run.name)
    config = run.config.copy_and_resolve_references()
    config.model.vocab_size = 128
    os.makedirs(workdir)
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
      f.write(config.to_json_best_effort(indent=2))
    with open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8") as f:
      f.write(json.dumps({"step": 6, "loss": 2.0, "eval_loss": 2.1}) + "\n")
  monkeypatch.setattr(checkpointing, "has_checkpoint", lambda workdir: True)
  monkeypatch.setattr(sweep, "finished_step", lambda workdir: 6)
  monkeypatch.setattr(sweep.plots, "write_plots_after_training", lambda workdir: None)
  monkeypatch.setattr(sweep.subprocess, "Popen", mock.Mock(side_effect=AssertionError))
  monkeypatch.setattr(sweep.compare, "overlay_figures", lambda *args: {})
  return runs


def test_a_rerun_refuses_changed_flags_and_reports_a_locked_run_in_use(tiny_config, tmp_path,
                                                                       monkeypatch, capsys):
  """Issue 34: finished runs are checked against their config.json; a locked run is in use."""
  from transformer.workdir import lock  # pylint: disable=import-outside-toplevel

  sweep_dir = str(tmp_path / "sweep")
  spec = "model.position=learned,rope"
  runs = _finished_runs(tiny_config, sweep_dir, spec, monkeypatch)

  assert sweep.run_sweep(tiny_config, "tests/tiny.py", sweep_dir, spec) == 0
  assert capsys.readouterr().out.count("finished (checkpoint 6/6), skipped") == 2
  with open(os.path.join(sweep_dir, "sweep.json"), encoding="utf-8") as f:
    recorded = f.read()

  # The same command with two flags added: refused as a resume refuses it, listing
  # each run's changes, and sweep.json still records the flags the runs ran with.
  changed = tiny_config.copy_and_resolve_references()
  changed.optimizer.learning_rate, changed.model.num_layers = 0.5, 3
  fixed = {"optimizer.learning_rate": 0.5, "model.num_layers": 3}
  with pytest.raises(ConfigError) as refusal:
    sweep.run_sweep(changed, "tests/tiny.py", sweep_dir, spec, fixed=fixed)
  message = str(refusal.value)
  assert "2 of 2 runs were started with other settings" in message
  assert message.count("model.num_layers: 2 -> 3") == 2
  assert message.count("optimizer.learning_rate: 0.003 -> 0.5") == 2
  assert message.count("that a resumed run cannot change") == 2  # The resume's own words.
  with open(os.path.join(sweep_dir, "sweep.json"), encoding="utf-8") as f:
    assert f.read() == recorded

  # A run whose workdir another command holds: "in use by PID N", never "finished".
  with lock.hold(os.path.join(sweep_dir, runs[0].name)):
    assert sweep.run_sweep(tiny_config, "tests/tiny.py", sweep_dir, spec) == 1
  output = capsys.readouterr()
  holder = f"in use by PID {os.getpid()} on "
  assert f"run 1/2 model.position=learned: {holder}" in output.err
  assert "run 2/2 model.position=rope: finished (checkpoint 6/6), skipped" in output.out
  assert "not finished: position=learned" in output.err
  first, second = compare.sweep_runs(sweep_dir)
  assert (first["status"], second["status"]) == ("in use", "finished")
  assert first["reason"].startswith(holder)
  with open(os.path.join(sweep_dir, "compare.md"), encoding="utf-8") as f:
    _, rows = _table_rows(f.read())
  assert rows[0]["status"].startswith(holder) and rows[1]["status"] == "finished"
  assert not os.path.exists(os.path.join(sweep_dir, "position=rope", "lock"))  # Probed only.


def test_a_rerun_with_another_list_keeps_the_earlier_runs_in_the_record(tiny_config, tmp_path,
                                                                         monkeypatch, capsys):
  """Issue 42: seed=0,1 then seed=1,2: sweep.json and compare.md keep seed=0, mark which
  runs the current list has, and one line says the list changed."""
  sweep_dir = str(tmp_path / "sweep")
  _finished_runs(tiny_config, sweep_dir, "seed=0,1,2", monkeypatch)  # seed=2 as if trained.
  assert sweep.run_sweep(tiny_config, "tests/tiny.py", sweep_dir, "seed=0,1") == 0
  assert "--sweep list changed" not in capsys.readouterr().out
  assert sweep.run_sweep(tiny_config, "tests/tiny.py", sweep_dir, "seed=1,2") == 0
  out = capsys.readouterr().out
  assert ("sweep: the --sweep list changed ('seed=0,1' -> 'seed=1,2'): seed=0 no longer in "
          "it (kept in sweep.json and compare.md as runs of an earlier list); new: seed=2\n"
          ) in out
  with open(os.path.join(sweep_dir, "sweep.json"), encoding="utf-8") as f:
    record = json.load(f)
  assert record["sweeps"] == ["seed=0,1", "seed=1,2"]
  assert [(r["name"], r["current"], r["status"]) for r in record["runs"]] == [
      ("seed=1", True, "finished"), ("seed=2", True, "finished"),
      ("seed=0", False, "finished")]
  with open(os.path.join(sweep_dir, "compare.md"), encoding="utf-8") as f:
    text = f.read()
  _, rows = _table_rows(text)
  assert [(r["run"], r["status"]) for r in rows] == [
      ("seed=1", "finished"), ("seed=2", "finished"),
      ("seed=0", "finished (earlier --sweep list)")]
  assert "earlier --sweep list: a run a previous --sweep of this folder ran" in text
  # --mode=compare on the folder reads the same record; the same list again says nothing.
  assert len(compare.find_runs(sweep_dir)) == 3
  assert sweep.run_sweep(tiny_config, "tests/tiny.py", sweep_dir, "seed=1,2") == 0
  assert "--sweep list changed" not in capsys.readouterr().out
  with open(os.path.join(sweep_dir, "sweep.json"), encoding="utf-8") as f:
    assert json.load(f)["runs"] == record["runs"]
