"""Where a compiled step's time goes: every kernel priced on the chip, summed by part.

hlo.launches lists the kernels a step launches (loops multiplied out), each with its
FLOPs, its HBM bytes, its collective bytes and the JAX op it came from. Each launch is
put in one part of the step (PARTS) and priced on its own:

  time = max(FLOPs / (its unit's datasheet peak x Rates.tensor or .tf32),
             HBM bytes / (HBM bandwidth x Rates.hbm),
             collective bytes / (interconnect x Rates.interconnect)) + Rates.launch_seconds,

its unit the one the datasheet gives for its operands (hardware.Chip.matmul_peak: bf16
or fp8 tensor cores, TF32 tensor cores for float32 matmuls; fused attention at bf16's).
Every efficiency is a share of a datasheet peak and at most 1, so no unit runs faster
than its datasheet. The same formula at Rates of 1 and no launch cost is the step's
floor (`Breakdown.floor_seconds`): each kernel at its own roofline, summed, since a GPU
runs one kernel after another (collectives, on their own stream, may overlap: the floor
takes the larger of the two sums).

On GPUs the efficiencies are fitted on train steps measured on a device (calibration.py,
its data in gpu_calibration.json, `calibration.rates_for`); the step estimate is the sum of
its kernels. On TPUs they are 1 (no TPU step was measured kernel by kernel): the parts show where the
bytes and FLOPs are, and the step estimate stays estimate.py's bound.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from transformer.hardware import Chip
from transformer.planning import hlo

# The parts of a step, in the report's order.
PARTS = ("matmul", "attention", "loss", "elementwise", "optimizer", "collectives")
# What bounds a kernel's time (its class), for the kernel mix calibration.py compares
# with the measured steps': the unit of its FLOPs, else HBM, the interconnect, or the
# launch cost of kernels too small to be bound by either.
CLASSES = ("tensor", "fp8", "tf32", "attention", "hbm", "interconnect", "launch")
# Where an op's name says it belongs (JAX's op_name metadata): the loss head's scope
# (training/head_loss.py), the attention product's (model/attention.py's _attend).
LOSS_SCOPES = ("loss_head", "/loss_sums", "head_loss_sums")
ATTENTION_SCOPES = ("._attend",)
_FP8 = ("f8e4m3fn", "f8e5m2", "s8")


@dataclasses.dataclass(frozen=True)
class Rates:
  """What a chip's kernels achieve, each a share (<= 1) of a datasheet peak, and the
  fixed cost of launching one kernel."""

  tensor: float  # Of the tensor cores' peak for the operands (bf16, fp8) and attention's.
  tf32: float  # Float32 matmuls: of the TF32 tensor-core peak (XLA's DEFAULT precision).
  hbm: float  # Of the HBM bandwidth, for kernels bound by their bytes.
  interconnect: float  # Of the one-way interconnect bandwidth.
  launch_seconds: float  # Per kernel launch (host dispatch, the kernel's ramp).
  calibrated: str  # What the figures were fitted on ("" = datasheet peaks only).

  def __post_init__(self):
    for name in ("tensor", "tf32", "hbm", "interconnect"):
      if not 0.0 < getattr(self, name) <= 1.0:
        raise ValueError(f"Rates.{name}={getattr(self, name)}: a share of a datasheet "
                         "peak is in (0, 1]")


PEAK = Rates(tensor=1.0, tf32=1.0, hbm=1.0, interconnect=1.0, launch_seconds=0.0,
             calibrated="")


def unit_seconds(launch: hlo.Launch, chip: Chip) -> tuple[float, float, float, str]:
  """One launch at datasheet peaks: (compute, HBM, interconnect seconds, compute class)."""
  if launch.kind and launch.kind.startswith("attention"):
    compute, unit = launch.flops / chip.bf16_flops, "attention"
  else:
    dtype = launch.matmul_dtype
    compute = launch.flops / chip.matmul_peak(dtype)
    unit = "tf32" if dtype == "f32" else "fp8" if dtype in _FP8 else "tensor"
  memory = launch.bytes / chip.hbm_bytes_per_second
  network = launch.collective_bytes / chip.ici_bytes_per_second
  return compute, memory, network, unit


def kernel_seconds(launch: hlo.Launch, chip: Chip, chip_rates: Rates) -> float:
  """One launch's time on `chip` (not multiplied by launch.times)."""
  compute, memory, network, unit = unit_seconds(launch, chip)
  share = chip_rates.tf32 if unit == "tf32" else chip_rates.tensor
  return (max(compute / share, memory / chip_rates.hbm, network / chip_rates.interconnect)
          + chip_rates.launch_seconds)


def kernel_class(launch: hlo.Launch, chip: Chip, chip_rates: Rates) -> str:
  """Which resource bounds the launch at `chip_rates` (CLASSES)."""
  compute, memory, network, unit = unit_seconds(launch, chip)
  share = chip_rates.tf32 if unit == "tf32" else chip_rates.tensor
  times = {unit: compute / share, "hbm": memory / chip_rates.hbm,
           "interconnect": network / chip_rates.interconnect}
  if max(times.values()) < chip_rates.launch_seconds:
    return "launch"
  return max(times, key=times.get)


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
  # Each kernel at its own roofline at datasheet peaks, no launch cost, summed (the
  # collectives' sum instead where larger): no run of this program is faster.
  floor_seconds: float = 0.0
  # Seconds by CLASSES at the chip's rates (the kernel mix).
  class_seconds: tuple[tuple[str, float], ...] = ()

  @property
  def seconds(self) -> float:
    return sum(part.seconds for part in self.parts)

  @property
  def launches(self) -> int:
    return sum(part.launches for part in self.parts)

  def as_json(self) -> dict:
    return {"seconds": self.seconds, "launches": self.launches,
            "calibrated": self.calibrated, "floor_seconds": self.floor_seconds,
            "class_seconds": dict(self.class_seconds),
            "parts": {p.name: {"launches": p.launches, "flops": p.flops,
                               "hbm_bytes": p.hbm_bytes, "seconds": p.seconds}
                      for p in self.parts}}


def breakdown(launches: Iterable[hlo.Launch], chip: Chip, train: bool,
              chip_rates: Rates = PEAK) -> Breakdown:
  """Every kernel priced on `chip` at `chip_rates` (calibration.rates_for gives a chip's)
  and summed by part (only the kernels: free instructions such as a tuple or a bitcast
  launch nothing)."""
  totals = {name: [0, 0.0, 0.0, 0.0] for name in PARTS}
  classes = dict.fromkeys(CLASSES, 0.0)
  floor = network_floor = 0.0
  for launch in launches:
    if not launch.is_kernel:
      continue
    total = totals[part_of(launch, train)]
    seconds = kernel_seconds(launch, chip, chip_rates) * launch.times
    total[0] += launch.times
    total[1] += launch.flops * launch.times
    total[2] += launch.bytes * launch.times
    total[3] += seconds
    classes[kernel_class(launch, chip, chip_rates)] += seconds
    compute, memory, network, _ = unit_seconds(launch, chip)
    if network:  # A collective, on its own stream: it may overlap the kernels.
      network_floor += network * launch.times
    else:
      floor += max(compute, memory) * launch.times
  return Breakdown(parts=tuple(Part(name, *totals[name]) for name in PARTS),
                   calibrated=chip_rates.calibrated,
                   floor_seconds=max(floor, network_floor),
                   class_seconds=tuple(classes.items()))


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
