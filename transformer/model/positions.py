"""Position encodings that act inside attention: RoPE, T5 relative bias and ALiBi;
the sinusoidal table; and `POSITIONS`, what each model.position value does.

RoPE's long-context scalings (none, linear, llama3, yarn, dynamic, longrope) are one
table, ROPE_SCALINGS: each entry makes the timescales and names its source.

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


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """A long-context RoPE scaling's parameters (configs/base.py's model.rope_*).

  Attributes:
    factor: how many times longer the context is (model.rope_scaling_factor).
    low_freq_factor, high_freq_factor: "llama3"'s band edges.
    original_max_len: the context the model was pretrained on ("llama3", "yarn",
      "longrope"), or past which "dynamic" starts to grow the base.
    beta_fast, beta_slow: "yarn"'s ramp, in rotations over original_max_len.
    truncate: "yarn" rounds the ramp's ends to whole pairs (floor / ceil).
    short_factor, long_factor: "longrope"'s per-pair timescale multipliers, for
      sequences up to original_max_len and past it.
    attention_factor: multiplies the rotated features of q and k ("yarn",
      "longrope"); 0: derived from the factor (`rope_attention_factor`).
  """

  factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_len: int = 8192
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  truncate: bool = True
  short_factor: tuple[float, ...] = ()
  long_factor: tuple[float, ...] = ()
  attention_factor: float = 0.0


def _unscaled(fraction_R, base, s: RopeScaling, length_B):
  """Su et al. 2021 (RoFormer): pair i turns by pos / base^(2i / rotary_dim)."""
  del s, length_B
  return base ** fraction_R


def _linear(fraction_R, base, s: RopeScaling, length_B):
  """Position interpolation (Chen et al. 2023, arXiv:2306.15595; kaiokendev): every
  timescale times the factor, i.e. positions / factor."""
  return _unscaled(fraction_R, base, s, length_B) * jnp.float32(s.factor)


def _llama3(fraction_R, base, s: RopeScaling, length_B):
  """Llama 3.1 (transformers' `_compute_llama3_parameters`): pairs whose wavelength
  exceeds original_max_len / low_freq_factor are divided by the factor, those shorter
  than original_max_len / high_freq_factor kept, and in between the inverse frequency
  is interpolated: (1 - t) / factor + t, t = (original_max_len / wavelength -
  low_freq_factor) / (high_freq_factor - low_freq_factor)."""
  # In inverse frequencies, step for step as the reference computes them (float32).
  inv_freq_R = 1.0 / _unscaled(fraction_R, base, s, length_B)
  wavelength_R = 2 * math.pi / inv_freq_R
  low_freq_wavelength = s.original_max_len / s.low_freq_factor
  high_freq_wavelength = s.original_max_len / s.high_freq_factor
  scaled_R = jnp.where(wavelength_R > low_freq_wavelength, inv_freq_R / s.factor, inv_freq_R)
  smooth_R = ((s.original_max_len / wavelength_R - s.low_freq_factor)
               / (s.high_freq_factor - s.low_freq_factor))
  smoothed_R = (1 - smooth_R) * scaled_R / s.factor + smooth_R * scaled_R
  medium_R = (wavelength_R >= high_freq_wavelength) & (wavelength_R <= low_freq_wavelength)
  return 1.0 / jnp.where(medium_R, smoothed_R, scaled_R)


def yarn_ramp_ends(rotary_dim: int, base: float, s: RopeScaling) -> tuple[float, float]:
  """YaRN's (low, high) pair indices: pairs below `low` turn more than beta_fast times
  over original_max_len and are kept, pairs above `high` turn less than beta_slow
  times and are interpolated (transformers' `find_correction_range`)."""
  def pair(rotations):  # The pair index whose wavelength fits `rotations` times.
    return (rotary_dim * math.log(s.original_max_len / (rotations * 2 * math.pi))
            / (2 * math.log(base)))
  low, high = pair(s.beta_fast), pair(s.beta_slow)
  if s.truncate:
    low, high = math.floor(low), math.ceil(high)
  return max(low, 0), min(high, rotary_dim - 1)


def _yarn(fraction_R, base, s: RopeScaling, length_B):
  """YaRN (Peng et al. 2023, arXiv:2309.00071, "NTK-by-parts"): high-frequency pairs
  (index below the ramp's low end) keep their timescale, low-frequency ones (above its
  high end) are interpolated by the factor, a linear ramp in between; the attention
  temperature is `rope_attention_factor`. As transformers' `_compute_yarn_parameters`."""
  del length_B
  if isinstance(base, jax.Array):
    raise ValueError("rope scaling 'yarn' needs a static base (its ramp is computed on the "
                     "host); it is per-layer only for Gemma 3's local layers, which are "
                     "never scaled")
  rotary_dim = 2 * fraction_R.shape[0]
  timescale_R = _unscaled(fraction_R, base, s, None)
  low, high = yarn_ramp_ends(rotary_dim, float(base), s)
  if low == high:
    high += 0.001  # The reference's guard against a zero-width ramp.
  ramp_R = jnp.clip((jnp.arange(rotary_dim // 2, dtype=jnp.float32) - low) / (high - low),
                    0, 1)
  keep_R = 1 - ramp_R  # The share of the extrapolated (unscaled) inverse frequency.
  inv_freq_R = (1.0 / (s.factor * timescale_R)) * (1 - keep_R) + (1.0 / timescale_R) * keep_R
  return 1.0 / inv_freq_R


def _dynamic(fraction_R, base, s: RopeScaling, length_B):
  """Dynamic NTK-aware scaling (bloc97 and emozilla, 2023; transformers'
  `_compute_dynamic_ntk_parameters`): a sequence of n > original_max_len tokens uses
  the base base * (factor * n / original_max_len - (factor - 1))^(d / (d - 2)), d the
  rotary dim; up to original_max_len the base is unchanged. n is each row's
  `length_B`: see `rope_lengths`."""
  rotary_dim = 2 * fraction_R.shape[0]
  length_B1 = jnp.maximum(length_B, s.original_max_len).astype(jnp.float32)[:, None]
  growth_B1 = (s.factor * length_B1 / s.original_max_len - (s.factor - 1)) ** (
      rotary_dim / (rotary_dim - 2))
  return (jnp.asarray(base, jnp.float32) * growth_B1) ** fraction_R[None, :]


def _longrope(fraction_R, base, s: RopeScaling, length_B):
  """LongRoPE (Ding et al. 2024, arXiv:2402.13753; Phi-3's "su"): pair i's timescale is
  multiplied by short_factor[i] for a row of up to original_max_len tokens, by
  long_factor[i] past it (transformers' `_compute_longrope_parameters`); the attention
  temperature is `rope_attention_factor`. The row's length is `rope_lengths`'."""
  timescale_R = _unscaled(fraction_R, base, s, length_B)
  short_R = jnp.asarray(s.short_factor, jnp.float32) * timescale_R
  long_R = jnp.asarray(s.long_factor, jnp.float32) * timescale_R
  return jnp.where((length_B > s.original_max_len)[:, None], long_R[None], short_R[None])


# model.rope_scaling: how each scaling makes the timescales. config/modern.py's
# ROPE_SCALINGS lists the same names (tests/test_config_registries.py).
ROPE_SCALINGS = {"none": _unscaled, "linear": _linear, "llama3": _llama3, "yarn": _yarn,
                 "dynamic": _dynamic, "longrope": _longrope}
# Scalings whose timescales depend on each row's current length (`rope_lengths`).
LENGTH_DEPENDENT = ("dynamic", "longrope")


def rope_lengths(positions_BL: jax.Array) -> jax.Array:
  """The [B] lengths a length-dependent scaling ("dynamic", "longrope") reads: each row's
  largest position in this call + 1.

  transformers takes max(position_ids) + 1 of the call, the same for every row. In a
  teacher-forced forward (training, evaluation, scoring) that is the row's whole
  length (with packed documents: its longest document's), so every token of it uses
  one base. When generating it is the number of tokens so far: the prompt's width at
  the prefill (its padding included, as in transformers' batch), then position + 1 at
  each step; the keys already in the cache keep the rotation of their own step, as
  in transformers (whose cache, too, holds rotated keys).
  """
  return jnp.max(positions_BL, axis=1) + 1


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
  """YaRN's attention temperature term, 0.1 mscale ln(factor) + 1 (1.0 at factor <= 1)."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: str, s: RopeScaling) -> float:
  """What "yarn" and "longrope" multiply the rotated q and k features by (so the
  logits by its square); 1.0 for the other scalings.

  An explicit `s.attention_factor` wins. Otherwise YaRN's 0.1 ln(factor) + 1 (its
  "attention temperature" sqrt(1/t)), and LongRoPE's sqrt(1 + ln(factor) /
  ln(original_max_len)); both 1.0 at factor <= 1.
  """
  if scaling not in ("yarn", "longrope"):
    return 1.0
  if s.attention_factor:
    return float(s.attention_factor)
  if scaling == "yarn":
    return yarn_mscale(s.factor)
  if s.factor <= 1:
    return 1.0
  return math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_len))


def rope_timescales(rotary_dim: int, max_wavelength: float | jax.Array = 10000.0, *,
                    scaling: str = "none", length_B: jax.Array | None = None,
                    **params) -> jax.Array:
  """The float32 wavelengths / 2 pi (1 / inverse frequency) of RoPE's R = rotary_dim / 2 pairs.

  Pair i turns by pos / timescale_i, timescale_i = max_wavelength^(2i / rotary_dim).
  Long-context scaling changes the timescales, never the positions: each entry of
  ROPE_SCALINGS says how, with its source.

  Args:
    rotary_dim: features rotated (even).
    max_wavelength: the base; may be traced (a scanned stack's per-layer base).
    scaling: a key of ROPE_SCALINGS.
    length_B: [B] each row's current length (`rope_lengths`); needed by the
      LENGTH_DEPENDENT scalings only.
    **params: the scaling's parameters, RopeScaling's fields.

  Returns:
    The [R] timescales, R = rotary_dim // 2, or [B, R] for a LENGTH_DEPENDENT scaling.
  """
  if scaling not in ROPE_SCALINGS:
    raise ValueError(f"rope scaling={scaling!r}; valid: {', '.join(map(repr, ROPE_SCALINGS))}")
  if scaling in LENGTH_DEPENDENT and length_B is None:
    raise ValueError(f"rope scaling={scaling!r} depends on the sequence length: pass "
                     "length_B (rope_lengths(positions_BL))")
  fraction_R = 2.0 * jnp.arange(rotary_dim // 2, dtype=jnp.float32) / rotary_dim
  base = (max_wavelength if isinstance(max_wavelength, jax.Array)
          else float(max_wavelength))
  return ROPE_SCALINGS[scaling](fraction_R, base, RopeScaling(**params), length_B)


def apply_rope(x_BLHD: jax.Array, positions_BL: jax.Array,
               max_wavelength: float = 10000.0, *,
               timescale_R: jax.Array | None = None,
               attention_factor: float | jax.Array = 1.0) -> jax.Array:
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
    timescale_R: optional [R] (or per row [B, R]) timescales from `rope_timescales`
      (scaled, or for partial rotary: only the first 2R <= D features turn, the rest
      pass through); replaces `max_wavelength`.
    attention_factor: multiplies the rotated features (YaRN's and LongRoPE's
      temperature, `rope_attention_factor`: transformers multiplies cos and sin by it);
      the features that pass through keep their scale.

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
  half = timescale_R.shape[-1]
  if not 0 < 2 * half <= D:
    raise ValueError(f"timescale_R has {half} pairs; expected 1 to head_dim / 2 = {D // 2}.")
  if timescale_R.ndim == 1:
    timescale_R = timescale_R[None, :]
  angle_BL1R = (positions_BL.astype(jnp.float32)[:, :, None, None]
                / timescale_R[:, None, None, :])
  sin_BL1R, cos_BL1R = jnp.sin(angle_BL1R), jnp.cos(angle_BL1R)
  if not (isinstance(attention_factor, float) and attention_factor == 1.0):
    factor = jnp.asarray(attention_factor, jnp.float32)
    sin_BL1R, cos_BL1R = sin_BL1R * factor, cos_BL1R * factor
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
    learned: the embedding table is a parameter, so a trained model's max_len cannot
      grow (a computed table's can).
  """

  embedding_table: Callable[[nn.Module, ModelConfig], jax.Array] | None = None
  self_attention_bias: Callable[..., jax.Array] | None = None
  rotary: bool = False
  learned: bool = False


# model.position -> what it does; the names config/model.py's POSITIONS validates
# (tests/test_config_registries.py holds them equal).
POSITIONS: dict[str, Position] = {
    "learned": Position(embedding_table=_learned_table, learned=True),
    "sinusoidal": Position(embedding_table=_sinusoidal_table),
    "rope": Position(rotary=True),
    "relative": Position(self_attention_bias=_relative_bias),
    "alibi": Position(self_attention_bias=_alibi_bias),
    "none": Position(),
}
