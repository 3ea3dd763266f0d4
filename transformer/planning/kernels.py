"""Where a compiled step's time goes: every kernel priced on the chip, summed by part.

hlo.launches lists the kernels a step launches (loops multiplied out), each with its
FLOPs, its HBM bytes, its collective bytes and the JAX op it came from. Each launch is
put in one part of the step (PARTS) and priced on its own:

  time = max(FLOPs / matmul or attention rate, HBM bytes / HBM rate,
             collective bytes / interconnect rate) + a launch cost,

the rates a chip's published peaks times the efficiencies of its `Rates` (RATES). On
GPUs these were calibrated on the train steps measured on an H100 (docs/compile-
results.md, "Calibration"); the step estimate is then the sum of its kernels, not the
slowest of three totals, since a GPU runs its kernels one after another. On TPUs the
efficiencies are 1 (no TPU step was measured kernel by kernel): the parts show where
the bytes and FLOPs are, and the step estimate stays estimate.py's bound.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from transformer.hardware import Chip
from transformer.planning import hlo

# The parts of a step, in the report's order.
PARTS = ("matmul", "attention", "loss", "elementwise", "optimizer", "collectives")
# Where an op's name says it belongs (JAX's op_name metadata): the loss head's scope
# (training/head_loss.py), the attention product's (model/attention.py's _attend).
LOSS_SCOPES = ("loss_head", "/loss_sums", "head_loss_sums")
ATTENTION_SCOPES = ("._attend",)


@dataclasses.dataclass(frozen=True)
class Rates:
  """What a chip's kernels achieve, as shares of its published peaks, and the fixed cost
  of launching one kernel."""

  matmul: float  # Of the dense peak for the operands' dtype (tensor cores / MXU).
  matmul_f32: float  # A float32 matmul's peak as a share of the bf16 peak.
  attention: float  # Fused attention kernels (cuDNN, splash), of the bf16 peak.
  hbm: float  # Of the HBM bandwidth, for kernels bound by their bytes.
  interconnect: float  # Of the one-way interconnect bandwidth.
  launch_seconds: float  # Per kernel launch (host dispatch, the kernel's ramp).
  calibrated: str  # What the figures were fitted on ("" = published peaks only).


# Fitted on the four train steps measured on an H100 (docs/compile-results.md#
# calibration: gpt_small 32 x 1024 with cuDNN, 102.5 ms, and with XLA's attention,
# 156.0 ms; llama:1b 16 x 2048 with packed rows, 816.3 ms, and per-row lengths, 799.5
# ms), compiled here without a device with the code that ran there: the largest error is
# the least (1.20x, 1.20x, 0.87x, 0.89x of each) with efficiencies bounded to what
# Hopper reaches (matmuls <= 0.8 of the dense peak, HBM <= 0.9, >= 2 us a launch). The
# float32 matmuls of that code's loss head fit the CUDA cores' rate (0.08 of the bf16
# peak, not TF32's 0.5). The interconnect's share was not measured (one GPU). The H200
# shares the figures (the same SMs; its own bandwidth from hardware.py), the A100 too
# until one is measured.
_HOPPER = Rates(matmul=0.8, matmul_f32=0.08, attention=0.75, hbm=0.9, interconnect=0.7,
                launch_seconds=2e-6,
                calibrated="fitted on 4 train steps measured on an H100: 0.87x-1.20x of each")
_PEAK = Rates(matmul=1.0, matmul_f32=1 / 3, attention=1.0, hbm=1.0, interconnect=1.0,
              launch_seconds=0.0, calibrated="")
RATES: dict[str, Rates] = {"h100": _HOPPER, "h200": _HOPPER, "a100": _HOPPER}

# Dense peak of a matmul with these operands, as a multiple of the bf16 peak (float32:
# Rates.matmul_f32).
_DTYPE_PEAK = {"f64": 1 / 16, "f8e4m3fn": 2.0, "f8e5m2": 2.0, "s8": 2.0}


def rates(chip: Chip) -> Rates:
  """The chip's Rates: calibrated where RATES has it, else its published peaks."""
  return RATES.get(chip.name, _PEAK)


def part_of(launch: hlo.Launch, train: bool) -> str:
  """The part of the step a kernel belongs to (PARTS)."""
  kind, op_name = launch.kind or "", launch.instruction.op_name
  if launch.collective_bytes or kind in hlo.COLLECTIVES:
    return "collectives"
  if any(scope in op_name for scope in LOSS_SCOPES):
    return "loss"
  if kind.startswith("attention") or any(scope in op_name for scope in ATTENTION_SCOPES):
    return "attention"
  if train and op_name and "jvp(" not in op_name and "transpose(" not in op_name:
    return "optimizer"  # Outside the forward and backward: the update and its norms.
  if kind.startswith("matmul") or launch.flops:
    return "matmul"
  return "elementwise"


def kernel_seconds(launch: hlo.Launch, chip: Chip, chip_rates: Rates) -> float:
  """One launch's time on `chip` (not multiplied by launch.times)."""
  peak = chip.bf16_flops
  if launch.kind and launch.kind.startswith("attention"):
    compute = launch.flops / (peak * chip_rates.attention)
  else:
    scale = (chip_rates.matmul_f32 if launch.matmul_dtype == "f32"
             else _DTYPE_PEAK.get(launch.matmul_dtype, 1.0))
    compute = launch.flops / (peak * scale * chip_rates.matmul)
  memory = launch.bytes / (chip.hbm_bytes_per_second * chip_rates.hbm)
  network = launch.collective_bytes / (chip.ici_bytes_per_second * chip_rates.interconnect)
  return max(compute, memory, network) + chip_rates.launch_seconds


@dataclasses.dataclass(frozen=True)
class Part:
  """One part of a step: its kernels' launches, FLOPs, bytes and estimated time."""

  name: str
  launches: int
  flops: float
  hbm_bytes: float
  seconds: float


@dataclasses.dataclass(frozen=True)
class Breakdown:
  """A step's parts and the sum of its kernels' times (the GPU estimate)."""

  parts: tuple[Part, ...]
  calibrated: str  # Rates.calibrated of the chip.

  @property
  def seconds(self) -> float:
    return sum(part.seconds for part in self.parts)

  @property
  def launches(self) -> int:
    return sum(part.launches for part in self.parts)

  def as_json(self) -> dict:
    return {"seconds": self.seconds, "launches": self.launches,
            "calibrated": self.calibrated,
            "parts": {p.name: {"launches": p.launches, "flops": p.flops,
                               "hbm_bytes": p.hbm_bytes, "seconds": p.seconds}
                      for p in self.parts}}


def breakdown(launches: Iterable[hlo.Launch], chip: Chip, train: bool) -> Breakdown:
  """Every kernel priced on `chip` and summed by part (only the kernels: free
  instructions such as a tuple or a bitcast launch nothing)."""
  chip_rates = rates(chip)
  totals = {name: [0, 0.0, 0.0, 0.0] for name in PARTS}
  for launch in launches:
    if not launch.is_kernel:
      continue
    total = totals[part_of(launch, train)]
    total[0] += launch.times
    total[1] += launch.flops * launch.times
    total[2] += launch.bytes * launch.times
    total[3] += kernel_seconds(launch, chip, chip_rates) * launch.times
  return Breakdown(parts=tuple(Part(name, *totals[name]) for name in PARTS),
                   calibrated=chip_rates.calibrated)


def table(step: str, result: Breakdown) -> list[str]:
  """The report's lines: one row a part (launches, GFLOPs, GB, ms and share)."""
  total = result.seconds or 1e-12
  lines = [f"  {step}: {'part':<12} {'kernels':>8} {'TFLOPs':>9} {'HBM GB':>9} "
           f"{'ms':>9} {'share':>6}"]
  for part in result.parts:
    if not part.launches:
      continue
    lines.append(f"  {'':{len(step) + 1}} {part.name:<12} {part.launches:>8,} "
                 f"{part.flops / 1e12:>9.2f} {part.hbm_bytes / 1e9:>9.2f} "
                 f"{part.seconds * 1e3:>9.2f} {100 * part.seconds / total:>5.1f}%")
  lines.append(f"  {'':{len(step) + 1}} {'total':<12} {result.launches:>8,} "
               f"{sum(p.flops for p in result.parts) / 1e12:>9.2f} "
               f"{sum(p.hbm_bytes for p in result.parts) / 1e9:>9.2f} "
               f"{total * 1e3:>9.2f} {100.0:>5.1f}%")
  return lines
