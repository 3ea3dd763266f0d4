"""A real Ray cluster on this machine for the tests: a head and worker nodes on 127.0.0.1.

Each node is a `ray start --block` process of its own (the head with its own port and
temporary folder); `stop` ends them by process id (SIGTERM to each `ray start`, which
ends its node's processes, then SIGKILL to any process of theirs still alive). Never `ray
stop`: that would end every Ray cluster of this machine's user, other jobs' too.

Loopback only: Ray turns 127.0.0.1 into the machine's outward IP (and then listens on
every interface) unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which also refuses a second
node; `_LAUNCHER` keeps 127.0.0.1 (services.resolve_ip_for_localhost) and allows the second
node, so every port of the cluster is bound to 127.0.0.1 (a test checks it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil  # Installed with orbax-checkpoint and tensorflow-datasets.
import pytest

_LAUNCHER = """
import sys
from ray._private import ray_constants, services
services.resolve_ip_for_localhost = lambda host: host  # Keep 127.0.0.1: loopback only.
ray_constants.ENABLE_RAY_CLUSTER = True  # A second node on this machine (the check only).
from ray.scripts.scripts import main
sys.argv = ["ray"] + sys.argv[1:]
main()
"""
_READY = "Ray runtime started"
_SLOW_START = "timed out during startup"  # Ray's node.py: its raylet took over 30 s.


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class LocalCluster:
  """A head and `workers` more nodes, `cpus` CPUs each (the head `head_cpus` if given: 0
  keeps tasks off it, so that a test can kill the node a task runs on), bound to 127.0.0.1."""

  def __init__(self, workers: int = 1, cpus: int = 1, env: dict[str, str] | None = None,
               head_cpus: int | None = None):
    self.port = _free_port()
    self.address = f"127.0.0.1:{self.port}"
    # Short: Ray's unix sockets live under it (a socket path is at most 107 bytes).
    self.temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    self.env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    self._nodes: list[tuple[subprocess.Popen, str]] = []
    common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats", "--block"]
    try:
      self._start(["--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
                   "--include-dashboard=false",
                   f"--num-cpus={cpus if head_cpus is None else head_cpus}", *common])
      for _ in range(workers):
        self._start([f"--address={self.address}", f"--num-cpus={cpus}", *common])
    except BaseException:
      self.stop()
      raise

  def _start(self, args: list[str], timeout: float = 120.0, attempts: int = 3) -> None:
    """Starts one node; again (up to `attempts` in all) when its raylet did not register
    within Ray's fixed 30 s, as happens on a machine loaded far beyond its cores."""
    for attempt in range(attempts):
      try:
        return self._start_once(args, timeout, attempt)
      except RuntimeError as e:
        if (_SLOW_START not in str(e) or attempt == attempts - 1
            or self._nodes[-1][0].poll() is None):
          raise
        self._nodes.pop()  # Its `ray start` has exited, and so have the processes it started.

  def _start_once(self, args: list[str], timeout: float, attempt: int) -> None:
    log = os.path.join(self.temp_dir, f"node{len(self._nodes)}-{attempt}.log")
    with open(log, "w", encoding="utf-8") as out:
      process = subprocess.Popen([sys.executable, "-c", _LAUNCHER, "start", *args],
                                 stdout=out, stderr=subprocess.STDOUT, env=self.env)
    self._nodes.append((process, log))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      with open(log, encoding="utf-8", errors="replace") as f:
        if _READY in f.read():
          return
      if process.poll() is not None:
        break
      time.sleep(0.5)
    with open(log, encoding="utf-8", errors="replace") as f:
      raise RuntimeError(f"ray start {' '.join(args)} did not start:\n{f.read()[-3000:]}")

  def processes(self, node: int | None = None) -> list[psutil.Process]:
    """Every process of the cluster (the `ray start`s and what they started), or of node
    `node` only (0: the head, 1...: the workers in their order)."""
    found = []
    for index, (process, _) in enumerate(self._nodes):
      if node is not None and index != node:
        continue
      try:
        parent = psutil.Process(process.pid)
        found += [parent] + parent.children(recursive=True)
      except psutil.NoSuchProcess:
        pass
    return found

  def kill_node(self, node: int) -> None:
    """SIGKILLs every process of worker node `node` at once, as a machine lost: frozen
    first (SIGSTOP), so none of them reacts to another's death (a run's SIGTERM from its
    dead parent would save a checkpoint)."""
    assert node > 0, "the head: its death ends the cluster"
    processes = self.processes(node)
    for signum in (signal.SIGSTOP, signal.SIGKILL):
      for process in processes:
        try:
          process.send_signal(signum)
        except psutil.NoSuchProcess:
          pass
    self._nodes[node][0].wait(timeout=30)

  def listening(self) -> list[str]:
    """The addresses the cluster's processes listen on ('127.0.0.1:6379', ...)."""
    found = []
    for process in self.processes():
      try:
        connections = process.net_connections(kind="inet")
      except (psutil.NoSuchProcess, psutil.AccessDenied):
        continue
      found += [f"{c.laddr.ip}:{c.laddr.port}" for c in connections
                if c.status == psutil.CONN_LISTEN]
    return found

  def stop(self) -> None:
    """Ends every process of the cluster by its id (never `ray stop`)."""
    # psutil.Process remembers its process's start time: a pid reused meanwhile is not killed.
    processes = self.processes()
    for process, _ in reversed(self._nodes):
      if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    for process, _ in self._nodes:
      try:
        process.wait(timeout=30)
      except subprocess.TimeoutExpired:
        pass
    for process in processes:  # Whatever outlived its `ray start`.
      try:
        process.kill()
      except psutil.NoSuchProcess:
        pass
    self._nodes.clear()


@pytest.fixture(scope="module")
def cluster():
  """A head and one more node, one CPU each, on 127.0.0.1; stopped by process ids (a test
  module takes it with `from local_ray import cluster`)."""
  local = LocalCluster(workers=1, cpus=1)
  yield local
  local.stop()
