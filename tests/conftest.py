"""Shared test setup: 8 simulated CPU devices, strict rank promotion, tiny configs."""

import os
import sys

# Must happen before JAX initialises its backends: sharding code runs on 8 CPU "devices".
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(scope="session")
def tfds_data_dir(tmp_path_factory) -> str:
  """A TFDS data dir private to this test session (the stdlib dataset builds in ~2 s)."""
  return str(tmp_path_factory.mktemp("tensorflow_datasets"))


@pytest.fixture
def tiny_config(tfds_data_dir):
  """A fresh tiny config per test (tests mutate it)."""
  return make_tiny_config(tfds_data_dir)
