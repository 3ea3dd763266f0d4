"""One config's train step on the attached accelerator: speed, MFU, memory and kernels.

The project's own `Trainer` (jitted, donated train step: AdamW, clipping, dropout as the
config has it) on one random batch (benchmarks/shapes.py), compiled ahead of time so the
compile is timed apart. Printed as it goes, then one `RESULT {json}` line:

- step time: the median (and min) of --rounds rounds of --steps steps each, dispatched
  as the training loop does, after --warmup steps; tokens/s; MFU = model FLOPs
  (flops.py's PaLM count) per second over the device's published dense bf16 peak
  (989 TFLOP/s for an H100 SXM); rematerialised work does not count;
- memory: the compiled step's own analysis (arguments, temporaries, outputs: what the
  compile mode's deviceless verdict estimates) and the device's `peak_bytes_in_use`
  after the steps (`memory_stats()`);
- kernels: the custom calls in the compiled program (`__cudnn$fmha...` for cuDNN's flash
  attention), by target and count;
- with --profile=N: N more steps under jax.profiler, each XLA op's device time summed and
  put in the parts of the compile mode's table (planning/kernels.py: matmul, attention,
  loss, elementwise, optimizer, collectives) beside that mode's estimate of each part for
  the same compiled program, as a `PROFILE {json}` line and a table: where the time goes,
  measured.

`--batch` is tried first; a RESOURCE_EXHAUSTED (out of memory) at compile or run time
retries once at half the batch, and the RESULT says so. Each RESULT also carries the
compiled program's kernels as planning/calibration.py's rows (`kernel_rows`), its
`case` (config and shape: calibration.py counts steps of one case as one) and its chip,
so that gpu_first_run_report.py can refit the time model on what was measured.

`--variant=LABEL:KEY=VALUE[,KEY=VALUE]` measures the same step again with those overrides
in the same process (no second start-up), as its own RESULT; a KEY this tree's config
lacks (`model.quantization` before the fp8 change) gives a RESULT with `skipped` and the
reason instead.

  python benchmarks/gpu_train_step.py --config=configs/gpt_small.py --batch=128 \
      --seq_len=1024 --set model.attention_impl=auto
  python benchmarks/gpu_train_step.py --config=configs/llama.py:1b --batch=16 --seq_len=2048
  python benchmarks/gpu_train_step.py --config=configs/gpt_small.py --batch=4 --tiny   # CPU
  python benchmarks/gpu_train_step.py --config=configs/gpt_small.py --batch=32 --profile=3 \
      --label=gpt_small_auto_32 --variant=gpt_small_fp8_32:model.quantization=fp8
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_step  # benchmarks/profile_step.py; pylint: disable=g-bad-import-order,wrong-import-position
import shapes  # benchmarks/shapes.py; pylint: disable=g-bad-import-order,wrong-import-position
from transformer import hardware  # pylint: disable=wrong-import-position
from transformer.planning import calibration  # pylint: disable=wrong-import-position
from transformer.planning import hlo  # pylint: disable=wrong-import-position
from transformer.planning import kernels as kernels_lib  # pylint: disable=wrong-import-position
from transformer.training import flops  # pylint: disable=wrong-import-position


def load_config(spec: str, batch: int, seq_len: int, overrides: list[str], tiny: bool):
  """configs/<name>.py[:arg] with the batch, length, one micro-batch and the overrides."""
  path, _, arg = spec.partition(":")
  module = importlib.import_module("configs." + os.path.splitext(os.path.basename(path))[0])
  config = module.get_config(arg) if arg else module.get_config()
  config.data.update(seq_len=seq_len, batch_size=batch)
  config.train.microbatches = 1
  config.model.max_len = max(config.model.max_len, seq_len)
  if tiny:  # The CPU dry run: the same code path at a shape 2 cores compile in seconds.
    config.model.update(num_layers=2, d_model=128, num_heads=4, mlp_dim=256, vocab_size=512)
    if config.model.num_kv_heads:
      config.model.num_kv_heads = 2
    if config.model.head_dim:
      config.model.head_dim = 32
  shapes.apply_overrides(config, overrides)
  return config


def kernels_of(hlo_text: str) -> dict[str, int]:
  """Custom-call targets in a compiled program's text, with their counts."""
  return dict(collections.Counter(re.findall(r'custom_call_target="([^"]+)"', hlo_text)))


def memory_of(compiled) -> dict[str, int]:
  analysis = compiled.memory_analysis()
  if analysis is None:
    return {}
  names = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
           "temp_size_in_bytes", "generated_code_size_in_bytes")
  return {name: int(getattr(analysis, name, 0) or 0) for name in names}


def profile(compiled, state, batch, steps: int) -> tuple[dict, object]:
  """Device time per part of the step (kernels.PARTS) over `steps` traced steps, beside
  the compile mode's estimate of each part for this program; (PROFILE fields, state)."""
  text = compiled.as_text()
  launches, _, _ = hlo.launches(text)
  part = {l.instruction.name: kernels_lib.part_of(l, train=True) for l in launches
          if l.is_kernel}
  # Loops, calls and conditionals: their events span their bodies' ops (on a CPU host).
  containers = {l.instruction.name for l in launches if not l.is_kernel}
  trace_dir = tempfile.mkdtemp(prefix="gpu_profile_")
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    _, state = shapes.run_steps(compiled, state, batch, steps)
  ops = profile_step.read_trace(trace_dir, "train_step")
  measured = collections.Counter()
  unmatched = collections.Counter()
  for op, us in ops:
    if op in containers or op.split(".")[0] in ("while", "call", "conditional"):
      continue
    name = part.get(op)
    if name is None:
      unmatched[op] += us / steps / 1e3
      name = "unmatched"
    measured[name] += us / steps / 1e3
  chip = hardware.chip_of(jax.devices()[0].device_kind)
  estimated = ({p.name: p.seconds * 1e3 for p in kernels_lib.breakdown(
      launches, chip, True, calibration.rates_for(chip)).parts}
               if chip is not None and chip.has_memory_figures else {})
  result = dict(measured_ms=dict(measured), estimated_ms=estimated, ops=len(ops),
                ops_per_step=len(ops) / steps, trace_dir=trace_dir,
                unmatched_top=dict(unmatched.most_common(8)))
  print("| part | measured ms/step | estimated ms/step |\n|---|---|---|", flush=True)
  for name in kernels_lib.PARTS + ("unmatched",):
    if measured.get(name) or estimated.get(name):
      print(f"| {name} | {measured.get(name, 0.0):.2f} | {estimated.get(name, 0.0):.2f} |")
  print(f"| total (device busy) | {sum(measured.values()):.2f} | "
        f"{sum(estimated.values()):.2f} |", flush=True)
  return result, state


def measure(config, args) -> dict:
  """Compiles and times the step at config.data.batch_size; the RESULT fields."""
  trainer = shapes.make_trainer(config)
  batch_size, seq_len = config.data.batch_size, config.data.seq_len
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    batch = trainer.train_batch(shapes.random_batch(config))
    start = time.perf_counter()
    compiled = trainer.train_step.lower(state, batch).compile()
    compile_seconds = time.perf_counter() - start
    print(f"compiled in {compile_seconds:.1f} s; memory analysis {memory_of(compiled)}",
          flush=True)
    text = compiled.as_text()
    kernels = kernels_of(text)
    kernel_rows = calibration.rows_of(hlo.launches(text)[0])
    print(f"custom calls: {kernels}", flush=True)
    _, state = shapes.run_steps(compiled, state, batch, args.warmup)
    times = []
    for _ in range(args.rounds):
      seconds, state = shapes.run_steps(compiled, state, batch, args.steps)
      times.append(seconds)
      print(f"  round: {1e3 * seconds:.2f} ms/step", flush=True)
    profiled = None
    if args.profile:
      profiled, state = profile(compiled, state, batch, args.profile)
      print("PROFILE " + json.dumps(dict(label=args.label, **profiled)), flush=True)
  device = jax.devices()[0]
  stats = device.memory_stats() or {}
  median = statistics.median(times)
  model_flops = flops.train_flops_per_step(trainer.model_config, batch_size, seq_len)
  peak = flops.published_peak_flops(device.device_kind)
  tokens = batch_size * seq_len
  return dict(
      batch=batch_size, seq_len=seq_len, tokens_per_step=tokens,
      params=int(sum(np.prod(x.shape) for x in jax.tree.leaves(state.params))),
      compile_seconds=compile_seconds, step_ms_median=1e3 * median,
      step_ms_min=1e3 * min(times), rounds=len(times), steps_per_round=args.steps,
      tokens_per_second=tokens / median, model_flops_per_step=model_flops,
      model_tflops_per_second=model_flops / median / 1e12,
      peak_bf16_flops=peak, mfu=model_flops / median / peak if peak else None,
      memory_analysis=memory_of(compiled),
      peak_bytes_in_use=stats.get("peak_bytes_in_use"),
      bytes_limit=stats.get("bytes_limit"), kernels=kernels, kernel_rows=kernel_rows,
      attention_impl=config.model.attention_impl, dtype=np.dtype(trainer.model_config.dtype).name)


def is_oom(error: Exception) -> bool:
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def measure_with_retry(spec: str, args, overrides: list[str], label: str) -> dict:
  """measure() at --batch, once more at half of it after an out-of-memory; the RESULT."""
  batch, result = args.batch, None
  for attempt in range(2):
    config = load_config(spec, batch, args.seq_len, overrides, args.tiny)
    print(f"{label or spec}: batch {batch} x {args.seq_len}, "
          f"{' '.join(overrides) or 'no overrides'}", flush=True)
    try:
      result = measure(config, args)
      break
    except Exception as e:  # pylint: disable=broad-except  (an OOM halves the batch once)
      if attempt or not is_oom(e):
        raise
      print(f"out of memory at batch {batch}: {str(e).splitlines()[0][:300]}; "
            f"trying {batch // 2}", flush=True)
    gc.collect()  # The failed attempt's arrays, freed once its traceback is gone.
    jax.clear_caches()
    batch //= 2
  device = jax.devices()[0].device_kind
  chip = hardware.chip_of(device)
  name = os.path.splitext(os.path.basename(spec.partition(":")[0]))[0]
  result.update(label=label, config=spec, overrides=overrides, batch_asked=args.batch,
                jax=jax.__version__, device=device, chip=chip.name if chip else None,
                case=args.case or f"{name}{spec.partition(':')[2]}_{batch}x{args.seq_len}")
  return result


def missing_key(spec: str, overrides: list[str]) -> str | None:
  """The first override whose key this tree's config (`spec`) lacks, or None."""
  config = load_config(spec, 1, 8, [], True)
  for override in overrides:
    node = config
    try:
      for part in override.partition("=")[0].split("."):
        node = node[part]
    except (KeyError, AttributeError, TypeError):
      return override.partition("=")[0]
  return None


def print_result(result: dict) -> None:
  print("RESULT " + json.dumps(result), flush=True)
  if result.get("skipped"):
    print(f"{result['label']}: skipped: {result['skipped']}", flush=True)
    return
  mfu = f", MFU {100 * result['mfu']:.1f}%" if result["mfu"] else ""
  print(f"{result['label']}: {result['step_ms_median']:.1f} ms/step, "
        f"{result['tokens_per_second']:,.0f} tokens/s{mfu}, peak "
        f"{(result['peak_bytes_in_use'] or 0) / 2**30:.2f} GiB", flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True, help="configs/<name>.py[:arg]")
  parser.add_argument("--batch", type=int, required=True)
  parser.add_argument("--seq_len", type=int, default=1024)
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5, help="steps per timed round")
  parser.add_argument("--label", default="", help="names the RESULT line")
  parser.add_argument("--case", default="", help="the calibration case (default: the "
                      "config and shape)")
  parser.add_argument("--tiny", action="store_true", help="a small model (CPU dry run)")
  parser.add_argument("--profile", type=int, default=0,
                      help="steps traced after the timing, reduced to the parts of the step")
  parser.add_argument("--variant", action="append", default=[],
                      metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                      help="the step again with these overrides, in this process")
  args = parser.parse_args()
  print(shapes.platform_line(), flush=True)
  print_result(measure_with_retry(args.config, args, args.set, args.label))
  args.profile = 0  # Variants are timed, not profiled.
  for variant in args.variant:
    label, _, sets = variant.partition(":")
    overrides = args.set + [item for item in sets.split(",") if item]
    missing = missing_key(args.config, overrides)
    if missing:
      print_result(dict(label=label, overrides=overrides, skipped=(
          f"config key {missing} does not exist in this tree (configs/base.py)")))
      continue
    print_result(measure_with_retry(args.config, args, overrides, label))


if __name__ == "__main__":
  main()
