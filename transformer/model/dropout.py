"""Dropout whose mask, off the CPU, is a hash of each element's index: never written to
HBM, drawn again in the backward pass.

The same arithmetic as `flax.linen.Dropout` (and the same class name, so the auto-names
`Dropout_0`, ... and the rng streams they fold in are unchanged). On CPUs the mask is
drawn from the module's threefry key as flax draws it, so CPU runs keep their numbers.

On a GPU or TPU a generated mask is a buffer the size of the activation: XLA's
RngBitGenerator (the hardware's generator) runs as a kernel of its own and writes it,
and the backward pass reads it back (gpt_small 32 x 1024 on an H100, compiled without a
device: 25 masks, 4.4 GB of the step's HBM traffic). Here each element's keep bit is
instead a 32-bit hash (Wellons' triple32, applied twice) of its row and column index
under a per-call seed drawn from the module's key: elementwise arithmetic that XLA fuses
into the kernel that consumes the mask, and that the backward pass (a custom VJP whose
only residual is the seed) recomputes where it needs it. The mask depends on the global
index only, so every mesh partition of the activation draws the same mask (threefry's
partitionable mode has the same property; RngBitGenerator had to run whole on every
device of a mesh). The keep probability is exact to 2^-32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from transformer import accelerator

# Wellons' triple32 constants: a bijective 32-bit integer hash (xorshift-multiply).
_TRIPLE32 = ((17, 0xED5AD4BB), (11, 0xAC4C1B51), (15, 0x31848BAB))
_GOLDEN = 0x9E3779B9  # 2^32 / phi: spreads consecutive column indices.


def _mix(h: jax.Array) -> jax.Array:
  for shift, multiplier in _TRIPLE32:
    h = (h ^ (h >> shift)) * jnp.uint32(multiplier)
  return h ^ (h >> 14)


def keep_mask(seed: jax.Array, shape: tuple[int, ...], keep_prob: float) -> jax.Array:
  """Bool `shape`: True where an element is kept, with probability `keep_prob`, from
  uint32[2] `seed` and the element's index (rows: the leading axes, flattened; columns:
  the last axis)."""
  row = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in range(len(shape) - 2, -1, -1):
    row = row + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
    stride = (stride * shape[axis]) % (1 << 32)
  column = lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1)
  h = _mix(row ^ seed[0])
  h = _mix(h ^ (column * jnp.uint32(_GOLDEN) + seed[1]))
  threshold = min(int(round(keep_prob * (1 << 32))), (1 << 32) - 1)
  return h < jnp.uint32(threshold)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def hashed_dropout(inputs: jax.Array, seed: jax.Array, rate: float) -> jax.Array:
  """inputs * keep_mask / (1 - rate), the mask recomputed (never saved) for the gradient."""
  keep_prob = 1.0 - rate
  return lax.select(keep_mask(seed, inputs.shape, keep_prob), inputs / keep_prob,
                    jnp.zeros_like(inputs))


def _forward(inputs, seed, rate):
  return hashed_dropout(inputs, seed, rate), seed


def _backward(rate, seed, g):
  keep_prob = 1.0 - rate
  # Behind a barrier the backward's mask is a computation of its own, made where it is
  # read: without it XLA may share the forward's (the same hash of the same seed), which
  # it then writes to HBM as a boolean array and reads back (gpt_small 32 x 1024 on an
  # H100: 96.70 -> 95.82 GB a step).
  seed = lax.optimization_barrier(seed)
  return (lax.select(keep_mask(seed, g.shape, keep_prob), g / keep_prob, jnp.zeros_like(g)),
          None)


hashed_dropout.defvjp(_forward, _backward)


def hashed_bits() -> bool:
  """Whether the mask being traced is the index hash (off the CPU) rather than flax's
  threefry draw (CPU devices: their runs keep flax's numbers)."""
  return accelerator.platform_of_mesh() != "cpu"


def drop(inputs: jax.Array, key: jax.Array, rate: float) -> jax.Array:
  """inputs * mask / (1 - rate) with the mask by platform (module doc): the one dropout
  of the package (the Dropout module's, and the einsum attention's on its weights)."""
  if hashed_bits():
    return hashed_dropout(inputs, jax.random.bits(key, (2,), jnp.uint32), float(rate))
  keep_prob = 1.0 - rate
  mask = jax.random.bernoulli(key, p=keep_prob, shape=inputs.shape)
  return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))


class Dropout(nn.Module):
  """flax.linen.Dropout's inputs * mask / keep_prob; the mask by platform (module doc)."""

  rate: float
  deterministic: bool | None = None

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    if self.rate == 0.0 or self.deterministic:
      return inputs
    if self.rate == 1.0:  # As flax: no NaN gradients at the edge.
      return jnp.zeros_like(inputs)
    return drop(inputs, self.make_rng("dropout"), self.rate)
