"""Checkpoint save time: Orbax's default jax.Array handler against this project's.

transformer/workdir/checkpointing.py registers Orbax's ArrayHandler with
min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES, so a replicated array whose
per-replica slice would be smaller is written whole by one replica instead of sliced on
every device. This times `CheckpointManager.save` of a replicated state (--arrays arrays
of --shape float32 on the simulated CPU devices) with each handler, interleaved over
--rounds rounds in one process, and prints the medians and their ratio.

  python benchmarks/checkpoint_save.py                  # 8 simulated CPU devices
  python benchmarks/checkpoint_save.py --devices=8 --arrays=170 --shape=64,32 --rounds=6
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices")
  parser.add_argument("--arrays", type=int, default=170, help="arrays in the state")
  parser.add_argument("--shape", default="64,32", help="each array's shape")
  parser.add_argument("--rounds", type=int, default=6, help="saves per handler")
  args = parser.parse_args()
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from orbax.checkpoint._src.metadata import array_metadata_store  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from transformer.workdir import checkpointing  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.ERROR)  # Not Orbax's "overriding jax.Array" at every swap.

  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shape = tuple(int(n) for n in args.shape.split(","))
  state = {f"a{i}": jax.device_put(jnp.full(shape, i, jnp.float32), replicated)
           for i in range(args.arrays)}
  handlers = {
      "orbax default": ocp.type_handlers.ArrayHandler(
          array_metadata_store=array_metadata_store.Store()),
      "this project": ocp.type_handlers.get_type_handler(jax.Array),
  }
  times = {name: [] for name in handlers}
  with tempfile.TemporaryDirectory() as root:
    managers = {name: ocp.CheckpointManager(
        os.path.join(root, str(i)), options=ocp.CheckpointManagerOptions(max_to_keep=2,
                                                                         create=True))
                for i, name in enumerate(handlers)}
    for step in range(args.rounds + 1):  # Round 0 warms up (compiles the slicing ops).
      for name, handler in handlers.items():
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
        start = time.perf_counter()
        managers[name].save(step, args=ocp.args.StandardSave(state))
        elapsed = time.perf_counter() - start
        managers[name].wait_until_finished()
        if step:
          times[name].append(elapsed)
    for manager in managers.values():
      manager.close()
  print(f"{args.arrays} arrays of {shape} float32 replicated on {len(jax.devices())} devices, "
        f"MIN_REPLICA_SLICE_BYTES={checkpointing.MIN_REPLICA_SLICE_BYTES:,}; "
        f"CheckpointManager.save, median of {args.rounds}:")
  medians = {name: statistics.median(values) for name, values in times.items()}
  for name, value in medians.items():
    print(f"  {name:14s} {value:.3f} s   (each: {', '.join(f'{t:.3f}' for t in times[name])})")
  print(f"  ratio default / this project: {medians['orbax default'] / medians['this project']:.2f}x")


if __name__ == "__main__":
  main()
