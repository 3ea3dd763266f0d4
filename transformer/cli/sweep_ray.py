"""--mode=sweep --devices_per_run=K --ray_address=ADDRESS: each arm a Ray task on a cluster.

The connection (the address check, one line for no cluster or a bad address, the
project's code shipped with runtime_env py_modules) is --mode=prepare's
(data/corpus/on_ray.connect). Each arm is one task asking for its devices: num_gpus=K on
a cluster with GPUs (Ray sets the task's CUDA_VISIBLE_DEVICES), else num_cpus=K with K
simulated CPU devices; Ray starts as many at once as the nodes' resources allow. The
task runs the arm's own `launch.py --mode=train` command, so the project's checkout and
the sweep folder must be at the same paths on every node (a shared file system), as a
sweep on a pod needs; before the first arm a probe on each alive node checks that, and
the run's packages (on_ray.check_nodes: one line naming a node that fails).

A dead node never loses its arm: a task whose worker or node dies is submitted again
(RayRun, up to on_ray.MAX_RETRIES times, one line each), and the rerun resumes the arm
from its last checkpoint in its workdir, on any node with the arm's resources. While
an arm waits or runs, it checks every _POLL_SECONDS that some alive node could still take
it: when none can (the nodes with enough CPUs or GPUs all died), or after the last
retry, the task is cancelled and the arm recorded as failed with the reason; rerunning
the sweep resumes it. (Ray's own retries would leave such a task pending for ever.)
Ctrl-C (or SIGTERM): each signal the sweep gets is appended to a file beside the arm's
workdir in the shared sweep folder, and the task passes it to its run (the first: it
stops after its step and saves; a second aborts it); an arm not started yet does not start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from transformer.config.errors import ConfigError
from transformer.cli import sweep_devices
from transformer.data.corpus import on_ray
from transformer.workdir import checkpointing

# What a node needs installed to run an arm (requirements.txt's modules that training imports).
TRAINING_MODULES = ("jax", "flax", "optax", "orbax.checkpoint", "tensorflow_datasets", "grain",
                    "array_record", "ml_collections", "absl", "numpy", "sentencepiece",
                    "tensorboardX", "matplotlib")
_POLL_SECONDS = 2.0  # How often a waiting arm asks whether an alive node can still take it.


def slots(address: str, devices_per_run: int, arms: int,
          sweep_dir: str = "", launch: str = "") -> list[sweep_devices.Slot]:
  """Connects and returns one slot per arm, each asking Ray for the arm's resources.

  Args:
    address, devices_per_run: --ray_address, --devices_per_run.
    arms: how many slots.
    sweep_dir, launch: when given (the folder exists), every alive node is checked first
      (on_ray.check_nodes): the run's packages installed, the checkout's `launch` (its
      launch.py) and the sweep folder seen at the same paths.

  Raises:
    ConfigError: no cluster at `address` (on_ray.connect's line), a node that fails the
      check (one line naming it), or no node with K GPUs (on a GPU cluster) or K CPUs.
  """
  on_ray.connect(address)
  if sweep_dir:
    on_ray.check_nodes(os.path.dirname(launch), os.path.basename(launch), sweep_dir,
                       modules=TRAINING_MODULES, names=(
                           "the project's", "the sweep folder",
                           "the project's checkout and the sweep folder"))
  import ray  # pylint: disable=g-import-not-at-top
  nodes = [n for n in ray.nodes() if n["Alive"]]
  kind = "GPU" if any(n["Resources"].get("GPU", 0) for n in nodes) else "CPU"
  largest = max(int(n["Resources"].get(kind, 0)) for n in nodes)
  if devices_per_run > largest:
    raise ConfigError(f"--devices_per_run={devices_per_run}: no node of the Ray cluster at "
                      f"{address} has {devices_per_run} {kind}s (the largest has {largest}); "
                      f"at most {largest}")
  resources = ({"num_gpus": devices_per_run, "num_cpus": 1} if kind == "GPU"
               else {"num_cpus": devices_per_run})
  env = {} if kind == "GPU" else sweep_devices.cpu_env(devices_per_run)
  where = f"the Ray cluster ({devices_per_run} {kind}{'s' if devices_per_run > 1 else ''})"
  return [sweep_devices.Slot(where, env, resources) for _ in range(arms)]


def _signals(path: str) -> list[int]:
  """The signals the sweep has passed to an arm so far (one number a line in `path`)."""
  try:
    with open(path, encoding="utf-8") as f:
      return [int(line) for line in f if line.strip().isdigit()]
  except OSError:
    return []


def _arm(command: list[str], env: dict[str, str], signals: str) -> dict[str, Any]:
  """The Ray task: runs the arm's command on this node; its exit status and last lines.

  `signals`: a file in the shared sweep folder where the sweep appends each signal it
  passes on (Ctrl-C); each new one is sent to the run (the first: it stops after its step
  with a checkpoint; a second aborts it). Not ray.cancel: its KeyboardInterrupt
  (_thread.interrupt_main) never reached a task waiting for its run here.
  """
  import ray  # pylint: disable=g-import-not-at-top
  node = ray.util.get_node_ip_address()
  if not os.path.exists(command[1]):
    return {"code": 2, "node": node, "stderr": f"ConfigError: node {node} does not see "
            f"{command[1]}: every node needs the project's checkout and the sweep folder at "
            "the same paths (a shared file system)"}
  if _signals(signals):
    return {"code": 130, "node": node,
            "stderr": "KeyboardInterrupt: the sweep was stopped before this arm started"}
  stop_with_the_task = sweep_devices.stop_with_the_parent()

  def prepare_the_run() -> None:
    # Ray's worker blocks SIGINT, and a child inherits the mask: the run would never get
    # the Ctrl-C passed on below (it stayed pending while the run trained on).
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if stop_with_the_task is not None:
      stop_with_the_task()

  # The node's own interpreter; the root of the checkout, as on the driver. The run dies
  # with its task's worker, so a retry never finds it still holding the workdir.
  process = subprocess.Popen([sys.executable] + command[1:], cwd=os.path.dirname(command[1]),
                             preexec_fn=prepare_the_run,
                             env={**os.environ, **env}, stderr=subprocess.PIPE, text=True,
                             errors="replace")
  chunks: list[str] = []
  reader = threading.Thread(target=lambda: chunks.append(process.stderr.read()), daemon=True)
  reader.start()
  passed = 0
  while process.poll() is None:
    time.sleep(_POLL_SECONDS / 10)
    for signum in _signals(signals)[passed:]:
      process.send_signal(signum)
      passed += 1
  reader.join()
  return {"code": process.returncode, "node": node, "stderr": "".join(chunks)}


def _no_node_can_take(resources: dict[str, int]) -> str:
  """'' when an alive node of the cluster has `resources` (num_cpus, num_gpus) in all;
  else what is missing, in words."""
  import ray  # pylint: disable=g-import-not-at-top
  names = {"num_cpus": "CPU", "num_gpus": "GPU"}
  wanted = {names[key]: count for key, count in resources.items()}
  nodes = [n for n in ray.nodes() if n["Alive"]]
  if any(all(n["Resources"].get(kind, 0) >= count for kind, count in wanted.items())
         for n in nodes):
    return ""
  needs = " and ".join(f"{count} {kind}{'s' if count > 1 else ''}"
                       for kind, count in wanted.items())
  return f"no alive node of the Ray cluster has {needs} ({len(nodes)} node(s) alive)"


class RayRun:
  """An arm running as a Ray task, with the Popen methods the sweep uses; submitted
  again when its worker or node dies (see the module docstring)."""

  def __init__(self, command: list[str], slot: sweep_devices.Slot, label: str, workdir: str):
    import ray  # pylint: disable=g-import-not-at-top
    self._ray = ray
    # No Ray retries: wait() resubmits, so that it can say so and give up when no node can
    # take the arm.
    self._task = ray.remote(max_retries=0, retry_exceptions=False, **slot.ray)(_arm)
    # Beside the arm's workdir in the sweep folder, which every node shares (checked).
    self._signals = os.path.join(os.path.dirname(workdir), f".signals-{os.path.basename(workdir)}")
    if os.path.exists(self._signals):  # An earlier sweep's.
      os.remove(self._signals)
    self._args = (command, dict(slot.env), self._signals)
    self._resources, self._label, self._workdir = dict(slot.ray), label, workdir
    self._ref = self._task.remote(*self._args)
    self._cancelled = False
    self.returncode: int | None = None
    self.node = ""

  def poll(self) -> int | None:
    return self.returncode

  def send_signal(self, signum: int) -> None:
    """Passes `signum` to the arm's run through the signals file (see _arm)."""
    self._cancelled = True  # Not submitted again after this.
    with open(self._signals, "a", encoding="utf-8") as f:
      f.write(f"{int(signum)}\n")

  def _failed(self, reason: str) -> dict[str, Any]:
    step = checkpointing.newest_complete_step(self._workdir)
    kept = (f"its last checkpoint ({step}) is kept: rerun the sweep to resume it from there"
            if step is not None else "it has no checkpoint yet: rerun the sweep to start it")
    return {"code": -9, "node": "", "stderr": f"RuntimeError: {reason}; {kept}"}

  def wait(self) -> tuple[int, str]:
    """Waits for the task, submitting it again when it dies; (exit status, its stderr)
    (-9 with the reason when it died for good or no node could take it)."""
    ray, retries = self._ray, 0
    while True:
      ready, _ = ray.wait([self._ref], timeout=_POLL_SECONDS)
      if not ready:
        missing = _no_node_can_take(self._resources)
        if missing:
          ray.cancel(self._ref, force=True)
          answer = self._failed(f"the arm's Ray task cannot run: {missing}")
          break
        continue
      try:
        answer = ray.get(self._ref)
        break
      except ray.exceptions.TaskCancelledError:
        answer = {"code": 130, "node": "", "stderr": "KeyboardInterrupt: cancelled"}
        break
      except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
              ray.exceptions.ObjectLostError, ray.exceptions.OutOfMemoryError) as e:
        died = f"its worker or node died ({type(e).__name__})"
        missing = _no_node_can_take(self._resources)
        if self._cancelled or missing or retries == on_ray.MAX_RETRIES:
          answer = self._failed(f"the arm's Ray task died {retries + 1} time(s), {died}"
                                + (f", and {missing}" if missing else ""))
          break
        retries += 1
        step = checkpointing.newest_complete_step(self._workdir)
        print(f"{self._label}: {died}; submitted again to the Ray cluster (retry {retries} "
              f"of {on_ray.MAX_RETRIES}), it resumes from "
              + (f"checkpoint {step}" if step is not None else "the start (no checkpoint)"),
              flush=True)
        self._ref = self._task.remote(*self._args)
    if os.path.exists(self._signals):
      os.remove(self._signals)
    self.returncode, self.node = answer["code"], answer["node"]
    stderr = answer["stderr"]  # Relayed line by line: a message of ours ends its line too.
    return answer["code"], stderr if not stderr or stderr.endswith("\n") else stderr + "\n"
