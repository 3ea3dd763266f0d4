"""What an accelerator run needs from its environment before JAX starts, and checks after.

Three things a GPU run should not leave to chance (the JAX GPU performance guide and
NVIDIA's JAX-Toolbox set the same):

- XLA flags (`GPU_XLA_FLAGS`): set by the launcher only where an NVIDIA GPU is attached
  and the user has not set `XLA_FLAGS` at all, so a user's own flags always win whole.
- The memory the runtime preallocates: JAX takes `XLA_PYTHON_CLIENT_MEM_FRACTION` of each
  GPU (0.75 when unset); the launcher sets `GPU_MEMORY_FRACTION` where unset, and
  `--mode=compile` judges a step against the same fraction of the GPU's memory.
- The backend actually started: a host with an accelerator attached whose JAX came up on
  the CPU (a missing or broken CUDA plugin or libtpu; JAX itself only logs it) stops
  with one line (`check_backend`), unless `JAX_PLATFORMS` asks for the CPU.

And one for several processes on one GPU host: each process claims only its own GPU
(`local_device_ids`), instead of every process claiming every GPU.
"""

from __future__ import annotations

import glob
import os
from typing import Mapping, MutableMapping

# (flag, why). Checked to parse in this jax's XLA by tests/test_accelerator.py (an
# unknown flag aborts XLA at start-up).
GPU_XLA_FLAGS: tuple[tuple[str, str], ...] = (
    ("--xla_gpu_enable_latency_hiding_scheduler=true",
     "schedules collectives to overlap with compute (fsdp's all-gathers, the gradients' "
     "reduce-scatters)"),
    ("--xla_gpu_enable_while_loop_double_buffering=true",
     "a scanned stack's next layer's collectives start during the current layer"),
    ("--xla_gpu_enable_pipelined_all_gather=true",
     "fsdp's weight all-gathers move one loop iteration ahead"),
    ("--xla_gpu_enable_pipelined_reduce_scatter=true",
     "the gradients' reduce-scatters move one loop iteration behind"),
    ("--xla_gpu_enable_pipelined_all_reduce=true",
     "the same for all-reduces (data parallelism without fsdp)"),
    ("--xla_gpu_all_reduce_combine_threshold_bytes=134217728",
     "combines small all-reduces into 128 MiB ones (fewer, larger NCCL calls)"),
    ("--xla_gpu_all_gather_combine_threshold_bytes=134217728",
     "the same for all-gathers"),
    ("--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728",
     "the same for reduce-scatters"),
)
# The share of each GPU's memory the runtime preallocates (JAX's default is 0.75; NVIDIA's
# JAX-Toolbox guide sets 0.8-0.9: the rest serves cuDNN/cuBLAS workspaces and the CUDA
# context).
GPU_MEMORY_FRACTION = 0.9


# Device nodes an attached accelerator creates (what libtpu and the CUDA driver open):
# TPU v2-v4 /dev/accel<N>, TPU v5e/v5p/v6e /dev/vfio/<N> (an IOMMU group; /dev/vfio/vfio
# alone exists on hosts without one), NVIDIA /dev/nvidia<N> and /dev/nvidiactl, WSL's
# /dev/dxg, AMD's /dev/kfd.
ACCELERATOR_NODES = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*",
                     "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def gpu_compiler_options(environ: Mapping[str, str] = os.environ) -> dict[str, object]:
  """GPU_XLA_FLAGS as jax compiler options, for compiling a GPU step on a host without
  the GPU (--mode=compile): the program a run launched here would get. None where the
  user's XLA_FLAGS is set (it then applies to both, as to a run)."""
  if "XLA_FLAGS" in environ:
    return {}
  options = {}
  for flag, _ in GPU_XLA_FLAGS:
    name, _, value = flag.removeprefix("--").partition("=")
    options[name] = {"true": True, "false": False}.get(value, int(value) if value.isdigit()
                                                       else value)
  return options


def attached_accelerators(root: str = "") -> list[str]:
  """The accelerator device nodes present (under `root`, for tests); [] on a CPU-only host."""
  return sorted(path for pattern in ACCELERATOR_NODES for path in glob.glob(root + pattern))


def nvidia_gpus(root: str = "") -> list[str]:
  """The NVIDIA GPUs' device nodes (/dev/nvidia0, ...)."""
  return [p for p in attached_accelerators(root)
          if os.path.basename(p)[len("nvidia"):].isdigit() and "nvidia" in p]


def tpu_chips(root: str = "") -> list[str]:
  """The TPU chips' device nodes (/dev/accel0, ..., or /dev/vfio/N on v5e and later)."""
  return [p for p in attached_accelerators(root)
          if os.path.basename(os.path.dirname(p)) == "vfio" or "/accel" in p]


def memory_fraction(environ: Mapping[str, str] = os.environ) -> float:
  """The share of a GPU's memory a run launched here can use: XLA_PYTHON_CLIENT_MEM_FRACTION
  as the launcher leaves it (GPU_MEMORY_FRACTION where the user set none), or all of it
  when preallocation is off.

  Raises:
    ValueError: for a value that is not a fraction in (0, 1].
  """
  if environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() in ("false", "0"):
    return 1.0
  text = environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
  try:
    fraction = float(text) if text else GPU_MEMORY_FRACTION
  except ValueError:
    fraction = -1.0
  if not 0 < fraction <= 1:
    raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={text!r} is not a fraction in (0, 1]")
  return fraction


def configure_environment(environ: MutableMapping[str, str] = os.environ,
                          root: str = "") -> list[str]:
  """Sets the GPU defaults in `environ` where a GPU is attached and the user set none;
  returns one line per setting made (for the log). Must run before JAX starts."""
  if not nvidia_gpus(root) or environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
    return []
  made = []
  if "XLA_FLAGS" not in environ:
    environ["XLA_FLAGS"] = " ".join(flag for flag, _ in GPU_XLA_FLAGS)
    made.append(f"XLA_FLAGS={environ['XLA_FLAGS']} (the GPU defaults; set XLA_FLAGS, even "
                "empty, to choose your own)")
  if "XLA_PYTHON_CLIENT_MEM_FRACTION" not in environ:
    environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(GPU_MEMORY_FRACTION)
    made.append(f"XLA_PYTHON_CLIENT_MEM_FRACTION={GPU_MEMORY_FRACTION}")
  return made


def backend_mismatch(backend: str, environ: Mapping[str, str] = os.environ,
                     root: str = "") -> str | None:
  """The one-line error for a host with an accelerator whose JAX started on the CPU, or
  None. `JAX_PLATFORMS=cpu` means the CPU was asked for: no error."""
  if backend != "cpu" or environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
    return None
  gpus, tpus = nvidia_gpus(root), tpu_chips(root)
  if gpus:
    return (f"an NVIDIA GPU is attached ({gpus[0]}) but JAX started on the CPU: its CUDA "
            "plugin is missing or failed to load (log.txt has JAX's reason). Install it "
            "with `pip install -U \"jax[cuda12]\"` (the version of your jax), or set "
            "JAX_PLATFORMS=cpu to run on the CPU anyway")
  if tpus:
    return (f"a TPU is attached ({tpus[0]}) but JAX started on the CPU: libtpu is missing "
            "or failed to load (log.txt has JAX's reason). Install it with `pip install -U "
            "\"jax[tpu]\"`, or set JAX_PLATFORMS=cpu to run on the CPU anyway")
  return None


def local_device_ids(num_processes: int | None, environ: Mapping[str, str] = os.environ,
                     root: str = "") -> list[int] | None:
  """This process's GPU when several processes share a GPU host, one GPU each, else None
  (JAX's default: every local device).

  The process's rank on its host comes from the launcher that started it (torchrun's or
  SLURM's LOCAL_RANK / SLURM_LOCALID, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK); with
  CUDA_VISIBLE_DEVICES set the user has already chosen, and nothing is changed.
  """
  if not num_processes or num_processes < 2 or "CUDA_VISIBLE_DEVICES" in environ:
    return None
  gpus = nvidia_gpus(root)
  if len(gpus) < 2:
    return None
  for key in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
    if environ.get(key, "").isdigit():
      rank = int(environ[key])
      if rank < len(gpus):
        return [rank]
  return None


def platform_of_mesh() -> str:
  """The platform the computation being traced is for: the current mesh's devices (the
  compile-only devices of a deviceless TPU/GPU compile too), else JAX's default backend.
  "cpu", "gpu" (or "cuda"/"rocm"), "tpu"."""
  import jax  # pylint: disable=g-import-not-at-top  (this module is read before JAX starts)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    return mesh.abstract_device.platform
  return jax.default_backend()
