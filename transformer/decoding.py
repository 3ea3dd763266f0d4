"""Autoregressive decoding with a key/value cache, for the decoder and the encoder-decoder.

The model runs in decode mode (`ModelConfig.decode=True`): each causal
self-attention keeps max_len key/value slots in the "cache" collection, slot s for
position s. A prompt is prefilled in one call, then one token per step is added;
a step costs one token's worth of compute instead of a forward pass over the prefix.
Tokens are picked greedily (temperature 0) or sampled from softmax(logits / T).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.configuration import ModelConfig
from transformer.data import tokenizers
from transformer.models import make_model


def decode_model(config: ModelConfig) -> nn.Module:
  """The model in decode mode (no dropout, cached self-attention)."""
  return make_model(dataclasses.replace(config, deterministic=True, decode=True))


def _empty_cache(model: nn.Module, batch_size: int) -> dict:
  """Zeros in the shapes the cache takes, found without running (or initialising) anything."""
  length = model.config.max_len
  tokens = jnp.zeros((batch_size, length), jnp.int32)
  ones = jnp.ones_like(tokens)
  positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
  args = (tokens, ones, positions)
  if model.config.arch == "encoder_decoder":
    args = args + args
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), *args)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), variables["cache"])


def _pick(logits_BV: jax.Array, temperature: float, rng: jax.Array) -> jax.Array:
  if temperature == 0.0:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  return jax.random.categorical(rng, logits_BV / temperature).astype(jnp.int32)


def _check_length(config: ModelConfig, used: int) -> None:
  if used > config.max_len:
    raise ValueError(f"decoding needs {used} positions but model.max_len={config.max_len}; "
                     "shorten the prompt or num_steps, or raise model.max_len")


@functools.partial(jax.jit, static_argnames=("config", "num_steps", "temperature"))
def generate(config: ModelConfig, params, prompt_BP: jax.Array, num_steps: int, *,
             temperature: float = 0.0, rng: jax.Array | None = None) -> jax.Array:
  """Continues each prompt row of a decoder-only LM by `num_steps` tokens.

  Args:
    config: the model config (arch "decoder", head "lm").
    params: trained parameters.
    prompt_BP: [B, P] token ids, one unpadded prompt per row (P >= 1, e.g. just bos).
    num_steps: tokens to generate.
    temperature: 0 for greedy; otherwise sample from softmax(logits / temperature).
    rng: PRNG key, required when sampling.

  Returns:
    [B, num_steps] generated ids.
  """
  if config.arch != "decoder" or config.head != "lm":
    raise ValueError(f"generate needs a decoder LM, got arch={config.arch!r}, "
                     f"head={config.head!r}; use generate_seq2seq for encoder_decoder")
  batch, prompt_len = prompt_BP.shape
  _check_length(config, prompt_len + num_steps)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  model = decode_model(config)
  cache = _empty_cache(model, batch)

  def run(cache, tokens_BL, start):
    positions_BL = start + jnp.broadcast_to(jnp.arange(tokens_BL.shape[1]), tokens_BL.shape)
    logits_BLV, variables = model.apply(
        {"params": params, "cache": cache}, tokens_BL, jnp.ones_like(tokens_BL),
        positions_BL, mutable=["cache"])
    return logits_BLV[:, -1], variables["cache"]

  logits_BV, cache = run(cache, prompt_BP, 0)  # Prefill the whole prompt at once.
  first = _pick(logits_BV, temperature, jax.random.fold_in(rng, 0))

  def step(carry, i):
    cache, token_B = carry
    logits_BV, cache = run(cache, token_B[:, None], prompt_len + i)
    token_B = _pick(logits_BV, temperature, jax.random.fold_in(rng, i + 1))
    return (cache, token_B), token_B

  _, rest = jax.lax.scan(step, (cache, first), jnp.arange(num_steps - 1))
  return jnp.concatenate([first[:, None], rest.T], axis=1)


@functools.partial(jax.jit, static_argnames=("config", "num_steps", "temperature"))
def generate_seq2seq(config: ModelConfig, params, inputs_BS: jax.Array,
                     inputs_segment_ids_BS: jax.Array, num_steps: int, *,
                     temperature: float = 0.0, rng: jax.Array | None = None) -> jax.Array:
  """Encodes each source row once, then decodes `num_steps` target tokens from bos.

  Args:
    config: the model config (arch "encoder_decoder").
    params: trained parameters.
    inputs_BS: [B, S] source ids (padding 0).
    inputs_segment_ids_BS: 1 on real source tokens, 0 on padding.
    num_steps: target tokens to generate.
    temperature, rng: as for `generate`.

  Returns:
    [B, num_steps] ids; after a row's first eos, everything is pad (0).
  """
  if config.arch != "encoder_decoder":
    raise ValueError(f"generate_seq2seq needs arch='encoder_decoder', got {config.arch!r}")
  _check_length(config, num_steps)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  model = decode_model(config)
  batch = inputs_BS.shape[0]
  inputs_positions_BS = jnp.broadcast_to(jnp.arange(inputs_BS.shape[1]), inputs_BS.shape)
  encoded_BSE = model.apply({"params": params}, inputs_BS, inputs_segment_ids_BS,
                            inputs_positions_BS, method="encode")
  cache = _empty_cache(model, batch)

  def step(carry, i):
    cache, token_B, done_B = carry
    token_BL = token_B[:, None]
    logits_BLV, variables = model.apply(
        {"params": params, "cache": cache}, token_BL, jnp.ones_like(token_BL),
        jnp.full_like(token_BL, i), encoded_BSE, inputs_segment_ids_BS, method="decode",
        mutable=["cache"])
    token_B = _pick(logits_BLV[:, -1], temperature, jax.random.fold_in(rng, i))
    token_B = jnp.where(done_B, tokenizers.PAD_ID, token_B)
    return (variables["cache"], token_B, done_B | (token_B == tokenizers.EOS_ID)), token_B

  bos = jnp.full((batch,), tokenizers.BOS_ID, jnp.int32)
  _, tokens = jax.lax.scan(step, (cache, bos, jnp.zeros((batch,), bool)),
                           jnp.arange(num_steps))
  return tokens.T
