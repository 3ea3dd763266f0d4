"""The loss head: the vocabulary projection and the cross-entropy, a chunk of tokens at a
time, with a VJP of its own.

What it computes is metrics.loss_sums of `head(x)` (the sums, the same gradients); how:

- **One pass over each chunk's logits for every statistic.** The logits of a chunk
  ([rows, c, V], the matmul accumulated in float32, stored in `logits_dtype`) are read
  by one variadic reduction that carries the running max, the first index of the max
  (accuracy, argmax's tie rule), the sum of exp (online, rescaled as the max moves),
  the target's logit (no gather) and, with label smoothing, the sum of the allowed
  logits.
- **The gradient is made in the forward, never by recomputation.** When the loss is
  differentiated, each chunk's logit gradient (softmax minus the smoothed one-hot,
  z-loss and softcap terms, times the token weight; no scatter: a compare with the
  vocabulary index) is formed in the compute dtype right after the statistics and fed
  to the two matmuls it needs: the hidden states' gradient (kept, [B, L, E]) and the
  weight's, accumulated in float32 across chunks (and the logits bias's). The
  backward pass only scales these by the incoming cotangent. Three matmuls of the
  head in all, as the step's FLOPs count them; a chunk's logits are never written
  twice nor held beyond their chunk.
- **Nothing of the unused half.** Not differentiated (evaluation), a chunk makes its
  statistics and stops.

Only `objective_sum` carries a gradient: the other sums (loss_sum, correct_sum, ...) are
reported metrics and leave through `lax.stop_gradient`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from transformer.training import head_pallas
from transformer.training import logit_gradient

# What an excluded row's logit becomes: finite (a pad target there, weighted 0, must
# give 0, not inf * 0 = nan) yet far enough below any real logit that exp() is 0.
EXCLUDED_LOGIT = -1e9
# The per-bucket arrays of the sums by position (a LossOptions.groups prefix): metrics
# reports them.
BY_POSITION_PREFIX = "by_position_"


@dataclasses.dataclass(frozen=True)
class LossOptions:
  """The static half of the loss: what it adds to the NLL and which sums it returns.

  label_smoothing: of the objective's cross-entropy (loss_sum stays the plain NLL).
  z_loss: PaLM's coefficient: the objective adds z_loss * log(Z)^2 per target token.
  never_predict: vocabulary rows left out of the softmax (model.never_predict).
  groups: (key prefix, count) per grouping of the tokens: also loss_sum, correct_sum and
    weight_sum per group, [count] arrays under prefix + the key; the group of each token
    is its id on the last axis of the group-ids array (`groups` in the functions below,
    [..., len(groups)], ids in [0, count)). Each token counts in one group of each
    grouping, so a grouping's sums add up to the totals exactly (by position:
    metrics.loss_sums' buckets; by tag: evaluation's sums per UL2 denoiser).
  """

  label_smoothing: float = 0.0
  z_loss: float = 0.0
  never_predict: tuple[int, ...] = ()
  groups: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class HeadSpec:
  """The static half of the head: its layout, compute and storage dtypes, softcap."""

  tied: bool  # Weight [V, E] (the token embedding), else [E, V].
  dtype: Any  # The matmuls' operands (the model's compute dtype).
  logits_dtype: Any  # A chunk's logits between the matmul and the reductions.
  softcap: float
  pallas: bool = False  # The backward's matmuls by head_pallas.py's kernels.
  interpret: bool = False  # Those kernels through Pallas's interpreter (a CPU).


def _allowed(vocab: int, options: "LossOptions") -> jax.Array | None:
  """logit_gradient.allowed_V where the loss reads it (never_predict, label smoothing),
  else None."""
  if options.never_predict or options.label_smoothing:
    return logit_gradient.allowed_V(vocab, options.never_predict)
  return None


def _along_vocab(v_V: jax.Array, ndim: int) -> jax.Array:
  """A [V] vector shaped to broadcast against [..., V] (strict rank promotion)."""
  return v_V.reshape((1,) * (ndim - 1) + v_V.shape)


def _combine(a, b):
  """Merges two partial row statistics (max, first index of the max, sum of exp(l - max),
  target logit, sum of allowed logits): associative and commutative, as XLA's reductions
  need."""
  a_max, a_index, a_sum, a_label, a_smooth = a
  b_max, b_index, b_sum, b_label, b_smooth = b
  top = jnp.maximum(a_max, b_max)
  index = jnp.where(a_max > b_max, a_index,
                    jnp.where(b_max > a_max, b_index, jnp.minimum(a_index, b_index)))
  # exp(max - top) without inf - inf: the side that holds the top scales by 1.
  scale = lambda m: jnp.where(m == top, 1.0, jnp.exp(m - top))
  return (top, index, a_sum * scale(a_max) + b_sum * scale(b_max), a_label + b_label,
          a_smooth + b_smooth)


def row_statistics(logits_NV: jax.Array, targets_N: jax.Array, allowed_V: jax.Array | None
                   ) -> dict[str, jax.Array]:
  """Per-row softmax statistics of logits [..., V] in one pass over them (float32).

  Returns lse (log-sum-exp), label (the target's logit), correct (1.0 where the first
  index of the largest logit is the target, argmax's rule) and, with `allowed_V`, the
  mean of the allowed logits (label smoothing's term).
  """
  axis = logits_NV.ndim - 1
  vocab = logits_NV.shape[axis]
  l = logits_NV.astype(jnp.float32)
  index = lax.broadcasted_iota(jnp.int32, l.shape, axis)
  label = jnp.where(index == targets_N[..., None], l, 0.0)
  smooth = l * _along_vocab(allowed_V, l.ndim) if allowed_V is not None else jnp.zeros_like(l)
  init = (jnp.float32(-jnp.inf), jnp.int32(vocab), jnp.float32(0), jnp.float32(0),
          jnp.float32(0))
  top, first, sum_exp, label, smooth = lax.reduce(
      (l, index, jnp.ones_like(l), label, smooth), init, _combine, (axis,))
  stats = {"lse": top + jnp.log(sum_exp), "label": label,
           "correct": (first == targets_N).astype(jnp.float32)}
  if allowed_V is not None:
    stats["mean_allowed"] = smooth / jnp.sum(allowed_V)
  return stats


def token_terms(stats: dict[str, jax.Array], options: LossOptions
                ) -> dict[str, jax.Array]:
  """Per-token nll, objective and z-loss term from row_statistics."""
  nll = stats["lse"] - stats["label"]
  objective = nll
  if options.label_smoothing > 0:
    # (1 - eps) * NLL + eps * mean over the predictable rows of -log p.
    eps = options.label_smoothing
    objective = (1.0 - eps) * nll + eps * (stats["lse"] - stats["mean_allowed"])
  terms = {"nll": nll, "objective": objective}
  if options.z_loss > 0:
    terms["z"] = options.z_loss * jnp.square(stats["lse"])
    terms["objective"] = objective + terms["z"]
  return terms


def sums_of(stats: dict[str, jax.Array], weights: jax.Array, groups: jax.Array,
            options: LossOptions) -> dict[str, jax.Array]:
  """The token-weighted sums (metrics.loss_sums' keys) of one chunk's statistics."""
  terms = token_terms(stats, options)
  weights = weights.astype(jnp.float32)
  sums = {"objective_sum": jnp.sum(terms["objective"] * weights),
          "loss_sum": jnp.sum(terms["nll"] * weights),
          "correct_sum": jnp.sum(stats["correct"] * weights),
          "weight_sum": jnp.sum(weights)}
  if options.z_loss > 0:
    sums["z_loss_sum"] = jnp.sum(terms["z"] * weights)
  for index, (prefix, count) in enumerate(options.groups):
    group_N = groups[..., index].ravel()
    per_group = lambda values, ids=group_N, count=count: jax.ops.segment_sum(
        values.ravel(), ids, num_segments=count)
    sums.update({prefix + "loss_sum": per_group(terms["nll"] * weights),
                 prefix + "correct_sum": per_group(stats["correct"] * weights),
                 prefix + "weight_sum": per_group(weights)})
  return sums


def logits_gradient(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                    stats: dict[str, jax.Array], allowed_V: jax.Array | None,
                    options: LossOptions, softcap: float) -> jax.Array:
  """d objective_sum / d logits before the softcap (float32), elementwise.

  w * (p * (1 + 2 z lse) - (1 - eps) onehot - eps allowed / n) on the allowed rows,
  0 on never_predict's; times 1 - (l / cap)^2 under a softcap.
  """
  l = logits.astype(jnp.float32)
  index = lax.broadcasted_iota(jnp.int32, l.shape, l.ndim - 1)
  allowed = None if allowed_V is None else _along_vocab(allowed_V, l.ndim)
  return logit_gradient.formula(l, index, targets[..., None],
                                weights.astype(jnp.float32)[..., None], stats["lse"][..., None],
                                allowed, None if allowed_V is None else jnp.sum(allowed_V),
                                options, softcap)


def project(weight: jax.Array, bias_V: jax.Array | None, x: jax.Array, spec: HeadSpec,
            allowed_V: jax.Array | None) -> jax.Array:
  """Logits [..., V] of x [..., E] in spec.logits_dtype: the operands in spec.dtype, the
  product accumulated in float32, then the bias, the softcap and never_predict's rows."""
  equation = "...E,VE->...V" if spec.tied else "...E,EV->...V"
  logits = jnp.einsum(equation, x.astype(spec.dtype), weight,
                      preferred_element_type=jnp.float32)
  if bias_V is not None:
    logits = logits + _along_vocab(bias_V.astype(jnp.float32), logits.ndim)
  if spec.softcap:  # Gemma 2: cap * tanh(logits / cap).
    logits = spec.softcap * jnp.tanh(logits / spec.softcap)
  if allowed_V is not None:
    logits = jnp.where(_along_vocab(allowed_V > 0, logits.ndim), logits, EXCLUDED_LOGIT)
  return logits.astype(spec.logits_dtype)


def _chunk(weight, bias_V, x, targets, weights, groups, dw_total=None, *, spec: HeadSpec,
           options: LossOptions, allowed_V, grad: bool):
  """One chunk's sums; with `grad` also d/dx (x's dtype), d/dweight and d/dbias (f32).
  With spec.pallas, d/dweight is `dw_total` plus this chunk's (the kernel adds it)."""
  logits = project(weight, bias_V, x, spec, allowed_V if options.never_predict else None)
  stats = row_statistics(logits, targets, allowed_V if options.label_smoothing else None)
  sums = sums_of(stats, weights, groups, options)
  if not grad:
    return sums
  if spec.pallas:  # d is made inside the two matmuls, never written (head_pallas.py).
    dx, dw = head_pallas.gradients(logits, x.astype(spec.dtype), weight, stats["lse"],
                                   targets, weights, dw_total, tied=spec.tied,
                                   dtype=spec.dtype, options=options, softcap=spec.softcap,
                                   interpret=spec.interpret, dx_dtype=x.dtype)
    return sums, dx, dw, None
  d = logits_gradient(logits, targets, weights, stats, allowed_V, options, spec.softcap)
  d_bias = jnp.sum(d, axis=tuple(range(d.ndim - 1))) if bias_V is not None else None
  d = d.astype(spec.dtype)
  if spec.tied:
    dx = jnp.einsum("...V,VE->...E", d, weight, preferred_element_type=jnp.float32)
    dw = jnp.einsum("...V,...E->VE", d, x.astype(spec.dtype),
                    preferred_element_type=jnp.float32)
  else:
    dx = jnp.einsum("...V,EV->...E", d, weight, preferred_element_type=jnp.float32)
    dw = jnp.einsum("...E,...V->EV", x.astype(spec.dtype), d,
                    preferred_element_type=jnp.float32)
  return sums, dx.astype(x.dtype), dw, d_bias


def _scan(weight, bias_V, chunks, *, spec, options, allowed_V, grad):
  """The chunks ([n, ...] each) walked by lax.scan: the sums added, and with `grad` the
  hidden-state gradients stacked and the weight's (and bias's) added in float32."""
  first = jax.tree.map(lambda a: a[0], chunks)
  run = functools.partial(_chunk, weight, bias_V, spec=spec, options=options,
                          allowed_V=allowed_V, grad=grad)
  shapes = jax.eval_shape(functools.partial(run, dw_total=_weight_zeros(weight))
                          if spec.pallas else run, *first)
  if not grad:
    zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(total, xs):
      return jax.tree.map(jnp.add, total, run(*xs)), None
    return lax.scan(body, zero, chunks)[0]
  sums_shape, _, dw_shape, db_shape = shapes
  zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (sums_shape, dw_shape, db_shape))

  def body(total, xs):
    if spec.pallas:  # The kernel adds the chunk's weight gradient to the running sum.
      sums, dx, dw, db = run(*xs, total[1])
      return (jax.tree.map(jnp.add, total[0], sums), dw, db), dx
    sums, dx, dw, db = run(*xs)
    return jax.tree.map(jnp.add, total, (sums, dw, db)), dx
  (sums, dw, db), dx = lax.scan(body, zero, chunks)
  return sums, dx, dw, db


def _weight_zeros(weight: jax.Array) -> jax.Array:
  """A float32 zero sum of the weight's gradient, the Pallas kernels' first total."""
  return jnp.zeros(weight.shape, jnp.float32)


@functools.lru_cache(maxsize=None)
def _loss_fn(spec: HeadSpec, options: LossOptions, layout: tuple):
  """The head loss as a jax.custom_vjp for one static (head, loss, chunk layout).

  layout: (B, L, p, c, n, pad): rows, length, context shards, positions a shard per
  chunk, chunks, padding positions a shard (see head_loss_sums).
  """
  B, L, p, c, n, pad = layout

  def chunked(a):  # [B, L, ...] -> [n, B, p * c, ...]: chunk j is c positions a shard.
    a = a.reshape((B, p, L // p) + a.shape[2:])
    a = jnp.pad(a, ((0, 0), (0, 0), (0, pad)) + ((0, 0),) * (a.ndim - 3))
    a = jnp.moveaxis(a.reshape((B, p, n, c) + a.shape[3:]), 2, 0)
    return a.reshape((n, B, p * c) + a.shape[4:])

  def unchunked(a):  # chunked's inverse, the padding dropped.
    a = a.reshape((n, B, p, c) + a.shape[3:])
    a = jnp.moveaxis(a, 0, 2).reshape((B, p, n * c) + a.shape[4:])
    return a[:, :, :L // p].reshape((B, L) + a.shape[3:])

  def allowed(weight):
    vocab = weight.shape[0] if spec.tied else weight.shape[1]
    return _allowed(vocab, options)

  def run(weight, bias_V, x, targets, weights, groups, grad):
    w = weight.astype(spec.dtype)  # Once, not once per chunk.
    if n == 1:
      return _chunk(w, bias_V, x, targets, weights, groups,
                    _weight_zeros(weight) if spec.pallas else None, spec=spec,
                    options=options, allowed_V=allowed(weight), grad=grad)
    # Every chunk reads the weight whole: gathered over the embed axis once (an
    # fsdp-sharded table would otherwise be all-gathered in every chunk: 504 GiB a step
    # for llama 1B at 32k tokens on v5p:2x2x1).
    w = nn.with_logical_constraint(w, ("vocab", None) if spec.tied else (None, "vocab"))
    out = _scan(w, bias_V, tuple(map(chunked, (x, targets, weights, groups))),
                spec=spec, options=options, allowed_V=allowed(weight), grad=grad)
    if grad:
      sums, dx, dw, db = out
      return sums, unchunked(dx), dw, db
    return out

  @jax.custom_vjp
  def loss(weight, bias_V, x, targets, weights, groups):
    return run(weight, bias_V, x, targets, weights, groups, grad=False)

  def forward(weight, bias_V, x, targets, weights, groups):
    sums, dx, dw, db = run(weight, bias_V, x, targets, weights, groups, grad=True)
    return sums, (dx, dw.astype(weight.dtype),
                  db.astype(bias_V.dtype) if bias_V is not None else None)

  def backward(residuals, cotangents):
    dx, dw, db = residuals
    g = cotangents["objective_sum"]  # The other sums leave through stop_gradient.
    scale = lambda a: None if a is None else (a * g.astype(a.dtype))
    return scale(dw), scale(db), scale(dx), None, None, None

  loss.defvjp(forward, backward)
  return loss


def head_loss(weight: jax.Array, bias_V: jax.Array | None, x_BLE: jax.Array,
              targets_BL: jax.Array, weights_BL: jax.Array, groups_BLG: jax.Array,
              *, spec: HeadSpec, options: LossOptions, layout: tuple
              ) -> dict[str, jax.Array]:
  """The loss sums of the head on x, chunked as `layout` says; only objective_sum is
  differentiable (see the module docstring). `groups_BLG`: each token's group ids, one
  per options.groups (G may be 0)."""
  with jax.named_scope("loss_head"):  # Where planning/kernels.py finds its kernels.
    sums = _loss_fn(spec, options, layout)(weight, bias_V, x_BLE, targets_BL, weights_BL,
                                           groups_BLG)
  return {k: v if k == "objective_sum" else lax.stop_gradient(v) for k, v in sums.items()}


@functools.lru_cache(maxsize=None)
def _logits_loss_fn(options: LossOptions):
  """logits_loss as a jax.custom_vjp for one static options."""

  def statistics(logits, targets):
    allowed_V = _allowed(logits.shape[-1], options)
    if options.never_predict:
      logits = jnp.where(_along_vocab(allowed_V > 0, logits.ndim), logits.astype(jnp.float32),
                         EXCLUDED_LOGIT)
    return logits, allowed_V, row_statistics(
        logits, targets, allowed_V if options.label_smoothing else None)

  @jax.custom_vjp
  def loss(logits, targets, weights, groups):
    _, _, stats = statistics(logits, targets)
    return sums_of(stats, weights, groups, options)

  def forward(logits, targets, weights, groups):
    masked, allowed_V, stats = statistics(logits, targets)
    d = logits_gradient(masked, targets, weights, stats, allowed_V, options, softcap=0.0)
    return sums_of(stats, weights, groups, options), d.astype(logits.dtype)

  def backward(d, cotangents):
    return d * cotangents["objective_sum"].astype(d.dtype), None, None, None

  loss.defvjp(forward, backward)
  return loss


def logits_loss(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                groups: jax.Array, options: LossOptions) -> dict[str, jax.Array]:
  """The loss sums of given logits [..., V] (a classifier's, or a whole sequence's):
  the same statistics and gradient as head_loss; only objective_sum is differentiable.
  `groups`: each target's group ids [..., len(options.groups)]."""
  with jax.named_scope("loss_head"):
    sums = _logits_loss_fn(options)(logits, targets, weights, groups)
  return {k: v if k == "objective_sum" else lax.stop_gradient(v) for k, v in sums.items()}
