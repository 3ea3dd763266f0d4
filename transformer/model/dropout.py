"""Dropout whose random bits come from the hardware generator on accelerators.

The same arithmetic as `flax.linen.Dropout` (and the same class name, so the auto-names
`Dropout_0`, ... and the rng streams they fold in are unchanged). On CPUs the mask is
drawn from the module's threefry key as flax draws it, so CPU runs keep their numbers.
On one GPU or TPU threefry costs a counter-mode hash per element, with large u32
buffers in the step; there the module's key seeds XLA's RngBitGenerator
("unsafe_rbg": the hardware's own generator, not splittable like threefry, which
dropout never needs) and draws the mask from it. On a mesh of several devices the
mask stays threefry's: XLA's SPMD partitioner cannot split RngBitGenerator and runs
it whole on every device (transformer_base on 32 v5p chips, 1 row a chip: u32 bits
for all 32 rows on each, 1.06 -> 1.48 GiB a chip, 3.25 -> 4.64 ms estimated), while
partitionable threefry (jax's default) draws only each device's own elements. (On 8
H100s the compiled steps of the four presets with dropout need the same memory either
way, the estimates within 2%: threefry there costs little.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from transformer import accelerator


def hardware_key(key: jax.Array) -> jax.Array:
  """An "unsafe_rbg" key seeded from a threefry `key` (one 4-word threefry draw)."""
  return jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl="unsafe_rbg")


def use_hardware_bits() -> bool:
  """Whether the mask being traced comes from the hardware generator: on a GPU or TPU,
  and only when the step runs on one device (see the module doc)."""
  mesh = jax.sharding.get_abstract_mesh()
  return accelerator.platform_of_mesh() != "cpu" and (mesh.empty or mesh.size == 1)


class Dropout(nn.Module):
  """flax.linen.Dropout's inputs * mask / keep_prob; the mask's bits by platform."""

  rate: float
  deterministic: bool | None = None

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    if self.rate == 0.0 or self.deterministic:
      return inputs
    if self.rate == 1.0:  # As flax: no NaN gradients at the edge.
      return jnp.zeros_like(inputs)
    keep_prob = 1.0 - self.rate
    key = self.make_rng("dropout")
    if use_hardware_bits():
      key = hardware_key(key)
    mask = jax.random.bernoulli(key, p=keep_prob, shape=inputs.shape)
    return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))
