"""An estimate of step time, tokens/s and MFU from a compiled step and the chip's figures.

On a GPU the estimate is the sum of the step's kernels, each priced at the rates the
chip's kernels were measured to reach (kernels.py: calibrated on the train steps
measured on an H100; it is no lower bound). Everywhere, and alone on TPUs, it also
gives the bounds: the step cannot be faster than the slowest of
  compute:  max(hardware FLOPs, the model FLOPs) / the chip's bf16 peak,
  memory:   bytes accessed / the chip's HBM bandwidth,
  network:  the collectives' bytes / the chip's one-way interconnect bandwidth,
and the estimate is that bound, as if the three overlapped perfectly at published peak
rates. Real steps are slower (kernels below peak, collectives not hidden, host work);
MFU from it is an upper bound; HFU counts the hardware FLOPs (remat's recomputation
too) the same way. Every loop trip is counted (compiled.py, hlo.py). Several slices
talk over the data-centre network, far slower than ICI, and the estimate still prices
their traffic at ICI rates.
"""

from __future__ import annotations

import dataclasses

from transformer.hardware import Chip
from transformer.planning import collectives
from transformer.planning import kernels
from transformer.planning.compiled import StepCost

ASSUMPTIONS = (
    "estimate = max(compute, HBM, interconnect) time: perfect overlap at published peak "
    "rates (hardware.py); compute = max(hardware FLOPs, model FLOPs) / bf16 peak, the "
    "hardware FLOPs XLA's (GPU: the HLO's dots and fused-attention calls), remat's "
    "recomputation included, every loop trip counted; HBM = bytes accessed / HBM "
    "bandwidth; interconnect = collective bytes / one-way ICI (NVLink) bandwidth of one "
    "chip. A lower bound on step time: real steps are slower. XLA's own TPU cost model "
    "(optimal_seconds) is shown beside it. On a GPU the estimate is instead the sum of the "
    "step's kernels at the rates calibrated on measured steps (kernels.py; not a bound). "
    "No estimate for a step XLA refused.")


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
  compute = max(cost.xla_flops, cost.model_flops or 0.0) / chip.bf16_flops
  hbm = cost.hbm_bytes_accessed / chip.hbm_bytes_per_second
  network = collective_total(cost) / chip.ici_bytes_per_second
  parts = (kernels.breakdown(cost.launches, chip, train=cost.name == "train")
           if cost.launches else None)
  result = Estimate(compute_seconds=compute, hbm_seconds=hbm, network_seconds=network,
                    tokens_per_second=0.0, mfu=None, optimal_seconds=cost.optimal_seconds,
                    breakdown=parts)
  seconds = max(result.seconds, 1e-12)
  peak = seconds * chip.bf16_flops
  mfu = None if cost.model_flops is None else min(1.0, cost.model_flops / peak)
  hfu = min(1.0, cost.xla_flops / peak) if cost.xla_flops else None
  return dataclasses.replace(result, tokens_per_second=cost.tokens / seconds, mfu=mfu,
                             hfu=hfu)
