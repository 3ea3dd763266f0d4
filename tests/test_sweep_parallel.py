"""--mode=sweep --devices_per_run: arms side by side on device slots, against one at a time.

The fast tests check the slots (which devices, which environment) and the one-line
errors; the slow ones run two tiny arms side by side on this CPU host (one simulated device
each) and as Ray tasks on a local cluster, and hold their metrics.jsonl to a sequential
sweep's, value for value; one kills the node an arm runs on (the arm resumes on another
node, or is listed as failed when no node can take it).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import psutil

from local_ray import cluster  # pylint: disable=unused-import  (the fixture)
from local_ray import LocalCluster
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


@pytest.mark.slow  # Two long arms started side by side, then Ctrl-C (~40-90 s each).
@pytest.mark.parametrize("on_ray", [False, True], ids=["local", "ray"])
def test_ctrl_c_stops_every_running_arm_with_a_checkpoint(tfds_data_dir, tmp_path, on_ray,
                                                          request):
  sweep_dir = str(tmp_path / "sweep")
  # On Ray: each arm a task on the module's two-node cluster, cancelled by the Ctrl-C.
  ray_flags = [f"--ray_address={request.getfixturevalue('cluster').address}"] if on_ray else []
  command = [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=sweep",
             "--config=configs/gpt_small.py:local", f"--workdir={sweep_dir}",
             "--sweep=model.position=learned,rope", "--devices_per_run=1"] + [
                 flag for flag in _tiny_flags(tfds_data_dir)
                 if not flag.startswith(("--config.model.position", "--config.train.num_steps"))
             ] + ["--config.train.num_steps=100000"] + ray_flags
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


def _sweep_killing_its_node(local: LocalCluster, spec: str, sweep_dir: str, data_dir: str,
                            frozen: str) -> tuple[int, str, int]:
  """A one-arm sweep on `local` whose run freezes (SIGSTOP) after step 4, once (checkpoint
  3 saved, step 4's row written); then the node it runs on is SIGKILLed whole, as a machine
  lost. Returns (exit status, output, the killed node)."""
  command = [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=sweep",
             "--config=configs/gpt_small.py:local", f"--workdir={sweep_dir}", f"--sweep={spec}",
             "--devices_per_run=1", f"--ray_address={local.address}"] + [
                 flag for flag in _tiny_flags(data_dir)
                 if flag.split("=")[0].removeprefix("--config.") not in spec]
  env = subprocess_env(TRANSFORMER_TEST_KILL_AT="after_step:4:SIGSTOP",
                       TRANSFORMER_TEST_KILL_ONCE=frozen)
  process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
  try:
    deadline, node = time.monotonic() + 600, None  # A hang guard only.
    while node is None:
      assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
      time.sleep(0.5)
      for index in (1, 2):
        for p in local.processes(index):
          try:
            if "--mode=train" in p.cmdline() and p.status() == psutil.STATUS_STOPPED:
              node = index
          except psutil.NoSuchProcess:
            pass
    local.kill_node(node)
    output, _ = process.communicate(timeout=600)
  finally:
    if process.poll() is None:
      process.kill()
  return process.returncode, output, node


@pytest.mark.slow  # A three-node Ray cluster and two tiny arms, each losing its node (~1-2 min).
def test_a_dead_nodes_arm_resumes_on_another_node_or_is_listed_failed(tfds_data_dir, sequential,
                                                                      tmp_path):
  # The head takes no task (no CPU), so the arm's node is a worker the test can kill; the
  # head checks its nodes every second, so a killed one is seen dead in seconds, not 15+.
  health = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
  local = LocalCluster(workers=2, cpus=1, head_cpus=0, env=health)
  try:
    # 1. The arm's node dies after checkpoint 3: the arm runs again on the other node,
    # resumes from checkpoint 3 there, and ends as the uninterrupted arm did.
    code, output, killed = _sweep_killing_its_node(
        local, "model.position=learned", str(tmp_path / "resumed"), tfds_data_dir,
        str(tmp_path / "frozen_once"))
    assert code == 0, output[-3000:]
    assert ("run 1/1 model.position=learned: its worker or node died (") in output, output[-3000:]
    assert ("; submitted again to the Ray cluster (retry 1 of 3), it resumes from checkpoint 3"
            in output), output[-3000:]
    workdir = tmp_path / "resumed" / "position=learned"
    with open(workdir / "log.txt", encoding="utf-8") as f:
      assert "Resumed from checkpoint 3 in" in f.read()
    # Step 4's row, written before the node died, is written once: the rows go on from 3.
    assert training_values(str(workdir)) == training_values(
        os.path.join(sequential, "position=learned"))
    assert [r["status"] for r in compare.sweep_runs(str(tmp_path / "resumed"))] == ["finished"]

    # 2. The other node, the last with a CPU, dies too: no node can take the arm, which
    # is listed as failed with the reason, its checkpoint kept for a rerun.
    code, output, last = _sweep_killing_its_node(
        local, "model.position=rope", str(tmp_path / "failed"), tfds_data_dir,
        str(tmp_path / "frozen_twice"))
    assert last != killed
    assert code == 1, output[-3000:]
    [run] = compare.sweep_runs(str(tmp_path / "failed"))
    assert run["status"] == "failed", run
    assert run["reason"].startswith("RuntimeError: the arm's Ray task "), run
    assert "no alive node of the Ray cluster has 1 CPU (1 node(s) alive)" in run["reason"], run
    assert "its last checkpoint (3) is kept: rerun the sweep to resume it" in run["reason"], run
    assert sweep.finished_step(str(tmp_path / "failed" / "position=rope")) == 3
  finally:
    local.stop()


@pytest.mark.slow  # A two-node Ray cluster (the module's) and a probe task on each node.
def test_a_node_without_the_runs_packages_or_checkout_stops_the_sweep_in_one_line(
    cluster, tmp_path, monkeypatch):
  """sweep_ray.slots checks every node before the first arm (what launch.py's sweep calls
  once the sweep folder exists): packages, the checkout's launch.py, the shared folder."""
  import ray  # pylint: disable=g-import-not-at-top
  from transformer.cli import sweep_ray  # pylint: disable=g-import-not-at-top  (imports Ray)
  # Connect to the loopback cluster as a launch.py would (on_ray.connect sets it before Ray).
  monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
  monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)  # pylint: disable=protected-access
  installed = sweep_ray.TRAINING_MODULES
  try:
    monkeypatch.setattr(sweep_ray, "TRAINING_MODULES", installed + ("no_such_package_here",))
    with pytest.raises(ConfigError, match=r"^--ray_address: node 127.0.0.1 lacks the "
                       r"project's packages no_such_package_here: pip install -r "
                       r"requirements.txt on every node of the cluster$"):
      sweep_ray.slots(cluster.address, 1, 2, str(tmp_path), sweep.LAUNCH)
    monkeypatch.setattr(sweep_ray, "TRAINING_MODULES", installed)
    elsewhere = str(tmp_path / "elsewhere" / "launch.py")
    with pytest.raises(ConfigError, match=(
        f"^--ray_address: node 127.0.0.1 does not see the project's {elsewhere}: every node "
        "needs the project's checkout and the sweep folder at the same path")):
      sweep_ray.slots(cluster.address, 1, 2, str(tmp_path), elsewhere)
    assert [s.where for s in sweep_ray.slots(cluster.address, 1, 2, str(tmp_path),
                                             sweep.LAUNCH)] == ["the Ray cluster (1 CPU)"] * 2
  finally:
    ray.shutdown()
  assert not os.listdir(tmp_path)  # The probes' markers removed.
