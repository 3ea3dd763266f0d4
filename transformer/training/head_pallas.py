"""The loss head's two backward matmuls with the logit gradient made in their prologue:
Pallas Triton kernels for GPUs (model.loss_head_impl, "auto" on GPUs where it applies).

head_loss.py makes each chunk's logit gradient d (softmax minus the smoothed one-hot,
times the token weight) right after the chunk's statistics and feeds it to two matmuls:
dx = d @ W and dW = d^T @ x. On a GPU XLA writes d as a pass of its own (the logits read,
d written, [tokens, V] each) before the matmuls read it: its GEMM fusions take the
float32 exp(l - lse) of a stored operand in no prologue (docs/performance.md, "Fewer
bytes"). These kernels read the logits themselves and compute d block by block with
logit_gradient.formula, the same formula XLA's path uses, in float32, rounded once
to the compute dtype for the product: d is never written (gpt_small 32 x 1024: 537 MB
read and 537 MB written less per chunk of 8,192 tokens).

dW accumulates in float32 across chunks in the kernel (the running sum read and
written in place). Refused by `refusal` (and left to XLA's path by "auto"): a logits
bias (its gradient is d's column sums), a vocabulary or d_model that is no multiple of
16. Under a mesh the kernels run in a `jax.shard_map` over the tokens' batch axes, the
weight whole, dW's partial sums added over them (the all-reduce XLA's data-parallel
gradient takes too); a mesh that shards the head's weight is refused. On a CPU they run
through Pallas's interpreter (tests hold them to XLA's path).

Shape letters as in the package legend (transformer/model/__init__.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from transformer.model import mlp_pallas
from transformer.training import logit_gradient

_F32 = jnp.float32
ALIGN = mlp_pallas.ALIGN


def refusal(vocab: int, d_model: int, bias: bool) -> str | None:
  """Why these kernels cannot take a head of this shape; None when they can."""
  if bias:
    return "a logits bias (model.logits_bias) needs XLA's loss head"
  for name, size in (("the vocabulary", vocab), ("model.d_model", d_model)):
    if size % ALIGN:
      return f"{name} ({size}) is not a multiple of {ALIGN}"
  return None


def weight_sharded() -> tuple[str, ...]:
  """Mesh axes (size > 1) the rules shard the head's weight over ("vocab", "embed")."""
  return mlp_pallas.sharded_over(("vocab", "embed"))


def _dx(logits_NV, weight, lse_N, targets_N, weights_N, allowed_V, *, tied, dtype,
        options, softcap, count, interpret, dx_dtype) -> jax.Array:
  """d @ W ([N, E] in `dx_dtype`, accumulated in float32), d made from each [bm, bk]
  block of logits."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  N, V = logits_NV.shape
  E = weight.shape[1] if tied else weight.shape[0]
  bm, bn, bk = mlp_pallas.tile(N), mlp_pallas.tile(E), mlp_pallas.tile(V, mlp_pallas.DEPTHS)

  def kernel(l_ref, w_ref, lse_ref, t_ref, wt_ref, al_ref, dx_ref):
    lse, t, wt = (r[...][:, None] for r in (lse_ref, t_ref, wt_ref))

    def step(k, acc):
      cols = pl.ds(k * bk, bk)
      l = l_ref[:, cols].astype(_F32)
      index = k * bk + lax.broadcasted_iota(jnp.int32, (bm, bk), 1)
      d = logit_gradient.formula(l, index, t, wt, lse, al_ref[cols][None, :], count,
                                 options, softcap).astype(dtype)
      if tied:  # W [V, E]: rows k.
        return acc + mlp_pallas.dot_f32(d, w_ref[cols, :], (1, 0))
      return acc + mlp_pallas.dot_f32(d, w_ref[:, cols], (1, 1))
    dx_ref[...] = lax.fori_loop(0, V // bk, step, jnp.zeros((bm, bn), _F32)
                                ).astype(dx_ref.dtype)

  w_spec = (pl.BlockSpec((V, bn), lambda i, j: (0, j)) if tied
            else pl.BlockSpec((bn, V), lambda i, j: (j, 0)))
  row = pl.BlockSpec((bm,), lambda i, j: (i,))
  return mlp_pallas.pallas_call(
      kernel, f"loss_head_dx_{N}x{E}x{V}", jax.ShapeDtypeStruct((N, E), dx_dtype),
      (N // bm, E // bn),
      [pl.BlockSpec((bm, V), lambda i, j: (i, 0)), w_spec, row, row, row,
       pl.BlockSpec((V,), lambda i, j: (0,))],
      pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret)(
          logits_NV, weight, lse_N, targets_N, weights_N, allowed_V)


def _dw(logits_NV, x_NE, lse_N, targets_N, weights_N, allowed_V, total, *, tied, dtype,
        options, softcap, count, interpret) -> jax.Array:
  """total + d^T @ x ([V, E] tied, else x^T @ d [E, V]; float32), d made per block; the
  running total read and written in place (its buffer aliased to the output)."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  N, V = logits_NV.shape
  E = x_NE.shape[1]
  tile, depth = mlp_pallas.tile, mlp_pallas.DEPTHS
  bk = tile(N, depth)
  # The output's axes: (V, E) tied, (E, V) untied; `a` indexes its first, `b` its second.
  (A, ba), (B, bb) = ((V, tile(V)), (E, tile(E))) if tied else ((E, tile(E)), (V, tile(V)))
  bv = ba if tied else bb

  def kernel(l_ref, x_ref, lse_ref, t_ref, wt_ref, al_ref, total_ref, dw_ref):
    v0 = pl.program_id(0 if tied else 1) * bv

    def step(k, acc):
      rows = pl.ds(k * bk, bk)
      l = l_ref[rows, :].astype(_F32)
      index = v0 + lax.broadcasted_iota(jnp.int32, (bk, bv), 1)
      d = logit_gradient.formula(
          l, index, t_ref[rows][:, None], wt_ref[rows][:, None], lse_ref[rows][:, None],
          al_ref[...][None, :], count, options, softcap).astype(dtype)
      x = x_ref[rows, :]
      pair = (d, x) if tied else (x, d)
      return acc + mlp_pallas.dot_f32(*pair, (0, 0))
    dw_ref[...] = lax.fori_loop(0, N // bk, step, total_ref[...])

  v_index = (lambda i, j: (0, i)) if tied else (lambda i, j: (0, j))
  x_index = (lambda i, j: (0, j)) if tied else (lambda i, j: (0, i))
  x_block = bb if tied else ba
  row = pl.BlockSpec((N,), lambda i, j: (0,))
  return mlp_pallas.pallas_call(
      kernel, f"loss_head_dw_{A}x{B}x{N}", jax.ShapeDtypeStruct((A, B), _F32),
      (A // ba, B // bb),
      [pl.BlockSpec((N, bv), v_index), pl.BlockSpec((N, x_block), x_index), row, row, row,
       pl.BlockSpec((bv,), (lambda i, j: (i,)) if tied else (lambda i, j: (j,))),
       pl.BlockSpec((ba, bb), lambda i, j: (i, j))],
      pl.BlockSpec((ba, bb), lambda i, j: (i, j)), interpret, aliases={6: 0})(
          logits_NV, x_NE, lse_N, targets_N, weights_N, allowed_V, total)


def gradients(logits, x, weight, lse, targets, weights, dw_total, *, tied: bool, dtype,
              options, softcap: float, interpret: bool,
              dx_dtype) -> tuple[jax.Array, jax.Array]:
  """(dx in `dx_dtype` shaped as x, dw_total + this chunk's weight gradient in float32) of
  one chunk: logits [..., V], x [..., E], per token lse, targets and weights [...].

  `dw_total` is the running sum ([V, E] tied, [E, V] untied). Tokens are padded to a
  multiple of 16 with weight-0 rows (their d is 0)."""
  V = logits.shape[-1]
  E = x.shape[-1]
  allowed_V = logit_gradient.allowed_V(V, options.never_predict)
  count = float(V - len(set(options.never_predict)))  # Static: the kernels' constant.
  flat = [a.reshape((-1,) + a.shape[len(targets.shape):])
          for a in (logits, x, lse, targets, weights.astype(_F32))]
  N = flat[0].shape[0]
  rows, shards, spread = mlp_pallas.token_shards(N)
  pad = -(N // shards) % ALIGN * shards
  if pad:
    flat = [jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1)) for a in flat]
  kw = dict(tied=tied, dtype=dtype, options=options, softcap=softcap, interpret=interpret)

  def local(l, xs, s, t, w, weight, allowed, total):
    dx = _dx(l, weight, s, t, w, allowed, count=count, dx_dtype=dx_dtype, **kw)
    if not spread:  # One device, or all tokens on each: add in place.
      return dx, _dw(l, xs, s, t, w, allowed, total, count=count, **kw)
    part = _dw(l, xs, s, t, w, allowed, jnp.zeros_like(total), count=count, **kw)
    return dx, total + lax.psum(part, rows)

  run = local
  if spread:
    from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
    token = P(rows)
    run = jax.shard_map(
        local, in_specs=(P(rows, None), P(rows, None), token, token, token,
                         P(), P(), P()),
        out_specs=(P(rows, None), P()), check_vma=False)
  dx, dw = run(*flat, weight.astype(dtype), allowed_V, dw_total)
  return dx[:N].reshape(x.shape[:-1] + (E,)), dw
