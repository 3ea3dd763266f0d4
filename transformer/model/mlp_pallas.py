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
7 arrays of that size instead of 11 (gpt_small 32 x 1024: 201 MB each a layer). Gated
(swiglu, geglu: act(h) * gate, gate = x @ wi_gate + bg), the prologue reads both, and the
third kernel writes dh = dA * gate * act'(h) and dgate = dA * act(h): 14 arrays of [N, F]
instead of 17.

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

from transformer import accelerator
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


def pallas_call(kernel, name: str, out_shape, grid, in_specs, out_specs, interpret: bool,
                aliases: dict[int, int] | None = None):
  """pl.pallas_call with this module's launch settings. A matmul kernel's name ends in
  its product's M x N x K (`_32768x768x3072`): planning/hlo.py counts a Pallas matmul's
  FLOPs from it, since the HLO holds the kernel only as Triton IR. `aliases`: inputs
  whose buffers the outputs take (pallas_call's input_output_aliases)."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  return pl.pallas_call(
      kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
      input_output_aliases=aliases or {}, name=name, interpret=interpret,
      compiler_params=None if interpret else gpu_params())


def _load(ref, rows, cols, gated: bool) -> tuple[jax.Array, jax.Array | None]:
  """A block of h (and of the gate) as float32: gated, the ref holds [..., 2, F], h at 0
  and the gate at 1 of its middle axis (the joined projection's layout)."""
  if not gated:
    return ref[rows, cols].astype(_F32), None
  return ref[rows, 0, cols].astype(_F32), ref[rows, 1, cols].astype(_F32)


def _prologue(act, h, gate):
  """act(h), times the gate for a gated MLP; float32 blocks in, float32 out."""
  a = act(h)
  return a if gate is None else a * gate


def act_matmul(act_name: str, h_NF: jax.Array, w_FE: jax.Array, interpret: bool
               ) -> jax.Array:
  """act(h) @ w in h's dtype, the prologue applied to each [bm, bk] block of h as it is
  loaded. Gated, h is [N, 2, F] (h, gate) and the product is (act(h) * gate) @ w."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  act, gated = activation_of(act_name), h_NF.ndim == 3
  (N, F), E = (h_NF.shape[0], h_NF.shape[-1]), w_FE.shape[1]
  bm, bn, bk = tile(N), tile(E), tile(F, DEPTHS)

  def kernel(h_ref, w_ref, y_ref):
    def step(k, acc):
      cols = pl.ds(k * bk, bk)
      a = _prologue(act, *_load(h_ref, slice(None), cols, gated)).astype(w_ref.dtype)
      return acc + dot_f32(a, w_ref[cols, :], (1, 0))
    acc = jax.lax.fori_loop(0, F // bk, step, jnp.zeros((bm, bn), _F32))
    y_ref[...] = acc.astype(y_ref.dtype)

  h_spec = (pl.BlockSpec((bm, 2, F), lambda i, j: (i, 0, 0)) if gated
            else pl.BlockSpec((bm, F), lambda i, j: (i, 0)))
  return pallas_call(kernel, f"mlp_{act_name}_matmul_{N}x{E}x{F}",
                     jax.ShapeDtypeStruct((N, E), h_NF.dtype), (N // bm, E // bn),
                     [h_spec, pl.BlockSpec((F, bn), lambda i, j: (0, j))],
                     pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret)(h_NF, w_FE)


def act_t_matmul(act_name: str, h_NF: jax.Array, dy_NE: jax.Array, interpret: bool
                 ) -> jax.Array:
  """act(h)^T @ dy in float32 ([F, E]: wo's gradient), the same prologue as act_matmul."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  act, gated = activation_of(act_name), h_NF.ndim == 3
  (N, F), E = (h_NF.shape[0], h_NF.shape[-1]), dy_NE.shape[1]
  bm, bn, bk = tile(F), tile(E), tile(N, DEPTHS)

  def kernel(h_ref, dy_ref, dw_ref):
    def step(k, acc):
      rows = pl.ds(k * bk, bk)
      a = _prologue(act, *_load(h_ref, rows, slice(None), gated)).astype(dy_ref.dtype)
      return acc + dot_f32(a, dy_ref[rows, :], (0, 0))
    dw_ref[...] = jax.lax.fori_loop(0, N // bk, step, jnp.zeros((bm, bn), _F32))

  h_spec = (pl.BlockSpec((N, 2, bm), lambda i, j: (0, 0, i)) if gated
            else pl.BlockSpec((N, bm), lambda i, j: (0, i)))
  return pallas_call(kernel, f"mlp_{act_name}_matmul_t_{F}x{E}x{N}",
                     jax.ShapeDtypeStruct((F, E), _F32), (F // bm, E // bn),
                     [h_spec, pl.BlockSpec((N, bn), lambda i, j: (0, j))],
                     pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret)(h_NF, dy_NE)


def matmul_dact(act_name: str, dy_NE: jax.Array, w_FE: jax.Array, h_NF: jax.Array,
                interpret: bool) -> tuple[jax.Array, jax.Array]:
  """dh = (dy @ w^T) * act'(h) in h's dtype, and the float32 column sums of that rounded
  dh per block of rows ([N / bm, F]: their sum is wi's bias gradient). Gated (h
  [N, 2, F]), with dA = dy @ w^T: dh = dA * gate * act'(h) and dgate = dA * act(h),
  written as h is laid out ([N, 2, F]), their sums [N / bm, 2, F]."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  act, gated = activation_of(act_name), h_NF.ndim == 3
  (N, E), F = dy_NE.shape, w_FE.shape[0]
  bm, bn, bk = tile(N), tile(F), tile(E, DEPTHS)

  def kernel(dy_ref, w_ref, h_ref, dh_ref, sums_ref):
    def step(k, acc):
      cols = pl.ds(k * bk, bk)
      return acc + dot_f32(dy_ref[:, cols], w_ref[:, cols], (1, 1))
    da = jax.lax.fori_loop(0, E // bk, step, jnp.zeros((bm, bn), _F32))
    h, gate = _load(h_ref, slice(None), slice(None), gated)
    if not gated:
      dh = (da * _derivative(act, h)).astype(dh_ref.dtype)
      dh_ref[...] = dh
      sums_ref[...] = jnp.sum(dh.astype(_F32), axis=0, keepdims=True)
      return
    a, slope = jax.jvp(act, (h,), (jnp.ones_like(h),))
    for half, grad in enumerate((da * gate * slope, da * a)):
      rounded = grad.astype(dh_ref.dtype)
      dh_ref[:, half, :] = rounded
      sums_ref[:, half, :] = jnp.sum(rounded.astype(_F32), axis=0, keepdims=True)

  if gated:
    block = pl.BlockSpec((bm, 2, bn), lambda i, j: (i, 0, j))
    sums = (jax.ShapeDtypeStruct((N // bm, 2, F), _F32),
            pl.BlockSpec((1, 2, bn), lambda i, j: (i, 0, j)))
  else:
    block = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    sums = (jax.ShapeDtypeStruct((N // bm, F), _F32),
            pl.BlockSpec((1, bn), lambda i, j: (i, j)))
  return pallas_call(
      kernel, f"mlp_matmul_d{act_name}_{N}x{F}x{E}",
      (jax.ShapeDtypeStruct(h_NF.shape, h_NF.dtype), sums[0]), (N // bm, F // bn),
      [pl.BlockSpec((bm, E), lambda i, j: (i, 0)), pl.BlockSpec((bn, E), lambda i, j: (j, 0)),
       block], (block, sums[1]), interpret)(dy_NE, w_FE, h_NF)


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


# The activations the kernels compute (float32 in, float32 out): mlp.py's, the same
# functions; a gated one (act(x W) * x V) by the activation of its GATED entry.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu, "gelu": _gelu_exact, "gelu_tanh": _gelu_tanh, "silu": jax.nn.silu,
}
GATED = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def activation_of(act_name: str) -> Callable[[jax.Array], jax.Array]:
  """The float32 function of model.activation `act_name` (a gated one's activation)."""
  return ACTIVATIONS[GATED.get(act_name, act_name)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _mlp(act_name: str, dtype: jnp.dtype, interpret: bool, x_NE: jax.Array,
         wi_EF: jax.Array, bi_F: jax.Array | None, wg_EF: jax.Array | None,
         bg_F: jax.Array | None, wo_FE: jax.Array) -> jax.Array:
  return _mlp_fwd(act_name, dtype, interpret, x_NE, wi_EF, bi_F, wg_EF, bg_F, wo_FE)[0]


def _hidden(x_NE, wi_EF, bi_F, dtype):
  """x @ wi + bi, the bias added to the float32 product before its one rounding (XLA then
  adds it in the matmul's epilogue, as attention.biased_product says)."""
  h_NF = jnp.einsum("NE,EF->NF", x_NE, wi_EF.astype(dtype), preferred_element_type=_F32)
  return (h_NF if bi_F is None else h_NF + bi_F.astype(_F32)[None, :]).astype(dtype)


def _joined(wi_EF, bi_F, wg_EF, bg_F):
  """The projection's kernel [E, F] and bias, gated: wi and wi_gate side by side [E, 2F]
  (one matmul writes h and the gate as one [N, 2, F] array: with two, XLA's GPU compiler
  merges them into one and copies the halves out, two passes more)."""
  if wg_EF is None:
    return wi_EF, bi_F
  if bi_F is None and bg_F is None:
    return jnp.concatenate([wi_EF, wg_EF], axis=1), None
  zeros = jnp.zeros((wi_EF.shape[1],), _F32)  # One of the two without a bias.
  bias = jnp.concatenate([zeros if b is None else b.astype(_F32) for b in (bi_F, bg_F)])
  return jnp.concatenate([wi_EF, wg_EF], axis=1), bias


def _mlp_fwd(act_name, dtype, interpret, x_NE, wi_EF, bi_F, wg_EF, bg_F, wo_FE):
  w_EF, b_F = _joined(wi_EF, bi_F, wg_EF, bg_F)
  h_NF = _hidden(x_NE, w_EF, b_F, dtype)
  if wg_EF is not None:
    h_NF = h_NF.reshape(h_NF.shape[0], 2, -1)  # [N, 2, F]: h, gate.
  y_NE = act_matmul(act_name, h_NF, wo_FE.astype(dtype), interpret)
  return y_NE, (x_NE, wi_EF, bi_F, wg_EF, bg_F, wo_FE, h_NF)


def _mlp_bwd(act_name, dtype, interpret, residuals, dy_NE):
  x_NE, wi_EF, bi_F, wg_EF, bg_F, wo_FE, h_NF = residuals
  dy_NE = dy_NE.astype(dtype)
  dwo_FE = act_t_matmul(act_name, h_NF, dy_NE, interpret)
  dh_NF, sums = matmul_dact(act_name, dy_NE, wo_FE.astype(dtype), h_NF, interpret)
  dh_NF = dh_NF.reshape(dh_NF.shape[0], -1)  # Gated: [N, 2F], the joined kernel's columns.
  w_EF, _ = _joined(wi_EF, bi_F, wg_EF, bg_F)
  dw_EF = jnp.einsum("NE,NF->EF", x_NE, dh_NF, preferred_element_type=_F32)
  dx_NE = jnp.einsum("NF,EF->NE", dh_NF, w_EF.astype(dtype))
  db_F = jnp.sum(sums.reshape(sums.shape[0], -1), axis=0)
  F = wi_EF.shape[1]
  grads = []
  for w, b, part in ((wi_EF, bi_F, slice(0, F)), (wg_EF, bg_F, slice(F, 2 * F))):
    if w is None:
      grads += [None, None]
      continue
    grads += [dw_EF[:, part].astype(w.dtype), None if b is None else db_F[part].astype(b.dtype)]
  return (dx_NE.astype(x_NE.dtype), grads[0], grads[1], grads[2], grads[3],
          dwo_FE.astype(wo_FE.dtype))


_mlp.defvjp(_mlp_fwd, _mlp_bwd)


def mlp(act_name: str, x_NE: jax.Array, wi_EF: jax.Array, bi_F: jax.Array | None,
        wo_FE: jax.Array, dtype: jnp.dtype, interpret: bool,
        gate: tuple[jax.Array, jax.Array | None] | None = None) -> jax.Array:
  """act(x @ wi + bi) @ wo in `dtype` ([N, E]; wo's bias is the caller's), gated:
  (act(x @ wi + bi) * (x @ wg + bg)) @ wo, by the kernels above, differentiable (a
  custom VJP: every weight's gradient in its own dtype).

  Args:
    act_name: a key of ACTIVATIONS or GATED (model.activation).
    x_NE: the tokens, in `dtype`.
    wi_EF, bi_F, wo_FE: the MLP's weights as stored (bi_F None without biases).
    dtype: the compute dtype.
    interpret: run the kernels through Pallas's interpreter (a CPU).
    gate: (wg_EF, bg_F), wi_gate's weights, for a GATED activation.
  """
  if (gate is None) == (act_name in GATED):
    raise ValueError(f"model.activation={act_name!r} {'needs' if gate is None else 'takes no'}"
                     " gate weights")
  N, E = x_NE.shape
  F = wi_EF.shape[1]
  if E % ALIGN or F % ALIGN:
    raise ValueError(f"the Pallas MLP needs d_model ({E}) and mlp_dim ({F}) to be multiples "
                     f"of {ALIGN}; set model.mlp_impl='xla'")
  wg_EF, bg_F = gate or (None, None)
  run = functools.partial(_mlp, act_name, jnp.dtype(dtype), interpret)
  rows, shards, spread = token_shards(N)
  pad = -(N // shards) % ALIGN * shards  # Each shard's tokens a multiple of ALIGN.
  if pad:
    x_NE = jnp.pad(x_NE, ((0, pad), (0, 0)))
  if spread:
    from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
    # check_vma off, as splash.py's: pallas_call's outputs carry no varying-axes type.
    # The weights' cotangents are then summed over `rows` by shard_map's transpose.
    run = jax.shard_map(run, in_specs=(P(rows, None), P(), P(), P(), P(), P()),
                        out_specs=P(rows, None), check_vma=False)
  y_NE = run(x_NE, wi_EF, bi_F, wg_EF, bg_F, wo_FE)
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


GPU_PLATFORMS = ("gpu", "cuda")


def platform() -> str:
  """The platform being traced for (accelerator.platform_of_mesh: a compile-only GPU's
  too): "auto" takes the kernels on GPU_PLATFORMS, a CPU interprets them."""
  return accelerator.platform_of_mesh()


def uses_context() -> bool:
  """Whether the sequence is cut over context shards (the kernels need merged tokens)."""
  return not context.tokens_mergeable()
