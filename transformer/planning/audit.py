"""The sharding audit: parameter and optimizer leaves left whole on every chip.

On a mesh with fsdp or tensor > 1 a leaf that no rule shards is stored in full on
every chip: usually a rule that names no mesh axis for one of its logical axes, or a
dimension the mesh cannot split. Scalars (Adam's step count) are not listed.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from transformer import sharding


@dataclasses.dataclass(frozen=True)
class ReplicatedLeaf:
  """One leaf stored whole on every chip."""

  path: str  # "params/block_0/mlp/wi/kernel", "opt_state/1/0/mu/...".
  shape: tuple[int, ...]
  nbytes: int  # Its full size, which each chip holds.


def replicated_leaves(abstract_state, mesh) -> list[ReplicatedLeaf]:
  """Params and optimizer leaves with no sharded dimension, when the mesh shards weights.

  Args:
    abstract_state: `Trainer.abstract_state` (ShapeDtypeStructs with shardings).
    mesh: the run's mesh.

  Returns:
    The replicated leaves, largest first; empty when fsdp and tensor are both 1 (then
    replication is the plan, not a mistake).
  """
  if mesh.shape.get("fsdp", 1) == 1 and mesh.shape.get("tensor", 1) == 1:
    return []
  found = []
  for part in ("params", "opt_state"):
    tree = getattr(abstract_state, part)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      if not leaf.shape:
        continue
      if tuple(leaf.sharding.shard_shape(leaf.shape)) == tuple(leaf.shape):
        nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
        found.append(ReplicatedLeaf(f"{part}/{sharding._path_name(path)}",  # pylint: disable=protected-access
                                    tuple(leaf.shape), nbytes))
  return sorted(found, key=lambda leaf: -leaf.nbytes)
