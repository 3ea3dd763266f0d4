"""What to change when a step does not fit, and which mesh is fastest: each one compiled.

Nothing here guesses: a lever or a mesh is a config change, and its effect is what XLA
reports for the train step compiled with it (decode.batch_size for the decode step).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from transformer import sharding
from transformer.config.errors import ConfigError
from transformer.config.model import REMAT_POLICIES
from transformer.planning import plan as plan_lib
from transformer.planning import topology as topology_lib
from transformer.workdir import progress



@dataclasses.dataclass
class Trial:
  """One config variant compiled for one step (or refused by the checks, with why)."""

  label: str  # "model.remat=full", "data=2 fsdp=4 tensor=2 remat=full".
  overrides: dict[str, Any]
  step: str
  total_bytes: int | None = None  # None when it did not compile (see `error`).
  fits: bool = False
  seconds: float | None = None  # The step-time estimate.
  mfu: float | None = None
  compile_seconds: float = 0.0
  error: str | None = None  # The checks refused the variant: nothing was compiled.
  compile_error: str | None = None  # XLA refused to compile it (out of HBM): no estimate.


def _try(config: ml_collections.ConfigDict, topology: topology_lib.Topology, devices: list,
         label: str, overrides: dict[str, Any], step: str,
         extrapolate_depth: bool = False) -> Trial:
  """Compiles `step` of `config` with `overrides`; a ConfigError becomes the trial's error."""
  trial = Trial(label=label, overrides=overrides, step=step)
  progress.say(f"compile: trying {label} for the {step} step")
  try:
    with sharding.tables_off_the_console():  # One table a command: the model's own.
      result = plan_lib.make_plan(plan_lib.with_overrides(config, overrides), topology,
                                  devices, steps=(step,), extrapolate_depth=extrapolate_depth)
  except ConfigError as e:
    trial.error = str(e).splitlines()[0]
    progress.say(f"compile: {label}: {trial.error}")
    return trial
  cost, estimate = result.costs[step], result.estimates[step]
  trial.total_bytes, trial.fits = cost.total_bytes, result.fits(step)
  trial.compile_error = cost.compile_error
  if estimate is not None:  # None: XLA refused the step (out of memory).
    trial.seconds, trial.mfu = estimate.seconds, estimate.mfu
  trial.compile_seconds = cost.compile_seconds
  return trial


def levers(config: ml_collections.ConfigDict, mesh: dict[str, int], step: str,
           ) -> list[tuple[str, dict[str, Any]]]:
  """The changes that lower `step`'s memory, as (label, overrides), each on its own.

  Train: recompute activations in the backward pass (model.remat=full), scan the
  blocks (model.scan_layers), move data-parallel ways to fsdp (weights and optimizer
  state split over them too), twice the micro-batches, half the batch. Decode: half
  decode.batch_size. Levers already in effect are left out.
  """
  if step == "decode":
    rows = config.decode.batch_size
    return [(f"decode.batch_size={rows // 2}", {"decode.batch_size": rows // 2})] if rows > 1 else []
  options = []
  if config.model.remat != "full":
    options.append(("model.remat=full", {"model.remat": "full"}))
  if not config.model.scan_layers:
    options.append(("model.scan_layers=True", {"model.scan_layers": True}))
  if mesh.get("data", 1) > 1:
    shape = (("data", 1), ("fsdp", mesh["data"] * mesh.get("fsdp", 1)),
             ("tensor", mesh.get("tensor", 1)))
    options.append((f"mesh data=1 fsdp={shape[1][1]} tensor={shape[2][1]}",
                    {"mesh.shape": shape}))
  micro = config.train.microbatches * 2
  options.append((f"train.microbatches={micro}", {"train.microbatches": micro}))
  if config.data.batch_size > 1:
    half = config.data.batch_size // 2
    options.append((f"data.batch_size={half}", {"data.batch_size": half}))
  return options


def try_levers(config: ml_collections.ConfigDict, topology: topology_lib.Topology,
               devices: list, mesh: dict[str, int], step: str,
               extrapolate_depth: bool = False) -> list[Trial]:
  """Each of `levers` compiled for `step` on its own (make_plan's extrapolate_depth)."""
  return [_try(config, topology, devices, label, overrides, step, extrapolate_depth)
          for label, overrides in levers(config, mesh, step)]


def full_fine_tuning(config: ml_collections.ConfigDict, topology: topology_lib.Topology,
                     devices: list, extrapolate_depth: bool = False) -> Trial:
  """A LoRA config's train step compiled without adapters (model.lora_rank=0): what
  training every weight would need, beside what the adapters need."""
  return _try(config, topology, devices, "full fine-tuning (model.lora_rank=0)",
              {"model.lora_rank": 0}, "train", extrapolate_depth)


def factorisations(chips: int) -> list[tuple[int, int, int]]:
  """Every (data, fsdp, tensor) whose product is `chips`."""
  divisors = [d for d in range(1, chips + 1) if chips % d == 0]
  return [(d, f, chips // (d * f)) for d in divisors for f in divisors
          if chips % (d * f) == 0]


def mesh_search(config: ml_collections.ConfigDict, topology: topology_lib.Topology,
                devices: list, remats: tuple[str, ...],
                extrapolate_depth: bool = False) -> list[Trial]:
  """The train step for every mesh factorisation and remat policy, best first.

  Order: variants that fit, by estimated step time (fastest first), then those that
  do not fit, by memory, then those the checks refused (a batch or a head count that
  does not split), with the reason.
  """
  unknown = set(remats) - set(REMAT_POLICIES)
  if unknown:
    raise ConfigError(f"--search_remat has {sorted(unknown)}; valid: {list(REMAT_POLICIES)}")
  trials = []
  meshes = factorisations(len(devices))
  searching = progress.Progress("compile: mesh search", len(meshes) * len(remats), "trials")
  for data, fsdp, tensor in meshes:
    for remat in remats:
      shape = (("data", data), ("fsdp", fsdp), ("tensor", tensor))
      trials.append(_try(config, topology, devices,
                         f"data={data} fsdp={fsdp} tensor={tensor} remat={remat}",
                         {"mesh.shape": shape, "model.remat": remat}, "train",
                         extrapolate_depth))
      searching.update()
  searching.finish()
  return sorted(trials, key=rank)


def rank(trial: Trial) -> tuple:
  """Sort key: fitting by time, then not fitting by memory, then refused."""
  if trial.error is not None:
    return (2, 0.0)
  if trial.fits:
    return (0, trial.seconds)
  return (1, float(trial.total_bytes))
