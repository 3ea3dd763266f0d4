"""--mode=sweep --devices_per_run=K --ray_address=ADDRESS: each arm a Ray task on a cluster.

The connection (the address check, one line for no cluster or a bad address, the
project's code shipped with runtime_env py_modules) is --mode=prepare's
(data/corpus/on_ray.connect). Each arm is one task asking for its devices: num_gpus=K on
a cluster with GPUs (Ray sets the task's CUDA_VISIBLE_DEVICES), else num_cpus=K with K
simulated CPU devices; Ray starts as many at once as the nodes' resources allow. The
task runs the arm's own `launch.py --mode=train` command, so the project's checkout and
the sweep folder must be at the same paths on every node (a shared file system), as a
sweep on a pod needs. A task whose worker or node dies is run again by Ray (on_ray's
MAX_RETRIES): the rerun resumes the arm from its last checkpoint in its workdir; after
the last retry the arm is recorded as failed, naming the error. Ctrl-C cancels each
running task, which passes SIGINT to its run (it stops after its step and saves).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

from transformer.config.errors import ConfigError
from transformer.cli import sweep_devices
from transformer.data.corpus import on_ray


def slots(address: str, devices_per_run: int, arms: int) -> list[sweep_devices.Slot]:
  """Connects and returns one slot per arm, each asking Ray for the arm's resources.

  Raises:
    ConfigError: no cluster at `address` (on_ray.connect's line), or no node with K
      GPUs (on a GPU cluster) or K CPUs.
  """
  on_ray.connect(address)
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


def _arm(command: list[str], env: dict[str, str]) -> dict[str, Any]:
  """The Ray task: runs the arm's command on this node; its exit status and last lines."""
  import ray  # pylint: disable=g-import-not-at-top
  node = ray.util.get_node_ip_address()
  if not os.path.exists(command[1]):
    return {"code": 2, "node": node, "stderr": f"ConfigError: node {node} does not see "
            f"{command[1]}: every node needs the project's checkout and the sweep folder at "
            "the same paths (a shared file system)"}
  stop_with_the_task = sweep_devices.stop_with_the_parent()
  # The node's own interpreter; the root of the checkout, as on the driver. The run dies
  # with its task's worker, so a retry never finds it still holding the workdir.
  process = subprocess.Popen([sys.executable] + command[1:], cwd=os.path.dirname(command[1]),
                             preexec_fn=stop_with_the_task,
                             env={**os.environ, **env}, stderr=subprocess.PIPE, text=True,
                             errors="replace")
  try:
    _, stderr = process.communicate()
  except KeyboardInterrupt:  # ray.cancel: the run stops after its step and saves.
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate()
  return {"code": process.returncode, "node": node, "stderr": stderr}


class RayRun:
  """An arm running as a Ray task, with the Popen methods the sweep uses."""

  def __init__(self, command: list[str], slot: sweep_devices.Slot):
    import ray  # pylint: disable=g-import-not-at-top
    self._ray = ray
    task = ray.remote(max_retries=on_ray.MAX_RETRIES, retry_exceptions=False,
                      **slot.ray)(_arm)
    self._ref = task.remote(command, dict(slot.env))
    self.returncode: int | None = None
    self.node = ""

  def poll(self) -> int | None:
    return self.returncode

  def send_signal(self, signum: int) -> None:
    del signum
    self._ray.cancel(self._ref, force=False)  # KeyboardInterrupt in the task.

  def wait(self) -> tuple[int, str]:
    """Waits for the task; (exit status, its stderr) (-9 with the error when it died)."""
    ray = self._ray
    try:
      answer = ray.get(self._ref)
    except ray.exceptions.TaskCancelledError:
      answer = {"code": 130, "node": "", "stderr": "KeyboardInterrupt: cancelled"}
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
            ray.exceptions.ObjectLostError, ray.exceptions.OutOfMemoryError) as e:
      answer = {"code": -9, "node": "", "stderr": (
          f"RuntimeError: the arm's Ray task died {on_ray.MAX_RETRIES + 1} times (its worker "
          f"or node: {type(e).__name__}); rerun the sweep to resume it from its checkpoint")}
    self.returncode, self.node = answer["code"], answer["node"]
    return answer["code"], answer["stderr"]
