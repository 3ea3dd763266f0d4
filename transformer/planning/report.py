"""The compile mode's report: lines for the console and a JSON-able dict for --output."""

from __future__ import annotations

from typing import Any

from transformer.planning import budget
from transformer.planning import collectives
from transformer.planning import estimate as estimate_lib
from transformer.planning import kernels
from transformer.planning.plan import Plan
from transformer.planning.search import Trial

GIB = 2 ** 30


def gib(nbytes: float) -> str:
  """Bytes as GiB with two decimals (MiB below 1 GiB, so that small steps read)."""
  if abs(nbytes) < GIB:
    return f"{nbytes / 2 ** 20:.2f} MiB"
  return f"{nbytes / GIB:.2f} GiB"


def verdict(total_bytes: int, chip_bytes: int) -> str:
  """'fits with N GiB to spare' or 'does not fit by N GiB'."""
  spare = chip_bytes - total_bytes
  if spare >= 0:
    return f"fits with {spare / GIB:.2f} GiB to spare"
  return f"does not fit by {-spare / GIB:.2f} GiB"


def plan_lines(plan: Plan) -> list[str]:
  """The console report of one plan."""
  chip, topo = plan.chip, plan.topology
  slices = f" x {topo.num_slices} slices" if topo.num_slices > 1 else ""
  usable = (f"{gib(plan.usable_bytes)} usable = {plan.memory_fraction:.2f} "
            "(XLA_PYTHON_CLIENT_MEM_FRACTION) of the device's "
            f"{gib(plan.usable_bytes / plan.memory_fraction)}; "
            if plan.memory_fraction else "")
  lines = [
      f"Topology {topo.name}{slices}: {topo.chips} chips of {plan.chip_kind} ({chip.name}: "
      f"{usable or gib(chip.hbm_bytes) + ' HBM, '}{chip.bf16_flops / 1e12:.0f} TFLOP/s bf16, "
      f"{chip.hbm_bytes_per_second / 1e9:.0f} GB/s HBM, "
      f"{chip.ici_bytes_per_second / 1e9:.0f} GB/s one-way interconnect; hardware.py)",
      f"Mesh {plan.mesh}; model.dtype {plan.config.model.dtype}, param_dtype "
      f"{plan.config.model.param_dtype}, remat {plan.config.model.remat}, scan_layers "
      f"{plan.config.model.scan_layers}, batch {plan.config.data.batch_size} x "
      f"{plan.config.data.seq_len}, train.microbatches {plan.config.train.microbatches}",
      *xla_attention_note(plan),
      "",
      "Per chip, train step arguments: " + ", ".join(
          f"{part} {gib(nbytes)}" for part, nbytes in plan.breakdown.items()),
  ]
  header = (f"{'step':<7} {'arguments':>11} {'temporaries':>12} {'outputs':>11} "
            f"{'total':>11} {'of':>4} {'chip':>10}  verdict")
  lines += ["", header]
  for name, cost in plan.costs.items():
    lines.append(f"{name:<7} {gib(cost.arguments_bytes):>11} {gib(cost.temp_bytes):>12} "
                 f"{gib(cost.output_bytes - cost.alias_bytes):>11} "
                 f"{gib(cost.total_bytes):>11} {'':>4} {gib(plan.usable_bytes):>10}  "
                 f"{verdict(cost.total_bytes, plan.usable_bytes)}")
    if cost.compile_error:
      lines.append(f"        XLA refused to compile it: {cost.compile_error}")
    if cost.workspace_bytes:
      lines.append(f"        the total includes ~{gib(cost.workspace_bytes)} of cuDNN attention "
                   "workspace, an ESTIMATE: XLA sizes it only on a GPU (0 here); measured "
                   "on an H100 it was up to 8 x head_dim bytes per token, query head and "
                   "segment slot (model.attention_max_segments; docs/compile-report.md)")
  lines += ["", "(outputs: those not written into donated arguments; temporaries include "
            "the activations kept for the backward pass)", ""]
  calibrated = any(est is not None and est.calibrated for est in plan.estimates.values())
  lines.append("Step time (an ESTIMATE, not a measurement: "
               + ("each kernel at efficiencies fitted on measured steps, summed; its range "
                  "spans every fit within the calibration's tolerance; the floor is each "
                  "kernel at datasheet peaks" if calibrated
                  else "the bound at published peaks, which is also the floor") + "):")
  for name, cost in plan.costs.items():
    lines += _estimate_lines(name, cost, plan.estimates[name])
  lines += _parts_lines(plan)
  kernels = {name: cost.kernels for name, cost in plan.costs.items() if cost.kernels}
  if kernels:
    lines += ["", "Kernels that matter, launches per step (loops multiplied out):"]
    lines += [f"  {name}: " + ", ".join(f"{kind} x{n}" for kind, n in sorted(counts.items()))
              for name, counts in kernels.items()]
    if plan.memory_fraction is not None:
      lines.append("  (no fused-attention kernel listed: attention runs as XLA fusions; "
                   "model.attention_impl=cudnn asks for cuDNN's)"
                   if not any(k.startswith("attention") for c in kernels.values() for k in c)
                   else "  (attention kernels listed: the fused one was chosen)")
  lines.append("  Assumptions: " + estimate_lib.ASSUMPTIONS)
  lines += ["", _audit_line(plan)]
  lines += [f"  {leaf.path} {leaf.shape}: {gib(leaf.nbytes)}" for leaf in plan.replicated]
  return lines


# What cuDNN's fused attention changed on a device (docs/performance.md, the first H100
# run: gpt_small 32 x 1024, XLA's attention against cuDNN's).
_CUDNN_MEASURED = "156.0 ms with XLA's attention against 102.5 ms with cuDNN's"


def xla_attention_note(plan: Plan) -> list[str]:
  """The report's first lines when a GPU target's step has XLA's attention only because
  this host cannot load cuDNN (a GPU run of the same config gets cuDNN's kernel)."""
  if plan.memory_fraction is None or plan.config.model.attention_impl not in ("auto", "cudnn"):
    return []
  if any(kind.startswith("attention") for cost in plan.costs.values()
         for kind in cost.kernels):
    return []
  from transformer.model import attention_ops  # pylint: disable=g-import-not-at-top
  if attention_ops.cudnn_available():
    return []
  return [f"NOTE: this estimate assumes XLA's attention: model.attention_impl="
          f"{plan.config.model.attention_impl!r} gets cuDNN's flash kernel on a GPU, but jax "
          "picks it only where it can load cuDNN, and nvidia-cudnn-cu12 is not installed on "
          "this host (pip install nvidia-cudnn-cu12, or the package's [compile] extra). On "
          f"the H100 of docs/performance.md gpt_small 32 x 1024 measured {_CUDNN_MEASURED}: "
          "the bytes, kernels and step time below are of the XLA step, slower than a run's."]


def _ms(seconds: float) -> str:
  return f"{seconds * 1e3:.2f} ms"


def _estimate_lines(name: str, cost, est: estimate_lib.Estimate | None) -> list[str]:
  """One step's estimate: FLOPs, collectives, the three bounds, MFU/HFU, XLA's model."""
  if est is None:
    return [f"  {name}: no estimate: XLA refused to compile it ({cost.compile_error})"]
  model = (f"model {cost.model_flops:.3g} FLOPs/chip (flops.py), "
           if cost.model_flops is not None else "")
  moved = ", ".join(f"{kind} {gib(cost.collective_bytes.get(kind, 0))}"
                    for kind in collectives.KINDS if cost.collective_bytes.get(kind))
  bound = "~" if est.calibrated else "<="
  mfu = f", MFU {bound} {100 * est.mfu:.1f}%" if est.mfu is not None else ""
  hfu = f", HFU {bound} {100 * est.hfu:.1f}%" if est.hfu is not None else ""
  unknown = (f" UNKNOWN (XLA could not print the compiled HLO: {cost.collective_error}; "
             "the interconnect bound below is missing)" if cost.collective_error else "")
  looped = (f", loops multiplied out x{cost.loop_factors['flops']:.2f}"
            if cost.loop_factors.get("flops", 1.0) > 1.001 else "")
  totals = (f"compute {_ms(est.compute_seconds)}, HBM {_ms(est.hbm_seconds)}, "
            f"interconnect {_ms(est.network_seconds)}")
  if est.calibrated:
    low, high = est.seconds_range
    headline = (f"  {name}: ~{_ms(est.seconds)} a step (ESTIMATE, range {_ms(low)} to "
                f"{_ms(high)}; floor >= {_ms(est.lower_bound_seconds)}), "
                f"~{est.tokens_per_second:,.0f} tokens/s{mfu}{hfu}")
    detail = (f"    {est.breakdown.launches:,} kernels, each at fitted efficiencies "
              f"({est.breakdown.calibrated}); the step's totals at the bf16 peak and "
              f"the bandwidths: {totals}")
  else:
    headline = (f"  {name}: ~{_ms(est.seconds)} a step (ESTIMATE = floor, {est.bound}-bound "
                f"at published peaks: {totals}), ~{est.tokens_per_second:,.0f} tokens/s"
                f"{mfu}{hfu}")
    detail = ""
  lines = [headline] + ([detail] if detail else []) + [
      f"    {model}hardware {cost.xla_flops:.3g} FLOPs/chip ({cost.cost_source}{looped}); "
      f"collectives per chip: {moved or 'none'}{unknown}; compiled in "
      f"{cost.compile_seconds:.1f} s"]
  if est.mix_warnings:
    lines.append("    OUTSIDE CALIBRATION: this step's kernel mix differs from every measured "
                 "step's, so the estimate extrapolates: " + "; ".join(est.mix_warnings))
  if cost.bytes_source and cost.bytes_source != cost.cost_source:
    lines.append(f"    HBM bytes {cost.hbm_bytes_accessed:.3g}/chip and optimal_seconds: "
                 f"{cost.bytes_source} (compiled in {cost.depth_compile_seconds:.1f} s)")
  if est.optimal_seconds is not None:
    lines.append(f"    (another model, not this estimate: XLA's own TPU cost model, "
                 f"optimal_seconds with loops multiplied out, says {_ms(est.optimal_seconds)})")
  if cost.collective_bytes.get(collectives.UNKNOWN_TRIPS):
    lines.append(f"    ({cost.collective_bytes[collectives.UNKNOWN_TRIPS]} loop(s) have no "
                 "known trip count and count once)")
  return lines


def _parts_lines(plan: Plan) -> list[str]:
  """"Where the time goes": each step's kernels summed by part (kernels.py)."""
  done = {name: est.breakdown for name, est in plan.estimates.items()
          if est is not None and est.breakdown is not None}
  if not done:
    return []
  calibrated = next((b.calibrated for b in done.values() if b.calibrated), "")
  lines = ["", "Where the time goes (every kernel priced on the chip, loops multiplied out; "
           + (f"efficiencies {calibrated}; the total is the estimate above" if calibrated
              else "each kernel at its roofline at published peaks, summed: another model "
              "than the estimate above, which lets compute, HBM and interconnect overlap; "
              "no kernel of this chip was measured, so the shares show where the work is, "
              "and the total is no step time") + "):"]
  for name, parts in done.items():
    lines += kernels.table(name, parts)
  return lines


def _audit_line(plan: Plan) -> str:
  if plan.mesh.get("fsdp", 1) == 1 and plan.mesh.get("tensor", 1) == 1:
    return "Sharding audit: fsdp = tensor = 1, every weight is replicated by design."
  if not plan.replicated:
    return "Sharding audit: no parameter or optimizer leaf is replicated."
  total = sum(leaf.nbytes for leaf in plan.replicated)
  return (f"Sharding audit: {len(plan.replicated)} parameter/optimizer leaves are "
          f"replicated on every chip ({gib(total)} each chip holds in full):")


def trial_lines(title: str, trials: list[Trial], chip_bytes: int,
                baseline: int | None = None) -> list[str]:
  """A table of levers or mesh-search trials: fits, does not fit, or refused (and why)."""
  lines = ["", title]
  for trial in trials:
    if trial.error is not None:
      lines.append(f"  {trial.label:<44} not possible: {trial.error}")
      continue
    change = (f" ({(trial.total_bytes - baseline) / GIB:+.2f} GiB)"
              if baseline is not None else "")
    if trial.compile_error is not None:  # Its bytes are XLA's figure; no step time.
      lines.append(f"  {trial.label:<44} {gib(trial.total_bytes)}{change}: XLA refused to "
                   f"compile it: {trial.compile_error} (in {trial.compile_seconds:.0f} s)")
      continue
    mfu = f", MFU <= {100 * trial.mfu:.1f}%" if trial.mfu is not None else ""
    lines.append(f"  {trial.label:<44} {gib(trial.total_bytes)}{change}: "
                 f"{verdict(trial.total_bytes, chip_bytes)}; ~{trial.seconds * 1e3:.2f} ms"
                 f"{mfu} (compiled in {trial.compile_seconds:.0f} s)")
  return lines


def to_json(plan: Plan, levers: dict[str, list[Trial]] | None = None,
            search: list[Trial] | None = None,
            full_fine_tuning: Trial | None = None,
            train_time: budget.TrainTime | None = None) -> dict[str, Any]:
  """The --output report (`full_fine_tuning`: a LoRA config's train step without
  adapters, search.full_fine_tuning; `train_time`: --tokens' answer)."""
  steps = {}
  for name, cost in plan.costs.items():
    est = plan.estimates[name]
    estimated = lambda field: getattr(est, field) if est is not None else None
    steps[name] = dict(
        arguments_bytes=cost.arguments_bytes, temp_bytes=cost.temp_bytes,
        output_bytes=cost.output_bytes, alias_bytes=cost.alias_bytes,
        code_bytes=cost.code_bytes, workspace_bytes=cost.workspace_bytes,
        total_bytes=cost.total_bytes,
        chip_bytes=plan.usable_bytes, fits=plan.fits(name),
        flops_per_chip=cost.model_flops, xla_flops_per_chip=cost.xla_flops,
        hbm_bytes_accessed=cost.hbm_bytes_accessed,
        collective_bytes=cost.collective_bytes if cost.collective_error is None else None,
        collective_error=cost.collective_error, estimated_seconds=estimated("seconds"),
        estimate_bound=estimated("bound"),
        estimated_tokens_per_second=estimated("tokens_per_second"),
        estimated_mfu=estimated("mfu"), estimated_hfu=estimated("hfu"),
        estimate_calibrated=estimated("calibrated"),
        estimated_seconds_range=(list(est.seconds_range)
                                 if est is not None and est.seconds_range else None),
        lower_bound_seconds=estimated("lower_bound_seconds"),
        estimate_outside_calibration=(list(est.mix_warnings) if est is not None else None),
        where_the_time_goes=(est.breakdown.as_json()
                             if est is not None and est.breakdown is not None else None),
        optimal_seconds=cost.optimal_seconds, loop_factors=cost.loop_factors,
        cost_source=cost.cost_source, bytes_source=cost.bytes_source or cost.cost_source,
        kernels=cost.kernels,
        compile_seconds=cost.compile_seconds, compile_error=cost.compile_error)
  trial = lambda t: dict(label=t.label, step=t.step, total_bytes=t.total_bytes,
                         fits=t.fits, estimated_seconds=t.seconds, estimated_mfu=t.mfu,
                         error=t.error, compile_error=t.compile_error)
  return dict(
      topology=plan.topology.name, num_slices=plan.topology.num_slices,
      chips=plan.topology.chips, chip_kind=plan.chip_kind, chip=plan.chip.name,
      usable_bytes=plan.usable_bytes, memory_fraction=plan.memory_fraction,
      mesh=plan.mesh, steps=steps, train_arguments_per_chip=plan.breakdown,
      config=dict(batch_size=plan.config.data.batch_size, seq_len=plan.config.data.seq_len,
                  microbatches=plan.config.train.microbatches,
                  remat=plan.config.model.remat, scan_layers=plan.config.model.scan_layers,
                  dtype=str(plan.config.model.dtype),
                  param_dtype=str(plan.config.model.param_dtype)),
      replicated=[dict(path=leaf.path, shape=list(leaf.shape), bytes=leaf.nbytes)
                  for leaf in plan.replicated],
      levers={step: [trial(t) for t in trials] for step, trials in (levers or {}).items()},
      mesh_search=[trial(t) for t in (search or [])],
      full_fine_tuning=trial(full_fine_tuning) if full_fine_tuning is not None else None,
      **(train_time.as_json() if train_time is not None else {}),
      assumptions=estimate_lib.ASSUMPTIONS)
