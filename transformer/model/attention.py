"""Multi-head attention and the one helper that builds every attention mask.

Shape letters as in the package legend (transformer/model/__init__.py); grouped-query
attention splits the H query heads into K groups of G = H / K, one per key/value head.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.config.model import ModelConfig
from transformer.model import initializers
from transformer.model import norms
from transformer.model import positions


def make_attention_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array, *,
                        causal: bool, q_positions: jax.Array | None = None,
                        kv_positions: jax.Array | None = None, window: int = 0) -> jax.Array:
  """Builds a boolean [B, 1, L, S] mask: True where a query may attend to a key.

  Segment ids are integers: 0 is padding, packed documents are 1, 2, ... A query
  attends only to keys of its own segment, so packed documents never see each
  other and real tokens never see padding. With `causal`, a query also sees only
  keys at positions <= its own (positions default to the array index). With a
  `window` > 0 (local attention) a query sees only keys less than `window` positions
  away: its own and the window - 1 before it when causal (Mistral, Gemma 2), either
  side otherwise.

  Args:
    q_segment_ids: [B, L] segment ids of the queries.
    kv_segment_ids: [B, S] segment ids of the keys.
    causal: whether to forbid attending to later positions.
    q_positions: optional [B, L] positions of the queries.
    kv_positions: optional [B, S] positions of the keys.
    window: the sliding window in positions; 0 = no window.

  Returns:
    A [B, 1, L, S] boolean mask (the 1 broadcasts over heads).
  """
  mask_BLS = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
  if causal or window:
    if q_positions is None:
      q_positions = jnp.broadcast_to(jnp.arange(q_segment_ids.shape[1]), q_segment_ids.shape)
    if kv_positions is None:
      kv_positions = jnp.broadcast_to(jnp.arange(kv_segment_ids.shape[1]), kv_segment_ids.shape)
    distance_BLS = q_positions[:, :, None] - kv_positions[:, None, :]
    if causal:
      mask_BLS &= distance_BLS >= 0
    if window:
      mask_BLS &= (distance_BLS if causal else jnp.abs(distance_BLS)) < window
  return mask_BLS[:, None, :, :]


def einsum_attention(q_BLHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array,
                     mask_B1LS: jax.Array, *, bias_BHLS: jax.Array | None = None,
                     softcap: float = 0.0, dropout_rate: float = 0.0,
                     dropout_rng: jax.Array | None = None) -> jax.Array:
  """Reference softmax(QK^T / sqrt(D) + bias + mask) V in plain einsums, softmax in float32.

  With `softcap` > 0 the scaled scores become softcap * tanh(scores / softcap) before
  the bias and the mask (Gemma 2).
  """
  B, L, H, D = q_BLHD.shape
  K = k_BSKD.shape[2]
  # Grouped-query attention: each of the K kv heads serves H // K query heads.
  q_BLKGD = q_BLHD.reshape(B, L, K, H // K, D)
  logits_BKGLS = jnp.einsum("BLKGD,BSKD->BKGLS", q_BLKGD, k_BSKD).astype(jnp.float32)
  logits_BKGLS = logits_BKGLS / jnp.sqrt(jnp.float32(D))
  if softcap:
    logits_BKGLS = softcap * jnp.tanh(logits_BKGLS / softcap)
  if bias_BHLS is not None:
    bias_BKGLS = jnp.broadcast_to(bias_BHLS, (B, H) + bias_BHLS.shape[2:]).reshape(
        B, K, H // K, L, bias_BHLS.shape[-1])  # Not -1: L may be 0 (a cache-filling call).
    logits_BKGLS = logits_BKGLS + bias_BKGLS.astype(jnp.float32)
  mask_B11LS = mask_B1LS[:, :, None, :, :]
  logits_BKGLS = jnp.where(mask_B11LS, logits_BKGLS, jnp.finfo(jnp.float32).min)
  probs_BKGLS = jax.nn.softmax(logits_BKGLS, axis=-1)
  if dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs_BKGLS.shape)
    probs_BKGLS = jnp.where(keep, probs_BKGLS / (1.0 - dropout_rate), 0.0)
  out_BLKGD = jnp.einsum("BKGLS,BSKD->BLKGD", probs_BKGLS.astype(v_BSKD.dtype), v_BSKD)
  return out_BLKGD.reshape(B, L, H, D)


class EinsumDense(nn.Module):
  """y = einsum(equation, x, kernel) + bias, with the kernel created at its full rank.

  (flax's DenseGeneral creates a flattened 2-D kernel first, which cannot carry
  3-D logical axis names such as ("embed", "heads", "head_dim").)
  """

  equation: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_axes: tuple[str, ...]  # The trailing kernel axes that make up the output.
  use_bias: bool
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  kernel_init: nn.initializers.Initializer = nn.initializers.normal(0.02)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param(
        "kernel", nn.with_logical_partitioning(self.kernel_init, self.kernel_axes),
        self.kernel_shape, self.param_dtype)
    # The two token axes (batch, length) as one, N: the kernel's gradient then contracts
    # one axis, a plain matmul, where over two XLA:CPU copies the gradient transposed
    # first (a fifth of the tiny shape's step). The same numbers, fewer passes.
    inputs, output = self.equation.split("->")
    x_spec, kernel_spec = inputs.split(",")
    if x_spec[:2] != output[:2] or "N" in self.equation:
      raise ValueError(f"EinsumDense equation {self.equation!r}: x and the output must "
                       "begin with the same two token axes, e.g. 'BLE,EHD->BLHD'")
    y = jnp.einsum(f"N{x_spec[2:]},{kernel_spec}->N{output[2:]}",
                   x.reshape((-1,) + x.shape[2:]).astype(self.dtype), kernel.astype(self.dtype))
    y = y.reshape(x.shape[:2] + y.shape[1:])
    if self.use_bias:
      bias_shape = self.kernel_shape[len(self.kernel_shape) - len(self.bias_axes):]
      bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                             self.bias_axes),
                        bias_shape, self.param_dtype)
      y = y + bias.astype(self.dtype).reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
    return y


class MultiHeadAttention(nn.Module):
  """Self- or cross-attention with H query heads and K <= H key/value heads."""

  config: ModelConfig
  # Decoding (see decoding.py): "self" writes each call's keys/values into max_len cache
  # slots, slot = token position (causal self-attention); "cross" computes the keys/values
  # of the encoder output on the first call and reuses them on every later one.
  cache: str | None = None
  residual_adds: int = 0  # Of the block's stack, for the init of `out` (initializers.py).

  @nn.compact
  def __call__(self, x_BLE: jax.Array, kv_BSE: jax.Array | None, mask_B1LS: jax.Array, *,
               bias_BHLS: jax.Array | None = None,
               rope_positions: tuple[jax.Array, jax.Array] | None = None,
               rope_timescale_R: jax.Array | None = None,
               positions_BL: jax.Array | None = None) -> jax.Array:
    """Attends from x to kv.

    Args:
      x_BLE: queries' inputs.
      kv_BSE: keys' and values' inputs (x itself for self-attention); None for a
        "cross" cache that already holds them.
      mask_B1LS: boolean mask from make_attention_mask.
      bias_BHLS: optional additive logit bias (T5 relative, ALiBi).
      rope_positions: (query positions [B, L], key positions [B, S]) to rotate q and k.
      rope_timescale_R: RoPE's timescales (positions.rope_timescales); None: the
        unscaled ones of rope_max_wavelength over the whole head dim.
      positions_BL: the queries' positions: the cache slots a "self" cache writes.

    Returns:
      The [B, L, E] attention output.
    """
    cfg = self.config
    H, K, D, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
    dense = functools.partial(EinsumDense, use_bias=cfg.use_bias, dtype=cfg.dtype,
                              param_dtype=cfg.param_dtype,
                              kernel_init=initializers.dense_kernel(cfg, in_axis=0,
                                                                    out_axis=(1, 2)))
    # Qwen2 biases q/k/v (model.qkv_bias) in a model without other biases.
    qkv_dense = functools.partial(dense, use_bias=cfg.use_bias or cfg.qkv_bias)
    q_BLHD = qkv_dense("BLE,EHD->BLHD", (E, H, D), ("embed", "heads", "head_dim"),
                       ("heads", "head_dim"), name="query")(x_BLE)
    if cfg.qk_norm:  # Per head, before RoPE (Qwen3, Gemma 3): bounds the scores' scale.
      q_BLHD = norms.make_norm(cfg, "query_norm", axis_name="head_dim")(q_BLHD).astype(
          cfg.dtype)
    rope = functools.partial(positions.apply_rope, max_wavelength=cfg.rope_max_wavelength,
                             timescale_R=rope_timescale_R)
    if rope_positions is not None:
      q_BLHD = rope(q_BLHD, rope_positions[0])

    if kv_BSE is None:  # Decoding steps after the first: the source's k/v are cached.
      if self.cache != "cross" or not self.has_variable("cache", "cached_key"):
        raise ValueError("attention got no keys/values input; only a decoding cross-"
                         "attention can do without, once a first call with the encoder "
                         "output has cached them")
      k_BSKD = self.get_variable("cache", "cached_key")
      v_BSKD = self.get_variable("cache", "cached_value")
    else:
      k_BSKD = qkv_dense("BSE,EKD->BSKD", (E, K, D), ("embed", "kv_heads", "head_dim"),
                         ("kv_heads", "head_dim"), name="key")(kv_BSE)
      v_BSKD = qkv_dense("BSE,EKD->BSKD", (E, K, D), ("embed", "kv_heads", "head_dim"),
                         ("kv_heads", "head_dim"), name="value")(kv_BSE)
      if cfg.qk_norm:
        k_BSKD = norms.make_norm(cfg, "key_norm", axis_name="head_dim")(k_BSKD).astype(
            cfg.dtype)
      if rope_positions is not None:
        k_BSKD = rope(k_BSKD, rope_positions[1])
      # model.init only sizes the "self" cache: a "cross" cache's shape depends on the
      # source length, so it is created by the first decoding call instead.
      if self.cache == "cross" and not self.is_initializing():
        self.put_variable("cache", "cached_key", k_BSKD)
        self.put_variable("cache", "cached_value", v_BSKD)
      elif self.cache == "self":
        k_BSKD, v_BSKD = self._update_cache(k_BSKD, v_BSKD, positions_BL)

    if cfg.attention_impl == "einsum":
      use_dropout = cfg.attention_dropout > 0.0 and not cfg.deterministic
      out_BLHD = einsum_attention(
          q_BLHD, k_BSKD, v_BSKD, mask_B1LS, bias_BHLS=bias_BHLS,
          softcap=cfg.attention_softcap,
          dropout_rate=cfg.attention_dropout if use_dropout else 0.0,
          dropout_rng=self.make_rng("dropout") if use_dropout else None)
    else:
      if bias_BHLS is not None:
        bias_BHLS = bias_BHLS.astype(q_BLHD.dtype)
      out_BLHD = jax.nn.dot_product_attention(
          q_BLHD, k_BSKD, v_BSKD, bias=bias_BHLS, mask=mask_B1LS,
          implementation=cfg.attention_impl)

    out_init = initializers.dense_kernel(cfg, in_axis=(0, 1), out_axis=2,
                                         residual_adds=self.residual_adds)
    return dense("BLHD,HDE->BLE", (H, D, E), ("heads", "head_dim", "embed"), ("embed",),
                 kernel_init=out_init, name="out")(out_BLHD)

  def _update_cache(self, k_BLKD: jax.Array, v_BLKD: jax.Array,
                    positions_BL: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Writes this call's keys/values into slots `positions_BL`; returns all max_len slots.

    Slot = position, per row, so the rows of a batch may sit at different positions
    (prompts of different lengths). The first call (model.init in decode mode, with a
    [B, max_len] input) only sizes the cache. Later calls may prefill several tokens at
    once or add one per step. A slot past a query's position is masked by causality, so
    whatever a slot held before it is written (zeros, a prompt's padding) is never read.
    """
    cfg = self.config
    B, _, K, D = k_BLKD.shape
    shape = (B, cfg.max_len, K, D)
    sizing = not self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, shape, k_BLKD.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, shape, v_BLKD.dtype)
    if sizing:
      return k_BLKD, v_BLKD
    rows_B1 = jnp.arange(B)[:, None]
    cached_k.value = cached_k.value.at[rows_B1, positions_BL].set(k_BLKD)
    cached_v.value = cached_v.value.at[rows_B1, positions_BL].set(v_BLKD)
    return cached_k.value, cached_v.value
