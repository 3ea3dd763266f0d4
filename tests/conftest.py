"""Shared test setup: 8 simulated CPU devices, strict rank promotion, tiny configs."""

import os
import sys

# Must happen before JAX initialises its backends: sharding code runs on 8 CPU "devices".
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(scope="session")
def tfds_data_dir(tmp_path_factory) -> str:
  """A TFDS data dir private to this test session (the stdlib dataset builds in ~2 s)."""
  return str(tmp_path_factory.mktemp("tensorflow_datasets"))


@pytest.fixture
def tiny_config(tfds_data_dir):
  """gpt_small:local shrunk to train a few steps in seconds on the real offline corpus."""
  from configs import gpt_small  # pylint: disable=g-import-not-at-top
  config = gpt_small.get_config("local")
  config.model.update(d_model=32, num_layers=2, num_heads=2, mlp_dim=64, max_len=32)
  config.data.update(data_dir=tfds_data_dir, seq_len=32, batch_size=8, num_threads=1)
  config.optimizer.update(warmup_steps=2, learning_rate=3e-3)
  config.train.update(num_steps=6, log_every=1, eval_every=3, eval_batches=2)
  config.checkpoint.update(every=3, keep=5)
  return config
