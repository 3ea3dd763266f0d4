"""--mode=sweep --devices_per_run=K: the host's devices cut into slots of K, one arm each.

The sweep process starts no JAX devices, so the devices are found the way the runtimes
find them, without initialising one:
  - GPUs: CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L`; a slot is K of them, given
    to its arm through CUDA_VISIBLE_DEVICES.
  - TPU chips: /dev/accel* (v4, v5e) or /dev/vfio/<n> (v5p, v6e); a slot is K chips
    through TPU_VISIBLE_CHIPS, TPU_CHIPS_PER_PROCESS_BOUNDS (the slot's shape),
    TPU_PROCESS_BOUNDS=1,1,1 and a TPU_PROCESS_PORT of its own. The TPU runtime lets a
    process take 1, 2 or 4 chips of a host this way (4: a 2x2 block); any other K is one
    line. Not run on a TPU here.
  - Otherwise the CPU: a slot is K cores, its arm a process with K simulated devices
    (XLA_FLAGS=--xla_force_host_platform_device_count=K, JAX_PLATFORMS=cpu).
More devices per run than the host has is one line naming both.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Callable

from transformer.config.errors import ConfigError

# TPU_CHIPS_PER_PROCESS_BOUNDS for the subsets the TPU runtime gives a process.
_TPU_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1"}
_TPU_FIRST_PORT = 8476  # TPU_PROCESS_PORT of slot 0; each slot takes the next.
_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S*")


@dataclasses.dataclass(frozen=True)
class Slot:
  """K devices of the host and the environment that gives an arm exactly those."""
  where: str  # "GPU 0,1", "TPU chips 2,3", "CPU slot 1 (1 device)"
  env: dict[str, str]
  ray: dict[str, int] = dataclasses.field(default_factory=dict)  # A Ray task's resources.


def host_devices() -> tuple[str, list[str]]:
  """(kind, device ids) of this host: ("gpu", ...), ("tpu", ...) or ("cpu", cores)."""
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None and visible.strip() not in ("", "-1"):
    return "gpu", [d.strip() for d in visible.split(",") if d.strip()]
  if visible is None and shutil.which("nvidia-smi"):
    try:
      listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                               timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
      listing = ""
    gpus = re.findall(r"^GPU (\d+):", listing, re.MULTILINE)
    if gpus:
      return "gpu", gpus
  chips = sorted(glob.glob("/dev/accel[0-9]*")) or sorted(
      p for p in glob.glob("/dev/vfio/[0-9]*"))
  if chips:
    return "tpu", [str(i) for i in range(len(chips))]
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return "cpu", [str(i) for i in range(cores or 1)]


def cpu_env(count: int) -> dict[str, str]:
  """The environment of a CPU process with `count` simulated devices."""
  flags = _COUNT_FLAG.sub("", os.environ.get("XLA_FLAGS", "")).strip()
  return {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": (
      f"{flags} --xla_force_host_platform_device_count={count}").strip()}


def slots(devices_per_run: int, kind: str = "", devices: list[str] | None = None) -> list[Slot]:
  """The host's devices in slots of `devices_per_run`; as many slots as fit.

  Args:
    devices_per_run: K, the devices of each arm (>= 1).
    kind, devices: the host's (host_devices() when not given; tests pass their own).

  Raises:
    ConfigError: K < 1, K more than the host has, or a TPU subset the runtime refuses.
  """
  if not kind:
    kind, devices = host_devices()
  devices = list(devices or [])
  k = devices_per_run
  name = {"gpu": "GPUs", "tpu": "TPU chips", "cpu": "CPU cores"}[kind]
  if k < 1:
    raise ConfigError(f"--devices_per_run={k} is invalid: expected a number of devices >= 1 "
                      "(or leave it out: every run takes all devices, one run at a time)")
  if k > len(devices):
    raise ConfigError(f"--devices_per_run={k}: this host has {len(devices)} {name} "
                      f"({', '.join(devices)}); at most {len(devices)} per run")
  if kind == "tpu" and k not in _TPU_BOUNDS:
    raise ConfigError(f"--devices_per_run={k}: a TPU process can take 1, 2 or 4 chips of a "
                      f"host (TPU_CHIPS_PER_PROCESS_BOUNDS); this host has {len(devices)}")
  found = []
  for index in range(len(devices) // k):
    mine = devices[index * k:(index + 1) * k]
    if kind == "gpu":
      found.append(Slot(f"GPU {','.join(mine)}", {"CUDA_VISIBLE_DEVICES": ",".join(mine)}))
    elif kind == "tpu":
      found.append(Slot(f"TPU chips {','.join(mine)}", {
          "TPU_VISIBLE_CHIPS": ",".join(mine), "TPU_CHIPS_PER_PROCESS_BOUNDS": _TPU_BOUNDS[k],
          "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_PORT": str(_TPU_FIRST_PORT + index)}))
    else:
      found.append(Slot(f"CPU slot {index} ({k} device{'s' if k > 1 else ''})", cpu_env(k)))
  return found


def stop_with_the_parent() -> Callable[[], None] | None:
  """A preexec_fn: the run gets SIGTERM (stop after the step, save) when the sweep (its parent)
  dies.

  Otherwise a killed sweep (SIGKILL, a test's timeout) would leave its run training
  alone in its own session, and a rerun of the sweep would start a second one in the
  same workdir. Linux only (prctl); elsewhere the run outlives a killed sweep.
  """
  if not sys.platform.startswith("linux"):
    return None
  libc = ctypes.CDLL(None, use_errno=True)  # Loaded before the fork: the child only calls.
  set_parent_death_signal = 1  # PR_SET_PDEATHSIG in <linux/prctl.h>.
  return lambda: libc.prctl(set_parent_death_signal, signal.SIGTERM)
