"""This project's training loop against PyTorch on nanoGPT's CPU recipe, side by side.

For each seed, one after the other in this one invocation (the order alternating from
seed to seed, so that a drift in the machine's load hits both): the PyTorch reference
(`benchmarks/nanogpt_reference.py`, vocabulary padded to 128 rows as here) and
`python launch.py --config=configs/shakespeare_char.py:cpu`, both for `--steps` steps.
Reported per seed and as means: tokens/s of each training loop (evaluations excluded on
both sides; the JAX side's first step, which compiles, too: `tokens_per_second` of its
metrics.jsonl, weighted by the steps of each row), their ratio (this project / PyTorch),
and the whole-split validation loss after the last step.

  python benchmarks/nanogpt_side_by_side.py \
      --data=../shared/data/tiny_shakespeare/input.txt --torch_python=/path/to/python \
      --seeds=0,1,2 --out=/tmp/side_by_side

`--set KEY=VALUE` (repeatable) overrides a key of the JAX runs' config, e.g.
`--set train.steps_per_call=1` for the loop without several steps per call.
`--torch_python` is an interpreter with torch installed (torch is not a requirement of
this repository); by default this one. The JAX runs' workdirs go under `--out`, one per
seed; a workdir that exists is refused (nothing is overwritten): give a new `--out`.
Run it on a quiet machine: the ratio is a speed measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = "configs/shakespeare_char.py:cpu"


def run_torch(args: argparse.Namespace, seed: int, log_path: str) -> dict[str, float]:
  """The PyTorch reference for one seed; its RESULT line as a dict."""
  argv = [args.torch_python, os.path.join(ROOT, "benchmarks", "nanogpt_reference.py"),
          f"--data={args.data}", f"--seeds={seed}", f"--steps={args.steps}",
          "--vocab_size=128", f"--eval_every={args.steps}", f"--threads={args.threads}"]
  output = _run(argv, log_path)
  results = [json.loads(line[len("RESULT "):]) for line in output.splitlines()
             if line.startswith("RESULT ")]
  if not results:
    raise SystemExit(f"the PyTorch reference printed no RESULT line; see {log_path}")
  return results[-1]


def run_jax(args: argparse.Namespace, seed: int, workdir: str,
            log_path: str) -> dict[str, float]:
  """launch.py's training of the preset for one seed, read back from its metrics.jsonl."""
  argv = [sys.executable, os.path.join(ROOT, "launch.py"), f"--config={PRESET}",
          f"--config.data.path={args.data}", f"--config.seed={seed}",
          f"--config.train.num_steps={args.steps}", f"--workdir={workdir}"]
  argv += [f"--config.{override}" for override in args.set]
  _run(argv, log_path)
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    data = json.load(f)["data"]  # The run's own batch and context, as trained.
  tokens_per_step = data["batch_size"] * data["seq_len"]
  train_rows = [r for r in rows if "seconds_per_step" in r]
  # The first call (its first step, or its train.steps_per_call steps) compiles and is
  # not timed: its row, the first with a loss, is where the timed steps start.
  untimed = min((r["step"] for r in rows if "loss" in r), default=1)
  eval_rows = [r for r in rows if "eval_loss" in r]
  if not train_rows or not eval_rows:
    raise SystemExit(f"{workdir}/metrics.jsonl has no timed or no evaluation rows")
  # Each row's seconds_per_step averages the steps since the row before it.
  seconds, steps, previous = 0.0, 0, untimed
  for row in sorted(train_rows, key=lambda r: r["step"]):
    count = row["step"] - previous
    seconds += row["seconds_per_step"] * count
    steps += count
    previous = row["step"]
  return {"seed": seed, "val_loss": eval_rows[-1]["eval_loss"], "steps": args.steps,
          "ms_per_step": 1e3 * seconds / steps,
          "tokens_per_second": tokens_per_step * steps / seconds}


def _run(argv: list[str], log_path: str) -> str:
  print("$ " + " ".join(argv), flush=True)
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  with open(log_path, "w", encoding="utf-8") as log:
    completed = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, check=False)
    log.write(completed.stdout)
  if completed.returncode:
    raise SystemExit(f"exit {completed.returncode}: {' '.join(argv)}; its output is in "
                     f"{log_path}")
  return completed.stdout


def _mean_std(values: list[float]) -> str:
  if len(values) == 1:
    return f"{values[0]:.4f}"
  return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", required=True, help="Tiny Shakespeare's input.txt")
  parser.add_argument("--torch_python", default=sys.executable,
                      help="a Python interpreter with torch installed")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--threads", type=int, default=2, help="PyTorch's intra-op threads")
  parser.add_argument("--out", required=True, help="a new folder for workdirs and logs")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a config override of the JAX runs, repeatable, passed to "
                      "launch.py as --config.KEY=VALUE (e.g. train.steps_per_call=1)")
  args = parser.parse_args()
  for override in args.set:
    if "=" not in override or override.startswith("="):
      parser.error(f"--set {override!r}: expected KEY=VALUE, e.g. train.steps_per_call=1")
  if not os.path.isfile(args.data):
    parser.error(f"--data={args.data}: no such file (Tiny Shakespeare's input.txt)")
  args.data = os.path.abspath(args.data)
  seeds = [int(s) for s in args.seeds.split(",")]
  os.makedirs(args.out, exist_ok=True)
  rows = []
  start = time.perf_counter()
  for index, seed in enumerate(seeds):
    workdir = os.path.join(args.out, f"jax_seed{seed}")
    if os.path.exists(workdir):
      raise SystemExit(f"{workdir} exists; give a new --out (nothing is overwritten)")
    order = ("torch", "jax") if index % 2 == 0 else ("jax", "torch")
    results = {}
    for side in order:
      print(f"[seed {seed}] {side} ({(time.perf_counter() - start) / 60:.1f} min so far)",
            flush=True)
      log_path = os.path.join(args.out, f"{side}_seed{seed}.log")
      results[side] = (run_torch(args, seed, log_path) if side == "torch"
                       else run_jax(args, seed, workdir, log_path))
      print(f"[seed {seed}] {side}: {results[side]['ms_per_step']:.1f} ms/step, "
            f"{results[side]['tokens_per_second']:,.0f} tokens/s, val loss "
            f"{results[side]['val_loss']:.4f}", flush=True)
    rows.append(results)
  overrides = f"; JAX overrides: {', '.join(args.set)}" if args.set else ""
  print(f"\nnanoGPT's CPU recipe ({args.steps} steps, batch 12 x 64{overrides}), "
        f"{(time.perf_counter() - start) / 60:.1f} min in all:\n")
  print("| seed | PyTorch ms/step | this project ms/step | PyTorch tokens/s "
        "| this project tokens/s | ratio | PyTorch val loss | this project val loss |")
  print("|---|---|---|---|---|---|---|---|")
  for seed, r in zip(seeds, rows):
    t, j = r["torch"], r["jax"]
    print(f"| {seed} | {t['ms_per_step']:.1f} | {j['ms_per_step']:.1f} "
          f"| {t['tokens_per_second']:,.0f} | {j['tokens_per_second']:,.0f} "
          f"| {j['tokens_per_second'] / t['tokens_per_second']:.2f}x "
          f"| {t['val_loss']:.4f} | {j['val_loss']:.4f} |")
  ratios = [r["jax"]["tokens_per_second"] / r["torch"]["tokens_per_second"] for r in rows]
  print(f"\ntokens/s ratio (this project / PyTorch): {_mean_std(ratios)}; validation loss: "
        f"PyTorch {_mean_std([r['torch']['val_loss'] for r in rows])}, this project "
        f"{_mean_std([r['jax']['val_loss'] for r in rows])}")


if __name__ == "__main__":
  main()
