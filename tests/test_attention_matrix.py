"""The reference matrix: every attention path that runs on a CPU against the einsum
reference, outputs and gradients, over the mask kinds the model produces and the mesh
layouts a run uses (8 simulated CPU devices, tests/conftest.py).

A path is `model.attention_impl` on a mesh: einsum, xla and splash (Pallas's
interpreter on a CPU mesh) whole, and with a context axis their per-shard variants
(attention_ops.context_attention, splash.context_splash_attention) on the zig-zag order
the model feeds them. Each cell calls attention_ops.dot_product_attention under the
mesh and the base config's logical rules, exactly as MultiHeadAttention does, and holds
it to einsum_attention on one device: the output on real query rows, and the gradient
of a position-dependent scalar of it with respect to q, k, v (and the bias).

The default run takes a slice of cells (SLICE); the whole matrix is marked `matrix` and
`slow` (deselected by default, in CI's slow run), one command:

  python -m pytest tests/test_attention_matrix.py -m matrix -n 0 -q

Its last result is in docs/scaling.md ("The attention reference matrix"). cuDNN cannot
run on a CPU: its cells are skipped with that reason (`--mode=compile` and a GPU run
hold it to the reference there).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from configs import base
from transformer import sharding
from transformer.config import attention as attention_table
from transformer.model import attention_ops as ops
from transformer.model import context


@dataclasses.dataclass(frozen=True)
class Mask:
  """One mask kind the model produces."""
  causal: bool = True
  packed: bool = False  # Two documents in row 0.
  padded: bool = True  # Trailing padding (segment 0) in every row.
  window: int = 0
  cross: bool = False  # Keys of another sequence (kv length KV_LEN).
  kv_heads: int = 2  # Of 4 query heads: GQA; 4 MHA; 1 MQA.
  softcap: float = 0.0
  bias: bool = False  # An additive [1, H, L, S] bias (ALiBi's shape).


MASKS = {
    "causal": Mask(padded=False),
    "causal_packed": Mask(packed=True),
    "bidirectional_packed": Mask(causal=False, packed=True),
    "padding": Mask(causal=False),
    "window_causal": Mask(window=40, packed=True),
    "window_bidirectional": Mask(causal=False, window=40),
    "cross": Mask(causal=False, cross=True),
    "mha": Mask(packed=True, kv_heads=4),
    "mqa": Mask(packed=True, kv_heads=1),
    "softcap": Mask(packed=True, softcap=5.0),
    "bias": Mask(packed=True, bias=True),
}

# (data, fsdp, tensor, context) and the batch rows.
MESHES = {
    "one_device": ((1, 1, 1, 1), 2),
    "data": ((2, 1, 1, 1), 2),
    "fsdp": ((1, 2, 1, 1), 2),
    "tensor": ((1, 1, 2, 1), 2),
    "data_fsdp_tensor": ((2, 2, 2, 1), 4),
    "context": ((1, 1, 1, 2), 2),
    "data_context": ((2, 1, 1, 2), 2),
    "tensor_context": ((1, 1, 2, 2), 2),
    "init_row": ((2, 1, 1, 1), 1),  # model.init's one-row batch on a data axis.
    "init_row_context": ((2, 1, 1, 2), 1),
    "indivisible_rows": ((2, 1, 1, 1), 3),
}
KERNELS = tuple(attention_table.KERNELS)
HEADS, HEAD_DIM, KV_LEN = 4, 16, 128


def _length(mesh_shape) -> int:
  return 128 * mesh_shape[3]  # Splash: 128 query rows a context shard.


def _skip_reason(kernel: str, mask: Mask, mesh_shape) -> str | None:
  shards, tensor = mesh_shape[3], mesh_shape[2]
  if kernel == "cudnn":
    return "cuDNN runs on NVIDIA GPUs only (no CPU path); --mode=compile and a GPU run check it"
  if mask.kv_heads % tensor:
    return (f"{mask.kv_heads} k/v heads do not split over tensor={tensor} "
            "(sharding.check_divisible refuses it before compiling)")
  kind = ops.LayerKind(causal=mask.causal, window=mask.window, has_bias=mask.bias,
                       softcap=mask.softcap, cross=mask.cross)
  q_len = _length(mesh_shape)
  reason = attention_table.unsupported_reason(
      kernel, kind, dtype="float32", head_dim=HEAD_DIM, q_len=q_len,
      kv_len=KV_LEN if mask.cross else q_len, context=shards)
  return reason and f"{kernel} does not serve this kind: {reason}"


def _inputs(mask: Mask, rows: int, length: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  kv_len = KV_LEN if mask.cross else length
  q = rng.normal(size=(rows, length, HEADS, HEAD_DIM)).astype(np.float32)
  k, v = (rng.normal(size=(rows, kv_len, mask.kv_heads, HEAD_DIM)).astype(np.float32)
          for _ in range(2))

  def segments(n):
    seg = np.ones((rows, n), np.int32)
    if mask.packed:
      seg[0, n // 3:] = 2
    if mask.padded:
      for row in range(rows):
        seg[row, n - 5 - 7 * row:] = 0
    return seg

  q_seg = segments(length)
  kv_seg = segments(kv_len) if mask.cross else q_seg
  bias = (rng.normal(size=(1, HEADS, length, kv_len)).astype(np.float32)
          if mask.bias else None)
  return q, k, v, q_seg, kv_seg, bias


def _mesh(mesh_shape):
  config = ml_collections.ConfigDict({"shape": tuple(zip(("data", "fsdp", "tensor", "context"),
                                                         mesh_shape)),
                                      "rules": base.get_config().mesh.rules})
  devices = jax.devices()[:int(np.prod(mesh_shape))]
  mesh = sharding.make_mesh(config, devices)
  return mesh, sharding.rules_of(config, mesh)


def _attend(kernel: str, mask: Mask, shards: int, q_seg, kv_seg):
  """f(q, k, v, bias) in the natural order: the model's zig-zag order inside (the rows of
  a context-sharded sequence; a cross-attention's source stays natural), as the model
  builds its mask and segments at the top of the stack."""
  length = q_seg.shape[1]
  kv_order = (lambda x: x) if mask.cross else (lambda x: context.zigzag(x, shards))
  positions = np.broadcast_to(np.arange(length), q_seg.shape)
  kv_positions = np.broadcast_to(np.arange(kv_seg.shape[1]), kv_seg.shape)
  q_seg_z, q_pos_z = context.zigzag(q_seg, shards), context.zigzag(positions, shards)
  kv_seg_z, kv_pos_z = kv_order(kv_seg), kv_order(kv_positions)
  mask_B1LS = ops.make_attention_mask(
      jnp.asarray(q_seg_z), jnp.asarray(kv_seg_z), causal=mask.causal,
      q_positions=jnp.asarray(q_pos_z), kv_positions=jnp.asarray(kv_pos_z), window=mask.window)
  kind = ops.LayerKind(causal=mask.causal, window=mask.window, has_bias=mask.bias,
                       softcap=mask.softcap, cross=mask.cross)
  segments = ops.Segments(jnp.asarray(q_seg_z), jnp.asarray(kv_seg_z))

  def f(q, k, v, bias):
    q = nn.with_logical_constraint(context.zigzag(q, shards),
                                   ("batch", "length", "heads", "head_dim"))
    k, v = (nn.with_logical_constraint(kv_order(x), ("batch", "length", "kv_heads", "head_dim"))
            for x in (k, v))
    if bias is not None:  # Rows (and a self-attention's columns) in the zig-zag order.
      bias = context.zigzag(bias.transpose(0, 2, 1, 3), shards).transpose(0, 2, 1, 3)
      if not mask.cross:
        bias = context.zigzag(bias.transpose(0, 3, 1, 2), shards).transpose(0, 2, 3, 1)
    out = ops.dot_product_attention(q, k, v, impl=kernel, kind=kind, mask_B1LS=mask_B1LS,
                                    segments=segments, bias_BHLS=bias)
    return context.unzigzag(out, shards)

  return f


def _reference(mask: Mask, q_seg, kv_seg):
  full = ops.make_attention_mask(jnp.asarray(q_seg), jnp.asarray(kv_seg), causal=mask.causal,
                                 window=mask.window)
  return lambda q, k, v, bias: ops.einsum_attention(q, k, v, full, bias_BHLS=bias,
                                                    softcap=mask.softcap)


def _value_and_grads(f, real, q, k, v, bias):
  weight = np.sin(np.arange(real.size, dtype=np.float32)).reshape(real.shape)[..., None, None]

  def scalar(q, k, v, bias):
    out = f(q, k, v, bias)
    return jnp.sum(jnp.where(real[..., None, None], jnp.sin(out) * weight, 0.0)), out

  argnums = (0, 1, 2, 3) if bias is not None else (0, 1, 2)
  (_, out), grads = jax.jit(jax.value_and_grad(scalar, argnums, has_aux=True))(q, k, v, bias)
  return np.asarray(out), [np.asarray(g) for g in grads]


def check_cell(kernel: str, mask_name: str, mesh_name: str) -> None:
  mask, (mesh_shape, rows) = MASKS[mask_name], MESHES[mesh_name]
  reason = _skip_reason(kernel, mask, mesh_shape)
  if reason:
    pytest.skip(reason)
  q, k, v, q_seg, kv_seg, bias = _inputs(mask, rows, _length(mesh_shape))
  real = q_seg != 0  # Padded queries' rows are undefined in the fused kernels.
  want_out, want_grads = _value_and_grads(_reference(mask, q_seg, kv_seg), real, q, k, v, bias)
  mesh, rules = _mesh(mesh_shape)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    got_out, got_grads = _value_and_grads(_attend(kernel, mask, mesh_shape[3], q_seg, kv_seg),
                                          real, q, k, v, bias)
  np.testing.assert_allclose(np.where(real[..., None, None], got_out, 0),
                             np.where(real[..., None, None], want_out, 0), atol=3e-5, rtol=1e-5)
  for name, got, want in zip("qkvb", got_grads, want_grads):
    error = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-6)
    assert error < 1e-4, (name, error)


# The default run's slice (~15 s on 2 cores): each path once, the layouts that broke.
SLICE = [
    ("splash", "causal_packed", "init_row"),  # Trainer.init with data=2 crashed (issue 39).
    ("splash", "window_causal", "context"),  # Context splash's backward failed (block 64).
    ("splash", "cross", "data_context"),  # A full mask cut per shard failed in jax.
    ("einsum", "bias", "tensor_context"),
    ("xla", "mqa", "indivisible_rows"),
    ("einsum", "softcap", "data_fsdp_tensor"),
]


@pytest.mark.parametrize("kernel,mask,mesh", SLICE)
def test_reference_matrix_slice(kernel, mask, mesh):
  check_cell(kernel, mask, mesh)


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("kernel", KERNELS)
def test_reference_matrix(kernel, mask, mesh):
  check_cell(kernel, mask, mesh)


def test_splash_trains_on_a_data_parallel_mesh_like_xla(tfds_data_dir):
  """Trainer.init runs model.init on one row inside the mesh: with splash and data=2 it
  stopped in shard_map ("not evenly divisible"). Now its rows stay whole there, and one
  training step gives xla's loss."""
  from test_sharding import _config, _train  # pylint: disable=g-import-not-at-top
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  losses = {}
  for impl in ("xla", "splash"):
    config = _config(make_tiny_config(tfds_data_dir), mesh=(2, 1, 1))
    config.model.update(attention_impl=impl, max_len=128, num_layers=1)
    config.data.update(seq_len=128, batch_size=2)
    losses[impl] = _train(config, jax.devices()[:2], steps=1)[0]
  np.testing.assert_allclose(losses["splash"], losses["xla"], rtol=2e-5)
