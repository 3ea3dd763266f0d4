"""The dense MLP with its activation inside the matmuls: Pallas Triton kernels for GPUs.

model.mlp_impl="pallas" (and "auto" on a GPU where the MLP allows it: config/model.py's
`mlp_kernel`). XLA's GPU compiler writes act(h) between the `wi` and `wo` matmuls, and in
the backward writes the `wo` gradient dg before a pass of its own makes dh = dg * act'(h):
its Triton GEMM fusions take neither a float32 function of a stored operand before the
product nor a product times a function of another array after it (docs/performance.md,
"Fewer bytes"). Three kernels of our own do:

  forward   y = act(h) @ wo           act in the prologue: act(h) is never written
  backward  dwo = act(h)^T @ dy       the same prologue on the transposed operand
            dh = (dy @ wo^T) * act'(h) act' in the epilogue: dg is never written; the
                                      kernel also writes dh's column sums per row block,
                                      which make wi's bias gradient without a pass over dh

h = x @ wi + bi stays XLA's (the bias added in its epilogue, attention.biased_product),
as do wi's two backward matmuls. Per [N, F] activation, the forward and backward move
7 arrays of that size instead of 11 (gpt_small 32 x 1024: 201 MB each a layer).

Each kernel accumulates in float32, reads the activation's input in float32 and rounds
once to the compute dtype. On a CPU the kernels run through Pallas's interpreter, which
is how tests hold them to the XLA path. Tokens that no block size divides are padded to
one (rows of zeros, sliced off). Under a mesh the MLP runs in a `jax.shard_map` over the
tokens' batch axes with the weights whole (model.mlp_impl="pallas" is refused where the
rules shard the MLP's weights over a mesh axis: tensor parallelism needs XLA's).

Shape letters as in the package legend (transformer/model/__init__.py).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.model import context

# Block sizes, largest first: a tile of 128 x 128 with 64 along the contraction is what
# XLA's own Triton GEMMs mostly pick for matmuls this large on sm_90 (4 warps, 3 stages).
_TILES = (128, 64, 32, 16)
DEPTHS = (64, 32, 16)
ALIGN = 16  # d_model and mlp_dim must be multiples of it (config/model.py checks).
_WARPS, _STAGES = 4, 3
_F32 = jnp.float32


def tile(n: int, sizes: tuple[int, ...] = _TILES) -> int:
  """The largest of `sizes` that divides n (callers pad or check n to ALIGN first)."""
  for size in sizes:
    if n % size == 0:
      return size
  raise ValueError(f"{n} is not a multiple of {sizes[-1]}")


def _derivative(act: Callable[[jax.Array], jax.Array], h: jax.Array) -> jax.Array:
  """act'(h), elementwise, by forward-mode autodiff of act itself (no hand derivative)."""
  return jax.jvp(act, (h,), (jnp.ones_like(h),))[1]


def dot_f32(a: jax.Array, b: jax.Array, contract: tuple[int, int]) -> jax.Array:
  """a and b contracted over axis contract[0] of a and contract[1] of b, in float32."""
  return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())),
                             preferred_element_type=_F32)


def gpu_params():
  """The Triton launch settings of this module's kernels (and head_pallas.py's)."""
  from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top
  return plgpu.CompilerParams(num_warps=_WARPS, num_stages=_STAGES)


def pallas_call(kernel, name: str, out_shape, grid, in_specs, out_specs, interpret: bool):
  """pl.pallas_call with this module's launch settings. The kernel's name ends in its
  contraction length (`_k3072`): planning/hlo.py counts a Pallas matmul's FLOPs from it,
  since the HLO holds the kernel only as Triton IR."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  return pl.pallas_call(
      kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
      name=name, interpret=interpret, compiler_params=None if interpret else gpu_params())


def act_matmul(act_name: str, h_NF: jax.Array, w_FE: jax.Array, interpret: bool) -> jax.Array:
  """act(h) @ w in h's dtype, act applied to each [bm, bk] block of h as it is loaded."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  act = ACTIVATIONS[act_name]
  (N, F), E = h_NF.shape, w_FE.shape[1]
  bm, bn, bk = tile(N), tile(E), tile(F, DEPTHS)

  def kernel(h_ref, w_ref, y_ref):
    def step(k, acc):
      a = act(h_ref[:, pl.ds(k * bk, bk)].astype(_F32)).astype(w_ref.dtype)
      return acc + dot_f32(a, w_ref[pl.ds(k * bk, bk), :], (1, 0))
    acc = jax.lax.fori_loop(0, F // bk, step, jnp.zeros((bm, bn), _F32))
    y_ref[...] = acc.astype(y_ref.dtype)

  return pallas_call(kernel, f"mlp_{act_name}_matmul_k{F}",
               jax.ShapeDtypeStruct((N, E), h_NF.dtype), (N // bm, E // bn),
               [pl.BlockSpec((bm, F), lambda i, j: (i, 0)),
                pl.BlockSpec((F, bn), lambda i, j: (0, j))],
               pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret)(h_NF, w_FE)


def act_t_matmul(act_name: str, h_NF: jax.Array, dy_NE: jax.Array, interpret: bool
                 ) -> jax.Array:
  """act(h)^T @ dy in float32 ([F, E]: wo's gradient), the same prologue as act_matmul."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  act = ACTIVATIONS[act_name]
  (N, F), E = h_NF.shape, dy_NE.shape[1]
  bm, bn, bk = tile(F), tile(E), tile(N, DEPTHS)

  def kernel(h_ref, dy_ref, dw_ref):
    def step(k, acc):
      a = act(h_ref[pl.ds(k * bk, bk), :].astype(_F32)).astype(dy_ref.dtype)
      return acc + dot_f32(a, dy_ref[pl.ds(k * bk, bk), :], (0, 0))
    dw_ref[...] = jax.lax.fori_loop(0, N // bk, step, jnp.zeros((bm, bn), _F32))

  return pallas_call(kernel, f"mlp_{act_name}_matmul_t_k{N}", jax.ShapeDtypeStruct((F, E), _F32),
               (F // bm, E // bn),
               [pl.BlockSpec((N, bm), lambda i, j: (0, i)),
                pl.BlockSpec((N, bn), lambda i, j: (0, j))],
               pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret)(h_NF, dy_NE)


def matmul_dact(act_name: str, dy_NE: jax.Array, w_FE: jax.Array, h_NF: jax.Array,
                interpret: bool) -> tuple[jax.Array, jax.Array]:
  """(dy @ w^T) * act'(h) in h's dtype, and the float32 column sums of that rounded dh
  per block of rows ([N / bm, F]: their sum is wi's bias gradient)."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  act = ACTIVATIONS[act_name]
  (N, E), F = dy_NE.shape, w_FE.shape[0]
  bm, bn, bk = tile(N), tile(F), tile(E, DEPTHS)

  def kernel(dy_ref, w_ref, h_ref, dh_ref, sums_ref):
    def step(k, acc):
      return acc + dot_f32(dy_ref[:, pl.ds(k * bk, bk)], w_ref[:, pl.ds(k * bk, bk)], (1, 1))
    dg = jax.lax.fori_loop(0, E // bk, step, jnp.zeros((bm, bn), _F32))
    dh = (dg * _derivative(act, h_ref[...].astype(_F32))).astype(dh_ref.dtype)
    dh_ref[...] = dh
    sums_ref[...] = jnp.sum(dh.astype(_F32), axis=0, keepdims=True)

  return pallas_call(kernel, f"mlp_matmul_d{act_name}_k{E}",
               (jax.ShapeDtypeStruct((N, F), h_NF.dtype),
                jax.ShapeDtypeStruct((N // bm, F), _F32)),
               (N // bm, F // bn),
               [pl.BlockSpec((bm, E), lambda i, j: (i, 0)),
                pl.BlockSpec((bn, E), lambda i, j: (j, 0)),
                pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
               (pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
                pl.BlockSpec((1, bn), lambda i, j: (i, j))), interpret)(dy_NE, w_FE, h_NF)


def _gelu_tanh(x: jax.Array) -> jax.Array:
  return jax.nn.gelu(x, approximate=True)


# erf as XLA computes it in float32 (Eigen's rational fit on [-4, 4], odd numerator):
# Pallas's Triton lowering has no erf.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
          -7.37332916720468e-03, -1.42647390514189e-02)


def _erf(x: jax.Array) -> jax.Array:
  """erf(x) in float32 by XLA's own rational approximation (within 2e-7 of lax.erf)."""
  x = jnp.clip(x, -4.0, 4.0)
  x2 = x * x
  p = functools.reduce(lambda acc, c: acc * x2 + np.float32(c), _ERF_P[1:],
                       jnp.full_like(x2, _ERF_P[0]))
  q = functools.reduce(lambda acc, c: acc * x2 + np.float32(c), _ERF_Q[1:],
                       jnp.full_like(x2, _ERF_Q[0]))
  return x * p / q


def _gelu_exact(x: jax.Array) -> jax.Array:
  return 0.5 * x * (1.0 + _erf(x * np.float32(1 / np.sqrt(2))))


# The activations the kernels compute (float32 in, float32 out): mlp.py's ungated ones,
# the same functions. Gated MLPs (act(x W) * x V) keep XLA's path.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu, "gelu": _gelu_exact, "gelu_tanh": _gelu_tanh, "silu": jax.nn.silu,
}


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _mlp(act_name: str, dtype: jnp.dtype, interpret: bool, x_NE: jax.Array,
         wi_EF: jax.Array, bi_F: jax.Array | None, wo_FE: jax.Array) -> jax.Array:
  return _mlp_fwd(act_name, dtype, interpret, x_NE, wi_EF, bi_F, wo_FE)[0]


def _hidden(x_NE, wi_EF, bi_F, dtype):
  """x @ wi + bi, the bias added to the float32 product before its one rounding (XLA then
  adds it in the matmul's epilogue, as attention.biased_product says)."""
  h_NF = jnp.einsum("NE,EF->NF", x_NE, wi_EF.astype(dtype), preferred_element_type=_F32)
  return (h_NF if bi_F is None else h_NF + bi_F.astype(_F32)[None, :]).astype(dtype)


def _mlp_fwd(act_name, dtype, interpret, x_NE, wi_EF, bi_F, wo_FE):
  h_NF = _hidden(x_NE, wi_EF, bi_F, dtype)
  y_NE = act_matmul(act_name, h_NF, wo_FE.astype(dtype), interpret)
  return y_NE, (x_NE, wi_EF, bi_F, wo_FE, h_NF)


def _mlp_bwd(act_name, dtype, interpret, residuals, dy_NE):
  x_NE, wi_EF, bi_F, wo_FE, h_NF = residuals
  dy_NE = dy_NE.astype(dtype)
  dwo_FE = act_t_matmul(act_name, h_NF, dy_NE, interpret)
  dh_NF, sums = matmul_dact(act_name, dy_NE, wo_FE.astype(dtype), h_NF, interpret)
  dwi_EF = jnp.einsum("NE,NF->EF", x_NE, dh_NF, preferred_element_type=_F32)
  dx_NE = jnp.einsum("NF,EF->NE", dh_NF, wi_EF.astype(dtype))
  dbi = None if bi_F is None else jnp.sum(sums, axis=0).astype(bi_F.dtype)
  return (dx_NE.astype(x_NE.dtype), dwi_EF.astype(wi_EF.dtype), dbi,
          dwo_FE.astype(wo_FE.dtype))


_mlp.defvjp(_mlp_fwd, _mlp_bwd)


def mlp(act_name: str, x_NE: jax.Array, wi_EF: jax.Array, bi_F: jax.Array | None,
        wo_FE: jax.Array, dtype: jnp.dtype, interpret: bool) -> jax.Array:
  """act(x @ wi + bi) @ wo in `dtype` ([N, E]; wo's bias is the caller's), by the kernels
  above, differentiable (a custom VJP: wi's, bi's and wo's gradients in their own dtypes).

  Args:
    act_name: a key of ACTIVATIONS.
    x_NE: the tokens, in `dtype`.
    wi_EF, bi_F, wo_FE: the MLP's weights as stored (bi_F None without biases).
    dtype: the compute dtype.
    interpret: run the kernels through Pallas's interpreter (a CPU).
  """
  N, E = x_NE.shape
  F = wi_EF.shape[1]
  if E % ALIGN or F % ALIGN:
    raise ValueError(f"the Pallas MLP needs d_model ({E}) and mlp_dim ({F}) to be multiples "
                     f"of {ALIGN}; set model.mlp_impl='xla'")
  run = functools.partial(_mlp, act_name, jnp.dtype(dtype), interpret)
  rows, shards, spread = token_shards(N)
  pad = -(N // shards) % ALIGN * shards  # Each shard's tokens a multiple of ALIGN.
  if pad:
    x_NE = jnp.pad(x_NE, ((0, pad), (0, 0)))
  if spread:
    from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
    # check_vma off, as splash.py's: pallas_call's outputs carry no varying-axes type.
    # The weights' cotangents are then summed over `rows` by shard_map's transpose.
    run = jax.shard_map(run, in_specs=(P(rows, None), P(), P(), P()),
                        out_specs=P(rows, None), check_vma=False)
  y_NE = run(x_NE, wi_EF, bi_F, wo_FE)
  return y_NE[:N] if pad else y_NE


def token_shards(tokens: int) -> tuple[tuple[str, ...], int, bool]:
  """(the mesh axes `tokens` split over, their product, whether the kernels run in a
  shard_map over them). On one device, or with the tokens whole on every device, the
  kernels are called as they are (XLA then runs the custom call on whole operands)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return (), 1, False
  rows = _row_axes(tokens)
  shards = int(np.prod([mesh.shape[a] for a in rows], dtype=np.int64)) if rows else 1
  return rows, shards, shards > 1


def _row_axes(tokens: int) -> tuple[str, ...]:
  """The mesh axes the logical rules shard the batch over, when `tokens` split over them
  (else () and the tokens stay whole on every device, as context.operand_specs does)."""
  mesh = jax.sharding.get_abstract_mesh()
  spec = nn.logical_to_mesh_axes(("batch",))[0]
  names = spec if isinstance(spec, tuple) else (spec,) if spec else ()
  names = tuple(n for n in names if n in mesh.shape)
  size = int(np.prod([mesh.shape[n] for n in names], dtype=np.int64)) if names else 1
  return names if names and tokens % size == 0 else ()


def sharded_over(logical: tuple[str, ...]) -> tuple[str, ...]:
  """The mesh axes (of size > 1) the current rules shard these logical axes over."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return ()
  found = []
  for entry in nn.logical_to_mesh_axes(logical):
    names = entry if isinstance(entry, tuple) else (entry,) if entry else ()
    found += [n for n in names if n in mesh.shape and mesh.shape[n] > 1]
  return tuple(dict.fromkeys(found))


def weights_sharded() -> tuple[str, ...]:
  """The mesh axes the MLP's weights are sharded over: the kernels take them whole, so
  model.mlp_impl="pallas" is refused there and "auto" keeps XLA's MLP (mlp.py)."""
  return sharded_over(("embed", "mlp"))


def uses_context() -> bool:
  """Whether the sequence is cut over context shards (the kernels need merged tokens)."""
  return not context.tokens_mergeable()
