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

from transformer.planning import attention_cost
from transformer.planning import hlo_text as text
from transformer.planning.hlo_text import COLLECTIVES, array_bytes, parse  # pylint: disable=unused-import

# Instructions that launch no kernel and move no HBM bytes of their own.
_FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "while", "call",
         "conditional", "after-all", "partition-id", "replica-id", "opt-barrier",
         "add-dependency", "domain", "iota"}
_FREE_SUFFIXES = ("-done", "-update")  # The async halves whose -start already counted.


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


def _trip_count(line: str, condition: text.Computation | None,
                computations: dict[str, text.Computation]) -> tuple[int | None, int | None]:
  """XLA's known_trip_count, else N of the condition's `compare(iv, constant(N)) LT`.

  Returns (the count or the bound N, the induction variable's index in the loop's tuple;
  None with a known_trip_count, which needs no start or step).
  """
  known = text.TRIPS.search(line)
  if known:
    return int(known.group(1)), None
  if condition is None or condition.root is None:
    return None, None
  root = condition.root
  outer_operands = None
  if root.opcode == "fusion":  # TPU and GPU fuse the compare: look inside.
    callee = text.CALLEE.search(root.rest)
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
  value = text.CONSTANT.search(f"constant({constants[operands[1]].rest}")
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


def _constant_value(name: str, computation: text.Computation) -> int | None:
  """The integer a constant (or a copy of one) named `name` holds, else None."""
  instruction = next((i for i in computation.instructions if i.name == name), None)
  if instruction is not None and instruction.opcode == "copy" and instruction.operands:
    return _constant_value(instruction.operands[0], computation)
  if instruction is None or instruction.opcode != "constant":
    return None
  value = text.CONSTANT.search(f"constant({instruction.rest}")
  return int(value.group(1)) if value else None


def _start_and_step(index: int, loop: text.Instruction, computation: text.Computation,
                    body: text.Computation | None) -> tuple[int, int]:
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


def _dot_flops(instruction: text.Instruction, computation: text.Computation) -> float:
  out = 1
  for d in text.dims(instruction.shape):
    out *= d
  if instruction.opcode == "dot":
    lhs = text.dims(computation.shape_of(instruction.operands[0]))
    match = text.CONTRACTING.search(instruction.rest)
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


def _convolution_flops(instruction: text.Instruction, computation: text.Computation) -> float:
  """2 x multiply-adds of a convolution, counting only the window taps that land on input.

  XLA's TPU compiler writes batched matmuls (attention's per-head products) as
  convolutions whose window runs over a padded, dilated dimension; most taps of such
  a window fall on padding, so each spatial dimension's taps are counted one by one.
  """
  labels = text.DIM_LABELS.search(instruction.rest)
  operands = instruction.operands
  if not labels or len(operands) < 2:
    return 0.0
  lhs_labels, rhs_labels, out_labels = labels.groups()
  lhs = text.dims(computation.shape_of(operands[0]))
  rhs = text.dims(computation.shape_of(operands[1]))
  out = text.dims(instruction.shape)
  if len(lhs) != len(lhs_labels) or len(rhs) != len(rhs_labels) or len(out) != len(out_labels):
    return 0.0
  spatial = sorted(label for label in out_labels if label.isdigit())
  window = _WINDOW.search(instruction.rest)
  window_text = window.group(1) if window else ""
  n = len(spatial)
  strides = _window_field(window_text, "stride", n, 1)
  lhs_dilation = _window_field(window_text, "lhs_dilate", n, 1)
  rhs_dilation = _window_field(window_text, "rhs_dilate", n, 1)
  pads = re.search(r"\bpad=([\d_x\-]+)", window_text)
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


_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')


def _gemm_call_flops(instruction: text.Instruction, computation: text.Computation) -> float:
  """A cuBLAS(Lt) gemm call: 2 x output elements x the lhs's contracting size."""
  match = _GEMM_CONTRACTING.search(instruction.rest)
  if not match or not instruction.operands:
    return 0.0
  lhs = text.dims(computation.shape_of(instruction.operands[0]))
  contracting = 1
  for d in re.findall(r"\d+", match.group(1)):
    contracting *= lhs[int(d)] if int(d) < len(lhs) else 1
  out = 1
  for d in text.dims(instruction.shape):  # The first array: a workspace may follow.
    out *= d
  return 2.0 * out * contracting


# A Pallas kernel for XLA's GPU backend: a custom call holding Triton IR, named by its
# pallas_call. The project's Pallas matmuls (model/mlp_pallas.py, training/head_pallas.py)
# end their names in their product's shape, "_<M>x<N>x<K>": the IR is opaque here, so
# their FLOPs are 2 x M x N x K.
PALLAS_GPU_TARGET = "__gpu$xla.gpu.triton"
_PALLAS_NAME = re.compile(r'\bname = "([^"]+)"')
_PALLAS_MATMUL = re.compile(r"_(\d+)x(\d+)x(\d+)$")


def pallas_gpu_name(instruction: text.Instruction) -> str | None:
  """The pallas_call name of a Pallas GPU kernel (None for any other instruction)."""
  if instruction.opcode != "custom-call" or PALLAS_GPU_TARGET not in instruction.rest:
    return None
  match = _PALLAS_NAME.search(instruction.rest)
  return match.group(1) if match else "pallas_call"


def _pallas_matmul_flops(instruction: text.Instruction) -> float:
  match = _PALLAS_MATMUL.search(pallas_gpu_name(instruction) or "")
  if not match:
    return 0.0
  m, n, k = (int(g) for g in match.groups())
  return 2.0 * m * n * k


def kernel_kind(instruction: text.Instruction) -> str | None:
  """The kernels the report lists: fused attention by kind, matmul calls, collectives.

  Other custom calls (TPU layout and buffer calls, top-k) are left out, as are the
  fusions XLA emits itself (elementwise work, reductions).
  """
  if instruction.opcode == "custom-call":
    target = text.CUSTOM_TARGET.search(instruction.rest)
    name = target.group(1) if target else "custom-call"
    pallas = attention_cost.SPLASH.match(instruction.name) if name == "tpu_custom_call" else None
    if pallas:  # A Pallas kernel is named by its pallas_call, not by its target.
      return f"attention {pallas.group(0)}"
    gpu_kernel = pallas_gpu_name(instruction)
    if gpu_kernel:
      matmul = "matmul " if _PALLAS_MATMUL.search(gpu_kernel) else ""
      return f"{matmul}pallas {gpu_kernel}"
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


def _kernel_bytes(instruction: text.Instruction, computation: text.Computation,
                  computations: dict[str, text.Computation]) -> int:
  """HBM bytes a kernel reads and writes; slices and in-place updates by what they touch."""
  if instruction.opcode == "dynamic-slice":
    return 2 * sum(text.array_bytes(instruction.shape))
  if instruction.opcode == "custom-call" and text.NO_TRAFFIC.search(instruction.rest):
    return 0
  if instruction.opcode == "dynamic-update-slice":
    operands = instruction.operands
    return 2 * sum(text.array_bytes(computation.shape_of(operands[1]))) if len(operands) > 1 else 0
  sizes = text.array_bytes(instruction.shape)
  written = max(sizes, default=0) if instruction.opcode.endswith("-start") else sum(sizes)
  operands = instruction.operands
  read = [sum(text.array_bytes(computation.shape_of(name))) for name in operands]
  if instruction.opcode == "fusion":
    callee = text.CALLEE.search(instruction.rest)
    fused = computations.get(callee.group(2)) if callee else None
    if fused is not None:
      written, read = _fused_bytes(fused, written, read)
  return written + sum(read)


def _fused_bytes(fused: text.Computation, written: int, read: list[int]) -> tuple[int, list[int]]:
  """A fusion's parameters read only through dynamic slices read the slices; a root that
  updates a parameter in place writes the update (and does not read the rest)."""
  params = {}
  for instruction in fused.instructions:
    if instruction.opcode == "parameter":
      index = re.match(r"(\d+)", instruction.rest)
      if index:
        params[instruction.name] = int(index.group(1))
  users: dict[str, list[text.Instruction]] = {name: [] for name in params}
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
      read[index] = sum(sum(text.array_bytes(u.shape)) for u in uses)
  roots = [fused.root] if fused.root is not None else []
  if roots and roots[0].opcode == "tuple":
    by_name = {i.name: i for i in fused.instructions}
    roots = [by_name[n] for n in roots[0].operands if n in by_name]
  for root in roots:
    if root.opcode != "dynamic-update-slice" or len(root.operands) < 2:
      continue
    target, update = root.operands[0], root.operands[1]
    update_bytes = sum(text.array_bytes(fused.shape_of(update)))
    written -= sum(text.array_bytes(root.shape)) - update_bytes
    if target in params and params[target] < len(read):
      read[params[target]] = 0
  return max(written, 0), read


@dataclasses.dataclass
class Launch:
  """One kernel of a compiled program (an instruction of a non-fused computation), per
  execution, and how many times a step launches it (loops multiplied out)."""

  instruction: text.Instruction
  times: int
  kind: str | None  # kernel_kind(): fused attention, matmul calls, collectives; else None.
  flops: float  # Its dots and convolutions (inside its fusion too) and fused attention.
  opaque_flops: float  # The part XLA's cost analysis cannot see (fused attention).
  bytes: int  # HBM bytes it reads and writes (0 for an instruction that is no kernel).
  collective_bytes: int  # Bytes a collective moves per chip (0 for other kernels).
  workspace: int  # cuDNN's unsized backward workspace (attention_cost), else 0.
  matmul_dtype: str  # The element type of its matmul operands ("bf16", "f32", ...), or "".

  @property
  def is_kernel(self) -> bool:
    return (self.instruction.opcode not in _FREE
            and not self.instruction.opcode.endswith(_FREE_SUFFIXES))


_DOT_OPERAND = re.compile(r"\b(bf16|f16|f32|f64|f8e4m3fn|f8e5m2|s8)\[")


def _fused_matmuls(callees: list[str], computations: dict[str, text.Computation],
                   depth: int = 0) -> tuple[float, str]:
  """FLOPs of the dots and convolutions in fused computations (nested ones too), and the
  element type of the first dot's left operand."""
  flops, dtype = 0.0, ""
  for name in callees:
    computation = computations.get(name)
    if computation is None or depth > 16:
      continue
    for instruction in computation.instructions:
      if instruction.opcode in ("dot", "convolution"):
        flops += _dot_flops(instruction, computation)
        if not dtype and instruction.operands:
          match = _DOT_OPERAND.match(computation.shape_of(instruction.operands[0]))
          dtype = match.group(1) if match else ""
      inner = [callee for _, callee in text.CALLEE.findall(instruction.rest)]
      more, inner_dtype = _fused_matmuls(inner, computations, depth + 1)
      flops, dtype = flops + more, dtype or inner_dtype
  return flops, dtype


def _launch(instruction: text.Instruction, computation: text.Computation,
            computations: dict[str, text.Computation], times: int) -> Launch:
  """The Launch of one instruction of a non-fused computation."""
  kind = (kernel_kind(instruction) if not text.NO_TRAFFIC.search(instruction.rest)
          else None)
  flops = opaque = 0.0
  workspace = 0
  dtype = ""
  if instruction.opcode in ("dot", "convolution"):
    flops = _dot_flops(instruction, computation)
    match = _DOT_OPERAND.match(computation.shape_of(instruction.operands[0])
                               if instruction.operands else "")
    dtype = match.group(1) if match else ""
  if kind and kind.startswith("attention"):
    workspace = attention_cost.unsized_cudnn_workspace(instruction)
    opaque = attention_cost.attention_flops(kind, instruction, computation)
    flops += opaque
  elif kind and kind.startswith("matmul pallas"):
    flops += _pallas_matmul_flops(instruction)
    match = _DOT_OPERAND.match(computation.shape_of(instruction.operands[0])
                               if instruction.operands else "")
    dtype = match.group(1) if match else ""
  elif kind and kind.startswith("matmul __"):
    flops += _gemm_call_flops(instruction, computation)
    match = _DOT_OPERAND.match(computation.shape_of(instruction.operands[0])
                               if instruction.operands else "")
    dtype = match.group(1) if match else ""
  if instruction.opcode == "fusion":
    fused, fused_dtype = _fused_matmuls(
        [callee for _, callee in text.CALLEE.findall(instruction.rest)], computations)
    flops, dtype = flops + fused, dtype or fused_dtype
  collective = 0
  base = instruction.opcode.removesuffix("-start")
  if base in COLLECTIVES:
    sizes = array_bytes(instruction.shape)
    # An async start returns (operand, result[, context]): the largest is the result.
    collective = max(sizes, default=0) if instruction.opcode.endswith("-start") else sum(sizes)
  launch = Launch(instruction=instruction, times=times, kind=kind, flops=flops,
                  opaque_flops=opaque, bytes=0, collective_bytes=collective,
                  workspace=workspace, matmul_dtype=dtype)
  if launch.is_kernel:
    launch.bytes = _kernel_bytes(instruction, computation, computations)
  return launch


def launches(hlo_text: str, multiply_loops: bool = True
             ) -> tuple[list[Launch], dict[str, int], int]:
  """Every kernel of the entry computation, with the loops' bodies walked once each and
  their trips as the launches' `times` (1 with multiply_loops=False, as XLA's TPU cost
  analysis counts); also the trips found per loop body and the loops whose trip count
  could not be read (those run once)."""
  computations, entry = parse(hlo_text)
  found: list[Launch] = []
  loops: dict[str, int] = {}
  unknown = [0]

  def walk(name: str, times: int, depth: int) -> None:
    computation = computations.get(name)
    if computation is None or depth > 64:
      return
    for instruction in computation.instructions:
      callees = text.CALLEE.findall(instruction.rest)
      if instruction.opcode == "while":
        named = dict(callees)
        trips, index = _trip_count(f"{instruction.opcode}({instruction.rest}",
                                   computations.get(named.get("condition", "")),
                                   computations)
        if trips is not None and index is not None:
          start, step = _start_and_step(index, instruction, computation,
                                        computations.get(named.get("body", "")))
          trips = max(0, -(-(trips - start) // step))
        body = named.get("body", "")
        loops[body] = trips or 0
        before = len(found)
        walk(body, times * ((trips or 1) if multiply_loops else 1), depth + 1)
        if trips is None and any(l.flops or l.collective_bytes for l in found[before:]):
          unknown[0] += 1
        continue
      found.append(_launch(instruction, computation, computations, times))
      if instruction.opcode == "fusion":
        continue  # Its body is the kernel's own code (_launch read its matmuls).
      # Computations that run as kernels of their own (a call's, an async op's, a
      # conditional's branches); not a reduction's or a sort's combiner (to_apply),
      # which runs inside its instruction's kernel.
      for key, callee in callees:
        if key != "to_apply":
          walk(callee, times, depth + 1)
      for branches in text.BRANCHES.findall(instruction.rest):
        for callee in branches.split(","):
          walk(callee.strip().lstrip("%"), times, depth + 1)

  if entry:
    walk(entry, 1, 0)
  return found, loops, unknown[0]


def count(hlo_text: str, multiply_loops: bool = True) -> Counts:
  """The Counts of the entry computation of `hlo_text`, every loop multiplied out.

  With multiply_loops=False each loop body counts once, as XLA's TPU cost analysis
  counts it: the ratio of the two is the factor that analysis is short by.
  """
  return totals(*launches(hlo_text, multiply_loops))


def totals(found: list[Launch], loops: dict[str, int], unknown: int) -> Counts:
  """The Counts of launches() (its three results)."""
  counts = Counts(collective_bytes={kind: 0 for kind in COLLECTIVES}, loops=loops,
                  unknown_loops=unknown)
  for launch in found:
    counts.flops += launch.flops * launch.times
    counts.opaque_flops += launch.opaque_flops * launch.times
    counts.bytes_accessed += launch.bytes * launch.times
    if launch.kind:
      counts.kernels[launch.kind] = counts.kernels.get(launch.kind, 0) + launch.times
    if launch.collective_bytes:
      kind = launch.instruction.opcode.removesuffix("-start")
      counts.collective_bytes[kind] += launch.collective_bytes * launch.times
    counts.cudnn_workspace = max(counts.cudnn_workspace, launch.workspace)
  return counts
