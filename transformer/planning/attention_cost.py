"""The cost of the fused attention kernels, read from their calls in an optimised HLO text.

XLA's cost analysis sees no FLOPs in a custom call, and a compile-only GPU target leaves
cuDNN's workspace unsized; hlo.py reads the calls and asks this module:
  attention_flops          cuDNN's fused calls and Pallas's splash kernels, from shapes
                           (splash: only the blocks its mask visits, per context shard)
  unsized_cudnn_workspace  cuDNN's backward workspace where XLA left it u8[0]
"""

from __future__ import annotations

import re

import numpy as np

from transformer.config import attention
from transformer.model import context
from transformer.planning import hlo_text as text


def attention_flops(kind: str, instruction: text.Instruction,
                    computation: text.Computation) -> float:
  """A fused attention call's FLOPs from its shapes: XLA's cost analysis sees none.

  The one place for the known cost of the attention kernels a config can pick:
  cuDNN's custom calls (below) and Pallas's splash kernels (`_splash_flops`).
  cuDNN: forward QK^T and PV, 2 x 2 x B x H x Lq x Lk x D; backward 2.5 times that (dQ,
  dK, dV, dP and the recomputed scores), over the blocks a flash kernel visits: a
  causal mask (the call's backend_config says "CAUSAL" or "PADDING_CAUSAL") skips the
  tiles above the diagonal, counted at CUDNN_TILE, the smallest tile cuDNN's flash
  kernels take, so that the count is never above what a kernel computes (the compile
  mode's floor relies on it). Padding's skipped rows are not known from shapes and
  are counted.
  """
  if kind.startswith("attention splash_"):
    return _splash_flops(kind, instruction, computation)
  operands = [text.dims(computation.shape_of(name)) for name in instruction.operands[:3]]
  if len(operands) < 3 or any(len(shape) != 4 for shape in operands):
    return 0.0
  (b, lq, h, d), (_, lk, _, _) = operands[0], operands[1]  # cuDNN: [B, L, H, D].
  forward = 4.0 * b * h * lq * lk * d
  mask = _CUDNN_MASK.search(instruction.rest)
  if mask and "CAUSAL" in mask.group(1):
    forward *= visited_fraction(lq, lk, CUDNN_TILE, CUDNN_TILE, causal=True)
  return forward * (2.5 if "backward" in kind.lower() or "bprop" in kind.lower() else 1.0)


# cuDNN's flash attention tiles (64 or 128 rows and columns on Hopper and Ampere): the
# causal count takes the smaller, which visits the fewest masked entries.
CUDNN_TILE = 64
_CUDNN_MASK = re.compile(r'mask_type\\?"\s*:\s*\\?"(\w+)')


# Pallas splash attention (jax.experimental.pallas.ops.tpu.splash_attention): the
# custom call is named splash_{mha,mqa}_{fwd,dq,dkv}[_segmented]_..., its block sizes
# are in its kernel metadata, and model/attention_ops.py names its mask in a scope.
SPLASH = re.compile(r"splash_m[hq]a_(fwd|dq|dkv)")
_SPLASH_MASK = re.compile(r"splash_mask_(causal|full)(?:_window(\d+))?(?:_zigzag(\d+))?")
# Matmuls of one block pair, in units of one [L, D] x [D, S] product: the forward's
# QK^T and PV; dq recomputes QK^T, then dP = dO V^T and dQ = dS K; dkv recomputes QK^T
# and dP, then dV = P^T dO and dK = dS^T Q (with the fused backward, dQ too).
_SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
_SPLASH_BLOCKS = {"fwd": ("block_q", "block_kv_compute"), "dq": ("block_q_dq", "block_kv_dq"),
                  "dkv": ("block_q_dkv", "block_kv_dkv_compute")}


def _block(rest: str, key: str) -> int | None:
  match = re.search(rf'\\?"{key}\\?":\s*(\d+)', rest)
  return int(match.group(1)) if match else None


def zigzag_rows(shard: int, shards: int, rows: int) -> np.ndarray:
  """The sequence positions of one context shard's `rows` query rows: its slice of
  model/context.py's zig-zag order of the whole `rows * shards` sequence."""
  order = context.zigzag(np.arange(rows * shards)[None], shards)[0]
  return order[shard * rows:(shard + 1) * rows]


def visited_fraction(q_len: int, kv_len: int, block_q: int, block_kv: int, causal: bool,
                     window: int = 0, q_positions: np.ndarray | None = None) -> float:
  """Share of the [q_len, kv_len] scores in the blocks a splash kernel computes.

  Splash skips every (query block, key block) pair its mask rules out entirely and
  computes the others whole: a causal mask over n x n blocks computes n(n+1)/2 of them
  (half, for many blocks; all of them with a single block); a window keeps a band.
  `q_positions` are the rows' sequence positions when they are not 0..q_len-1 (a
  context shard's zig-zag rows): a block then reaches from its rows' least to their
  greatest position.
  """
  if q_positions is None:
    q_positions = np.arange(q_len)
  starts = np.arange(0, q_len, block_q)
  q_min = np.minimum.reduceat(q_positions, starts)[:, None]
  q_max = np.maximum.reduceat(q_positions, starts)[:, None]
  rows = (np.minimum(starts + block_q, q_len) - starts)[:, None]
  k0 = np.arange(0, kv_len, block_kv)[None, :]
  k1 = np.minimum(k0 + block_kv, kv_len) - 1
  keep = np.ones(np.broadcast_shapes(q_min.shape, k0.shape), bool)
  if causal:
    keep &= k0 <= q_max
  if window:
    keep &= k1 >= q_min - (window - 1)
    if not causal:
      keep &= k0 <= q_max + (window - 1)
  area = rows * (k1 - k0 + 1)
  return float((area * keep).sum()) / (q_len * kv_len)


def _splash_flops(kind: str, instruction: text.Instruction,
                  computation: text.Computation) -> float:
  """A splash kernel's FLOPs: 2 x (query elements) x S per matmul, over visited blocks.

  Its first two floating operands of rank >= 3 are q [..., L, D] and k [..., S, D] (the
  integer ones before them are the mask's block tables). A kernel without the mask's
  scope counts every block, as an unmasked kernel would.
  """
  phase = SPLASH.match(kind.removeprefix("attention ")).group(1)
  floats = [text.dims(computation.shape_of(name)) for name in instruction.operands
            if re.match(r"(bf16|f16|f32)\[", computation.shape_of(name))]
  floats = [shape for shape in floats if len(shape) >= 3]
  if len(floats) < 2:
    return 0.0
  q, k = floats[0], floats[1]
  q_len, kv_len = q[-2], k[-2]
  matmuls = _SPLASH_MATMULS[phase]
  if phase == "dkv" and re.search(r'use_fused_bwd_kernel\\?":\s*true', instruction.rest):
    matmuls += 1
  mask = _SPLASH_MASK.search(instruction.rest)
  fraction = 1.0
  block_q, block_kv = (_block(instruction.rest, key) for key in _SPLASH_BLOCKS[phase])
  if mask and not (block_q and block_kv):  # No kernel metadata: the blocks it was built
    # with are config/attention.py's rule for these lengths (splash.block_sizes).
    blocks = attention.splash_blocks(q_len * int(mask.group(3) or 1), kv_len,
                                     int(mask.group(3) or 1))
    block_q, block_kv = blocks if isinstance(blocks, tuple) else (None, None)
  if mask and block_q and block_kv:
    causal, window, shards = mask.group(1) == "causal", int(mask.group(2) or 0), int(
        mask.group(3) or 1)
    if shards > 1:  # A context shard's rows: the mean over the shards (each one's kernel).
      fraction = float(np.mean([
          visited_fraction(q_len, kv_len, block_q, block_kv, causal, window,
                           zigzag_rows(shard, shards, q_len)) for shard in range(shards)]))
    else:
      fraction = visited_fraction(q_len, kv_len, block_q, block_kv, causal, window)
  elements = 1
  for d in q:
    elements *= d
  return 2.0 * matmuls * elements * kv_len * fraction


# cuDNN's attention calls return a workspace (their last result, u8[N]) that XLA sizes by
# asking cuDNN for the compiled graph's need, which takes a GPU: compiling for a
# compile-only target leaves u8[0]. On an H100 (jax 0.11.2, cuDNN 9.19; docs/
# compile-report.md) the backward's workspace was B x L x H x M x (4 x D + 4) bytes for
# gpt_small (12 heads, no GQA) and B x L x H x M x (8 x D + 4) for llama:1b (32 query
# heads over 8 kv heads), at every measured shape (M: the segments a row may hold, 1
# for per-row lengths): the larger factor is the estimate, exact for the one, twice the
# other's main term. Forward calls' workspaces were at most 0.25 MiB: not estimated.
_UNSIZED_WORKSPACE = re.compile(r"\bu8\[0\]")
_CONSTRAINT_SHAPES = re.compile(r"(\w+)\[([\d,]*)\]")


def cudnn_workspace_estimate(b: int, length: int, heads: int, head_dim: int,
                             segments: int) -> int:
  """Bytes of one cuDNN attention backward call's workspace (see above)."""
  return b * length * heads * segments * (8 * head_dim + 4)


def unsized_cudnn_workspace(instruction: text.Instruction) -> int:
  """The estimated workspace of a cuDNN attention backward call XLA left at u8[0];
  0 for any other instruction or a workspace XLA sized."""
  target = text.CUSTOM_TARGET.search(instruction.rest)
  if (instruction.opcode != "custom-call" or not target or "fmha" not in target.group(1)
      or "backward" not in target.group(1).lower()
      or not _UNSIZED_WORKSPACE.search(instruction.shape)):
    return 0
  constraints = instruction.rest.partition("operand_layout_constraints={")[2]
  shapes = [(dtype, [int(d) for d in dims.split(",") if d])
            for dtype, dims in _CONSTRAINT_SHAPES.findall(constraints)]
  if not shapes or len(shapes[0][1]) != 4:
    return 0
  b, length, heads, head_dim = shapes[0][1]  # The query, [B, L, H, D] (layout BTNH).
  # Packed rows pass per-segment lengths [B, M]; per-row lengths are [B].
  segments = next((dims[1] for dtype, dims in shapes if dtype == "s32" and len(dims) == 2), 1)
  return cudnn_workspace_estimate(b, length, heads, head_dim, segments)
