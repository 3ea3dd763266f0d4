"""A real two-process JAX run on localhost: training, checkpoints, resume, failures."""

import json
import os
import socket
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess_worker.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_pair(tmp_path, data_dir, workdir, num_steps, tag, fail_at_batch=-1, timeout=240):
  """Starts processes 0 and 1 (2 CPU devices each) and waits for both."""
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  procs, outs = [], []
  for pid in range(2):
    out = str(tmp_path / f"{tag}_{pid}.json")
    outs.append(out)
    cmd = [sys.executable, WORKER, f"--process_id={pid}", f"--port={port}",
           f"--num_steps={num_steps}", f"--workdir={workdir}", f"--data_dir={data_dir}",
           f"--out={out}", f"--fail_at_batch={fail_at_batch if pid == 1 else -1}"]
    log = open(tmp_path / f"{tag}_{pid}.log", "w", encoding="utf-8")
    procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
  codes = []
  for proc, log in procs:
    try:
      codes.append(proc.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
      for p, _ in procs:
        p.kill()
      pytest.fail(f"{tag}: a process hung for {timeout} s (see {log.name})")
    log.close()
  logs = [open(tmp_path / f"{tag}_{pid}.log", encoding="utf-8").read() for pid in range(2)]
  seen = [json.load(open(o, encoding="utf-8")) if os.path.exists(o) else None for o in outs]
  return codes, logs, seen


def _train_losses(seen):
  return {m["step"]: m["loss"] for m in seen["metrics"] if "loss" in m}


@pytest.fixture(scope="module")
def prepared_data_dir(tmp_path_factory):
  """Built once in this process so the pair does not spend its time preparing data."""
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  from transformer.data import sources  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path_factory.mktemp("mp_tfds"))
  sources.load_sources(make_tiny_config(data_dir))
  return data_dir


def test_two_processes_train_checkpoint_and_resume(tmp_path, prepared_data_dir):
  workdir = str(tmp_path / "run")
  codes, logs, seen = _run_pair(tmp_path, prepared_data_dir, workdir, 4, "first")
  assert codes == [0, 0], logs
  # Every process sees the same global loss at every step.
  assert _train_losses(seen[0]) == _train_losses(seen[1])
  assert sorted(_train_losses(seen[0])) == [1, 2, 3, 4]
  # Each process read its own, disjoint slice of the data.
  rows = [{h for batch in s["rows"] for h in batch} for s in seen]
  assert rows[0] and rows[1] and not rows[0] & rows[1]
  # Orbax wrote one checkpoint, with each process's data-iterator position.
  data_files = sorted(os.listdir(os.path.join(workdir, "checkpoints", "4", "data")))
  assert {"process_0-of-2.json", "process_1-of-2.json"} <= set(data_files)
  # Only process 0 writes metrics.jsonl.
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    assert len([line for line in f if '"loss"' in line]) == 4

  codes, logs, seen = _run_pair(tmp_path, prepared_data_dir, workdir, 6, "resumed")
  assert codes == [0, 0], logs
  assert all("Resumed from checkpoint 4" in log for log in logs)
  assert sorted(_train_losses(seen[0])) == [5, 6]
  assert _train_losses(seen[0]) == _train_losses(seen[1])


def test_a_failing_process_ends_the_whole_run(tmp_path, prepared_data_dir):
  codes, logs, _ = _run_pair(tmp_path, prepared_data_dir, str(tmp_path / "run"), 6,
                             "fail", fail_at_batch=2, timeout=180)
  assert codes[1] != 0 and "injected failure in process 1" in logs[1]
  assert codes[0] != 0, logs[0]  # The healthy peer does not hang or pretend success.
