"""An estimate of step time, tokens/s and MFU from a compiled step and the chip's figures.

One step time is the estimate (`Estimate.seconds`); beside it a floor and, on a GPU, a
range:

  GPU: the estimate is the sum of the step's kernels, each at the efficiencies fitted on
    steps measured on a device (kernels.py, calibration.py): not a bound. Its range
    [low, high] spans every fit within the calibration's tolerance of every measured
    step, at every assumed HBM efficiency and launch cost. The floor is each kernel at
    its own roofline at datasheet peaks, summed (a GPU runs one kernel after another):
    no run of this program is faster.
  TPU: no TPU step was measured kernel by kernel, so the estimate is the bound, the
    slowest of
      compute:  max(hardware FLOPs, the model FLOPs) / the chip's bf16 peak,
      memory:   bytes accessed / the chip's HBM bandwidth,
      network:  the collectives' bytes / the chip's one-way interconnect bandwidth,
    as if the three overlapped perfectly at published peak rates: it is the floor too,
    and real steps are slower; MFU from it is an upper bound.

HFU counts the hardware FLOPs (remat's recomputation too) the same way as MFU. Every loop
trip is counted (compiled.py, hlo.py). Several slices talk over the data-centre network,
far slower than ICI, and the estimate still prices their traffic at ICI rates. MFU and
HFU are given for the train step only (an evaluation step's are no training figure).
"""

from __future__ import annotations

import dataclasses

from transformer.hardware import Chip
from transformer.planning import calibration
from transformer.planning import collectives
from transformer.planning import kernels
from transformer.planning.compiled import StepCost

ASSUMPTIONS = (
    "GPU: the estimate is the sum of the step's kernels, each at efficiencies fitted on "
    "steps measured on an H100 (planning/calibration.py; every efficiency a share <= 1 of "
    "its unit's datasheet peak, hardware.py): it is not a bound, and its range spans every "
    "fit within 1.25x of every measured step. The floor is each kernel at its own roofline "
    "at datasheet peaks, summed: a true lower bound, the estimate is not one. TPU: no TPU "
    "step was measured kernel by kernel, so the estimate is max(compute, HBM, "
    "interconnect) time at published peaks (compute = max(hardware FLOPs, model FLOPs) / "
    "bf16 peak; HBM = bytes accessed / bandwidth; interconnect = collective bytes / one-way "
    "ICI): perfect overlap, so it is the floor too and real steps are slower. Every loop "
    "trip counted, remat's recomputation included. XLA's own TPU cost model "
    "(optimal_seconds) and the kernels' sum (where the time goes) are other models, shown "
    "as such. No estimate for a step XLA refused.")


@dataclasses.dataclass(frozen=True)
class Estimate:
  """The three time bounds of one step on one chip, and what follows from them."""

  compute_seconds: float
  hbm_seconds: float
  network_seconds: float
  tokens_per_second: float
  mfu: float | None  # None where the step has no model-FLOP count (decode).
  hfu: float | None = None  # Hardware FLOPs (remat's recompute too) / peak at the estimate.
  optimal_seconds: float | None = None  # XLA's TPU cost model, loops multiplied out.
  # The step's kernels priced one by one and summed by part (kernels.py); its total is
  # the estimate where the chip's rates are calibrated (GPUs).
  breakdown: kernels.Breakdown | None = None
  # [low, high] over every fit within the calibration's tolerance (calibrated only).
  seconds_range: tuple[float, float] | None = None
  # Kernel classes whose share of the step lies outside the measured steps' range.
  mix_warnings: tuple[str, ...] = ()

  @property
  def bound_seconds(self) -> float:
    """The slowest of the three bounds (perfect overlap at published peaks)."""
    return max(self.compute_seconds, self.hbm_seconds, self.network_seconds)

  @property
  def calibrated(self) -> bool:
    """Whether the estimate is the calibrated kernel-by-kernel sum (not the bound)."""
    return self.breakdown is not None and bool(self.breakdown.calibrated)

  @property
  def seconds(self) -> float:
    """The estimate: the calibrated kernel sum where there is one, else the bound."""
    return self.breakdown.seconds if self.calibrated else self.bound_seconds

  @property
  def lower_bound_seconds(self) -> float:
    """No run is faster: each kernel at its roofline at datasheet peaks, summed (GPUs);
    the perfect-overlap bound elsewhere."""
    if self.calibrated:
      return self.breakdown.floor_seconds
    return self.bound_seconds

  @property
  def bound(self) -> str:
    """Which resource sets the bound ("kernels" for the calibrated sum)."""
    if self.calibrated:
      return "kernels"
    times = {"compute": self.compute_seconds, "HBM": self.hbm_seconds,
             "interconnect": self.network_seconds}
    return max(times, key=times.get)


def collective_total(cost: StepCost) -> int:
  """Bytes of all collective kinds together."""
  return sum(cost.collective_bytes.get(kind, 0) for kind in collectives.KINDS)


def estimate(cost: StepCost, chip: Chip, chips: int) -> Estimate | None:
  """Bounds for `cost` (per chip) on `chips` chips of kind `chip`; None if XLA refused it.

  MFU and HFU are at most 1: the compute bound already uses the larger FLOP count.

  Raises:
    ValueError: the table lacks the chip's memory and bandwidth figures.
  """
  del chips  # Per-chip figures throughout; the count is in the caller's report.
  if not chip.has_memory_figures:
    raise ValueError(f"hardware.CHIPS has no HBM/bandwidth figures for {chip.name}")
  if cost.compile_error:
    return None
  # A GPU step's FLOPs are the HLO's own count, fused attention's by the blocks its kernel
  # visits; the model's count (flops.py: the whole causal square) would overstate them.
  flops = (cost.xla_flops if chip.platform == "gpu" and cost.launches
           else max(cost.xla_flops, cost.model_flops or 0.0))
  compute = flops / chip.bf16_flops
  hbm = cost.hbm_bytes_accessed / chip.hbm_bytes_per_second
  network = collective_total(cost) / chip.ici_bytes_per_second
  parts = (kernels.breakdown(cost.launches, chip, train=cost.name == "train",
                             chip_rates=calibration.rates_for(chip))
           if cost.launches else None)
  result = Estimate(compute_seconds=compute, hbm_seconds=hbm, network_seconds=network,
                    tokens_per_second=0.0, mfu=None, optimal_seconds=cost.optimal_seconds,
                    breakdown=parts)
  if result.calibrated:
    result = dataclasses.replace(
        result, seconds_range=calibration.interval(cost.launches, chip),
        mix_warnings=tuple(calibration.mix_warnings(parts)))
  seconds = max(result.seconds, 1e-12)
  peak = seconds * chip.bf16_flops
  train = cost.name == "train"
  mfu = (min(1.0, cost.model_flops / peak)
         if train and cost.model_flops is not None else None)
  hfu = min(1.0, cost.xla_flops / peak) if train and cost.xla_flops else None
  return dataclasses.replace(result, tokens_per_second=cost.tokens / seconds, mfu=mfu,
                             hfu=hfu)
