"""The GPU/TPU runtime settings: defaults only where an accelerator is attached and the
user set nothing, a CPU fallback on an accelerator host refused, one GPU per process."""

from __future__ import annotations

import os
import subprocess
import sys

from transformer import accelerator


def _fake_dev(tmp_path, *names):
  """A fake root holding dev/<name> for each name; the functions take it as `root`."""
  dev = tmp_path / "dev"
  dev.mkdir(parents=True)
  for name in names:
    path = dev / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
  return str(tmp_path)


def test_gpu_defaults_set_only_on_a_gpu_host_and_never_over_the_users(tmp_path):
  gpu_dev = _fake_dev(tmp_path, "nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")
  assert accelerator.nvidia_gpus(gpu_dev) == [os.path.join(gpu_dev, "dev", "nvidia0"),
                                              os.path.join(gpu_dev, "dev", "nvidia1")]
  assert accelerator.tpu_chips(gpu_dev) == []
  environ = {}
  made = accelerator.configure_environment(environ, root=gpu_dev)
  assert len(made) == 2
  assert environ["XLA_FLAGS"].split() == [f for f, _ in accelerator.GPU_XLA_FLAGS]
  assert float(environ["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == accelerator.GPU_MEMORY_FRACTION
  # The user's own settings win whole, an empty XLA_FLAGS included.
  mine = {"XLA_FLAGS": "", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
  assert accelerator.configure_environment(mine, root=gpu_dev) == []
  assert mine == {"XLA_FLAGS": "", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
  assert accelerator.memory_fraction(mine) == 0.5
  # No GPU, or the CPU asked for: nothing is set.
  for environ, root in (({}, _fake_dev(tmp_path / "cpu")), ({"JAX_PLATFORMS": "cpu"}, gpu_dev)):
    assert accelerator.configure_environment(environ, root=root) == [] and "XLA_FLAGS" not in environ


def test_memory_fraction_follows_the_runtime():
  assert accelerator.memory_fraction({}) == accelerator.GPU_MEMORY_FRACTION
  assert accelerator.memory_fraction({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}) == 1.0


def test_gpu_xla_flags_parse_in_this_xla():
  """An unknown flag in XLA_FLAGS aborts XLA at start-up; every default must parse."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=" ".join(f for f, _ in accelerator.GPU_XLA_FLAGS))
  done = subprocess.run([sys.executable, "-c", "import jax; print(jax.jit(lambda x: x + 1)(1))"],
                        env=env, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr[-2000:]
  env["XLA_FLAGS"] = "--xla_gpu_no_such_flag=true"  # The check above can fail.
  done = subprocess.run([sys.executable, "-c", "import jax; jax.jit(lambda x: x + 1)(1)"],
                        env=env, capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode != 0 and "Unknown flag" in done.stderr


def test_cpu_backend_on_an_accelerator_host_is_one_line(tmp_path):
  gpu_dev = _fake_dev(tmp_path / "g", "nvidia0")
  tpu_dev = _fake_dev(tmp_path / "t", "vfio/0", "vfio/vfio")
  message = accelerator.backend_mismatch("cpu", {}, root=gpu_dev)
  assert "NVIDIA GPU is attached" in message and "jax[cuda12]" in message
  assert "JAX_PLATFORMS=cpu" in message and "\n" not in message
  assert accelerator.tpu_chips(tpu_dev) == [os.path.join(tpu_dev, "dev", "vfio", "0")]
  assert "libtpu" in accelerator.backend_mismatch("cpu", {}, root=tpu_dev)
  assert accelerator.backend_mismatch("cpu", {"JAX_PLATFORMS": "cpu"}, root=gpu_dev) is None
  assert accelerator.backend_mismatch("gpu", {}, root=gpu_dev) is None
  assert accelerator.backend_mismatch("cpu", {}, root=_fake_dev(tmp_path / "c")) is None


def test_one_gpu_per_process_from_the_launchers_local_rank(tmp_path):
  dev = _fake_dev(tmp_path, *(f"nvidia{i}" for i in range(8)))
  assert accelerator.local_device_ids(8, {"LOCAL_RANK": "3"}, root=dev) == [3]
  assert accelerator.local_device_ids(8, {"SLURM_LOCALID": "7"}, root=dev) == [7]
  assert accelerator.local_device_ids(8, {"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, root=dev) == [0]
  # One process, a user's own CUDA_VISIBLE_DEVICES, no rank, a rank past the GPUs: JAX's default.
  assert accelerator.local_device_ids(1, {"LOCAL_RANK": "3"}, root=dev) is None
  assert accelerator.local_device_ids(8, {"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "3"},
                                      root=dev) is None
  assert accelerator.local_device_ids(8, {}, root=dev) is None
  assert accelerator.local_device_ids(16, {"LOCAL_RANK": "9"}, root=dev) is None
