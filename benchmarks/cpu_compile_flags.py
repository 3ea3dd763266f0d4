"""How long the tests' tiny training takes to compile under sets of XLA CPU flags.

Each arm is a fresh process (XLA reads XLA_FLAGS once) that trains tests/tiny.py's config
for 3 steps (an evaluation and a checkpoint at step 3), with JAX's compilation cache off,
and prints its process CPU seconds and JAX's own trace / lowering / backend-compile
durations. Arms are interleaved, `--repeats` rounds, so that a machine that slows down
part-way slows every arm alike; the table gives each arm's median and its ratio to the
first arm. tests/conftest.py's flags come from this:

  python benchmarks/cpu_compile_flags.py --repeats=3

`--collector` times the tests' flags under three settings of Python's garbage collector
instead (transformer/gc_tuning.py's numbers: `--collector --repeats=5`).
(`--devices=8`, the default, is the tests' simulated mesh; `--devices=1` a launch.py run
the tests start, tiny.subprocess_env.) Needs no data: the tiny config reads the
python_stdlib catalog dataset built from this machine's own Python sources.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_REPEATS = flags.DEFINE_integer("repeats", 3, "Interleaved rounds of every arm.")
_DEVICES = flags.DEFINE_integer("devices", 8, "Simulated CPU devices of each arm.")
_COLLECTOR = flags.DEFINE_bool(
    "collector", False, "Instead of XLA flag sets: the tests' XLA flags under three settings "
    "of Python's garbage collector (COLLECTOR_ARMS: CPython's defaults, "
    "transformer/gc_tuning.tune(), switched off).")

# name -> flags on top of --xla_force_host_platform_device_count.
ARMS = {
    "XLA's defaults": "",
    "-O0": "--xla_backend_optimization_level=0",
    "-O0, no fusion emitters": ("--xla_backend_optimization_level=0 "
                                "--xla_cpu_use_fusion_emitters=false"),
    "-O0, no fusion emitters, no expensive LLVM passes": (
        "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
        "--xla_llvm_disable_expensive_passes=true"),
    "-O0, no fusion emitters, one LLVM module (the tests')": (
        "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
        "--xla_cpu_parallel_codegen_split_count=1"),
}

# The tests' XLA flags (tests/conftest.py), the collector arms' common ground.
TESTS_FLAGS = ARMS["-O0, no fusion emitters, one LLVM module (the tests')"]
# name -> the child's COLLECTOR setting, applied once its modules are imported.
COLLECTOR_ARMS = {"CPython's defaults": "", "gc_tuning.tune()": "tune", "switched off": "off"}

_CHILD = r"""
import gc, json, os, resource, sys, tempfile, time
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tests")]
from jax import monitoring
seconds = {}
def _duration(event, value, **kwargs):
  del kwargs
  key = event.rsplit("/", 1)[-1]
  seconds[key] = seconds.get(key, 0.0) + value
monitoring.register_event_duration_secs_listener(_duration)
from tiny import make_tiny_config
from transformer.training import loop
if os.environ.get("COLLECTOR") == "tune":
  from transformer import gc_tuning
  gc_tuning.tune()
elif os.environ.get("COLLECTOR") == "off":
  gc.disable()
config = make_tiny_config(sys.argv[2])
config.train.update(num_steps=3, eval_every=3)
config.checkpoint.update(every=3)
start = time.perf_counter()
loop.train_and_evaluate(config, tempfile.mkdtemp())
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
print("RESULT " + json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "wall": wall,
      "trace": seconds.get("jaxpr_trace_duration", 0.0),
      "lower": seconds.get("jaxpr_to_mlir_module_duration", 0.0),
      "compile": seconds.get("backend_compile_duration", 0.0)}))
"""


def run_arm(extra: str, data_dir: str, devices: int, collector: str = "") -> dict[str, float]:
  """One fresh process of the tiny training under `extra` (and the `collector` setting of
  COLLECTOR_ARMS); its RESULT line, parsed."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {extra}".strip(),
             COLLECTOR=collector)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  result = subprocess.run([sys.executable, "-c", _CHILD, ROOT, data_dir], env=env,
                          capture_output=True, text=True, check=False)
  lines = [l for l in result.stdout.splitlines() if l.startswith("RESULT ")]
  if result.returncode or not lines:
    raise RuntimeError(f"the arm with XLA_FLAGS={env['XLA_FLAGS']!r} failed "
                       f"(exit {result.returncode}): {result.stderr[-2000:]}")
  return json.loads(lines[-1].removeprefix("RESULT "))


def main(argv: list[str]) -> None:
  del argv
  data_dir = tempfile.mkdtemp(prefix="cpu_compile_flags_tfds_")
  # name -> (XLA flags, collector setting)
  arms = ({name: (TESTS_FLAGS, setting) for name, setting in COLLECTOR_ARMS.items()}
          if _COLLECTOR.value else {name: (extra, "") for name, extra in ARMS.items()})
  runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
  # A first run builds the catalog dataset, outside the timings.
  run_arm(ARMS["XLA's defaults"], data_dir, _DEVICES.value)
  for round_ in range(_REPEATS.value):
    for name, (extra, collector) in arms.items():
      runs[name].append(run_arm(extra, data_dir, _DEVICES.value, collector))
      print(f"round {round_ + 1}/{_REPEATS.value}, {name}: "
            f"{runs[name][-1]['cpu']:.1f} CPU s", file=sys.stderr, flush=True)
  first = statistics.median(r["cpu"] for r in runs[next(iter(arms))])
  print(f"\nThe tiny training (3 steps, {_DEVICES.value} CPU device(s)), medians of "
        f"{_REPEATS.value}:\n")
  what = "garbage collector (the tests' XLA flags)" if _COLLECTOR.value else "XLA flags"
  print(f"| {what} | process CPU s | ratio | training wall s | backend compile s | trace s "
        "| lowering s |")
  print("|---|---|---|---|---|---|---|")
  for name, rows in runs.items():
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"| {name} | {median['cpu']:.1f} | {median['cpu'] / first:.2f}x | "
          f"{median['wall']:.2f} | {median['compile']:.1f} | {median['trace']:.1f} | "
          f"{median['lower']:.1f} |")


if __name__ == "__main__":
  app.run(main)
