"""Decoding a prefix LM: the prompt is prefilled as the prefix (bidirectional among its
tokens), then tokens follow causally; every search equals the same search over full
forward passes with the prompt as the prefix, and each row decodes as if alone.

The models and helpers are tests/test_decoding.py's (its fast-compile fixture included).
"""

import functools

import jax.numpy as jnp
import numpy as np

from test_decoding import (MAX_LEN, SMALL_VOCAB, after_first_eos_is_pad,  # pylint: disable=unused-import
                           fast_decoding_compiles, jit_fast, model_config, random_params,
                           right_pad, single_document)
from transformer.data.tokenizers.vocabularies import EOS_ID, PAD_ID
from transformer.inference import decoding
from transformer.model.models import make_model

STEPS = 6


def prefix_lm(**overrides):
  """A decoder trained as a prefix LM (model.objective="prefix_lm")."""
  return model_config("decoder", objective="prefix_lm", position="learned",
                      vocab_size=SMALL_VOCAB, **overrides)


@functools.lru_cache(maxsize=None)
def prefix_case():
  """A prefix LM, right-padded prompts of 3 lengths, and the first seed's weights whose
  greedy output stops some rows at eos (before the end) but not all."""
  cfg = prefix_lm()
  assert decoding.prompt_is_prefix(cfg)
  prompts = right_pad([[2, 5, 6, 7, 4], [2, 6], [2, 7, 5, 4]])
  for seed in range(20):
    params = random_params(cfg, seed)
    greedy = np.asarray(decoding.generate(cfg, params, prompts, STEPS))
    stopped = (greedy[:, :-1] == EOS_ID).any(axis=1)
    if stopped.any() and not stopped.all():
      return cfg, params, prompts
  raise AssertionError("no seed stopped some rows at eos but not all")


def full_forward(cfg, params):
  """logits of whole [1, MAX_LEN] rows whose first `length` tokens are the prefix."""
  model = make_model(cfg)

  def forward(sequence_BL, lengths_B):
    prefix_BL = (jnp.arange(MAX_LEN)[None, :] < lengths_B[:, None]).astype(jnp.int32)
    return model.apply({"params": params}, sequence_BL, *single_document(sequence_BL),
                       prefix_BL)
  return jit_fast(forward)


def test_greedy_prefix_lm_equals_the_uncached_loop_with_the_prompt_as_prefix():
  cfg, params, prompts = prefix_case()
  lengths = (prompts != PAD_ID).sum(axis=1)
  forward = full_forward(cfg, params)
  expected = []
  for row, length in enumerate(lengths.tolist()):
    sequence = jnp.zeros((1, MAX_LEN), jnp.int32).at[0, :length].set(prompts[row, :length])
    for i in range(length, length + STEPS):
      logits = forward(sequence, jnp.asarray([length]))
      sequence = sequence.at[0, i].set(jnp.argmax(logits[0, i - 1]))
    expected.append(sequence[0, length:length + STEPS])
  expected = after_first_eos_is_pad(np.stack(expected))
  assert (expected[:, :-1] == EOS_ID).any(), "no row stops early: the test is too weak"
  np.testing.assert_array_equal(decoding.generate(cfg, params, prompts, STEPS), expected)
  # The prefix matters: the causal reading of the same prompts decodes otherwise.
  sequence = jnp.zeros((3, MAX_LEN), jnp.int32).at[:, :prompts.shape[1]].set(prompts)
  causal = make_model(cfg).apply({"params": params}, sequence, *single_document(sequence))
  bidirectional = forward(sequence, lengths)
  assert np.abs(np.asarray(causal - bidirectional)[:, :2]).max() > 1e-3


def test_cached_prefix_lm_beam_search_equals_beam_search_over_full_forward_passes():
  cfg, params, prompts = prefix_case()
  lengths = jnp.asarray((prompts != PAD_ID).sum(axis=1))
  model = make_model(cfg)

  def uncached_logits_fn(tokens_B, cache, i):
    # Step 0 predicts after the prompt's last token; step i > 0 feeds token i - 1's
    # choice at position length + i - 1.
    rows = jnp.arange(tokens_B.shape[0])
    positions_B = cache["lengths"] + i - 1
    sequence_BL = jnp.where(i > 0, cache["sequence"].at[rows, positions_B].set(tokens_B),
                            cache["sequence"])
    prefix_BL = (jnp.arange(MAX_LEN)[None, :] < cache["lengths"][:, None]).astype(jnp.int32)
    logits_BLV = model.apply({"params": params}, sequence_BL, *single_document(sequence_BL),
                             prefix_BL)
    read_B = cache["lengths"] - 1 + i
    logits_BV = jnp.take_along_axis(logits_BLV, read_B[:, None, None], axis=1)[:, 0]
    return logits_BV, dict(cache, sequence=sequence_BL)

  sequence_BL = jnp.zeros((3, MAX_LEN), jnp.int32).at[:, :prompts.shape[1]].set(prompts)
  last_B = jnp.take_along_axis(prompts, (lengths - 1)[:, None], axis=1)[:, 0]
  search = jit_fast(lambda cache: decoding.beam_search(
      uncached_logits_fn, last_B, cache, beam_size=3, max_steps=STEPS, alpha=0.6))
  expected, _ = search({"sequence": sequence_BL, "lengths": lengths})
  np.testing.assert_array_equal(
      decoding.generate(cfg, params, prompts, STEPS, beam_size=3, alpha=0.6), expected[:, 0])


def test_each_prefix_lm_row_beam_searches_as_if_alone():
  """Greedy rows are compared one by one above; beam search's here."""
  cfg, params, prompts = prefix_case()
  search = dict(beam_size=3)
  batch = np.asarray(decoding.generate(cfg, params, prompts, STEPS, **search))
  for row, length in enumerate((prompts != PAD_ID).sum(axis=1).tolist()):
    alone = np.asarray(decoding.generate(cfg, params, prompts[row:row + 1, :length], STEPS,
                                         **search))[0]
    np.testing.assert_array_equal(batch[row], alone, err_msg=f"row {row}")


def test_a_causal_prefix_attention_decodes_as_a_causal_lm():
  """model.prefix_attention="causal" (T5 Table 2's plain LM arm): no bidirectional
  prompt; its decoding is the causal LM's, token for token."""
  cfg, params, prompts = prefix_case()
  causal_cfg = prefix_lm(prefix_attention="causal")
  causal_lm = model_config("decoder", position="learned", vocab_size=SMALL_VOCAB)
  assert not decoding.prompt_is_prefix(causal_cfg)
  np.testing.assert_array_equal(decoding.generate(causal_cfg, params, prompts, STEPS),
                                decoding.generate(causal_lm, params, prompts, STEPS))
  assert not np.array_equal(decoding.generate(cfg, params, prompts, STEPS),
                            decoding.generate(causal_lm, params, prompts, STEPS))
