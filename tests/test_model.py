"""Model tests: causality, packing isolation, attention vs NumPy, masks, params, axes.

Every model here is configs/base.py shrunk to vocab 64, d_model 32, 2 layers,
4 heads, mlp 64, max_len 16, so the whole file runs in seconds on a CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from configs import base
from configs import gpt_small
from transformer.model import attention
from transformer.config.mesh import LOGICAL_AXES
from transformer.config.model import ModelConfig
from transformer.model.positions import sinusoidal_table
from transformer.model.models import Embedder, make_model

jax.config.update("jax_numpy_rank_promotion", "raise")

VOCAB, LENGTH = 64, 8
ATTENTION_IMPLS = ("xla", "einsum")
NORMS = ("pre", "post")


def tiny_config(**overrides) -> ModelConfig:
  """configs/base.py shrunk to test size; deterministic (no dropout) unless overridden."""
  config = base.get_config()
  config.model.update(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, mlp_dim=64,
                      max_len=16, dtype="float32")
  model_overrides = {k: v for k, v in overrides.items() if k != "deterministic"}
  config.model.update(**model_overrides)
  return dataclasses.replace(ModelConfig.from_config(config.model),
                             deterministic=overrides.get("deterministic", True))


def single_document_inputs(batch: int = 2, length: int = LENGTH, seed: int = 0):
  """Random tokens, one document per row: segment ids all 1, positions 0..L-1."""
  tokens = np.random.default_rng(seed).integers(0, VOCAB, (batch, length), dtype=np.int32)
  segments = np.ones((batch, length), np.int32)
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))
  return tokens, segments, positions


def random_params(model: nn.Module, seed: int = 0):
  """Parameters drawn with NumPy in the shapes `model.init` would make.

  Compiling `model.init` (threefry for every weight) takes seconds on a CPU; these
  tests exercise the forward computation, not the initializers. Biases are nonzero
  and scales are not all one, so every parameter takes part.
  """
  tokens, segments, positions = single_document_inputs()
  shapes = nn.unbox(
      jax.eval_shape(model.init, jax.random.key(0), tokens, segments, positions)["params"])
  rng = np.random.default_rng(seed)

  def draw(path, shape):
    noise = rng.normal(size=shape.shape).astype(np.float32)
    return 1.0 + 0.1 * noise if path[-1].key == "scale" else 0.1 * noise

  return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.lru_cache(maxsize=None)
def forward_fn(cfg: ModelConfig):
  """A jitted logits function of (tokens, segments, positions) with fixed random params."""
  model = make_model(cfg)
  params = random_params(model)
  return jax.jit(lambda t, s, p: model.apply({"params": params}, t, s, p))


# ---------------------------------------------------------------- causality


def perturbed_rows():
  """Row 0 is a random document; row t + 1 is the same with token t changed."""
  tokens, _, _ = single_document_inputs(batch=1)
  rows = np.repeat(tokens, LENGTH + 1, axis=0)
  for t in range(LENGTH):
    rows[t + 1, t] = (rows[t + 1, t] + 1 + t) % VOCAB
  return rows


@functools.lru_cache(maxsize=None)
def logits_and_embedding_jacobian(cfg: ModelConfig):
  """Logits [B, L, V] on perturbed_rows() and d(readout of logits[b, t]) / d(embedding[c, s]).

  The embedder's output gets a zero float `delta` added (via nn.intercept_methods) so
  the model can be differentiated with respect to its (otherwise integer) inputs.
  """
  model = make_model(cfg)
  params = random_params(model)
  tokens = perturbed_rows()
  _, segments, positions = single_document_inputs(batch=tokens.shape[0])
  # A fixed random readout so every vocabulary entry contributes to the scalar.
  readout_V = np.random.default_rng(1).normal(size=VOCAB).astype(np.float32)

  def logits_with_delta(delta_BLE):
    def add_delta(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if isinstance(context.module, Embedder) and context.method_name == "__call__":
        out = out + delta_BLE
      return out

    with nn.intercept_methods(add_delta):
      return model.apply({"params": params}, tokens, segments, positions)

  def logits_and_jacobian(delta_BLE):
    # jac[b, t, c, s, e] = d readout(logits[b, t]) / d delta[c, s, e]
    jac = jax.jacrev(lambda d: logits_with_delta(d) @ readout_V)(delta_BLE)
    return logits_with_delta(delta_BLE), jac

  delta = jnp.zeros(tokens.shape + (cfg.d_model,))
  logits, jac = jax.jit(logits_and_jacobian)(delta)
  return np.asarray(logits), np.asarray(jac)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_causality_through_gradients(impl, norm):
  """d(logits at t)/d(embedding at s) is exactly zero for s > t and nonzero for s <= t."""
  _, jac = logits_and_embedding_jacobian(tiny_config(attention_impl=impl, norm=norm))
  B, L = jac.shape[:2]
  assert jac.shape == (B, L, B, L, 32)  # d_model = 32.
  for b in range(B):
    for t in range(L):
      np.testing.assert_array_equal(jac[b, t, b, t + 1:], 0.0,
                                    err_msg=f"position {t} depends on a later position")
      past_norms = np.linalg.norm(jac[b, t, b, : t + 1], axis=-1)
      assert np.all(past_norms > 1e-6), (t, past_norms)  # Not vacuous: the past matters.
      np.testing.assert_array_equal(np.delete(jac[b, t], b, axis=0), 0.0,
                                    err_msg="rows of a batch interact")


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_causality_by_perturbation(impl, norm):
  """Changing token t leaves logits < t bitwise unchanged and changes every logit >= t."""
  logits, _ = logits_and_embedding_jacobian(tiny_config(attention_impl=impl, norm=norm))
  reference = logits[0]
  for t in range(LENGTH):
    changed = logits[t + 1]
    np.testing.assert_array_equal(changed[:t], reference[:t],
                                  err_msg=f"changing token {t} changed an earlier logit")
    diff = np.abs(changed[t:] - reference[t:]).max(axis=-1)
    assert np.all(diff > 1e-5), (t, diff)


# ---------------------------------------------------------------- packing


@pytest.mark.parametrize("impl, norm, position", [
    ("xla", "pre", "learned"),
    ("einsum", "post", "learned"),
    ("xla", "pre", "sinusoidal"),
])
def test_packed_documents_are_isolated(impl, norm, position):
  """Two packed documents + padding behave exactly like each document on its own."""
  forward = forward_fn(tiny_config(attention_impl=impl, norm=norm, position=position))
  doc1, doc2 = [5, 9, 13], [21, 34, 55]
  packed = (doc1 + doc2 + [7, 7], [1, 1, 1, 2, 2, 2, 0, 0], [0, 1, 2, 0, 1, 2, 0, 0])
  rows = [
      packed,
      (doc2 + [0] * 5, [1, 1, 1, 0, 0, 0, 0, 0], [0, 1, 2, 0, 0, 0, 0, 0]),  # doc 2 alone
      (doc1 + [0] * 5, [1, 1, 1, 0, 0, 0, 0, 0], [0, 1, 2, 0, 0, 0, 0, 0]),  # doc 1 alone
      ([1, 2, 3] + doc2 + [7, 7],) + packed[1:],  # doc 1 changed
      (doc1 + [1, 2, 3] + [7, 7],) + packed[1:],  # doc 2 changed
      (doc1 + doc2 + [60, 61],) + packed[1:],  # padding changed
  ]
  tokens, segments, positions = (np.array(column, np.int32) for column in zip(*rows))
  logits = np.asarray(forward(tokens, segments, positions))
  reference = logits[0]
  d1, d2 = slice(0, 3), slice(3, 6)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

  close(reference[d2], logits[1, 0:3])  # Document 2 packed == document 2 alone.
  close(reference[d1], logits[2, 0:3])  # Document 1 packed == document 1 alone.
  close(logits[3, d2], reference[d2])  # Changing document 1 leaves document 2 alone ...
  assert np.abs(logits[3, d1] - reference[d1]).max() > 1e-4  # ... and does change doc 1.
  close(logits[4, d1], reference[d1])  # Changing document 2 leaves document 1 alone ...
  assert np.abs(logits[4, d2] - reference[d2]).max() > 1e-4  # ... and does change doc 2.
  close(logits[5, :6], reference[:6])  # Padding tokens reach no real token.


# ---------------------------------------------------------------- attention vs NumPy


def numpy_attention(q_BLHD, k_BSKD, v_BSKD, mask_B1LS):
  """softmax(QK^T / sqrt(D) + mask) V in float64, kv heads repeated for GQA."""
  q, k, v = (np.asarray(a, np.float64) for a in (q_BLHD, k_BSKD, v_BSKD))
  groups = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
  logits_BHLS = np.einsum("blhd,bshd->bhls", q, k) / math.sqrt(q.shape[-1])
  logits_BHLS = np.where(np.asarray(mask_B1LS), logits_BHLS, -np.inf)
  logits_BHLS -= logits_BHLS.max(axis=-1, keepdims=True)
  probs = np.exp(logits_BHLS)
  probs /= probs.sum(axis=-1, keepdims=True)
  return np.einsum("bhls,bshd->blhd", probs, v)


def _masks():
  """Masks from make_attention_mask: causal, and causal / bidirectional over packed rows."""
  plain = np.ones((2, 6), np.int32)
  packed = np.array([[1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 2, 2]], np.int32)
  return {
      "causal": attention.make_attention_mask(plain, plain, causal=True),
      "segments": attention.make_attention_mask(packed, packed, causal=True),
      "segments_bidirectional": attention.make_attention_mask(packed, packed, causal=False),
  }


@pytest.mark.parametrize("num_kv_heads", (4, 2, 1))
@pytest.mark.parametrize("mask_name", ("causal", "segments", "segments_bidirectional"))
def test_einsum_attention_matches_numpy(mask_name, num_kv_heads):
  mask = _masks()[mask_name]
  B, L, H, D = 2, 6, 4, 8
  rng = np.random.default_rng(0)
  q = rng.normal(size=(B, L, H, D)).astype(np.float32)
  k = rng.normal(size=(B, L, num_kv_heads, D)).astype(np.float32)
  v = rng.normal(size=(B, L, num_kv_heads, D)).astype(np.float32)
  out = attention.einsum_attention(q, k, v, mask)
  assert out.shape == (B, L, H, D)
  np.testing.assert_allclose(out, numpy_attention(q, k, v, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_kv_heads", (4, 2))
@pytest.mark.parametrize("mask_name", ("causal", "segments"))
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_multi_head_attention_module_matches_numpy(impl, mask_name, num_kv_heads):
  """The whole module (projections + attention + output) vs NumPy, incl. GQA."""
  cfg = tiny_config(attention_impl=impl, num_kv_heads=num_kv_heads)
  mask = _masks()[mask_name]
  B, L = mask.shape[0], mask.shape[2]
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, L, cfg.d_model)).astype(np.float32)
  module = attention.MultiHeadAttention(cfg)
  shapes = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), x, x, mask)["params"])
  # Random (not zero) biases and large weights so attention is far from uniform.
  params = jax.tree.map(lambda s: (0.3 * rng.normal(size=s.shape)).astype(np.float32), shapes)
  out = module.apply({"params": params}, x, x, mask)

  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x64 = x.astype(np.float64)
  project = lambda name: np.einsum("ble,ehd->blhd", x64, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = project("query"), project("key"), project("value")
  assert q.shape[2] == cfg.num_heads and k.shape[2] == num_kv_heads
  heads = numpy_attention(q, k, v, mask)
  expected = np.einsum("blhd,hde->ble", heads, p["out"]["kernel"]) + p["out"]["bias"]
  np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------- masks


@pytest.mark.parametrize("num_heads,num_kv_heads,bias", [(4, 4, True), (4, 2, True), (4, 2, False)])
def test_joined_qkv_is_the_three_projections_and_their_autodiff(num_heads, num_kv_heads, bias):
  """Three matmuls forward, the joined kernel's two backward: the same values and
  gradients (float32; summation order aside) as autodiff of the three projections."""
  rng = np.random.default_rng(0)
  B, L, E, D = 2, 5, 16, 8
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  x = normal(B, L, E)
  shapes = ((num_heads, D), (num_kv_heads, D), (num_kv_heads, D))
  kernels = tuple(normal(E, *s) for s in shapes)
  biases = tuple(normal(*s) for s in shapes) if bias else (None,) * 3
  equations = ("BLE,EHD->BLHD", "BLE,EKD->BLKD", "BLE,EKD->BLKD")

  def separate(x, kernels, biases):
    return tuple(jnp.einsum(eq, x, k) + (0.0 if b is None else b[None, None])
                 for eq, k, b in zip(equations, kernels, biases))

  joined = lambda x, kernels, biases: attention.joined_qkv(x, kernels, biases, jnp.float32)
  loss = lambda f: lambda *args: sum(jnp.sum(jnp.sin(y) * (i + 1))
                                     for i, y in enumerate(f(*args)))
  for a, b in zip(separate(x, kernels, biases), joined(x, kernels, biases)):
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
  expected = jax.grad(loss(separate), argnums=(0, 1, 2))(x, kernels, biases)
  got = jax.grad(loss(joined), argnums=(0, 1, 2))(x, kernels, biases)
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_joined_qkv_adds_its_biases_to_the_float32_product_before_rounding():
  """In bfloat16 each projection is (x @ kernel accumulated in float32 + bias in float32),
  rounded once: the form XLA's GPU compiler fuses into the matmul (attention.biased_product);
  adding a bias rounded to bfloat16 to a rounded product gives other numbers."""
  rng = np.random.default_rng(1)
  B, L, E, H, D = 2, 16, 64, 4, 16
  x = jnp.asarray(rng.normal(size=(B, L, E)), jnp.bfloat16)
  kernels = tuple(jnp.asarray(rng.normal(size=(E, H, D)), jnp.float32) for _ in range(3))
  biases = tuple(jnp.asarray(3.0 * rng.normal(size=(H, D)), jnp.float32) for _ in range(3))
  got = attention.joined_qkv(x, kernels, biases, jnp.bfloat16)
  for y, kernel, bias in zip(got, kernels, biases):
    assert y.dtype == jnp.bfloat16
    product = jnp.einsum("ble,ehd->blhd", x, kernel.astype(jnp.bfloat16),
                         preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(y, np.float32),
                                  np.asarray((product + bias[None, None]).astype(jnp.bfloat16),
                                             np.float32))
    twice = product.astype(jnp.bfloat16) + bias.astype(jnp.bfloat16)[None, None]
    assert np.any(np.asarray(twice, np.float32) != np.asarray(y, np.float32))


def test_make_attention_mask_causal_and_segments():
  segments = np.array([[1, 1, 2, 2, 0]], np.int32)
  causal = attention.make_attention_mask(segments, segments, causal=True)
  assert causal.shape == (1, 1, 5, 5) and causal.dtype == jnp.bool_
  expected_causal = np.array([
      [1, 0, 0, 0, 0],
      [1, 1, 0, 0, 0],
      [0, 0, 1, 0, 0],
      [0, 0, 1, 1, 0],
      [0, 0, 0, 0, 1],
  ], bool)
  np.testing.assert_array_equal(causal[0, 0], expected_causal)

  bidirectional = attention.make_attention_mask(segments, segments, causal=False)
  expected_bidirectional = np.array([
      [1, 1, 0, 0, 0],
      [1, 1, 0, 0, 0],
      [0, 0, 1, 1, 0],
      [0, 0, 1, 1, 0],
      [0, 0, 0, 0, 1],
  ], bool)
  np.testing.assert_array_equal(bidirectional[0, 0], expected_bidirectional)


def test_make_attention_mask_uses_positions_and_batch_rows():
  segments = np.array([[1, 1, 1], [1, 1, 0]], np.int32)
  positions = np.array([[2, 0, 1], [0, 1, 0]], np.int32)
  mask = attention.make_attention_mask(segments, segments, causal=True,
                                       q_positions=positions, kv_positions=positions)
  expected = np.array([
      [[1, 1, 1],  # Position 2 sees positions 2, 0, 1.
       [0, 1, 0],  # Position 0 sees only itself.
       [0, 1, 1]],  # Position 1 sees 0 and 1.
      [[1, 0, 0],
       [1, 1, 0],
       [0, 0, 1]],
  ], bool)
  np.testing.assert_array_equal(mask[:, 0], expected)


def test_make_attention_mask_cross_lengths():
  q_segments = np.array([[1, 2]], np.int32)
  kv_segments = np.array([[1, 1, 2, 0]], np.int32)
  mask = attention.make_attention_mask(q_segments, kv_segments, causal=False)
  assert mask.shape == (1, 1, 2, 4)
  np.testing.assert_array_equal(mask[0, 0], np.array([[1, 1, 0, 0], [0, 0, 1, 0]], bool))


# ---------------------------------------------------------------- parameters


def _abstract_variables(cfg: ModelConfig):
  model = make_model(cfg)
  tokens = jax.ShapeDtypeStruct((1, LENGTH), jnp.int32)
  return jax.eval_shape(model.init, jax.random.key(0), tokens, tokens, tokens)


GPT2_SMALL_PARAMS = 124_439_808  # GPT-2 small (124M) at its vocabulary of 50,257.


@pytest.mark.parametrize("vocab_size", [50257, None], ids=["gpt2_vocab", "preset_vocab"])
def test_gpt2_small_parameter_count(vocab_size):
  """Counted from abstract shapes (jax.eval_shape): nothing is materialised."""
  config = gpt_small.get_config()
  if vocab_size is not None:
    config.model.vocab_size = vocab_size
  cfg = dataclasses.replace(ModelConfig.from_config(config.model), deterministic=True)
  abstract = nn.unbox(_abstract_variables(cfg)["params"])
  count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(abstract))
  # Only the (tied) token embedding depends on the vocabulary: vocab x d_model.
  assert count == GPT2_SMALL_PARAMS - (50257 - cfg.vocab_size) * cfg.d_model
  if vocab_size == 50257:
    assert count == GPT2_SMALL_PARAMS


def _flat_specs_and_shapes(cfg: ModelConfig):
  abstract = _abstract_variables(cfg)["params"]
  specs = nn.get_partition_spec(abstract)
  shapes = nn.unbox(abstract)
  flat_specs = {jax.tree_util.keystr(path): spec for path, spec in
                jax.tree_util.tree_flatten_with_path(
                    specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[0]}
  flat_shapes = {jax.tree_util.keystr(path): leaf.shape for path, leaf in
                 jax.tree_util.tree_flatten_with_path(shapes)[0]}
  assert flat_specs.keys() == flat_shapes.keys()
  return flat_specs, flat_shapes


@pytest.mark.parametrize("overrides", [
    {},
    {"use_bias": False, "norm_type": "rmsnorm", "activation": "swiglu"},
    {"tie_embeddings": False, "num_kv_heads": 2, "norm": "post", "position": "sinusoidal"},
], ids=["base", "rmsnorm_swiglu_nobias", "untied_gqa_postnorm"])
def test_every_param_has_full_rank_logical_axes(overrides):
  specs, shapes = _flat_specs_and_shapes(tiny_config(**overrides))
  assert len(specs) > 10
  for path, spec in specs.items():
    assert len(spec) == len(shapes[path]), f"{path}: spec {spec} for shape {shapes[path]}"
    assert all(name in LOGICAL_AXES for name in spec), f"{path}: {spec}"


def test_expected_partition_specs():
  cfg = tiny_config(tie_embeddings=False, num_kv_heads=2, activation="swiglu")
  specs, shapes = _flat_specs_and_shapes(cfg)
  P = jax.sharding.PartitionSpec
  E, H, K, D, F = cfg.d_model, cfg.num_heads, 2, cfg.head_dim, cfg.mlp_dim
  expected = {
      "['block_0']['self_attention']['query']['kernel']": (P("embed", "heads", "head_dim"),
                                                           (E, H, D)),
      "['block_0']['self_attention']['query']['bias']": (P("heads", "head_dim"), (H, D)),
      "['block_1']['self_attention']['key']['kernel']": (P("embed", "kv_heads", "head_dim"),
                                                         (E, K, D)),
      "['block_1']['self_attention']['value']['kernel']": (P("embed", "kv_heads", "head_dim"),
                                                           (E, K, D)),
      "['block_0']['self_attention']['out']['kernel']": (P("heads", "head_dim", "embed"),
                                                         (H, D, E)),
      "['block_0']['self_attention']['out']['bias']": (P("embed"), (E,)),
      "['block_0']['mlp']['wi']['kernel']": (P("embed", "mlp"), (E, F)),
      "['block_0']['mlp']['wi_gate']['kernel']": (P("embed", "mlp"), (E, F)),
      "['block_0']['mlp']['wi']['bias']": (P("mlp"), (F,)),
      "['block_0']['mlp']['wo']['kernel']": (P("mlp", "embed"), (F, E)),
      "['block_0']['mlp_norm']['scale']": (P("embed"), (E,)),
      "['embedder']['token_embed']['embedding']": (P("vocab", "embed"), (VOCAB, E)),
      "['embedder']['position_embed']": (P("length", "embed"), (cfg.max_len, E)),
      "['final_norm']['scale']": (P("embed"), (E,)),
      "['lm_head']['kernel']": (P("embed", "vocab"), (E, VOCAB)),
  }
  for path, (spec, shape) in expected.items():
    assert specs[path] == spec, path
    assert shapes[path] == shape, path


# ---------------------------------------------------------------- positions


def test_sinusoidal_table_matches_paper_formula():
  max_len, d_model = 50, 16
  table = sinusoidal_table(max_len, d_model)
  assert table.shape == (max_len, d_model)
  for pos in (0, 1, 7, 49):
    for i in range(d_model // 2):
      angle = pos / (10000.0 ** (2 * i / d_model))
      assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6), (pos, i)
      assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6), (pos, i)


# ---------------------------------------------------------------- output dtype


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_logits_are_float32_with_bfloat16_compute(tie_embeddings):
  cfg = tiny_config(dtype="bfloat16", tie_embeddings=tie_embeddings)
  model = make_model(cfg)
  tokens, segments, positions = single_document_inputs()
  logits = jax.eval_shape(
      lambda: model.apply(model.init(jax.random.key(0), tokens, segments, positions),
                          tokens, segments, positions))
  assert logits.shape == (2, LENGTH, VOCAB)
  assert logits.dtype == jnp.float32


@pytest.mark.parametrize("tie", [True, False])
def test_lm_head_is_a_compute_dtype_product_with_float32_accumulation(tie):
  """Issue 31: the [B, L, V] product runs at the accelerator's bfloat16 rate, its logits
  come out float32 (not rounded to bfloat16), and a float32 model is unchanged."""
  cfg = tiny_config(tie_embeddings=tie, dtype="bfloat16")
  model = make_model(cfg)
  tokens = jnp.ones((2, 8), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), tokens, tokens, jnp.broadcast_to(jnp.arange(8), (2, 8)))
  jaxpr = jax.make_jaxpr(model.apply)(params, tokens, tokens,
                                      jnp.broadcast_to(jnp.arange(8), (2, 8)))
  heads = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"
           and e.outvars[0].aval.shape == (2, 8, cfg.vocab_size)]
  assert len(heads) == 1, heads
  assert [v.aval.dtype for v in heads[0].invars] == [jnp.bfloat16, jnp.bfloat16]
  assert heads[0].outvars[0].aval.dtype == jnp.float32
  logits = model.apply(params, tokens, tokens, jnp.broadcast_to(jnp.arange(8), (2, 8)))
  assert logits.dtype == jnp.float32
