"""Starting JAX's multi-controller runtime, and the barriers the run needs.

One process per host (TPU VMs, GPU nodes) or per GPU; all run the same command.
On TPU pods, SLURM and Open MPI JAX finds its peers by itself (`--distributed`);
elsewhere pass the coordinator address, the process count and this process's id.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback

import jax
from absl import logging
from jax.experimental import multihost_utils


def initialize(*, auto: bool = False, coordinator_address: str | None = None,
               num_processes: int | None = None, process_id: int | None = None,
               heartbeat_timeout_seconds: int = 100,
               local_device_ids: list[int] | None = None) -> bool:
  """Calls `jax.distributed.initialize` when several processes are in play.

  Args:
    auto: let JAX detect the cluster (TPU pod slices, SLURM, Open MPI).
    coordinator_address: "host:port" of process 0 (explicit CPU/GPU clusters).
    num_processes: total number of processes (with coordinator_address).
    process_id: this process, 0..num_processes-1 (with coordinator_address).
    heartbeat_timeout_seconds: after this long without a heartbeat from a peer, every
      process stops with an error instead of waiting forever on a dead peer.
    local_device_ids: the devices of this host this process uses (one GPU per process,
      accelerator.local_device_ids); None: all of them.

  Returns:
    Whether the distributed runtime was started.

  Raises:
    ValueError: if the explicit arguments are incomplete.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if coordinator_address is None and not auto:
    if num_processes is not None or process_id is not None:
      raise ValueError("--num_processes/--process_id need --coordinator_address=HOST:PORT")
    return False
  if coordinator_address is not None and None in explicit:
    raise ValueError(f"--coordinator_address={coordinator_address!r} also needs "
                     f"--num_processes and --process_id (got {num_processes}, {process_id})")
  # CPU processes exchange collectives through gloo; harmless on GPU/TPU hosts.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=coordinator_address, num_processes=num_processes,
      process_id=process_id, heartbeat_timeout_seconds=heartbeat_timeout_seconds,
      local_device_ids=local_device_ids)
  logging.info("jax.distributed started: process %d of %d", jax.process_index(),
               jax.process_count())
  return True


def barrier(name: str) -> None:
  """Waits until every process reaches `name` (a no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def fail_together():
  """Makes an error in one process end every process of the run, instead of a hang.

  A clean exit would tell the coordinator this process left on purpose, while its
  peers wait forever in the next collective. So a process that fails prints its own
  error and exits at once, without the clean shutdown: the coordinator then misses
  its heartbeats and stops every other process with an error.
  """
  try:
    yield
  except BaseException:  # pylint: disable=broad-except
    if jax.process_count() == 1:
      raise
    sys.stderr.write(f"Process {jax.process_index()} of {jax.process_count()} failed:\n")
    traceback.print_exc()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)  # pylint: disable=protected-access
