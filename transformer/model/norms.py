"""The norms every module shares: LayerNorm, RMSNorm and Gemma's (1 + scale) RMSNorm,
and where a block puts them (pre, post or sandwich).

A module of its own so that attention (QK-norm) and the blocks both use it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.config.model import ModelConfig


class OffsetRMSNorm(nn.Module):
  """RMSNorm that multiplies by (1 + scale), scale initialised at zero (Gemma), in float32.

  The same `scale` parameter path as nn.RMSNorm; only its meaning is shifted by one,
  which is how Gemma checkpoints store it.
  """

  epsilon: float
  param_dtype: jnp.dtype
  axis_name: str = "embed"  # The logical axis of the normalised (last) dimension.

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.zeros,
                                                             (self.axis_name,)),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
                                 + self.epsilon)
    scale = scale.astype(jnp.float32).reshape((1,) * (x.ndim - 1) + scale.shape)
    return normed * (1.0 + scale)


def _layernorm(config: ModelConfig, name: str, axis_name: str) -> nn.Module:
  scale_init = nn.with_logical_partitioning(nn.initializers.ones, (axis_name,))
  return nn.LayerNorm(
      epsilon=config.norm_epsilon, use_bias=config.use_bias, dtype=jnp.float32,
      param_dtype=config.param_dtype, scale_init=scale_init, name=name,
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axis_name,)))


def _rmsnorm(config: ModelConfig, name: str, axis_name: str) -> nn.Module:
  if config.norm_scale_plus_one:
    return OffsetRMSNorm(epsilon=config.norm_epsilon, param_dtype=config.param_dtype,
                         axis_name=axis_name, name=name)
  scale_init = nn.with_logical_partitioning(nn.initializers.ones, (axis_name,))
  return nn.RMSNorm(epsilon=config.norm_epsilon, dtype=jnp.float32,
                    param_dtype=config.param_dtype, scale_init=scale_init, name=name)


# model.norm_type -> its module; the names config/model.py's NORM_TYPES validates
# (tests/test_config_registries.py holds them equal).
NORM_TYPES = {"layernorm": _layernorm, "rmsnorm": _rmsnorm}


def make_norm(config: ModelConfig, name: str, axis_name: str = "embed") -> nn.Module:
  """LayerNorm or RMSNorm over the last axis (logical `axis_name`), computed in float32."""
  return NORM_TYPES[config.norm_type](config, name, axis_name)


# A block's sublayer (attention or MLP: normed input -> output) and its residual dropout
# (a new Dropout per call: the blocks' rng streams hang on their auto-names).
Sublayer = Callable[[jax.Array], jax.Array]
MakeDropout = Callable[[], nn.Module]


def _pre_norm(config: ModelConfig, name: str, sublayer: Sublayer, x_BLE: jax.Array,
              dropout: MakeDropout) -> jax.Array:
  """GPT-2's pre-norm: x + Sublayer(Norm(x))."""
  y = sublayer(make_norm(config, f"{name}_norm")(x_BLE).astype(config.dtype))
  return x_BLE + dropout()(y)


def _post_norm(config: ModelConfig, name: str, sublayer: Sublayer, x_BLE: jax.Array,
               dropout: MakeDropout) -> jax.Array:
  """The paper's post-norm: Norm(x + Sublayer(x))."""
  y = sublayer(x_BLE)
  return make_norm(config, f"{name}_norm")(x_BLE + dropout()(y)).astype(config.dtype)


def _sandwich_norm(config: ModelConfig, name: str, sublayer: Sublayer, x_BLE: jax.Array,
                   dropout: MakeDropout) -> jax.Array:
  """Gemma 2/3: x + PostNorm(Sublayer(Norm(x))), the sublayer's output normed too."""
  y = sublayer(make_norm(config, f"{name}_norm")(x_BLE).astype(config.dtype))
  y = make_norm(config, f"{name}_post_norm")(y).astype(config.dtype)
  return x_BLE + dropout()(y)


@dataclasses.dataclass(frozen=True)
class NormPlacement:
  """One `model.norm` value: where a block's norms sit around each sublayer.

  Attributes:
    residual: (config, sublayer name, sublayer, x_BLE, dropout) -> x_BLE after the
      sublayer's residual add, with the norms (`<name>_norm`, `<name>_post_norm`) it
      creates; call inside the block's compact method.
    ends_in_norm: each block's output is already normed, so a stack has no final norm.
  """

  residual: Callable[[ModelConfig, str, Sublayer, jax.Array, MakeDropout], jax.Array]
  ends_in_norm: bool = False


# model.norm -> its placement; the names config/model.py's NORMS validates
# (tests/test_config_registries.py holds them equal).
NORM_PLACEMENTS = {
    "pre": NormPlacement(_pre_norm),
    "post": NormPlacement(_post_norm, ends_in_norm=True),
    "sandwich": NormPlacement(_sandwich_norm),
}
