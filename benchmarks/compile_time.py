"""Compile time: `model.scan_layers` on vs off at 12, 24 and 48 layers (time to first step).

The gpt_small.py:local shape (d_model 256, 4 heads, MLP 1024, context 128, batch 16,
vocab 384) at each depth, unrolled blocks (`block_0`, ...) and `nn.scan` over one
block. For each: building the Trainer (shapes and shardings through jax.eval_shape),
the sharded init (compile + run), tracing + lowering the train step, compiling it, and
running the first step; "to first step" is their sum, what a user waits for before
the first progress line (the data pipeline aside). Each configuration runs in a fresh
process that has started JAX's backend first (the one-off cost every run pays before
its model compiles), in the order 12 off, 12 on, 24 off, ..., so that a change in the
machine's load hits both settings.

  python benchmarks/compile_time.py
  python benchmarks/compile_time.py --layers 12,48 --shape tiny
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

import shapes  # benchmarks/shapes.py; pylint: disable=g-bad-import-order


def time_to_first_step(shape: str, layers: int, scan: bool) -> dict[str, float]:
  """Seconds of each phase before the first step of `shape` at `layers` blocks is done."""
  jax.jit(jnp.sin)(jnp.ones(8)).block_until_ready()  # The backend, before the clock.
  config = shapes.SHAPES[shape]()
  config.model.update(num_layers=layers, scan_layers=scan)
  times = {}
  start = time.perf_counter()
  trainer = shapes.make_trainer(config)
  times["trainer"] = time.perf_counter() - start
  with trainer.context():
    start = time.perf_counter()
    state = jax.block_until_ready(trainer.init(jax.random.PRNGKey(0)))
    times["init"] = time.perf_counter() - start
    batch = trainer.train_batch(shapes.random_batch(config))
    start = time.perf_counter()
    lowered = trainer.train_step.lower(state, batch)
    times["lower"] = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    times["compile"] = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(compiled(state, batch))
    times["first step"] = time.perf_counter() - start
  times["to first step"] = sum(times.values())
  return times


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shape", default="local", help=f"one of {sorted(shapes.SHAPES)}")
  parser.add_argument("--layers", default="12,24,48")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # "layers,scan": JSON.
  args = parser.parse_args()
  if args.child:
    layers, scan = args.child.split(",")
    print(json.dumps(time_to_first_step(args.shape, int(layers), scan == "True")))
    return
  print(shapes.platform_line())
  print(f"{args.shape} shape ({shapes.describe(shapes.SHAPES[args.shape]())}) at each "
        "depth; seconds\n")
  phases = ("trainer", "init", "lower", "compile", "first step", "to first step")
  print("| layers | scan_layers | " + " | ".join(phases) + " |")
  print("|---|---|" + "---|" * len(phases))
  totals, compiles = {}, {}
  for layers in [int(x) for x in args.layers.split(",")]:
    for scan in (False, True):
      result = subprocess.run(
          [sys.executable, os.path.abspath(__file__), f"--shape={args.shape}",
           f"--child={layers},{scan}"], capture_output=True, text=True, check=True)
      times = json.loads(result.stdout.strip().splitlines()[-1])
      totals[layers, scan] = times["to first step"]
      compiles[layers, scan] = times["compile"]
      print(f"| {layers} | {scan} | " + " | ".join(f"{times[p]:.1f}" for p in phases) + " |",
            flush=True)
  depths = sorted({layers for layers, _ in totals})
  for scan in (False, True):
    print(f"scan_layers={scan}: {depths[-1]} layers take "
          f"{compiles[depths[-1], scan] / compiles[depths[0], scan]:.2f}x the compile time of "
          f"{depths[0]}, {totals[depths[-1], scan] / totals[depths[0], scan]:.2f}x the time "
          "to the first step (which includes the init and the step's own run)")


if __name__ == "__main__":
  main()
