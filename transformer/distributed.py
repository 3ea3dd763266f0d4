"""Starting JAX's multi-controller runtime, the barriers the run needs, and the check
that its processes agree.

One process per host (TPU VMs, GPU nodes) or per GPU; all run the same command.
On TPU pods, SLURM and Open MPI JAX finds its peers by itself (`--distributed`);
elsewhere pass the coordinator address, the process count and this process's id.

`agree` is how the processes of one run find out that they were not started alike
(another --config.seed on one host, another data file behind the same path): each
process's records (the command, the resolved config, the data and tokenizer identity,
the checkpoint read) are hashed and exchanged, and when the hashes differ the records
themselves, so that every process stops with the same line naming the first key that
differs and the process it differs on. PER_PROCESS_KEYS is the one table of keys that
may differ.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import traceback
from typing import Any, Mapping, Sequence

import jax
import numpy as np
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


# Keys whose values may differ between the processes of one run, and why; every other
# key of what `agree` exchanges must be equal on every process.
PER_PROCESS_KEYS = {
    "--process_id": "each process's own index, 0..num_processes-1",
    "data.prepare_workers": "--mode=prepare's worker processes, sized to each host's "
                            "cores; no other mode reads it",
}
_ABSENT = object()  # A key one process's record lacks.


def _shown(value: Any) -> str:
  return "absent" if value is _ABSENT else json.dumps(value, sort_keys=True, default=str)


def first_difference(records: Sequence[Mapping[str, Mapping[str, Any]]]) -> str | None:
  """The line saying where the processes' records differ, or None when they agree.

  Args:
    records: process i's records at index i: {what: {key: JSON value}}, e.g.
      {"config": {"seed": 1, ...}, "data": {...}}; keys in PER_PROCESS_KEYS are skipped.

  Returns:
    "config differs between processes: seed is 1 on process 0 and 2 on process 1",
    naming the first section and key (in sorted order) that differs, the first process
    that differs from process 0, and how many other keys differ.
  """
  for what in sorted(set().union(*records)):
    sections = [record.get(what, {}) for record in records]
    keys = sorted(k for k in set().union(*sections) if k not in PER_PROCESS_KEYS)
    differing = [k for k in keys
                 if len({_shown(s.get(k, _ABSENT)) for s in sections}) > 1]
    if not differing:
      continue
    key = differing[0]
    values = [_shown(s.get(key, _ABSENT)) for s in sections]
    other = next(i for i, value in enumerate(values) if value != values[0])
    more = (f" ({len(differing) - 1} other key(s) differ too: "
            f"{', '.join(differing[1:4])}{', ...' if len(differing) > 4 else ''})"
            if len(differing) > 1 else "")
    return (f"{what} differs between processes: {key} is {values[0]} on process 0 and "
            f"{values[other]} on process {other}{more}; every process of a run must be "
            "started with the same command and read the same files")
  return None


def _allgather_bytes(payload: bytes) -> list[bytes]:
  """Every process's `payload`, in process order (a collective: all must call it)."""
  size = np.array([len(payload)], np.int32)
  sizes = np.asarray(multihost_utils.process_allgather(size)).reshape(-1)
  buffer = np.zeros([int(sizes.max())], np.uint8)
  buffer[:len(payload)] = np.frombuffer(payload, np.uint8)
  gathered = np.asarray(multihost_utils.process_allgather(buffer))
  return [gathered[i, :int(n)].tobytes() for i, n in enumerate(sizes)]


def _exchange(payload: bytes) -> list[bytes] | None:
  """Every process's `payload`, or None when all equal this one (then only their sha256
  digests travelled)."""
  if len(set(_allgather_bytes(hashlib.sha256(payload).digest()))) == 1:
    return None
  return _allgather_bytes(payload)


def agree(records: Mapping[str, Mapping[str, Any]], error: type[Exception]) -> None:
  """Stops every process in one line unless all hold the same `records` (a collective).

  A no-op with one process. Otherwise the sha256 of this process's records (keys in
  PER_PROCESS_KEYS left out) is exchanged; only when they differ are the records
  themselves, to name the key (`first_difference`).

  Args:
    records: {what: {key: JSON value}}: "config" (the resolved config, one key per
      line), "data" (the data and tokenizer identity), ...
    error: the exception to raise (config.errors.ConfigError); it is raised on every
      process at once, so `fail_together` lets it end each process as in a single
      process run (one line, no traceback).
  """
  if jax.process_count() == 1:
    return
  kept = {what: {k: v for k, v in section.items() if k not in PER_PROCESS_KEYS}
          for what, section in records.items()}
  gathered = _exchange(json.dumps(kept, sort_keys=True, default=str).encode())
  if gathered is None:
    return
  problem = error(first_difference([json.loads(p) for p in gathered])
                  or "the processes' records differ")
  problem.every_process = True  # fail_together: every process raised it, none waits.
  raise problem


@contextlib.contextmanager
def fail_together():
  """Makes an error in one process end every process of the run, instead of a hang.

  A clean exit would tell the coordinator this process left on purpose, while its
  peers wait forever in the next collective. So a process that fails prints its own
  error and exits at once, without the clean shutdown: the coordinator then misses
  its heartbeats and stops every other process with an error. An error every process
  raised at the same point (`agree`'s) ends each one as a single process would: no
  peer is left waiting.
  """
  try:
    yield
  except BaseException as e:  # pylint: disable=broad-except
    if jax.process_count() == 1 or getattr(e, "every_process", False):
      raise
    sys.stderr.write(f"Process {jax.process_index()} of {jax.process_count()} failed:\n")
    traceback.print_exc()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)  # pylint: disable=protected-access
