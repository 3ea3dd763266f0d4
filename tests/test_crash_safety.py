"""Crash safety: nothing lost, nothing silent.

A run killed anywhere reruns to the same losses and bitwise the same parameters,
with one metrics row per step; a non-finite step never reaches a checkpoint;
unfinished or corrupt checkpoints are set aside, never loaded; a resume with a
changed config applies cadence changes and stops on the others.
"""

import glob
import hashlib
import json
import os
import shutil
import struct
import subprocess
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from tensorboardX.proto import event_pb2

import crash_worker
from tiny import subprocess_env
from transformer.workdir import checkpointing
from transformer.training import metrics
from transformer import sharding
from transformer.training import fault_injection
from transformer.training import hooks
from transformer.training import loop
from transformer.training import optim
from transformer.training import resume
from transformer.training import signals
from transformer.training import trainer as trainer_lib
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import metrics_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------- helpers


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _by_step(workdir, key):
  """{step: row} of the rows holding `key`; fails if a step has two such rows."""
  rows = [r for r in _rows(workdir) if key in r]
  steps = [r["step"] for r in rows]
  assert len(steps) == len(set(steps)), f"a step written twice: {steps}"
  # Timing is the one thing a rerun may not reproduce.
  return {r["step"]: {k: v for k, v in r.items() if k not in metrics.TIMING_KEYS}
          for r in rows}


def _checkpoint_steps(workdir):
  directory = os.path.join(workdir, "checkpoints")
  return sorted(int(s) for s in os.listdir(directory) if s.isdigit())


def _restore_raw(workdir, step):
  path = os.path.join(os.path.abspath(workdir), "checkpoints", str(step), "state")
  return ocp.StandardCheckpointer().restore(path)


def _assert_trees_equal(a, b):
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _all_finite(tree):
  return all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(tree)
             if np.issubdtype(np.asarray(x).dtype, np.floating))


def _events(path):
  """The Event protos of one TensorBoard events file (TFRecord framing)."""
  with open(path, "rb") as f:
    data = f.read()
  offset = 0
  while offset < len(data):
    (length,) = struct.unpack("<Q", data[offset:offset + 8])
    event = event_pb2.Event()
    event.ParseFromString(data[offset + 12:offset + 12 + length])
    offset += 12 + length + 4
    yield event


def _tensorboard_scalars(workdir, tag):
  """{step: [values]} as TensorBoard shows `tag`: a purge event hides steps >= its step."""
  paths = glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))
  seen = {}
  for path in sorted(paths, key=lambda p: (int(os.path.basename(p).split(".")[3]), p)):
    for event in _events(path):
      if event.session_log.status == event_pb2.SessionLog.START:
        seen = {step: v for step, v in seen.items() if step < event.step}
      for value in event.summary.value:
        if value.tag == tag:
          seen.setdefault(event.step, []).append(value.simple_value)
  return seen


# ---------------------------------------------------------------- 1. one row per step


def test_metric_writer_start_from_scratch_says_so(tmp_path, caplog):
  """resume(-1): no 'after step -1'; the rows belong to a start that left no checkpoint."""
  writer = metrics_file.MetricWriter(str(tmp_path))
  for step in range(1, 4):
    writer.write(step, {"loss": float(step)})
  writer.close()
  writer = metrics_file.MetricWriter(str(tmp_path))
  with caplog.at_level("WARNING"):
    assert writer.resume(-1) == []
  writer.close()
  assert ("dropped 3 rows (0 unreadable) of an earlier start that left no usable checkpoint; "
          "this run starts at step 0") in caplog.text
  assert "step -1" not in caplog.text


def test_metric_writer_resume_keeps_rows_up_to_the_checkpoint(tmp_path, caplog):
  workdir = str(tmp_path)
  writer = metrics_file.MetricWriter(workdir)
  writer.write(0, {"eval_loss": 5.0})
  for step in range(1, 6):
    writer.write(step, {"loss": float(step)})
    if step == 3:
      writer.write(3, {"eval_loss": 4.0})
  writer.close()
  with open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8") as f:
    f.write('{"step": 6, "lo')  # A torn line: the process died mid-write.

  writer = metrics_file.MetricWriter(workdir)
  with caplog.at_level("WARNING"):
    kept = writer.resume(3)
  assert "dropped 3 rows written after step 3" in caplog.text  # 4, 5 and the torn one.
  assert [(r["step"], sorted(r)) for r in kept] == [
      (0, ["eval_loss", "step"]), (1, ["loss", "step"]), (2, ["loss", "step"]),
      (3, ["loss", "step"]), (3, ["eval_loss", "step"])]
  assert _rows(workdir) == kept
  assert not os.path.exists(os.path.join(workdir, "metrics.jsonl.tmp"))
  for step in (4, 5):
    writer.write(step, {"loss": 10.0 * step})
  writer.close()
  assert [r["step"] for r in _rows(workdir) if "loss" in r] == [1, 2, 3, 4, 5]
  # TensorBoard: the new events file purges what the dead run wrote after step 3.
  assert _tensorboard_scalars(workdir, "loss") == {1: [1.0], 2: [2.0], 3: [3.0],
                                                    4: [40.0], 5: [50.0]}

  writer = metrics_file.MetricWriter(workdir)
  assert writer.resume(-1) == []  # A start from scratch: every row goes.
  writer.close()
  assert not _rows(workdir)


def _run_worker(workdir, data_dir, kill_at=None, sync_save=False):
  """Runs tests/crash_worker.py on one CPU device; returns (returncode, output)."""
  env = subprocess_env()
  env.pop(fault_injection.KillAt.VARIABLE, None)  # pylint: disable=protected-access
  if kill_at:
    env[fault_injection.KillAt.VARIABLE] = kill_at  # pylint: disable=protected-access
  command = [sys.executable, os.path.join(ROOT, "tests", "crash_worker.py"),
             f"--workdir={workdir}", f"--data_dir={data_dir}"]
  if sync_save:
    command.append("--sync_save")
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
  return result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def uninterrupted(tfds_data_dir, tmp_path_factory):
  """The worker's run without a crash: the reference every killed run must match."""
  workdir = str(tmp_path_factory.mktemp("uninterrupted") / "run")
  code, output = _run_worker(workdir, tfds_data_dir)
  assert code == 0, output[-3000:]
  return workdir


def _kill_and_rerun(point_and_step, uninterrupted, tfds_data_dir, tmp_path, sync_save=False):
  """Kills the worker at `point_and_step`, reruns it, checks it matches `uninterrupted`."""
  workdir = str(tmp_path / "run")
  code, output = _run_worker(workdir, tfds_data_dir, point_and_step, sync_save)
  assert code == -9, f"expected a SIGKILL, got {code}:\n{output[-3000:]}"
  assert f"killing this process {point_and_step.replace(':', ' ')}" in output
  killed_rows = _rows(workdir)

  code, output = _run_worker(workdir, tfds_data_dir, sync_save=sync_save)  # The same command.
  assert code == 0, output[-3000:]
  resumed = _checkpoint_steps(workdir)
  num_steps = crash_worker.NUM_STEPS
  assert resumed[-1] == num_steps
  # One row per step, equal to the uninterrupted run's: same data order, same updates.
  assert list(_by_step(workdir, "loss")) == list(range(1, num_steps + 1))
  assert _by_step(workdir, "loss") == _by_step(uninterrupted, "loss")
  assert _by_step(workdir, "eval_loss") == _by_step(uninterrupted, "eval_loss")
  assert _tensorboard_scalars(workdir, "loss") == _tensorboard_scalars(uninterrupted, "loss")
  _assert_trees_equal(_restore_raw(workdir, num_steps), _restore_raw(uninterrupted, num_steps))
  data = os.path.join("checkpoints", str(num_steps), "data", "process_0-of-1.json")
  with open(os.path.join(workdir, data), encoding="utf-8") as a, \
       open(os.path.join(uninterrupted, data), encoding="utf-8") as b:
    assert json.load(a) == json.load(b)  # The data iterator ends at the same position.
  return killed_rows, output


def test_sigkill_after_a_step_reruns_exactly(uninterrupted, tfds_data_dir, tmp_path):
  """Killed after step 5 (checkpoint 3 written): the rows of step 4 are written again, once."""
  killed_rows, output = _kill_and_rerun("after_step:5", uninterrupted, tfds_data_dir,
                                        tmp_path, sync_save=True)
  # The dead run had written rows past its last checkpoint (train rows of 4, eval of 4).
  assert max(r["step"] for r in killed_rows) == 4
  assert "Resumed from checkpoint 3" in output
  assert "dropped 2 rows written after step 3" in output


@pytest.mark.slow
@pytest.mark.parametrize("point_and_step", ["during_eval:4", "during_save:6", "after_save:6",
                                            "after_step:7"])
def test_sigkill_anywhere_reruns_exactly(point_and_step, uninterrupted, tfds_data_dir,
                                         tmp_path):
  """Async saves: where a save was in flight, the rerun sets it aside and resumes before it."""
  _, output = _kill_and_rerun(point_and_step, uninterrupted, tfds_data_dir, tmp_path)
  if point_and_step == "after_save:6":  # The write had finished: the rerun resumes from it.
    assert "Resumed from checkpoint 6" in output
  elif point_and_step == "during_save:6":
    assert "Resumed from checkpoint 6" not in output


def test_kill_hook_registers_itself_only_when_asked(monkeypatch):
  """The loop names no crash point: fault_injection registers a hook when the variable is set."""
  monkeypatch.delenv(fault_injection.KillAt.VARIABLE, raising=False)
  assert not [h for h in hooks.registered() if isinstance(h, fault_injection.KillAt)]
  monkeypatch.setenv(fault_injection.KillAt.VARIABLE, "after_save:6")
  (hook,) = [h for h in hooks.registered() if isinstance(h, fault_injection.KillAt)]
  called = []
  waiting = type("Checkpointer", (), {"wait": lambda self: called.append(1)})()
  hook.after_save(5, waiting)  # Another step: nothing happens.
  hook.after_call(6, None)  # Another point: nothing either.
  assert not called
  monkeypatch.setenv(fault_injection.KillAt.VARIABLE, "during_lunch:3")
  with pytest.raises(ValueError, match="TRANSFORMER_TEST_KILL_AT='during_lunch:3'"):
    hooks.registered()


# ---------------------------------------------------------------- 2. non-finite steps


@pytest.fixture
def poison_steps(monkeypatch):
  """poison_steps({4}) makes the batches of those steps (1-based) carry NaN weights."""
  steps = set()
  create = trainer_lib.Trainer.create

  def poisoned_create(cls, config, mesh):
    del cls
    trainer = create(config, mesh)
    train_step = trainer.train_step

    def step_with_poison(state, batch):
      if int(state.step) + 1 in steps:
        batch = dict(batch, weights=batch["weights"] * jnp.nan)
      return train_step(state, batch)

    trainer.train_step = step_with_poison
    return trainer

  monkeypatch.setattr(trainer_lib.Trainer, "create", classmethod(poisoned_create))
  return steps.update


def test_nonfinite_step_stops_before_it_is_saved(tiny_config, tmp_path, poison_steps):
  poison_steps({4})
  tiny_config.checkpoint.every = 1  # A save after every step: step 4's must not happen.
  workdir = str(tmp_path / "run")
  with pytest.raises(FloatingPointError, match=r"Non-finite training loss nan .* at step 4"):
    loop.train_and_evaluate(tiny_config, workdir)
  assert _checkpoint_steps(workdir) == [1, 2, 3]
  assert _all_finite(_restore_raw(workdir, 3))
  assert [r["step"] for r in _rows(workdir) if "loss" in r] == [1, 2, 3]


def test_skip_nonfinite_skips_updates_then_stops_after_a_streak(tiny_config, tmp_path,
                                                                 poison_steps):
  tiny_config.optimizer.skip_nonfinite = 2
  tiny_config.checkpoint.every = 1
  poison_steps({4})  # One bad batch: skipped, the run goes on.
  workdir = str(tmp_path / "one")
  loop.train_and_evaluate(tiny_config, workdir)
  rows = _by_step(workdir, "skipped_updates")
  assert [rows[s]["skipped_updates"] for s in range(1, 7)] == [0, 0, 0, 1, 0, 0]
  assert [rows[s]["skipped_total"] for s in range(1, 7)] == [0, 0, 0, 1, 1, 1]
  assert "loss" not in rows[4] and all("loss" in rows[s] for s in (1, 2, 3, 5, 6))
  # The logged rate is the one applied: the schedule at the optimizer's update count,
  # which the skipped step 4 did not advance (steps 5 and 6 are updates 4 and 5).
  schedule = optim.make_schedule(tiny_config.optimizer, tiny_config.model.d_model,
                                 tiny_config.train.num_steps)
  applied = [float(schedule(count)) for count in (0, 1, 2, 3, 3, 4)]
  assert applied[4] != float(schedule(4))  # Else the check below could not fail.
  assert [rows[s]["learning_rate"] for s in range(1, 7)] == pytest.approx(applied, rel=1e-6)
  before, skipped = _restore_raw(workdir, 3), _restore_raw(workdir, 4)
  assert int(skipped["step"]) == 4  # The step advanced ...
  _assert_trees_equal(skipped["params"], before["params"])  # ... the update did not happen.
  _assert_trees_equal(skipped["opt_state"], before["opt_state"])
  assert _all_finite(_restore_raw(workdir, 6))

  poison_steps({5})  # Now 4 and 5: two in a row stops the run.
  workdir = str(tmp_path / "streak")
  with pytest.raises(FloatingPointError, match=r"2 steps in a row \(steps 4, 5\)"):
    loop.train_and_evaluate(tiny_config, workdir)
  assert _checkpoint_steps(workdir) == [1, 2, 3, 4]
  assert _all_finite(_restore_raw(workdir, 4))


@pytest.mark.parametrize("value", [-1, True])
def test_skip_nonfinite_is_validated(tiny_config, value):
  tiny_config.optimizer.skip_nonfinite = value
  with pytest.raises(ConfigError, match=r"config\.optimizer\.skip_nonfinite=.* expected an "
                     r"integer >= 0"):
    validate(tiny_config)


# ---------------------------------------------------------------- 3. bad checkpoints


@pytest.fixture
def finished_run(finished_tiny_run):
  """A finished 6-step tiny run (checkpoints 3 and 6), kept pristine: tests copy it."""
  return finished_tiny_run


def _copy(run, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(run, workdir)
  return workdir


def _truncate_largest_file(step_dir):
  files = [os.path.join(d, f) for d, _, names in os.walk(step_dir) for f in names]
  largest = max(files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    f.truncate(os.path.getsize(largest) // 2)


def _overwrite(path):
  with open(path, "w", encoding="utf-8") as f:
    f.write("{not json")


def _garbage_ocdbt_manifest_unrecorded(step_dir):
  """Damage only a read finds: no recorded sizes, a binary index overwritten."""
  os.remove(os.path.join(step_dir, layout.FILE_SIZES))
  _overwrite(os.path.join(step_dir, "state", "manifest.ocdbt"))


CORRUPTIONS = {
    "truncated": (_truncate_largest_file, "truncated"),  # Its size was recorded.
    "unrecorded": (_garbage_ocdbt_manifest_unrecorded, "unreadable"),  # Found by restore.
    "no_state": (lambda d: shutil.rmtree(os.path.join(d, "state")), "missing-state"),
    "garbage_metadata": (lambda d: _overwrite(os.path.join(d, "state", "_METADATA")),
                         "bad-metadata"),
    "unfinished": (lambda d: os.rename(d, d + ".orbax-checkpoint-tmp"), "unfinished"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_newest_checkpoint_is_set_aside(corruption, finished_run, tiny_config,
                                                tmp_path, caplog):
  damage, reason = CORRUPTIONS[corruption]
  workdir = _copy(finished_run, tmp_path)
  damage(os.path.join(workdir, "checkpoints", "6"))
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    loop.train_and_evaluate(tiny_config, workdir)
  assert "Skipping checkpoint 6" in caplog.text
  assert "Resumed from checkpoint 3" in caplog.text
  assert os.listdir(os.path.join(workdir, "checkpoints_bad")) == [f"6-{reason}"]
  assert _checkpoint_steps(workdir) == [3, 6]  # 6 written again by the rerun.
  _assert_trees_equal(_restore_raw(workdir, 6), _restore_raw(finished_run, 6))
  assert _by_step(workdir, "loss") == _by_step(finished_run, "loss")


class _UnusedIterator:
  """Stands in for the data iterator where no checkpoint gets restored."""

  def get_state(self):
    return {}

  def set_state(self, state):
    raise AssertionError(f"nothing was restored, yet set_state({state})")


def test_no_usable_checkpoint_left_means_none(finished_run, tiny_config, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "6", "data"))
  _overwrite(os.path.join(workdir, "checkpoints", "3", "_CHECKPOINT_METADATA"))
  trainer = trainer_lib.Trainer.create(tiny_config, sharding.make_mesh(tiny_config.mesh))
  checkpointer = checkpointing.Checkpointer(workdir, tiny_config.checkpoint)
  try:
    assert checkpointer.restore_latest(trainer.abstract_state, _UnusedIterator()) is None
  finally:
    checkpointer.close()
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints_bad"))) == [
      "3-bad-metadata", "6-missing-data"]
  assert len(checkpointer.set_aside) == 2


def test_checkpoint_of_another_model_is_a_config_error_not_damage(finished_run, tiny_config,
                                                                  tmp_path):
  workdir = _copy(finished_run, tmp_path)
  tiny_config.model.mlp_dim = 128
  trainer = trainer_lib.Trainer.create(tiny_config, sharding.make_mesh(tiny_config.mesh))
  checkpointer = checkpointing.Checkpointer(workdir, tiny_config.checkpoint)
  try:
    with pytest.raises(ConfigError, match="checkpoint 6 .* do not match"):
      checkpointer.restore_latest(trainer.abstract_state, _UnusedIterator())
  finally:
    checkpointer.close()
  assert not os.path.exists(os.path.join(workdir, "checkpoints_bad"))


# ---------------------------------------------------------------- 5. changed config


def test_resume_applies_cadence_changes_and_lists_them(finished_run, tiny_config, tmp_path,
                                                       caplog):
  workdir = _copy(finished_run, tmp_path)
  tiny_config.train.update(num_steps=8, log_every=2, eval_batches=1)
  tiny_config.decode.beam_size = 2
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    loop.train_and_evaluate(tiny_config, workdir)
  assert ("Resuming with changed settings (applied): decode.beam_size: 4 -> 2; "
          "train.eval_batches: 2 -> 1; train.log_every: 1 -> 2; train.num_steps: 6 -> 8"
          in caplog.text)
  assert "Resumed from checkpoint 6" in caplog.text
  assert _checkpoint_steps(workdir)[-1] == 8
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["train"]["num_steps"] == 8  # The new values are the run's now.


def test_resume_with_a_changed_model_or_optimizer_stops(finished_run, tiny_config, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  tiny_config.model.mlp_dim = 128
  tiny_config.optimizer.learning_rate = 1e-3
  tiny_config.seed = 7
  tiny_config.train.num_steps = 8  # Safe: not listed.
  with pytest.raises(ConfigError) as error:
    loop.train_and_evaluate(tiny_config, workdir)
  message = str(error.value)
  assert "3 key(s)" in message
  for change in ("model.mlp_dim: 64 -> 128", "optimizer.learning_rate: 0.003 -> 0.001",
                 "seed: 0 -> 7", "--config.checkpoint.on_config_change=allow"):
    assert change in message
  assert "num_steps" not in message
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["model"]["mlp_dim"] == 64  # Left as it was.


def test_on_config_change_allow_resumes_anyway(finished_run, tiny_config, tmp_path, caplog):
  workdir = _copy(finished_run, tmp_path)
  tiny_config.optimizer.learning_rate = 1e-3
  tiny_config.train.num_steps = 7
  tiny_config.checkpoint.on_config_change = "allow"
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    loop.train_and_evaluate(tiny_config, workdir)
  assert "on_config_change='allow'" in caplog.text
  assert "optimizer.learning_rate: 0.003 -> 0.001" in caplog.text
  assert "Resumed from checkpoint 6" in caplog.text
  assert _checkpoint_steps(workdir)[-1] == 7


def test_resolved_vocab_size_is_not_a_change(finished_run, tiny_config, tmp_path, caplog,
                                             monkeypatch):
  """vocab_size=0 resolves (bytes tokenizer: 384) to what config.json holds: no difference.

  The run is finished: the rerun says so and returns its logged metrics without
  building or compiling a model.
  """
  workdir = _copy(finished_run, tmp_path)
  tiny_config.model.vocab_size = 0

  def no_compiling(*args, **kwargs):
    raise AssertionError("a finished run built a Trainer")

  monkeypatch.setattr(trainer_lib.Trainer, "create", no_compiling)
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    result = loop.train_and_evaluate(tiny_config, workdir)
  assert f"{workdir} is already complete: its checkpoint 6 reaches train.num_steps=6" in (
      caplog.text)
  assert "Resumed" not in caplog.text and "changed settings" not in caplog.text
  rows = [r for r in _rows(workdir) if "eval_loss" in r]
  assert result["eval_loss"] == rows[-1]["eval_loss"]


def test_config_json_without_a_checkpoint_is_not_a_resume(finished_run, tiny_config, tmp_path,
                                                          caplog):
  workdir = str(tmp_path / "stale")
  os.makedirs(workdir)
  shutil.copy(os.path.join(finished_run, "config.json"), workdir)
  tiny_config.model.mlp_dim = 128
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    resume.check_config_change(tiny_config, workdir)
  assert "not a resume" in caplog.text
  tiny_config.checkpoint.on_config_change = "sometimes"
  with pytest.raises(ConfigError, match=r"config\.checkpoint\.on_config_change='sometimes' "
                     r"is invalid: valid values are 'stop', 'allow'"):
    resume.check_config_change(tiny_config, workdir)


def _file_digests(workdir: str) -> dict[str, str]:
  """sha256 of every file directly in `workdir` (not the checkpoints, not log.txt)."""
  return {name: hashlib.sha256(open(os.path.join(workdir, name), "rb").read()).hexdigest()
          for name in sorted(os.listdir(workdir))
          if os.path.isfile(os.path.join(workdir, name)) and name != layout.LOG}


def test_resume_keeps_its_vocabulary_and_refuses_an_edited_dataset(tiny_config, tmp_path):
  """Issue 19 row 1: edited data under a resumed run is a listed change, never a new vocabulary."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("".join(f"{i} the quick brown fox jumps over the lazy dog\n"
                            for i in range(200)), encoding="utf-8")
  tiny_config.data.update(name="local_text", path=str(corpus), tokenizer="char",
                          data_dir=str(tmp_path / "data"))
  tiny_config.model.vocab_size = 0
  tiny_config.train.update(num_steps=2, eval_every=2)
  tiny_config.checkpoint.every = 2
  workdir = str(tmp_path / "run")
  loop.train_and_evaluate(tiny_config, workdir)
  with open(os.path.join(workdir, layout.TOKENIZER_RECORD), encoding="utf-8") as f:
    vocabulary = json.load(f)
  before = _file_digests(workdir)

  # Issue 34: identity by content. A byte-identical copy in another folder under another
  # name passes the resume check (the run is complete, so nothing is trained or written).
  copy = tmp_path / "elsewhere" / "copy.txt"
  copy.parent.mkdir()
  copy.write_bytes(corpus.read_bytes())
  tiny_config.data.path = str(copy)
  loop.train_and_evaluate(tiny_config, workdir)
  assert _file_digests(workdir) == before
  tiny_config.data.path = str(corpus)

  # New characters: a retrained character vocabulary would grow.
  with open(corpus, "a", encoding="utf-8") as f:
    f.write("".join(f"{i} ZYXWVUTSRQ JKL éàü\n" for i in range(200)))
  tiny_config.train.num_steps = 3
  with pytest.raises(ConfigError, match=r"dataset: 'local_text/corpus_.*' -> "
                     r"'local_text/corpus_.*' \(changed: corpus\.txt\)"):
    loop.train_and_evaluate(tiny_config, workdir)
  assert _file_digests(workdir) == before  # Nothing rewritten.

  tiny_config.checkpoint.on_config_change = "allow"  # Resume on the new data anyway ...
  loop.train_and_evaluate(tiny_config, workdir)
  assert _checkpoint_steps(workdir)[-1] == 3
  with open(os.path.join(workdir, layout.TOKENIZER_RECORD), encoding="utf-8") as f:
    assert json.load(f) == vocabulary  # ... with the run's own vocabulary.

  # Issue 34: the vocabulary is part of the run. Without it the resume stops (one line
  # naming the file), 'allow' or not, instead of deriving one from the changed data.
  os.remove(os.path.join(workdir, layout.TOKENIZER_RECORD))
  before = _file_digests(workdir)
  tiny_config.train.num_steps = 4
  with pytest.raises(ConfigError, match=rf"{workdir}/tokenizer\.json is missing: it names "
                     r"the vocabulary .*whatever checkpoint\.on_config_change says") as error:
    loop.train_and_evaluate(tiny_config, workdir)
  assert "\n" not in str(error.value)
  assert _file_digests(workdir) == before  # Nothing written: not even a new vocabulary.
  assert _checkpoint_steps(workdir)[-1] == 3


def test_a_failed_resume_leaves_every_file_as_it_was(finished_run, tiny_config, tmp_path):
  """Issue 19 row 2: config.json and the vocabulary are written after the restore succeeds."""
  workdir = _copy(finished_run, tmp_path)
  before = _file_digests(workdir)
  tiny_config.model.mlp_dim = 128  # Allowed by the policy, but the arrays do not fit.
  tiny_config.train.num_steps = 8  # A resume (the run is complete at 6).
  tiny_config.checkpoint.on_config_change = "allow"
  with pytest.raises(ConfigError, match="do not match"):
    loop.train_and_evaluate(tiny_config, workdir)
  assert _file_digests(workdir) == before
  tiny_config.model.mlp_dim = 64
  tiny_config.checkpoint.on_config_change = "stop"
  loop.train_and_evaluate(tiny_config, workdir)  # The command with the run's model resumes.


# ---------------------------------------------------------------- 6. signals


class _SendSignals(hooks.Hook):
  """Sends this process `signums` after the call that ends at `step` (Ctrl-C twice)."""

  def __init__(self, step, *signums):
    self.step, self.signums = step, signums

  def after_call(self, step, state):
    if step == self.step:
      for signum in self.signums:
        os.kill(os.getpid(), signum)


def test_a_second_signal_stops_at_once_with_its_own_status(tiny_config, tmp_path, monkeypatch):
  """Issue 34: no KeyboardInterrupt traceback; 130 / 143 as the signal says; nothing partial."""
  # The handlers are installed only in the main thread; elsewhere the signal would kill pytest.
  assert threading.current_thread() is threading.main_thread()
  callers_handler = signal.getsignal(signal.SIGTERM)
  workdir = str(tmp_path / "run")
  save = checkpointing.Checkpointer.save

  def signalled_save(self, step, state, data_iterator):
    if step == 3:  # Both signals arrive as the save starts: it is finished first.
      os.kill(os.getpid(), signal.SIGINT)
      os.kill(os.getpid(), signal.SIGINT)
    save(self, step, state, data_iterator)

  monkeypatch.setattr(checkpointing.Checkpointer, "save", signalled_save)
  with pytest.raises(signals.Interrupted) as stopped:
    loop.train_and_evaluate(tiny_config, workdir)
  assert (stopped.value.step, stopped.value.exit_status, stopped.value.aborted) == (3, 130, True)
  assert str(stopped.value) == ("Stopped at once by a second signal (SIGINT); rerun the same "
                                "command to resume from checkpoint 3")
  assert _checkpoint_steps(workdir) == [3]
  assert checkpointing.checkpoint_problem(os.path.join(workdir, "checkpoints", "3")) is None
  monkeypatch.setattr(checkpointing.Checkpointer, "save", save)

  # Between saves it stops at once: step 4 is trained, never saved; SIGTERM's status.
  with pytest.raises(signals.Interrupted) as stopped:
    loop.train_and_evaluate(tiny_config, workdir,
                            hooks=[_SendSignals(4, signal.SIGTERM, signal.SIGTERM)])
  assert (stopped.value.step, stopped.value.exit_status, stopped.value.aborted) == (3, 143, True)
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["3"]  # No temporary left.
  # Whole lines only; step 4's row (reported one call late) never came.
  assert [r["step"] for r in _rows(workdir) if "loss" in r] == [1, 2, 3]
  assert signal.getsignal(signal.SIGTERM) == callers_handler  # The caller's handler again.
  loop.train_and_evaluate(tiny_config, workdir)  # Rerunning resumes from 3 and finishes.
  assert _checkpoint_steps(workdir) == [3, 6]
  assert [r["step"] for r in _rows(workdir) if "loss" in r] == [1, 2, 3, 4, 5, 6]


def test_a_third_signal_during_a_save_that_hangs_stops_at_once(tiny_config, tmp_path,
                                                               monkeypatch, caplog):
  """A save waiting on a dead peer held every signal until SIGKILL. The first is the stop
  request, the second waits for the save, the third stops at once: the checkpoint is left
  incomplete (the next start sets it aside), and launch.py is told not to wait for it."""
  workdir = str(tmp_path / "run")
  save, waited = checkpointing.Checkpointer.save, []

  def hangs(self, step, state, data_iterator):
    if step == 3:
      for _ in range(3):
        os.kill(os.getpid(), signal.SIGINT)
      for _ in range(100):  # 5 s, unless stopped.
        time.sleep(0.05)
        waited.append(1)
    save(self, step, state, data_iterator)

  monkeypatch.setattr(checkpointing.Checkpointer, "save", hangs)
  files.forget_finished()
  with caplog.at_level("WARNING"), pytest.raises(signals.Interrupted) as stopped:
    loop.train_and_evaluate(tiny_config, workdir)
  assert len(waited) < 100
  assert (stopped.value.step, stopped.value.exit_status, stopped.value.aborted) == (None, 130, True)
  assert ("a third time: stopping now; the checkpoint being written is left incomplete: the "
          "next start moves it to checkpoints_bad/") in caplog.text
  assert files.abandoned_writes() == ["the checkpoint being written is incomplete"]
  files.forget_finished()
  monkeypatch.setattr(checkpointing.Checkpointer, "save", save)
  loop.train_and_evaluate(tiny_config, workdir)  # The rerun trains from the start.
  assert _checkpoint_steps(workdir) == [3, 6]


def test_a_signal_during_the_last_save_says_the_run_finished(tiny_config, tmp_path,
                                                           monkeypatch, caplog):
  """SIGINT during the last call's checkpoint: "Stopped at step 6; rerun the same command
  to resume" was logged beside "finished" (exit 0). The one true line: it finished."""
  save = checkpointing.Checkpointer.save

  def signalled(self, step, state, data_iterator):
    if step == tiny_config.train.num_steps:
      os.kill(os.getpid(), signal.SIGINT)
    save(self, step, state, data_iterator)

  monkeypatch.setattr(checkpointing.Checkpointer, "save", signalled)
  with caplog.at_level("WARNING"):
    loop.train_and_evaluate(tiny_config, str(tmp_path / "run"))  # No Interrupted: finished.
  assert "rerun the same command" not in caplog.text
  assert ("SIGINT came as the run finished: all 6 steps are trained and saved (checkpoint "
          "6); nothing was cut short, nothing to resume") in caplog.text


def test_a_signal_during_the_last_call_says_the_run_finished(tiny_config, tmp_path, caplog,
                                                             monkeypatch):
  """The same for a signal while the last call trains (sent once it is dispatched: a
  signal before it stops the run at step 5, test_train.py): nothing is left to stop."""
  dispatch = loop._dispatch  # pylint: disable=protected-access

  def dispatch_then_signal(run, state, call):
    result = dispatch(run, state, call)
    if run.stop._call == (6, 6):  # pylint: disable=protected-access
      os.kill(os.getpid(), signal.SIGTERM)
    return result
  monkeypatch.setattr(loop, "_dispatch", dispatch_then_signal)
  with caplog.at_level("WARNING"):
    loop.train_and_evaluate(tiny_config, str(tmp_path / "run"))
  assert "rerun the same command" not in caplog.text
  assert "SIGTERM came as the run finished: all 6 steps" in caplog.text
