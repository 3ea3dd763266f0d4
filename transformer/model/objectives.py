"""What an objective feeds the model and scores: batch fields in, logits and targets out.

The objective itself (its fields, targets, sides, pipeline, what it may do) is one
entry of `transformer.config.objective.OBJECTIVES`, resolved once from (model.arch,
model.head); the functions here read that entry, so they need no change for a new
objective. Each takes the entry or its name.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from transformer.config import objective as objective_lib
from transformer.model import moe

Batch = dict[str, jax.Array]
ObjectiveLike = objective_lib.Objective | str


def model_inputs(objective: ObjectiveLike, batch: Batch) -> tuple[jax.Array, ...]:
  """The positional arguments of `model.apply` for this objective."""
  return tuple(batch[key] for key in objective_lib.get(objective).model_inputs)


def targets_and_weights(objective: ObjectiveLike, batch: Batch) -> tuple[jax.Array, jax.Array]:
  """What the logits are scored against, and each target's weight (0 = ignore)."""
  return batch[objective_lib.get(objective).target], batch["weights"]


def init_batch(objective: ObjectiveLike, batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
  """A batch of the right shapes and dtypes to initialise parameters with."""
  zeros = lambda *shape: np.zeros(shape, np.int32)
  ones = lambda *shape: np.ones(shape, np.int32)
  batch = {key: zeros(batch_size, seq_len) for key in objective_lib.get(objective).model_inputs}
  for key in ("segment_ids", "inputs_segment_ids", "targets_segment_ids"):
    if key in batch:
      batch[key] = ones(batch_size, seq_len)
  return batch


Forward = Callable[..., tuple[jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]]


def make_forward(model, objective: ObjectiveLike, hidden: bool = False) -> Forward:
  """forward(params, batch, rngs) -> (outputs, targets, weights, moe statistics).

  The outputs are the logits, or with `hidden` (for an objective that predicts the
  vocabulary) the pair (final hidden states, LogitsHead) that metrics.objective_sums
  projects a chunk at a time. The statistics are `moe.moe_metrics` of the MoE layers
  (aux_loss, z_loss, dropped_fraction, load), averaged over them; {} without MoE layers.
  """
  objective = objective_lib.get(objective)
  kwargs = {"hidden": True} if hidden and not objective.classifies else {}

  def forward(params, batch: Batch, rngs=None):
    logits, sown = model.apply({"params": params}, *model_inputs(objective, batch),
                               rngs=rngs, mutable=[moe.COLLECTION], **kwargs)
    targets, weights = targets_and_weights(objective, batch)
    return logits, targets, weights, moe.moe_metrics(sown)
  return forward
