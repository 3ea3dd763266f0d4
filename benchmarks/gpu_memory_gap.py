"""Where `--mode=compile`'s GPU memory estimate parts from the device's: the same train
step compiled for a compile-only H100 and for the attached GPU, in one process.

The first H100 run (docs/performance.md) found the deviceless estimate 10% low for
gpt_small and 41% low for llama:1b (23.41 against 39.94 GiB), but the two compiles ran
different jax and CUDA versions. Here both compiles run the host's jax, on the same
resolved config (`compiled.target_config`), with abstract state and batch (no array is
made): (a) `--mode=compile`'s route, compile-only devices from h100.txtpb; (b) the
attached GPU, as a run compiles it; (c) the attached GPU with autotuning off
(`xla_gpu_autotune_level=0`), since (a) cannot autotune. Each prints XLA's memory
analysis and custom-call kernels; the memory-usage report XLA dumps for each goes to
--out (gzipped) to read the buffers that differ. One `RESULT {json}` line per case.

(a) runs in its own process under JAX_PLATFORMS=cpu, as `--mode=compile` runs:

  JAX_PLATFORMS=cpu python benchmarks/gpu_memory_gap.py --route=deviceless --out=$OUT
  python benchmarks/gpu_memory_gap.py --route=device --out=$OUT      # on the GPU host
  python benchmarks/gpu_memory_gap.py --route=device --out=/tmp/gap --tiny   # CPU dry run
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=wrong-import-position
import gpu_train_step  # benchmarks/gpu_train_step.py: load_config, memory_of, kernels_of.
import shapes  # benchmarks/shapes.py: make_trainer.
from transformer.config import objective as objective_lib
from transformer.planning import compiled
from transformer.planning import gpu
from transformer.planning import topology as topology_lib

# name -> (config, rows, length, overrides); --cases picks, --extra adds
# "name=config,rows,length[,key=value...]".
CASES = {"llama_1b": ("configs/llama.py:1b", 16, 2048, []),
         "gpt_small": ("configs/gpt_small.py", 32, 1024, [])}


def _lower(trainer, config):
  batch = compiled.abstract_batch(config, objective_lib.resolve(config.model),
                                  trainer.batch_sharding)
  with trainer.context():
    return trainer.train_step.lower(trainer.abstract_state, batch)


def _compile(label: str, lowered, out: str, **options) -> dict:
  """Compiles with XLA's dump on; the memory analysis, kernels and the report, kept."""
  with tempfile.TemporaryDirectory() as dump:
    start = time.perf_counter()
    program = lowered.compile(compiler_options={"xla_dump_to": dump, **options})
    seconds = time.perf_counter() - start
    reports = sorted(glob.glob(os.path.join(dump, "*memory-usage-report.txt")),
                     key=os.path.getsize)
    if reports:
      with open(reports[-1], "rb") as f, gzip.open(
          os.path.join(out, f"{label}.memory-usage-report.txt.gz"), "wb") as g:
        shutil.copyfileobj(f, g)
  memory = gpu_train_step.memory_of(program)
  total = sum(memory.get(k, 0) for k in ("argument_size_in_bytes", "temp_size_in_bytes",
                                         "output_size_in_bytes"))
  total -= memory.get("alias_size_in_bytes", 0)
  row = dict(label=label, compile_seconds=round(seconds, 1), memory=memory,
             total_gib=round(total / 2**30, 2),
             temp_gib=round(memory.get("temp_size_in_bytes", 0) / 2**30, 2),
             kernels=gpu_train_step.kernels_of(program.as_text()), report=bool(reports))
  print("RESULT " + json.dumps(row), flush=True)
  return row


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="folder for the gzipped reports")
  parser.add_argument("--tiny", action="store_true", help="small models (a CPU dry run)")
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--extra", action="append", default=[],
                      help="name=configs/x.py[:arg],rows,length[,key=value...]")
  parser.add_argument("--no_autotune0", action="store_true",
                      help="skip (c), the device compile without autotuning")
  parser.add_argument("--route", choices=("deviceless", "device"), required=True)
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  print(shapes.platform_line(), f"jax {jax.__version__}", flush=True)
  cases = {name: CASES[name] for name in args.cases.split(",") if name}
  for extra in args.extra:
    name, _, rest = extra.partition("=")
    spec, rows, length, *overrides = rest.split(",")
    cases[name] = (spec, int(rows), int(length), overrides)
  for name, (spec, batch, seq_len, overrides) in cases.items():
    config = compiled.target_config(
        gpu_train_step.load_config(spec, batch, seq_len, overrides, args.tiny))
    print(f"== {name}: {batch} x {seq_len}, attention_impl={config.model.attention_impl}",
          flush=True)
    if args.route == "deviceless":
      topology = topology_lib.parse_topology("h100:1")
      devices = topology_lib.topology_devices(topology)
      mesh = topology_lib.topology_mesh(config.mesh, devices, topology.num_slices)
      with gpu.target_capability(mesh):  # As compiled.compile_steps: cuDNN's checks
        lowered = _lower(compiled.build_trainer(config, mesh), config)  # read the target.
      _compile(f"{name}.deviceless", lowered, args.out)
      continue
    lowered = _lower(shapes.make_trainer(config), config)
    _compile(f"{name}.device", lowered, args.out)
    if jax.default_backend() == "gpu" and not args.no_autotune0:
      _compile(f"{name}.device_autotune0", lowered, args.out, xla_gpu_autotune_level=0)

if __name__ == "__main__":
  main()
