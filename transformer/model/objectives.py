"""Training objectives: which batch fields feed the model and which it must predict.

The objective follows from (model.arch, model.head), see
`config.model.OBJECTIVES`; the train and eval steps only call the functions here,
so a new objective is one entry in each table below.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from transformer.model import moe

Batch = dict[str, jax.Array]

# Batch fields passed to `model.apply`, in order.
MODEL_INPUTS: dict[str, tuple[str, ...]] = {
    "causal_lm": ("inputs", "segment_ids", "positions"),
    "masked_lm": ("inputs", "segment_ids", "positions"),
    "classification": ("inputs", "segment_ids", "positions"),
    "seq2seq": ("inputs", "inputs_segment_ids", "inputs_positions", "decoder_inputs",
                "targets_segment_ids", "targets_positions"),
}


def model_inputs(objective: str, batch: Batch) -> tuple[jax.Array, ...]:
  """The positional arguments of `model.apply` for this objective."""
  return tuple(batch[key] for key in MODEL_INPUTS[objective])


def targets_and_weights(objective: str, batch: Batch) -> tuple[jax.Array, jax.Array]:
  """What the logits are scored against, and each target's weight (0 = ignore)."""
  if objective == "classification":
    return batch["label"], batch["weights"]
  return batch["targets"], batch["weights"]


def init_batch(objective: str, batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
  """A batch of the right shapes and dtypes to initialise parameters with."""
  zeros = lambda *shape: np.zeros(shape, np.int32)
  ones = lambda *shape: np.ones(shape, np.int32)
  batch = {key: zeros(batch_size, seq_len) for key in MODEL_INPUTS[objective]}
  for key in ("segment_ids", "inputs_segment_ids", "targets_segment_ids"):
    if key in batch:
      batch[key] = ones(batch_size, seq_len)
  return batch


Forward = Callable[..., tuple[jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]]


def make_forward(model, objective: str) -> Forward:
  """forward(params, batch, rngs) -> (logits, targets, weights, moe statistics).

  The statistics are `moe.moe_metrics` of the MoE layers (aux_loss, z_loss,
  dropped_fraction, load), averaged over them; {} for a model without MoE layers.
  """
  def forward(params, batch: Batch, rngs=None):
    logits, sown = model.apply({"params": params}, *model_inputs(objective, batch),
                               rngs=rngs, mutable=[moe.COLLECTION])
    targets, weights = targets_and_weights(objective, batch)
    return logits, targets, weights, moe.moe_metrics(sown)
  return forward
