"""The axes of the Llama / Mistral / Qwen / Gemma / T5 v1.1 families, one test each.

Every test fails when its axis is switched off or broken: soft-capping bounds the
logits, the window hides keys beyond it (and the KV cache agrees with the full forward
for a local/global pattern, scanned too), QK-norm makes the scores invariant to the
scale of the q/k kernels, sandwich norms sit on the residual branch, the parallel block
equals attn(norm(x)) + mlp(norm(x)) by hand, Llama 3's RoPE scaling equals a NumPy copy
of transformers' `_compute_llama3_parameters`, and the z-loss equals coef * mean(log Z^2).
Shapes and helpers are test_topologies.py's (NumPy-drawn params, compile_fast).
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from test_topologies import (D_MODEL, MAX_LEN, VOCAB, changed, close, compile_fast,
                             embedding_jacobians, experiment_config, lm_batch, logits_fn,
                             model_config, random_params, random_tokens, seq2seq_batch)
from transformer.inference import decoding
from transformer.training import flops
from transformer.training import metrics
from transformer.model import positions
from transformer.training import trainer as trainer_lib
from transformer.model.attention import MultiHeadAttention, einsum_attention, make_attention_mask
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.model.layers import MLP, Block, StackInputs, make_norm, unrolled_to_scanned
from transformer.model.models import make_model
from transformer.model.norms import OffsetRMSNorm

jax.config.update("jax_numpy_rank_promotion", "raise")

# Row 0: one document then padding; row 1: two packed documents.
SEGMENTS = np.array([[1] * 12 + [0] * 4, [1] * 7 + [2] * 9], np.int32)


def batch_of(arch: str, seed: int = 0) -> dict[str, np.ndarray]:
  tokens = random_tokens(SEGMENTS.shape, seed) * (SEGMENTS > 0)
  if arch == "encoder_decoder":
    return seq2seq_batch(tokens, SEGMENTS, random_tokens(SEGMENTS.shape, seed + 1), SEGMENTS)
  return lm_batch(tokens, SEGMENTS)


def logits_of(cfg, params=None, seed: int = 0):
  """(logits, params) of `cfg` on batch_of(cfg.arch); params drawn unless given."""
  model = make_model(cfg)
  batch = batch_of(cfg.arch)
  params = random_params(model, batch, seed) if params is None else params
  return np.asarray(compile_fast(logits_fn(model, batch), params)(params)), params


def map_params(params, fn):
  """A copy of `params` with fn(path string, leaf) applied to every leaf."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: fn("/".join(k.key for k in path), x), params)


def param_paths(params) -> set[str]:
  return {"/".join(k.key for k in path)
          for path, _ in jax.tree_util.tree_leaves_with_path(params)}


# ---------------------------------------------------------------- soft-capping


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
def test_final_logit_softcap_bounds_the_logits(arch):
  """cap * tanh(logits / cap): bounded by the cap, and exactly that of the uncapped."""
  cap = 0.5
  uncapped, params = logits_of(model_config(arch))
  capped, _ = logits_of(model_config(arch, final_logit_softcap=cap), params)
  assert np.abs(uncapped).max() > 2 * cap  # Else the test could not tell.
  assert np.abs(capped).max() < cap
  close(capped, cap * np.tanh(uncapped / cap))


def test_attention_softcap_caps_the_scores_before_the_softmax():
  """einsum_attention with softcap equals softmax(cap * tanh(QK^T / sqrt(D) / cap)) V by
  hand, and differs from the uncapped attention on large scores."""
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(1, 5, 2, 8)).astype(np.float32) * s for s in (4, 4, 1))
  mask = np.tril(np.ones((5, 5), bool))[None, None]
  cap = 3.0
  out = np.asarray(einsum_attention(q, k, v, mask, softcap=cap))
  scores = np.einsum("blhd,bshd->bhls", q, k) / np.sqrt(8)
  scores = np.where(mask, cap * np.tanh(scores / cap), -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  close(out, np.einsum("bhls,bshd->blhd", probs, v))
  assert changed(out, einsum_attention(q, k, v, mask))


def test_attention_softcap_runs_in_a_model_and_changes_it():
  base, params = logits_of(model_config("decoder", attention_impl="einsum"))
  capped, _ = logits_of(model_config("decoder", attention_impl="einsum",
                                     attention_softcap=0.05), params)
  assert changed(base, capped)


# ---------------------------------------------------------------- sliding window


def test_window_mask_by_hand():
  """Causal: keys 0..W-1 positions back; bidirectional: |distance| < W; by positions, so
  a packed document's window restarts with it."""
  segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2]])
  pos = np.array([[0, 1, 2, 3, 4, 0, 1, 2]])
  same = segments[:, :, None] == segments[:, None, :]
  distance = pos[:, :, None] - pos[:, None, :]
  for causal, expected in ((True, same & (distance >= 0) & (distance < 3)),
                           (False, same & (np.abs(distance) < 3))):
    mask = make_attention_mask(segments, segments, causal=causal, q_positions=pos,
                               kv_positions=pos, window=3)
    np.testing.assert_array_equal(np.asarray(mask)[:, 0], expected)


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_one_local_layer_reaches_only_its_window(arch):
  """Gradients of a one-layer local model: position t depends on s only if |t - s| < W
  (s <= t when causal), inside its own document; zero (bitwise) beyond the window."""
  window = 3
  cfg = model_config(arch, num_layers=1, position="rope", sliding_window=window)
  model = make_model(cfg)
  batch = batch_of(arch)
  _, norms = embedding_jacobians(model, random_params(model, batch), batch)
  norms_BLBS = norms["embedder"]
  pos = batch["positions"]
  for b in range(2):
    for t in range(MAX_LEN):
      if not SEGMENTS[b, t]:
        continue
      distance = pos[b, t] - pos[b]
      reach = (SEGMENTS[b] == SEGMENTS[b, t]) & (
          (distance >= 0) & (distance < window) if arch == "decoder"
          else np.abs(distance) < window)
      row = norms_BLBS[b, t, b]
      np.testing.assert_array_equal(row[~reach], 0.0, err_msg=f"row {b} position {t}")
      assert np.all(row[reach] > 1e-7), (b, t, row)


LOCAL_GLOBAL = dict(position="rope", sliding_window=3, window_pattern="lg",
                    rope_local_max_wavelength=100.0)


def test_scanned_local_global_with_a_per_row_rope_scaling_equals_unrolled():
  """Dynamic NTK's [B, R] timescales on the global layers beside the local layers' [R]."""
  dynamic = dict(LOCAL_GLOBAL, rope_scaling="dynamic", rope_scaling_factor=2.0,
                 rope_original_max_len=8)
  unrolled, params = logits_of(model_config("decoder", **dynamic))
  scanned, _ = logits_of(model_config("decoder", scan_layers=True, **dynamic),
                         unrolled_to_scanned(params))
  close(scanned, unrolled)
  plain, _ = logits_of(model_config("decoder", **LOCAL_GLOBAL), params)
  assert changed(unrolled, plain)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_scanned_local_global_pattern_equals_unrolled(arch):
  """The per-layer flags travel through nn.scan: the same params give the same logits,
  and the pattern matters (an all-global model differs)."""
  unrolled, params = logits_of(model_config(arch, **LOCAL_GLOBAL))
  scanned_params = unrolled_to_scanned(params)
  scanned, _ = logits_of(model_config(arch, scan_layers=True, **LOCAL_GLOBAL),
                         scanned_params)
  close(scanned, unrolled)
  global_only, _ = logits_of(model_config(arch, position="rope"), params)
  assert changed(unrolled, global_only)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_cached_decoding_equals_the_full_forward_with_local_layers(scan_layers):
  """Prompts of lengths 3 and 5 prefilled, then one token per step, on a local/global
  stack whose window (3) is shorter than the sequence (12): every logit equals the full
  forward pass's, so the cache masks slots beyond the window exactly as training does."""
  cfg = model_config("decoder", scan_layers=scan_layers, **LOCAL_GLOBAL)
  length, width = 12, 5
  tokens = jnp.asarray(random_tokens((2, length), 3))
  lengths = jnp.asarray([3, 5])
  ones = jnp.ones_like(tokens)
  pos = jnp.broadcast_to(jnp.arange(length), tokens.shape)
  params = random_params(make_model(cfg), lm_batch(np.asarray(tokens), np.asarray(ones)))

  def full_and_cached(params):
    full_BLV = make_model(cfg).apply({"params": params}, tokens, ones, pos)
    model = decoding.decode_model(cfg)
    prompts_BP = jnp.where(jnp.arange(width)[None, :] < lengths[:, None],
                           tokens[:, :width], 0)
    prefill_BPV, variables = model.apply(
        {"params": params, "cache": decoding.init_cache(model, 2)}, prompts_BP,
        jnp.ones_like(prompts_BP), pos[:, :width], mutable=["cache"])

    def step(cache, j):
      positions_B1 = (lengths + j)[:, None]
      token_B1 = jnp.take_along_axis(tokens, positions_B1, axis=1)
      logits_B1V, variables = model.apply({"params": params, "cache": cache}, token_B1,
                                          jnp.ones_like(token_B1), positions_B1,
                                          mutable=["cache"])
      return variables["cache"], logits_B1V[:, 0]

    _, steps_JBV = jax.lax.scan(step, variables["cache"], jnp.arange(length - width))
    return full_BLV, prefill_BPV, steps_JBV

  full, prefill, steps = compile_fast(full_and_cached, params)(params)
  for row, n in enumerate(lengths.tolist()):
    cached = np.concatenate([prefill[row, :n], steps[:, row]])
    np.testing.assert_allclose(cached, full[row, :n + length - width], atol=2e-5,
                               err_msg=f"row {row}")


def test_sliding_window_flops_count_the_window():
  """A local layer's scores and values cost window / length of a global layer's."""
  full = model_config("decoder", position="rope")
  local = model_config("decoder", position="rope", sliding_window=4, window_pattern="lg")
  L, H, D = 16, full.num_heads, full.head_dim
  saved = flops.forward_flops_per_sequence(full, L) - flops.forward_flops_per_sequence(
      local, L)
  assert saved == 1 * 2 * 2 * L * (L - 4) * H * D  # One local layer of two.


# ---------------------------------------------------------------- QK-norm


@pytest.mark.parametrize("arch, norm_type", [("decoder", "rmsnorm"),
                                             ("encoder", "layernorm")])
def test_qk_norm_makes_scores_invariant_to_the_qk_kernel_scale(arch, norm_type):
  """Scaling every query/key kernel by 10 changes nothing with QK-norm (each head's q
  and k are normalised), and changes the logits without it."""
  scale_qk = lambda params: map_params(
      params, lambda p, x: x * 10 if re.search(r"/(query|key)/kernel$", p) else x)
  for qk_norm in (True, False):
    cfg = model_config(arch, use_bias=False, norm_type=norm_type, qk_norm=qk_norm)
    logits, params = logits_of(cfg)
    scaled, _ = logits_of(cfg, scale_qk(params))
    if qk_norm:
      np.testing.assert_allclose(scaled, logits, atol=2e-4)
      heads = {x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)
               if re.search(r"(query|key)_norm", jax.tree_util.keystr(p))}
      assert heads == {(cfg.head_dim,)}, heads
    else:
      assert changed(scaled, logits)


# ---------------------------------------------------------------- norms and blocks


@pytest.mark.parametrize("arch", ["encoder_decoder"])  # Both stacks, cross-attention too.
def test_sandwich_norms_sit_on_the_residual_branch(arch):
  """Sandwich adds a post-norm per sublayer; with its scale at 0 every sublayer adds 0,
  so the logits are those of a pre-norm model whose output projections are zero."""
  cfg = model_config(arch, norm="sandwich", norm_type="rmsnorm")
  logits, params = logits_of(cfg)
  post = {p for p in param_paths(params) if "_post_norm" in p}
  # Per layer: self-attention and MLP; the encoder-decoder's decoder adds cross-attention.
  expected = 2 * cfg.num_layers + (3 * cfg.num_decoder_layers if arch == "encoder_decoder"
                                   else 0)
  assert len(post) == expected, sorted(post)
  silenced, _ = logits_of(cfg, map_params(params, lambda p, x: 0 * x if "_post_norm" in p
                                          else x))
  pre = model_config(arch, norm="pre", norm_type="rmsnorm")
  no_branch = _drop(map_params(params, lambda p, x: 0 * x if re.search(r"/(out|wo)/", p)
                               else x), "_post_norm")
  identity, _ = logits_of(pre, no_branch)
  close(silenced, identity)
  assert changed(logits, silenced)


def _drop(params, word: str):
  """`params` without the subtrees whose name contains `word`."""
  if not isinstance(params, dict):
    return params
  return {k: _drop(v, word) for k, v in params.items() if word not in k}


def test_scale_plus_one_rmsnorm_starts_at_zero_and_multiplies_by_one_plus_scale():
  x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32)
  norm = OffsetRMSNorm(epsilon=1e-6, param_dtype=jnp.float32)
  init = norm.init(jax.random.key(0), x)["params"]["scale"]
  np.testing.assert_array_equal(nn.unbox(init), 0.0)
  w = np.linspace(-0.5, 0.5, 8).astype(np.float32)
  out = norm.apply({"params": {"scale": w}}, x)
  expected = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * (1 + w)
  close(out, expected)
  cfg = model_config("decoder", norm_type="rmsnorm", norm_scale_plus_one=True)
  assert isinstance(make_norm(cfg, "n"), OffsetRMSNorm)
  plain = make_norm(dataclasses.replace(cfg, norm_scale_plus_one=False), "n")
  assert changed(plain.apply({"params": {"scale": w}}, x), out)


def test_parallel_block_equals_attention_plus_mlp_of_one_norm_by_hand():
  cfg = model_config("decoder", parallel_block=True, position="rope")
  x = np.random.default_rng(0).normal(size=(2, 6, D_MODEL)).astype(np.float32)
  pos = np.broadcast_to(np.arange(6), (2, 6))
  mask = make_attention_mask(np.ones((2, 6), np.int32), np.ones((2, 6), np.int32),
                             causal=True)
  block, inputs = Block(cfg, causal=True), StackInputs(positions_BL=pos, self_mask_B1LS=mask)
  shapes = nn.unbox(jax.eval_shape(block.init, jax.random.key(0), x, inputs)["params"])
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda s: 0.2 * rng.normal(size=s.shape).astype(np.float32), shapes)
  assert set(params) == {"parallel_norm", "self_attention", "mlp"}, set(params)

  def block_and_by_hand(params):
    out, _ = block.apply({"params": params}, x, inputs)
    h = make_norm(cfg, "n").apply({"params": params["parallel_norm"]}, x)
    attn = MultiHeadAttention(cfg).apply({"params": params["self_attention"]}, h, h, mask,
                                         rope_positions=(pos, pos))
    mlp = MLP(cfg).apply({"params": params["mlp"]}, h)
    return out, x + attn + mlp

  out, by_hand = compile_fast(block_and_by_hand, params)(params)
  close(out, by_hand)


# ---------------------------------------------------------------- RoPE


def llama3_inv_freq_reference(base, dim, factor, low_freq_factor, high_freq_factor, old_len):
  """transformers' `_compute_llama3_parameters`, in NumPy float32."""
  inv_freq = 1.0 / (np.float32(base) ** (np.arange(0, dim, 2).astype(np.float32) / dim))
  low_freq_wavelen = old_len / low_freq_factor
  high_freq_wavelen = old_len / high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
  is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
  return np.where(is_medium, smoothed, inv_freq_llama)


def test_llama3_rope_scaling_matches_the_reference_formula():
  """Llama 3.1's published values: all three regimes (kept, interpolated, divided) occur."""
  args = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_len=8192)
  timescale = np.asarray(positions.rope_timescales(128, 500000.0, scaling="llama3", **args))
  expected = llama3_inv_freq_reference(500000.0, 128, 8.0, 1.0, 4.0, 8192)
  np.testing.assert_allclose(1.0 / timescale, expected, rtol=1e-6)
  plain = np.asarray(positions.rope_timescales(128, 500000.0))
  ratio = timescale / plain
  assert ratio.min() == pytest.approx(1.0) and ratio.max() == pytest.approx(8.0)
  assert np.any((ratio > 1.01) & (ratio < 7.99))  # The interpolated band.
  np.testing.assert_allclose(
      positions.rope_timescales(128, 500000.0, scaling="linear", factor=4.0), 4 * plain,
      rtol=1e-6)


def test_partial_rotary_turns_only_its_fraction():
  x = np.random.default_rng(0).normal(size=(1, 5, 2, 8)).astype(np.float32)
  pos = np.arange(5)[None]
  out = np.asarray(positions.apply_rope(x, pos, timescale_R=positions.rope_timescales(4)))
  np.testing.assert_array_equal(out[..., 4:], x[..., 4:])
  close(out[..., :4], positions.apply_rope(x[..., :4], pos))
  assert changed(out[..., :4], x[..., :4])


def test_rope_scaling_and_fraction_change_the_model():
  base, params = logits_of(model_config("decoder", position="rope"))
  for overrides in (dict(rope_scaling="linear", rope_scaling_factor=4.0),
                    dict(rope_scaling="llama3", rope_scaling_factor=8.0,
                         rope_original_max_len=8),
                    dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_max_len=8),
                    # Rows of 12 and 9 tokens, past the original 8.
                    dict(rope_scaling="dynamic", rope_scaling_factor=2.0,
                         rope_original_max_len=8),
                    dict(rope_scaling="longrope", rope_scaling_factor=4.0,
                         rope_original_max_len=8, rope_short_factor=(1.0,) * 4,
                         rope_long_factor=(1.0, 2.0, 4.0, 8.0)),
                    dict(rope_fraction=0.5)):
    other, _ = logits_of(model_config("decoder", position="rope", **overrides), params)
    assert changed(base, other), overrides


# ---------------------------------------------------------------- biases, activation


def test_qkv_bias_puts_biases_on_q_k_v_only():
  cfg = model_config("decoder", use_bias=False, qkv_bias=True, norm_type="rmsnorm")
  shapes = nn.unbox(jax.eval_shape(make_model(cfg).init, jax.random.key(0),
                                   *[jnp.zeros((1, 4), jnp.int32)] * 3)["params"])
  biases = {p for p in param_paths(shapes) if p.endswith("bias")}
  assert biases == {f"block_{i}/self_attention/{n}/bias" for i in range(2)
                    for n in ("query", "key", "value")}, biases


def test_geglu_tanh_is_the_gated_tanh_gelu_by_hand():
  cfg = model_config("decoder", activation="geglu_tanh", use_bias=False)
  x = np.random.default_rng(0).normal(size=(2, 3, D_MODEL)).astype(np.float32)
  mlp = MLP(cfg)
  shapes = nn.unbox(jax.eval_shape(mlp.init, jax.random.key(0), x)["params"])
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda s: 0.3 * rng.normal(size=s.shape).astype(np.float32), shapes)
  gelu_tanh = lambda z: 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
  hidden = gelu_tanh(x @ params["wi"]["kernel"]) * (x @ params["wi_gate"]["kernel"])
  close(mlp.apply({"params": params}, x), hidden @ params["wo"]["kernel"])
  exact = MLP(dataclasses.replace(cfg, activation="geglu")).apply({"params": params}, x)
  assert np.abs(np.asarray(exact) - hidden @ params["wo"]["kernel"]).max() > 1e-7


# ---------------------------------------------------------------- z-loss


def test_z_loss_equals_coef_times_mean_log_z_squared():
  rng = np.random.default_rng(0)
  logits = 3 * rng.normal(size=(2, 5, VOCAB)).astype(np.float32)
  targets = rng.integers(0, VOCAB, (2, 5))
  weights = (rng.random((2, 5)) > 0.3).astype(np.float32)
  coef = 1e-2
  sums = metrics.loss_sums(logits, targets, weights, z_loss=coef)
  log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  by_hand = coef * (log_z ** 2 * weights).sum() / weights.sum()
  np.testing.assert_allclose(float(sums["z_loss_sum"]) / float(sums["weight_sum"]),
                             by_hand, rtol=1e-5)
  np.testing.assert_allclose(float(sums["objective_sum"]),
                             float(sums["loss_sum"] + sums["z_loss_sum"]), rtol=1e-6)
  assert metrics.summarize(sums)["z_loss"] == pytest.approx(by_hand, rel=1e-5)
  assert "z_loss_sum" not in metrics.loss_sums(logits, targets, weights)


def test_train_step_adds_the_z_loss_to_the_gradient():
  """With logits = a parameter, the z-loss gradient coef * 2 log Z softmax is what the
  step's gradient gains (SGD, lr 1: the update is minus the gradient)."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(1, 3, 8)).astype(np.float32) + 2.0
  targets, weights = np.array([[1, 2, 3]]), np.ones((1, 3), np.float32)
  # (logits, targets, weights, MoE statistics: none here), as objectives.make_forward.
  forward = lambda params, batch, rngs=None: (params["logits"], targets, weights, {})
  # train_step logs the schedule at the optimizer's own update count (a ScaleBySchedule
  # state, as optim.make_optimizer builds); scale 1.0 leaves SGD's update as it is.
  tx = optax.chain(optax.sgd(1.0), optax.scale_by_schedule(lambda count: 1.0))
  updates = {}
  for coef in (0.0, 0.1):
    state = trainer_lib.TrainState(step=jnp.zeros((), jnp.int32), params={"logits": logits},
                             opt_state=tx.init({"logits": logits}), rng=jax.random.key(0))
    step = lambda state, coef=coef: trainer_lib.train_step(
        state, {}, forward=forward, tx=tx, schedule=lambda step: 1.0, label_smoothing=0.0,
        z_loss=coef)
    new_state, sums = compile_fast(step, state)(state)
    updates[coef] = np.asarray(logits - new_state.params["logits"])
  log_z = np.log(np.exp(logits).sum(-1, keepdims=True))
  softmax = np.exp(logits - log_z)
  close(updates[0.1] - updates[0.0], 0.1 * 2 * log_z * softmax / 3)
  assert float(sums["z_loss_sum"]) > 0


# ---------------------------------------------------------------- every axis trains


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
def test_all_axes_together_give_every_parameter_a_gradient(arch):
  """Every new axis on at once, scanned: finite logits, and each parameter (the new
  norms and biases included) has a nonzero gradient."""
  cfg = model_config(arch, scan_layers=True, qk_norm=True, norm="sandwich",
                     norm_type="rmsnorm", norm_scale_plus_one=True, attention_impl="einsum",
                     attention_softcap=20.0, final_logit_softcap=30.0, use_bias=False,
                     qkv_bias=True, activation="geglu_tanh", rope_scaling="llama3",
                     rope_scaling_factor=4.0, rope_original_max_len=8, rope_fraction=0.5,
                     **LOCAL_GLOBAL)
  model = make_model(cfg)
  batch = batch_of(arch)
  params = random_params(model, batch)
  readout = np.random.default_rng(1).normal(size=VOCAB).astype(np.float32)
  grads = compile_fast(jax.grad(lambda p: jnp.sum(logits_fn(model, batch)(p) @ readout)),
                       params)(params)
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, jax.tree_util.keystr(path)


# ---------------------------------------------------------------- bad combinations


BAD = [
    ("decoder", {"attention_softcap": -1.0, "attention_impl": "einsum"},
     r"model\.attention_softcap=-1\.0"),
    ("decoder", {"attention_softcap": 50.0, "attention_impl": "xla"},
     r"model\.attention_softcap=50\.0.*einsum"),
    ("decoder", {"final_logit_softcap": -0.5}, r"model\.final_logit_softcap=-0\.5"),
    ("decoder", {"head": "classification", "pooling": "last", "final_logit_softcap": 30.0},
     r"model\.final_logit_softcap=30\.0.*classification"),
    ("encoder", {"position": "relative", "sliding_window": 4},
     r"model\.sliding_window=4.*relative"),
    ("encoder_decoder", {"position": "relative", "sliding_window": 4},
     r"model\.sliding_window=4.*relative"),
    ("decoder", {"sliding_window": -2}, r"model\.sliding_window=-2"),
    ("decoder", {"sliding_window": 4, "window_pattern": "lx"}, r"model\.window_pattern='lx'"),
    ("decoder", {"window_pattern": "lg"}, r"model\.window_pattern='lg'.*sliding_window > 0"),
    ("decoder", {"sliding_window": 4, "window_pattern": "gg"},
     r"model\.window_pattern='gg'.*local"),
    ("decoder", {"position": "rope", "rope_local_max_wavelength": 1e4},
     r"model\.rope_local_max_wavelength=10000\.0"),
    ("decoder", {"rope_scaling": "linear", "rope_scaling_factor": 2.0},
     r"model\.rope_scaling='linear'.*position='rope'"),
    ("decoder", {"position": "rope", "rope_scaling": "ntk"}, r"model\.rope_scaling='ntk'"),
    ("decoder", {"position": "rope", "rope_scaling_factor": 2.0},
     r"model\.rope_scaling_factor=2\.0.*'none'"),
    ("decoder", {"position": "rope", "rope_scaling": "llama3", "rope_scaling_factor": 8.0,
                 "rope_high_freq_factor": 1.0}, r"model\.rope_high_freq_factor=1\.0"),
    ("decoder", {"position": "rope", "sliding_window": 4, "rope_scaling": "linear",
                 "rope_scaling_factor": 2.0}, r"model\.rope_scaling='linear'.*global"),
    ("decoder", {"position": "rope", "rope_scaling": "longrope", "rope_scaling_factor": 4.0,
                 "rope_short_factor": (1.0,) * 4, "rope_long_factor": (1.0, 2.0)},
     r"model\.rope_long_factor=\(1\.0, 2\.0\).*expected 4 floats > 0"),
    ("decoder", {"position": "rope", "rope_scaling": "longrope", "rope_scaling_factor": 4.0,
                 "rope_short_factor": (1.0, 1.0, 0.0, 1.0), "rope_long_factor": (1.0,) * 4},
     r"model\.rope_short_factor=\(1\.0, 1\.0, 0\.0, 1\.0\).*floats > 0"),
    ("decoder", {"position": "rope", "rope_short_factor": (1.0,) * 4},
     r"model\.rope_short_factor=.*only 'longrope' reads it"),
    ("decoder", {"position": "rope", "rope_scaling": "linear", "rope_scaling_factor": 2.0,
                 "rope_attention_factor": 1.2},
     r"model\.rope_attention_factor=1\.2.*only 'yarn' and 'longrope'"),
    ("decoder", {"position": "rope", "rope_scaling": "yarn", "rope_scaling_factor": 4.0,
                 "rope_yarn_beta_fast": 0.5}, r"model\.rope_yarn_beta_fast=0\.5.*beta_slow=1\.0"),
    ("decoder", {"position": "rope", "rope_scaling": "dynamic", "rope_scaling_factor": 2.0,
                 "rope_original_max_len": 0}, r"model\.rope_original_max_len=0"),
    ("decoder", {"position": "rope", "rope_fraction": 0.3}, r"model\.rope_fraction=0\.3"),
    ("decoder", {"rope_fraction": 0.5}, r"model\.rope_fraction=0\.5.*rope"),
    ("decoder", {"norm_scale_plus_one": True}, r"model\.norm_scale_plus_one=True.*rmsnorm"),
    ("decoder", {"parallel_block": True, "norm": "sandwich"},
     r"model\.parallel_block=True.*'sandwich'"),
    ("decoder", {"qkv_bias": True}, r"model\.qkv_bias=True.*use_bias"),
    ("decoder", {"sliding_window": 4, "window_pattern": ""}, r"model\.window_pattern=''"),
    ("decoder", {"qk_norm": True, "num_heads": 5}, r"model\.num_heads=5.*d_model=32"),
    ("decoder", {"norm": "middle"}, r"model\.norm='middle'.*'sandwich'"),
    ("decoder", {"activation": "gated-gelu"}, r"model\.activation='gated-gelu'.*geglu_tanh"),
]


@pytest.mark.parametrize("arch, overrides, pattern", BAD,
                         ids=[f"{a}-{'-'.join(o)}" for a, o, _ in BAD])
def test_bad_values_and_combinations_name_the_field(arch, overrides, pattern):
  config = experiment_config(arch, **overrides)
  with pytest.raises(ConfigError) as error:
    validate(config)
  assert re.search(pattern, str(error.value)), str(error.value)


def test_negative_z_loss_names_the_field():
  config = experiment_config("decoder")
  config.optimizer.z_loss = -1e-4
  with pytest.raises(ConfigError, match=r"optimizer\.z_loss=-0\.0001"):
    validate(config)
