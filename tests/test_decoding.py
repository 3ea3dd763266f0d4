"""Decoding: cached steps equal the full forward pass, and the searches are right.

Models are configs/base.py shrunk to d_model 32, 2 layers, 4 heads, max_len 16, with
NumPy-drawn weights (larger than the init's, so that outputs vary). Every program is
compiled without XLA's expensive CPU passes: they run in milliseconds and compiling
dominates this file's run time otherwise. The search algorithms are also checked on
hand-written logits functions whose beam-search answers are worked out by hand.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from configs import base
from transformer.inference import decoding
from transformer.config.model import ModelConfig
from transformer.config.validation import validate
from transformer.data.tokenizers.vocabularies import BOS_ID, EOS_ID, PAD_ID
from transformer.model.models import make_model

B, L, VOCAB, MAX_LEN = 2, 10, 64, 16
SMALL_VOCAB = 8  # Generation tests: eos (1 in 8) comes up within a few steps.

_FAST_CPU_COMPILE = {"xla_backend_optimization_level": 0,
                     "xla_llvm_disable_expensive_passes": True,
                     "xla_cpu_use_fusion_emitters": False}


def jit_fast(fn, **jit_kwargs):
  """jax.jit, compiled without the expensive CPU backend passes (same math)."""
  options = _FAST_CPU_COMPILE if jax.default_backend() == "cpu" else None
  return jax.jit(fn, compiler_options=options, **jit_kwargs)


_STATIC = ("config", "num_steps", "beam_size", "alpha", "temperature", "top_k", "top_p")
# pylint: disable=protected-access
_FAST_ENTRY_POINTS = {name: jit_fast(getattr(decoding, name).__wrapped__, static_argnames=_STATIC)
                      for name in ("_generate", "_generate_seq2seq")}
# pylint: enable=protected-access


@pytest.fixture(autouse=True)
def fast_decoding_compiles(monkeypatch):
  """The public generate functions, with their jitted cores compiled fast."""
  for name, fn in _FAST_ENTRY_POINTS.items():
    monkeypatch.setattr(decoding, name, fn)


def model_config(arch="decoder", **overrides) -> ModelConfig:
  config = base.get_config()
  config.model.update(arch=arch, head="lm", d_model=32, num_heads=4, mlp_dim=64,
                      num_layers=2, max_len=MAX_LEN, vocab_size=VOCAB, dtype="float32")
  config.model.update(**overrides)
  # Any tokenizer but SentencePiece, whose minimum vocabulary is far above these models'.
  config.data.update(seq_len=MAX_LEN, tokenizer="char")
  validate(config)
  return dataclasses.replace(ModelConfig.from_config(config.model), deterministic=True)


def tokens(seed=0, length=L, vocab=VOCAB, batch=B):
  ids = np.random.default_rng(seed).integers(4, vocab, (batch, length))
  return jnp.asarray(ids, jnp.int32)


def single_document(tokens_BL):
  return jnp.ones_like(tokens_BL), jnp.broadcast_to(jnp.arange(tokens_BL.shape[1]),
                                                    tokens_BL.shape)


@functools.lru_cache(maxsize=None)
def param_shapes(cfg: ModelConfig):
  t = jnp.zeros((1, 4), jnp.int32)
  args = (t,) + single_document(t)
  args = args * 2 if cfg.arch == "encoder_decoder" else args
  return nn.unbox(jax.eval_shape(make_model(cfg).init, jax.random.PRNGKey(0), *args)["params"])


def random_params(cfg: ModelConfig, seed: int = 0, scale: float = 0.3):
  """Parameters drawn with NumPy in the shapes `model.init` makes (no init compile)."""
  shapes = param_shapes(cfg)
  rng = np.random.default_rng(seed)

  def draw(path, shape):
    noise = rng.normal(size=shape.shape).astype(np.float32)
    return 1.0 + 0.1 * noise if path[-1].key == "scale" else scale * noise

  return jax.tree_util.tree_map_with_path(draw, shapes)


def right_pad(rows) -> jax.Array:
  width = max(map(len, rows))
  return jnp.asarray([list(r) + [PAD_ID] * (width - len(r)) for r in rows], jnp.int32)


def after_first_eos_is_pad(tokens_BT) -> np.ndarray:
  """What a decoder that stops each row at eos emits: everything after it is padding."""
  tokens_BT = np.array(tokens_BT)
  for row in tokens_BT:
    eos = np.flatnonzero(row == EOS_ID)
    if eos.size:
      row[eos[0] + 1:] = PAD_ID
  return tokens_BT


# ---------------------------------------------------------------- cached == full forward

DECODER_CASES = [dict(position=p) for p in ("learned", "sinusoidal", "rope", "relative",
                                            "alibi", "none")] + [
    dict(position="rope", scan_layers=True), dict(position="relative", scan_layers=True),
    dict(position="learned", num_kv_heads=2), dict(position="alibi", norm="post"),
    # Mixture of experts (dropless: a token's output depends on no other token's).
    dict(position="rope", mlp="moe", num_experts=4, experts_per_token=2),
    dict(position="rope", mlp="moe", num_experts=4, experts_per_token=2, scan_layers=True,
         moe_every=2, moe_offset=1, moe_shared_mlp_dim=16, moe_shared_gate=True),
]
ENCODER_DECODER_CASES = [dict(position=p) for p in ("learned", "sinusoidal", "rope",
                                                    "relative", "alibi", "none")] + [
    dict(position="rope", scan_layers=True),
    dict(position="relative", scan_layers=True, num_kv_heads=2),
    dict(position="rope", mlp="moe", num_experts=4, experts_per_token=2, scan_layers=True),
]


def case_id(overrides: dict) -> str:
  return "-".join(f"{k}={v}" for k, v in overrides.items())


def cached_decoder_logits(cfg, params, t, lengths, width: int, prefix: bool = False):
  """Prefill right-padded prompts (`lengths` tokens of `t`, padded to `width`), then one
  token of `t` per step, each row at its own positions: (prefill [B, width, V], steps
  [L - width, B, V]). With `prefix` the prompts are the prefix (Decoder's contract)."""
  model = decoding.decode_model(cfg)
  real_BP = jnp.arange(width)[None, :] < lengths[:, None]
  prompts_BP = jnp.where(real_BP, t[:, :width], PAD_ID)  # The padding must not matter.
  marks = lambda on: (on.astype(jnp.int32),) if prefix else ()
  prefill_BPV, variables = model.apply(
      {"params": params, "cache": decoding.init_cache(model, B)}, prompts_BP,
      *single_document(prompts_BP), *marks(real_BP), mutable=["cache"])

  def step(cache, j):
    positions_B1 = (lengths + j)[:, None]
    token_B1 = jnp.take_along_axis(t, positions_B1, axis=1)
    logits_B1V, variables = model.apply({"params": params, "cache": cache}, token_B1,
                                        jnp.ones_like(token_B1), positions_B1,
                                        *marks(jnp.zeros_like(token_B1)),
                                        mutable=["cache"])
    return variables["cache"], logits_B1V[:, 0]

  _, steps_JBV = jax.lax.scan(step, variables["cache"], jnp.arange(t.shape[1] - width))
  return prefill_BPV, steps_JBV


def assert_cached_equals_full(full, prefill, steps, lengths, width: int):
  for row, length in enumerate(lengths.tolist()):
    cached = np.concatenate([prefill[row, :length], steps[:, row]])
    np.testing.assert_allclose(cached, full[row, :length + L - width], atol=2e-5,
                               err_msg=f"row {row}")


# A prefix LM (Decoder's prefix_BL): the prompt is the prefix, bidirectional in itself.
PREFIX_CASES = [dict(position="rope"), dict(position="relative")]


@pytest.mark.parametrize("overrides,prefix", [(o, False) for o in DECODER_CASES]
                         + [(o, True) for o in PREFIX_CASES],
                         ids=lambda v: case_id(v) if isinstance(v, dict) else f"prefix={v}")
def test_cached_decoder_equals_full_forward(overrides, prefix):
  """Prefill right-padded prompts of lengths 3 and 5, then one token per step, each row
  at its own positions: every logit equals the full forward pass's. With `prefix` the
  prompts are the prefix (Decoder's decoding contract: prefilled in one call with
  prefix 1 on their real tokens, then causal steps), as in the full pass."""
  cfg = model_config("decoder", **overrides)
  t = tokens()
  lengths = jnp.asarray([3, 5])
  width = 5
  params = random_params(cfg)
  prefix_BL = (jnp.arange(L)[None, :] < lengths[:, None]).astype(jnp.int32)

  def full_and_cached(params):
    forward = lambda *p: make_model(cfg).apply({"params": params}, t, *single_document(t), *p)
    full_BLV = forward(prefix_BL) if prefix else forward()
    return (full_BLV, forward()) + cached_decoder_logits(cfg, params, t, lengths, width,
                                                          prefix=prefix)

  full, causal, prefill, steps = jit_fast(full_and_cached)(params)
  if prefix:  # The prefix reaches the output: the first token sees the rest of its prompt.
    assert np.abs(np.asarray(full[:, 0]) - np.asarray(causal[:, 0])).max() > 1e-3
  assert_cached_equals_full(full, prefill, steps, lengths, width)


@pytest.mark.parametrize("overrides", ENCODER_DECODER_CASES, ids=case_id)
def test_cached_encoder_decoder_equals_full_forward(overrides):
  """The first call caches the cross-attention keys/values; later steps get no encoder
  output at all, so they must come from the cache."""
  cfg = model_config("encoder_decoder", **overrides)
  source, target = tokens(0), tokens(1)
  seg, pos = single_document(source)
  source_seg = seg.at[1, -3:].set(0)  # Source padding must stay masked while decoding.
  params = random_params(cfg)

  def full_and_cached(params):
    full_BLV = make_model(cfg).apply({"params": params}, source, source_seg, pos, target,
                                     seg, pos)
    model = decoding.decode_model(cfg)
    encoded = model.apply({"params": params}, source, source_seg, pos, method="encode")
    empty = jnp.zeros((B, 0), jnp.int32)
    _, variables = model.apply({"params": params, "cache": decoding.init_cache(model, B)},
                               empty, empty, empty, encoded, source_seg, method="decode",
                               mutable=["cache"])

    def step(cache, i):
      token_B1 = jax.lax.dynamic_slice_in_dim(target, i, 1, axis=1)
      logits_B1V, variables = model.apply(
          {"params": params, "cache": cache}, token_B1, jnp.ones_like(token_B1),
          jnp.full_like(token_B1, i), None, source_seg, method="decode", mutable=["cache"])
      return variables["cache"], logits_B1V[:, 0]

    cache, steps_LBV = jax.lax.scan(step, variables["cache"], jnp.arange(L))
    return full_BLV, steps_LBV, cache

  full, steps, cache = jit_fast(full_and_cached)(params)
  np.testing.assert_allclose(jnp.swapaxes(steps, 0, 1), full, atol=2e-5)
  cross = [x.shape for path, x in jax.tree_util.tree_leaves_with_path(cache)
           if "cross_attention" in jax.tree_util.keystr(path)]
  layers = (2,) if cfg.scan_layers else ()
  assert cross and all(s == (B,) + layers + (L, cfg.num_kv_heads, cfg.head_dim)
                       for s in cross), cross


# ---------------------------------------------------------------- beam search, by hand

# A hand-written "model" over 5 tokens: P(next | prefix) from a table; the cache holds
# the prefix, encoded as a base-5 number, so beams must carry (and reorder) their cache.
A, B_TOKEN = 3, 4
V_HAND = 5


def table_logits_fn(table: dict, max_prefix: int, *, nan_after: int | None = None):
  """logits_fn for `table` {prefix (from the start token): {token: probability}}.

  Tokens missing from a distribution get probability 0 (logit -1e9). Prefixes longer
  than `nan_after` get NaN logits: reading one would poison the result.
  """
  codes = V_HAND ** (max_prefix + 1)
  logits = np.full((codes, V_HAND), -1e9, np.float32)
  for prefix, probs in table.items():
    code = functools.reduce(lambda c, t: c * V_HAND + t, prefix, 0)
    for token, p in probs.items():
      logits[code, token] = np.log(p)
  lengths = np.zeros(codes, np.int32)
  for code in range(codes):  # Number of base-5 digits, the start token being nonzero.
    lengths[code] = len(np.base_repr(code, V_HAND)) if code else 0
  if nan_after is not None:
    logits[lengths > nan_after] = np.nan
  logits = jnp.asarray(logits)

  def logits_fn(tokens_B, cache_B, i):
    del i
    code_B = cache_B * V_HAND + tokens_B
    return logits[code_B], code_B

  return logits_fn


def hand_beam_search(table, *, beam_size, alpha, max_steps, max_prefix, nan_after=None,
                     max_lengths_B=None):
  """Beam search over `table` from the start token, one row per entry of max_lengths_B."""
  fn = table_logits_fn(table, max_prefix, nan_after=nan_after)
  max_lengths_B = jnp.asarray(max_lengths_B or [max_steps])
  search = jit_fast(lambda start, cache: decoding.beam_search(
      fn, start, cache, beam_size=beam_size, max_steps=max_steps, alpha=alpha,
      max_lengths_B=max_lengths_B))
  rows = max_lengths_B.shape[0]
  return search(jnp.full((rows,), BOS_ID), jnp.zeros((rows,), jnp.int32))


S = BOS_ID  # Prefixes start with the start token.
LENGTH_PENALTY_TABLE = {
    (S,): {EOS_ID: 0.40, A: 0.38, B_TOKEN: 0.22},
    (S, A): {A: 0.95, EOS_ID: 0.03, B_TOKEN: 0.02},
    (S, B_TOKEN): {EOS_ID: 0.5, A: 0.3, B_TOKEN: 0.2},
    (S, A, A): {EOS_ID: 0.98, A: 0.012, B_TOKEN: 0.008},
    (S, B_TOKEN, A): {EOS_ID: 0.4, A: 0.35, B_TOKEN: 0.25},
    (S, B_TOKEN, B_TOKEN): {EOS_ID: 0.4, A: 0.35, B_TOKEN: 0.25},
    (S, A, B_TOKEN): {EOS_ID: 0.4, A: 0.35, B_TOKEN: 0.25},
}


@pytest.mark.parametrize("alpha, expected, score", [
    # [eos]: log .40 = -0.916, over lp(1) = 1. [a a eos]: log(.38 * .95 * .98) = -1.039,
    # below it by log-probability; over lp(3) = (8/6)^0.6 = 1.188 it scores -0.874 and wins.
    (0.0, [EOS_ID, PAD_ID, PAD_ID], np.log(0.40)),
    (0.6, [A, A, EOS_ID], np.log(0.38 * 0.95 * 0.98) / (8 / 6) ** 0.6),
])
def test_beam_search_length_penalty_changes_the_winner(alpha, expected, score):
  # Beam 2: step 0 finishes [eos] (the best candidate), keeps [a], [b] live; step 1
  # finishes [b eos] (2nd candidate), keeps [a a], [b a]; step 2 is the last (max_steps
  # 3): [a a eos] and [b a eos] finish there, and the best two finished hypotheses stay.
  tokens_BNT, scores_BN = hand_beam_search(LENGTH_PENALTY_TABLE, beam_size=2, alpha=alpha,
                                           max_steps=3, max_prefix=3)
  np.testing.assert_array_equal(tokens_BNT[0, 0], expected)
  np.testing.assert_allclose(scores_BN[0, 0], score, rtol=1e-5)
  assert scores_BN[0, 0] > scores_BN[0, 1]


def test_beam_search_stops_each_row_at_its_own_max_length():
  """A row at its maximum length keeps its result while other rows go on: [a a eos]
  wins with room for 3 tokens, [eos] with room for 2."""
  # Max 2: step 1 finishes its best two candidates, [a a] (log(.38 * .95) / lp(2) =
  # -0.929) and [b eos], and [eos] (-0.916) stays the best.
  tokens_BNT, _ = hand_beam_search(LENGTH_PENALTY_TABLE, beam_size=2, alpha=0.6,
                                   max_steps=3, max_prefix=3, max_lengths_B=[2, 3])
  np.testing.assert_array_equal(tokens_BNT[:, 0], [[EOS_ID, 0, 0], [A, A, EOS_ID]])


def test_beam_search_reorders_the_cache_with_its_beams():
  """After step 1 the best live beam descends from beam 1, the second from beam 0; a
  cache left in place would feed [b a]'s next step from [a a]'s prefix."""
  table = {
      (S,): {A: 0.5, B_TOKEN: 0.4, EOS_ID: 0.1},
      (S, A): {A: 0.4, B_TOKEN: 0.35, EOS_ID: 0.25},
      (S, B_TOKEN): {A: 0.9, B_TOKEN: 0.1},
      (S, B_TOKEN, A): {EOS_ID: 0.9, A: 0.06, B_TOKEN: 0.04},
      (S, A, A): {EOS_ID: 0.5, A: 0.3, B_TOKEN: 0.2},
  }
  tokens_BNT, scores_BN = hand_beam_search(table, beam_size=2, alpha=0.6, max_steps=3,
                                           max_prefix=3)
  np.testing.assert_array_equal(tokens_BNT[0, 0], [B_TOKEN, A, EOS_ID])
  np.testing.assert_allclose(scores_BN[0, 0], np.log(0.4 * 0.9 * 0.9) / (8 / 6) ** 0.6,
                             rtol=1e-5)


EARLY_EOS_TABLE = {
    (S,): {A: 0.5, EOS_ID: 0.3, B_TOKEN: 0.2},
    (S, A): {EOS_ID: 0.5, A: 0.3, B_TOKEN: 0.2},
    (S, B_TOKEN): {EOS_ID: 0.6, A: 0.25, B_TOKEN: 0.15},
}


def test_beam_search_early_eos_wins_and_the_search_stops():
  """[eos] at step 0 beats every longer hypothesis; greedy says [a eos]."""
  # Step 0 finishes [eos] (log .3 = -1.204, 2nd candidate of beam 2), live: [a] -0.693,
  # [b]. Step 1 finishes [a eos] (log .25 / lp(2) = -1.264); [b eos] is only the 3rd
  # candidate and is dropped; live: [a a] -1.897, [a b]. Even grown to max_steps 4,
  # [a a] could score at best -1.897 / lp(4) = -1.488 < -1.264, the 2nd finished
  # score: the search is over. Every logit after step 1 is NaN: reading one would
  # spoil the answer.
  tokens_BNT, scores_BN = hand_beam_search(EARLY_EOS_TABLE, beam_size=2, alpha=0.6,
                                           max_steps=4, max_prefix=4, nan_after=2)
  np.testing.assert_array_equal(tokens_BNT[0], [[EOS_ID, 0, 0, 0], [A, EOS_ID, 0, 0]])
  np.testing.assert_allclose(scores_BN[0], [np.log(0.3), np.log(0.25) / (7 / 6) ** 0.6],
                             rtol=1e-5)
  np.testing.assert_array_equal(hand_greedy(EARLY_EOS_TABLE, max_steps=4), [A, EOS_ID, 0, 0])


def hand_greedy(table, *, max_steps):
  fn = table_logits_fn(table, max_steps)
  search = jit_fast(lambda start, cache: decoding.temperature_sample(
      fn, start, cache, max_steps=max_steps))
  return search(jnp.asarray([BOS_ID]), jnp.zeros((1,), jnp.int32))[0]


@pytest.mark.parametrize("table", [LENGTH_PENALTY_TABLE, EARLY_EOS_TABLE],
                         ids=["eos_first", "eos_second"])
def test_width_one_beam_search_is_greedy_on_a_table(table):
  # With alpha=0 an eos hypothesis finishes only when it is the argmax, and then no
  # live one can beat it, exactly as greedy decoding stops.
  tokens_BNT, _ = hand_beam_search(table, beam_size=1, alpha=0.0, max_steps=3,
                                   max_prefix=3)
  np.testing.assert_array_equal(tokens_BNT[0, 0], hand_greedy(table, max_steps=3))


# ---------------------------------------------------------------- sampling rules


def test_top_k_and_top_p_sample_only_from_their_set():
  probs = np.array([0.4, 0.3, 0.2, 0.1], np.float32)
  logits_NV = jnp.asarray(np.broadcast_to(np.log(probs), (4000, 4)))
  draw = jit_fast(functools.partial(decoding.sample_logits, temperature=1.0),
                  static_argnames=("top_k", "top_p"))
  key = jax.random.PRNGKey(0)
  # top_p=0.5: {0, 1} (0.4 alone is short of 0.5), renormalised to 4/7, 3/7.
  counts = np.bincount(draw(logits_NV, key, top_p=0.5), minlength=4) / 4000
  np.testing.assert_allclose(counts, [4 / 7, 3 / 7, 0, 0], atol=0.03)
  counts = np.bincount(draw(logits_NV, key, top_k=3), minlength=4) / 4000
  np.testing.assert_allclose(counts, [4 / 9, 3 / 9, 2 / 9, 0], atol=0.03)
  counts = np.bincount(draw(logits_NV, key, top_k=3, top_p=0.75), minlength=4) / 4000
  np.testing.assert_allclose(counts, [4 / 7, 3 / 7, 0, 0], atol=0.03)


# ---------------------------------------------------------------- generating with a model


@functools.lru_cache(maxsize=None)
def generation_case(arch: str):
  """A small-vocabulary model, right-padded inputs of 3 lengths, and the first seed's
  weights whose greedy output stops some rows at eos (before the end) but not all.

  The encoder-decoder scans its layers: its caches, self and cross, then hold a layers
  axis, which beam search must leave alone when it expands and reorders beams.
  """
  if arch == "decoder":
    cfg = model_config(arch, position="learned", vocab_size=SMALL_VOCAB)
  else:
    cfg = model_config(arch, position="sinusoidal", vocab_size=SMALL_VOCAB, scan_layers=True)
  inputs = right_pad([[5, 6, 7, 4, 5], [6, 4], [7, 7, 5, 4]])
  segment_ids = (inputs != PAD_ID).astype(jnp.int32)
  for seed in range(20):
    params = random_params(cfg, seed)
    greedy = np.asarray(generate(cfg, params, inputs, segment_ids))
    stopped = (greedy[:, :-1] == EOS_ID).any(axis=1)
    if stopped.any() and not stopped.all():
      return cfg, params, inputs, segment_ids
  raise AssertionError("no seed stopped some rows at eos but not all")


def generate(cfg, params, inputs, segment_ids, **search):
  if cfg.arch == "decoder":
    return decoding.generate(cfg, params, inputs, 6, **search)
  return decoding.generate_seq2seq(cfg, params, inputs, segment_ids, max_length_offset=2,
                                   **search)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
@pytest.mark.parametrize("search", [dict(), dict(beam_size=3)], ids=["greedy", "beam3"])
def test_mixed_length_batch_decodes_each_row_as_if_alone(arch, search):
  cfg, params, inputs, segment_ids = generation_case(arch)
  batch = np.asarray(generate(cfg, params, inputs, segment_ids, **search))
  for row, length in enumerate(segment_ids.sum(axis=1).tolist()):
    alone = np.asarray(generate(cfg, params, inputs[row:row + 1, :length],
                                segment_ids[row:row + 1, :length], **search))[0]
    width = len(alone)  # A seq2seq row alone may be shorter: source length + offset.
    np.testing.assert_array_equal(batch[row, :width], alone, err_msg=f"row {row}")
    assert (batch[row, width:] == PAD_ID).all()


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_width_one_beam_search_is_greedy(arch):
  cfg, params, inputs, segment_ids = generation_case(arch)
  np.testing.assert_array_equal(generate(cfg, params, inputs, segment_ids),
                                generate(cfg, params, inputs, segment_ids, beam_size=1,
                                         alpha=0.0))


def test_greedy_generate_matches_the_uncached_loop_and_stops_at_eos():
  """Each row of a mixed-length batch is the argmax of full forward passes over its own
  growing sequence, up to its first eos; then padding."""
  cfg, params, prompts, segment_ids = generation_case("decoder")
  generated = decoding.generate(cfg, params, prompts, 6)
  forward = jit_fast(lambda seq: make_model(cfg).apply({"params": params}, seq,
                                                       *single_document(seq)))
  expected = []
  for row, length in enumerate(segment_ids.sum(axis=1).tolist()):
    # One padded length for all (one compile): causality makes the unfilled tail irrelevant.
    sequence = jnp.zeros((1, MAX_LEN), jnp.int32).at[0, :length].set(prompts[row, :length])
    for i in range(length, length + 6):
      sequence = sequence.at[0, i].set(jnp.argmax(forward(sequence)[0, i - 1]))
    expected.append(sequence[0, length:length + 6])
  expected = after_first_eos_is_pad(np.stack(expected))
  assert (expected[:, :-1] == EOS_ID).any(), "no row stops early: the test is too weak"
  np.testing.assert_array_equal(generated, expected)


def test_cached_beam_search_equals_beam_search_over_full_forward_passes():
  """The same search, fed by a step function that recomputes the whole sequence: the
  key/value cache, its prefill and its reordering by beam change nothing."""
  cfg, params, prompts, segment_ids = generation_case("decoder")
  lengths = segment_ids.sum(axis=1)
  model = make_model(cfg)

  def uncached_logits_fn(tokens_B, cache, i):
    positions_B = cache["first_position"] + i
    sequence_BL = cache["sequence"].at[jnp.arange(tokens_B.shape[0]), positions_B].set(
        tokens_B)
    logits_BLV = model.apply({"params": params}, sequence_BL, *single_document(sequence_BL))
    logits_BV = jnp.take_along_axis(logits_BLV, positions_B[:, None, None], axis=1)[:, 0]
    return logits_BV, dict(cache, sequence=sequence_BL)

  # Causality makes what lies after a row's position irrelevant; one width compiles once.
  sequence_BL = jnp.zeros((3, MAX_LEN), jnp.int32).at[:, :prompts.shape[1]].set(prompts)
  last_B = jnp.take_along_axis(prompts, (lengths - 1)[:, None], axis=1)[:, 0]
  search = jit_fast(lambda cache: decoding.beam_search(
      uncached_logits_fn, last_B, cache, beam_size=3, max_steps=6, alpha=0.6))
  expected, _ = search({"sequence": sequence_BL, "first_position": lengths - 1})
  np.testing.assert_array_equal(generate(cfg, params, prompts, segment_ids, beam_size=3),
                                expected[:, 0])


def test_greedy_seq2seq_matches_the_uncached_loop_and_pads_after_eos():
  cfg, params, inputs, segment_ids = generation_case("encoder_decoder")
  generated = decoding.generate_seq2seq(cfg, params, inputs, segment_ids,
                                        max_length_offset=2)
  width = inputs.shape[1] + 2
  assert generated.shape == (3, width)
  positions = single_document(inputs)[1]
  forward = jit_fast(lambda target: make_model(cfg).apply(
      {"params": params}, inputs, segment_ids, positions, target, *single_document(target)))
  target = jnp.zeros((3, width + 1), jnp.int32).at[:, 0].set(BOS_ID)
  for i in range(1, width + 1):
    target = target.at[:, i].set(jnp.argmax(forward(target)[:, i - 1], -1))
  expected = after_first_eos_is_pad(target[:, 1:])
  # Each row's output stops at its own limit: source length + 2.
  for row, length in enumerate(segment_ids.sum(axis=1).tolist()):
    expected[row, length + 2:] = PAD_ID
  np.testing.assert_array_equal(generated, expected)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
  cfg, params, prompts, segment_ids = generation_case("decoder")
  key = jax.random.PRNGKey(7)
  sample = functools.partial(decoding.generate, cfg, params, prompts, 6, temperature=1.0)
  a, b, c = sample(rng=key), sample(rng=key), sample(rng=jax.random.PRNGKey(8))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  greedy = generate(cfg, params, prompts, segment_ids)
  assert not np.array_equal(a, greedy)
  np.testing.assert_array_equal(sample(rng=key, top_k=1), greedy)


# ---------------------------------------------------------------- errors


def test_generate_length_check_counts_the_positions_it_feeds():
  cfg = model_config("decoder")
  prompt = tokens(length=10)
  params = random_params(cfg)
  # 10 prompt + 7 new tokens need 16 positions: the 7th new token is never fed back.
  assert decoding.generate(cfg, params, prompt, 7).shape == (B, 7)
  with pytest.raises(ValueError, match=r"needs 17 positions but model.max_len=16"):
    decoding.generate(cfg, params, prompt, 8)


def test_rope_decodes_past_max_len_with_one_warning(monkeypatch, caplog):
  """Only a position table ends at max_len: RoPE decodes on, as a model whose max_len
  holds the positions does, and says so once for any number of calls."""
  monkeypatch.setattr(decoding, "_WARNED_PAST_MAX_LEN", set())
  cfg = model_config("decoder", position="rope")
  params, prompt = random_params(cfg), tokens(length=10)
  with caplog.at_level("WARNING"):
    past = decoding.generate(cfg, params, prompt, 8)
    decoding.generate(cfg, params, prompt, 8)
  warned = [r.getMessage() for r in caplog.records if "past model.max_len" in r.getMessage()]
  assert len(warned) == 1 and warned[0].startswith(
      "Decoding to 17 positions, past model.max_len=16"), warned
  longer = dataclasses.replace(cfg, max_len=17)
  np.testing.assert_array_equal(past, decoding.generate(longer, params, prompt, 8))


def test_decoding_rejects_bad_inputs_with_clear_errors():
  cfg = model_config("decoder")
  params = random_params(cfg)
  with pytest.raises(ValueError, match=r"non-empty prompt.*\(2, 0\)"):
    decoding.generate(cfg, params, jnp.zeros((2, 0), jnp.int32), 3)
  with pytest.raises(ValueError, match=r"prompt row 1 is empty"):
    decoding.generate(cfg, params, right_pad([[5, 6], []]), 3)
  with pytest.raises(ValueError, match=r"prompt row 0 has padding before its last token"):
    decoding.generate(cfg, params, jnp.asarray([[0, 5, 6]]), 3)
  with pytest.raises(ValueError, match=r"needs an rng"):
    decoding.generate(cfg, params, tokens(length=2), 3, temperature=0.7)
  with pytest.raises(ValueError, match=r"does not sample"):
    decoding.generate(cfg, params, tokens(length=2), 3, beam_size=2, temperature=0.7)
  with pytest.raises(ValueError, match=r"generate needs a decoder LM.*generate_seq2seq"):
    decoding.generate(model_config("encoder_decoder"), params, tokens(length=2), 2)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_seq2seq_rejects_sources_past_the_position_table(position):
  """Such a source used to decode silently to NaN encoder rows and all-padding output."""
  cfg = model_config("encoder_decoder", position=position)
  source = tokens(length=20)
  segment_ids = jnp.ones_like(source).at[1, 18:].set(0)
  with pytest.raises(ValueError, match=r"sources have 20 positions \(longest source 20 "
                     r"tokens\) but model.max_len=16 with " + position):
    decoding.generate_seq2seq(cfg, random_params(cfg), source, segment_ids)
