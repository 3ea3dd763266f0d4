"""Where a train step's time goes: per-XLA-op times from a jax.profiler trace, by model part.

Runs --steps steps of a benchmarks/shapes.py shape under `jax.profiler.trace`, reads
the Perfetto trace it writes, and sums the time of every XLA op of the train step.
Each op is put in a part of the step by the `op_name` metadata XLA keeps from the JAX
program: forward or backward (`transpose(jvp(...))`) of a module path (attention, MLP,
norms, embedding, the output projection and loss), or the update (optimizer, norms of
gradients/parameters). Also prints XLA's own cost analysis (FLOPs, bytes) of the step
beside the model FLOPs of flops.py, the number of ops a step runs, and the wall time
per step against the summed op time (the gap is host work between ops and steps).

  python benchmarks/profile_step.py --shape tiny
  python benchmarks/profile_step.py --shape local --steps 10 --top 30
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

import jax

import shapes  # benchmarks/shapes.py; pylint: disable=g-bad-import-order

# Model parts by the module names in an op's path, first match wins.
PARTS = (("attention", ("self_attention/", "cross_attention/")),
         ("mlp", ("/mlp/",)),
         ("norms", ("_norm/", "final_norm")),
         ("embedding", ("embedder/token_embed", "embedder/position_embed")),
         ("output projection", ("attend", "lm_head")),
         ("blocks (other)", ("block_", "blocks/")))


def op_names(hlo_text: str) -> dict[str, str]:
  """{instruction name: the JAX op_name of its metadata} of a compiled HLO module."""
  names = {}
  for match in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?op_name=\"([^\"]+)\"",
                           hlo_text, re.M):
    names.setdefault(match.group(1), match.group(2))
  return names


def part_of(op_name: str) -> str:
  """'forward: mlp', 'backward: attention', 'update', ... for a JAX op_name."""
  if "transpose(" in op_name:
    phase = "backward"
  elif "jvp(" in op_name:
    phase = "forward"
  else:
    return "update (optimizer, norms, step)"
  for part, needles in PARTS:
    if any(needle in op_name for needle in needles):
      return f"{phase}: {part}"
  return f"{phase}: loss and other"


def read_trace(trace_dir: str, module: str) -> list[tuple[str, float]]:
  """(hlo_op, microseconds) of every executed op of HLO modules whose name holds `module`."""
  path = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)[0]
  with gzip.open(path) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return [(e["args"]["hlo_op"], float(e["dur"])) for e in events
          if e.get("ph") == "X" and module in e.get("args", {}).get("hlo_module", "")
          and "hlo_op" in e.get("args", {})]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shape", default="tiny", help=f"one of {sorted(shapes.SHAPES)}")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--top", type=int, default=20, help="the slowest ops listed")
  parser.add_argument("--trace_dir", default="", help="keep the trace here (default: temp)")
  args = parser.parse_args()
  print(shapes.platform_line())
  config = shapes.SHAPES[args.shape]()
  trainer = shapes.make_trainer(config)
  print(f"{args.shape}: {shapes.describe(config)}, {args.steps} steps\n")
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    batch = trainer.train_batch(shapes.random_batch(config))
    compiled = trainer.train_step.lower(state, batch).compile()
    _, state = shapes.run_steps(compiled, state, batch, 2)
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="profile_step_")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      start = time.perf_counter()
      _, state = shapes.run_steps(compiled, state, batch, args.steps)
      wall = (time.perf_counter() - start) / args.steps
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  model_flops = shapes.model_flops_per_step(config, trainer)
  print(f"XLA cost analysis: {cost.get('flops', 0) / 1e9:.3f} GFLOP, "
        f"{cost.get('bytes accessed', 0) / 1e6:.1f} MB accessed per step; model FLOPs "
        f"(flops.py) {model_flops / 1e9:.3f} GFLOP")

  names = op_names(compiled.as_text())
  ops = read_trace(trace_dir, "train_step")
  busy = sum(us for _, us in ops) / args.steps / 1e3
  print(f"wall {1e3 * wall:.2f} ms/step; XLA ops {busy:.2f} ms/step summed over "
        f"{len(ops) / args.steps:.0f} ops/step (ops can overlap on several threads)\n")
  by_part, by_op, count = (collections.Counter(), collections.Counter(),
                           collections.Counter())
  for op, us in ops:
    by_part[part_of(names.get(op, ""))] += us / args.steps / 1e3
    by_op[op] += us / args.steps / 1e3
    count[op] += 1
  print("| part of the step | ms/step | share |\n|---|---|---|")
  for part, ms in by_part.most_common():
    print(f"| {part} | {ms:.2f} | {100 * ms / busy:.0f}% |")
  print(f"\nThe {args.top} slowest ops:\n| op | ms/step | runs/step | JAX op_name |\n|---|---|---|---|")
  for op, ms in by_op.most_common(args.top):
    print(f"| {op} | {ms:.3f} | {count[op] / args.steps:.0f} | {names.get(op, '?')[-90:]} |")
  print(f"\ntrace: {trace_dir}")


if __name__ == "__main__":
  main()
