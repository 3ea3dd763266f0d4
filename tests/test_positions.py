"""Tests for transformer/model/positions.py: RoPE, T5 relative position buckets and bias, ALiBi.

Each encoding is checked against an independent reference (a loop-based NumPy
RoPE, a pure-Python port of the T5 / ALiBi reference functions) and against
values derived by hand from the published algorithms.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer.model import positions
from transformer.config.mesh import LOGICAL_AXES

jax.config.update("jax_numpy_rank_promotion", "raise")


# ----------------------------------------------------------------------------- RoPE


def _rope_loops(x_LHD: np.ndarray, positions_L: np.ndarray, max_wavelength: float) -> np.ndarray:
  """Rotate-half RoPE written with explicit loops, in float64."""
  L, H, D = x_LHD.shape
  half = D // 2
  out = np.zeros((L, H, D), dtype=np.float64)
  for l in range(L):
    for h in range(H):
      for i in range(half):
        theta = positions_L[l] / max_wavelength ** (2 * i / D)
        a, b = float(x_LHD[l, h, i]), float(x_LHD[l, h, i + half])
        out[l, h, i] = a * math.cos(theta) - b * math.sin(theta)
        out[l, h, i + half] = b * math.cos(theta) + a * math.sin(theta)
  return out


def _scores_BHLS(q_BLHD: jax.Array, k_BSHD: jax.Array) -> jax.Array:
  return jnp.einsum("blhd,bshd->bhls", q_BLHD, k_BSHD)


def test_rope_matches_loop_reference():
  rng = np.random.default_rng(0)
  x_BLHD = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
  positions_BL = np.array([[0, 1, 2, 3, 4], [7, 0, 1, 2, 100]], dtype=np.int32)
  for wavelength in (10000.0, 10.0):
    got = positions.apply_rope(jnp.asarray(x_BLHD), jnp.asarray(positions_BL), wavelength)
    for b in range(2):
      want = _rope_loops(x_BLHD[b], positions_BL[b], wavelength)
      np.testing.assert_allclose(np.asarray(got[b]), want, atol=1e-4, rtol=1e-4)


def test_rope_scores_depend_only_on_relative_position():
  rng = np.random.default_rng(1)
  q_1LHD = jnp.asarray(rng.normal(size=(1, 4, 2, 16)), jnp.float32)
  k_1SHD = jnp.asarray(rng.normal(size=(1, 6, 2, 16)), jnp.float32)  # L != S on purpose.
  q_pos_1L = jnp.array([[0, 3, 9, 20]], jnp.int32)
  k_pos_1S = jnp.array([[0, 1, 5, 9, 17, 30]], jnp.int32)
  base_1HLS = _scores_BHLS(positions.apply_rope(q_1LHD, q_pos_1L),
                           positions.apply_rope(k_1SHD, k_pos_1S))
  for shift in (1, 7, 50, 1000):
    shifted_1HLS = _scores_BHLS(positions.apply_rope(q_1LHD, q_pos_1L + shift),
                                positions.apply_rope(k_1SHD, k_pos_1S + shift))
    np.testing.assert_allclose(shifted_1HLS, base_1HLS, atol=1e-4, rtol=1e-4)
  # The check has teeth: shifting only the queries changes the scores.
  moved_1HLS = _scores_BHLS(positions.apply_rope(q_1LHD, q_pos_1L + 3),
                            positions.apply_rope(k_1SHD, k_pos_1S))
  assert not np.allclose(moved_1HLS, base_1HLS, atol=1e-2)


def test_rope_packed_segments_restart_positions():
  # A token at position p in a second packed segment is rotated like position p.
  rng = np.random.default_rng(2)
  x_1LHD = jnp.asarray(rng.normal(size=(1, 6, 2, 8)), jnp.float32)
  packed = positions.apply_rope(x_1LHD, jnp.array([[0, 1, 2, 0, 1, 2]], jnp.int32))
  np.testing.assert_allclose(packed[:, 3:], positions.apply_rope(
      x_1LHD[:, 3:], jnp.array([[0, 1, 2]], jnp.int32)), atol=1e-6)


def test_rope_at_position_zero_is_identity_and_norm_is_preserved():
  rng = np.random.default_rng(3)
  x_BLHD = jnp.asarray(rng.normal(size=(2, 4, 3, 8)), jnp.float32)
  np.testing.assert_allclose(positions.apply_rope(x_BLHD, jnp.zeros((2, 4), jnp.int32)),
                             x_BLHD, atol=1e-6)
  rotated = positions.apply_rope(x_BLHD, jnp.array([[1, 5, 90, 4000]] * 2, jnp.int32))
  np.testing.assert_allclose(jnp.linalg.norm(rotated, axis=-1),
                             jnp.linalg.norm(x_BLHD, axis=-1), rtol=1e-5)


# ----------------------------------------------------------- long-context scalings
# Parity with transformers, model included, is tests/test_hf_import.py's (llama_yarn/,
# llama_dynamic/, llama_longrope/); these pin the per-row length each one reads.


def test_the_length_a_scaling_reads_is_each_rows_largest_position_plus_one():
  positions_BL = jnp.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 0]], jnp.int32)
  np.testing.assert_array_equal(positions.rope_lengths(positions_BL), [6, 3])


def test_dynamic_ntk_grows_the_base_only_past_the_original_length():
  plain_R = np.asarray(positions.rope_timescales(16, 10000.0))
  got_BR = np.asarray(positions.rope_timescales(
      16, 10000.0, scaling="dynamic", factor=2.0, original_max_len=16,
      length_B=jnp.array([5, 16, 32])))
  np.testing.assert_allclose(got_BR[:2], [plain_R, plain_R], rtol=1e-6)
  # base (factor n / original - (factor - 1))^(d / (d - 2)) with n = 32, d = 16.
  grown = 10000.0 * (2.0 * 32 / 16 - 1) ** (16 / 14)
  np.testing.assert_allclose(got_BR[2], grown ** (np.arange(8) / 8), rtol=1e-5)


def test_longrope_uses_the_long_factors_past_the_original_length_per_row():
  plain_R = np.asarray(positions.rope_timescales(8, 10000.0))
  short, long = (1.0, 1.5, 2.0, 2.5), (1.0, 4.0, 9.0, 16.0)
  got_BR = np.asarray(positions.rope_timescales(
      8, 10000.0, scaling="longrope", original_max_len=16, short_factor=short,
      long_factor=long, length_B=jnp.array([16, 17])))
  np.testing.assert_allclose(got_BR, [plain_R * short, plain_R * long], rtol=1e-6)
  with pytest.raises(ValueError, match="depends on the sequence length"):
    positions.rope_timescales(8, scaling="longrope", short_factor=short, long_factor=long)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_ramps_between():
  """llama_yarn/'s setting: factor 4 over 1024 tokens on 16 rotated features."""
  params = dict(factor=4.0, original_max_len=1024)
  assert positions.yarn_ramp_ends(16, 10000.0, positions.RopeScaling(**params)) == (1, 5)
  ratio_R = (np.asarray(positions.rope_timescales(16, 10000.0, scaling="yarn", **params))
             / np.asarray(positions.rope_timescales(16, 10000.0)))
  np.testing.assert_allclose(ratio_R[:2], 1.0, rtol=1e-6)
  np.testing.assert_allclose(ratio_R[5:], 4.0, rtol=1e-6)
  assert np.all((ratio_R[2:5] > 1.0) & (ratio_R[2:5] < 4.0))
  assert positions.rope_attention_factor("yarn", positions.RopeScaling(**params)) == (
      pytest.approx(0.1 * math.log(4.0) + 1))


def test_the_attention_factor_scales_the_rotated_features_only():
  x_BLHD = jnp.asarray(np.random.default_rng(5).normal(size=(1, 3, 2, 8)), jnp.float32)
  pos_BL = jnp.array([[0, 4, 9]], jnp.int32)
  timescale_R = positions.rope_timescales(4)  # Partial rotary: 4 of 8 features turn.
  plain = positions.apply_rope(x_BLHD, pos_BL, timescale_R=timescale_R)
  scaled = positions.apply_rope(x_BLHD, pos_BL, timescale_R=timescale_R, attention_factor=1.3)
  np.testing.assert_allclose(scaled[..., :4], 1.3 * plain[..., :4], rtol=1e-6)
  np.testing.assert_array_equal(scaled[..., 4:], x_BLHD[..., 4:])


def test_rope_keeps_dtype():
  x_BLHD = jnp.ones((1, 3, 2, 4), jnp.bfloat16)
  assert positions.apply_rope(x_BLHD, jnp.array([[0, 1, 2]])).dtype == jnp.bfloat16


def test_rope_odd_head_dim_raises():
  with pytest.raises(ValueError, match="head_dim=5"):
    positions.apply_rope(jnp.ones((1, 2, 1, 5)), jnp.zeros((1, 2), jnp.int32))


# ----------------------------------------------------------------------------- T5 buckets


def _hf_bucket(relative_position: int, bidirectional: bool, num_buckets: int = 32,
               max_distance: int = 128) -> int:
  """Hugging Face's T5Attention._relative_position_bucket, for one Python int."""
  relative_buckets = 0
  if bidirectional:
    num_buckets //= 2
    relative_buckets += int(relative_position > 0) * num_buckets
    relative_position = abs(relative_position)
  else:
    relative_position = -min(relative_position, 0)
  max_exact = num_buckets // 2
  if relative_position < max_exact:
    return relative_buckets + relative_position
  if_large = max_exact + int(math.log(relative_position / max_exact)
                             / math.log(max_distance / max_exact) * (num_buckets - max_exact))
  return relative_buckets + min(if_large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_match_reference_port(bidirectional):
  relative = np.arange(-200, 201)
  got = positions.t5_relative_position_bucket(jnp.asarray(relative), bidirectional=bidirectional)
  assert got.dtype == jnp.int32
  want = [_hf_bucket(int(r), bidirectional) for r in relative]
  np.testing.assert_array_equal(np.asarray(got), want)


# Derived by hand. Bidirectional: 16 buckets per direction, positive offsets add 16,
# distances 0..7 are exact, 8..127 take 8 + floor(log(d / 8) / log(16) * 8), >= 128 -> 15.
# Unidirectional: positive offsets are distance 0, distances 0..15 exact,
# 16..127 take 16 + floor(log(d / 16) / log(8) * 16), >= 128 -> 31.
BIDIRECTIONAL_SPOTS = {0: 0, 1: 17, -1: 1, 7: 23, -7: 7, 8: 24, -8: 8,
                       -16: 10,   # 8 + floor(log 2 / log 16 * 8) = 8 + 2
                       -64: 14,   # 8 + floor(log 8 / log 16 * 8) = 8 + 6
                       127: 31, 128: 31, 1000: 31, -1000: 15}
UNIDIRECTIONAL_SPOTS = {0: 0, 5: 0, 1000: 0, -1: 1, -15: 15, -16: 16,
                        -32: 21,  # 16 + floor(log 2 / log 8 * 16) = 16 + 5
                        -128: 31, -1000: 31}


@pytest.mark.parametrize("bidirectional,spots", [(True, BIDIRECTIONAL_SPOTS),
                                                 (False, UNIDIRECTIONAL_SPOTS)])
def test_t5_buckets_hand_derived_values(bidirectional, spots):
  relative = jnp.array(list(spots), jnp.int32)
  got = positions.t5_relative_position_bucket(relative, bidirectional=bidirectional)
  assert dict(zip(spots, np.asarray(got).tolist())) == spots


# ----------------------------------------------------------------------------- T5 bias


def test_relative_position_bias_shape_and_translation_invariance():
  module = positions.RelativePositionBias(num_heads=3, bidirectional=True)
  q_pos_BL = jnp.array([[0, 1, 2, 3], [5, 6, 0, 1]], jnp.int32)
  kv_pos_BS = jnp.array([[0, 1, 2, 3, 4, 5], [5, 6, 7, 0, 1, 2]], jnp.int32)
  variables = module.init(jax.random.PRNGKey(0), q_pos_BL, kv_pos_BS)
  bias_BHLS = module.apply(variables, q_pos_BL, kv_pos_BS)
  assert bias_BHLS.shape == (2, 3, 4, 6) and bias_BHLS.dtype == jnp.float32
  bias_BHLS, q_pos_BL, kv_pos_BS = map(np.asarray, (bias_BHLS, q_pos_BL, kv_pos_BS))
  table_NH = np.asarray(nn.unbox(variables["params"]["embedding"]))
  for b in range(2):
    for l in range(4):
      for s in range(6):
        offset = int(kv_pos_BS[b, s] - q_pos_BL[b, l])
        np.testing.assert_array_equal(bias_BHLS[b, :, l, s], table_NH[_hf_bucket(offset, True)])
  # Same offset, same bias: (q=0, k=1) in row 0 and (q=5, k=6) in row 1.
  np.testing.assert_array_equal(bias_BHLS[0, :, 0, 1], bias_BHLS[1, :, 0, 1])
  assert not np.allclose(bias_BHLS[0, :, 0, 1], bias_BHLS[0, :, 1, 0])  # +1 vs -1 differ.


def test_relative_position_bias_param_spec():
  module = positions.RelativePositionBias(num_heads=4, num_buckets=16, bidirectional=False)
  pos_BL = jnp.zeros((1, 2), jnp.int32)
  abstract = jax.eval_shape(module.init, jax.random.PRNGKey(0), pos_BL, pos_BL)
  assert list(abstract["params"]) == ["embedding"]
  spec = nn.get_partition_spec(abstract)["params"]["embedding"]
  assert tuple(spec) == (None, "heads")
  assert all(name is None or name in LOGICAL_AXES for name in spec)
  assert nn.unbox(abstract["params"]["embedding"]).shape == (16, 4)


# ----------------------------------------------------------------------------- ALiBi


def _reference_get_slopes(n: int) -> list[float]:
  """Press et al.'s get_slopes, from the ALiBi reference implementation."""
  def get_slopes_power_of_2(n):
    start = 2 ** (-2 ** -(math.log2(n) - 3))
    ratio = start
    return [start * ratio**i for i in range(n)]
  if math.log2(n).is_integer():
    return get_slopes_power_of_2(n)
  closest_power_of_2 = 2 ** math.floor(math.log2(n))
  return (get_slopes_power_of_2(closest_power_of_2)
          + _reference_get_slopes(2 * closest_power_of_2)[0::2][:n - closest_power_of_2])


def test_alibi_slopes_hard_coded():
  np.testing.assert_array_equal(positions.alibi_slopes(8), [2.0**-i for i in range(1, 9)])
  np.testing.assert_array_equal(positions.alibi_slopes(4), [1 / 4, 1 / 16, 1 / 64, 1 / 256])
  # 6 heads: the 4-head slopes, then every other one of the 8-head slopes (1/2, 1/8).
  six = [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
  np.testing.assert_array_equal(positions.alibi_slopes(6), six)
  np.testing.assert_array_equal(_reference_get_slopes(6), six)


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 6, 7, 8, 12, 16, 20, 32])
def test_alibi_slopes_match_reference(num_heads):
  np.testing.assert_allclose(positions.alibi_slopes(num_heads),
                             _reference_get_slopes(num_heads), rtol=1e-12)


def test_alibi_slopes_rejects_zero_heads():
  with pytest.raises(ValueError, match="num_heads=0"):
    positions.alibi_slopes(0)


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_values(causal):
  H = 6
  q_pos_BL = jnp.array([[0, 1, 2], [4, 0, 1]], jnp.int32)
  kv_pos_BS = jnp.array([[0, 1, 2, 3, 4], [3, 4, 0, 1, 2]], jnp.int32)
  bias_BHLS = positions.alibi_bias(q_pos_BL, kv_pos_BS, H, causal=causal)
  assert bias_BHLS.shape == (2, H, 3, 5) and bias_BHLS.dtype == jnp.float32
  bias_BHLS, q_pos_BL, kv_pos_BS = map(np.asarray, (bias_BHLS, q_pos_BL, kv_pos_BS))
  slopes = positions.alibi_slopes(H)
  for b in range(2):
    for l in range(3):
      for s in range(5):
        distance = int(q_pos_BL[b, l] - kv_pos_BS[b, s])
        if not causal:
          distance = abs(distance)
        np.testing.assert_allclose(bias_BHLS[b, :, l, s], -slopes * distance, rtol=1e-6)
  # Zero where query and key share a position, e.g. the diagonal of row 0.
  np.testing.assert_array_equal(np.diagonal(bias_BHLS[0, :, :, :3], axis1=1, axis2=2), 0.0)
  # A key two behind the query: -2 * slope for every head, causal or not.
  np.testing.assert_allclose(bias_BHLS[0, :, 2, 0], -2.0 * slopes, rtol=1e-6)
