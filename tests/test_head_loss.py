"""training/head_loss.py against a plain reference: the whole float32 logits, optax's
cross-entropy, argmax and JAX's own gradients.

The fused head computes the statistics in one pass and its gradient in the forward; the
reference below shares none of that code. Sums and both gradients (hidden states and
weight, and the logits bias) must match at 1 chunk and at 64, for every head layout
(tied, untied, bias, softcap), with label smoothing, z-loss and never_predict rows; in
bfloat16 the weight gradient's error must not grow with the chunk count (it is summed
in float32 across chunks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer.model.lm_head import LogitsHead
from transformer.training import head_loss
from transformer.training import metrics

ROWS, LENGTH, EMBED, VOCAB = 2, 128, 32, 256
OPTIONS = dict(label_smoothing=0.1, z_loss=1e-3, never_predict=(3, 200))


def reference_sums(weight, bias, x, targets, weights, *, tied, softcap, label_smoothing=0.0,
                   z_loss=0.0, never_predict=()):
  """The loss sums from the whole float32 logits, written the plain way."""
  equation = "BLE,VE->BLV" if tied else "BLE,EV->BLV"
  logits = jnp.einsum(equation, x.astype(jnp.float32), weight.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)
  if bias is not None:
    logits = logits + bias[None, None, :]
  if softcap:
    logits = softcap * jnp.tanh(logits / softcap)
  if never_predict:
    logits = logits.at[..., jnp.asarray(never_predict)].set(-1e9)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  allowed = jnp.ones(VOCAB).at[jnp.asarray(never_predict, jnp.int32)].set(0)
  smooth = -(jax.nn.log_softmax(logits) @ allowed) / jnp.sum(allowed)
  objective = (1 - label_smoothing) * nll + label_smoothing * smooth
  objective = objective + z_loss * jnp.square(jax.nn.logsumexp(logits, axis=-1))
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {"objective_sum": jnp.sum(objective * weights), "loss_sum": jnp.sum(nll * weights),
          "correct_sum": jnp.sum(correct * weights), "weight_sum": jnp.sum(weights)}


def _inputs(tied, bias, seed=0):
  rng = np.random.default_rng(seed)
  shape = (VOCAB, EMBED) if tied else (EMBED, VOCAB)
  weight = jnp.asarray(rng.normal(0, 0.5, shape), jnp.float32)
  bias_V = jnp.asarray(rng.normal(0, 0.5, VOCAB), jnp.float32) if bias else None
  x = jnp.asarray(rng.normal(0, 1.0, (ROWS, LENGTH, EMBED)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, VOCAB, (ROWS, LENGTH)), jnp.int32)
  targets = targets.at[0, :4].set(3)  # Targets on a never_predict row, weighted 0 below.
  weights = jnp.asarray(rng.random((ROWS, LENGTH)), jnp.float32).at[:, -5:].set(0.0)
  weights = weights.at[0, :4].set(0.0)
  return weight, bias_V, x, targets, weights


def _grads(fn, weight, bias_V, x):
  """(sums, d objective_sum / d (weight, bias, x))."""
  def objective(params):
    sums = fn(*params)
    return sums["objective_sum"], sums
  (_, sums), grads = jax.value_and_grad(objective, has_aux=True)((weight, bias_V, x))
  return sums, grads


def _fused(tied, cap, dtype, chunks, options, impl="xla"):
  def fn(weight, bias_V, x, targets, weights):
    head = LogitsHead(weight=weight, bias_V=bias_V, tied=tied, dtype=dtype, softcap=cap,
                      impl=impl)
    return metrics.head_loss_sums(head, x, targets, weights, chunk=LENGTH // chunks,
                                  logits_dtype="auto", **options)
  return fn


HEADS = [(True, False, 0.0), (False, True, 0.0), (False, False, 30.0), (True, True, 5.0)]


@pytest.mark.parametrize("tied,bias,cap", HEADS, ids=lambda v: str(v))
def test_float32_matches_the_reference_at_1_and_64_chunks(tied, bias, cap):
  weight, bias_V, x, targets, weights = _inputs(tied, bias)
  ref_sums, ref_grads = _grads(
      lambda w, b, h: reference_sums(w, b, h, targets, weights, tied=tied, softcap=cap,
                                     **OPTIONS), weight, bias_V, x)
  for chunks in (1, 64):
    fn = _fused(tied, cap, jnp.float32, chunks, OPTIONS)
    sums, grads = _grads(lambda w, b, h: fn(w, b, h, targets, weights), weight, bias_V, x)
    assert set(sums) == set(ref_sums) | {"z_loss_sum"}
    for key, value in ref_sums.items():
      np.testing.assert_allclose(sums[key], value, rtol=2e-6, err_msg=f"{key}, {chunks}")
    for name, a, b in zip(("weight", "bias", "x"), grads, ref_grads):
      if b is None:
        assert a is None
        continue
      assert a.dtype == b.dtype and a.shape == b.shape
      np.testing.assert_allclose(a, b, atol=2e-6, rtol=2e-5, err_msg=f"{name}, {chunks}")


@pytest.mark.parametrize("tied,cap,options,chunks,dtype", [
    (True, 0.0, {}, 1, jnp.float32),
    (False, 0.0, {}, 4, jnp.float32),
    (True, 5.0, OPTIONS, 4, jnp.float32),  # Label smoothing, z-loss, never_predict, cap.
    (False, 30.0, OPTIONS, 2, jnp.float32),
    (True, 0.0, {}, 4, jnp.bfloat16),
], ids=str)
def test_pallas_kernels_give_xlas_sums_and_gradients(tied, cap, options, chunks, dtype):
  """model.loss_head_impl='pallas' (head_pallas.py, Pallas's interpreter here): the logit
  gradient made inside the two matmuls, the weight's summed in place across chunks."""
  weight, _, x, targets, weights = _inputs(tied, False)
  runs = {impl: _grads(lambda w, b, h, impl=impl: _fused(tied, cap, dtype, chunks, options,
                                                          impl)(w, b, h, targets, weights),
                       weight, None, x) for impl in ("xla", "pallas")}
  (xla_sums, xla_grads), (sums, grads) = runs["xla"], runs["pallas"]
  for key, value in xla_sums.items():
    np.testing.assert_array_equal(sums[key], value, err_msg=key)  # The same forward.
  tolerance = 2e-6 if dtype == jnp.float32 else 1e-2
  for name, a, b in zip(("weight", "bias", "x"), grads, xla_grads):
    if b is None:
      assert a is None
      continue
    assert a.dtype == b.dtype and a.shape == b.shape, name
    assert float(jnp.max(jnp.abs(a - b))) <= tolerance * float(jnp.max(jnp.abs(b))), name


def test_pallas_head_refuses_a_logits_bias_by_name():
  weight, bias_V, x, targets, weights = _inputs(False, True)
  with pytest.raises(ValueError, match="model.loss_head_impl='pallas': a logits bias"):
    _fused(False, 0.0, jnp.float32, 1, {}, "pallas")(weight, bias_V, x, targets, weights)
  auto = _fused(False, 0.0, jnp.float32, 1, {}, "auto")(weight, bias_V, x, targets, weights)
  xla = _fused(False, 0.0, jnp.float32, 1, {}, "xla")(weight, bias_V, x, targets, weights)
  np.testing.assert_array_equal(auto["objective_sum"], xla["objective_sum"])


def _relative_error(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("tied", [True, False])
def test_bfloat16_error_does_not_grow_with_the_chunk_count(tied):
  """bf16 operands and logits: the weight gradient is summed in float32 across chunks, so
  its error against the float32 reference is the same at 64 chunks as at 1 (the head of
  before summed it in bfloat16: 3.6e-3 at 1 chunk, 9.4e-3 at 64 on gpt_small)."""
  weight, bias_V, x, targets, weights = _inputs(tied, True, seed=1)
  _, ref = _grads(lambda w, b, h: reference_sums(w, b, h, targets, weights, tied=tied,
                                                 softcap=0.0), weight, bias_V, x)
  errors = {}
  for chunks in (1, 64):
    fn = _fused(tied, 0.0, jnp.bfloat16, chunks, {})
    sums, grads = _grads(lambda w, b, h: fn(w, b, h, targets, weights), weight, bias_V, x)
    assert grads[0].dtype == jnp.float32  # The parameter's dtype, summed in float32.
    errors[chunks] = [_relative_error(a, b) for a, b in zip(grads, ref)]
  for name, one, many in zip(("weight", "bias", "x"), errors[1], errors[64]):
    assert one < 2e-2 and many < 2e-2, (name, errors)
    assert many < 1.25 * one + 1e-4, (name, errors)


def test_row_statistics_keep_argmax_ties_and_one_pass():
  """The first index of the largest logit decides accuracy, as jnp.argmax does."""
  logits = jnp.asarray([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
  stats = head_loss.row_statistics(logits, jnp.asarray([2, 0]), None)
  np.testing.assert_array_equal(stats["correct"], [0.0, 1.0])
  np.testing.assert_allclose(stats["lse"], jax.nn.logsumexp(logits, axis=-1), rtol=1e-6)
  np.testing.assert_allclose(stats["label"], [3.0, 2.0])


def test_only_the_objective_carries_a_gradient():
  weight, bias_V, x, targets, weights = _inputs(False, False)
  fn = _fused(False, 0.0, jnp.float32, 4, {})
  grad = jax.grad(lambda h: fn(weight, bias_V, h, targets, weights)["loss_sum"])(x)
  np.testing.assert_array_equal(grad, np.zeros_like(grad))  # Reported, not trained.


def test_given_logits_match_the_reference():
  """metrics.loss_sums (a classifier's or whole logits) shares the statistics and the
  gradient: against the reference on the same logits."""
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(0, 2, (ROWS, LENGTH, VOCAB)), jnp.float32)
  _, _, _, targets, weights = _inputs(False, False)
  eye = jnp.eye(VOCAB, dtype=jnp.float32)
  ref = lambda l: reference_sums(eye, None, l, targets, weights, tied=False, softcap=0.0,
                                 **OPTIONS)
  new = lambda l: metrics.loss_sums(l, targets, weights, **OPTIONS)
  for key, value in ref(logits).items():
    np.testing.assert_allclose(new(logits)[key], value, rtol=2e-6, err_msg=key)
  np.testing.assert_allclose(jax.grad(lambda l: new(l)["objective_sum"])(logits),
                             jax.grad(lambda l: ref(l)["objective_sum"])(logits),
                             atol=1e-6, rtol=1e-5)
