"""End-to-end training, exact resume and the loss guard."""

import json
import os
import signal
import threading
import time

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from transformer.training import hooks as hooks_lib
from transformer.training import loop
from transformer.training import metrics as metrics_lib
from transformer.training import prefetch
from transformer.training import reporting
from transformer.training import signals
from transformer.training import trainer as trainer_lib
from tiny import subprocess_env


def _read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _restore_raw(workdir, step):
  path = os.path.join(os.path.abspath(workdir), "checkpoints", str(step), "state")
  return ocp.StandardCheckpointer().restore(path)


def test_train_and_evaluate_writes_everything(tiny_config, tmp_path):
  workdir = str(tmp_path / "run")
  tiny_config.train.num_steps = 12
  tiny_config.train.eval_every = 6
  result = loop.train_and_evaluate(tiny_config, workdir)

  rows = _read_metrics(workdir)
  train_rows = [r for r in rows if "loss" in r]
  eval_rows = [r for r in rows if "eval_loss" in r]
  assert [r["step"] for r in train_rows] == list(range(1, 13))
  assert [r["step"] for r in eval_rows] == [0, 6, 12]  # 0: the untrained baseline.
  assert train_rows[-1]["loss"] < train_rows[0]["loss"] - 0.5  # It learns.
  assert eval_rows[-1]["eval_loss"] < eval_rows[0]["eval_loss"]
  assert np.isclose(eval_rows[-1]["eval_perplexity"], np.exp(eval_rows[-1]["eval_loss"]))
  assert 0 < eval_rows[-1]["eval_accuracy"] < 1
  assert result["eval_loss"] == eval_rows[-1]["eval_loss"]
  for key in ("learning_rate", "grad_norm", "param_norm", "update_norm"):
    assert np.isfinite(train_rows[-1][key]) and train_rows[-1][key] > 0
  # Speed, from step 2 on (step 1 includes the compile): tokens/s and MFU (flops.py).
  for row in train_rows[1:]:
    assert np.isclose(row["tokens_per_second"], 8 * 32 / row["seconds_per_step"])
    assert 0 < row["mfu"] < 1
  assert "mfu" not in train_rows[0]
  for row in train_rows[1:]:  # The step's input side (metrics.TrainProgress.next_batch).
    assert 0.0 <= row["data_wait_fraction"] <= 1.0
  assert os.listdir(os.path.join(workdir, "tensorboard"))
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["model"]["d_model"] == 32
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
  assert steps == [3, 6, 9, 12]


class _SigtermAfter(hooks_lib.Hook):
  """A preemption: SIGTERM after the call that ends at `step`, once the prefetch thread
  has had time to build the next calls' batches (the run stops there: no other call is
  dispatched, and the batch taken for the next one is given back)."""

  def __init__(self, step):
    self.step = step

  def after_call(self, step, state):
    if step == self.step:
      time.sleep(2)  # The thread (data.prefetch=2) builds steps 3 and 4 meanwhile.
      os.kill(os.getpid(), signal.SIGTERM)


def _prefetch_threads():
  return [t for t in threading.enumerate() if t.name.startswith("prefetch-")]


def test_resume_is_exact(tiny_config, tmp_path):
  """N steps straight == N/2 steps, stop, rerun to N: same losses and bitwise same params.

  The straight run builds each batch when it is needed (data.prefetch=0); the others
  build two calls ahead (the default), and a checkpoint saves the position of the
  batches trained on: a run preempted at step 1, when the thread had built the rows of
  steps 2 and 3 (and the loop had taken step 2's), resumes with step 2's rows.
  """
  assert tiny_config.data.prefetch == 2
  straight = str(tmp_path / "straight")
  tiny_config.data.prefetch = 0
  loop.train_and_evaluate(tiny_config, straight)
  tiny_config.data.prefetch = 2

  resumed = str(tmp_path / "resumed")
  tiny_config.train.num_steps = 3  # First run stops at 3 (and saves there) ...
  loop.train_and_evaluate(tiny_config, resumed)
  tiny_config.train.num_steps = 6  # ... the same command with the same workdir resumes.
  loop.train_and_evaluate(tiny_config, resumed)

  preempted = str(tmp_path / "preempted")
  with pytest.raises(signals.Interrupted) as stopped:
    loop.train_and_evaluate(tiny_config, preempted, hooks=[_SigtermAfter(1)])
  assert (stopped.value.step, stopped.value.exit_status) == (1, 143)
  assert not _prefetch_threads()  # Stopped with the run, not left building.
  loop.train_and_evaluate(tiny_config, preempted)  # The same command resumes from 1.

  losses = lambda w: {r["step"]: r["loss"] for r in _read_metrics(w) if "loss" in r}
  for run in (resumed, preempted):
    assert losses(straight) == losses(run), run  # Identical data order and updates.
    assert sorted(losses(run)) == [1, 2, 3, 4, 5, 6], run  # No step repeated or skipped.
    a, b = _restore_raw(straight, 6), _restore_raw(run, 6)
    assert int(a["step"]) == int(b["step"]) == 6
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=run)
    # The data iterator position was saved beside the state, per process: the same.
    data = os.path.join("checkpoints", "6", "data", "process_0-of-1.json")
    with open(os.path.join(straight, data), encoding="utf-8") as f, \
         open(os.path.join(run, data), encoding="utf-8") as g:
      assert json.load(f) == json.load(g), run
  assert not _prefetch_threads()


def test_ctrl_c_stops_within_the_compiled_call_and_says_how_many_steps(
    tiny_config, tmp_path, monkeypatch, caplog):
  """SIGINT while the call of steps 4-6 runs (3 steps a call): the line names step 6 and
  the 3 steps, the run stops there, and the evaluation due at 6 is skipped (said)."""
  tiny_config.train.update(num_steps=12, steps_per_call=3, log_every=3, eval_every=6)
  tiny_config.checkpoint.every = 12
  dispatch = loop._dispatch  # pylint: disable=protected-access

  def dispatch_then_signal(run, state, call):
    result = dispatch(run, state, call)  # Asynchronous: the call runs on.
    if run.stop._call == (4, 6):  # pylint: disable=protected-access
      os.kill(os.getpid(), signal.SIGINT)
    return result
  monkeypatch.setattr(loop, "_dispatch", dispatch_then_signal)
  workdir = str(tmp_path / "run")
  with caplog.at_level("INFO"), pytest.raises(signals.Interrupted) as stopped:
    loop.train_and_evaluate(tiny_config, workdir)
  assert (stopped.value.step, stopped.value.exit_status) == (6, 130)
  # What --mode=train then prints (cli/train.py; the launch.py run of this is slow:
  # test_sigint_saves_and_the_same_command_resumes).
  assert str(stopped.value) == ("Stopped by SIGINT at step 6 after saving a checkpoint; "
                                "rerun the same command to resume")
  from transformer.cli import train as train_mode  # pylint: disable=g-import-not-at-top
  assert train_mode.summary(workdir, 12, 1.0, stopped.value).startswith(
      "Run summary: step 6/12 (stopped by SIGINT); this session ")
  said = [r.getMessage() for r in caplog.records]
  assert ("Signal 2: stopping at step 6, where the compiled call running now ends (steps "
          "4-6: 3 steps; train.steps_per_call=3 steps a call), and saving a checkpoint "
          "there; an evaluation not started yet is skipped (again to stop at once, without "
          "saving it).") in said
  assert "Skipping the evaluation due at step 6: the run stops there" in said
  rows = _read_metrics(workdir)
  assert [r["step"] for r in rows if "eval_loss" in r] == [0]  # None at 6.
  assert max(r["step"] for r in rows) == 6
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["6"]


def _final_state_leaves(workdir, step):
  return jax.tree.leaves(_restore_raw(workdir, step))


@pytest.mark.slow  # Two runs compared step by step (~18 s on two cores).
def test_several_steps_per_call_make_the_same_run(tiny_config, tmp_path):
  """train.steps_per_call=3 (one lax.scan call per 3 steps): the same updates bit for bit,
  the same rows, evaluations and checkpoints; a resumed run may change it, even from a
  step that is not a multiple of it (a shorter first call)."""
  tiny_config.train.update(num_steps=7, log_every=3, eval_every=3)
  tiny_config.checkpoint.every = 3
  runs = {}
  for name, per_call in (("one", 1), ("three", 3)):
    tiny_config.train.steps_per_call = per_call
    runs[name] = str(tmp_path / name)
    loop.train_and_evaluate(tiny_config, runs[name])
  # Resumed: steps 1-4 one per call, then 5-6 in one call of 2 and 7 alone.
  runs["resumed"] = str(tmp_path / "resumed")
  tiny_config.train.update(num_steps=4, steps_per_call=1)
  loop.train_and_evaluate(tiny_config, runs["resumed"])
  tiny_config.train.update(num_steps=7, steps_per_call=3)
  loop.train_and_evaluate(tiny_config, runs["resumed"])

  for name, workdir in runs.items():
    steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints"))
                   if s.isdigit())
    assert steps[-1] == 7 and 6 in steps and 3 in steps, (name, steps)
    for x, y in zip(_final_state_leaves(runs["one"], 7), _final_state_leaves(workdir, 7)):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)
  rows = {}
  for name, workdir in runs.items():  # A step's training and evaluation rows, merged.
    rows[name] = {}
    for row in _read_metrics(workdir):
      rows[name].setdefault(row["step"], {}).update(row)
  # Rows at 3, 6 and 7 (the last step), evaluations at 0, 3, 6 and 7 in every run; the
  # one-step run also shows its first two steps.
  assert sorted(s for s, r in rows["three"].items() if "loss" in r) == [3, 6, 7]
  assert sorted(s for s, r in rows["one"].items() if "loss" in r) == [1, 2, 3, 6, 7]
  assert sorted(s for s, r in rows["resumed"].items() if "loss" in r) == [1, 2, 3, 4, 6, 7]
  for name, evaluated in (("one", [0, 3, 6, 7]), ("three", [0, 3, 6, 7]),
                          ("resumed", [0, 3, 4, 6, 7])):  # 4: where its first run ended.
    assert sorted(s for s, r in rows[name].items() if "eval_loss" in r) == evaluated
  for name, step in (("three", 6), ("three", 7), ("resumed", 7)):  # The same steps averaged.
    for key in ("loss", "grad_norm", "eval_loss"):
      assert rows[name][step][key] == rows["one"][step][key], (name, step, key)
  # The clock runs per call: the first call (which compiles) is not timed, as step 1 of
  # a one-step run is not; the second call's steps share its time.
  assert "seconds_per_step" not in rows["three"][3] and "seconds_per_step" not in rows["one"][1]
  assert rows["three"][6]["seconds_per_step"] > 0
  assert np.isclose(rows["three"][6]["tokens_per_second"],
                    8 * 32 / rows["three"][6]["seconds_per_step"])


def test_a_non_finite_step_inside_a_call_is_named(tiny_config):
  """A call's metrics have a leading axis of its steps; the guard checks each in order."""
  ok = {"loss_sum": 20.0, "weight_sum": 10.0, "objective_sum": 20.0, "correct_sum": 5.0,
        "learning_rate": 1e-3, "grad_norm": 1.0, "param_norm": 3.0, "update_norm": 0.1}
  call = {k: np.array([v, v, v], np.float32) for k, v in ok.items()}
  call["loss_sum"][1] = np.nan  # The second of steps 4, 5, 6.
  progress = metrics_lib.TrainProgress(3, 6, 256)
  written = []
  writer = type("Writer", (), {"write": lambda self, step, row: written.append(step)})()
  tiny_config.train.log_every = 1
  reporter = reporting.Reporter(tiny_config, writer, progress, 8, reporting.NonFiniteGuard(0))
  with pytest.raises(FloatingPointError, match="at step 5"):
    reporter.report_call(reporting.DispatchedCall(6, 3, call, shown=False), None)
  assert written == [4]  # Step 4 was fine and logged; nothing after step 5.


def test_non_finite_loss_names_the_step(tiny_config):
  host = {"loss_sum": np.float32(np.nan), "weight_sum": np.float32(10.0)}
  with pytest.raises(FloatingPointError, match="step 7"):
    reporting.Reporter(tiny_config, writer=None, progress=None,
                       local_rows=8).report_step(7, host, None)


def test_batch_must_split_over_data_parallel_devices(tiny_config):
  from transformer import sharding  # pylint: disable=g-import-not-at-top
  from transformer.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  tiny_config.data.batch_size = 12
  mesh = sharding.make_mesh(tiny_config.mesh)  # 8 simulated devices on the data axis.
  with pytest.raises(ConfigError, match=r"config\.data\.batch_size=12.*8 data-parallel"):
    trainer_lib.batch_share(tiny_config, mesh)
  tiny_config.data.batch_size = 16
  share = trainer_lib.batch_share(tiny_config, mesh)
  assert (share.index, share.count, share.rows) == (0, 1, 16)  # One process reads it all.


@pytest.mark.parametrize("preset", ["bert_base", "transformer_base"])
def test_other_topologies_train_end_to_end(preset, tiny_config, tmp_path):
  """The encoder (masked LM) and encoder-decoder (seq2seq) presets run through the loop."""
  import importlib  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f"configs.{preset}").get_config("local")
  config.model.update(d_model=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                      mlp_dim=64, max_len=32)
  config.data.update(data_dir=tiny_config.data.data_dir, seq_len=32, batch_size=8,
                     num_threads=1, continuation_chars=30)
  config.train.update(num_steps=6, log_every=1, eval_every=6, eval_batches=2,
                      steps_per_call=1)
  config.optimizer.update(warmup_steps=2)
  workdir = str(tmp_path / preset)
  result = loop.train_and_evaluate(config, workdir)
  rows = [r for r in _read_metrics(workdir) if "loss" in r]
  assert [r["step"] for r in rows] == list(range(1, 7))
  assert rows[-1]["loss"] < rows[0]["loss"]
  assert np.isfinite(result["eval_loss"])


@pytest.mark.slow  # Three launch.py trainings (45 s of CPU); in process by default:
# test_ctrl_c_stops_within_the_compiled_call_and_says_how_many_steps (the stop, its lines),
# test_resume_is_exact (the resume), test_crash_safety (already complete) and
# test_races_and_interrupts (a real process's Ctrl-C: one line and 130).
def test_sigint_saves_and_the_same_command_resumes(tfds_data_dir, tmp_path):
  """Ctrl-C (or a preemption's SIGTERM) finishes the step, saves it, and exits cleanly."""
  import re  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  workdir = str(tmp_path / "run")
  command = [sys.executable, os.path.join(root, "launch.py"),
             "--config=configs/gpt_small.py:local", f"--workdir={workdir}",
             f"--config.data.data_dir={tfds_data_dir}", "--config.model.d_model=32",
             "--config.model.num_layers=1", "--config.model.num_heads=2",
             "--config.model.mlp_dim=64", "--config.train.log_every=1",
             "--config.train.steps_per_call=1",
             "--config.train.eval_at_start=False", "--config.train.eval_every=100000",
             "--config.checkpoint.every=100000"]
  env = subprocess_env()
  log_path = tmp_path / "first.log"
  with open(log_path, "w", encoding="utf-8") as log:
    proc = subprocess.Popen(command + ["--config.train.num_steps=100000"], cwd=root, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while "step 2/" not in log_path.read_text() and time.time() < deadline:
      assert proc.poll() is None, log_path.read_text()[-3000:]
      time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=180) == 130  # 128 + SIGINT: `&&` chains see it stopped.
  output = log_path.read_text()
  stopped = int(re.search(r"Stopped at step (\d+)", output).group(1))
  assert stopped >= 2
  assert os.path.isdir(os.path.join(workdir, "checkpoints", str(stopped)))
  assert (f"Stopped by SIGINT at step {stopped} after saving a checkpoint; rerun the same "
          "command to resume (exit status 130)") in output
  assert f"Run summary: step {stopped}/100000 (stopped by SIGINT)" in output
  assert "Traceback" not in output

  result = subprocess.run(command + [f"--config.train.num_steps={stopped + 2}"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Resumed from checkpoint {stopped}" in result.stderr
  assert f"step {stopped + 2}/{stopped + 2}" in result.stderr
  assert f"Run summary: step {stopped + 2}/{stopped + 2} (finished)" in result.stderr
  assert "eval_loss: final" in result.stderr and f"outputs in {workdir}" in result.stderr

  # Once more: already complete, exit 0, nothing trained.
  result = subprocess.run(command + [f"--config.train.num_steps={stopped + 2}"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"is already complete: its checkpoint {stopped + 2}" in result.stderr
  assert "Resumed" not in result.stderr


def test_two_step_golden_values(tiny_config):
  """Regression guard: init, model, loss and optimizer together give these numbers.

  An intended change to any of them moves the values; update them in the same commit
  and say why. (Values from jax 0.10.2 on CPU, one device.)
  """
  from transformer import sharding  # pylint: disable=g-import-not-at-top
  trainer = trainer_lib.Trainer.create(tiny_config,
                                 sharding.make_mesh(tiny_config.mesh, jax.devices()[:1]))
  rng = np.random.default_rng(0)
  b, l = 8, 32
  batch = {"inputs": rng.integers(4, 260, (b, l), dtype=np.int32),
           "targets": rng.integers(4, 260, (b, l), dtype=np.int32),
           "segment_ids": np.ones((b, l), np.int32),
           "positions": np.broadcast_to(np.arange(l, dtype=np.int32), (b, l)).copy(),
           "weights": np.ones((b, l), np.float32)}
  seen = []
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    for _ in range(2):
      state, metrics = trainer.train_step(state, trainer.global_batch(batch))
      metrics = jax.device_get(metrics)
      seen.append((float(metrics["loss_sum"] / metrics["weight_sum"]),
                   float(metrics["grad_norm"]), float(metrics["param_norm"])))
  np.testing.assert_allclose(seen, [(5.967378, 0.951698, 13.026247),
                                    (5.872641, 0.684321, 13.056023)], rtol=1e-4)


def test_an_mfu_above_100_percent_is_never_shown_unexplained(caplog):
  """The measured peak is taken under other load: a faster step says why it is above."""
  progress = metrics_lib.TrainProgress(0, 10, 100, flops_per_step=1.0, peak_flops=1.0)
  with caplog.at_level("WARNING"):
    line = progress.line(2, {"seconds_per_step": 0.5, "tokens_per_second": 200.0, "mfu": 2.0})
    again = progress.line(3, {"seconds_per_step": 0.5, "tokens_per_second": 200.0, "mfu": 2.0})
  assert "MFU 200.0% (above the measured peak)" in line and "(above the measured peak)" in again
  assert caplog.text.count("MFU above 100%") == 1  # Explained once, in the log.
  assert "above" not in progress.line(4, {"seconds_per_step": 1.0, "tokens_per_second": 100.0,
                                          "mfu": 0.5})


class _FakeClock:
  """time.perf_counter for TrainProgress: advanced by hand, so fractions are exact."""

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_data_wait_fraction_is_the_share_of_the_window_spent_waiting(monkeypatch):
  """Calls of 1 s with 0.25 s then 0 s waits; the wait behind the compile is not counted,
  nor is an interval that restart_clock dropped."""
  clock = _FakeClock()
  monkeypatch.setattr(metrics_lib.time, "perf_counter", clock)
  progress = metrics_lib.TrainProgress(0, 10, 100)
  progress.waited(30.0)  # The first call: waited behind the compile; the clock not started.
  progress.update(1)
  for step, wait in ((2, 0.25), (3, 0.25)):
    clock.now += wait
    progress.waited(wait)
    clock.now += 1.0 - wait
    progress.update(step)
  assert progress.rates()["data_wait_fraction"] == pytest.approx(0.25)
  progress.waited(5.0)
  progress.restart_clock()  # An evaluation: dropped with its interval.
  clock.now += 1.0
  progress.update(4)
  rates = progress.rates()
  assert rates["data_wait_fraction"] == 0.0 and rates["seconds_per_step"] == 1.0
  assert "data wait 0%" in progress.line(4, rates)


def test_a_slow_pipeline_shows_a_larger_data_wait_than_a_fast_one():
  """The loop's own measure (TrainProgress.next_batch over prefetch.CallBatches), with a
  delay injected into the slow pipeline's placement; the step is a fixed sleep."""
  fractions = {}
  for name, delay in (("fast", 0.0), ("slow", 0.05)):
    def place(batch, stacked, delay=delay):
      time.sleep(delay)
      return batch
    rows = iter(grain.MapDataset.range(100).map(lambda i: {"x": np.array([[i]])})
                .to_iter_dataset())
    progress = metrics_lib.TrainProgress(0, 6, 1)
    with prefetch.CallBatches(rows, place, start_step=0, num_steps=6, steps_per_call=1,
                              depth=1) as batches:
      for step in range(1, 7):
        progress.next_batch(batches)
        time.sleep(0.01)  # The step.
        progress.update(step)
    fractions[name] = progress.rates()["data_wait_fraction"]
  assert 0.0 <= fractions["fast"] < fractions["slow"] <= 1.0, fractions
