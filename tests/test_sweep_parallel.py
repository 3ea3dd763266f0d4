"""--mode=sweep --devices_per_run: arms side by side on device slots, against one at a time.

The fast tests check the slots (which devices, which environment) and the one-line
errors; the slow one runs two tiny arms side by side on this CPU host (one simulated device
each) and holds their metrics.jsonl to a sequential sweep's, value for value.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from local_ray import cluster  # pylint: disable=unused-import  (the fixture)
from test_sweep import ROOT, _sweep, _tiny_flags
from tiny import subprocess_env
from transformer.cli import sweep
from transformer.cli import sweep_devices
from transformer.config.errors import ConfigError
from transformer.reports import compare

# Keys of a metrics.jsonl row that measure time, not the training: they differ run to run.
_TIMING = ("time", "second", "wall", "elapsed", "mfu", "flops", "wait")


def test_slots_give_each_arm_its_own_devices():
  gpu = sweep_devices.slots(2, "gpu", ["0", "1", "2", "3", "4"])
  assert [(s.where, s.env) for s in gpu] == [
      ("GPU 0,1", {"CUDA_VISIBLE_DEVICES": "0,1"}), ("GPU 2,3", {"CUDA_VISIBLE_DEVICES": "2,3"})]
  tpu = sweep_devices.slots(1, "tpu", ["0", "1"])
  assert [s.env["TPU_VISIBLE_CHIPS"] for s in tpu] == ["0", "1"]
  assert {s.env["TPU_CHIPS_PER_PROCESS_BOUNDS"] for s in tpu} == {"1,1,1"}
  assert len({s.env["TPU_PROCESS_PORT"] for s in tpu}) == 2  # One port per process.
  cpu = sweep_devices.slots(2, "cpu", ["0", "1", "2", "3"])
  assert len(cpu) == 2 and cpu[0].env["JAX_PLATFORMS"] == "cpu"
  assert cpu[0].env["XLA_FLAGS"].split().count("--xla_force_host_platform_device_count=2") == 1


@pytest.mark.parametrize("kind,devices,k,message", [
    ("gpu", ["0", "1"], 3, "--devices_per_run=3: this host has 2 GPUs (0, 1); at most 2"),
    ("cpu", ["0", "1"], 4, "--devices_per_run=4: this host has 2 CPU cores"),
    ("tpu", ["0", "1", "2", "3"], 3, "a TPU process can take 1, 2 or 4 chips"),
    ("cpu", ["0"], -1, "--devices_per_run=-1 is invalid"),
])
def test_slots_refuse_what_the_host_cannot_give(kind, devices, k, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    sweep_devices.slots(k, kind, devices)


@pytest.mark.parametrize("flags,message", [
    (["--devices_per_run=999"], "--devices_per_run=999: this host has"),
    (["--devices_per_run=0"], "--devices_per_run=0 is invalid"),
    (["--ray_address=127.0.0.1:1"], "--ray_address=127.0.0.1:1 with --mode=sweep needs "
     "--devices_per_run=K"),
    (["--devices_per_run=1", "--ray_address=127.0.0.1:1"],
     "--ray_address=127.0.0.1:1: no Ray cluster answers at 127.0.0.1:1"),
    (["--devices_per_run=1", "--ray_address=nohost"], "--ray_address='nohost' is invalid"),
])
def test_bad_device_flags_are_one_line_and_create_nothing(flags, message, tmp_path):
  sweep_dir = tmp_path / "sweep"
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=sweep",
       "--config=configs/gpt_small.py:local", f"--workdir={sweep_dir}",
       "--sweep=model.position=learned,rope", *flags], cwd=ROOT, env=subprocess_env(),
      capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert not sweep_dir.exists()


def training_values(workdir: str) -> list[dict]:
  """metrics.jsonl's rows without the timing keys."""
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [{k: v for k, v in row.items() if not any(t in k for t in _TIMING)} for row in rows]


@pytest.fixture(scope="module")
def sequential(tfds_data_dir, tmp_path_factory) -> str:
  """The two tiny arms, one at a time: the reference."""
  sweep_dir = str(tmp_path_factory.mktemp("sequential") / "sweep")
  code, output = _sweep(sweep_dir, tfds_data_dir)
  assert code == 0, output[-3000:]
  return sweep_dir


def assert_same_training(sweep_dir: str, reference: str) -> None:
  for name in ("position=learned", "position=rope"):
    expected = training_values(os.path.join(reference, name))
    assert len(expected) > 3 and any("eval_loss" in row for row in expected)
    assert training_values(os.path.join(sweep_dir, name)) == expected, name
  assert [r["status"] for r in compare.sweep_runs(sweep_dir)] == ["finished"] * 2
  for stem in ("compare.md", "compare_eval_loss.png"):
    assert os.path.exists(os.path.join(sweep_dir, stem))


@pytest.mark.slow  # Two two-run sweeps of the tiny model (~40-60 s on a shared 2-core CPU).
def test_two_arms_side_by_side_equal_a_sequential_sweep(tfds_data_dir, sequential, tmp_path):
  side_by_side = str(tmp_path / "parallel")
  code, output = _sweep(side_by_side, tfds_data_dir, extra=["--devices_per_run=1"])
  assert code == 0, output[-3000:]
  assert "sweep: 2 runs side by side, at most 2 at once on CPU slot 0 (1 device), " \
         "CPU slot 1 (1 device)" in output
  assert ("sweep: running run 1/2 model.position=learned on CPU slot 0 (1 device); "
          "run 2/2 model.position=rope on CPU slot 1 (1 device); 0 waiting") in output
  assert "run 2/2 model.position=rope: starting on CPU slot 1 (1 device) in" in output
  assert_same_training(side_by_side, sequential)


@pytest.mark.slow  # A two-node Ray cluster (15-40 s to start) and a sweep on it.
def test_two_arms_as_ray_tasks_equal_a_sequential_sweep(tfds_data_dir, sequential, cluster,
                                                        tmp_path):
  on_ray = str(tmp_path / "ray")
  code, output = _sweep(on_ray, tfds_data_dir,
                        extra=["--devices_per_run=1", f"--ray_address={cluster.address}"])
  assert code == 0, output[-3000:]
  assert ("sweep: running run 1/2 model.position=learned on the Ray cluster (1 CPU); "
          "run 2/2 model.position=rope on the Ray cluster (1 CPU); 0 waiting") in output
  assert output.count(": ran on node 127.0.0.1") == 2
  assert_same_training(on_ray, sequential)


@pytest.mark.slow
def test_more_devices_than_any_ray_node_has_is_one_line(cluster, tmp_path):
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=sweep",
       "--config=configs/gpt_small.py:local", f"--workdir={tmp_path / 'sweep'}",
       "--sweep=model.position=learned,rope", "--devices_per_run=2",
       f"--ray_address={cluster.address}"], cwd=ROOT, env=subprocess_env(),
      capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  assert (f"--devices_per_run=2: no node of the Ray cluster at {cluster.address} has 2 CPUs "
          "(the largest has 1); at most 1") in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr


def _logged_steps(workdir: str) -> int:
  try:
    return len(training_values(workdir))
  except (OSError, ValueError):
    return 0


@pytest.mark.slow  # Two long arms started side by side, then Ctrl-C (~40-90 s).
def test_ctrl_c_stops_every_running_arm_with_a_checkpoint(tfds_data_dir, tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  command = [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=sweep",
             "--config=configs/gpt_small.py:local", f"--workdir={sweep_dir}",
             "--sweep=model.position=learned,rope", "--devices_per_run=1"] + [
                 flag for flag in _tiny_flags(tfds_data_dir)
                 if not flag.startswith(("--config.model.position", "--config.train.num_steps"))
             ] + ["--config.train.num_steps=100000"]
  # SIGINT as a terminal's foreground process has it (a pytest-xdist worker ignores it).
  process = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  workdirs = [os.path.join(sweep_dir, n) for n in ("position=learned", "position=rope")]
  try:
    deadline = time.monotonic() + 600  # A hang guard only.
    while not all(_logged_steps(w) >= 2 for w in workdirs):
      assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
      time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=600)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 130, output[-3000:]
  assert "signal 2 passed to the running runs" in output
  assert [r["status"] for r in compare.sweep_runs(sweep_dir)] == ["stopped"] * 2, output[-3000:]
  for workdir in workdirs:  # Each saved where it stopped.
    assert sweep.finished_step(workdir) is not None, workdir
