"""TPU slices without the TPUs: `--topology=v5p:4x4x4` -> abstract devices -> the run's mesh.

`jax.experimental.topologies.get_topology_desc` asks libtpu (the `libtpu` wheel, which
holds XLA's TPU compiler) for the devices of a slice that is not attached: they carry
their kind and torus coordinates, and jit can lower and compile for them on a CPU host.
The chip settings follow Google's own slice table (MaxText's accelerator_to_spec_map):
v4 and v5p run their two TensorCores as one megacore device, hosts hold 2x2x1 chips,
and a dimension wraps around (torus) on full-cube v4/v5p slices (every side a multiple
of 4) and on a 16-chip side of v5e/v6e. A grid no rentable slice has (v5p:2x2x3, a
likely typo for 2x2x4) is refused with the nearest ones unless --any_slice.

GPU hosts (`--topology=h100:8`) are gpu.py's: parse_topology and topology_devices hand
them over, and the mesh is built the same way.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from typing import Sequence

import numpy as np

from transformer.config.errors import ConfigError
from transformer.planning import gpu

INSTALL_HINT = "pip install libtpu"
# Generation -> the chip_config_name libtpu wants (megacore: one device per chip).
GENERATIONS = {"v4": "megacore", "v5e": "default", "v5p": "megacore", "v6e": "default"}
# Cloud slice names -> topology names, docs/compile-results.md's tables and the error message's examples.
KNOWN_SLICES = {
    "v4-8": "v4:2x2x1", "v4-16": "v4:2x2x2", "v4-32": "v4:2x2x4", "v4-128": "v4:4x4x4",
    "v5e-4": "v5e:2x2", "v5e-8": "v5e:2x4", "v5e-16": "v5e:4x4", "v5e-64": "v5e:8x8",
    "v5e-256": "v5e:16x16",
    "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5p-32": "v5p:2x2x4",
    "v5p-64": "v5p:2x4x4", "v5p-128": "v5p:4x4x4", "v5p-512": "v5p:4x8x8",
    "v6e-4": "v6e:2x2", "v6e-8": "v6e:2x4", "v6e-16": "v6e:4x4", "v6e-256": "v6e:16x16",
}
# libtpu looks for TPU hosts (metadata server, worker hostnames) when it loads and
# prints warnings when there are none; these say "this host, no metadata server" (the
# accelerator type only quiets the host-bounds lookup: the topology's own chips are
# compiled for). libtpu also takes a lockfile so that one process owns the local TPUs;
# there are none here, so compiles in several processes (a test run's workers) may
# load it together. Set only where the user has not set them.
_QUIET_LIBTPU = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost",
                 "TPU_ACCELERATOR_TYPE": "v5litepod-4", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A parsed `--topology`: generation, chip grid and how many slices."""

  name: str  # As given: "v5p:4x4x4".
  generation: str  # "v5p".
  dims: tuple[int, ...]  # Chips along each torus side.
  num_slices: int = 1

  @property
  def chips(self) -> int:
    """Chips (= JAX devices) in all slices together."""
    return int(np.prod(self.dims)) * self.num_slices

  @property
  def wrap(self) -> tuple[bool, bool, bool]:
    """Which sides are a torus (wrap-around links), as Google's slice table has them."""
    dims = self.dims + (1,) * (3 - len(self.dims))
    if len(self.dims) == 3:
      full_cube = all(d % 4 == 0 for d in self.dims)
      return (full_cube,) * 3
    return tuple(d == 16 for d in dims)  # type: ignore[return-value]


def libtpu_missing() -> str | None:
  """One line naming the install command when libtpu is absent, else None."""
  if importlib.util.find_spec("libtpu") is None:
    return (f"--mode=compile needs XLA's TPU compiler, which is the libtpu package: "
            f"{INSTALL_HINT} (tested with libtpu 0.0.52 and jax 0.10.2)")
  return None


def known_topologies() -> str:
  """The examples an error message lists: 'v4:2x2x1 (v4-8), ...'."""
  return ", ".join(f"{topology} ({name})" for name, topology in KNOWN_SLICES.items())


def parse_topology(name: str, num_slices: int = 1,
                   any_shape: bool = False) -> Topology | gpu.GpuTopology:
  """`v5p:4x4x4` (or a Cloud name such as `v5p-128`) -> Topology; `h100:8` -> GpuTopology.

  Args:
    name: the --topology value.
    num_slices: --num_slices (TPU slices only).
    any_shape: compile a TPU chip grid that no rentable slice has (--any_slice).

  Raises:
    ConfigError: an unknown name, or a grid Cloud does not rent (a typo, likely).
  """
  if gpu.is_gpu(name):
    try:
      parsed = gpu.parse(name)
    except ConfigError as e:
      raise ConfigError(f"{e}; TPU slices: {known_topologies()}") from None
    if num_slices != 1:
      raise ConfigError(f"--num_slices={num_slices} is for TPU slices; for several GPU "
                        f"hosts write --topology={parsed.gpu}:{parsed.per_host}x{num_slices}")
    return parsed
  topology = KNOWN_SLICES.get(name, name)
  match = re.fullmatch(r"(v\d+[a-z]?):(\d+(?:x\d+){1,2})", topology)
  if not match or match.group(1) not in GENERATIONS:
    raise ConfigError(
        f"--topology={name!r} is unknown: expected <generation>:<chips per side>, the "
        f"generation one of {sorted(GENERATIONS)}, 2 sides for v5e/v6e and 3 for v4/v5p; "
        f"known slices: {known_topologies()}")
  generation, dims = match.group(1), tuple(int(d) for d in match.group(2).split("x"))
  if len(dims) != (3 if GENERATIONS[generation] == "megacore" else 2):
    raise ConfigError(f"--topology={name!r}: {generation} slices have "
                      f"{3 if GENERATIONS[generation] == 'megacore' else 2} sides "
                      f"(AxBxC or AxB); known slices: {known_topologies()}")
  if num_slices < 1:
    raise ConfigError(f"--num_slices={num_slices} is invalid: 1 or more")
  if not any_shape and not rentable(generation, dims):
    chips = int(np.prod(dims))
    raise ConfigError(
        f"--topology={name!r}: no rentable {generation} slice has the shape "
        f"{'x'.join(map(str, dims))} ({chips} chips); nearest: "
        f"{', '.join(nearest_slices(generation, dims))}; pass --any_slice to compile "
        "it anyway")
  return Topology(name=topology, generation=generation, dims=dims, num_slices=num_slices)


def rentable(generation: str, dims: tuple[int, ...]) -> bool:
  """Whether Cloud rents a slice of this grid (Google's slice tables, v4/v5p/v5e/v6e docs).

  v4 and v5p: 2x2x1, 2x2x2, 2x2x4, 2x4x4, then sides that are multiples of 4 (full
  cubes, in any order). v5e and v6e: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16.
  """
  if GENERATIONS[generation] == "megacore":
    if tuple(sorted(dims)) in ((1, 2, 2), (2, 2, 2), (2, 2, 4), (2, 4, 4)):
      return True
    return all(d % 4 == 0 for d in dims)
  return tuple(sorted(dims)) in _FLAT_SLICES


_FLAT_SLICES = ((1, 1), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16))


def nearest_slices(generation: str, dims: tuple[int, ...]) -> list[str]:
  """The rentable grids of `generation` with the chip counts nearest below and above."""
  if GENERATIONS[generation] == "megacore":
    sides = (1, 2, 4, 8, 12, 16)
    grids = {tuple(sorted((a, b, c), reverse=False)) for a in sides for b in sides
             for c in sides if rentable(generation, (a, b, c))}
  else:
    grids = set(_FLAT_SLICES)
  chips = int(np.prod(dims))
  by_count = sorted(grids, key=lambda g: (int(np.prod(g)), g))
  below = [g for g in by_count if int(np.prod(g)) < chips][-1:]
  above = [g for g in by_count if int(np.prod(g)) > chips][:1]
  # Written in the user's order where the grid keeps their sides (2x2x3 -> 2x2x4).
  names = []
  for grid in below + above:
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    ordered = [0] * len(dims)
    for rank, i in enumerate(order):
      ordered[i] = grid[rank]
    names.append(f"{generation}:{'x'.join(map(str, ordered))} ({int(np.prod(grid))} chips)")
  return names


def quiet_libtpu() -> None:
  """Keeps libtpu's 'no TPU host here' warnings off the console (before it loads)."""
  for key, value in _QUIET_LIBTPU.items():
    os.environ.setdefault(key, value)


def drop_cpu_compiler_flags() -> list[str]:
  """Takes the CPU compiler's `--xla_cpu_*` flags out of XLA_FLAGS before libtpu reads it.

  libtpu parses XLA_FLAGS at its first compile and aborts on a flag its XLA build does
  not register (`--xla_cpu_use_fusion_emitters`, say): exit 1, the reason only in
  /tmp/tpu_logs, nothing on the console. The CPU backend's flags configure a compiler
  a TPU compile does not use; they stay out for the rest of this process (a CPU backend
  that started before keeps what it read). Returns the flags taken out (logged).
  """
  flags = os.environ.get("XLA_FLAGS", "").split()
  dropped = [f for f in flags if f.startswith("--xla_cpu_")]
  if dropped:
    os.environ["XLA_FLAGS"] = " ".join(f for f in flags if f not in dropped)
    from absl import logging  # pylint: disable=g-import-not-at-top
    logging.info("XLA_FLAGS without %s for libtpu (flags of the CPU compiler, which libtpu "
                 "refuses)", " ".join(dropped))
  return dropped


def topology_devices(topology: Topology | gpu.GpuTopology) -> list:
  """The slice's abstract devices, slice by slice (device.slice_index for several)."""
  if isinstance(topology, gpu.GpuTopology):
    return gpu.devices(topology)
  quiet_libtpu()
  drop_cpu_compiler_flags()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    with gpu.plugin_noise_filtered():  # jax loads every installed plugin here, CUDA's too.
      description = topologies.get_topology_desc(
          platform="tpu", topology_name=topology.name,
          chip_config_name=GENERATIONS[topology.generation],
          chips_per_host_bounds=(2, 2, 1), num_slices=topology.num_slices,
          wrap=topology.wrap)
  except Exception as e:  # pylint: disable=broad-except
    # libtpu's own error (a side it does not build, say) as the one line the user reads.
    raise ConfigError(f"--topology={topology.name!r}: libtpu cannot build it ("
                      f"{str(e).splitlines()[0]}); known slices: {known_topologies()}") from e
  return list(description.devices)


def topology_mesh(mesh_config, devices: Sequence, num_slices: int = 1):
  """The run's Mesh over abstract devices, as `sharding.make_mesh` builds it on a slice.

  The same `-1` expansion and the same topology-aware device order
  (`sharding.device_grid`); with several slices the data axis spans them.

  Raises:
    ConfigError: the mesh's product differs from the chip count, the data axis does
      not split over the slices, or an axis does not map onto the torus.
  """
  from jax.sharding import Mesh  # pylint: disable=g-import-not-at-top
  from transformer import sharding  # pylint: disable=g-import-not-at-top
  names = tuple(name for name, _ in mesh_config.shape)
  return Mesh(sharding.device_grid(mesh_config, devices, num_slices), names)
