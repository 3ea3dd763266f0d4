"""GPU hosts without the GPUs: `--topology=h100:8` -> compile-only CUDA devices.

jax's CUDA plugin (the `jax-cuda12-plugin` and `jax-cuda12-pjrt` wheels, which hold
XLA's GPU compiler) builds devices for a GPU it is not attached to from a
`GpuTargetConfigProto` in text form (`jax.experimental.topologies.get_topology_desc(
platform="cuda", target_config=..., topology="1x<hosts>x<gpus per host>")`, the route
of jax's own deviceless AOT test). Each target's proto is a data file beside this
module (gpu_targets/*.txtpb) with the source of every figure. A jit on those devices
compiles to the GPU's own code: XLA's buffer assignment and its choice of kernels are
what a run would get, but no autotuning happens without a device (matmuls keep
Triton's default tiles) and `cost_analysis()` returns nothing: hlo.py counts the
FLOPs and bytes instead.

At run time the CUDA client preallocates `XLA_PYTHON_CLIENT_MEM_FRACTION` of the
device's memory (launch.py sets accelerator.GPU_MEMORY_FRACTION, 0.9, unless the user
sets it; jax's own default is 0.75) and XLA must fit the step in that pool, so
the memory verdict compares against that fraction, not the whole device.
"""

from __future__ import annotations

import contextlib
from typing import Iterator
import dataclasses
import importlib.util
import logging
import os
import re

from transformer import accelerator
from transformer import plugin_noise
from transformer.config.errors import ConfigError

INSTALL_HINT = "pip install jax-cuda12-plugin==0.10.2 jax-cuda12-pjrt==0.10.2"
# Name in --topology -> the target file; the host's GPU count is bounded by GPUS_PER_HOST.
TARGETS = {"h100": "h100.txtpb", "h200": "h200.txtpb", "a100": "a100.txtpb"}
GPUS_PER_HOST = 8  # An HGX / DGX board: 8 GPUs on one NVLink switch.
_DIR = os.path.join(os.path.dirname(__file__), "gpu_targets")


@dataclasses.dataclass(frozen=True)
class GpuTopology:
  """A parsed GPU `--topology`: `h100:8` (one host) or `h100:8x2` (two hosts of 8)."""

  name: str
  gpu: str  # A key of TARGETS.
  per_host: int
  hosts: int = 1

  @property
  def chips(self) -> int:
    """GPUs (= JAX devices) in all hosts together."""
    return self.per_host * self.hosts

  @property
  def num_slices(self) -> int:
    """One NVLink domain: the report's slice count (hosts talk over the network)."""
    return 1


# jax's CUDA plugins: jax[cuda12]'s (this project's test pin) or jax[cuda13]'s (what a
# GPU host with a newer jax has, e.g. the H100 of docs/performance.md); either compiles.
PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


def wheels_missing() -> str | None:
  """One line naming the install command when no CUDA plugin wheel is installed."""
  if all(importlib.util.find_spec(name) is None for name in PLUGINS):
    return (f"--topology for a GPU needs XLA's GPU compiler, which is jax's CUDA plugin: "
            f"{INSTALL_HINT} (about 480 MB installed; it needs no GPU or driver to "
            "compile, and training does not need it)")
  return None


def is_gpu(name: str) -> bool:
  """Whether a --topology names a GPU host (`h100:8`): TPU names start with v<digit>."""
  return re.match(r"v\d", name.lower()) is None


def parse(name: str) -> GpuTopology:
  """`h100:8` or `h100:8x2` -> GpuTopology; ConfigError naming what would be valid."""
  match = re.fullmatch(r"([a-z]\w*):(\d+)(?:x(\d+))?", name.lower())
  known = ", ".join(f"{gpu}:8" for gpu in TARGETS)
  if not match or match.group(1) not in TARGETS:
    raise ConfigError(f"--topology={name!r} is not a GPU this mode knows: expected "
                      f"<gpu>:<gpus per host>[x<hosts>] with the GPU one of "
                      f"{sorted(TARGETS)} (e.g. {known}, h100:8x2)")
  per_host, hosts = int(match.group(2)), int(match.group(3) or 1)
  if not 1 <= per_host <= GPUS_PER_HOST:
    raise ConfigError(f"--topology={name!r}: a host holds 1 to {GPUS_PER_HOST} "
                      f"{match.group(1)} GPUs; for more, add hosts: "
                      f"{match.group(1)}:{GPUS_PER_HOST}x{max(2, -(-per_host // GPUS_PER_HOST))}")
  if hosts < 1:
    raise ConfigError(f"--topology={name!r}: the host count after 'x' is 1 or more")
  return GpuTopology(name=name, gpu=match.group(1), per_host=per_host, hosts=hosts)


def target_text(gpu: str) -> str:
  """The GpuTargetConfigProto text of `gpu` (a key of TARGETS)."""
  with open(os.path.join(_DIR, TARGETS[gpu]), encoding="utf-8") as f:
    return f.read()


def device_memory_bytes(gpu: str) -> int:
  """The device's memory as the driver reports it (the target file's device_memory_size)."""
  return int(re.search(r"device_memory_size:\s*(\d+)", target_text(gpu)).group(1))


def memory_fraction() -> float:
  """The share of a GPU a run launched from this environment can use (accelerator.py:
  the launcher's default where XLA_PYTHON_CLIENT_MEM_FRACTION is unset)."""
  try:
    return accelerator.memory_fraction()
  except ValueError as e:
    raise ConfigError(str(e)) from None


def plugin_noise_filtered():
  """The CUDA plugin's no-driver lines (and XLA's deviceless-schedule ERROR line) taken
  off stderr for a block (plugin_noise.py): into log.txt, not the console."""
  if plugin_noise.driver_present():
    return contextlib.nullcontext()
  return plugin_noise.filtered(keep=_to_log_only)


def _to_log_only(line: str) -> None:
  logging.getLogger("xla_gpu_compile").info("%s", line, extra={"console": False})


def devices(topology: GpuTopology) -> list:
  """The hosts' compile-only CUDA devices (ConfigError if the plugin refuses)."""
  missing = wheels_missing()
  if missing:
    raise ConfigError(missing)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    with plugin_noise_filtered():
      description = topologies.get_topology_desc(
          platform="cuda", target_config=target_text(topology.gpu),
          topology=f"1x{topology.hosts}x{topology.per_host}")
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(f"--topology={topology.name!r}: jax's CUDA plugin cannot build it "
                      f"({str(e).splitlines()[0]})") from e
  return list(description.devices)


@contextlib.contextmanager
def target_capability(mesh) -> Iterator[None]:
  """jax's cuDNN attention checks the compute capability of *this host's* GPU when it
  traces (the packed layout needs sm_90); compiling for a target GPU from a CPU host,
  the check must read the target's devices instead, or an H100 target is refused as
  "not Hopper". A no-op for TPU and CPU meshes, and where a real GPU backend runs."""
  device = mesh.devices.flat[0]
  capability = getattr(device, "compute_capability", None)
  if device.platform != "gpu" or not capability:
    yield
    return
  import jax  # pylint: disable=g-import-not-at-top
  if jax.default_backend() == "gpu":
    yield
    return
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=g-import-not-at-top
  current = tuple(int(x) for x in capability.split("."))
  as_tuple = lambda text: tuple(int(x) for x in text.split("."))
  saved = cudnn.check_compute_capability, cudnn.is_cuda_compute_capability_equal
  cudnn.check_compute_capability = lambda wanted: current >= as_tuple(wanted)
  cudnn.is_cuda_compute_capability_equal = lambda wanted: current == as_tuple(wanted)
  try:
    yield
  finally:
    cudnn.check_compute_capability, cudnn.is_cuda_compute_capability_equal = saved
