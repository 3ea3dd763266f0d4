"""Optimizer tests: the learning-rate schedules, their validation and AdamW's decay mask."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from configs import base
from transformer.training import optim
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.config.validation import validate
from transformer.model.models import make_model

jax.config.update("jax_numpy_rank_promotion", "raise")


def optimizer_config(**overrides):
  optimizer = base.get_config().optimizer
  optimizer.update(**overrides)
  return optimizer


def paper_lr(count: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
  """Vaswani et al. (2017), eq. 3, with the paper's 1-based step = optax count + 1."""
  step = count + 1
  return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def evaluate(schedule, counts):
  return np.asarray(jax.vmap(schedule)(jnp.asarray(counts)))


NUM_STEPS = 10_000  # train.num_steps, which only the cosine schedule reads.
COUNTS = np.array(sorted(set(range(0, 50)) | {99, 100, 398, 399, 400, 401, 1000, 12345, 10**6}))


@pytest.mark.parametrize("d_model, warmup, scale", [(512, 4000, 1.0), (64, 400, 2.0),
                                                    (256, 1, 1.0)])
def test_noam_schedule_is_the_paper_formula(d_model, warmup, scale):
  schedule = optim.make_schedule(
      optimizer_config(schedule="noam", warmup_steps=warmup, noam_scale=scale), d_model,
      NUM_STEPS)
  counts = np.concatenate([COUNTS, [warmup - 2, warmup - 1, warmup, 4 * warmup]])
  counts = counts[counts >= 0]
  expected = [paper_lr(c, d_model, warmup, scale) for c in counts]
  np.testing.assert_allclose(evaluate(schedule, counts), expected, rtol=1e-6)


@pytest.mark.parametrize("warmup", [2, 10, 400])
def test_warmup_rsqrt_is_continuous_and_peaks_at_warmup(warmup):
  peak = 3e-4
  schedule = optim.warmup_rsqrt_schedule(peak, warmup)
  counts = np.arange(0, 3 * warmup)
  values = evaluate(schedule, counts)
  # The peak is reached at the paper's step == warmup, i.e. optax count warmup - 1.
  assert int(np.argmax(values)) == warmup - 1
  np.testing.assert_allclose(values[warmup - 1], peak, rtol=1e-6)
  # Continuity at the boundary: neighbours differ by at most one warmup increment.
  before, at, after = values[max(warmup - 2, 0)], values[warmup - 1], values[warmup]
  assert abs(at - before) <= peak / warmup * (1 + 1e-5)
  assert abs(at - after) <= peak / warmup * (1 + 1e-5)
  # Linear ramp, then monotone decay as peak * sqrt(warmup / step).
  steps = counts + 1.0
  np.testing.assert_allclose(values[:warmup], peak * steps[:warmup] / warmup, rtol=1e-6)
  np.testing.assert_allclose(values[warmup:], peak * np.sqrt(warmup / steps[warmup:]),
                             rtol=1e-6)
  assert np.all(np.diff(values[:warmup]) > 0) and np.all(np.diff(values[warmup - 1:]) < 0)


@pytest.mark.parametrize("d_model, warmup", [(512, 4000), (32, 7)])
def test_noam_peak(d_model, warmup):
  peak = optim.noam_peak(1.5, d_model, warmup)
  assert peak == pytest.approx(paper_lr(warmup - 1, d_model, warmup, scale=1.5), rel=1e-12)
  assert peak == pytest.approx(max(paper_lr(c, d_model, warmup, 1.5)
                                   for c in range(3 * warmup)), rel=1e-12)
  schedule = optim.make_schedule(
      optimizer_config(schedule="noam", warmup_steps=warmup, noam_scale=1.5), d_model,
      NUM_STEPS)
  np.testing.assert_allclose(schedule(warmup - 1), peak, rtol=1e-6)


def test_no_warmup_is_rsqrt_decay_from_the_peak():
  peak = 1e-3
  schedule = optim.make_schedule(
      optimizer_config(schedule="warmup_rsqrt", learning_rate=peak, warmup_steps=0), 256,
      NUM_STEPS)
  counts = np.array([0, 1, 2, 3, 8, 99, 9999])
  np.testing.assert_allclose(evaluate(schedule, counts), peak / np.sqrt(counts + 1.0),
                             rtol=1e-6)


def test_constant_schedule():
  schedule = optim.make_schedule(optimizer_config(schedule="constant", learning_rate=2e-3), 64,
                                 NUM_STEPS)
  np.testing.assert_allclose(evaluate(schedule, [0, 10, 10**5]), 2e-3, rtol=1e-7)


def test_unknown_schedule_names_the_valid_ones():
  optimizer = optimizer_config()
  optimizer.schedule = "linear"
  with pytest.raises(ValueError, match="noam.*cosine"):
    optim.make_schedule(optimizer, 64, NUM_STEPS)


# ---------------------------------------------------------------- cosine


def cosine_lr(count: int, peak: float, floor: float, warmup: int, decay: int) -> float:
  """nanoGPT's get_lr with optax's 0-based warmup: 0 -> peak, cosine to the floor, flat."""
  if count < warmup:
    return peak * count / warmup
  if count >= decay:
    return floor
  progress = (count - warmup) / (decay - warmup)
  return floor + 0.5 * (1 + np.cos(np.pi * progress)) * (peak - floor)


@pytest.mark.parametrize("warmup, decay_steps, num_steps", [(10, 100, 500), (10, 0, 100),
                                                            (0, 50, 50)])
def test_cosine_schedule(warmup, decay_steps, num_steps):
  peak, floor = 6e-4, 6e-5
  schedule = optim.make_schedule(
      optimizer_config(schedule="cosine", learning_rate=peak, min_learning_rate=floor,
                       warmup_steps=warmup, decay_steps=decay_steps), 64, num_steps)
  decay = decay_steps or num_steps  # 0 means the decay ends at train.num_steps.
  counts = np.arange(0, decay + 20)
  values = evaluate(schedule, counts)
  np.testing.assert_allclose(values, [cosine_lr(c, peak, floor, warmup, decay) for c in counts],
                             rtol=1e-5, atol=1e-12)
  # Step 0: the warmup starts from 0; without warmup the decay starts at the peak.
  assert values[0] == (0.0 if warmup else pytest.approx(peak, rel=1e-6))
  # Continuous at the warmup boundary: the peak, neighbours one warmup increment away.
  np.testing.assert_allclose(values[warmup], peak, rtol=1e-6)
  if warmup:
    np.testing.assert_allclose(values[warmup - 1], peak * (warmup - 1) / warmup, rtol=1e-6)
  assert peak - values[warmup + 1] < peak / max(warmup, 1)
  # Mid-decay: exactly halfway between peak and floor (cos(pi/2) = 0).
  if (decay - warmup) % 2 == 0:
    np.testing.assert_allclose(values[(warmup + decay) // 2], (peak + floor) / 2, rtol=1e-5)
  assert np.all(np.diff(values[warmup:decay + 1]) < 0)
  # At and after decay_steps: flat at the floor.
  np.testing.assert_allclose(evaluate(schedule, [decay, decay + 1, 10 * decay]), floor,
                             rtol=1e-6)


def _cosine_config(**optimizer):
  config = base.get_config()
  config.optimizer.update(schedule="cosine", **optimizer)
  return config


def test_cosine_default_config_validates():
  validate(_cosine_config())  # decay_steps=0: the decay runs to train.num_steps.


@pytest.mark.parametrize("overrides, message", [
    (dict(decay_steps=-1),
     r"config\.optimizer\.decay_steps=-1 is invalid: expected an integer >= 0"),
    (dict(min_learning_rate=-1e-5),
     r"config\.optimizer\.min_learning_rate=-1e-05 is invalid: expected a float in "
     r"\[0, optimizer\.learning_rate=0\.001\]"),
    (dict(min_learning_rate=2e-3), r"min_learning_rate=0\.002 is invalid: .*learning_rate=0\.001"),
    (dict(warmup_steps=100, decay_steps=100),
     r"config\.optimizer\.decay_steps=100 is invalid: with optimizer\.schedule='cosine' the "
     r"decay must end after the warmup \(it counts the warmup too\): expected > "
     r"optimizer\.warmup_steps=100"),
    (dict(warmup_steps=100, decay_steps=0, num_steps=80),
     r"config\.train\.num_steps=80 is invalid: with optimizer\.schedule='cosine' and "
     r"optimizer\.decay_steps=0 .* expected > optimizer\.warmup_steps=100; set "
     r"train\.num_steps above 100, or lower the warmup \(e\.g\. "
     r"--config\.optimizer\.warmup_steps=8\)"),
])
def test_cosine_validation_names_the_key_and_what_is_valid(overrides, message):
  num_steps = overrides.pop("num_steps", None)
  config = _cosine_config(**overrides)
  if num_steps is not None:
    config.train.num_steps = num_steps
  with pytest.raises(ConfigError, match=message):
    validate(config)


# ---------------------------------------------------------------- weight decay


def model_params(**model):
  """The parameter tree of a tiny model (configs/base.py shrunk), filled with NumPy values."""
  config = base.get_config()
  config.model.update(vocab_size=64, d_model=32, num_layers=2, num_heads=4, mlp_dim=64,
                      max_len=16, activation="swiglu", tie_embeddings=False, **model)
  model = make_model(ModelConfig.from_config(config.model))
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens, tokens, tokens))
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) + 2.0, s.dtype),
                      shapes["params"])


def one_adamw_step_with_zero_gradients(params, lr, weight_decay, grad_clip_norm=1.0):
  config = optimizer_config(schedule="constant", learning_rate=lr, weight_decay=weight_decay,
                            grad_clip_norm=grad_clip_norm)
  tx = optim.make_optimizer(config, optim.make_schedule(config, 32, NUM_STEPS))

  @jax.jit
  def step(params):
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    return optax.apply_updates(params, updates)

  return step(params)


def flat(tree):
  return {jax.tree_util.keystr(path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("grad_clip_norm", [1.0, 0.0])
def test_adamw_decays_weights_and_never_biases_or_norm_scales(grad_clip_norm):
  lr, weight_decay = 0.1, 0.5
  params = model_params()
  new_params = flat(one_adamw_step_with_zero_gradients(params, lr, weight_decay,
                                                       grad_clip_norm))
  kinds = collections.Counter()
  for name, old in flat(params).items():
    new = new_params[name]
    if name.endswith("['bias']") or name.endswith("['scale']"):
      # Includes the 2-D [heads, head_dim] attention biases: a rank rule would decay them.
      np.testing.assert_array_equal(new, old, err_msg=name)
      kinds[f"kept_{old.ndim}d"] += 1
    else:
      # Zero gradients give a zero Adam step, so only the decoupled decay moves the weight.
      np.testing.assert_allclose(new, old * (1 - lr * weight_decay), rtol=1e-6, err_msg=name)
      kinds["decayed"] += 1
  assert kinds["decayed"] > 5 and kinds["kept_1d"] > 5 and kinds["kept_2d"] > 0


def test_t5_relative_bias_table_is_not_decayed():
  """Named "embedding", but an additive logit bias: kept, like every bias."""
  params = model_params(position="relative")
  new_params = flat(one_adamw_step_with_zero_gradients(params, 0.1, 0.5))
  tables = [name for name in flat(params) if "relative_bias" in name]
  assert tables == ["['relative_bias']['embedding']"]
  np.testing.assert_array_equal(new_params[tables[0]], flat(params)[tables[0]])
  token_table = "['embedder']['token_embed']['embedding']"
  np.testing.assert_allclose(new_params[token_table], flat(params)[token_table] * 0.95,
                             rtol=1e-6)
