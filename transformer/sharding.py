"""The device mesh and the logical-axis rules that map weights and batches onto it.

Every weight names its axes logically ("embed", "heads", ...); `config.mesh.rules`
maps those names to mesh axes ("data", "fsdp", "tensor"). Changing parallelism is a
config change, never a code change.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer.configuration import ConfigError

Rules = Sequence[tuple[str, Any]]


def mesh_shape(shape: Sequence[tuple[str, int]], num_devices: int) -> dict[str, int]:
  """Fills the one -1 in `shape` from the device count and checks the product."""
  sizes = dict(shape)
  fixed = int(np.prod([s for s in sizes.values() if s != -1]))
  for name, size in sizes.items():
    if size == -1:
      if num_devices % fixed:
        raise ConfigError(f"config.mesh.shape={tuple(shape)} is invalid: the fixed axes "
                          f"multiply to {fixed}, which does not divide {num_devices} devices")
      sizes[name] = num_devices // fixed
  if int(np.prod(list(sizes.values()))) != num_devices:
    raise ConfigError(f"config.mesh.shape={tuple(shape)} is invalid: it has "
                      f"{int(np.prod(list(sizes.values())))} slots for {num_devices} devices")
  return sizes


def make_mesh(mesh_config: ml_collections.ConfigDict,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the (data, fsdp, tensor) mesh from `config.mesh.shape`."""
  devices = jax.devices() if devices is None else devices
  sizes = mesh_shape(mesh_config.shape, len(devices))
  names = tuple(name for name, _ in mesh_config.shape)
  array = np.asarray(devices).reshape([sizes[n] for n in names])
  return Mesh(array, names)


def rules_of(mesh_config: ml_collections.ConfigDict) -> tuple[tuple[str, Any], ...]:
  """The logical rules as hashable tuples (lists from a CLI override become tuples)."""
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in mesh_config.rules)


def logical_to_shardings(logical_specs: Any, mesh: Mesh, rules: Rules) -> Any:
  """Maps a pytree of logical PartitionSpecs to NamedShardings on `mesh`."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """Sharding of a [batch, length] input array."""
  spec = nn.logical_to_mesh_axes(("batch", "length"), rules)
  return NamedSharding(mesh, spec)


def data_parallel_size(mesh: Mesh, rules: Rules) -> int:
  """How many ways the batch axis is split."""
  spec = batch_sharding(mesh, rules).spec[0]
  axes = spec if isinstance(spec, tuple) else (spec,) if spec else ()
  return int(np.prod([mesh.shape[a] for a in axes]))


def replicated(mesh: Mesh) -> NamedSharding:
  """Fully replicated sharding on `mesh`."""
  return NamedSharding(mesh, PartitionSpec())
