"""Position encodings that act inside attention: RoPE, T5 relative bias and ALiBi;
the sinusoidal table; and `POSITIONS`, what each model.position value does.

Each one is a function of integer token positions, never of array indices, so
packed documents whose positions restart at 0 per segment are handled for free,
and queries and keys may have different lengths (cross-attention, decoding).

Shape letters as in the package legend (transformer/model/__init__.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.config.model import ModelConfig
from transformer.model import initializers


def rope_timescales(rotary_dim: int, max_wavelength: float | jax.Array = 10000.0, *,
                    scaling: str = "none", factor: float = 1.0,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                    original_max_len: int = 8192) -> jax.Array:
  """The [R] float32 wavelengths / 2 pi (1 / inverse frequency) of RoPE's R = rotary_dim / 2 pairs.

  Pair i turns by pos / timescale_i, timescale_i = max_wavelength^(2i / rotary_dim).
  Long-context scaling changes the timescales, never the positions:
  - "linear" multiplies every timescale by `factor` (positions / factor);
  - "llama3" (transformers' `_compute_llama3_parameters`) multiplies by `factor` the
    pairs whose wavelength exceeds original_max_len / low_freq_factor, keeps those
    shorter than original_max_len / high_freq_factor, and in between interpolates the
    inverse frequency: (1 - s) / factor + s with s = (original_max_len / wavelength -
    low_freq_factor) / (high_freq_factor - low_freq_factor).

  Args:
    rotary_dim: features rotated (even).
    max_wavelength: the base; may be traced (a scanned stack's per-layer base).
    scaling: "none" | "linear" | "llama3".
    factor, low_freq_factor, high_freq_factor, original_max_len: the scaling's parameters.

  Returns:
    The [R] float32 timescales, R = rotary_dim // 2.
  """
  fraction_R = 2.0 * jnp.arange(rotary_dim // 2, dtype=jnp.float32) / rotary_dim
  timescale_R = jnp.asarray(max_wavelength, jnp.float32) ** fraction_R
  if scaling == "none":
    return timescale_R
  if scaling == "linear":
    return timescale_R * jnp.float32(factor)
  if scaling != "llama3":
    raise ValueError(f"rope scaling={scaling!r}; valid: 'none', 'linear', 'llama3'")
  # In inverse frequencies, step for step as the reference computes them (float32).
  inv_freq_R = 1.0 / timescale_R
  wavelength_R = 2 * math.pi / inv_freq_R
  low_freq_wavelength = original_max_len / low_freq_factor
  high_freq_wavelength = original_max_len / high_freq_factor
  scaled_R = jnp.where(wavelength_R > low_freq_wavelength, inv_freq_R / factor, inv_freq_R)
  smooth_R = ((original_max_len / wavelength_R - low_freq_factor)
               / (high_freq_factor - low_freq_factor))
  smoothed_R = (1 - smooth_R) * scaled_R / factor + smooth_R * scaled_R
  medium_R = (wavelength_R >= high_freq_wavelength) & (wavelength_R <= low_freq_wavelength)
  return 1.0 / jnp.where(medium_R, smoothed_R, scaled_R)


def apply_rope(x_BLHD: jax.Array, positions_BL: jax.Array,
               max_wavelength: float = 10000.0, *,
               timescale_R: jax.Array | None = None) -> jax.Array:
  """Rotary position embedding (Su et al. 2021, RoFormer), "rotate half" convention.

  Feature i of the first half of the 2R rotated features is paired with feature i + R
  of the second half (GPT-NeoX / LLaMA / MaxText layout, not the interleaved
  (2i, 2i+1) pairing of the paper), and the pair is rotated by the angle
  pos / max_wavelength^(i/R), R = D / 2 unless `timescale_R` says otherwise. Apply it to
  queries and keys (never values); the dot product of a rotated query and key then
  depends only on their position difference. The rotation is computed in float32.

  Args:
    x_BLHD: [B, L, H, D] queries or keys; D must be even.
    positions_BL: [B, L] integer position of each token (may restart per packed
      segment).
    max_wavelength: the base of the geometric progression of wavelengths.
    timescale_R: optional [R] timescales from `rope_timescales` (scaled, or for
      partial rotary: only the first 2R <= D features turn, the rest pass through);
      replaces `max_wavelength`.

  Returns:
    The rotated [B, L, H, D] array, in x_BLHD's dtype.

  Raises:
    ValueError: if the head dim is odd or the shapes disagree.
  """
  B, L, _, D = x_BLHD.shape
  if D % 2:
    raise ValueError(f"apply_rope needs an even head_dim to pair features; got head_dim={D}.")
  if positions_BL.shape != (B, L):
    raise ValueError(f"positions_BL has shape {positions_BL.shape}; expected {(B, L)} to match "
                     f"x_BLHD of shape {x_BLHD.shape}.")
  if timescale_R is None:
    timescale_R = rope_timescales(D, max_wavelength)
  half = timescale_R.shape[0]
  if not 0 < 2 * half <= D:
    raise ValueError(f"timescale_R has {half} pairs; expected 1 to head_dim / 2 = {D // 2}.")
  angle_BL1R = (positions_BL.astype(jnp.float32)[:, :, None, None]
                / timescale_R[None, None, None, :])
  sin_BL1R, cos_BL1R = jnp.sin(angle_BL1R), jnp.cos(angle_BL1R)
  x32_BLHD = x_BLHD.astype(jnp.float32)
  x1_BLHR, x2_BLHR = x32_BLHD[..., :half], x32_BLHD[..., half:2 * half]
  out1_BLHR = x1_BLHR * cos_BL1R - x2_BLHR * sin_BL1R
  out2_BLHR = x2_BLHR * cos_BL1R + x1_BLHR * sin_BL1R
  rotated = [out1_BLHR, out2_BLHR]
  if 2 * half < D:  # Partial rotary: the remaining features carry no position.
    rotated.append(x32_BLHD[..., 2 * half:])
  return jnp.concatenate(rotated, axis=-1).astype(x_BLHD.dtype)


def t5_relative_position_bucket(relative_position: jax.Array, *, bidirectional: bool,
                                num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
  """Maps key_position - query_position to a bucket id, as in T5 (Raffel et al. 2020).

  A port of Mesh TensorFlow's `_relative_position_bucket` (identical to Hugging
  Face's `T5Attention._relative_position_bucket`). When `bidirectional`, half
  the buckets hold positive offsets (keys after the query) and half the rest;
  otherwise positive offsets all share bucket 0. Within a half, the first half
  of its buckets are exact distances 0, 1, ...; the rest cover distances up to
  `max_distance` on a log scale, and anything farther shares the last bucket.
  The log is taken in float32 like the references, so bucket edges match them.

  Args:
    relative_position: integer array of memory_position - query_position.
    bidirectional: whether keys after the query get their own buckets.
    num_buckets: the number of buckets (halved per direction when bidirectional).
    max_distance: distances at or beyond this share the last bucket.

  Returns:
    An int32 array of bucket ids in [0, num_buckets), shaped like the input.
  """
  relative_position = jnp.asarray(relative_position).astype(jnp.int32)
  buckets = jnp.zeros_like(relative_position)
  if bidirectional:
    num_buckets //= 2
    buckets += jnp.where(relative_position > 0, num_buckets, 0).astype(jnp.int32)
    distance = jnp.abs(relative_position)
  else:
    distance = -jnp.minimum(relative_position, 0)
  max_exact = num_buckets // 2
  is_small = distance < max_exact
  # log(0) = -inf on the small distances is computed but then discarded by where.
  log_ratio = (jnp.log(distance.astype(jnp.float32) / max_exact)
               / math.log(max_distance / max_exact) * (num_buckets - max_exact))
  # float -> int truncates toward zero, like the references' to_int32 / .to(long).
  if_large = max_exact + jnp.where(is_small, 0.0, log_ratio).astype(jnp.int32)
  if_large = jnp.minimum(if_large, num_buckets - 1)
  return buckets + jnp.where(is_small, distance, if_large)


class RelativePositionBias(nn.Module):
  """T5's learned per-head attention bias, indexed by the bucketed key-query offset.

  Add the result to the attention logits (T5 shares one such module across the
  layers of a stack).
  """

  num_heads: int
  bidirectional: bool
  num_buckets: int = 32
  max_distance: int = 128
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, q_positions_BL: jax.Array, kv_positions_BS: jax.Array) -> jax.Array:
    """Returns the [B, H, L, S] float32 bias for queries and keys at these positions.

    Args:
      q_positions_BL: [B, L] integer query positions.
      kv_positions_BS: [B, S] integer key positions.

    Returns:
      The [B, H, L, S] float32 bias.
    """
    # A small init keeps the initial bias near zero, like every other weight here.
    embedding_UH = self.param(
        "embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "heads")),
        (self.num_buckets, self.num_heads), self.param_dtype)
    relative_BLS = kv_positions_BS[:, None, :] - q_positions_BL[:, :, None]
    bucket_BLS = t5_relative_position_bucket(
        relative_BLS, bidirectional=self.bidirectional, num_buckets=self.num_buckets,
        max_distance=self.max_distance)
    bias_BLSH = jnp.take(embedding_UH.astype(jnp.float32), bucket_BLS, axis=0)
    return jnp.transpose(bias_BLSH, (0, 3, 1, 2))


def alibi_slopes(num_heads: int) -> np.ndarray:
  """The per-head ALiBi slopes of Press et al. 2022, as in their reference `get_slopes`.

  For n a power of 2 the slopes are the geometric sequence starting at and with
  ratio 2^(-8/n). Otherwise they are the slopes for the closest lower power of
  two, p, followed by every other slope of the 2p sequence, n - p of them.

  Args:
    num_heads: the number of attention heads (>= 1).

  Returns:
    A float64 [num_heads] array, head 0's slope first.

  Raises:
    ValueError: if num_heads < 1.
  """
  if num_heads < 1:
    raise ValueError(f"alibi_slopes needs num_heads >= 1; got num_heads={num_heads}.")

  def power_of_2_slopes(n: int) -> list[float]:
    start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
    return [start * start**i for i in range(n)]

  if math.log2(num_heads).is_integer():
    return np.asarray(power_of_2_slopes(num_heads), dtype=np.float64)
  closest = 2 ** math.floor(math.log2(num_heads))
  extra = alibi_slopes(2 * closest)[0::2][: num_heads - closest]
  return np.concatenate([np.asarray(power_of_2_slopes(closest)), extra])


def alibi_bias(q_positions_BL: jax.Array, kv_positions_BS: jax.Array, num_heads: int, *,
               causal: bool) -> jax.Array:
  """The ALiBi attention bias -slope_h * distance(query, key), to add to the logits.

  With `causal` the distance is the paper's signed q_pos - kv_pos: keys in the
  future get a positive bias, which is harmless only because the causal mask
  removes them, so always pair causal=True with a causal mask. Without it the
  distance is |q_pos - kv_pos|, a symmetric penalty (the usual bidirectional
  adaptation, e.g. MosaicBERT). On every key a causal query may see, the two
  agree.

  Args:
    q_positions_BL: [B, L] integer query positions.
    kv_positions_BS: [B, S] integer key positions.
    num_heads: the number of heads H; head h uses alibi_slopes(H)[h].
    causal: whether to use the signed (causal) or absolute (bidirectional) distance.

  Returns:
    The [B, H, L, S] float32 bias.
  """
  distance_BLS = (q_positions_BL[:, :, None] - kv_positions_BS[:, None, :]).astype(jnp.float32)
  if not causal:
    distance_BLS = jnp.abs(distance_BLS)
  slopes_H = jnp.asarray(alibi_slopes(num_heads), dtype=jnp.float32)
  return -slopes_H[None, :, None, None] * distance_BLS[:, None, :, :]


def _interleaved(table: np.ndarray, sines: np.ndarray, cosines: np.ndarray) -> None:
  """The paper's layout: sines in the even features, cosines in the odd ones."""
  table[:, 0::2], table[:, 1::2] = sines, cosines


def _halves(table: np.ndarray, sines: np.ndarray, cosines: np.ndarray) -> None:
  """Marian's layout (Hugging Face's opus-mt): every sine, then every cosine."""
  table[:, :sines.shape[1]], table[:, sines.shape[1]:] = sines, cosines


# model.sinusoidal_layout -> where the sines and cosines go, writing into the table;
# the names config/model.py's SINUSOIDAL_LAYOUTS validates (tests/test_config_registries.py).
SINUSOIDAL_LAYOUTS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], None]] = {
    "interleaved": _interleaved,
    "halves": _halves,
}


def sinusoidal_table(max_len: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
  """The paper's PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...).

  `layout="halves"` puts the same sines in the first half of the features and the
  cosines in the second (Marian's table, which Hugging Face's opus-mt models use).
  """
  positions = np.arange(max_len)[:, None]
  div = np.power(10000.0, np.arange(0, d_model, 2) / d_model)
  sines, cosines = np.sin(positions / div), np.cos(positions / div)[:, : d_model // 2]
  table = np.zeros((max_len, d_model), dtype=np.float32)
  SINUSOIDAL_LAYOUTS[layout](table, sines, cosines)
  return table


def _learned_table(embedder: nn.Module, config: ModelConfig) -> jax.Array:
  """The learned table: the embedder's `position_embed` parameter."""
  return embedder.param(
      "position_embed",
      nn.with_logical_partitioning(initializers.position_embedding(config), ("length", "embed")),
      (config.max_len, config.d_model), config.param_dtype)


def _sinusoidal_table(embedder: nn.Module, config: ModelConfig) -> jax.Array:
  del embedder  # A constant: no parameter.
  return jnp.asarray(sinusoidal_table(config.max_len, config.d_model, config.sinusoidal_layout))


def _relative_bias(config: ModelConfig, q_positions_BL: jax.Array, kv_positions_BS: jax.Array,
                   *, causal: bool, name: str) -> jax.Array:
  return RelativePositionBias(
      num_heads=config.num_heads, num_buckets=config.relative_buckets,
      max_distance=config.relative_max_distance, bidirectional=not causal,
      param_dtype=config.param_dtype, name=name)(q_positions_BL, kv_positions_BS)


def _alibi_bias(config: ModelConfig, q_positions_BL: jax.Array, kv_positions_BS: jax.Array,
                *, causal: bool, name: str) -> jax.Array:
  del name  # No parameters.
  return alibi_bias(q_positions_BL, kv_positions_BS, config.num_heads, causal=causal)


@dataclasses.dataclass(frozen=True)
class Position:
  """One `model.position` value: how token positions enter the model (None: not this way).

  Attributes:
    embedding_table: (embedder, config) -> the [max_len, E] table whose row at each
      token's position is added to its embedding, built in the embedder's setup (where
      a learned table becomes its parameter). Its max_len rows bound the sequences
      (config/model.py's TABLE_POSITIONS names these values).
    self_attention_bias: (config, q_positions_BL, kv_positions_BS, causal=, name=) ->
      the [B, H, L, S] float32 bias added to a stack's self-attention logits, called
      inside the stack's compact module (`name`: a table shared by its layers).
    rotary: RoPE: every self-attention rotates its queries and keys by their positions.
  """

  embedding_table: Callable[[nn.Module, ModelConfig], jax.Array] | None = None
  self_attention_bias: Callable[..., jax.Array] | None = None
  rotary: bool = False


# model.position -> what it does; the names config/model.py's POSITIONS validates
# (tests/test_config_registries.py holds them equal).
POSITIONS: dict[str, Position] = {
    "learned": Position(embedding_table=_learned_table),
    "sinusoidal": Position(embedding_table=_sinusoidal_table),
    "rope": Position(rotary=True),
    "relative": Position(self_attention_bias=_relative_bias),
    "alibi": Position(self_attention_bias=_alibi_bias),
    "none": Position(),
}
