"""The loss head's logit gradient, elementwise: the one formula of XLA's head
(head_loss.py) and the Pallas kernels' (head_pallas.py), and the vocabulary mask it reads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def allowed_V(vocab: int, never_predict: tuple[int, ...]) -> jax.Array:
  """1.0 for the vocabulary rows the softmax may predict, 0.0 for never_predict's."""
  allowed = jnp.ones((vocab,), jnp.float32)
  if never_predict:
    allowed = allowed.at[jnp.asarray(never_predict, jnp.int32)].set(0.0)
  return allowed


def formula(l: jax.Array, index: jax.Array, targets: jax.Array, weights: jax.Array,
            lse: jax.Array, allowed: jax.Array | None, allowed_count, options,
            softcap: float) -> jax.Array:
  """d objective_sum / d logits on float32 logits `l` and their vocabulary ids `index`,
  the rest broadcast against them (per row: targets, weights, lse; per vocabulary id:
  allowed, None where the options do not read it). One formula for XLA's path
  (head_loss.logits_gradient) and the Pallas kernels' blocks (head_pallas.py); `options`
  is a head_loss.LossOptions."""
  p = jnp.exp(l - lse)
  if options.z_loss > 0:
    p = p * (1.0 + 2.0 * options.z_loss * lse)
  hit = jnp.where(index == targets, 1.0 - options.label_smoothing, 0.0)
  d = p - hit
  if options.label_smoothing > 0:
    d = d - options.label_smoothing * (allowed / allowed_count)
  if options.never_predict:
    d = d * allowed
  if softcap:
    d = d * (1.0 - jnp.square(l / softcap))
  return d * weights
