"""The attention kernels' table: what each `model.attention_impl` kernel can compute.

One `Kernel` entry per kernel holds every fact the rest of the code asks about it: where
`auto` picks it, whether it serves a sequence sharded over a context axis, which layer
kinds it takes (bias, softcap, dropout, a decoding step, a prefix LM's mask), its dtype
and head-size limits, and its block rule (`splash_blocks`: the block sizes the kernel is
built with, the rule validation checks and the compile mode's cost accounting reads).
Config validation,
model/attention_ops.py (`unsupported_reason`, `choose_kernel`, the dispatch) and
planning/ read this table; model/attention_ops.py's `KERNEL_FUNCTIONS` binds each name to
its code (tests/test_config_registries.py holds the two equal). Plain Python: config/ may
import no model code, and the table is what validation needs before anything is traced.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from transformer.config.errors import fail

SPLASH_LANES = 128  # Splash's blocks are multiples of the TPU's 128 lanes...
SPLASH_MAX_BLOCK = 512  # ... and at most this (MaxText's default; VMEM-sized).


@dataclasses.dataclass(frozen=True)
class LayerKind:
  """The static facts of one attention call that decide which kernel can serve it."""
  causal: bool
  window: int = 0
  has_bias: bool = False
  softcap: float = 0.0
  dropout: bool = False
  decoding: bool = False  # A KV-cache call: queries are not the keys' positions.
  cross: bool = False  # Queries of one sequence, keys of another (an encoder's output).
  # Rows may hold several documents (model.attention_max_segments > 1): cuDNN's packed
  # layout, which needs an sm_90 GPU; False: one document a row, any cuDNN GPU.
  packed: bool = True
  # A prefix LM's self-attention (T5's decoder_causal_attention): the tokens of each
  # packed segment's prefix (a per-row, per-segment run the data decides, the `prefix`
  # batch field) see each other bidirectionally; every other pair is causal.
  prefix: bool = False


def _largest_block(length: int) -> int | None:
  """The largest multiple of SPLASH_LANES, at most SPLASH_MAX_BLOCK, dividing `length`."""
  for block in range(SPLASH_MAX_BLOCK, 0, -SPLASH_LANES):
    if length % block == 0:
      return block
  return None


def splash_blocks(q_len: int, kv_len: int, shards: int = 1) -> tuple[int, int] | str:
  """Splash's (query block, key block) for these lengths, or why there is none.

  Every block is a multiple of 128 (the kernel's lanes; its backward pass tiles segment
  ids by them), at most 512, and divides its length. With the queries cut into `shards`
  context shards (model/context.py's zig-zag: two chunks of L / 2n a shard) the query
  block divides a shard's rows, and preferably a chunk: a block spanning a shard's early
  and late chunk reaches from its first to its last position and so computes every key
  block up to the late one (correct, but more work; planning/hlo.py counts it).
  """
  kv_block = _largest_block(kv_len)
  if shards > 1 and q_len % (2 * shards) == 0:
    q_block = _largest_block(q_len // (2 * shards)) or _largest_block(q_len // shards)
  else:
    q_block = _largest_block(q_len // shards) if q_len % shards == 0 else None
  for name, length, block in (("query", q_len // shards, q_block), ("key", kv_len, kv_block)):
    if block is None:
      where = f" (per context shard, of {shards})" if shards > 1 and name == "query" else ""
      return (f"splash attention tiles the {name} length in blocks of a multiple of "
              f"{SPLASH_LANES}; {length}{where} is not a multiple of {SPLASH_LANES}")
  return q_block, kv_block


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One attention kernel's facts (the `KERNELS` table)."""
  platforms: tuple[str, ...] = ()  # Where `auto` picks it first (jax platform names).
  context: bool = True  # Serves a sequence sharded over context axes (model/context.py).
  bias: bool = True  # Takes an additive logit bias (T5 relative positions, ALiBi).
  softcap: bool = True  # Caps the scores (Gemma 2).
  dropout: bool = True  # Draws dropout on the attention probabilities.
  decoding: bool = True  # Serves a decoding step with a KV cache.
  dtypes: tuple[str, ...] = ()  # The compute dtypes it takes; () any.
  max_head_dim: int = 0  # 0: any head size.
  head_dim_multiple: int = 1
  bidirectional_window: bool = True  # A sliding window without causality.
  prefix: bool = True  # Serves a bidirectional prefix per row and segment (LayerKind.prefix).
  # (q_len, kv_len, context shards) -> its (query, key) blocks, or why it cannot tile them.
  blocks: Callable[[int, int, int], tuple[int, int] | str] | None = None


# The fused kernels' messages name them; the dense ones (einsum, xla) serve everything
# their fields allow. Order: "auto", then the table, is model.attention_impl's list.
# A prefix LM's mask (LayerKind.prefix) is dense-only: the prefix ends at a different
# place in every row and packed segment, as the data decides. cuDNN's mask types in jax
# 0.10 (fused_attention_stablehlo.MaskType: NO_MASK, PADDING, CAUSAL, PADDING_CAUSAL,
# ALIBI) make a whole call causal or not; any other pattern goes through its dense `mask`
# argument, which jax turns into an additive [B, 1, L, S] bias (combine_bias_and_mask):
# the full-square scores the kernel exists to avoid, and a bias cuDNN here does not take.
# Splash's masks (splash_attention_mask: CausalMask, LocalMask, ChunkedCausalMask,
# NumpyMask, FullMask and their and/or) are one static [L, S] pattern for every row,
# built on the host before tracing; its segment ids separate documents but cannot say
# where each one's prefix ends.
KERNELS: dict[str, Kernel] = {
    "xla": Kernel(softcap=False, dropout=False),
    "einsum": Kernel(),
    "cudnn": Kernel(platforms=("gpu", "cuda"), context=False, bias=False, softcap=False,
                    dropout=False, decoding=False, dtypes=("bfloat16", "float16"),
                    max_head_dim=128, head_dim_multiple=8, bidirectional_window=False,
                    prefix=False),
    "splash": Kernel(platforms=("tpu",), bias=False, dropout=False, decoding=False,
                     blocks=splash_blocks, prefix=False),
}
ATTENTION_IMPLS = ("auto",) + tuple(KERNELS)
FUSED = tuple(name for name, kernel in KERNELS.items() if kernel.platforms)


def fused_kernel(platform: str) -> str | None:
  """The kernel `auto` tries first on `platform`; None: xla (einsum where only it can)."""
  return next((name for name in FUSED if platform in KERNELS[name].platforms), None)


def unsupported_reason(name: str, kind: LayerKind, *, dtype: str, head_dim: int,
                       q_len: int | None, kv_len: int | None, context: int = 1) -> str | None:
  """Why kernel `name` cannot compute this call on any device, or None when it can (what
  depends on the device, cuDNN being installed say, is attention_ops.py's). `dtype` is a
  dtype name; `context` is how many shards the sequence is cut into."""
  kernel = KERNELS[name]
  if context > 1 and not kernel.context:
    return (f"{name} attention does not run on a sequence sharded over a context axis "
            f"({context} shards); context parallelism uses "
            f"{', '.join(n for n, k in KERNELS.items() if k.context)}")
  if kind.softcap and not kernel.softcap:
    return f"{name} attention has no logit softcapping"
  if kind.dropout and not kernel.dropout:
    return f"{name} attention draws no dropout on the attention probabilities"
  if kind.has_bias and not kernel.bias:
    return f"{name} attention takes no additive bias (T5 relative positions, ALiBi)"
  if kind.prefix and not kernel.prefix:
    return (f"{name} attention cannot express a prefix LM's mask (a bidirectional prefix "
            f"per row and packed segment; config/attention.py says why); it runs on "
            f"{', '.join(n for n, k in KERNELS.items() if k.prefix)}")
  if kind.decoding and not kernel.decoding:
    return f"a decoding step with a KV cache is not a {name} attention call"
  if kernel.dtypes and dtype not in kernel.dtypes:
    return f"{name} attention needs {' or '.join(kernel.dtypes)} (model.dtype is {dtype})"
  if (kernel.max_head_dim and head_dim > kernel.max_head_dim
      or head_dim % kernel.head_dim_multiple):
    return (f"{name} attention needs a head size that is a multiple of "
            f"{kernel.head_dim_multiple}, at most {kernel.max_head_dim} (model.head_dim is "
            f"{head_dim})")
  if kind.window and not kind.causal and not kernel.bidirectional_window:
    return f"{name} attention's sliding window is causal only"
  if kernel.blocks and q_len is not None and kv_len is not None:
    blocks = kernel.blocks(q_len, kv_len, context)
    if isinstance(blocks, str):
      return blocks
  return None


def validate_lengths(config: ml_collections.ConfigDict, shards: int) -> None:
  """An explicit kernel with a block rule must tile data.seq_len (per context shard):
  otherwise the kernel would fail when it is built. `auto` falls back instead."""
  impl, seq_len = config.model.attention_impl, config.data.seq_len
  kernel = KERNELS.get(impl)
  if kernel is None or kernel.blocks is None:
    return
  blocks = kernel.blocks(seq_len, seq_len, shards)
  if isinstance(blocks, str):
    fail("model.attention_impl", impl, f"cannot serve data.seq_len={seq_len}: {blocks}; "
         f"pick a data.seq_len it tiles, or model.attention_impl='auto' (falls back to "
         "xla for such a length, saying so once) or 'xla'")
