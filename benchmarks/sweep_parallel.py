"""--mode=sweep with its arms one at a time against two at a time (--devices_per_run=1).

Four small arms (configs/shakespeare_char.py:cpu, `seed=0,1,2,3`, --steps steps each,
--warmup warmup steps, evaluations of --eval_batches batches at steps 0 and --steps) swept as

  sequential  launch.py --mode=sweep ...                      (one arm at a time, all cores)
  parallel    the same with --devices_per_run=1               (one arm per core at once)
  ray         the same with --devices_per_run=1 --ray_address (--ray: each arm a task on a
              one-node local Ray cluster of --cpus CPUs; tests/local_ray.py, bound to 127.0.0.1)

in alternation (sequential, parallel[, ray], sequential, parallel[, ray], ...), each into a
fresh sweep folder, after one untimed arm that builds the dataset in the shared data_dir.
Each sweep prints one `RESULT {json}` line: its wall time (the whole command), the sum and
the longest of its arms' training-loop times (run.json's wall_seconds), each arm's final
eval_loss (the same in every mode: the same seeds), and `uptime`'s load averages before and
after (the machine may be shared: a load above the core count means the figures are upper
bounds). At the end one `RESULT {json}` line of medians, with parallel / sequential.

  nice -n 10 python benchmarks/sweep_parallel.py \\
    --data=../shared/data/tiny_shakespeare/input.txt --steps=100 --repeats=2 [--ray]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
SEEDS = "seed=0,1,2,3"


def load() -> str:
  """The 1, 5 and 15 minute load averages, as `uptime` prints them."""
  return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def sweep(sweep_dir: str, args: argparse.Namespace, data_dir: str, spec: str,
          extra: list[str]) -> float:
  """One launch.py --mode=sweep; its wall time (exits with its output if it failed)."""
  command = [sys.executable, "launch.py", "--mode=sweep",
             "--config=configs/shakespeare_char.py:cpu", f"--workdir={sweep_dir}",
             f"--sweep={spec}", f"--config.data.path={os.path.abspath(args.data)}",
             f"--config.data.data_dir={data_dir}", f"--config.train.num_steps={args.steps}",
             f"--config.train.eval_every={args.steps}",
             f"--config.checkpoint.every={args.steps}",
             f"--config.train.eval_batches={args.eval_batches}",
             f"--config.optimizer.warmup_steps={args.warmup}", *extra]
  start = time.perf_counter()
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if result.returncode:
    raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n"
                     f"{(result.stdout + result.stderr)[-4000:]}")
  return wall


def arms(sweep_dir: str) -> dict[str, dict[str, float]]:
  """{arm: {"loop_s": run.json's wall_seconds, "eval_loss": the last one}}."""
  found = {}
  for name in sorted(os.listdir(sweep_dir)):
    workdir = os.path.join(sweep_dir, name)
    if not os.path.isfile(os.path.join(workdir, "run.json")):
      continue
    with open(os.path.join(workdir, "run.json"), encoding="utf-8") as f:
      loop = float(json.load(f)["wall_seconds"])
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      losses = [row["eval_loss"] for row in map(json.loads, f) if "eval_loss" in row]
    found[name] = {"loop_s": loop, "eval_loss": losses[-1]}
  return found


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", required=True, help="Tiny Shakespeare's input.txt")
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--eval_batches", type=int, default=20, help="batches per evaluation")
  parser.add_argument("--warmup", type=int, default=10, help="optimizer.warmup_steps")
  parser.add_argument("--ray", action="store_true", help="also on a local Ray cluster")
  parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                      help="the Ray cluster's CPUs (default: this machine's)")
  args = parser.parse_args()
  if not os.path.isfile(args.data):
    raise SystemExit(f"--data={args.data}: no such file (Tiny Shakespeare's input.txt)")
  work = tempfile.mkdtemp(prefix="sweep_parallel_bench_")
  data_dir = os.path.join(work, "data")
  print(f"machine: {cpu_name()}, {os.cpu_count()} cores; load before: {load()}", flush=True)
  # Untimed: builds the dataset every timed sweep then reads.
  warm = time.perf_counter()
  sweep(os.path.join(work, "warmup"),
        argparse.Namespace(**{**vars(args), "steps": 10, "warmup": 1}),
        data_dir, "seed=0", [])
  print(f"warm-up (dataset built): {time.perf_counter() - warm:.1f} s", flush=True)
  modes = {"sequential": [], "parallel": ["--devices_per_run=1"]}
  cluster = None
  if args.ray:
    from local_ray import LocalCluster  # pylint: disable=g-import-not-at-top
    start = time.perf_counter()
    cluster = LocalCluster(workers=0, cpus=args.cpus)
    print(f"ray start (head, {args.cpus} CPUs): {time.perf_counter() - start:.1f} s", flush=True)
    modes["ray"] = ["--devices_per_run=1", f"--ray_address={cluster.address}"]
  results: dict[str, list[dict]] = {mode: [] for mode in modes}
  try:
    for repeat in range(args.repeats):
      for mode, extra in modes.items():
        sweep_dir = os.path.join(work, f"{mode}{repeat}")
        before = load()
        wall = sweep(sweep_dir, args, data_dir, SEEDS, extra)
        found = arms(sweep_dir)
        row = {"mode": mode, "repeat": repeat, "wall_s": round(wall, 1),
               "arms_loop_s_sum": round(sum(a["loop_s"] for a in found.values()), 1),
               "arms_loop_s_max": round(max(a["loop_s"] for a in found.values()), 1),
               "eval_loss": {name: a["eval_loss"] for name, a in found.items()},
               "load_before": before, "load_after": load()}
        results[mode].append(row)
        print("RESULT " + json.dumps(row), flush=True)
  finally:
    if cluster is not None:
      cluster.stop()
  losses = {json.dumps(row["eval_loss"], sort_keys=True) for rows in results.values()
            for row in rows}
  medians = {mode: statistics.median(row["wall_s"] for row in rows)
             for mode, rows in results.items()}
  summary = {"medians_wall_s": medians, "repeats": args.repeats, "arms": 4,
             "steps": args.steps, "cpu": cpu_name(), "cores": os.cpu_count(),
             "same_eval_losses_in_every_mode": len(losses) == 1, "load_after": load()}
  for mode in modes:
    if mode != "sequential":
      summary[f"{mode}_over_sequential"] = round(medians[mode] / medians["sequential"], 3)
  print("RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
  main()
