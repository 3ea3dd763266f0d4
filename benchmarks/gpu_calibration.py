"""The GPU time model's calibration: measured train steps against their kernels' estimate.

planning/kernels.py prices every kernel of a step at a chip's Rates; its GPU rates are
fitted on train steps measured on a device. This script keeps those steps as data
(benchmarks/gpu_calibration.json: each step's kernels as compact rows, grouped, with the
measured time and where it came from), prints the estimate of each against its
measurement with the current rates, and refits them.

  python benchmarks/gpu_calibration.py                       # estimate / measured, each step
  python benchmarks/gpu_calibration.py --fit                 # the best bounded rates
  python benchmarks/gpu_calibration.py --record=NAME --measured_ms=MS --hlo=STEP.txt \
      --note="..."                                           # add or replace a step

--hlo is the train step's optimised HLO text as XLA dumps it (`XLA_FLAGS=--xla_dump_to=DIR
--xla_dump_hlo_as_text` around `--mode=compile`, the file ending in
after_optimizations.txt), compiled for the same GPU without a device by the code that was
measured. tests/test_kernels.py holds the current rates to every step in the file
(within 1.25x).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from transformer import hardware
from transformer.planning import hlo
from transformer.planning import kernels

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_calibration.json")


def rows_of(hlo_text: str) -> list[list]:
  """The step's kernels as [times, kind, matmul_dtype, flops, bytes, collective_bytes,
  part], identical kernels merged (their times added)."""
  found, _, _ = hlo.launches(hlo_text)
  merged = collections.Counter()
  for launch in found:
    if launch.is_kernel:
      key = (launch.kind or "", launch.matmul_dtype, launch.flops, launch.bytes,
             launch.collective_bytes, kernels.part_of(launch, train=True))
      merged[key] += launch.times
  return [[times, *key] for key, times in sorted(merged.items(), key=lambda kv: -kv[1])]


def launches_of(rows: list[list]) -> list[tuple[int, hlo.Launch]]:
  """Stand-in Launches for kernel_seconds (only the fields it reads)."""
  out = []
  for times, kind, dtype, flops, nbytes, collective, _ in rows:
    launch = hlo.Launch(instruction=None, times=times, kind=kind or None, flops=flops,
                        opaque_flops=0.0, bytes=nbytes, collective_bytes=collective,
                        workspace=0, matmul_dtype=dtype)
    out.append((times, launch))
  return out


def estimate(step: dict, rates: kernels.Rates) -> float:
  """The step's seconds at `rates` on its chip."""
  chip = hardware.CHIPS[step["chip"]]
  return sum(times * kernels.kernel_seconds(launch, chip, rates)
             for times, launch in launches_of(step["kernels"]))


def ratios(steps: dict, rates: kernels.Rates) -> dict[str, float]:
  """Estimate over measurement, each step."""
  return {name: estimate(step, rates) / (step["measured_ms"] / 1e3)
          for name, step in steps.items()}


def fit(steps: dict) -> tuple[float, kernels.Rates]:
  """The rates with the least largest error, each within what Hopper reaches (matmuls <=
  0.8 of peak, HBM <= 0.9, >= 2 us a launch)."""
  best = None
  grid = itertools.product([0.05, 0.06, 0.07, 0.08, 0.1, 0.15, 0.25, 0.5],
                           [0.5, 0.6, 0.7, 0.75, 0.8], [0.4, 0.5, 0.6, 0.75, 0.9],
                           [0.6, 0.7, 0.8, 0.85, 0.9], [2e-6, 3e-6, 4e-6, 6e-6])
  for f32, matmul, attention, hbm, launch in grid:
    rates = kernels.Rates(matmul=matmul, matmul_f32=f32, attention=attention, hbm=hbm,
                          interconnect=0.7, launch_seconds=launch, calibrated="fit")
    worst = max(abs(math.log(r)) for r in ratios(steps, rates).values())
    if best is None or worst < best[0]:
      best = (worst, rates)
  return best


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--fit", action="store_true", help="refit the rates (a grid search)")
  parser.add_argument("--record", default="", help="add or replace the step of this name")
  parser.add_argument("--measured_ms", type=float, default=0.0)
  parser.add_argument("--hlo", default="", help="the step's optimised HLO text")
  parser.add_argument("--chip", default="h100", help="a key of hardware.CHIPS")
  parser.add_argument("--note", default="", help="what was measured, where, with which code")
  args = parser.parse_args()
  steps = json.load(open(DATA, encoding="utf-8")) if os.path.exists(DATA) else {}
  if args.record:
    if not (args.measured_ms > 0 and args.hlo and os.path.exists(args.hlo)):
      parser.error("--record needs --measured_ms > 0 and --hlo=<an existing HLO text file>")
    if args.chip not in hardware.CHIPS:
      parser.error(f"--chip={args.chip!r}: expected one of {sorted(hardware.CHIPS)}")
    with open(args.hlo, encoding="utf-8") as f:
      steps[args.record] = dict(chip=args.chip, measured_ms=args.measured_ms, note=args.note,
                                kernels=rows_of(f.read()))
    with open(DATA, "w", encoding="utf-8") as f:
      json.dump(steps, f, indent=None, separators=(",", ":"))
      f.write("\n")
    print(f"recorded {args.record}: {len(steps[args.record]['kernels'])} kernel rows")
  if not steps:
    parser.error(f"no steps in {DATA}; add one with --record")
  rates = kernels.RATES["h100"]
  print(f"{'step':<24} {'measured ms':>12} {'estimate ms':>12} {'ratio':>7}")
  for name, ratio in ratios(steps, rates).items():
    measured = steps[name]["measured_ms"]
    print(f"{name:<24} {measured:>12.1f} {ratio * measured:>12.1f} {ratio:>6.2f}x")
  if args.fit:
    worst, best = fit(steps)
    print(f"best bounded fit: largest error {math.exp(worst):.3f}x with {best}")
    print({name: round(r, 3) for name, r in ratios(steps, best).items()})


if __name__ == "__main__":
  main()
