"""Train-step speed: step time, tokens/s and model FLOP/s as a fraction of a matmul's rate.

For each shape of benchmarks/shapes.py the project's own jitted, donated train step
(`train.Trainer`, AdamW, clipping, norms) runs on one fixed random batch, dispatched as
the training loop does (step t before step t-1's metrics are fetched). Rounds alternate
a burst of steps (about --round_seconds) with a reference matmul (a [1024, 1024] float32
product on CPU, [8192, 8192] bfloat16 on accelerators), so both see the same load on a
shared machine. Reported: the best round's step time, tokens/s, model FLOPs (flops.py,
the PaLM count) per second, and that as a fraction of the best matmul rate; also the
median over rounds of each round's own ratio. On a GPU/TPU in flops.PEAK_BF16_FLOPS, MFU
against the published bf16 peak too. Compilation is excluded (reported separately by
benchmarks/compile_time.py).

  python benchmarks/train_step.py                       # tiny, local, gpt_small
  python benchmarks/train_step.py --shapes tiny,local --rounds 9
  python benchmarks/train_step.py --shapes tiny --set model.attention_impl=einsum
  python benchmarks/train_step.py --shapes tiny --set train.steps_per_call=10

With `--set train.steps_per_call=K` the timed call is `Trainer.train_steps`, K steps in
one compiled call as the training loop then runs them (on K copies of the batch); the
step time is the call's over K.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

import shapes  # benchmarks/shapes.py; pylint: disable=g-bad-import-order
from transformer.training import flops


def measure_shape(name: str, rounds: int, round_seconds: float, overrides: list[str]) -> dict:
  """Times one shape; returns the numbers of its table row."""
  config = shapes.SHAPES[name]()
  shapes.apply_overrides(config, overrides)
  trainer = shapes.make_trainer(config)
  per_call = config.train.steps_per_call
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    host_batch = shapes.random_batch(config)
    if per_call == 1:
      step, batch = trainer.train_step, trainer.train_batch(host_batch)
    else:  # train.steps_per_call=K: K steps a call (lax.scan), as the training loop runs them.
      step, batch = trainer.train_steps, trainer.train_batch(
          {k: np.stack([v] * per_call) for k, v in host_batch.items()}, stacked=True)
    start = time.perf_counter()
    _, state = shapes.run_steps(step, state, batch, 1)
    first_step = time.perf_counter() - start
    warm, state = shapes.run_steps(step, state, batch, 1)
    calls = max(1, min(100, round(round_seconds / warm)))
    step_times, matmul_rates = [], []
    for _ in range(rounds):
      matmul_rates.append(shapes.measure_matmul())
      seconds, state = shapes.run_steps(step, state, batch, calls)
      step_times.append(seconds / per_call)
  model_flops = shapes.model_flops_per_step(config, trainer)
  best = min(step_times)
  return dict(
      name=name, describe=shapes.describe(config),
      params=sum(x.size for x in jax.tree.leaves(state.params)),
      tokens=config.data.batch_size * config.data.seq_len, steps=calls * per_call,
      first_step=first_step, best=best, median=statistics.median(step_times),
      model_flops=model_flops, matmul=max(matmul_rates),
      fraction=model_flops / best / max(matmul_rates),
      fraction_median=statistics.median(
          model_flops / t / r for t, r in zip(step_times, matmul_rates)))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shapes", default="tiny,local,gpt_small",
                      help=f"comma-separated, of {sorted(shapes.SHAPES)}")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--round_seconds", type=float, default=2.0,
                      help="steps per round: about this long (at least one step)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a config override for every shape, repeatable: e.g. "
                      "model.attention_impl=einsum, model.dtype=bfloat16 (default dtype "
                      "'auto': float32 on CPU, bfloat16 on GPU/TPU)")
  args = parser.parse_args()
  print(shapes.platform_line())
  device = jax.devices()[0]
  published = flops.published_peak_flops(device.device_kind)
  peak = published * jax.device_count() if published and device.platform != "cpu" else None
  if args.set:
    print("overrides: " + ", ".join(args.set))
  print(f"{args.rounds} rounds per shape, each a reference matmul then ~{args.round_seconds}"
        " s of steps; best round and median of the rounds' ratios\n")
  header = ("| shape | parameters | tokens/step | step ms (best / median) | tokens/s | "
            "model GFLOP/step | model GFLOP/s | matmul GFLOP/s | fraction of matmul "
            "(best / median)" + (" | MFU vs published peak" if peak else "") + " |")
  print(header)
  print("|" + "---|" * header.count(" | ") + "---|")
  for name in args.shapes.split(","):
    r = measure_shape(name, args.rounds, args.round_seconds, args.set)
    row = (f"| {r['name']} ({r['describe']}) | {r['params'] / 1e6:.2f}M | {r['tokens']} | "
           f"{1e3 * r['best']:.1f} / {1e3 * r['median']:.1f} | "
           f"{r['tokens'] / r['best']:,.0f} | {r['model_flops'] / 1e9:.2f} | "
           f"{r['model_flops'] / r['best'] / 1e9:.1f} | {r['matmul'] / 1e9:.1f} | "
           f"{100 * r['fraction']:.0f}% / {100 * r['fraction_median']:.0f}%")
    if peak:
      row += f" | {100 * r['model_flops'] / r['best'] / peak:.1f}%"
    print(row + " |", flush=True)


if __name__ == "__main__":
  main()
