"""Attention dropout on a mesh of 8 simulated devices: every row and head its own mask.

With the sequence split over a context axis, each shard draws its queries' dropout
inside a shard_map from one key; that key must differ by every mesh axis that splits
the queries (rows over data/fsdp, heads over tensor, length over context), or the
shards draw the same mask (issue 39). The attention here reads the mask back: queries
and keys are zero (uniform probabilities over the 16 keys), the values one-hot in the
key index, so output [b, l, h, d] is nonzero exactly where key d was kept.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from configs import base
from transformer import sharding
from transformer.model import attention_ops as ops
from transformer.model import context

B, L, H = 4, 16, 4  # Rows, length (= keys = head dim), heads.


def _masks(shape: tuple) -> np.ndarray:
  """The kept [B, H, L, S] positions of attention dropout (rate 0.5) on mesh `shape`."""
  config = base.get_config()
  config.mesh.shape = shape
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:8])
  q = jnp.zeros((B, L, H, L), jnp.float32)
  v = jnp.broadcast_to(jnp.eye(L, dtype=jnp.float32)[None, :, None, :], (B, L, H, L))
  mask = jnp.ones((B, 1, L, L), bool)
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.rules_of(config.mesh, mesh)):
    assert context.size() == dict(shape).get("context", 1)
    out = jax.jit(lambda q, k, v, key: ops.dot_product_attention(
        q, k, v, impl="einsum", kind=ops.LayerKind(causal=False, dropout=True),
        mask_B1LS=mask, segments=None, dropout_rate=0.5, dropout_rng=key))(
            q, q, v, jax.random.PRNGKey(0))
  out = np.asarray(out)
  kept = out > 0
  np.testing.assert_allclose(out[kept], 2.0 / L, rtol=1e-6)  # Kept: scaled by 1 / 0.5.
  return kept.transpose(0, 2, 1, 3)  # [B, L, H, S] -> [B, H, L, S].


@pytest.mark.parametrize("shape", [
    (("data", 2), ("fsdp", 1), ("tensor", 2), ("context", 2)),
    (("data", 1), ("fsdp", 2), ("tensor", 2), ("context", 2)),
    (("data", 4), ("fsdp", 1), ("tensor", 1), ("context", 2)),
    (("data", 1), ("fsdp", 1), ("tensor", 4), ("context", 2)),
    (("data", 1), ("fsdp", 1), ("tensor", 1), ("context", 8)),
    (("data", 2), ("fsdp", 2), ("tensor", 2), ("context", 1)),  # No context: one draw.
], ids=lambda shape: "-".join(f"{name}{size}" for name, size in shape))
def test_every_row_head_and_length_shard_draws_its_own_mask(shape):
  kept = _masks(shape)
  assert 0.3 < kept.mean() < 0.7
  per_row_and_head = {kept[b, h].tobytes() for b in range(B) for h in range(H)}
  assert len(per_row_and_head) == B * H  # No two (row, head) share a mask.
  shards = dict(shape)["context"]
  blocks = kept.reshape(B, H, shards, L // shards, L)
  for b in range(B):
    for h in range(H):
      assert len({blocks[b, h, i].tobytes() for i in range(shards)}) == shards
