"""AdamW with gradient clipping, the warmup + inverse-square-root family and cosine.

The paper's schedule, lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5),
is the warmup_rsqrt schedule with peak = scale * d_model^-0.5 * warmup^-0.5:
linear warmup to the peak at step == warmup, then peak * sqrt(warmup / step).
`step` counts from 1 as in the paper: the update with optax count c uses step c + 1.

The cosine schedule (nanoGPT's recipe) is optax's warmup_cosine_decay_schedule, which
counts from 0: lr is 0 at count 0, the peak at count == warmup_steps, and the floor
from count == decay_steps on.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import traverse_util

from transformer.model import lora as lora_lib


def warmup_rsqrt_schedule(peak: float, warmup_steps: int) -> optax.Schedule:
  """peak * min(step / warmup, sqrt(warmup / step)) with step = count + 1.

  With warmup_steps == 0 there is no warmup and the decay is peak / sqrt(step).
  """
  warmup = max(warmup_steps, 1)

  def schedule(count: jax.Array) -> jax.Array:
    step = jnp.asarray(count, jnp.float32) + 1.0
    ramp = step / warmup if warmup_steps > 0 else jnp.ones_like(step)
    return peak * jnp.minimum(ramp, jnp.sqrt(warmup / step))

  return schedule


def noam_peak(scale: float, d_model: int, warmup_steps: int) -> float:
  """The peak learning rate of the paper's schedule, reached at step == warmup."""
  return scale * d_model ** -0.5 * warmup_steps ** -0.5


def _noam(optimizer: ml_collections.ConfigDict, d_model: int, num_steps: int) -> optax.Schedule:
  del num_steps  # The paper's schedule never ends.
  peak = noam_peak(optimizer.noam_scale, d_model, optimizer.warmup_steps)
  return warmup_rsqrt_schedule(peak, optimizer.warmup_steps)


def _warmup_rsqrt(optimizer: ml_collections.ConfigDict, d_model: int,
                  num_steps: int) -> optax.Schedule:
  del d_model, num_steps  # The peak is optimizer.learning_rate; the decay never ends.
  return warmup_rsqrt_schedule(optimizer.learning_rate, optimizer.warmup_steps)


def _cosine(optimizer: ml_collections.ConfigDict, d_model: int, num_steps: int) -> optax.Schedule:
  del d_model
  # decay_steps counts the warmup too (optax's convention, nanoGPT's lr_decay_iters),
  # so the floor is reached at the same step whatever the warmup.
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=optimizer.learning_rate,
      warmup_steps=optimizer.warmup_steps,
      decay_steps=optimizer.decay_steps or num_steps,
      end_value=optimizer.min_learning_rate)


def _constant(optimizer: ml_collections.ConfigDict, d_model: int,
              num_steps: int) -> optax.Schedule:
  del d_model, num_steps
  return optax.constant_schedule(optimizer.learning_rate)


# optimizer.schedule -> its builder (optimizer block, d_model, train.num_steps); the names
# config/train.py's SCHEDULES validates (tests/test_config_registries.py holds them equal).
SCHEDULES = {
    "warmup_rsqrt": _warmup_rsqrt,
    "noam": _noam,
    "cosine": _cosine,
    "constant": _constant,
}


def make_schedule(optimizer: ml_collections.ConfigDict, d_model: int,
                  num_steps: int) -> optax.Schedule:
  """The learning-rate schedule named by `optimizer.schedule`, from SCHEDULES.

  Args:
    optimizer: the `config.optimizer` block.
    d_model: the model width (the noam schedule scales with d_model^-0.5).
    num_steps: the run's `train.num_steps`; the cosine decay ends there when
      `optimizer.decay_steps` is 0.

  Returns:
    A function from the optax step count (0 for the first update) to the rate.
  """
  if optimizer.schedule not in SCHEDULES:
    raise ValueError(f"config.optimizer.schedule={optimizer.schedule!r}; "
                     "valid: " + ", ".join(repr(name) for name in SCHEDULES))
  return SCHEDULES[optimizer.schedule](optimizer, d_model, num_steps)


# Parameter names that are weights (decayed); biases and norm scales are not, even
# when they have 2+ dims (the [heads, head_dim] attention biases).
DECAYED_NAMES = ("kernel", "embedding", "position_embed", "lora_a", "lora_b")
# Modules whose "embedding" is an additive attention-logit bias, not a token table: the
# T5 relative-position bias [buckets, heads]. It is not decayed, like every bias (T5
# itself trained with no weight decay at all).
UNDECAYED_MODULES = ("relative_bias",)


def decay_mask(params) -> object:
  """True for weight matrices and token/position embeddings; False for biases (the T5
  relative-position bias table included) and norm scales."""
  def is_weight(path, p):
    names = [str(getattr(k, "key", k)) for k in path]
    return (names[-1] in DECAYED_NAMES and jnp.ndim(p) >= 2
            and not any(n in UNDECAYED_MODULES for n in names))
  return jax.tree_util.tree_map_with_path(is_weight, params)


# With LoRA (model.lora_rank > 0) only the adapters train, and these top-level modules in
# full beside them: a classifier's head is new to a fine-tune (peft's modules_to_save).
TRAINED_WITH_ADAPTERS = ("classification_head",)


def split_trainable(params: dict, lora: bool) -> tuple[dict, dict]:
  """(trainable, frozen): the parameters the optimizer updates, and the rest.

  Without LoRA everything trains: (params, {}). With it, the trainable tree holds only
  the adapters (model/lora.py) and TRAINED_WITH_ADAPTERS, so the optimizer's state
  (Adam's moments) and the gradients exist for them alone; the frozen base parameters
  pass through a step untouched. Boxed leaves (nn.Partitioned) count as leaves.

  Args:
    params: the model's parameter tree (nested dicts).
    lora: whether model.lora_rank > 0.

  Returns:
    Two nested dicts whose leaves together are `params`'s (`join_trainable` undoes it).
  """
  if not lora:
    return params, {}
  trainable, frozen = {}, {}
  for path, leaf in traverse_util.flatten_dict(params).items():
    trains = lora_lib.is_adapter(path) or path[0] in TRAINED_WITH_ADAPTERS
    (trainable if trains else frozen)[path] = leaf
  return traverse_util.unflatten_dict(trainable), traverse_util.unflatten_dict(frozen)


def join_trainable(trainable: dict, frozen: dict) -> dict:
  """The whole parameter tree again from `split_trainable`'s two halves."""
  if not frozen:
    return trainable
  return traverse_util.unflatten_dict({**traverse_util.flatten_dict(frozen),
                                       **traverse_util.flatten_dict(trainable)})


def update_count(opt_state: Any) -> jax.Array:
  """The count the learning-rate schedule is evaluated at: updates applied so far.

  optax's scale_by_schedule keeps it; a skipped update (optimizer.skip_nonfinite)
  keeps the old optimizer state, so the count, unlike TrainState.step, does not move.
  """
  counts = [s.count for s in jax.tree_util.tree_leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
            if isinstance(s, optax.ScaleByScheduleState)]
  if len(counts) != 1:
    raise ValueError(f"expected one optax.ScaleByScheduleState in the optimizer state, "
                     f"found {len(counts)}")
  return counts[0]


def make_optimizer(optimizer: ml_collections.ConfigDict,
                   schedule: optax.Schedule) -> optax.GradientTransformation:
  """Global-norm clipping followed by AdamW (decay masked to >= 2-D weights)."""
  adamw = optax.adamw(schedule, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps,
                      weight_decay=optimizer.weight_decay, mask=decay_mask)
  if optimizer.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(optimizer.grad_clip_norm), adamw)
  return adamw
