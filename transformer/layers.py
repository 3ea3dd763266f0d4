"""The building blocks every topology shares: norm, MLP, positions and the Block.

Shape legend as in attention.py: B batch, L length, E embed, F mlp hidden.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.attention import MultiHeadAttention
from transformer.configuration import ModelConfig

ACTIVATION_FNS = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's GELU.
    "silu": jax.nn.silu,
    "swiglu": jax.nn.silu,  # Gated: silu(x W) * (x V).
    "geglu": lambda x: jax.nn.gelu(x, approximate=False),  # Gated: gelu(x W) * (x V).
}


def activation_constraint(x_BLE: jax.Array) -> jax.Array:
  """Pins the residual stream's layout at block boundaries (batch over data/fsdp)."""
  return nn.with_logical_constraint(x_BLE, ("batch", "length", None))


def make_norm(config: ModelConfig, name: str) -> nn.Module:
  """LayerNorm or RMSNorm over the embed axis, computed in float32."""
  scale_init = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
  if config.norm_type == "rmsnorm":
    return nn.RMSNorm(epsilon=config.norm_epsilon, dtype=jnp.float32,
                      param_dtype=config.param_dtype, scale_init=scale_init, name=name)
  return nn.LayerNorm(
      epsilon=config.norm_epsilon, use_bias=config.use_bias, dtype=jnp.float32,
      param_dtype=config.param_dtype, scale_init=scale_init, name=name,
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
  """The paper's PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...)."""
  positions = np.arange(max_len)[:, None]
  div = np.power(10000.0, np.arange(0, d_model, 2) / d_model)
  table = np.zeros((max_len, d_model), dtype=np.float32)
  table[:, 0::2] = np.sin(positions / div)
  table[:, 1::2] = np.cos(positions / div)[:, : d_model // 2]
  return table


def _dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str,
           stddev: float = 0.02) -> nn.Dense:
  return nn.Dense(
      features, use_bias=config.use_bias, dtype=config.dtype, param_dtype=config.param_dtype,
      name=name,
      kernel_init=nn.with_logical_partitioning(nn.initializers.normal(stddev), axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]))


class MLP(nn.Module):
  """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi x) * wi_gate x) when gated."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BLE: jax.Array) -> jax.Array:
    cfg = self.config
    h_BLF = ACTIVATION_FNS[cfg.activation](_dense(cfg, cfg.mlp_dim, ("embed", "mlp"), "wi")(x_BLE))
    if cfg.activation in ("swiglu", "geglu"):
      h_BLF = h_BLF * _dense(cfg, cfg.mlp_dim, ("embed", "mlp"), "wi_gate")(x_BLE)
    h_BLF = nn.Dropout(cfg.mlp_dropout, deterministic=cfg.deterministic)(h_BLF)
    # GPT-2 scales the init of projections into the residual stream by 1/sqrt(2 * layers).
    residual_std = 0.02 / math.sqrt(2 * cfg.num_layers)
    return _dense(cfg, cfg.d_model, ("mlp", "embed"), "wo", residual_std)(h_BLF)


class Block(nn.Module):
  """One Transformer block: self-attention (+ cross-attention) + MLP, pre- or post-norm.

  The same block serves every topology: `causal` picks decoder self-attention,
  `cross_attention` adds the encoder-decoder sublayer.
  """

  config: ModelConfig
  causal: bool
  cross_attention: bool = False

  @nn.compact
  def __call__(self, x_BLE: jax.Array, self_mask_B1LL: jax.Array,
               encoded_BSE: jax.Array | None = None,
               cross_mask_B1LS: jax.Array | None = None) -> jax.Array:
    cfg = self.config
    sublayers = [("self_attention", lambda h: MultiHeadAttention(cfg, name="self_attention")(
        h, h, self_mask_B1LL))]
    if self.cross_attention:
      sublayers.append(("cross_attention", lambda h: MultiHeadAttention(
          cfg, name="cross_attention")(h, encoded_BSE, cross_mask_B1LS)))
    sublayers.append(("mlp", lambda h: MLP(cfg, name="mlp")(h)))

    for name, sublayer in sublayers:
      norm = make_norm(cfg, f"{name}_norm")
      if cfg.norm == "pre":
        y = sublayer(norm(x_BLE).astype(cfg.dtype))
        x_BLE = x_BLE + nn.Dropout(cfg.residual_dropout, deterministic=cfg.deterministic)(y)
      else:  # The paper's post-norm: LayerNorm(x + Sublayer(x)).
        y = sublayer(x_BLE)
        x_BLE = norm(x_BLE + nn.Dropout(cfg.residual_dropout,
                                        deterministic=cfg.deterministic)(y)).astype(cfg.dtype)
    return activation_constraint(x_BLE)
