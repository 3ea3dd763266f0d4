"""workdir/lock.py: one writer per workdir, released on any exit, never stale."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from transformer.workdir import layout
from transformer.workdir import lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A process that holds the lock of argv[1], says so, then waits to be killed.
HOLDER = ("import sys, time\n"
          "from transformer.workdir import lock\n"
          "with lock.hold(sys.argv[1]):\n"
          "  print('held', flush=True)\n"
          "  time.sleep(600)\n")


def _start_holder(workdir: str) -> subprocess.Popen:
  process = subprocess.Popen([sys.executable, "-c", HOLDER, workdir], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert process.stdout.readline().strip() == "held"
  return process


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
  workdir = str(tmp_path / "run")
  holder = _start_holder(workdir)
  try:
    with pytest.raises(lock.WorkdirInUse,
                       match=rf"workdir {workdir} in use by PID {holder.pid} on "
                             rf"{socket.gethostname()} "):
      with lock.hold(workdir):
        pass
  finally:
    holder.kill()
    holder.wait()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
  workdir = str(tmp_path / "run")
  holder = _start_holder(workdir)
  holder.send_signal(signal.SIGKILL)  # No cleanup runs: the kernel releases the flock.
  holder.wait()
  assert os.path.exists(os.path.join(workdir, layout.LOCK))  # Its file stays ...
  with lock.hold(workdir):  # ... and is free.
    with open(os.path.join(workdir, layout.LOCK), encoding="utf-8") as f:
      assert f.read() == f"{os.getpid()} {socket.gethostname()}\n"


def test_released_when_the_block_ends_even_by_an_exception(tmp_path):
  workdir = str(tmp_path / "run")
  with pytest.raises(RuntimeError):
    with lock.hold(workdir):
      raise RuntimeError("the command failed")
  with lock.hold(workdir):
    pass
