"""The tables of benchmarks/gpu_first_run.sh, read from the files its steps wrote.

  python benchmarks/gpu_first_run_report.py --out=$OUT --estimates=benchmarks/gpu_estimates.json
  python benchmarks/gpu_first_run_report.py --env          # versions and devices (step 0)
  python benchmarks/gpu_first_run_report.py --make_estimates=benchmarks/gpu_estimates.json \
      gpt_small_auto=/tmp/est/gs_auto_128.json ...         # from --mode=compile --output files
  python benchmarks/gpu_first_run_report.py --out=$OUT --speed --refit=$OUT/gpu_calibration.json

Reads `ROW` (1_attention.log) and `RESULT` (2_train.log, 3_torch.log) json lines and
prints Markdown: the parity verdicts, each train step's speed and MFU, JAX against
PyTorch at the same shape, and the compile mode's deviceless memory estimate (made on a
CPU host with jax 0.10.2's CUDA 12 compiler, `--topology=h100:1`) against the device's
own compiled memory analysis and its measured `peak_bytes_in_use`. With --speed
(gpu_speed_run.sh): the targets, fp8 against bf16, the XLA flag A/B, decoding tokens/s
(5_decode.log's tables as RESULT lines), and with --refit=FILE the time model refitted on
the measured steps (their `kernel_rows`): each step's estimate error before (the fit in
transformer/planning/gpu_calibration.json, which never saw it) and after, as RESULT
lines, and the refitted data written to FILE for the repository.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import re
import sys

GIB = 2**30


def json_lines(path: str, prefix: str) -> list:
  """The json of every line of `path` that starts with `prefix` (none if it is absent)."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8", errors="replace") as f:
    return [json.loads(line[len(prefix):]) for line in f if line.startswith(prefix)]


def gib(n) -> str:
  return f"{n / GIB:.2f}" if n else "-"


def attention_table(rows: list) -> None:
  print("## 1. Attention against the einsum reference\n")
  if not rows:
    print("no ROW line in 1_attention.log (the step failed early: see the log)\n")
    return
  print(f"jax {rows[0]['jax']}\n")
  print("| kernel | dtype | pass | FAIL (unexpected) | expected fail | n/a | error |")
  print("|---|---|---|---|---|---|---|")
  groups = {}
  for r in rows:
    groups.setdefault((r["kernel"], r["dtype"]), []).append(r)
  for (kernel, dtype), group in groups.items():
    count = lambda f: sum(1 for r in group if f(r))
    print(f"| {kernel} | {dtype} | {count(lambda r: r['status'] == 'pass')} | "
          f"{count(lambda r: r['status'] == 'FAIL' and r.get('expected') != 'fail')} | "
          f"{count(lambda r: r.get('expected') == 'fail')} | "
          f"{count(lambda r: r['status'] == 'n/a')} | {count(lambda r: r['status'] == 'error')} |")
  print("\n| kernel | dtype | case | status | out | dq | dk | dv |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    e = r.get("errors") or {}
    cells = " | ".join(f"{e[k]:.1e}" if k in e else "-" for k in ("out", "dq", "dk", "dv"))
    status = r["status"] + (" (expected fail)" if r.get("expected") == "fail" else "")
    if r["status"] in ("n/a", "error"):
      status += f": {r.get('reason', '')[:80]}"
    print(f"| {r['kernel']} | {r['dtype']} | {r['case']} | {status} | {cells} |")
  print()


def train_table(results: list, estimates: dict) -> None:
  print("## 2. Train steps (bf16, the project's Trainer) and 4. memory against the estimate\n")
  if not results:
    print("no RESULT line in 2_train.log\n")
    return
  print(f"jax {results[0]['jax']} on {results[0]['device']}\n")
  print("| run | batch x length | ms/step (median / min) | tokens/s | model TFLOP/s | MFU | "
        "compile s | compiled: args + temp GiB | device peak GiB | deviceless estimate GiB "
        "(args + temp) | fused-attention calls |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for r in results:
    mem = r.get("memory_analysis") or {}
    est = estimates.get(r["label"]) or {}
    asked = "" if r["batch"] == r["batch_asked"] else f" (asked {r['batch_asked']}: OOM)"
    est_text = "-"
    if est and est.get("batch") == r["batch"]:
      est_text = (f"{gib(est['total_bytes'])} ({gib(est['arguments_bytes'])} + "
                  f"{gib(est['temp_bytes'])})")
    elif est:
      est_text = f"for batch {est.get('batch')}: {gib(est['total_bytes'])}"
    fused = {k: v for k, v in r["kernels"].items() if "fmha" in k or "cudnn" in k}
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
    print(f"| {r['label']} | {r['batch']} x {r['seq_len']}{asked} | "
          f"{r['step_ms_median']:.1f} / {r['step_ms_min']:.1f} | "
          f"{r['tokens_per_second']:,.0f} | {r['model_tflops_per_second']:.1f} | {mfu} | "
          f"{r['compile_seconds']:.1f} | {gib(mem.get('argument_size_in_bytes'))} + "
          f"{gib(mem.get('temp_size_in_bytes'))} | {gib(r.get('peak_bytes_in_use'))} | "
          f"{est_text} | {fused or 'none'} |")
  print()


def torch_table(torch_results: list, results: list) -> None:
  print("## 3. PyTorch GPT-2 small at the same shape\n")
  if not torch_results:
    print("no RESULT line in 3_torch.log\n")
    return
  t = torch_results[-1]
  peak = next((r["peak_bf16_flops"] for r in results if r.get("peak_bf16_flops")), None)
  rows = [("eager", t.get("eager")), ("torch.compile", t.get("compiled"))]
  print(f"torch {t['torch']} on {t['device']}, batch {t['batch']} x {t['seq_len']}\n")
  print("| PyTorch | ms/step (median / min) | tokens/s | MFU |")
  print("|---|---|---|---|")
  for name, timing in rows:
    if not timing:
      print(f"| {name} | not timed | - | - |")
      continue
    seconds = timing["step_ms_median"] / 1e3
    mfu = f"{100 * t['model_flops_per_step'] / seconds / peak:.1f}%" if peak else "-"
    print(f"| {name} | {timing['step_ms_median']:.1f} / {timing['step_ms_min']:.1f} | "
          f"{t['batch'] * t['seq_len'] / seconds:,.0f} | {mfu} |")
  print("\n| JAX run | its tokens/s | / PyTorch's best tokens/s |")
  print("|---|---|---|")
  for r in results:
    if r["label"].startswith("gpt_small"):
      print(f"| {r['label']} (batch {r['batch']}) | {r['tokens_per_second']:,.0f} | "
            f"{r['tokens_per_second'] / t['tokens_per_second']:.2f}x |")
  print()


def profile_tables(profiles: list) -> None:
  """Where the time goes, measured (jax.profiler, device time per part) beside the
  compile mode's estimate of the same compiled program (PROFILE lines)."""
  print("## Where the time goes: measured against the compile mode's parts\n")
  if not profiles:
    print("no PROFILE line in 2_train.log\n")
    return
  for p in profiles:
    measured, estimated = p.get("measured_ms", {}), p.get("estimated_ms", {})
    print(f"{p.get('label') or '?'}: {p.get('ops_per_step', 0):.0f} ops a step\n")
    print("| part | measured ms/step | estimated ms/step | estimated / measured |")
    print("|---|---|---|---|")
    for name in sorted(set(measured) | set(estimated), key=lambda n: -measured.get(n, 0.0)):
      m, e = measured.get(name, 0.0), estimated.get(name, 0.0)
      ratio = f"{e / m:.2f}" if m and e else "-"
      print(f"| {name} | {m:.2f} | {e:.2f} | {ratio} |")
    total_m, total_e = sum(measured.values()), sum(estimated.values())
    print(f"| total | {total_m:.2f} | {total_e:.2f} | "
          f"{total_e / total_m if total_m and total_e else 0:.2f} |")
    if p.get("unmatched_top"):
      print(f"\nops with no part (not in the compiled program's kernels): {p['unmatched_top']}")
    print()


def targets(results: list, torch_results: list, estimates: dict) -> None:
  """Issue 47's targets, each with its measured figure and a verdict."""
  print("## Targets\n")
  by_label = {r["label"]: r for r in results}
  lines = []
  gs, t = by_label.get("gpt_small_auto_32"), (torch_results[-1] if torch_results else None)
  compiled = (t or {}).get("compiled") or {}
  if gs and compiled:
    torch_tps = t["batch"] * t["seq_len"] / (compiled["step_ms_median"] / 1e3)
    ratio = gs["tokens_per_second"] / torch_tps
    lines.append(f"gpt_small 32 x 1024 against torch.compile: {gs['tokens_per_second']:,.0f} "
                 f"vs {torch_tps:,.0f} tokens/s = {ratio:.2f}x (target >= 1.2x: "
                 f"{'met' if ratio >= 1.2 else 'NOT met'}); MFU "
                 f"{100 * (gs.get('mfu') or 0):.1f}%")
  else:
    lines.append("gpt_small against torch.compile: not measured (a RESULT line is missing)")
  llama = by_label.get("llama_1b")
  if llama and llama.get("mfu"):
    lines.append(f"llama:1b 16 x 2048: MFU {100 * llama['mfu']:.1f}% (target >= 45%: "
                 f"{'met' if llama['mfu'] >= 0.45 else 'NOT met'})")
  else:
    lines.append("llama:1b: not measured")
  other = by_label.get("llama_1b_xla_kernels")
  if llama and llama.get("step_ms_median") and other and other.get("step_ms_median"):
    lines.append(f"llama:1b with XLA's MLP and loss head instead of the Pallas kernels: "
                 f"{other['step_ms_median']:.1f} vs {llama['step_ms_median']:.1f} ms/step "
                 f"({llama['step_ms_median'] / other['step_ms_median']:.2f}x the "
                 "default's speed)")
  for label, name in (("gpt_small_cublas_32", "XLA_FLAGS=--xla_gpu_enable_triton_gemm=false"),
                      ("gpt_small_maxtext_flags_32", "MaxText's XLA flag set"),
                      ("gpt_small_fp8_32", "fp8 (model.quantization=fp8)"),
                      ("gpt_small_xla_kernels_32", "XLA's MLP and loss head (model.mlp_impl="
                       "xla, model.loss_head_impl=xla) instead of the Pallas kernels")):
    other = by_label.get(label)
    if gs and other:
      lines.append(f"{name}: {other['step_ms_median']:.1f} vs {gs['step_ms_median']:.1f} "
                   f"ms/step bf16 default ({gs['step_ms_median'] / other['step_ms_median']:.2f}x "
                   "the default's speed)")
  for label, est in estimates.items():
    r = by_label.get(label)
    if label.startswith("_") or not r or not est.get("estimated_seconds"):
      continue
    if (est.get("batch"), est.get("seq_len")) != (r["batch"], r["seq_len"]):
      lines.append(f"compile mode's estimate for {label}: made for {est.get('batch')} x "
                   f"{est.get('seq_len')}, measured at {r['batch']} x {r['seq_len']}: "
                   "not compared")
      continue
    ratio = est["estimated_seconds"] * 1e3 / r["step_ms_median"]
    span = est.get("estimated_seconds_range")
    inside = (f"; its range {span[0] * 1e3:.1f}-{span[1] * 1e3:.1f} ms "
              f"{'holds' if span[0] * 1e3 <= r['step_ms_median'] <= span[1] * 1e3 else 'MISSES'}"
              " the measurement" if span else "")
    lines.append(f"compile mode's estimate for {label}: {est['estimated_seconds'] * 1e3:.1f} "
                 f"ms vs {r['step_ms_median']:.1f} ms measured = {ratio:.2f}x (target within "
                 f"1.25x: {'met' if 0.8 <= ratio <= 1.25 else 'NOT met'}){inside}")
  for line in lines:
    print(f"- {line}")
  print()


def decode_results(path: str) -> list[dict]:
  """decoding_speed.py's greedy tables in 5_decode.log, as RESULT dicts (batch, tokens/s)."""
  if not os.path.exists(path):
    return []
  results, batch = [], None
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      head = re.match(r"Greedy, (\d+) new tokens .* batch (\d+):", line)
      if head:
        batch = int(head.group(2))
      cached = re.match(r"\s+key/value cache\s+([\d.]+)\s+([\d.]+)", line)
      if cached and batch is not None:
        results.append(dict(label=f"decode_batch_{batch}", batch=batch,
                            seconds=float(cached.group(1)),
                            tokens_per_second=float(cached.group(2))))
        batch = None
  return results


def refit(results: list, path: str) -> None:
  """The time model refitted with the measured steps: each one's error before and after."""
  print("## The time model refitted on the measured steps\n")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  # pylint: disable-next=g-import-not-at-top
  from transformer import hardware
  from transformer.planning import calibration  # pylint: disable=g-import-not-at-top
  steps = calibration.load()
  before = calibration.fit(steps)
  new = {}
  for r in results:
    if r.get("kernel_rows") and r.get("chip") in hardware.CHIPS and r.get("step_ms_median"):
      new[f"{r['label']}_{r['chip']}"] = dict(
          case=r.get("case") or r["label"], chip=r["chip"], measured_ms=r["step_ms_median"],
          note=f"{r.get('device')}, jax {r.get('jax')} ({datetime.date.today()}, "
               "benchmarks/gpu_speed_run.sh): the device's own compiled program",
          kernels=r["kernel_rows"])
  if not new:
    print("no step measured on a GPU of hardware.CHIPS carries its kernels (kernel_rows; a "
          "CPU dry run's steps have no such chip): nothing to refit\n")
    return
  merged = {**steps, **new}
  after = calibration.fit(merged)
  loo = calibration.leave_one_out(merged)
  cases = len({step.get("case", name) for name, step in merged.items()})
  print(f"before: {before.best.calibrated}\nafter: {after.best.calibrated} ({cases} cases)\n")
  print("| step | measured ms | before: estimate ms (range) | before / measured | "
        "after / measured | leave-one-out |")
  print("|---|---|---|---|---|---|")
  for name, step in new.items():
    chip = hardware.CHIPS[step["chip"]]
    found = calibration.launches_of(step["kernels"])
    point = calibration.step_seconds(found, chip, before.best) * 1e3
    low, high = (x * 1e3 for x in calibration.interval(found, chip, before))
    measured = step["measured_ms"]
    print(f"| {name} | {measured:.1f} | {point:.1f} ({low:.1f}-{high:.1f}) | "
          f"{point / measured:.2f}x | {after.best_ratios[name]:.2f}x | {loo[name]:.2f}x |")
    print("RESULT " + json.dumps(dict(
        label="refit", step=name, measured_ms=measured, before_ms=point,
        before_range_ms=[low, high], before_ratio=point / measured,
        after_ratio=after.best_ratios[name], leave_one_out_ratio=loo[name])))
  with open(path, "w", encoding="utf-8") as f:
    json.dump(merged, f, indent=None, separators=(",", ":"))
    f.write("\n")
  print(f"\nthe refitted data: {path} (copy it to transformer/planning/gpu_calibration.json "
        "to make it the estimate's)\n")


def env() -> None:
  print("python", sys.version.split()[0])
  for name in ("jax", "jaxlib", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12", "flax",
               "optax", "orbax.checkpoint", "grain", "ml_collections", "numpy", "torch"):
    try:
      module = importlib.import_module(name)
      print(f"{name} {getattr(module, '__version__', '')} {getattr(module, '__file__', '')}")
    except Exception as e:  # pylint: disable=broad-except  (report, never stop)
      print(f"{name}: not importable ({type(e).__name__}: {str(e)[:200]})")
  import jax  # pylint: disable=g-import-not-at-top
  print("devices", jax.devices(), "backend", jax.default_backend())
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  # pylint: disable-next=g-import-not-at-top
  from transformer.model import attention_ops, cudnn_guard
  print("cudnn_available", attention_ops.cudnn_available(), "| packed layout supported",
        attention_ops.packed_layout_supported(), "| cuDNN k/v offset bug in this jax",
        cudnn_guard.kv_offsets_scaled_by_query_heads())


def make_estimates(path: str, pairs: list[str]) -> None:
  """Writes {label: the train step of a --mode=compile --output json} to `path`."""
  estimates = {}
  for pair in pairs:
    label, _, source = pair.partition("=")
    with open(source, encoding="utf-8") as f:
      report = json.load(f)
    train = report["steps"]["train"]
    estimates[label] = dict(
        batch=report["config"]["batch_size"], seq_len=report["config"]["seq_len"],
        topology=report["topology"], memory_fraction=report["memory_fraction"],
        **{k: train.get(k) for k in ("arguments_bytes", "temp_bytes", "total_bytes",
                                     "estimated_seconds", "estimated_seconds_range",
                                     "lower_bound_seconds", "estimate_bound",
                                     "estimated_mfu", "kernels", "compile_seconds")})
  estimates["_made"] = (f"{datetime.date.today()}: --mode=compile --notry_levers "
                        "--compile_steps=train --topology=h100:1 on a CPU host (jax 0.10.2, "
                        "jax-cuda12-plugin 0.10.2, nvidia-cudnn-cu12 9.28)")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(estimates, f, indent=1)
    f.write("\n")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=".")
  parser.add_argument("--estimates", default="")
  parser.add_argument("--env", action="store_true")
  parser.add_argument("--make_estimates", default="")
  parser.add_argument("--speed", action="store_true",
                      help="gpu_speed_run.sh's report: the profiles and issue 47's targets")
  parser.add_argument("--refit", default="", help="--speed: refit the time model on the "
                      "measured steps and write the data here")
  parser.add_argument("pairs", nargs="*", help="LABEL=compile-mode json (--make_estimates)")
  args = parser.parse_args()
  if args.env:
    env()
    return
  if args.make_estimates:
    make_estimates(args.make_estimates, args.pairs)
    return
  estimates = {}
  if args.estimates and os.path.exists(args.estimates):
    with open(args.estimates, encoding="utf-8") as f:
      estimates = json.load(f)
  results = json_lines(os.path.join(args.out, "2_train.log"), "RESULT ")
  torch_results = json_lines(os.path.join(args.out, "3_torch.log"), "RESULT ")
  skipped = [r for r in results + torch_results if r.get("skipped")]
  results = [r for r in results if not r.get("skipped")]
  torch_results = [r for r in torch_results if not r.get("skipped")]
  if args.speed:
    device = json_lines(os.path.join(args.out, "0_env.log"), "RESULT ")
    if device:
      print(f"Device: {device[-1].get('nvidia_smi_name')} ({device[-1].get('chip')})\n")
    targets(results, torch_results, estimates)
    for r in skipped:
      print(f"- {r['label']}: skipped: {r['skipped']}")
    for r in decode_results(os.path.join(args.out, "5_decode.log")):
      print("RESULT " + json.dumps(r))
    print()
    profile_tables(json_lines(os.path.join(args.out, "2_train.log"), "PROFILE "))
    if args.refit:
      refit(results, args.refit)
  else:
    attention_table(json_lines(os.path.join(args.out, "1_attention.log"), "ROW "))
  train_table(results, estimates)
  torch_table(torch_results, results)
  if "_made" in estimates:
    print(f"Deviceless estimates: {estimates['_made']}.")


if __name__ == "__main__":
  main()
