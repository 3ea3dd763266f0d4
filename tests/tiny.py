"""The tiny config shared by the tests and the multi-process worker."""

import os

import ml_collections

from configs import gpt_small


def make_tiny_config(data_dir: str) -> ml_collections.ConfigDict:
  """gpt_small:local shrunk to train a few steps in seconds on the real offline corpus."""
  config = gpt_small.get_config("local")
  config.model.update(d_model=32, num_layers=2, num_heads=2, mlp_dim=64, max_len=32)
  config.data.update(data_dir=data_dir, seq_len=32, batch_size=8, num_threads=1)
  config.optimizer.update(warmup_steps=2, learning_rate=3e-3)
  # One step per call (a row every step); test_train covers several.
  config.train.update(num_steps=6, log_every=1, eval_every=3, eval_batches=2,
                      steps_per_call=1)
  config.checkpoint.update(every=3, keep=5)
  return config


def get_config(data_dir: str = "") -> ml_collections.ConfigDict:
  """The tiny config for launch.py: `--config=tests/tiny.py:<data_dir>`."""
  return make_tiny_config(data_dir)


def subprocess_env(devices: int = 1, **extra: str) -> dict[str, str]:
  """The environment of a `python launch.py` (or worker) the tests start: CPU only,
  `devices` simulated CPU devices, and the tests' own XLA settings otherwise
  (tests/conftest.py: LLVM at -O0, which every test passes with); `extra` on top.

  A subprocess that kept XLA's default -O2 compiled the same tiny programs 1.5-2x slower
  (a sweep of two runs: 34 s), for nothing a test checks.
  """
  env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
  flags = [flag for flag in env.get("XLA_FLAGS", "").split()
           if not flag.startswith("--xla_force_host_platform_device_count")]
  if devices != 1:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  env["XLA_FLAGS"] = " ".join(flags)
  return env
