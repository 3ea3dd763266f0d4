"""How a checkpoint writes replicated arrays (checkpointing.MIN_REPLICA_SLICE_BYTES).

Orbax's replica-parallel saving has each replica write one slice of a replicated array,
one device-side slicing op per slice; below the threshold one replica writes the array
whole. Counted here through Orbax's ReplicaSlice.data, the call that slices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint._src.serialization import replica_slices

from transformer.workdir import checkpointing


def _sliced_saves(monkeypatch, state, directory) -> int:
  """Saves `state` with a Checkpointer-configured Orbax; returns how many slices were cut."""
  cut = []
  data = replica_slices.ReplicaSlice.data

  def counting(self):
    if self.slice_args is not None:
      cut.append(self.index)
    return data(self)

  monkeypatch.setattr(replica_slices.ReplicaSlice, "data", counting)
  manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=True))
  manager.save(1, args=ocp.args.StandardSave(state))
  manager.wait_until_finished()
  restored = manager.restore(1, args=ocp.args.StandardRestore(state))
  manager.close()
  for name, value in state.items():
    np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(value))
  # Orbax's default handler keeps each array's metadata beside it; so does this one.
  assert (directory / "1" / "default" / "array_metadatas").is_dir()
  return len(cut)


def test_small_replicated_arrays_are_written_whole_and_large_ones_in_slices(monkeypatch,
                                                                          tmp_path):
  devices = jax.devices()
  assert len(devices) == 8
  mesh = jax.sharding.Mesh(np.array(devices), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  # 64 KiB (8 KiB a slice) and 8 MiB (1 MiB a slice, the threshold) arrays on 8 devices.
  small = {f"bias{i}": jax.device_put(jnp.full((128, 128), i, jnp.float32), replicated)
           for i in range(3)}
  size = checkpointing.MIN_REPLICA_SLICE_BYTES * len(devices) // 4
  large = {"kernel": jax.device_put(jnp.arange(size, dtype=jnp.float32).reshape(-1, 1024),
                                    replicated)}
  assert _sliced_saves(monkeypatch, small, tmp_path / "small") == 0
  assert _sliced_saves(monkeypatch, large, tmp_path / "large") == len(devices)
