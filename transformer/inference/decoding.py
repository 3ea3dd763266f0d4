"""Autoregressive decoding with a key/value cache: greedy, sampling and beam search.

The model runs in decode mode (`ModelConfig.decode=True`): each causal self-attention
keeps max_len key/value slots in the "cache" collection, slot s for position s of its
row, and each cross-attention keeps the keys/values of its encoder output, computed on
the first decoding call. A prompt is prefilled in one call, then one token per step is
added; a step costs one token's worth of compute instead of a forward pass. A prefix
LM's prompt (`prompt_is_prefix`: its objective feeds the model a `prefix` field) is
prefilled whole as the prefix, its tokens attending to each other both ways as in
training, and the first step's logits are the prefill's; a causal LM prefills all but
the last prompt token, which the first step feeds.

Two searches share one interface and know nothing about models:
`temperature_sample` (greedy at temperature 0, else sampling with optional top-k and
top-p) and `beam_search` (GNMT length penalty). Each is a `jax.lax.while_loop` over
a step function `logits_fn(tokens_B, cache, i) -> (logits_BV, cache)`, which feeds
token i of every row and returns the next-token logits; `cache` is any pytree whose
leaves have the batch on axis 0 (beam search repeats it by beam and reorders it by
the chosen beams). `generate` (decoder) and `generate_seq2seq` (encoder-decoder) wrap
them around a model; each compiles once per (batch size, prompt or source length).

Batches of different lengths are right-padded with PAD_ID (0). Every row keeps its own
positions (its first token at 0), so its cache slots, position encodings and outputs
are exactly those it gets when decoded alone; rows simply write different slots at the
same step. (Not quite with model.rope_scaling "dynamic" or "longrope", whose rotation
depends on the length: the prefill's is the padded width, the batch's as in
transformers; see positions.rope_lengths.) Output rows hold the generated tokens, the
first eos included, then PAD. Past model.max_len only learned and sinusoidal positions
stop; the others decode on with a longer cache and one warning (`generate`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import linen as nn

from transformer.config import objective as objective_lib
from transformer.config.model import ModelConfig
from transformer.data.tokenizers import vocabularies
from transformer.model import positions as positions_lib
from transformer.model.models import make_model

# (tokens_B fed at step i, cache, i) -> (float logits_BV of token i + 1, updated cache).
LogitsFn = Callable[[jax.Array, Any, jax.Array], tuple[jax.Array, Any]]

NEG_INF = -np.inf


def decode_model(config: ModelConfig) -> nn.Module:
  """The model in decode mode (no dropout, cached self-attention)."""
  return make_model(dataclasses.replace(config, deterministic=True, decode=True))


def init_cache(model: nn.Module, batch_size: int) -> dict:
  """Zeros in the shapes of the self-attention caches, found without running anything.

  Cross-attention caches are absent: the first decoding call creates them from the
  encoder output, whose length only it knows.

  Args:
    model: a model from `decode_model`.
    batch_size: rows to decode at once.

  Returns:
    The "cache" collection, every leaf [batch_size, ...].
  """
  length = model.config.max_len
  tokens = jnp.zeros((batch_size, length), jnp.int32)
  ones = jnp.ones_like(tokens)
  positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
  args = (tokens, ones, positions)
  if model.config.arch == "encoder_decoder":
    args = args + args
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), *args)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables["cache"])


def length_penalty(length: jax.Array | int, alpha: float) -> jax.Array:
  """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016); scores are log P / lp."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


# ---------------------------------------------------------------- sampling and greedy


def _check_sampling(temperature: float, top_k: int, top_p: float, rng: jax.Array | None):
  if temperature < 0:
    raise ValueError(f"temperature={temperature} must be >= 0 (0 is greedy)")
  if top_k < 0 or not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_k={top_k} must be >= 0 (0: off) and top_p={top_p} in (0, 1]")
  if temperature == 0.0 and (top_k or top_p < 1.0):
    raise ValueError(f"top_k={top_k} and top_p={top_p} only apply when sampling; "
                     "set temperature > 0 or leave them at 0 and 1.0")
  if temperature > 0.0 and rng is None:
    raise ValueError(f"sampling at temperature={temperature} needs an rng key "
                     "(jax.random.PRNGKey(seed)); a fixed default would repeat samples")


def sample_logits(logits_BV: jax.Array, rng: jax.Array | None, *, temperature: float,
                  top_k: int = 0, top_p: float = 1.0) -> jax.Array:
  """Picks one token per row: argmax at temperature 0, else a sample.

  The sample is drawn from softmax(logits / temperature) restricted to the `top_k`
  most likely tokens (0: all) and then to the smallest set of them whose probability
  reaches `top_p` (nucleus sampling; 1.0: all), renormalised.

  Args:
    logits_BV: [B, V] next-token logits.
    rng: PRNG key; unused at temperature 0.
    temperature: 0 for greedy, else the softmax temperature.
    top_k: keep only the k most likely tokens; 0 keeps all.
    top_p: keep the most likely tokens up to this cumulative probability.

  Returns:
    [B] int32 token ids.
  """
  if temperature == 0.0:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  logits_BV = logits_BV.astype(jnp.float32) / temperature
  if not top_k and top_p >= 1.0:
    return jax.random.categorical(rng, logits_BV).astype(jnp.int32)
  k = min(top_k or logits_BV.shape[-1], logits_BV.shape[-1])
  top_logits_BK, top_ids_BK = jax.lax.top_k(logits_BV, k)  # Sorted, most likely first.
  if top_p < 1.0:
    probs_BK = jax.nn.softmax(top_logits_BK, axis=-1)
    # Keep a token while the tokens ranked above it hold less than top_p; the first one
    # always stays.
    mass_before_BK = jnp.cumsum(probs_BK, axis=-1) - probs_BK
    top_logits_BK = jnp.where(mass_before_BK < top_p, top_logits_BK, NEG_INF)
  choice_B = jax.random.categorical(rng, top_logits_BK)
  return jnp.take_along_axis(top_ids_BK, choice_B[:, None], axis=1)[:, 0].astype(jnp.int32)


def temperature_sample(logits_fn: LogitsFn, start_tokens_B: jax.Array, cache: Any, *,
                       max_steps: int, max_lengths_B: jax.Array | None = None,
                       temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                       rng: jax.Array | None = None,
                       eos_id: int = vocabularies.EOS_ID) -> jax.Array:
  """Greedy decoding (temperature 0) or sampling, stopping each row at eos.

  Runs inside a `jax.lax.while_loop` that ends once every row is done.

  Args:
    logits_fn: the step function (module docstring); called with i = 0, 1, ...
    start_tokens_B: [B] the token each row feeds first (its last prompt token, or bos).
    cache: pytree for `logits_fn`, leaves [B, ...].
    max_steps: the most tokens any row generates (the output width).
    max_lengths_B: optional [B] per-row limit (<= max_steps); default max_steps.
    temperature, top_k, top_p: as for `sample_logits`.
    rng: PRNG key, required when temperature > 0; step i uses fold_in(rng, i).
    eos_id: the token that ends a row.

  Returns:
    [B, max_steps] int32 tokens: each row up to and including its first eos, then PAD.
  """
  _check_sampling(temperature, top_k, top_p, rng)
  batch = start_tokens_B.shape[0]
  if max_lengths_B is None:
    max_lengths_B = jnp.full((batch,), max_steps, jnp.int32)

  def cond(state):
    i, _, _, done_B, _ = state
    return (i < max_steps) & ~jnp.all(done_B)

  def body(state):
    i, tokens_BT, last_B, done_B, cache = state
    logits_BV, cache = logits_fn(last_B, cache, i)
    step_rng = None if temperature == 0.0 else jax.random.fold_in(rng, i)
    token_B = sample_logits(logits_BV, step_rng, temperature=temperature, top_k=top_k,
                            top_p=top_p)
    token_B = jnp.where(done_B, vocabularies.PAD_ID, token_B)
    tokens_BT = jax.lax.dynamic_update_slice(tokens_BT, token_B[:, None], (0, i))
    done_B = done_B | (token_B == eos_id) | (i + 1 >= max_lengths_B)
    return i + 1, tokens_BT, token_B, done_B, cache

  state = (jnp.zeros((), jnp.int32),
           jnp.full((batch, max_steps), vocabularies.PAD_ID, jnp.int32),
           start_tokens_B.astype(jnp.int32), max_lengths_B <= 0, cache)
  return jax.lax.while_loop(cond, body, state)[1]


# ---------------------------------------------------------------- beam search


class BeamState(NamedTuple):
  """The beam search loop's carry; B rows, N beams, T = max_steps."""

  step: jax.Array  # int32 []: the index of the token generated next.
  last_BN: jax.Array  # The token each live beam feeds at `step`.
  live_tokens_BNT: jax.Array  # Live hypotheses (tokens 0..step-1, then PAD).
  live_logp_BN: jax.Array  # Their log-probabilities, best first; -inf for no hypothesis.
  finished_tokens_BNT: jax.Array  # The best ended hypotheses (through eos), then PAD.
  finished_scores_BN: jax.Array  # Their log P / lp(|Y|), best first; -inf: empty slot.
  done_B: jax.Array  # Rows whose result is final; their state no longer changes.
  cache: Any  # Leaves [B * N, ...], beams of a row adjacent.


def _gather_beams(tree: Any, beams_BN: jax.Array) -> Any:
  """Picks beam beams_BN[b, n] of row b for every leaf of a [B * N, ...] pytree."""
  batch, beam_size = beams_BN.shape
  flat_M = (jnp.arange(batch)[:, None] * beam_size + beams_BN).reshape(-1)
  return jax.tree.map(lambda x: jnp.take(x, flat_M, axis=0), tree)


def beam_search(logits_fn: LogitsFn, start_tokens_B: jax.Array, cache: Any, *,
                beam_size: int, max_steps: int, max_lengths_B: jax.Array | None = None,
                alpha: float = 0.6,
                eos_id: int = vocabularies.EOS_ID) -> tuple[jax.Array, jax.Array]:
  """Beam search with GNMT's length penalty, in one `jax.lax.while_loop`.

  Each step extends the N live hypotheses of a row by every token and ranks the
  candidates by log-probability. Those among the best N that end in eos are set
  aside as finished, scored log P / lp(|Y|) (`length_penalty`, |Y| counting the eos);
  the best N that do not end in eos stay live. (Only eos candidates that rank in the
  best N finish, as in fairseq: a search never finishes a hypothesis it would not have
  kept as a beam, so beam_size=1 is greedy decoding exactly when alpha=0.) At a row's
  maximum length its best N candidates all finish, eos or not. A row is done when no
  live hypothesis could beat its N-th best finished one, even growing to its maximum
  length (log P only falls and, for alpha >= 0, lp only grows), or at that length.

  Args:
    logits_fn: the step function (module docstring); called with i = 0, 1, ... on
      B * N rows (the N beams of row b are rows b * N ... b * N + N - 1).
    start_tokens_B: [B] the token each row feeds first (its last prompt token, or bos).
    cache: pytree for `logits_fn`, leaves [B, ...]; repeated here N times per row.
    beam_size: N, hypotheses kept per row.
    max_steps: the most tokens any row generates (the output width).
    max_lengths_B: optional [B] per-row maximum output length (<= max_steps).
    alpha: the length penalty's exponent (>= 0); 0 ranks by log-probability alone.
    eos_id: the token that ends a hypothesis.

  Returns:
    ([B, N, max_steps] int32 finished hypotheses, best first, each through its eos and
    then PAD; [B, N] their scores, -inf for a slot that holds none).
  """
  if beam_size < 1:
    raise ValueError(f"beam_size={beam_size} must be >= 1")
  if alpha < 0:
    raise ValueError(f"alpha={alpha} must be >= 0: the search's stopping rule relies on "
                     "the length penalty not shrinking with length")
  batch = start_tokens_B.shape[0]
  if max_lengths_B is None:
    max_lengths_B = jnp.full((batch,), max_steps, jnp.int32)

  def cond(state: BeamState):
    return (state.step < max_steps) & ~jnp.all(state.done_B)

  def body(state: BeamState) -> BeamState:
    return _beam_step(logits_fn, state, beam_size=beam_size, max_steps=max_steps,
                      max_lengths_B=max_lengths_B, alpha=alpha, eos_id=eos_id)

  state = _start_beams(start_tokens_B, cache, beam_size, max_steps, max_lengths_B)
  state = jax.lax.while_loop(cond, body, state)
  return state.finished_tokens_BNT, state.finished_scores_BN


def _start_beams(start_tokens_B: jax.Array, cache: Any, n: int, max_steps: int,
                 max_lengths_B: jax.Array) -> BeamState:
  """The search's first state: no finished hypothesis, the cache repeated N times a row."""
  batch = start_tokens_B.shape[0]
  empty_BNT = jnp.full((batch, n, max_steps), vocabularies.PAD_ID, jnp.int32)
  # All N beams start as the same hypothesis; only beam 0 may extend it, so that the
  # first step's candidates are not N copies of each other.
  live_logp_BN = jnp.where(jnp.arange(n)[None, :] == 0, 0.0, NEG_INF)
  return BeamState(
      step=jnp.zeros((), jnp.int32),
      last_BN=jnp.repeat(start_tokens_B.astype(jnp.int32)[:, None], n, axis=1),
      live_tokens_BNT=empty_BNT,
      live_logp_BN=jnp.broadcast_to(live_logp_BN, (batch, n)).astype(jnp.float32),
      finished_tokens_BNT=empty_BNT,
      finished_scores_BN=jnp.full((batch, n), NEG_INF, jnp.float32),
      done_B=max_lengths_B <= 0,
      cache=jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), cache))


def _beam_step(logits_fn: LogitsFn, state: BeamState, *, beam_size: int, max_steps: int,
               max_lengths_B: jax.Array, alpha: float, eos_id: int) -> BeamState:
  """One step of `beam_search`: every live hypothesis extended by every token; the best
  N candidates ending in eos (or at the row's limit) finish, the best N others stay live;
  a row that is done keeps its state."""
  batch, n = state.done_B.shape[0], beam_size
  steps_T = jnp.arange(max_steps)
  ranks_2N = jnp.arange(2 * n)
  i = state.step
  logits_MV, cache = logits_fn(state.last_BN.reshape(batch * n), state.cache, i)
  vocab = logits_MV.shape[-1]
  logp_BNV = jax.nn.log_softmax(logits_MV.astype(jnp.float32)).reshape(batch, n, vocab)
  candidates_BX = (state.live_logp_BN[:, :, None] + logp_BNV).reshape(batch, n * vocab)
  # 2N candidates always hold N that do not end in eos (a beam adds one eos at most).
  logp_B2, flat_B2 = jax.lax.top_k(candidates_BX, 2 * n)
  parent_B2, token_B2 = flat_B2 // vocab, (flat_B2 % vocab).astype(jnp.int32)
  tokens_B2T = jnp.take_along_axis(state.live_tokens_BNT, parent_B2[:, :, None], axis=1)
  tokens_B2T = jnp.where(steps_T[None, None, :] == i, token_B2[:, :, None], tokens_B2T)
  is_eos_B2 = token_B2 == eos_id

  at_limit_B = i + 1 >= max_lengths_B
  ends_B2 = (ranks_2N[None, :] < n) & (is_eos_B2 | at_limit_B[:, None])
  new_scores_B2 = jnp.where(ends_B2, logp_B2 / length_penalty(i + 1, alpha), NEG_INF)
  finished_scores_BN, pick_BN = jax.lax.top_k(
      jnp.concatenate([state.finished_scores_BN, new_scores_B2], axis=1), n)
  finished_tokens_BNT = jnp.take_along_axis(
      jnp.concatenate([state.finished_tokens_BNT, tokens_B2T], axis=1),
      pick_BN[:, :, None], axis=1)

  live_logp_BN, pick_BN = jax.lax.top_k(jnp.where(is_eos_B2, NEG_INF, logp_B2), n)
  parent_BN = jnp.take_along_axis(parent_B2, pick_BN, axis=1)
  live_tokens_BNT = jnp.take_along_axis(tokens_B2T, pick_BN[:, :, None], axis=1)
  last_BN = jnp.take_along_axis(token_B2, pick_BN, axis=1)

  # A done row keeps its state (and beam order), so that what other rows still do
  # cannot change it: a row gets the same result alone or in any batch.
  keep_B = state.done_B
  parent_BN = jnp.where(keep_B[:, None], jnp.arange(n)[None, :], parent_BN)

  def merge(old, new):
    return jnp.where(keep_B.reshape((batch,) + (1,) * (old.ndim - 1)), old, new)

  finished_scores_BN = merge(state.finished_scores_BN, finished_scores_BN)
  best_possible_B = live_logp_BN[:, 0] / length_penalty(max_lengths_B, alpha)
  done_B = (keep_B | at_limit_B | (best_possible_B < finished_scores_BN[:, -1]))
  return BeamState(
      step=i + 1, last_BN=merge(state.last_BN, last_BN),
      live_tokens_BNT=merge(state.live_tokens_BNT, live_tokens_BNT),
      live_logp_BN=merge(state.live_logp_BN, live_logp_BN),
      finished_tokens_BNT=merge(state.finished_tokens_BNT, finished_tokens_BNT),
      finished_scores_BN=finished_scores_BN, done_B=done_B,
      cache=_gather_beams(cache, parent_BN))


# ---------------------------------------------------------------- model wrappers


def _search(logits_fn: LogitsFn, start_tokens_B: jax.Array, cache: Any, *, max_steps: int,
            max_lengths_B: jax.Array | None, beam_size: int | None, alpha: float,
            temperature: float, top_k: int, top_p: float,
            rng: jax.Array | None) -> jax.Array:
  """The best [B, max_steps] tokens of beam search, or of `temperature_sample`."""
  if beam_size is None:
    return temperature_sample(logits_fn, start_tokens_B, cache, max_steps=max_steps,
                              max_lengths_B=max_lengths_B, temperature=temperature,
                              top_k=top_k, top_p=top_p, rng=rng)
  tokens_BNT, _ = beam_search(logits_fn, start_tokens_B, cache, beam_size=beam_size,
                              max_steps=max_steps, max_lengths_B=max_lengths_B, alpha=alpha)
  return tokens_BNT[:, 0]


def _check_search(beam_size: int | None, temperature: float, top_k: int, top_p: float,
                  rng: jax.Array | None) -> None:
  if beam_size is None:
    _check_sampling(temperature, top_k, top_p, rng)
  elif beam_size < 1 or temperature or top_k or top_p < 1.0:
    raise ValueError(f"beam search (beam_size={beam_size}) needs beam_size >= 1 and does "
                     f"not sample: got temperature={temperature}, top_k={top_k}, "
                     f"top_p={top_p}")


def _right_padded_lengths(real_BL: np.ndarray, what: str) -> np.ndarray:
  """Per-row lengths of right-padded rows; raises on empty rows or inner padding."""
  lengths_B = real_BL.sum(axis=1)
  for row, (real_L, length) in enumerate(zip(real_BL, lengths_B)):
    if length == 0:
      raise ValueError(f"{what} row {row} is empty (all padding); every row needs at "
                       "least one token")
    if not real_L[:length].all():
      raise ValueError(f"{what} row {row} has padding before its last token; right-pad "
                       f"{what}s (real tokens first, then padding)")
  return lengths_B.astype(np.int32)


def prompt_is_prefix(config: ModelConfig) -> bool:
  """Whether a decoder reads its prompt as a prefix LM's prefix (bidirectional among the
  prompt's tokens, then causal): its objective feeds the model a `prefix` field
  (Decoder.__call__), as attention_ops.layer_kinds decides the same."""
  return config.arch == "decoder" and "prefix" in objective_lib.resolve(config).model_inputs


def _prefill_causal(model: nn.Module, params, cache: Any, prompts_BP: jax.Array,
                    lengths_B: jax.Array) -> tuple[Any, jax.Array, None]:
  """A causal LM's prefill: all but each row's last prompt token, which the search
  feeds first. The padding goes in as if it were content: causality hides it from the
  real tokens before it, the generated tokens overwrite its slots before anything reads
  them, and no query faces a fully masked row (which some attention kernels turn to NaN).

  Returns:
    (cache, the start tokens [B], None: the first step runs the model).
  """
  width = prompts_BP.shape[1]
  if width > 1:
    head_BL = prompts_BP[:, :-1]
    positions_BL = jnp.broadcast_to(jnp.arange(width - 1), head_BL.shape)
    _, variables = model.apply({"params": params, "cache": cache}, head_BL,
                               jnp.ones_like(head_BL), positions_BL, mutable=["cache"])
    cache = variables["cache"]
  start_B = jnp.take_along_axis(prompts_BP, (lengths_B - 1)[:, None], axis=1)[:, 0]
  return cache, start_B, None


def _prefill_prefix(model: nn.Module, params, cache: Any, prompts_BP: jax.Array,
                    lengths_B: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
  """A prefix LM's prefill: the whole prompt in one call, its real tokens the prefix
  (each sees every other), so every prompt key is cached before any prompt query reads
  (Decoder.__call__). The padding after a row's prompt is outside the prefix: causal, it
  sees the prompt, no prompt token sees it, and generated tokens overwrite its slots.

  Returns:
    (cache, the last prompt tokens [B] (fed to nothing: the first step's logits are
    the prefill's), the logits [B, V] after each row's last prompt token).
  """
  width = prompts_BP.shape[1]
  positions_BP = jnp.broadcast_to(jnp.arange(width), prompts_BP.shape)
  prefix_BP = (positions_BP < lengths_B[:, None]).astype(jnp.int32)
  logits_BPV, variables = model.apply(
      {"params": params, "cache": cache}, prompts_BP, jnp.ones_like(prompts_BP),
      positions_BP, prefix_BP, mutable=["cache"])
  last_B1 = (lengths_B - 1)[:, None]
  first_logits_BV = jnp.take_along_axis(logits_BPV, last_B1[:, :, None], axis=1)[:, 0]
  start_B = jnp.take_along_axis(prompts_BP, last_B1, axis=1)[:, 0]
  return variables["cache"], start_B, first_logits_BV


@functools.partial(jax.jit, static_argnames=("config", "num_steps", "beam_size", "alpha",
                                             "temperature", "top_k", "top_p"))
def _generate(config: ModelConfig, params, prompts_BP: jax.Array, lengths_B: jax.Array,
              rng: jax.Array | None, *, num_steps: int, beam_size: int | None,
              alpha: float, temperature: float, top_k: int, top_p: float) -> jax.Array:
  """`generate` after validation: one compile per (batch size, prompt width)."""
  model = decode_model(config)
  prefill = _prefill_prefix if prompt_is_prefix(config) else _prefill_causal
  cache, start_B, first_logits_BV = prefill(model, params, init_cache(model, prompts_BP.shape[0]),
                                            prompts_BP, lengths_B)

  def model_step(tokens_B, state, i):
    tokens_B1 = tokens_B[:, None]
    positions_B1 = (state["first_position"] + i)[:, None]
    logits_B1V, variables = model.apply(
        {"params": params, "cache": state["model"]}, tokens_B1, jnp.ones_like(tokens_B1),
        positions_B1, mutable=["cache"])
    return logits_B1V[:, 0], dict(state, model=variables["cache"])

  def prefilled_step(tokens_B, state, i):
    # Step 0's logits are the prefill's: the last prompt token was read as part of the
    # prefix, and feeding it again would overwrite its cached keys with causal ones.
    return jax.lax.cond(i == 0, lambda: (state["first_logits"].astype(jnp.float32), state),
                        lambda: model_step(tokens_B, state, i))

  # Per-row data travels in the cache pytree, so beam search expands it with the rest.
  state = {"model": cache, "first_position": lengths_B - 1}
  logits_fn = model_step
  if first_logits_BV is not None:
    state["first_logits"] = first_logits_BV.astype(jnp.float32)
    logits_fn = prefilled_step
  return _search(logits_fn, start_B, state, max_steps=num_steps, max_lengths_B=None,
                 beam_size=beam_size, alpha=alpha, temperature=temperature, top_k=top_k,
                 top_p=top_p, rng=rng)


# (max_len, position, rope_scaling) of the models already warned about in this process.
_WARNED_PAST_MAX_LEN: set[tuple[int, str, str]] = set()


def _warn_past_max_len(config: ModelConfig, used: int) -> None:
  """One log line per model kind and process: decoding past model.max_len (an import's
  max_position_embeddings) runs on positions the model never saw in training."""
  key = (config.max_len, config.position, config.rope_scaling)
  if key in _WARNED_PAST_MAX_LEN:
    return
  _WARNED_PAST_MAX_LEN.add(key)
  scaling = (f", model.rope_scaling={config.rope_scaling!r}"
             if positions_lib.POSITIONS[config.position].rotary else "")
  logging.warning("Decoding to %d positions, past model.max_len=%d (an imported model's "
                  "max_position_embeddings): positions from %d on are extrapolated "
                  "(model.position=%r%s); the cache grows to %d slots", used,
                  config.max_len, config.max_len, config.position, scaling, used)


def generate(config: ModelConfig, params, prompts_BP: jax.Array, num_steps: int, *,
             beam_size: int | None = None, alpha: float = 0.6, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0,
             rng: jax.Array | None = None) -> jax.Array:
  """Continues each prompt of a decoder-only LM by up to `num_steps` tokens.

  Greedy by default; sampling with `temperature` > 0 (and `rng`), optionally top-k /
  top-p; beam search with `beam_size`. A row stops at its first eos. Call it eagerly
  (it validates the prompts on the host and jits the decoding itself).

  Args:
    config: the model config (arch "decoder", head "lm").
    params: trained parameters.
    prompts_BP: [B, P] token ids, one prompt per row (at least one token, e.g. bos),
      right-padded with PAD_ID (0) to the longest.
    num_steps: the most tokens to generate per row.
    beam_size: None for greedy/sampling; N >= 1 for beam search (1: greedy when alpha=0).
    alpha: beam search's length-penalty exponent (`beam_search`).
    temperature: 0 for greedy; otherwise sample from softmax(logits / temperature).
    top_k: when sampling, keep only the k most likely tokens (0: all).
    top_p: when sampling, keep the smallest set of tokens holding this probability.
    rng: PRNG key, required when sampling.

  Returns:
    [B, num_steps] generated ids, through each row's first eos, then PAD (0).

  Past model.max_len (an import's max_position_embeddings) only learned and
  sinusoidal positions stop: the others decode on, with a cache as long as needed, and
  a warning, once per process, that those positions are extrapolated.

  Raises:
    ValueError: on a wrong topology, an empty or left-padded prompt, prompts that do
      not fit model.max_len's position table, or inconsistent search options.
  """
  if not objective_lib.resolve(config).generates:
    raise ValueError(f"generate needs a decoder LM, got arch={config.arch!r}, "
                     f"head={config.head!r}; use generate_seq2seq for encoder_decoder")
  _check_search(beam_size, temperature, top_k, top_p, rng)
  batch, width = prompts_BP.shape
  if width == 0 or batch == 0:
    raise ValueError(f"generate needs a non-empty prompt in every row (at least bos); "
                     f"got prompts of shape {prompts_BP.shape}")
  if num_steps < 1:
    raise ValueError(f"num_steps={num_steps} must be >= 1")
  # Token t of a row sits at position t; the last generated token is never fed back.
  used = width + num_steps - 1
  if used > config.max_len:
    if positions_lib.POSITIONS[config.position].embedding_table is not None:
      raise ValueError(f"decoding needs {used} positions but model.max_len={config.max_len} "
                       f"(prompt width {width} + num_steps {num_steps} - 1) with "
                       f"{config.position} positions, whose table ends there; shorten the "
                       "prompt or num_steps, or raise model.max_len")
    _warn_past_max_len(config, used)
    config = dataclasses.replace(config, max_len=used)  # A cache of `used` slots.
  lengths_B = _right_padded_lengths(np.asarray(prompts_BP) != vocabularies.PAD_ID, "prompt")
  return _generate(config, params, jnp.asarray(prompts_BP, jnp.int32), jnp.asarray(lengths_B),
                   rng, num_steps=num_steps, beam_size=beam_size, alpha=alpha,
                   temperature=temperature, top_k=top_k, top_p=top_p)


@functools.partial(jax.jit, static_argnames=("config", "num_steps", "beam_size", "alpha",
                                             "temperature", "top_k", "top_p"))
def _generate_seq2seq(config: ModelConfig, params, inputs_BS: jax.Array,
                      inputs_segment_ids_BS: jax.Array, max_lengths_B: jax.Array,
                      rng: jax.Array | None, *, num_steps: int, beam_size: int | None,
                      alpha: float, temperature: float, top_k: int,
                      top_p: float) -> jax.Array:
  """`generate_seq2seq` after validation: one compile per (batch size, source width)."""
  model = decode_model(config)
  batch = inputs_BS.shape[0]
  inputs_positions_BS = jnp.broadcast_to(jnp.arange(inputs_BS.shape[1]), inputs_BS.shape)
  encoded_BSE = model.apply({"params": params}, inputs_BS, inputs_segment_ids_BS,
                            inputs_positions_BS, method="encode")
  # A call on zero target tokens runs only the cross-attention key/value projections of
  # the encoder output and caches them; the steps then pass no encoder output at all.
  empty_B0 = jnp.zeros((batch, 0), jnp.int32)
  _, variables = model.apply(
      {"params": params, "cache": init_cache(model, batch)}, empty_B0, empty_B0, empty_B0,
      encoded_BSE, inputs_segment_ids_BS, method="decode", mutable=["cache"])

  def logits_fn(tokens_B, state, i):
    tokens_B1 = tokens_B[:, None]
    logits_B1V, variables = model.apply(
        {"params": params, "cache": state["model"]}, tokens_B1, jnp.ones_like(tokens_B1),
        jnp.full_like(tokens_B1, i), None, state["inputs_segment_ids"], method="decode",
        mutable=["cache"])
    return logits_B1V[:, 0], dict(state, model=variables["cache"])

  state = {"model": variables["cache"], "inputs_segment_ids": inputs_segment_ids_BS}
  bos_B = jnp.full((batch,), vocabularies.BOS_ID, jnp.int32)
  return _search(logits_fn, bos_B, state, max_steps=num_steps, max_lengths_B=max_lengths_B,
                 beam_size=beam_size, alpha=alpha, temperature=temperature, top_k=top_k,
                 top_p=top_p, rng=rng)


def generate_seq2seq(config: ModelConfig, params, inputs_BS: jax.Array,
                     inputs_segment_ids_BS: jax.Array, *, max_length_offset: int = 50,
                     beam_size: int | None = None, alpha: float = 0.6,
                     temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                     rng: jax.Array | None = None) -> jax.Array:
  """Encodes each source once, then decodes its target from bos.

  A row's output holds at most min(its source length + `max_length_offset`,
  model.max_len) tokens (the paper: beam 4, alpha 0.6, offset 50). Call it eagerly.

  Args:
    config: the model config (arch "encoder_decoder").
    params: trained parameters.
    inputs_BS: [B, S] source ids, right-padded with PAD_ID (0).
    inputs_segment_ids_BS: [B, S] 1 on real source tokens, 0 on padding.
    max_length_offset: how many tokens an output may exceed its source by.
    beam_size, alpha, temperature, top_k, top_p, rng: as for `generate`.

  Returns:
    [B, min(S + max_length_offset, model.max_len)] ids, through each row's first eos,
    then PAD (0).

  Raises:
    ValueError: on a wrong topology, an empty or left-padded source, a source longer
      than the position table (learned/sinusoidal positions), or inconsistent options.
  """
  if config.arch != "encoder_decoder":
    raise ValueError(f"generate_seq2seq needs arch='encoder_decoder', got {config.arch!r}")
  _check_search(beam_size, temperature, top_k, top_p, rng)
  segment_ids_BS = np.asarray(inputs_segment_ids_BS)
  if inputs_BS.shape != segment_ids_BS.shape or 0 in inputs_BS.shape:
    raise ValueError(f"inputs_BS {inputs_BS.shape} and inputs_segment_ids_BS "
                     f"{segment_ids_BS.shape} must have one equal, non-empty shape")
  if not np.isin(segment_ids_BS, (0, 1)).all():
    raise ValueError("inputs_segment_ids_BS must be 1 on source tokens, 0 on padding "
                     "(one source per row, no packing)")
  lengths_B = _right_padded_lengths(segment_ids_BS == 1, "source")
  width = inputs_BS.shape[1]
  # A position past the table is not clamped: the lookup returns NaN, the encoder rows
  # turn to NaN and the output to padding, without an error.
  table = positions_lib.POSITIONS[config.position].embedding_table
  if width > config.max_len and table is not None:
    raise ValueError(f"sources have {width} positions (longest source {lengths_B.max()} "
                     f"tokens) but model.max_len={config.max_len} with {config.position} "
                     "positions; shorten or split the sources, trim their padding, or "
                     "raise model.max_len")
  if max_length_offset < 0:
    raise ValueError(f"max_length_offset={max_length_offset} must be >= 0")
  num_steps = min(width + max_length_offset, config.max_len)
  max_lengths_B = np.minimum(lengths_B + max_length_offset, config.max_len)
  return _generate_seq2seq(config, params, jnp.asarray(inputs_BS, jnp.int32),
                           jnp.asarray(segment_ids_BS, jnp.int32),
                           jnp.asarray(max_lengths_B, jnp.int32), rng, num_steps=num_steps,
                           beam_size=beam_size, alpha=alpha, temperature=temperature,
                           top_k=top_k, top_p=top_p)
