"""The GPU time model's efficiencies, fitted on train steps measured on a device.

gpu_calibration.json (beside this module) keeps each measured step as data: its
kernels as compact rows ([times, kind, matmul dtype, FLOPs, HBM bytes, collective
bytes, part], the step compiled without a device by the code that was measured), the
measured time, the chip, where it came from, and its `case`: steps of one model and
shape that differ in one detail (gpt_small with cuDNN's or XLA's attention; llama:1b
with packed or per-row lengths) are one case, since their kernels are mostly the same
ones and their errors move together. The model may have no more free parameters than
there are cases (FREE_PARAMETERS <= cases, checked on load).

The free parameters are two efficiencies, each a share <= 1 of a datasheet peak
(kernels.Rates): `tensor` (bf16/fp8 tensor-core matmuls and fused attention) and
`tf32` (float32 matmuls, which XLA's DEFAULT precision runs on TF32 tensor cores: on
the CUDA cores' 67 TFLOP/s the measured steps would be faster than their own floor).
Two others are assumptions, not fitted, each taken at three values: the HBM efficiency
(ASSUMED_HBM: 0.9 of the datasheet is what a streaming copy reaches on Hopper) and the
launch cost (ASSUMED_LAUNCH_SECONDS: a few microseconds a kernel, Hopper's smallest
kernels' span). The interconnect's share was never measured (one GPU): 0.7, assumed.

  best_rates()     the fit with the least largest error at the central assumptions
  rates_for(chip)  the Rates a chip's kernels are priced at (the fit, or datasheet peaks)
  interval(...)    [low, high] of a step over every fit within TOLERANCE of every
                   measured step, at every assumed value: the estimate's range
  floor_seconds()  each kernel at its roofline at datasheet peaks, summed
  leave_one_out()  each step predicted by the fit on the others
  mix_warnings()   a step's kernel mix against the measured steps' (kernels.CLASSES)
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
from typing import Iterable

import numpy as np

from transformer import hardware
from transformer.planning import hlo
from transformer.planning import kernels

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_calibration.json")
TOLERANCE = 1.25  # A fit is kept when it is within this factor of every measured step.
FREE_PARAMETERS = ("tensor", "tf32")
ASSUMED_HBM = (0.8, 0.9, 1.0)  # Central: 0.9.
ASSUMED_LAUNCH_SECONDS = (1e-6, 2e-6, 4e-6)  # Central: 2 us.
CENTRAL = (0.9, 2e-6)
INTERCONNECT = 0.7
GRID = np.round(np.arange(0.02, 1.0001, 0.01), 2)  # Shares a fit may take.


def load(path: str = DATA) -> dict:
  """The measured steps; ValueError when they support fewer parameters than are fitted."""
  with open(path, encoding="utf-8") as f:
    steps = json.load(f)
  cases = {step.get("case", name) for name, step in steps.items()}
  if len(cases) < len(FREE_PARAMETERS):
    raise ValueError(f"{path}: {len(cases)} independent case(s) ({sorted(cases)}) cannot "
                     f"support {len(FREE_PARAMETERS)} fitted parameters {FREE_PARAMETERS}")
  return steps


def rows_of(found: Iterable[hlo.Launch], train: bool = True) -> list[list]:
  """A step's kernels as [times, kind, matmul_dtype, flops, bytes, collective_bytes,
  part], identical kernels merged (their times added): the file's row format."""
  merged = collections.Counter()
  for launch in found:
    if launch.is_kernel:
      key = (launch.kind or "", launch.matmul_dtype, launch.flops, launch.bytes,
             launch.collective_bytes, kernels.part_of(launch, train=train))
      merged[key] += launch.times
  return [[times, *key] for key, times in sorted(merged.items(), key=lambda kv: -kv[1])]


def launches_of(rows: list[list]) -> list[hlo.Launch]:
  """Stand-in Launches of a step's rows (the fields kernels.unit_seconds reads)."""
  return [hlo.Launch(instruction=None, times=times, kind=kind or None, flops=flops,
                     opaque_flops=0.0, bytes=nbytes, collective_bytes=collective,
                     workspace=0, matmul_dtype=dtype)
          for times, kind, dtype, flops, nbytes, collective, _ in rows]


@dataclasses.dataclass(frozen=True)
class _Terms:
  """A step's kernels at datasheet peaks, as arrays (one entry a kernel row)."""

  times: np.ndarray
  tensor: np.ndarray  # Compute seconds of kernels on the tensor / attention rate, else 0.
  tf32: np.ndarray  # Compute seconds of float32 matmuls, else 0.
  memory: np.ndarray
  network: np.ndarray


def _terms(found: Iterable[hlo.Launch], chip: hardware.Chip) -> _Terms:
  """Identical kernels merged (their launches added): a step's thousands of launches are
  a few hundred kinds, which keeps the [tensor, tf32, kernel] grids small."""
  merged = collections.Counter()
  for launch in found:
    if launch.instruction is not None and not launch.is_kernel:
      continue
    compute, memory, network, unit = kernels.unit_seconds(launch, chip)
    merged[(0.0 if unit == "tf32" else compute, compute if unit == "tf32" else 0.0,
            memory, network)] += launch.times
  array = np.array([(times, *key) for key, times in merged.items()],
                   dtype=np.float64).reshape(-1, 5)
  return _Terms(*array.T)


def _grid_seconds(terms: _Terms, hbm: float, launch: float) -> np.ndarray:
  """The step's seconds at every (tensor, tf32) pair of GRID: shape [tensor, tf32]."""
  t = terms.tensor[None, None, :] / GRID[:, None, None]
  f = terms.tf32[None, None, :] / GRID[None, :, None]
  fixed = np.maximum(terms.memory / hbm, terms.network / INTERCONNECT)[None, None, :]
  return (terms.times * (np.maximum(np.maximum(t, f), fixed) + launch)).sum(-1)


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The fits over the measured steps."""

  steps: dict
  best: kernels.Rates
  best_ratios: dict[str, float]  # Estimate / measured of each step at `best`.
  accepted: tuple[tuple[float, float, np.ndarray], ...]  # (hbm, launch, mask[tensor, tf32]).


def _measured(steps: dict) -> dict[str, tuple[_Terms, float]]:
  return {name: (_terms(launches_of(step["kernels"]), hardware.CHIPS[step["chip"]]),
                 step["measured_ms"] / 1e3) for name, step in steps.items()}


def _worst(measured: dict, hbm: float, launch: float) -> np.ndarray:
  """The largest |log(estimate / measured)| over the steps, at every grid pair."""
  worst = np.zeros((len(GRID), len(GRID)))
  for terms, seconds in measured.values():
    worst = np.maximum(worst, np.abs(np.log(_grid_seconds(terms, hbm, launch) / seconds)))
  return worst


def _rates(tensor: float, tf32: float, hbm: float, launch: float, note: str) -> kernels.Rates:
  return kernels.Rates(tensor=float(tensor), tf32=float(tf32), hbm=hbm,
                       interconnect=INTERCONNECT, launch_seconds=launch, calibrated=note)


def fit(steps: dict) -> Calibration:
  """The minimax fit at the central assumptions and every fit within TOLERANCE."""
  measured = _measured(steps)
  worst = _worst(measured, *CENTRAL)
  i, j = np.unravel_index(np.argmin(worst), worst.shape)
  cases = len({step.get("case", name) for name, step in steps.items()})
  probe = _rates(GRID[i], GRID[j], *CENTRAL, "")
  ratios = {name: step_seconds(launches_of(step["kernels"]), hardware.CHIPS[step["chip"]],
                           probe) / (step["measured_ms"] / 1e3)
            for name, step in steps.items()}
  note = (f"fitted on {len(steps)} train steps measured on an H100 ({cases} independent "
          f"cases, {len(FREE_PARAMETERS)} free efficiencies): "
          f"{min(ratios.values()):.2f}x-{max(ratios.values()):.2f}x of each")
  accepted = tuple((hbm, launch, _worst(measured, hbm, launch) <= math.log(TOLERANCE))
                   for hbm in ASSUMED_HBM for launch in ASSUMED_LAUNCH_SECONDS)
  return Calibration(steps=steps, best=_rates(GRID[i], GRID[j], *CENTRAL, note),
                     best_ratios=ratios, accepted=accepted)


def step_seconds(found: Iterable[hlo.Launch], chip: hardware.Chip,
                 rates: kernels.Rates) -> float:
  """A step's kernels (real or stand-in launches) at `rates`, summed."""
  return sum(l.times * kernels.kernel_seconds(l, chip, rates) for l in found
             if l.instruction is None or l.is_kernel)


@functools.lru_cache(maxsize=1)
def calibration() -> Calibration:
  """The fit of gpu_calibration.json, its note with the leave-one-out errors too
  (computed once a process, in about a second)."""
  fitted = fit(load())
  loo = leave_one_out(fitted.steps).values()
  note = f"{fitted.best.calibrated}; leave-one-out {min(loo):.2f}x-{max(loo):.2f}x"
  return dataclasses.replace(fitted, best=dataclasses.replace(fitted.best, calibrated=note))


def best_rates() -> kernels.Rates:
  """The rates of the GPU estimate (the minimax fit at the central assumptions)."""
  return calibration().best


# GPUs priced at the fitted efficiencies (fitted on the H100's measured steps: the H200 is
# the same die with faster HBM, priced at its own bandwidth; the A100 shares them until
# one is measured).
CALIBRATED_GPUS = ("h100", "h200", "a100")


def rates_for(chip: hardware.Chip) -> kernels.Rates:
  """A chip's Rates: the best fit for the GPUs it covers, else datasheet peaks."""
  return best_rates() if chip.name in CALIBRATED_GPUS else kernels.PEAK


def interval(found: Iterable[hlo.Launch], chip: hardware.Chip,
             fitted: Calibration | None = None) -> tuple[float, float]:
  """[low, high] seconds of a step over every fit within TOLERANCE (of `fitted`, else of
  gpu_calibration.json); the best fit's estimate lies inside."""
  terms = _terms(list(found), chip)
  low, high = math.inf, 0.0
  for hbm, launch, mask in (fitted or calibration()).accepted:
    if mask.any():
      seconds = _grid_seconds(terms, hbm, launch)[mask]
      low, high = min(low, float(seconds.min())), max(high, float(seconds.max()))
  return low, high


def floor_seconds(found: Iterable[hlo.Launch], chip: hardware.Chip) -> float:
  """Each kernel at its roofline at datasheet peaks, summed (kernels.Breakdown's floor)."""
  terms = _terms(list(found), chip)
  kernel = np.where(terms.network > 0, 0.0,
                    np.maximum(np.maximum(terms.tensor, terms.tf32), terms.memory))
  return max(float((terms.times * kernel).sum()), float((terms.times * terms.network).sum()))


def leave_one_out(steps: dict) -> dict[str, float]:
  """Each step's estimate / measured under the minimax fit on the other steps."""
  out = {}
  for name, step in steps.items():
    others = {other: s for other, s in steps.items() if other != name}
    measured = _measured(others)
    worst = _worst(measured, *CENTRAL)
    i, j = np.unravel_index(np.argmin(worst), worst.shape)
    rates = _rates(GRID[i], GRID[j], *CENTRAL, "")
    out[name] = (step_seconds(launches_of(step["kernels"]), hardware.CHIPS[step["chip"]], rates)
                 / (step["measured_ms"] / 1e3))
  return out


def shares(breakdown: kernels.Breakdown) -> dict[str, float]:
  """Each class's share of a step's estimated time."""
  total = sum(seconds for _, seconds in breakdown.class_seconds) or 1.0
  return {name: seconds / total for name, seconds in breakdown.class_seconds}


@functools.lru_cache(maxsize=1)
def measured_shares() -> dict[str, tuple[float, float]]:
  """[least, greatest] share of each class over the measured steps, at the best fit."""
  found = {}
  for step in calibration().steps.values():
    chip = hardware.CHIPS[step["chip"]]
    classes = dict.fromkeys(kernels.CLASSES, 0.0)
    for launch in launches_of(step["kernels"]):
      classes[kernels.kernel_class(launch, chip, best_rates())] += (
          launch.times * kernels.kernel_seconds(launch, chip, best_rates()))
    total = sum(classes.values())
    for name, seconds in classes.items():
      found.setdefault(name, []).append(seconds / total)
  return {name: (min(values), max(values)) for name, values in found.items()}


def mix_warnings(breakdown: kernels.Breakdown, slack: float = 0.02) -> list[str]:
  """One line per kernel class whose share of the step lies outside the measured steps'
  range (by more than `slack`): the estimate extrapolates there."""
  lines = []
  ranges = measured_shares()
  for name, share in shares(breakdown).items():
    low, high = ranges.get(name, (0.0, 0.0))
    if share < low - slack or share > high + slack:
      lines.append(f"{name} {100 * share:.0f}% of the step (measured steps: "
                   f"{100 * low:.0f}-{100 * high:.0f}%)")
  return lines
