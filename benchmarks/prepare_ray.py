"""--mode=prepare on the local worker pool against a local Ray cluster of the same cores.

Writes a synthetic corpus (--files jsonl files of --mb_per_file MB of word documents),
then, --repeats rounds interleaved, each into a fresh data_dir:

  local   launch.py --mode=prepare --config.data.prepare_workers=--cpus
  ray     launch.py --mode=prepare --ray_address=<a one-node cluster of --cpus CPUs>

and reports each one's wall time (the whole command), its tasks' time (the "N tasks
done in" line: tokenizing, from the first task's start) and tokens/s over it, with the
ratio ray / local. Also: Ray's start-up (the `ray start` of the head until it is ready),
and a rerun with nothing left to do on each path (Ray's connect and node check: the
difference). The cluster is tests/local_ray.py's, bound to 127.0.0.1 and stopped by
process ids. Bytes tokenizer: the scheduling is measured, not a vocabulary.

  nice -n 10 python benchmarks/prepare_ray.py --files=8 --mb_per_file=3 --repeats=2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def write_corpus(folder: str, files: int, mb_per_file: float) -> int:
  """jsonl files of random word documents; returns their bytes."""
  rng = random.Random(0)
  words = [("".join(rng.choice("etaoinshrdlcumwfgypbvk") for _ in range(rng.randint(2, 9))))
           for _ in range(5000)]
  os.makedirs(folder, exist_ok=True)
  total = 0
  for i in range(files):
    lines, size = [], 0
    while size < mb_per_file * 1e6:
      line = json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(50, 400)))}) + "\n"
      lines.append(line)
      size += len(line)
    with open(os.path.join(folder, f"part-{i:03d}.jsonl"), "w", encoding="utf-8") as f:
      f.writelines(lines)
    total += size
  return total


def prepare(source: str, data_dir: str, extra: list[str]) -> dict:
  """One launch.py --mode=prepare: its wall time, tasks' time and tokens."""
  args = [sys.executable, "launch.py", "--mode=prepare", f"--config=tests/tiny.py:{data_dir}",
          "--config.data.name=corpus", f"--config.data.path={source}",
          "--config.data.tokenizer=bytes", "--config.model.vocab_size=0",
          f"--config.data.data_dir={data_dir}", *extra]
  start = time.perf_counter()
  result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if result.returncode:
    raise SystemExit(result.stderr[-3000:])
  tasks = re.search(r"prepare: \d+ tasks done in ([\d.]+)s", result.stderr)
  tokens = sum(int(n.replace(",", "")) for n in re.findall(r"([\d,]+) tokens in", result.stderr))
  return {"wall_s": wall, "tasks_s": float(tasks.group(1)) if tasks else float("nan"),
          "tokens": tokens}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--files", type=int, default=8)
  parser.add_argument("--mb_per_file", type=float, default=3.0)
  parser.add_argument("--cpus", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()
  from local_ray import LocalCluster  # pylint: disable=g-import-not-at-top
  work = tempfile.mkdtemp(prefix="prepare_ray_bench_")
  source = os.path.join(work, "src")
  size = write_corpus(source, args.files, args.mb_per_file)
  print(f"corpus: {args.files} files, {size / 1e6:.1f} MB", flush=True)
  start = time.perf_counter()
  cluster = LocalCluster(workers=0, cpus=args.cpus)
  startup = time.perf_counter() - start
  print(f"ray start (head, {args.cpus} CPUs): {startup:.1f} s", flush=True)
  runs = {"local": [], "ray": []}
  flags = {"local": [f"--config.data.prepare_workers={args.cpus}"],
           "ray": [f"--ray_address={cluster.address}"]}
  try:
    for repeat in range(args.repeats):
      for name in ("local", "ray"):
        data_dir = os.path.join(work, f"{name}{repeat}")
        run = prepare(source, data_dir, flags[name])
        rerun = prepare(source, data_dir, flags[name])  # Nothing left to do.
        run["rerun_wall_s"] = rerun["wall_s"]
        run["tokens_per_s"] = run["tokens"] / run["tasks_s"]
        runs[name].append(run)
        print(json.dumps({"path": name, "repeat": repeat, **run}), flush=True)
  finally:
    cluster.stop()
  median = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
            for name, rs in runs.items()}
  print(f"\nmedians of {args.repeats} (AMD EPYC, {os.cpu_count()} cores):")
  for name, m in median.items():
    print(f"  {name:5s} wall {m['wall_s']:.1f} s, tasks {m['tasks_s']:.1f} s, "
          f"{m['tokens_per_s'] / 1e6:.2f} M tokens/s, rerun (nothing to do) {m['rerun_wall_s']:.1f} s")
  print(f"  ray / local: tokens/s {median['ray']['tokens_per_s'] / median['local']['tokens_per_s']:.2f}, "
        f"wall {median['ray']['wall_s'] / median['local']['wall_s']:.2f}; Ray's connect + node "
        f"check {median['ray']['rerun_wall_s'] - median['local']['rerun_wall_s']:.1f} s; "
        f"ray start {startup:.1f} s")


if __name__ == "__main__":
  main()
