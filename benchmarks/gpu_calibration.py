"""The GPU time model's calibration: measured train steps against their kernels' estimate.

planning/kernels.py prices every kernel of a step at a chip's Rates; planning/
calibration.py fits the GPU efficiencies on the train steps measured on a device, kept
as data in transformer/planning/gpu_calibration.json (each step's kernels as compact
rows, the measured time, where it came from, and its case). This script prints, for
each step, the best fit's estimate against its measurement, the leave-one-out
prediction (the fit on the other steps), the floor, and the range of every fit within
the tolerance; and records a new step.

  python benchmarks/gpu_calibration.py                       # the table
  python benchmarks/gpu_calibration.py --record=NAME --case=CASE --measured_ms=MS \
      --hlo=STEP.txt --note="..."                            # add or replace a step

--hlo is the train step's optimised HLO text as XLA dumps it (`XLA_FLAGS=--xla_dump_to=DIR
--xla_dump_hlo_as_text` around `--mode=compile`, the file ending in
after_optimizations.txt), compiled for the same GPU without a device by the code that was
measured; or the device's own (`compiled.as_text()`, which gpu_train_step.py writes with
--hlo_out). --case names the model and shape: steps of one case count as one independent
case (calibration.py). tests/test_kernels.py holds the fit to every step (within 1.25x).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from transformer import hardware
from transformer.planning import calibration
from transformer.planning import hlo


def table(steps: dict) -> list[dict]:
  """One row a step: measured, best fit, leave-one-out, floor and range (ms)."""
  cal = calibration.fit(steps)
  loo = calibration.leave_one_out(steps)
  rows = []
  for name, step in steps.items():
    chip = hardware.CHIPS[step["chip"]]
    found = calibration.launches_of(step["kernels"])
    low, high = calibration.interval(found, chip, cal)
    rows.append(dict(step=name, case=step.get("case", name), measured_ms=step["measured_ms"],
                     estimate_ms=cal.best_ratios[name] * step["measured_ms"],
                     ratio=cal.best_ratios[name], loo_ratio=loo[name],
                     floor_ms=calibration.floor_seconds(found, chip) * 1e3, low_ms=low * 1e3,
                     high_ms=high * 1e3))
  return rows


def print_table(steps: dict) -> None:
  cal = calibration.fit(steps)
  cases = sorted({step.get("case", name) for name, step in steps.items()})
  print(f"{len(steps)} measured steps in {len(cases)} independent cases ({', '.join(cases)}); "
        f"fitted: {', '.join(calibration.FREE_PARAMETERS)}; best fit {cal.best}")
  print(f"{'step':<26} {'measured':>9} {'estimate':>9} {'ratio':>6} {'LOO':>6} "
        f"{'floor':>8} {'range (fits within ' + str(calibration.TOLERANCE) + 'x)':>28}")
  for row in table(steps):
    print(f"{row['step']:<26} {row['measured_ms']:>9.1f} {row['estimate_ms']:>9.1f} "
          f"{row['ratio']:>5.2f}x {row['loo_ratio']:>5.2f}x {row['floor_ms']:>8.1f} "
          f"{row['low_ms']:>13.1f} - {row['high_ms']:<12.1f}")
  print("(ms; LOO: the step predicted by the fit on the others: a step's twin of the same "
        "case stays in, so it is the optimistic end of a transfer error)")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--record", default="", help="add or replace the step of this name")
  parser.add_argument("--case", default="", help="the model and shape of the step "
                      "(steps of one case are one independent case)")
  parser.add_argument("--measured_ms", type=float, default=0.0)
  parser.add_argument("--hlo", default="", help="the step's optimised HLO text")
  parser.add_argument("--chip", default="h100", help="a key of hardware.CHIPS")
  parser.add_argument("--note", default="", help="what was measured, where, with which code")
  parser.add_argument("--data", default=calibration.DATA, help="the calibration file")
  args = parser.parse_args()
  with open(args.data, encoding="utf-8") as f:
    steps = json.load(f)
  if args.record:
    if not (args.measured_ms > 0 and args.hlo and os.path.exists(args.hlo) and args.case):
      parser.error("--record needs --case, --measured_ms > 0 and --hlo=<an existing HLO "
                   "text file>")
    if args.chip not in hardware.CHIPS:
      parser.error(f"--chip={args.chip!r}: expected one of {sorted(hardware.CHIPS)}")
    with open(args.hlo, encoding="utf-8") as f:
      found, _, _ = hlo.launches(f.read())
    steps[args.record] = dict(case=args.case, chip=args.chip, measured_ms=args.measured_ms,
                              note=args.note, kernels=calibration.rows_of(found))
    with open(args.data, "w", encoding="utf-8") as f:
      json.dump(steps, f, indent=None, separators=(",", ":"))
      f.write("\n")
    print(f"recorded {args.record}: {len(steps[args.record]['kernels'])} kernel rows")
  print_table(steps)


if __name__ == "__main__":
  main()
