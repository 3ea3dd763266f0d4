"""The three topologies: attention reach, packing, scan/remat equivalence, every axis trains.

Every model is configs/base.py shrunk to vocab 64, d_model 32, 2 layers, 4 heads,
mlp 64, max_len 16. Parameters are drawn with NumPy in the shapes `model.init` would
make (compiling init costs seconds on a CPU; test_train covers the initializers), and
every program is compiled without XLA's LLVM optimisations (`compile_fast`), which
otherwise dominate the run time of this file.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import linen as nn
from jax.flatten_util import ravel_pytree

from configs import base
from transformer.training import metrics
from transformer.model import objectives
from transformer.config.errors import ConfigError
from transformer.config.model import ACTIVATIONS, ModelConfig, POSITIONS, objective_of
from transformer.config.validation import validate
from transformer.model.layers import scanned_to_unrolled, unrolled_to_scanned
from transformer.model.models import ARCHITECTURES, ClassificationHead, Embedder, make_model

jax.config.update("jax_numpy_rank_promotion", "raise")

VOCAB, D_MODEL, MAX_LEN = 64, 32, 16
ARCHS = tuple(ARCHITECTURES)  # decoder, encoder, encoder_decoder
HEAD_OF = {"decoder": "lm", "encoder": "mlm", "encoder_decoder": "lm"}
BOS, MASK = 1, VOCAB - 1

# ---------------------------------------------------------------- helpers

# These programs are tiny: they run in milliseconds, while XLA's LLVM passes and fusion
# emitters take seconds per compile on a CPU. The math is the same, only less optimised.
_FAST_CPU_COMPILE = {"xla_backend_optimization_level": 0,
                     "xla_llvm_disable_expensive_passes": True,
                     "xla_cpu_use_fusion_emitters": False}


def compile_fast(fn, *args):
  """jax.jit(fn) compiled for `args`, without the expensive CPU backend passes."""
  lowered = jax.jit(fn).lower(*args)
  return lowered.compile(_FAST_CPU_COMPILE if jax.default_backend() == "cpu" else None)


def experiment_config(arch: str = "decoder", **model_overrides) -> ml_collections.ConfigDict:
  """configs/base.py shrunk to test size, with `arch`'s natural head."""
  config = base.get_config()
  config.model.update(arch=arch, head=HEAD_OF[arch], vocab_size=VOCAB, d_model=D_MODEL,
                      num_layers=2, num_heads=4, mlp_dim=64, max_len=MAX_LEN, dtype="float32")
  config.model.update(**model_overrides)
  config.data.seq_len = MAX_LEN
  if config.model.head == "classification":
    config.data.label_key = "label"
  return config


def model_config(arch: str = "decoder", *, deterministic: bool = True,
                 **model_overrides) -> ModelConfig:
  """The validated, frozen ModelConfig of experiment_config(arch, **model_overrides)."""
  config = experiment_config(arch, **model_overrides)
  validate(config)
  return dataclasses.replace(ModelConfig.from_config(config.model), deterministic=deterministic)


def objective(cfg: ModelConfig) -> str:
  return objective_of(cfg.arch, cfg.head)


def positions_of(segment_ids: np.ndarray) -> np.ndarray:
  """Positions restarting at 0 in every segment (padding gets 0)."""
  positions = np.zeros_like(segment_ids)
  for row, segments in enumerate(segment_ids):
    for i in range(1, len(segments)):
      same = segments[i] == segments[i - 1] and segments[i] > 0
      positions[row, i] = positions[row, i - 1] + 1 if same else 0
  return positions


def lm_batch(tokens, segment_ids) -> dict[str, np.ndarray]:
  """Model inputs of a decoder or encoder: tokens, segment ids, positions."""
  segment_ids = np.asarray(segment_ids, np.int32)
  return {"inputs": np.asarray(tokens, np.int32), "segment_ids": segment_ids,
          "positions": positions_of(segment_ids)}


def seq2seq_batch(sources, source_segments, decoder_inputs, target_segments):
  """Model inputs of an encoder-decoder."""
  source_segments = np.asarray(source_segments, np.int32)
  target_segments = np.asarray(target_segments, np.int32)
  return {"inputs": np.asarray(sources, np.int32), "inputs_segment_ids": source_segments,
          "inputs_positions": positions_of(source_segments),
          "decoder_inputs": np.asarray(decoder_inputs, np.int32),
          "targets_segment_ids": target_segments,
          "targets_positions": positions_of(target_segments)}


def random_params(model: nn.Module, batch, seed: int = 0):
  """Parameters drawn with NumPy in the shapes `model.init` would make.

  Biases are nonzero and norm scales are not all one, so every parameter takes part.
  """
  inputs = objectives.model_inputs(objective(model.config), batch)
  shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"])
  rng = np.random.default_rng(seed)

  def draw(path, shape):
    noise = rng.normal(size=shape.shape).astype(np.float32)
    return 1.0 + 0.1 * noise if path[-1].key == "scale" else 0.1 * noise

  return jax.tree_util.tree_map_with_path(draw, shapes)


def logits_fn(model: nn.Module, batch):
  """params -> logits of `model` on `batch`."""
  inputs = objectives.model_inputs(objective(model.config), batch)
  return lambda params: model.apply({"params": params}, *inputs)


def embedding_jacobians(model: nn.Module, params, batch):
  """Logits and |d readout(logits[b, t]) / d embedding_output[c, s]| per embedder.

  A zero float delta is added to each embedder's output (nn.intercept_methods), so the
  model can be differentiated with respect to its integer inputs. Returns (logits
  [B, L, V], {embedder name: norms [B, L, B, S]}).
  """
  inputs = objectives.model_inputs(objective(model.config), batch)
  # A fixed random readout so every vocabulary entry contributes to the scalar.
  readout_V = np.random.default_rng(1).normal(size=VOCAB).astype(np.float32)
  names = (("source_embedder", "inputs"), ("target_embedder", "decoder_inputs"))
  if model.config.arch != "encoder_decoder":
    names = (("embedder", "inputs"),)
  deltas = {name: jnp.zeros(batch[key].shape + (D_MODEL,)) for name, key in names}

  def logits_with(deltas):
    def add_delta(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if isinstance(context.module, Embedder) and context.method_name == "__call__":
        out = out + deltas[context.module.name]
      return out

    with nn.intercept_methods(add_delta):
      return model.apply({"params": params}, *inputs)

  def logits_and_norms(deltas):
    jac = jax.jacrev(lambda d: logits_with(d) @ readout_V)(deltas)
    return logits_with(deltas), {k: jnp.linalg.norm(v, axis=-1) for k, v in jac.items()}

  logits, norms = compile_fast(logits_and_norms, deltas)(deltas)
  return np.asarray(logits), {k: np.asarray(v) for k, v in norms.items()}


def assert_reach(norms_BLBS, reachable_BLS, what):
  """At real positions gradient norms are > 0 exactly where `reachable`, bitwise 0
  elsewhere and across rows (padding queries, which reach nothing real, are skipped)."""
  B, L = reachable_BLS.shape[:2]
  for b in range(B):
    for t in range(L):
      if not reachable_BLS[b, t].any():
        continue
      row = norms_BLBS[b, t, b]
      np.testing.assert_array_equal(row[~reachable_BLS[b, t]], 0.0,
                                    err_msg=f"{what}: row {b} position {t} sees {row}")
      assert np.all(row[reachable_BLS[b, t]] > 1e-7), (what, b, t, row)
      np.testing.assert_array_equal(np.delete(norms_BLBS[b, t], b, axis=0), 0.0,
                                    err_msg=f"{what}: rows of a batch interact")


def same_segment(q_segments, kv_segments):
  """[B, L, S]: real query and key of the same segment."""
  q, kv = np.asarray(q_segments), np.asarray(kv_segments)
  return (q[:, :, None] == kv[:, None, :]) & (q[:, :, None] > 0)


def close(a, b, **kwargs):
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, **kwargs)


def changed(a, b):
  return np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-4


# ---------------------------------------------------------------- fixed batches


def random_tokens(shape, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(2, VOCAB - 1, shape).astype(np.int32)


# Row 0: one document and padding; row 1: two packed documents.
ENCODER_SEGMENTS = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 2, 2, 2, 2, 2]], np.int32)
ENCODER_BATCH = lm_batch(random_tokens(ENCODER_SEGMENTS.shape, 0), ENCODER_SEGMENTS)
# Pair k of a row: source segment k -> target segment k.
SOURCE_SEGMENTS = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 2, 2, 2, 2, 0]], np.int32)
TARGET_SEGMENTS = np.array([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 2, 2, 2, 2]], np.int32)
SEQ2SEQ_BATCH = seq2seq_batch(random_tokens(SOURCE_SEGMENTS.shape, 1), SOURCE_SEGMENTS,
                              random_tokens(TARGET_SEGMENTS.shape, 2), TARGET_SEGMENTS)


def _pattern_rows(seed: int, batch: int, length: int, low: int, high: int) -> np.ndarray:
  """Each row repeats its own short random pattern (period 3 to 5)."""
  rng = np.random.default_rng(seed)
  rows = []
  for row in range(batch):
    period = 3 + row % 3
    rows.append(np.resize(rng.integers(low, high, period), length))
  return np.stack(rows).astype(np.int32)


def _make_training_batches(batch: int = 4, length: int = MAX_LEN) -> dict:
  # Row 2 packs two documents, row 3 ends in padding: the real masks are exercised.
  segments = np.ones((batch, length), np.int32)
  segments[2, length // 2:] = 2
  segments[3, -4:] = 0
  real = segments > 0

  # Decoder: next token of a repeating pattern.
  sequence = _pattern_rows(0, batch, length + 1, 2, VOCAB - 1)
  causal = lm_batch(np.where(real, sequence[:, :-1], 0), segments)
  causal.update(targets=sequence[:, 1:], weights=real.astype(np.float32))

  # Encoder: recover every fourth token of a repeating pattern from the mask token.
  pattern = _pattern_rows(1, batch, length, 2, VOCAB - 1)
  masked = (np.arange(length)[None] + np.arange(batch)[:, None]) % 4 == 0
  mlm = lm_batch(np.where(real, np.where(masked, MASK, pattern), 0), segments)
  mlm.update(targets=pattern, weights=(masked & real).astype(np.float32))

  # Encoder-decoder: the target is the source reversed, pair by pair.
  source = np.where(real, np.random.default_rng(2).integers(2, 20, (batch, length)), 0)
  target = np.zeros_like(source)
  for row in range(batch):
    for segment in np.unique(segments[row][segments[row] > 0]):
      index = np.flatnonzero(segments[row] == segment)
      target[row, index] = source[row, index[::-1]]
  positions = positions_of(segments)
  decoder_inputs = np.where(positions == 0, BOS, np.roll(target, 1, axis=1))
  seq2seq = seq2seq_batch(source, segments, np.where(real, decoder_inputs, 0), segments)
  seq2seq.update(targets=target.astype(np.int32), weights=real.astype(np.float32))
  return {"causal_lm": causal, "masked_lm": mlm, "seq2seq": seq2seq}


# With targets and weights, one per objective (see test_every_axis_value_trains).
TRAINING_BATCHES = _make_training_batches()


def training_batch(obj: str) -> dict[str, np.ndarray]:
  return TRAINING_BATCHES[obj]


# Every dropout on (attention-probability dropout needs the einsum attention).
DROPOUT = dict(embed_dropout=0.1, residual_dropout=0.1, mlp_dropout=0.1,
               attention_dropout=0.1, attention_impl="einsum")


# ---------------------------------------------------------------- encoder reach


@pytest.mark.parametrize("position, norm", [("learned", "pre"), ("rope", "post"),
                                            ("relative", "pre"), ("alibi", "post")])
def test_encoder_is_bidirectional_within_segments(position, norm):
  """Each real position's logits depend on every token of its segment, before and after
  it, and on nothing else: not on padding, another packed document or another row."""
  model = make_model(model_config("encoder", position=position, norm=norm))
  _, norms = embedding_jacobians(model, random_params(model, ENCODER_BATCH), ENCODER_BATCH)
  assert_reach(norms["embedder"], same_segment(ENCODER_SEGMENTS, ENCODER_SEGMENTS),
               f"encoder/{position}")


# ---------------------------------------------------------------- encoder-decoder reach


@pytest.mark.parametrize("position, norm, impl", [
    ("learned", "post", "xla"),
    ("rope", "pre", "einsum"),
    ("relative", "post", "xla"),
])
def test_encoder_decoder_reach_through_gradients(position, norm, impl):
  """Target position t sees targets s <= t of its own pair, and all of its pair's source.

  d(logits at t)/d(target embedding at s) is bitwise zero for s > t, for other packed
  pairs and for padding; d(logits at t)/d(source embedding at s) is nonzero for every
  real source token of the same pair and bitwise zero for the other pair's source and
  for source padding (the cross mask).
  """
  cfg = model_config("encoder_decoder", position=position, norm=norm, attention_impl=impl)
  model = make_model(cfg)
  _, norms = embedding_jacobians(model, random_params(model, SEQ2SEQ_BATCH), SEQ2SEQ_BATCH)
  L = TARGET_SEGMENTS.shape[1]
  causal_LS = np.tril(np.ones((L, L), bool))
  assert_reach(norms["target_embedder"],
               same_segment(TARGET_SEGMENTS, TARGET_SEGMENTS) & causal_LS[None],
               "decoder self-attention")
  assert_reach(norms["source_embedder"], same_segment(TARGET_SEGMENTS, SOURCE_SEGMENTS),
               "cross-attention")


def test_encoder_decoder_causal_by_perturbation():
  """Changing decoder input t leaves target logits < t bitwise unchanged and changes every
  logit >= t; changing one source token changes every target logit."""
  model = make_model(model_config("encoder_decoder", norm="post"))
  L = 8
  sources, targets = random_tokens((1, L), 3), random_tokens((1, L), 4)
  rows = np.repeat(targets, L + 2, axis=0)
  for t in range(L):
    rows[t + 1, t] = (rows[t + 1, t] + 1 + t) % VOCAB
  source_rows = np.repeat(sources, L + 2, axis=0)
  source_rows[L + 1, 3] = (source_rows[L + 1, 3] + 7) % VOCAB
  ones = np.ones_like(rows)
  batch = seq2seq_batch(source_rows, ones, rows, ones)
  params = random_params(model, batch)
  logits = np.asarray(compile_fast(logits_fn(model, batch), params)(params))
  reference = logits[0]
  for t in range(L):
    np.testing.assert_array_equal(logits[t + 1, :t], reference[:t],
                                  err_msg=f"changing decoder input {t} changed an earlier logit")
    diff = np.abs(logits[t + 1, t:] - reference[t:]).max(axis=-1)
    assert np.all(diff > 1e-5), (t, diff)
  diff = np.abs(logits[L + 1] - reference).max(axis=-1)
  assert np.all(diff > 1e-5), ("the decoder ignores the source", diff)


@pytest.mark.parametrize("share_embeddings", [False, True])
def test_encode_then_decode_equals_the_full_call(share_embeddings):
  """EncoderDecoder.encode once + .decode is the forward pass (what cached decoding uses)."""
  model = make_model(model_config("encoder_decoder", share_embeddings=share_embeddings))
  batch = SEQ2SEQ_BATCH
  params = random_params(model, batch)
  full = compile_fast(logits_fn(model, batch), params)(params)

  def encode_decode(params):
    variables = {"params": params}
    encoded = model.apply(variables, batch["inputs"], batch["inputs_segment_ids"],
                          batch["inputs_positions"], method=model.encode)
    logits = model.apply(variables, batch["decoder_inputs"], batch["targets_segment_ids"],
                         batch["targets_positions"], encoded, batch["inputs_segment_ids"],
                         method=model.decode)
    return encoded, logits

  encoded, logits = compile_fast(encode_decode, params)(params)
  assert encoded.shape == batch["inputs"].shape + (D_MODEL,)
  assert logits.shape == batch["decoder_inputs"].shape + (VOCAB,) and logits.dtype == jnp.float32
  close(logits, full)
  assert ("target_embedder" in params) != share_embeddings


# ---------------------------------------------------------------- packing and padding


@pytest.mark.parametrize("position, impl", [("learned", "xla"), ("relative", "einsum"),
                                            ("alibi", "xla")])
def test_encoder_packed_documents_are_isolated(position, impl):
  """Two packed documents + padding behave exactly like each document on its own."""
  model = make_model(model_config("encoder", position=position, attention_impl=impl))
  doc1, doc2 = [5, 9, 13], [21, 34, 55, 8]
  packed_segments = [1, 1, 1, 2, 2, 2, 2, 0]
  alone = lambda doc: (doc + [0] * (8 - len(doc)), [1] * len(doc) + [0] * (8 - len(doc)))
  rows = [
      (doc1 + doc2 + [7], packed_segments),
      alone(doc1),
      alone(doc2),
      ([1, 2, 3] + doc2 + [7], packed_segments),  # doc 1 changed
      (doc1 + [1, 2, 3, 4] + [7], packed_segments),  # doc 2 changed
      (doc1 + doc2 + [60], packed_segments),  # padding changed
  ]
  batch = lm_batch(*(np.array(column) for column in zip(*rows)))
  params = random_params(model, batch)
  logits = np.asarray(compile_fast(logits_fn(model, batch), params)(params))
  reference = logits[0]
  d1, d2 = slice(0, 3), slice(3, 7)
  close(reference[d1], logits[1, 0:3])  # Document 1 packed == document 1 alone.
  close(reference[d2], logits[2, 0:4])  # Document 2 packed == document 2 alone.
  close(logits[3, d2], reference[d2])  # Changing document 1 leaves document 2 alone ...
  assert changed(logits[3, d1], reference[d1])  # ... and does change doc 1.
  close(logits[4, d1], reference[d1])
  assert changed(logits[4, d2], reference[d2])
  close(logits[5, :7], reference[:7])  # Padding reaches no real token.


@pytest.mark.parametrize("position, impl", [("learned", "xla"), ("rope", "einsum")])
def test_encoder_decoder_packed_pairs_are_isolated(position, impl):
  """Pair k's target sees only pair k's source; padding on either side changes nothing."""
  model = make_model(model_config("encoder_decoder", position=position, attention_impl=impl))
  s1, s2 = [5, 9, 13], [21, 34, 55, 8]
  t1, t2 = [40, 41], [42, 43, 44]
  S, L = 8, 6
  pad = lambda xs, n: xs + [0] * (n - len(xs))
  source_segments = [1, 1, 1, 2, 2, 2, 2, 0]
  target_segments = [1, 1, 2, 2, 2, 0]
  packed = (s1 + s2 + [7], source_segments, t1 + t2 + [9], target_segments)
  rows = [
      packed,
      (pad(s1, S), pad([1] * 3, S), pad(t1, L), pad([1] * 2, L)),  # pair 1 alone
      (pad(s2, S), pad([1] * 4, S), pad(t2, L), pad([1] * 3, L)),  # pair 2 alone
      (s1 + [1, 2, 3, 4] + [7],) + packed[1:],  # source 2 changed
      ([1, 2, 3] + s2 + [7],) + packed[1:],  # source 1 changed
      (packed[0], packed[1], t1 + [1, 2, 3] + [9], packed[3]),  # target 2 changed
      (s1 + s2 + [60],) + packed[1:],  # source padding changed
      (packed[0], packed[1], t1 + t2 + [61], packed[3]),  # target padding changed
  ]
  batch = seq2seq_batch(*(np.array(column) for column in zip(*rows)))
  params = random_params(model, batch)
  logits = np.asarray(compile_fast(logits_fn(model, batch), params)(params))
  reference = logits[0]
  p1, p2 = slice(0, 2), slice(2, 5)
  close(reference[p1], logits[1, 0:2])  # Pair 1 packed == pair 1 alone.
  close(reference[p2], logits[2, 0:3])  # Pair 2 packed == pair 2 alone.
  close(logits[3, p1], reference[p1])  # Source 2 changed: target 1 unchanged ...
  assert changed(logits[3, p2], reference[p2])  # ... target 2 changed.
  close(logits[4, p2], reference[p2])  # Source 1 changed: target 2 unchanged ...
  assert changed(logits[4, p1], reference[p1])  # ... target 1 changed.
  close(logits[5, p1], reference[p1])  # Target 2 changed: target 1 unchanged.
  close(logits[6, :5], reference[:5])  # Source padding reaches no target (cross mask).
  close(logits[7, :5], reference[:5])  # Target padding reaches no real target.
  assert np.all(np.isfinite(logits))


# ---------------------------------------------------------------- scanned vs unrolled


def _flat(tree):
  return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[0]}


def _specs(model, batch):
  inputs = objectives.model_inputs(objective(model.config), batch)
  return _flat(nn.get_partition_spec(
      jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"]))


@pytest.mark.parametrize("arch", ARCHS)
def test_scanned_and_unrolled_models_agree(arch):
  """Scanned params converted with scanned_to_unrolled give the unrolled model's outputs;
  unrolled_to_scanned inverts the conversion exactly; scanned specs lead with "layers"."""
  obj = objective_of(arch, HEAD_OF[arch])
  batch = training_batch(obj)
  scanned_cfg = model_config(arch, scan_layers=True, position="relative")
  scanned, unrolled = make_model(scanned_cfg), make_model(
      dataclasses.replace(scanned_cfg, scan_layers=False))
  params = random_params(scanned, batch)
  converted = scanned_to_unrolled(params, scanned_cfg.num_layers)

  # The converted tree is exactly the tree the unrolled model expects.
  inputs = objectives.model_inputs(obj, batch)
  expected = nn.unbox(jax.eval_shape(unrolled.init, jax.random.key(0), *inputs)["params"])
  assert (jax.tree.map(lambda x: (x.shape, x.dtype), converted)
          == jax.tree.map(lambda x: (x.shape, x.dtype), expected))

  out_scanned = compile_fast(logits_fn(scanned, batch), params)(params)
  out_unrolled = compile_fast(logits_fn(unrolled, batch), converted)(converted)
  close(out_unrolled, out_scanned)

  round_trip = unrolled_to_scanned(converted)
  assert jax.tree.structure(round_trip) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, round_trip, params)

  scanned_specs, unrolled_specs = _specs(scanned, batch), _specs(unrolled, batch)
  stacked = [path for path in scanned_specs if "['blocks']" in path]
  assert len(stacked) > 10
  for path, spec in scanned_specs.items():
    if "['blocks']" in path:
      assert spec[0] == "layers", (path, spec)
      assert tuple(spec[1:]) == tuple(
          unrolled_specs[path.replace("['blocks']", "['block_0']")]), path
    else:
      assert spec == unrolled_specs[path], path


def test_scanned_layers_are_initialised_independently():
  """split_rngs={"params": True}: the layers of a scanned stack do not share a draw."""
  cfg = model_config("decoder", scan_layers=True)
  batch = training_batch("causal_lm")
  model = make_model(cfg)
  inputs = objectives.model_inputs("causal_lm", batch)
  init = lambda key: nn.unbox(model.init(key, *inputs)["params"])
  kernel = compile_fast(init, jax.random.key(0))(jax.random.key(0))[
      "blocks"]["mlp"]["wi"]["kernel"]
  assert kernel.shape[0] == 2
  assert changed(kernel[0], kernel[1])


def test_encoder_decoder_with_unequal_depths_converts_per_stack():
  """With num_decoder_layers != num_layers each stack converts with its own depth."""
  cfg = model_config("encoder_decoder", scan_layers=True, num_decoder_layers=3)
  batch = training_batch("seq2seq")
  scanned, unrolled = make_model(cfg), make_model(dataclasses.replace(cfg, scan_layers=False))
  params = random_params(scanned, batch)
  converted = dict(params, encoder=scanned_to_unrolled(params["encoder"], 2),
                   decoder=scanned_to_unrolled(params["decoder"], 3))
  # One call, no depth given, splits each stack by its own depth.
  jax.tree.map(np.testing.assert_array_equal, scanned_to_unrolled(params), converted)
  assert sorted(k for k in converted["decoder"] if k.startswith("block_")) == [
      "block_0", "block_1", "block_2"]
  out_scanned = compile_fast(logits_fn(scanned, batch), params)(params)
  out_unrolled = compile_fast(logits_fn(unrolled, batch), converted)(converted)
  close(out_unrolled, out_scanned)


def test_scanned_to_unrolled_never_drops_or_invents_layers():
  """Without a depth each stack is split by its own; a depth that a stack lacks is an error."""
  params = {"encoder": {"blocks": {"w": jnp.arange(6.0).reshape(2, 3)}},
            "decoder": {"blocks": {"w": jnp.arange(9.0).reshape(3, 3)}}}
  with pytest.raises(ValueError, match=r"stack 'blocks' has \[3\] layers; expected 2"):
    scanned_to_unrolled(params, 2)
  converted = scanned_to_unrolled(params)
  assert sorted(converted["encoder"]) == ["block_0", "block_1"]
  assert sorted(converted["decoder"]) == ["block_0", "block_1", "block_2"]
  np.testing.assert_array_equal(converted["decoder"]["block_2"]["w"], [6.0, 7.0, 8.0])


# ---------------------------------------------------------------- remat


@functools.lru_cache(maxsize=None)
def _logits_and_grads(scan_layers: bool, remat: str):
  """Logits and parameter gradients of a decoder with residual dropout, fixed params and rng.

  The T5 bias and the sliding-window mask are computed once per stack and passed through
  remat and scan to every block in one StackInputs, with each layer's local flag.
  """
  cfg = model_config("decoder", deterministic=False, scan_layers=scan_layers, remat=remat,
                     position="relative", residual_dropout=0.1, sliding_window=3,
                     window_pattern="lg")
  batch = training_batch("causal_lm")
  model = make_model(cfg)
  forward = objectives.make_forward(model, "causal_lm")
  params = random_params(model, batch)

  def loss(params):
    logits, targets, weights, _ = forward(params, batch, rngs={"dropout": jax.random.key(3)})
    return metrics.loss_sums(logits, targets, weights)["objective_sum"], logits

  (_, logits), grads = compile_fast(jax.value_and_grad(loss, has_aux=True), params)(params)
  return logits, grads


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("remat", ["full", "dots", "dots_no_batch"])
def test_remat_changes_neither_outputs_nor_gradients(remat, scan_layers):
  """Rematerialisation is invisible to the math: same logits and gradients as
  remat="none" from the same params, and the recomputed forward draws the same dropout."""
  logits, grads = _logits_and_grads(scan_layers, remat)
  want_logits, want_grads = _logits_and_grads(scan_layers, "none")
  close(logits, want_logits)
  assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
  jax.tree.map(close, grads, want_grads)
  assert all(np.abs(g).max() > 0 for g in jax.tree.leaves(grads))


# ---------------------------------------------------------------- every axis value trains


TRAINING_STEPS = 10
# One block exercises every code path of an axis value; depth matters to these two.
DEPTH_AXES = ("scan_layers", "remat")

# Values that act inside attention or the stacks, where the topologies differ (causal or
# not, cross-attention, one stack or two), run on all three topologies.
PER_TOPOLOGY_AXES = {
    "norm": ("pre", "post"),
    "position": ("learned", "rope", "relative", "alibi"),
    "num_kv_heads": (4, 2, 1),  # MHA, GQA, MQA.
    "scan_layers": (False, True),
}
# The others (the embedder's absolute positions, the MLP, embeddings, dtypes, ...) are
# the same code in every topology: one topology per value, rotating through the three.
ROTATED_AXES = {
    "position": ("sinusoidal", "none"),
    "norm_type": ("layernorm", "rmsnorm"),
    "activation": ACTIVATIONS,
    "tie_embeddings": (True, False),
    "scale_embeddings": (False, True),
    "use_bias": (True, False),
    "attention_impl": ("xla", "einsum"),
    "dropout": (0.1,),
    "remat": ("full",),
    "dtype": ("bfloat16",),
}
assert set(PER_TOPOLOGY_AXES["position"] + ROTATED_AXES["position"]) == set(POSITIONS)


def _training_cases():
  """pytest params (arch, overrides). A value that resolves to base.py's defaults is that
  topology's baseline (pre-norm, layernorm, learned, gelu_tanh, MHA, tied, biases, xla,
  unrolled, float32), trained once."""
  candidates = [(f"baseline-{arch}", arch, {}) for arch in ARCHS]
  for axis, values in PER_TOPOLOGY_AXES.items():
    for value, arch in itertools.product(values, ARCHS):
      candidates.append((f"{axis}={value}-{arch}", arch, {axis: value}))
  arch_cycle = itertools.cycle(ARCHS)
  for axis, values in ROTATED_AXES.items():
    for value in values:
      overrides = DROPOUT if axis == "dropout" else {axis: value}
      candidates.append((f"{axis}={value}-{(arch := next(arch_cycle))}", arch, overrides))
  for value in (False, True):  # Source/target sharing exists only on the encoder-decoder.
    candidates.append((f"share_embeddings={value}-encoder_decoder", "encoder_decoder",
                       {"share_embeddings": value}))
  cases, seen = [], set()
  for case_id, arch, overrides in candidates:
    resolved = ModelConfig.from_config(experiment_config(arch, **overrides).model)
    if resolved not in seen:
      seen.add(resolved)
      cases.append(pytest.param(arch, overrides, id=case_id))
  return cases


@pytest.mark.parametrize("arch, overrides", _training_cases())
def test_every_axis_value_trains(arch, overrides):
  """Adam(1e-2) memorises a fixed structured batch: finite losses, final < 0.9 initial.

  The loss goes through the library's own path (objectives.make_forward ->
  metrics.loss_sums), with dropout active where the config has it.
  """
  depth = {} if DEPTH_AXES & overrides.keys() else {"num_layers": 1}
  cfg = model_config(arch, deterministic=False, **depth, **overrides)
  model = make_model(cfg)
  obj = objective(cfg)
  batch = training_batch(obj)
  flat, unravel = ravel_pytree(random_params(model, batch))
  forward = objectives.make_forward(model, obj)
  tx = optax.adam(1e-2)  # Elementwise: one flat vector is the same optimizer, fewer ops.

  def train(flat):
    def loss_fn(flat, rng):
      sums = metrics.loss_sums(*forward(unravel(flat), batch, rngs={"dropout": rng})[:3])
      return sums["objective_sum"] / sums["weight_sum"]

    def step(carry, rng):
      flat, opt_state = carry
      loss, grads = jax.value_and_grad(loss_fn)(flat, rng)
      updates, opt_state = tx.update(grads, opt_state, flat)
      return (optax.apply_updates(flat, updates), opt_state), loss

    rngs = jax.random.split(jax.random.key(0), TRAINING_STEPS)
    return jax.lax.scan(step, (flat, tx.init(flat)), rngs)[1]

  losses = np.asarray(compile_fast(train, flat)(flat))
  assert np.all(np.isfinite(losses)), losses
  assert losses[-1] < 0.9 * losses[0], losses


# ---------------------------------------------------------------- classification head


def random_params_of(module: nn.Module, *args):
  """Standard-normal parameters (seed 0) for `module` called on `args`."""
  shapes = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), *args)["params"])
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)


def _head_outputs(pooling: str, x_BLE, segment_ids_BL):
  cfg = model_config("encoder", head="classification", pooling="mean", num_classes=3)
  cfg = dataclasses.replace(cfg, pooling=pooling)  # "last" is rejected on an encoder.
  head = ClassificationHead(cfg)
  params = random_params_of(head, x_BLE, segment_ids_BL)
  return np.asarray(head.apply({"params": params}, x_BLE, segment_ids_BL)), params


@pytest.mark.parametrize("pooling", ["cls", "mean", "last"])
def test_classification_head_pooling(pooling):
  """cls = first token, mean = average of the real tokens, last = last real token;
  padded positions never matter."""
  segments = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]], np.int32)
  x = np.random.default_rng(0).normal(size=segments.shape + (D_MODEL,)).astype(np.float32)
  logits, params = _head_outputs(pooling, x, segments)
  assert logits.shape == (3, 3)
  lengths = (segments > 0).sum(axis=1)
  if pooling == "cls":
    pooled = x[:, 0]
  elif pooling == "mean":
    pooled = np.stack([x[b, :n].mean(axis=0) for b, n in enumerate(lengths)])
  else:
    pooled = np.stack([x[b, n - 1] for b, n in enumerate(lengths)])
  dense = params["classifier"]
  close(logits, pooled @ dense["kernel"] + dense["bias"])

  noisy = np.where((segments > 0)[..., None], x, 100.0 * x + 3.0).astype(np.float32)
  close(_head_outputs(pooling, noisy, segments)[0], logits)


@pytest.mark.parametrize("arch, pooling", [("encoder", "cls"), ("encoder", "mean"),
                                           ("decoder", "last"), ("decoder", "mean")])
def test_classification_models_ignore_padding(arch, pooling):
  """[B, C] logits; padded tokens change nothing, the last real token does."""
  model = make_model(model_config(arch, head="classification", pooling=pooling,
                                  num_classes=3))
  tokens = np.array([[5, 6, 7, 8, 0, 0]] * 3)
  tokens[1, 4:] = [50, 51]  # Padding changed.
  tokens[2, 3] = 9  # Last real token changed.
  batch = lm_batch(tokens, [[1, 1, 1, 1, 0, 0]] * 3)
  params = random_params(model, batch)
  logits = np.asarray(compile_fast(logits_fn(model, batch), params)(params))
  assert logits.shape == (3, 3)
  close(logits[1], logits[0])
  assert changed(logits[2], logits[0])


@pytest.mark.parametrize("arch, pooling", [("decoder", "cls"), ("decoder", ""),
                                           ("encoder", ""), ("encoder", "max"),
                                           ("encoder", "last")])
def test_invalid_pooling_is_rejected(arch, pooling):
  config = experiment_config(arch, head="classification", pooling=pooling)
  with pytest.raises(ConfigError, match=r"model\.pooling"):
    validate(config)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("arch, overrides, expected", [
    ("decoder", {"share_embeddings": True},
     [r"model\.share_embeddings", r"encoder_decoder"]),
    ("encoder", {"share_embeddings": True},
     [r"model\.share_embeddings", r"encoder_decoder"]),
    ("decoder", {"head": "mlm"}, [r"model\.head='mlm'", r"'classification'", r"'lm'"]),
    ("encoder", {"head": "lm"}, [r"model\.head='lm'", r"'classification'", r"'mlm'"]),
    ("encoder_decoder", {"head": "classification"}, [r"model\.head", r"\['lm'\]"]),
    ("decoder", {"position": "rope", "d_model": 36}, [r"model\.position='rope'",
                                                      r"even head_dim"]),
    ("encoder", {"position": "rope", "head_dim": 5}, [r"model\.position='rope'",
                                                      r"even head_dim"]),
    ("decoder", {"num_kv_heads": 3}, [r"model\.num_kv_heads=3", r"model\.num_heads=4"]),
    ("encoder_decoder", {"num_kv_heads": 8}, [r"model\.num_kv_heads=8",
                                              r"model\.num_heads=4"]),
], ids=["share_on_decoder", "share_on_encoder", "mlm_on_decoder", "lm_on_encoder",
        "classification_on_encoder_decoder", "rope_odd_derived_head_dim",
        "rope_odd_explicit_head_dim", "kv_heads_not_dividing", "kv_heads_above_heads"])
def test_invalid_combinations_name_the_field(arch, overrides, expected):
  config = experiment_config(arch, **overrides)
  with pytest.raises(ConfigError) as error:
    validate(config)
  for pattern in expected:
    assert re.search(pattern, str(error.value)), (pattern, str(error.value))


def test_objective_of_names_the_heads_of_a_topology():
  with pytest.raises(ConfigError, match=r"model\.arch='decoder' supports heads "
                                        r"\['classification', 'lm'\]"):
    objective_of("decoder", "mlm")


def test_rope_error_names_the_odd_head_dim():
  with pytest.raises(ConfigError, match=r"head_dim.*9|9.*head_dim"):
    validate(experiment_config("decoder", position="rope", d_model=36))
