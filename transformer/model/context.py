"""Context parallelism: one sequence sharded over the mesh axes the "length" rule names.

With `mesh.shape` holding ("context", n) and the rule ("length", "context"), every
activation's length (the residual stream, q/k/v, the logits) is split into n shards;
the per-token layers (embedding, norms, MLP, heads) need nothing more than to keep the
length an axis of its own (`tokens_mergeable`), and attention
all-gathers the keys and values over the context axes inside a `jax.shard_map`
(attention_ops.context_attention): each shard keeps its own queries, sees every key,
and builds its mask from the keys' global segment ids and positions, so causality,
packed documents, sliding windows and grouped-query heads are what they are unsharded.

Causal load balance (the zig-zag order): cut the sequence into 2n chunks and give shard
i chunks i and 2n - 1 - i, so every shard holds as many early (cheap) as late (costly)
queries. `zigzag` applies this order to each stack's residual stream, segment ids and
positions at the top of the stack (models._stack); `unzigzag` undoes it on the stack's
output, so logits, losses, heads and cross-attention's source all see the natural order.
The masks read positions and segment ids, never array indices, so attention in the
permuted order is exactly attention in the natural one.

Shape letters as in the package legend (transformer/model/__init__.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn


def axes() -> tuple[str, ...]:
  """The mesh axes the current logical rules shard "length" over; () outside a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return ()
  spec = nn.logical_to_mesh_axes(("length",))[0]
  names = spec if isinstance(spec, tuple) else (spec,) if spec else ()
  return tuple(name for name in names if name in mesh.shape)


def size() -> int:
  """How many shards the sequence is cut into (1: no context parallelism)."""
  mesh = jax.sharding.get_abstract_mesh()
  return int(np.prod([mesh.shape[name] for name in axes()], dtype=np.int64))


def zigzag(x: jax.Array, shards: int) -> jax.Array:
  """Reorders axis 1 (the length) into the load-balanced order of `shards` shards.

  Chunks 0..2n-1 of length L / 2n become 0, 2n-1, 1, 2n-2, ..., n-1, n: shard i (the
  i-th contiguous block of 2 chunks) holds chunks i and 2n - 1 - i.
  """
  if shards == 1:
    return x
  B, L = x.shape[:2]
  rest = x.shape[2:]
  chunks = x.reshape((B, 2, shards, L // (2 * shards)) + rest)
  xp = np if isinstance(x, np.ndarray) else jnp  # numpy: a static order (splash's mask).
  early, late = chunks[:, 0], xp.flip(chunks[:, 1], axis=1)
  return xp.stack([early, late], axis=2).reshape(x.shape)


def unzigzag(x: jax.Array, shards: int) -> jax.Array:
  """The inverse of `zigzag`: the natural order back."""
  if shards == 1:
    return x
  B, L = x.shape[:2]
  rest = x.shape[2:]
  pairs = x.reshape((B, shards, 2, L // (2 * shards)) + rest)
  xp = np if isinstance(x, np.ndarray) else jnp
  early, late = pairs[:, :, 0], xp.flip(pairs[:, :, 1], axis=1)
  return xp.stack([early, late], axis=1).reshape(x.shape)


def tokens_mergeable() -> bool:
  """Whether a per-token layer may merge the batch and length axes into one, N = B * L.

  The merge makes the kernel's gradient one plain matmul (faster on XLA:CPU, see
  attention.EinsumDense), but with the length sharded over context axes and more than
  one row a shard, a shard's tokens are no contiguous block of the merged axis: XLA
  would then gather the whole sequence onto every shard and run the layer on all of it
  (the MLP of a 2-row, 2-shard step ran on twice its tokens).
  """
  return size() == 1


def operand_specs(batch: int):
  """The PartitionSpecs of attention's q [B, L, H, D] and k/v [B, S, K, D] on the current
  mesh, for a `jax.shard_map` over them: the logical rules' batch, length and head axes,
  with the batch entry dropped when `batch` rows do not split over it (model.init's one
  row, a small evaluation batch): the rows then stay whole on every device."""
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  q_spec = nn.logical_to_mesh_axes(("batch", "length", "heads", "head_dim"))
  kv_spec = nn.logical_to_mesh_axes(("batch", "length", "kv_heads", "head_dim"))
  mesh = jax.sharding.get_abstract_mesh()
  rows = q_spec[0]
  row_axes = rows if isinstance(rows, tuple) else (rows,) if rows else ()
  if batch % int(np.prod([mesh.shape[a] for a in row_axes], dtype=np.int64)):
    return P(None, *q_spec[1:]), P(None, *kv_spec[1:])
  return q_spec, kv_spec
