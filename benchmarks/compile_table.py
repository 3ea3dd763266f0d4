"""docs/compile-results.md's table: every preset compiled for every slice, one cell at a time.

Each cell is one `launch.py --mode=compile --notry_levers --compile_steps=<steps>`
process (the command a user would type, printed before it starts), its report kept as
`<out>/<preset>@<slice>.json` beside its console output `<out>/<preset>@<slice>.log`
and its wall time in `<out>/<preset>@<slice>.time`. A cell whose JSON (or, for a cell
that stopped with an error, whose .time file) exists is not compiled again, so the
same command resumes an interrupted table; `--redo` compiles every cell anew. At the
end, and with `--table_only` at any time, the cells are printed as docs/compile-results.md's
markdown table. Cells that could not be compiled are rows too, with the reason.

  python benchmarks/compile_table.py --out=/tmp/compile_table            # all 36 cells
  python benchmarks/compile_table.py --out=/tmp/compile_table --presets=bert_base \
      --slices=v6e:2x4 --steps=train,eval
  python benchmarks/compile_table.py --out=/tmp/compile_table --table_only

Needs libtpu (`pip install libtpu`) and, for the h100/h200 columns, jax's CUDA plugin
(`pip install jax-cuda12-plugin==0.10.2 jax-cuda12-pjrt==0.10.2`); runs on this host's CPU. A full-size compile takes
minutes on 2 cores: run the whole table in the background (`nohup ... &`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Preset -> (config argument, overrides). Every global batch here divides over the
# largest slice's 32 data/fsdp shards; gpt_small's own batch (8 rows in 2
# micro-batches, sized for a CPU host) does not, so it is raised as its docstring says
# to on accelerators.
PRESETS = {
    "gpt_small": ("configs/gpt_small.py",
                  ("--config.data.batch_size=64", "--config.train.microbatches=1")),
    "bert_base": ("configs/bert_base.py", ()),
    "transformer_base": ("configs/transformer_base.py", ()),
    "transformer_big": ("configs/transformer_big.py", ()),
    "llama_1b": ("configs/llama.py:1b", ()),
    "llama_7b": ("configs/llama.py:7b", ()),
}
# The slices, as jax.experimental.topologies spells them, with their Cloud names.
# The GPU hosts (jax's CUDA plugin, planning/gpu.py) with what a cloud calls them.
SLICES = {"v4:2x2x1": "v4-8", "v5e:4x4": "v5e-16", "v5p:2x4x4": "v5p-64", "v6e:2x4": "v6e-8",
          "h100:8": "8 x H100 SXM", "h200:8": "8 x H200 SXM"}


def cell_name(preset: str, slice_name: str) -> str:
  return f"{preset}@{slice_name.replace(':', '_')}"


def command(preset: str, slice_name: str, steps: str, output: str) -> list[str]:
  """The launch.py command of one cell."""
  config, overrides = PRESETS[preset]
  return [sys.executable, "launch.py", "--mode=compile", "--notry_levers",
          f"--compile_steps={steps}", f"--config={config}", *overrides,
          f"--topology={slice_name}", f"--output={output}"]


def run_cell(preset: str, slice_name: str, steps: str, out: str) -> tuple[int, float]:
  """Compiles one cell in its own process; returns (exit status, wall seconds)."""
  base = os.path.join(out, cell_name(preset, slice_name))
  argv = command(preset, slice_name, steps, base + ".json")
  print("$ " + " ".join(argv[1:]), flush=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  start = time.perf_counter()
  with open(base + ".log", "w", encoding="utf-8") as log:
    status = subprocess.call(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
  seconds = time.perf_counter() - start
  with open(base + ".time", "w", encoding="utf-8") as f:
    json.dump({"status": status, "seconds": seconds, "command": argv[1:]}, f)
  return status, seconds


def _gib(nbytes: float) -> str:
  return f"{nbytes / 2 ** 30:.2f}"


def _last_line(path: str) -> str:
  """The reason a failed cell gave: its last non-empty console line."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      lines = [line.strip() for line in f if line.strip()]
  except OSError:
    return "no log"
  return lines[-1][:200] if lines else "no output"


def _batch(report: dict, log_path: str) -> str:
  """'rows x length' of the cell: from the report, or (reports written before the
  report carried its config) from the mode's own 'Mesh ..., batch R x L' line."""
  config = report.get("config")
  if config:
    return f"{config['batch_size']} x {config['seq_len']}"
  with open(log_path, encoding="utf-8", errors="replace") as f:
    found = re.search(r", batch (\d+ x \d+),", f.read())
  return found.group(1) if found else "-"


def table_row(preset: str, slice_name: str, out: str) -> str | None:
  """The markdown row of one cell, or None when it has not run."""
  base = os.path.join(out, cell_name(preset, slice_name))
  if not os.path.exists(base + ".time"):
    return None
  with open(base + ".time", encoding="utf-8") as f:
    timing = json.load(f)
  head = f"| {preset} | {SLICES[slice_name]} (`{slice_name}`) "
  if not os.path.exists(base + ".json"):
    return head + (f"| - | - | - | - | - | exit {timing['status']}: {_last_line(base + '.log')} "
                   f"| {timing['seconds']:.0f} s |")
  with open(base + ".json", encoding="utf-8") as f:
    report = json.load(f)
  mesh = " x ".join(f"{axis} {size}" for axis, size in report["mesh"].items() if size > 1)
  cells = []
  for step_name, step in report["steps"].items():
    if step.get("compile_error"):
      # XLA's TPU compiler stops at temporaries above the chip's HBM; the report then
      # holds the hand-counted arguments plus XLA's temporaries figure.
      cells.append(f"{step_name} {_gib(step['total_bytes'])} GiB ({_gib(step['arguments_bytes'])}"
                   f" + {_gib(step['temp_bytes'])}; XLA refused to compile it: "
                   "temporaries above HBM)")
      continue
    outputs = step["output_bytes"] - step.get("alias_bytes", 0)
    cells.append(f"{step_name} {_gib(step['total_bytes'])} GiB ({_gib(step['arguments_bytes'])}"
                 f" + {_gib(step['temp_bytes'])} + {_gib(outputs)} + {_gib(step['code_bytes'])})")
  train = report["steps"].get("train", {})
  chip = _gib(train.get("chip_bytes", 0))
  fits = all(step["fits"] for step in report["steps"].values())
  verdict = "fits" if fits else "**does not fit**"
  estimate = "-"
  if train.get("estimated_seconds"):
    mfu = train.get("estimated_mfu")
    estimate = (f"{train['estimated_seconds'] * 1e3:.1f} ms ({train['estimate_bound']}"
                f"-bound{f', MFU <= {100 * mfu:.0f}%' if mfu is not None else ''})")
    if train.get("collective_error"):
      estimate += ", collectives unknown"
  compile_seconds = " / ".join(f"{step.get('compile_seconds') or 0:.0f}"
                               for step in report["steps"].values())
  batch = _batch(report, base + ".log")
  return (head + f"| {mesh or 'data 1'} | {batch} | {'; '.join(cells)} of {chip} GiB | {verdict} "
          f"| {estimate} | {compile_seconds} s (wall {timing['seconds']:.0f} s) |")


HEADER = ("| preset | slice | mesh | global batch | per chip: total GiB (arguments + "
          "temporaries + outputs + code) | verdict | est. train step (upper-bound MFU) "
          "| compile time |\n|---|---|---|---|---|---|---|---|")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="folder for the cells' reports")
  parser.add_argument("--presets", default=",".join(PRESETS),
                      help=f"comma-separated, of {', '.join(PRESETS)}")
  parser.add_argument("--slices", default=",".join(SLICES),
                      help=f"comma-separated, of {', '.join(SLICES)}")
  parser.add_argument("--steps", default="train", help="--compile_steps of every cell")
  parser.add_argument("--redo", action="store_true", help="compile finished cells again")
  parser.add_argument("--table_only", action="store_true", help="print the table, compile nothing")
  args = parser.parse_args()
  presets, slices = args.presets.split(","), args.slices.split(",")
  for name, known in (("--presets", PRESETS), ("--slices", SLICES)):
    unknown = [v for v in (presets if name == "--presets" else slices) if v not in known]
    if unknown:
      parser.error(f"{name}: unknown {', '.join(unknown)}; valid: {', '.join(known)}")
  os.makedirs(args.out, exist_ok=True)
  cells = [(p, s) for p in presets for s in slices]
  if not args.table_only:
    start = time.perf_counter()
    for index, (preset, slice_name) in enumerate(cells, 1):
      base = os.path.join(args.out, cell_name(preset, slice_name))
      if not args.redo and os.path.exists(base + ".time"):
        print(f"[{index}/{len(cells)}] {preset} on {slice_name}: done before, kept", flush=True)
        continue
      print(f"[{index}/{len(cells)}] {preset} on {slice_name} "
            f"({(time.perf_counter() - start) / 60:.0f} min so far)", flush=True)
      status, seconds = run_cell(preset, slice_name, args.steps, args.out)
      print(f"[{index}/{len(cells)}] {preset} on {slice_name}: exit {status} in "
            f"{seconds:.0f} s ({_last_line(base + '.log')})", flush=True)
  rows = [table_row(p, s, args.out) for p, s in cells]
  print("\n" + HEADER)
  print("\n".join(row for row in rows if row))
  missing = [cell_name(p, s) for (p, s), row in zip(cells, rows) if row is None]
  print(f"\n{len(cells) - len(missing)} of {len(cells)} cells compiled or answered"
        + (f"; not run: {', '.join(missing)}" if missing else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
