"""HBM bytes of a scanned stack, from the same step compiled unrolled at two small depths.

XLA's TPU cost analysis counts a while loop's body once and its totals cannot be split
by loop; hlo.py's count of the trips it left out multiplies FLOPs and collectives out
well (within 1.5% and 4% of the unrolled program), but its per-kernel byte count of a
scanned body is not that of the unrolled layers (TPU memory spaces, the stacked weights'
slices, the carry's copies): 1.4x-1.75x the unrolled program's bytes on toy TPU models,
1.1x on a toy GPU one, 8.6% on llama 1B (TPU). So for a scanned model the step is
compiled again unscanned at the layer period p (1; moe_every for interleaved MoE
layers; the length of window_pattern for local/global layers) and at 2p, and its bytes
accessed and optimal_seconds (XLA's own on a TPU; hlo.py's bytes on a GPU, which has no
cost analysis) are extrapolated linearly per layer to the real depth:

  f(N) = f(p) + (N - p) / p x (f(2p) - f(p))

one slope per stack (an encoder-decoder compiles three variants: both stacks at p, then
each at 2p). A stack of at most 2p layers is compiled at its own depth: nothing is
extrapolated for it. Memory (memory_analysis), FLOPs, collectives and kernels stay those
of the scanned program, which is what a run executes.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import ml_collections

from transformer import sharding
from transformer.planning import compiled
from transformer.workdir import progress


def period(model: ml_collections.ConfigDict) -> int:
  """Layers after which a stack's blocks repeat (MoE interleave, local/global pattern)."""
  p = model.moe_every if model.mlp == "moe" else 1
  if model.sliding_window:
    p = math.lcm(p, len(model.window_pattern))
  return p


def stacks(model: ml_collections.ConfigDict) -> dict[str, int]:
  """Depth key -> layers of each stack of blocks the model has."""
  if model.arch == "encoder_decoder":
    return {"num_layers": model.num_layers,
            "num_decoder_layers": model.num_decoder_layers or model.num_layers}
  return {"num_layers": model.num_layers}


def applies(config: ml_collections.ConfigDict, costs: dict[str, compiled.StepCost]) -> bool:
  """Whether the model is scanned and a step compiled (XLA refused none of them all)."""
  return bool(config.model.scan_layers) and any(
      cost.compile_error is None for cost in costs.values())


def variants(model: ml_collections.ConfigDict) -> list[dict[str, int]]:
  """The depths compiled: every stack at its base depth, then each stack at its second.

  Base depth min(p, N), second min(2p, N) (only where N exceeds the base).
  """
  p = period(model)
  base = {key: min(p, n) for key, n in stacks(model).items()}
  out = [dict(base)]
  for key, n in stacks(model).items():
    if n > base[key]:
      out.append(dict(base, **{key: min(2 * p, n)}))
  return out


def _line(values: list[float], depths: list[dict[str, int]], target: dict[str, int]) -> float:
  """values[0] plus each stack's slope times the layers it has beyond its base depth."""
  total = values[0]
  base = depths[0]
  for value, depth in zip(values[1:], depths[1:]):
    (key,) = [k for k in depth if depth[k] != base[k]]
    total += (value - values[0]) / (depth[key] - base[key]) * (target[key] - base[key])
  return total


def extrapolate(config: ml_collections.ConfigDict, mesh,
                costs: dict[str, compiled.StepCost]) -> dict[str, compiled.StepCost]:
  """`costs` with HBM bytes and optimal_seconds from the unrolled compiles (module doc).

  Args:
    config: the config as compiled (compiled.target_config), scanned.
    mesh: the mesh it was compiled for.
    costs: the scanned steps' StepCosts.

  Returns:
    New StepCosts; a step XLA refused is returned unchanged.
  """
  steps = tuple(name for name, cost in costs.items() if cost.compile_error is None)
  depths = variants(config.model)
  measured = []
  for depth in depths:
    variant = copy.deepcopy(config)
    variant.model.scan_layers = False
    for key, n in depth.items():
      variant.model[key] = n
    with progress.stage("compile: the steps unrolled at depth "
                        + "/".join(str(n) for n in depth.values())), \
        sharding.tables_off_the_console():  # A probe: the table printed is the model's.
      measured.append(compiled.compile_steps(compiled.build_trainer(variant, mesh), steps))
  target = stacks(config.model)
  label = " and ".join(
      "/".join(str(d[k]) for k in target) for d in depths)
  out = dict(costs)
  for name in steps:
    runs = [m[name] for m in measured]
    if any(run.compile_error for run in runs):
      continue  # An unrolled variant out of memory: keep the loop count.
    nbytes = _line([run.hbm_bytes_accessed for run in runs], depths, target)
    optimal = None
    if all(run.optimal_seconds is not None for run in runs):
      optimal = _line([run.optimal_seconds for run in runs], depths, target)
    factors = {k: v for k, v in costs[name].loop_factors.items() if k == "flops"}
    out[name] = dataclasses.replace(
        costs[name], hbm_bytes_accessed=nbytes, optimal_seconds=optimal, loop_factors=factors,
        bytes_source=(f"{runs[0].cost_source} of the step unrolled at {label} layers, "
                      f"extrapolated per layer to {'/'.join(str(n) for n in target.values())}"),
        depth_compile_seconds=sum(run.compile_seconds for run in runs))
  return out
