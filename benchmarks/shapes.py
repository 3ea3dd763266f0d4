"""The model shapes the benchmarks measure, and what they share: configs, batches, timing.

  tiny       nanoGPT's CPU recipe (configs/shakespeare_char.py:cpu at vocab 65): 4 layers,
             4 heads, d_model 128, context 64, batch 12
  local      configs/gpt_small.py:local: 4 layers, 4 heads, d_model 256, MLP 1024,
             context 128, batch 16, vocab 384
  gpt_small  configs/gpt_small.py at context 256, batch 8 (one micro-batch): 12 x 768,
             12 heads, MLP 3072, vocab 32768, dropout 0.1

Weights and tokens are random: only speed and memory are measured.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from configs import gpt_small, shakespeare_char
from transformer import sharding
from transformer.config import objective as objective_lib
from transformer.data.tokenizers import vocabularies
from transformer.model import objectives
from transformer.training import flops
from transformer.training import trainer as trainer_lib
# pylint: enable=g-import-not-at-top,wrong-import-position


def tiny() -> ml_collections.ConfigDict:
  config = shakespeare_char.get_config("cpu")
  config.model.vocab_size = 65
  return config


def local() -> ml_collections.ConfigDict:
  return gpt_small.get_config("local")


def gpt_small_256() -> ml_collections.ConfigDict:
  config = gpt_small.get_config()
  config.data.update(seq_len=256, batch_size=8)
  config.train.microbatches = 1
  return config


SHAPES: dict[str, Callable[[], ml_collections.ConfigDict]] = {
    "tiny": tiny, "local": local, "gpt_small": gpt_small_256}


def apply_overrides(config: ml_collections.ConfigDict, overrides: list[str]) -> None:
  """Sets "model.attention_impl=einsum"-style overrides, each cast to its key's type."""
  for override in overrides:
    key, sep, text = override.partition("=")
    parent, _, name = key.rpartition(".")
    node = config
    try:
      for part in filter(None, parent.split(".")):
        node = node[part]
      old = node[name]
    except (KeyError, AttributeError, TypeError):
      raise SystemExit(f"--set {override!r}: the config has no key {key!r} (every key is "
                       "in configs/base.py)") from None
    if not sep:
      raise SystemExit(f"--set {override!r}: expected KEY=VALUE, e.g. model.remat=full")
    if isinstance(old, bool):
      if text not in ("True", "False", "true", "false"):
        raise SystemExit(f"--set {override!r}: {key} is a bool: True or False")
      value = text in ("True", "true")
    else:
      try:
        value = type(old)(text)
      except ValueError:
        raise SystemExit(f"--set {override!r}: {key} needs a {type(old).__name__}, "
                         f"got {text!r}") from None
    node[name] = value


def describe(config: ml_collections.ConfigDict) -> str:
  m, d = config.model, config.data
  return (f"{m.num_layers} x {m.d_model}, {m.num_heads} heads, MLP {m.mlp_dim}, vocab "
          f"{m.vocab_size}, context {d.seq_len}, batch {d.batch_size}")


def platform_line() -> str:
  device = jax.devices()[0]
  return (f"JAX {jax.__version__}, {jax.device_count()} x {device.device_kind} "
          f"({device.platform}), {os.cpu_count()} CPU cores visible")


def make_trainer(config: ml_collections.ConfigDict) -> trainer_lib.Trainer:
  """The project's Trainer (jitted, donated train step) on all local devices, compiled
  for the rows random_batch makes (one document a row, no padding: cuDNN's plain call)."""
  rows = objective_lib.layout_of_batch(random_batch(config))
  return trainer_lib.Trainer.create(config, sharding.make_mesh(config.mesh), rows=rows)


def random_batch(config: ml_collections.ConfigDict, seed: int = 0) -> dict[str, np.ndarray]:
  """A full batch of random token ids with every field the objective reads."""
  objective = objective_lib.resolve(config.model)
  batch = objectives.init_batch(objective, config.data.batch_size, config.data.seq_len)
  rng = np.random.default_rng(seed)
  shape = (config.data.batch_size, config.data.seq_len)
  tokens = lambda: rng.integers(vocabularies.NUM_SPECIAL, config.model.vocab_size, shape,
                                dtype=np.int32)
  positions = np.broadcast_to(np.arange(shape[1], dtype=np.int32), shape).copy()
  for key in batch:
    if key.endswith("positions"):
      batch[key] = positions
    elif key in ("inputs", "decoder_inputs"):
      batch[key] = tokens()
  batch["targets"] = tokens()
  batch["weights"] = np.ones(shape, np.float32)
  return batch


def model_flops_per_step(config: ml_collections.ConfigDict, trainer: trainer_lib.Trainer) -> int:
  return flops.train_flops_per_step(trainer.model_config, config.data.batch_size,
                                    config.data.seq_len)


def matmul_size() -> int:
  """Large enough to run a device at its matmul rate; ~20 ms on 2 CPU cores."""
  return 1024 if jax.devices()[0].platform == "cpu" else 8192


def measure_matmul(repeats: int = 3) -> float:
  """FLOP/s of the reference matmul: float32 on CPU, bfloat16 on accelerators."""
  dtype = jnp.float32 if jax.devices()[0].platform == "cpu" else jnp.bfloat16
  return flops.measure_matmul_flops(matmul_size(), repeats=repeats, dtype=dtype)


def run_steps(train_step: Callable[..., tuple[Any, Any]], state: Any,
              batch: dict[str, jax.Array], steps: int) -> tuple[float, Any]:
  """Seconds per step of `steps` steps run as the training loop runs them.

  `train_step` is `Trainer.train_step` or its compiled executable. Step t is dispatched
  before step t-1's metrics are fetched, so the host stays a step ahead; the clock
  stops when the last step is done.
  """
  start = time.perf_counter()
  pending = None
  for _ in range(steps):
    state, metrics = train_step(state, batch)
    if pending is not None:
      jax.device_get(pending)
    pending = metrics
  jax.block_until_ready((state, pending))
  return (time.perf_counter() - start) / steps, state
