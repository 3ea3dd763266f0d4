"""One config on one slice or GPU host: mesh, compiled steps, per-chip memory, estimates, audit."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import ml_collections

from transformer import hardware
from transformer.config.errors import ConfigError
from transformer.planning import audit
from transformer.planning import compiled
from transformer.planning import depth
from transformer.planning import estimate as estimate_lib
from transformer.planning import gpu
from transformer.planning import topology as topology_lib
from transformer.workdir import progress


@dataclasses.dataclass
class Plan:
  """Everything the report says about one config on one slice."""

  config: ml_collections.ConfigDict  # As compiled (dtype resolved for the target).
  topology: topology_lib.Topology
  chip_kind: str  # The devices' device_kind, e.g. "TPU v5 lite".
  chip: hardware.Chip
  mesh: dict[str, int]
  costs: dict[str, compiled.StepCost]
  estimates: dict[str, estimate_lib.Estimate | None]  # None: XLA refused the step.
  breakdown: dict[str, int]  # Train arguments per chip by part (compiled.argument_breakdown).
  replicated: list[audit.ReplicatedLeaf]
  # What a step may use: a TPU chip's HBM; a GPU's memory as the driver reports it times
  # XLA_PYTHON_CLIENT_MEM_FRACTION (the pool the CUDA client preallocates).
  usable_bytes: int = 0
  memory_fraction: float | None = None  # GPU targets only.

  def fits(self, step: str) -> bool:
    """Whether the step's peak footprint is within the memory a run can use."""
    cost = self.costs[step]
    return cost.compile_error is None and cost.total_bytes <= self.usable_bytes

  @property
  def train_tokens_per_second(self) -> float | None:
    """The train step's estimated tokens/s on the whole target; None without one."""
    est = self.estimates.get("train")
    return est.tokens_per_second if est is not None else None

  @property
  def all_fit(self) -> bool:
    """Whether every compiled step fits."""
    return all(self.fits(step) for step in self.costs)


def with_overrides(config: ml_collections.ConfigDict,
                   overrides: dict[str, Any]) -> ml_collections.ConfigDict:
  """A copy of `config` with dotted keys set: {"model.remat": "full"}."""
  config = copy.deepcopy(config)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


def chip_for(devices: list) -> tuple[str, hardware.Chip]:
  """The devices' kind and its row of hardware.CHIPS; ConfigError if the table lacks it."""
  kind = devices[0].device_kind
  chip = hardware.chip_of(kind)
  if chip is None or not chip.has_memory_figures:
    raise ConfigError(f"hardware.CHIPS has no memory and bandwidth figures for device kind "
                      f"{kind!r}; add its published figures there")
  return kind, chip


def usable_memory(topology, chip: hardware.Chip) -> tuple[int, float | None]:
  """(bytes a step may use per chip, the GPU memory fraction or None on a TPU)."""
  if isinstance(topology, gpu.GpuTopology):
    fraction = gpu.memory_fraction()
    return int(gpu.device_memory_bytes(topology.gpu) * fraction), fraction
  return chip.hbm_bytes, None


def make_plan(config: ml_collections.ConfigDict, topology: topology_lib.Topology,
              devices: list, steps: tuple[str, ...] = compiled.STEPS,
              extrapolate_depth: bool = False) -> Plan:
  """Compiles `steps` of `config` for the slice's abstract `devices` and reads the results.

  Args:
    config: the experiment config (a copy is resolved for the target, see
      `compiled.target_config`).
    topology: the parsed --topology.
    devices: `topology.topology_devices(topology)`.
    steps: which of compiled.STEPS to compile.
    extrapolate_depth: for a scanned model, take HBM bytes and optimal_seconds
      from the steps compiled unrolled at two small depths (depth.py): a few more,
      small compiles.

  Returns:
    The Plan.

  Raises:
    ConfigError: on a config or mesh that does not fit the slice, naming the key.
  """
  config = compiled.target_config(config)
  kind, chip = chip_for(devices)
  mesh = topology_lib.topology_mesh(config.mesh, devices, topology.num_slices)
  try:
    with progress.stage(f"compile: tracing the model on mesh {dict(mesh.shape)}"):
      trainer = compiled.build_trainer(config, mesh)
  except (RuntimeError, NotImplementedError) as e:  # Tracing the model for the target.
    raise compiled.rejected("model's init", e) from e
  costs = compiled.compile_steps(trainer, steps)
  if extrapolate_depth and depth.applies(config, costs):
    costs = depth.extrapolate(config, mesh, costs)
  estimates = {name: estimate_lib.estimate(cost, chip, mesh.size)
               for name, cost in costs.items()}
  usable, fraction = usable_memory(topology, chip)
  return Plan(config=config, topology=topology, chip_kind=kind, chip=chip,
              mesh=dict(mesh.shape), costs=costs, estimates=estimates,
              usable_bytes=usable, memory_fraction=fraction,
              breakdown=compiled.argument_breakdown(trainer),
              replicated=audit.replicated_leaves(trainer.abstract_state, mesh))
