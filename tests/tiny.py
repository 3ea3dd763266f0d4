"""The tiny config shared by the tests and the multi-process worker."""

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
