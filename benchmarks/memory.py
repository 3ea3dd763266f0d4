"""Memory and step time of the GPT-small step for each `model.remat` policy.

Each (policy, model.scan_layers) pair runs in a process of its own (peak resident
memory only grows within a process): build the Trainer, init, compile the train step,
run --steps steps. Reported: XLA's memory analysis of the compiled step (its
temporary buffers, mostly the activations kept for the backward pass, beside the
arguments: parameters, optimizer state and the batch), the process's peak resident
memory (host RAM; on CPU it holds everything), the device's peak bytes in use where the
backend reports memory stats (GPU, TPU), and the median step time after compilation.
The processes run one after another: on a shared machine their step times see
different loads.

  python benchmarks/memory.py                      # gpt_small, context 256, batch 8
  python benchmarks/memory.py --shape local --steps 5 --scan True
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

import jax

import shapes  # benchmarks/shapes.py; pylint: disable=g-bad-import-order
from transformer.config.model import REMAT_POLICIES


def measure_policy(shape: str, policy: str, scan: bool, steps: int) -> dict:
  """Runs in the child process: memory and step time of one policy."""
  config = shapes.SHAPES[shape]()
  config.model.update(remat=policy, scan_layers=scan)
  trainer = shapes.make_trainer(config)
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    batch = trainer.train_batch(shapes.random_batch(config))
    compiled = trainer.train_step.lower(state, batch).compile()
    analysis = compiled.memory_analysis()
    _, state = shapes.run_steps(compiled, state, batch, 1)
    times = []
    for _ in range(steps):
      seconds, state = shapes.run_steps(compiled, state, batch, 1)
      times.append(seconds)
  stats = jax.devices()[0].memory_stats() or {}
  return dict(
      step=statistics.median(times),
      temp=getattr(analysis, "temp_size_in_bytes", 0),
      arguments=getattr(analysis, "argument_size_in_bytes", 0),
      peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # KiB on Linux.
      device_peak=stats.get("peak_bytes_in_use", 0))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shape", default="gpt_small", help=f"one of {sorted(shapes.SHAPES)}")
  parser.add_argument("--policies", default=",".join(REMAT_POLICIES))
  parser.add_argument("--scan", default="False,True", help="model.scan_layers values")
  parser.add_argument("--steps", type=int, default=2, help="timed steps after the first")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # "policy,scan": JSON.
  args = parser.parse_args()
  if args.child:
    policy, scan = args.child.split(",")
    print(json.dumps(measure_policy(args.shape, policy, scan == "True", args.steps)))
    return
  print(shapes.platform_line())
  print(f"{args.shape}: {shapes.describe(shapes.SHAPES[args.shape]())}; each setting in its "
        f"own process, the median of {args.steps} steps after the first\n")
  gib = 2.0 ** 30
  print("| model.scan_layers | model.remat | step s | XLA temporaries GiB | arguments GiB | "
        "peak host RSS GiB | device peak GiB |\n|---|---|---|---|---|---|---|")
  for scan in args.scan.split(","):
    for policy in args.policies.split(","):
      result = subprocess.run(
          [sys.executable, os.path.abspath(__file__), f"--shape={args.shape}",
           f"--steps={args.steps}", f"--child={policy},{scan}"],
          capture_output=True, text=True, check=False)
      if result.returncode:
        print(f"| {scan} | {policy} | failed: {result.stderr.strip().splitlines()[-1:]} |||||")
        continue
      r = json.loads(result.stdout.strip().splitlines()[-1])
      device = f"{r['device_peak'] / gib:.2f}" if r["device_peak"] else "n/a (CPU)"
      print(f"| {scan} | {policy} | {r['step']:.2f} | {r['temp'] / gib:.2f} | "
            f"{r['arguments'] / gib:.2f} | {r['peak_rss'] / gib:.2f} | {device} |", flush=True)


if __name__ == "__main__":
  main()
