"""A compiled program's optimised HLO text, read for what XLA's cost analysis leaves out.

One parse serves every count the compile mode takes from the program text:
  collectives  bytes each collective kind moves per chip (collectives.py names the kinds),
  FLOPs        of every dot and convolution (inside fusions too) and of the fused
               attention custom calls, whose cost XLA cannot see (counted from shapes),
  bytes        each kernel reads and writes in HBM: the operands and results of every
               instruction of a non-fused computation that runs as a kernel (a fusion,
               a custom call, a copy, a collective, ...), a dynamic slice counting only
               the slice it reads and an in-place update only the update it writes,
  kernels      how many fused-attention calls of which kind, matmul custom calls and
               collectives the step launches, per step (loops multiplied out).
Everything is counted once per execution: an instruction inside a while loop counts
once per trip. The trip count is XLA's `known_trip_count` where the backend config
has one (GPU), else it is read from the loop's condition, `compare(iv, constant(N)),
direction=LT`, with the induction variable's start from the loop's initial tuple and its
step from the body's `add(iv, constant(c))` (XLA's TPU compiler drops the annotation: a
scanned stack of N layers would otherwise count once; its windowed einsums step by 2).
A loop whose count cannot be read (a decode that stops at eos) counts once, and
`Counts.unknown_loops` says how many such loops there were.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from transformer.config import attention
from transformer.model import context

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
          "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?.*\{\s*$")
_INSTRUCTION = re.compile(r"^(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_CALLEE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|"
                     r"false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OPERAND = re.compile(r"%([\w.\-]+)")
_CUSTOM_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=([\w]+)_([\w]+)->([\w]+)")
_FEATURE_GROUPS = re.compile(r"feature_group_count=(\d+)")
_CONSTANT = re.compile(r"constant\((-?\d+)\)")
# Custom calls that reserve or name a buffer and move no bytes (XLA's TPU compiler).
_NO_TRAFFIC = re.compile(r'custom_call_target="(AllocateBuffer|Sharding|SPMDFullToShardShape|'
                         r'SPMDShardToFullShape|MoveToHost|MoveToDevice)"')
# Instructions that launch no kernel and move no HBM bytes of their own.
_FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "while", "call",
         "conditional", "after-all", "partition-id", "replica-id", "opt-barrier",
         "add-dependency", "domain", "iota"}
_FREE_SUFFIXES = ("-done", "-update")  # The async halves whose -start already counted.


def array_bytes(shape_text: str) -> list[int]:
  """Bytes of each array in an HLO shape (a tuple gives several)."""
  sizes = []
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype in _BYTES:
      sizes.append(_count(dims) * _BYTES[dtype])
  return sizes


def _dims(shape_text: str) -> list[int]:
  match = _ARRAY.search(shape_text)
  return [int(d) for d in match.group(2).split(",") if d] if match else []


def _count(dims: str) -> int:
  count = 1
  for d in filter(None, dims.split(",")):
    count *= int(d)
  return count


@dataclasses.dataclass
class _Instruction:
  name: str
  shape: str
  opcode: str
  rest: str  # Operands and attributes, as printed.

  @property
  def operands(self) -> list[str]:
    depth, end = 1, 0
    for end, char in enumerate(self.rest):
      depth += {"(": 1, ")": -1}.get(char, 0)
      if depth == 0:
        break
    return _OPERAND.findall(self.rest[:end])


@dataclasses.dataclass
class _Computation:
  name: str
  instructions: list[_Instruction] = dataclasses.field(default_factory=list)
  root: _Instruction | None = None

  shapes: dict[str, str] = dataclasses.field(default_factory=dict)  # Name -> result shape.

  def shape_of(self, name: str) -> str:
    return self.shapes.get(name, "")


@dataclasses.dataclass
class Counts:
  """What one execution of a compiled program does, per chip, loops multiplied out."""

  flops: float = 0.0  # Dots, convolutions and fused-attention calls.
  # The part of `flops` in kernels XLA's cost analysis cannot see (fused attention:
  # cuDNN's custom calls, Pallas's splash kernels), counted from their shapes.
  opaque_flops: float = 0.0
  bytes_accessed: float = 0.0  # HBM bytes the kernels read and write.
  collective_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
  kernels: dict[str, int] = dataclasses.field(default_factory=dict)  # Kind -> launches.
  unknown_loops: int = 0  # Loops whose trip count could not be read (counted once).
  # The largest cuDNN attention backward workspace XLA left unsized (a compile-only GPU
  # target), as `cudnn_workspace_estimate` sizes it; the calls share one buffer.
  cudnn_workspace: int = 0
  loops: dict[str, int] = dataclasses.field(default_factory=dict)  # Body -> trips found.

  def add(self, other: "Counts", times: int = 1) -> None:
    self.flops += other.flops * times
    self.opaque_flops += other.opaque_flops * times
    self.bytes_accessed += other.bytes_accessed * times
    for kind, n in other.collective_bytes.items():
      self.collective_bytes[kind] = self.collective_bytes.get(kind, 0) + n * times
    for kind, n in other.kernels.items():
      self.kernels[kind] = self.kernels.get(kind, 0) + n * times
    self.unknown_loops += other.unknown_loops
    self.cudnn_workspace = max(self.cudnn_workspace, other.cudnn_workspace)


def parse(hlo_text: str) -> tuple[dict[str, _Computation], str]:
  """Computations by name, and the entry computation's name."""
  computations: dict[str, _Computation] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if current is None:
      match = _COMPUTATION.match(stripped)
      if match and not stripped.startswith(("HloModule", "//")):
        current = computations.setdefault(match.group(1), _Computation(match.group(1)))
        if stripped.startswith("ENTRY"):
          entry = current.name
      continue
    if stripped == "}":
      current = None
      continue
    match = _INSTRUCTION.match(stripped)
    if match:
      instruction = _Instruction(*match.groups())
      current.instructions.append(instruction)
      current.shapes[instruction.name] = instruction.shape
      if stripped.startswith("ROOT"):
        current.root = instruction
    elif current.instructions:
      # An attribute printed over several lines (a Pallas kernel's kernel_metadata):
      # its op_name and backend_config follow on the next lines.
      current.instructions[-1].rest += "\n" + stripped
  return computations, entry


def _trip_count(line: str, condition: _Computation | None,
                computations: dict[str, _Computation]) -> tuple[int | None, int | None]:
  """XLA's known_trip_count, else N of the condition's `compare(iv, constant(N)) LT`.

  Returns (the count or the bound N, the induction variable's index in the loop's tuple;
  None with a known_trip_count, which needs no start or step).
  """
  known = _TRIPS.search(line)
  if known:
    return int(known.group(1)), None
  if condition is None or condition.root is None:
    return None, None
  root = condition.root
  outer_operands = None
  if root.opcode == "fusion":  # TPU and GPU fuse the compare: look inside.
    callee = _CALLEE.search(root.rest)
    fused = computations.get(callee.group(2)) if callee else None
    if fused is None or fused.root is None:
      return None, None
    constants = {i.name: i for i in fused.instructions if i.opcode == "constant"}
    outer = {i.name: i for i in condition.instructions if i.opcode == "constant"}
    arguments = outer_operands = root.operands
    params = {}
    for i in fused.instructions:  # A bound passed into the fusion as a parameter.
      index = re.match(r"(\d+)", i.rest) if i.opcode == "parameter" else None
      if index:
        params[i.name] = int(index.group(1))
      if index and int(index.group(1)) < len(arguments) and arguments[int(index.group(1))] in outer:
        constants[i.name] = outer[arguments[int(index.group(1))]]
    root = fused.root
  else:
    constants = {i.name: i for i in condition.instructions if i.opcode == "constant"}
  if root.opcode != "compare" or "direction=LT" not in root.rest:
    return None, None
  operands = root.operands
  if len(operands) != 2 or operands[1] not in constants:
    return None, None
  value = _CONSTANT.search(f"constant({constants[operands[1]].rest}")
  if not value:
    return None, None
  iv = operands[0]
  if outer_operands is not None:  # The fusion's parameter -> the condition's operand.
    iv = outer_operands[params[iv]] if params.get(iv, len(outer_operands)) < len(outer_operands) else ""
  by_name = {i.name: i for i in condition.instructions}
  element = by_name.get(iv)
  index = (re.search(r"index=(\d+)", element.rest)
           if element is not None and element.opcode == "get-tuple-element" else None)
  return int(value.group(1)), int(index.group(1)) if index else None


def _constant_value(name: str, computation: _Computation) -> int | None:
  """The integer a constant (or a copy of one) named `name` holds, else None."""
  instruction = next((i for i in computation.instructions if i.name == name), None)
  if instruction is not None and instruction.opcode == "copy" and instruction.operands:
    return _constant_value(instruction.operands[0], computation)
  if instruction is None or instruction.opcode != "constant":
    return None
  value = _CONSTANT.search(f"constant({instruction.rest}")
  return int(value.group(1)) if value else None


def _start_and_step(index: int, loop: _Instruction, computation: _Computation,
                    body: _Computation | None) -> tuple[int, int]:
  """The induction variable's first value (the loop's initial tuple) and its step (the
  body's `add(iv, constant(c))`); (0, 1), lax.fori_loop's and scan's, where unreadable.

  XLA's TPU windowed einsums (an all-gather or reduce-scatter overlapped with its matmul)
  run two shards per trip, their counter stepping by 2 up to the shard count.
  """
  start, step = 0, 1
  init = next((i for i in computation.instructions if i.name in loop.operands[:1]), None)
  if init is not None and init.opcode == "tuple" and index < len(init.operands):
    value = _constant_value(init.operands[index], computation)
    start = value if value is not None else 0
  root = body.root if body is not None else None
  if root is None or root.opcode != "tuple" or index >= len(root.operands):
    return start, step
  update = next((i for i in body.instructions if i.name == root.operands[index]), None)
  if update is not None and update.opcode == "add":
    for operand in update.operands:
      value = _constant_value(operand, body)
      if value is not None and value > 0:
        step = value
  return start, step


def _dot_flops(instruction: _Instruction, computation: _Computation) -> float:
  out = 1
  for d in _dims(instruction.shape):
    out *= d
  if instruction.opcode == "dot":
    lhs = _dims(computation.shape_of(instruction.operands[0]))
    match = _CONTRACTING.search(instruction.rest)
    contracting = 1
    for d in (match.group(1).split(",") if match else []):
      if d:
        contracting *= lhs[int(d)]
    return 2.0 * out * contracting
  return _convolution_flops(instruction, computation)


_WINDOW = re.compile(r"window=\{([^}]*)\}")


def _window_field(window: str, key: str, count: int, default: int) -> list[int]:
  match = re.search(rf"\b{key}=([\d_x]+)", window)
  if not match:
    return [default] * count
  return [int(v.split("_")[0]) for v in match.group(1).split("x")]


def _convolution_flops(instruction: _Instruction, computation: _Computation) -> float:
  """2 x multiply-adds of a convolution, counting only the window taps that land on input.

  XLA's TPU compiler writes batched matmuls (attention's per-head products) as
  convolutions whose window runs over a padded, dilated dimension; most taps of such
  a window fall on padding, so each spatial dimension's taps are counted one by one.
  """
  labels = _DIM_LABELS.search(instruction.rest)
  operands = instruction.operands
  if not labels or len(operands) < 2:
    return 0.0
  lhs_labels, rhs_labels, out_labels = labels.groups()
  lhs = _dims(computation.shape_of(operands[0]))
  rhs = _dims(computation.shape_of(operands[1]))
  out = _dims(instruction.shape)
  if len(lhs) != len(lhs_labels) or len(rhs) != len(rhs_labels) or len(out) != len(out_labels):
    return 0.0
  spatial = sorted(label for label in out_labels if label.isdigit())
  window = _WINDOW.search(instruction.rest)
  text = window.group(1) if window else ""
  n = len(spatial)
  strides = _window_field(text, "stride", n, 1)
  lhs_dilation = _window_field(text, "lhs_dilate", n, 1)
  rhs_dilation = _window_field(text, "rhs_dilate", n, 1)
  pads = re.search(r"\bpad=([\d_x\-]+)", text)
  lows = [int(p.split("_")[0]) for p in pads.group(1).split("x")] if pads else [0] * n
  taps = 1
  for j, label in enumerate(spatial):
    size_out, size_in = out[out_labels.index(label)], lhs[lhs_labels.index(label)]
    size_kernel = rhs[rhs_labels.index(label)]
    o = np.arange(size_out)[:, None]
    k = np.arange(size_kernel)[None, :]
    position = o * strides[j] + k * rhs_dilation[j] - lows[j]
    valid = ((position >= 0) & (position % lhs_dilation[j] == 0)
             & (position // lhs_dilation[j] < size_in))
    taps *= int(valid.sum())
  others = 1
  for label, size in zip(out_labels, out):
    if not label.isdigit():
      others *= size
  return 2.0 * others * rhs[rhs_labels.index("i")] * taps


def attention_flops(kind: str, instruction: _Instruction, computation: _Computation) -> float:
  """A fused attention call's FLOPs from its shapes: XLA's cost analysis sees none.

  The one place for the known cost of the attention kernels a config can pick:
  cuDNN's custom calls (below) and Pallas's splash kernels (`_splash_flops`).
  cuDNN: forward QK^T and PV, 2 x 2 x B x H x Lq x Lk x D; backward 2.5 times that (dQ,
  dK, dV, dP and the recomputed scores). Causal masking is not subtracted: the kernel
  visits the masked blocks of a tile it must compute anyway.
  """
  if kind.startswith("attention splash_"):
    return _splash_flops(kind, instruction, computation)
  operands = [_dims(computation.shape_of(name)) for name in instruction.operands[:3]]
  if len(operands) < 3 or any(len(shape) != 4 for shape in operands):
    return 0.0
  (b, lq, h, d), (_, lk, _, _) = operands[0], operands[1]  # cuDNN: [B, L, H, D].
  forward = 4.0 * b * h * lq * lk * d
  return forward * (2.5 if "backward" in kind.lower() or "bprop" in kind.lower() else 1.0)


# Pallas splash attention (jax.experimental.pallas.ops.tpu.splash_attention): the
# custom call is named splash_{mha,mqa}_{fwd,dq,dkv}[_segmented]_..., its block sizes
# are in its kernel metadata, and model/attention_ops.py names its mask in a scope.
_SPLASH = re.compile(r"splash_m[hq]a_(fwd|dq|dkv)")
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


def _splash_flops(kind: str, instruction: _Instruction, computation: _Computation) -> float:
  """A splash kernel's FLOPs: 2 x (query elements) x S per matmul, over visited blocks.

  Its first two floating operands of rank >= 3 are q [..., L, D] and k [..., S, D] (the
  integer ones before them are the mask's block tables). A kernel without the mask's
  scope counts every block, as an unmasked kernel would.
  """
  phase = _SPLASH.match(kind.removeprefix("attention ")).group(1)
  floats = [_dims(computation.shape_of(name)) for name in instruction.operands
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


_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')


def _gemm_call_flops(instruction: _Instruction, computation: _Computation) -> float:
  """A cuBLAS(Lt) gemm call: 2 x output elements x the lhs's contracting size."""
  match = _GEMM_CONTRACTING.search(instruction.rest)
  if not match or not instruction.operands:
    return 0.0
  lhs = _dims(computation.shape_of(instruction.operands[0]))
  contracting = 1
  for d in re.findall(r"\d+", match.group(1)):
    contracting *= lhs[int(d)] if int(d) < len(lhs) else 1
  out = 1
  for d in _dims(instruction.shape):  # The first array: a workspace may follow.
    out *= d
  return 2.0 * out * contracting


def kernel_kind(instruction: _Instruction) -> str | None:
  """The kernels the report lists: fused attention by kind, matmul calls, collectives.

  Other custom calls (TPU layout and buffer calls, top-k) are left out, as are the
  fusions XLA emits itself (elementwise work, reductions).
  """
  if instruction.opcode == "custom-call":
    target = _CUSTOM_TARGET.search(instruction.rest)
    name = target.group(1) if target else "custom-call"
    pallas = _SPLASH.match(instruction.name) if name == "tpu_custom_call" else None
    if pallas:  # A Pallas kernel is named by its pallas_call, not by its target.
      return f"attention {pallas.group(0)}"
    if "fmha" in name.lower() or "attention" in name.lower() or "flash" in name.lower():
      return f"attention {name}"
    if "gemm" in name.lower() or "matmul" in name.lower():
      return f"matmul {name}"
    return None  # Layout and bookkeeping calls: not the kernels a user picks between.
  if instruction.opcode == "fusion" and '"kind":"__triton' in instruction.rest:
    return "matmul triton gemm fusion"
  if instruction.opcode in ("dot", "convolution"):
    return f"matmul {instruction.opcode}"
  base = instruction.opcode.removesuffix("-start")
  if base in COLLECTIVES:
    return base
  return None


def _kernel_bytes(instruction: _Instruction, computation: _Computation,
                  computations: dict[str, _Computation]) -> int:
  """HBM bytes a kernel reads and writes; slices and in-place updates by what they touch."""
  if instruction.opcode == "dynamic-slice":
    return 2 * sum(array_bytes(instruction.shape))
  if instruction.opcode == "custom-call" and _NO_TRAFFIC.search(instruction.rest):
    return 0
  if instruction.opcode == "dynamic-update-slice":
    operands = instruction.operands
    return 2 * sum(array_bytes(computation.shape_of(operands[1]))) if len(operands) > 1 else 0
  sizes = array_bytes(instruction.shape)
  written = max(sizes, default=0) if instruction.opcode.endswith("-start") else sum(sizes)
  operands = instruction.operands
  read = [sum(array_bytes(computation.shape_of(name))) for name in operands]
  if instruction.opcode == "fusion":
    callee = _CALLEE.search(instruction.rest)
    fused = computations.get(callee.group(2)) if callee else None
    if fused is not None:
      written, read = _fused_bytes(fused, written, read)
  return written + sum(read)


def _fused_bytes(fused: _Computation, written: int, read: list[int]) -> tuple[int, list[int]]:
  """A fusion's parameters read only through dynamic slices read the slices; a root that
  updates a parameter in place writes the update (and does not read the rest)."""
  params = {}
  for instruction in fused.instructions:
    if instruction.opcode == "parameter":
      index = re.match(r"(\d+)", instruction.rest)
      if index:
        params[instruction.name] = int(index.group(1))
  users: dict[str, list[_Instruction]] = {name: [] for name in params}
  for instruction in fused.instructions:
    for operand in instruction.operands:
      if operand in users:
        users[operand].append(instruction)
  read = list(read)
  for name, index in params.items():
    uses = users[name]
    if index >= len(read) or not uses:
      continue
    if all(u.opcode == "dynamic-slice" and u.operands[0] == name for u in uses):
      read[index] = sum(sum(array_bytes(u.shape)) for u in uses)
  roots = [fused.root] if fused.root is not None else []
  if roots and roots[0].opcode == "tuple":
    by_name = {i.name: i for i in fused.instructions}
    roots = [by_name[n] for n in roots[0].operands if n in by_name]
  for root in roots:
    if root.opcode != "dynamic-update-slice" or len(root.operands) < 2:
      continue
    target, update = root.operands[0], root.operands[1]
    update_bytes = sum(array_bytes(fused.shape_of(update)))
    written -= sum(array_bytes(root.shape)) - update_bytes
    if target in params and params[target] < len(read):
      read[params[target]] = 0
  return max(written, 0), read


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


def unsized_cudnn_workspace(instruction: _Instruction) -> int:
  """The estimated workspace of a cuDNN attention backward call XLA left at u8[0];
  0 for any other instruction or a workspace XLA sized."""
  target = _CUSTOM_TARGET.search(instruction.rest)
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


def count(hlo_text: str, multiply_loops: bool = True) -> Counts:
  """The Counts of the entry computation of `hlo_text`, every loop multiplied out.

  With multiply_loops=False each loop body counts once, as XLA's TPU cost analysis
  counts it: the ratio of the two is the factor that analysis is short by.
  """
  computations, entry = parse(hlo_text)
  fused = set()
  for computation in computations.values():
    for instruction in computation.instructions:
      if instruction.opcode == "fusion":
        fused.update(callee for _, callee in _CALLEE.findall(instruction.rest))
  memo: dict[str, Counts] = {}
  loops: dict[str, int] = {}

  def total(name: str, depth: int = 0) -> Counts:
    if name in memo or name not in computations or depth > 64:
      return memo.get(name, Counts())
    computation, counts = computations[name], Counts()
    for instruction in computation.instructions:
      line = f"{instruction.opcode}({instruction.rest}"
      if instruction.opcode in ("dot", "convolution"):
        counts.flops += _dot_flops(instruction, computation)
      kind = (kernel_kind(instruction) if name not in fused
              and not _NO_TRAFFIC.search(instruction.rest) else None)
      if kind:
        counts.kernels[kind] = counts.kernels.get(kind, 0) + 1
      if kind and kind.startswith("attention"):
        counts.cudnn_workspace = max(counts.cudnn_workspace,
                                     unsized_cudnn_workspace(instruction))
        attention = attention_flops(kind, instruction, computation)
        counts.flops += attention
        counts.opaque_flops += attention
      elif kind and kind.startswith("matmul __"):
        counts.flops += _gemm_call_flops(instruction, computation)
      base = instruction.opcode.removesuffix("-start")
      if base in COLLECTIVES:
        sizes = array_bytes(instruction.shape)
        # An async start returns (operand, result[, context]): the largest is the result.
        nbytes = max(sizes, default=0) if instruction.opcode.endswith("-start") else sum(sizes)
        counts.collective_bytes[base] = counts.collective_bytes.get(base, 0) + nbytes
      if (name not in fused and instruction.opcode not in _FREE
          and not instruction.opcode.endswith(_FREE_SUFFIXES)):
        counts.bytes_accessed += _kernel_bytes(instruction, computation, computations)
      callees = _CALLEE.findall(instruction.rest)
      if instruction.opcode == "while":
        named = dict(callees)
        trips, index = _trip_count(line, computations.get(named.get("condition", "")),
                                   computations)
        if trips is not None and index is not None:
          start, step = _start_and_step(index, instruction, computation,
                                        computations.get(named.get("body", "")))
          trips = max(0, -(-(trips - start) // step))
        body = total(named.get("body", ""), depth + 1)
        if trips is None and (body.collective_bytes or body.flops):
          counts.unknown_loops += 1
        loops[named.get("body", "")] = trips or 0
        counts.add(body, (trips or 1) if multiply_loops else 1)
        continue
      for _, callee in callees:
        counts.add(total(callee, depth + 1))
      for branches in _BRANCHES.findall(instruction.rest):
        for callee in branches.split(","):
          counts.add(total(callee.strip().lstrip("%"), depth + 1))
    memo[name] = counts
    return counts

  result = total(entry) if entry else Counts()
  result = dataclasses.replace(result, collective_bytes={
      kind: int(result.collective_bytes.get(kind, 0)) for kind in COLLECTIVES},
                               loops=loops)
  return result
