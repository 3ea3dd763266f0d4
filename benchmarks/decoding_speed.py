"""Decoding speed: the key/value cache against recomputation, and beam-search translation.

Greedy generation with a gpt_small.py:local-shaped decoder (4 layers, d_model 256,
4 heads, MLP 1024, vocab 384; max_len raised to hold the prompt and the new tokens),
once with `decoding.generate` (cached: one token of compute per step) and once
recomputing the forward pass over the whole prefix at every step. Then sentences/s of
beam-4 (and greedy) translation with a 2 + 2 layer, d_model 256 encoder-decoder. All
weights are random: only speed is measured. Compilation is excluded (one warm-up run);
each row reports the best of --repeats runs, the least disturbed by other jobs.

  python benchmarks/decoding_speed.py             # Defaults as in docs/modes.md.
  python benchmarks/decoding_speed.py --batch 8 --new_tokens 128
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from configs import base, gpt_small
from transformer.config.model import ModelConfig
from transformer.data.tokenizers import vocabularies
from transformer.inference import decoding
from transformer.model.models import make_model
# pylint: enable=g-import-not-at-top,wrong-import-position


def best_time(fn: Callable[[], jax.Array], repeats: int) -> tuple[float, jax.Array]:
  """Runs fn once to compile, then `repeats` times; the fastest wall time and the output."""
  out = jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times), out


def init_params(config: ModelConfig, *args: jax.Array):
  model = make_model(dataclasses.replace(config, deterministic=True))
  return nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), *args)["params"])


def single_document(tokens_BL: jax.Array) -> tuple[jax.Array, jax.Array]:
  return jnp.ones_like(tokens_BL), jnp.broadcast_to(jnp.arange(tokens_BL.shape[1]),
                                                    tokens_BL.shape)


def recompute_greedy(config: ModelConfig, params, prompt_BP: jax.Array, num_steps: int,
                     bucket: int) -> jax.Array:
  """Greedy decoding without a cache: each step runs the model over the whole prefix.

  The prefix is padded up to a multiple of `bucket` positions (causality makes the
  padding irrelevant), so that a few programs compile instead of one per length.
  """
  model = make_model(dataclasses.replace(config, deterministic=True))
  batch, prompt_len = prompt_BP.shape
  total = prompt_len + num_steps

  @functools.partial(jax.jit, static_argnames="width")
  def fill(buffer_BT, lo, hi, *, width):
    def body(q, buffer_BT):  # Position q's token is the argmax of the logits at q - 1.
      window_BW = buffer_BT[:, :width]
      logits_BWV = model.apply({"params": params}, window_BW, *single_document(window_BW))
      next_B = jnp.argmax(jax.lax.dynamic_index_in_dim(logits_BWV, q - 1, axis=1,
                                                       keepdims=False), axis=-1)
      return jax.lax.dynamic_update_slice(buffer_BT, next_B[:, None].astype(jnp.int32),
                                          (0, q))
    return jax.lax.fori_loop(lo, hi, body, buffer_BT)

  buffer_BT = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_len].set(prompt_BP)
  q = prompt_len
  while q < total:
    width = min(-(-q // bucket) * bucket, total)
    hi = min(width, total - 1) + 1  # A window of `width` predicts positions up to width.
    buffer_BT = fill(buffer_BT, q, hi, width=width)
    q = hi
  return buffer_BT[:, prompt_len:]


def decoder_config(max_len: int) -> ModelConfig:
  config = gpt_small.get_config("local")
  config.model.max_len = max_len
  return ModelConfig.from_config(config.model)


def encoder_decoder_config(max_len: int) -> ModelConfig:
  config = base.get_config()
  config.model.update(arch="encoder_decoder", head="lm", vocab_size=384, d_model=256,
                      num_layers=2, num_decoder_layers=2, num_heads=4, mlp_dim=1024,
                      max_len=max_len, position="sinusoidal", norm="post",
                      activation="relu", scale_embeddings=True, share_embeddings=True,
                      tie_embeddings=True, embed_dropout=0.0, residual_dropout=0.0)
  return ModelConfig.from_config(config.model)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=1, help="decoder prompts per call")
  parser.add_argument("--prompt_len", type=int, default=16)
  parser.add_argument("--new_tokens", type=int, default=256)
  parser.add_argument("--bucket", type=int, default=64,
                      help="recompute: the prefix is padded to a multiple of this")
  parser.add_argument("--sentences", type=int, default=32, help="sources per seq2seq call")
  parser.add_argument("--source_len", type=int, default=20, help="mean source length")
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--alpha", type=float, default=0.6)
  parser.add_argument("--max_length_offset", type=int, default=50)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  print(f"JAX {jax.__version__} on {jax.devices()[0].device_kind} "
        f"({jax.default_backend()}), best of {args.repeats} runs after a warm-up\n")

  # ---- decoder: cache vs recomputation
  max_len = max(300, args.prompt_len + args.new_tokens)
  cfg = decoder_config(max_len)
  prompt_BP = jnp.asarray(rng.integers(vocabularies.NUM_SPECIAL, cfg.vocab_size,
                                       (args.batch, args.prompt_len)), jnp.int32)
  params = init_params(cfg, prompt_BP, *single_document(prompt_BP))
  cached_s, cached = best_time(
      lambda: decoding.generate(cfg, params, prompt_BP, args.new_tokens), args.repeats)
  recompute_s, recomputed = best_time(
      lambda: recompute_greedy(cfg, params, prompt_BP, args.new_tokens, args.bucket),
      args.repeats)
  # Timing is only fair if no row stopped early at eos (the recomputation never stops).
  assert not (np.asarray(cached) == vocabularies.EOS_ID).any(), "a row hit eos; change seeds"
  tokens = args.batch * args.new_tokens
  print(f"Greedy, {args.new_tokens} new tokens after a {args.prompt_len}-token prompt, "
        f"batch {args.batch}: decoder {cfg.num_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.num_heads} heads, mlp {cfg.mlp_dim}, vocab {cfg.vocab_size}, "
        f"max_len {cfg.max_len}, {jnp.dtype(cfg.dtype).name}")
  print(f"  {'method':<34}{'seconds':>9}{'tokens/s':>11}{'speed-up':>10}")
  print(f"  {'recompute the prefix every step':<34}{recompute_s:>9.3f}"
        f"{tokens / recompute_s:>11.1f}{1.0:>9.1f}x")
  print(f"  {'key/value cache':<34}{cached_s:>9.3f}{tokens / cached_s:>11.1f}"
        f"{recompute_s / cached_s:>9.1f}x")
  agree = (np.asarray(cached) == np.asarray(recomputed)).mean()
  print(f"  same tokens from both: {agree:.1%}\n")

  # ---- encoder-decoder: translation sentences/s
  lengths_B = rng.integers(args.source_len - 4, args.source_len + 5, args.sentences)
  width = int(lengths_B.max())
  cfg = encoder_decoder_config(max(128, width + args.max_length_offset))
  real_BS = np.arange(width)[None, :] < lengths_B[:, None]
  inputs_BS = jnp.asarray(np.where(real_BS, rng.integers(vocabularies.NUM_SPECIAL,
                                                         cfg.vocab_size, real_BS.shape),
                                   vocabularies.PAD_ID), jnp.int32)
  segment_ids_BS = jnp.asarray(real_BS, jnp.int32)
  params = init_params(cfg, inputs_BS, segment_ids_BS, single_document(inputs_BS)[1],
                       inputs_BS, segment_ids_BS, single_document(inputs_BS)[1])
  print(f"Translation of {args.sentences} sources of {lengths_B.min()}-{lengths_B.max()} "
        f"tokens in one batch, output <= source + {args.max_length_offset}: "
        f"encoder-decoder {cfg.num_layers} + {cfg.num_decoder_layers} layers, d_model "
        f"{cfg.d_model}, {cfg.num_heads} heads, mlp {cfg.mlp_dim}, vocab {cfg.vocab_size}, "
        f"{jnp.dtype(cfg.dtype).name}")
  print(f"  {'search':<34}{'seconds':>9}{'sentences/s':>14}{'mean output':>13}")
  for name, search in [("greedy", {}),
                       (f"beam {args.beam_size}, alpha {args.alpha}",
                        dict(beam_size=args.beam_size, alpha=args.alpha))]:
    seconds, out = best_time(lambda search=search: decoding.generate_seq2seq(
        cfg, params, inputs_BS, segment_ids_BS, max_length_offset=args.max_length_offset,
        **search), args.repeats)
    mean_len = (np.asarray(out) != vocabularies.PAD_ID).sum(axis=1).mean()
    print(f"  {name:<34}{seconds:>9.3f}{args.sentences / seconds:>14.1f}{mean_len:>13.1f}")


if __name__ == "__main__":
  main()
