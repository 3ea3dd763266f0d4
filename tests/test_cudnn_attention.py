"""cuDNN attention's guards (cudnn_guard.py) held to the einsum reference on a CPU.

cuDNN cannot run here, so jax's two entry points are replaced by stand-ins that keep
their contract, faults included: the packed kernel reads each segment's keys at the
element offset jax computes for it (scaled by the query heads on jax < 0.11.1, the
grouped-query bug, when `buggy`), and leaves NaN in the output and in dq/dk/dv wherever
no segment covers a token (memory it never writes). The same parity on a real GPU:
`python benchmarks/attention_parity.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.cudnn import fused_attention_stablehlo as cudnn

from transformer.config import objective as objective_lib
from transformer.config.errors import DataError
from transformer.model import attention_ops as ops
from transformer.model import cudnn_guard


@jax.custom_vjp
def _nan_grad_outside(x, covered):
  return x


def _nan_grad_fwd(x, covered):
  return x, covered


def _nan_grad_bwd(covered, ct):  # The kernel never writes dq/dk/dv where no segment is.
  return jnp.where(covered[:, :, None, None], ct, jnp.nan), None


_nan_grad_outside.defvjp(_nan_grad_fwd, _nan_grad_bwd)


def _fake_packed_kernel(buggy: bool):
  """jax's private cudnn.dot_product_attention for the packed layout (BTNH), in einsums."""

  def fake(query, key, value, bias=None, mask=None, q_seqlen=None, kv_seqlen=None,
           q_offsets=None, kv_offsets=None, *, scale, mask_type, qkv_layout,
           sliding_window_length=None, **unused):
    assert bias is None and mask is None and qkv_layout == "BTNH"
    B, T, N, D = query.shape
    _, S, K, _ = key.shape
    causal = mask_type == cudnn.MaskType.PADDING_CAUSAL
    # jax turns offsets into elements of the flat [B * S, K, D] buffer: x N * D (the bug)
    # where the stride of a token is K * D.
    stride = N // K if buggy else 1
    ql, qo, kl, ko = (np.asarray(a) for a in (q_seqlen, q_offsets, kv_seqlen, kv_offsets))
    allowed = np.zeros((B, T, B * S), bool)
    q_covered, kv_covered = np.zeros((B, T), bool), np.zeros((B, S), bool)
    for b in range(B):
      for m in range(ql.shape[1]):
        if ql[b, m] < 0:
          continue
        i = np.arange(ql[b, m])[:, None]
        j = np.arange(kl[b, m])[None, :]
        keep = np.ones((ql[b, m], kl[b, m]), bool)
        if causal:
          keep &= j <= i
        if sliding_window_length:
          keep &= i - j < sliding_window_length
        flat = (b * S + ko[b, m]) * stride + j  # The flat key token each reads.
        rows = np.broadcast_to(qo[b, m] + i, keep.shape)
        cols = np.broadcast_to(flat, keep.shape)
        inside = cols < B * S
        allowed[b, rows[inside & keep], cols[inside & keep]] = True
        q_covered[b, qo[b, m]:qo[b, m] + ql[b, m]] = True
        kv_covered[b, ko[b, m]:ko[b, m] + kl[b, m]] = True
    query = _nan_grad_outside(query, jnp.asarray(q_covered))
    key = _nan_grad_outside(key, jnp.asarray(kv_covered))
    value = _nan_grad_outside(value, jnp.asarray(kv_covered))
    heads = np.arange(N) // (N // K)
    k_FND = key.reshape(B * S, K, D)[:, heads].astype(jnp.float32)
    v_FND = value.reshape(B * S, K, D)[:, heads].astype(jnp.float32)
    logits = jnp.einsum("btnd,fnd->bntf", query.astype(jnp.float32), k_FND) * scale
    logits = jnp.where(allowed[:, None], logits, jnp.finfo(jnp.float32).min)
    out = jnp.einsum("bntf,fnd->btnd", jax.nn.softmax(logits, axis=-1), v_FND)
    return jnp.where(q_covered[:, :, None, None], out, jnp.nan).astype(query.dtype)

  return fake


_XLA_ATTENTION = jax.nn.dot_product_attention  # Before a test replaces it.


def _fake_public_kernel(query, key, value, bias=None, mask=None, *, is_causal=False,
                        query_seq_lengths=None, key_value_seq_lengths=None,
                        local_window_size=None, implementation=None, **unused):
  """jax.nn.dot_product_attention(implementation="cudnn"): rows' lengths, NaN past them."""
  assert implementation == "cudnn" and bias is None and mask is None
  out = _XLA_ATTENTION(
      query, key, value, is_causal=is_causal, query_seq_lengths=query_seq_lengths,
      key_value_seq_lengths=key_value_seq_lengths, local_window_size=local_window_size,
      implementation="xla")
  past = jnp.arange(query.shape[1])[None, :] >= query_seq_lengths[:, None]
  return jnp.where(past[:, :, None, None], jnp.nan, out)


def _inputs(B=3, L=64, H=8, K=2, D=16):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(B, L, n, D)), jnp.float32) for n in (H, K, K))
  seg = np.ones((B, L), np.int32)
  seg[0, 20:] = 2
  seg[0, 41:] = 3
  seg[0, 60:] = 0  # Padding, covered by no segment.
  seg[2, 50:] = 2
  return q, k, v, jnp.asarray(seg)


def _loss_and_grads(attend, q, k, v, seg):
  # The model's loss weights padding by zero through a product: NaN there would poison it.
  weight = (seg != 0).astype(jnp.float32)[:, :, None, None]
  loss = lambda q, k, v: jnp.sum(attend(q, k, v) * weight * jnp.cos(q))
  return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)


def _reference(seg, causal, window):
  mask = ops.make_attention_mask(seg, seg, causal=causal, window=window)
  return lambda q, k, v: ops.einsum_attention(q, k, v, mask)


def _assert_matches(got, want):
  (got_loss, got_grads), (want_loss, want_grads) = got, want
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-4)
  for g, w in zip(got_grads, want_grads):
    assert np.isfinite(g).all()
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def test_the_gqa_offset_bug_is_known_exactly_on_the_versions_that_have_it():
  assert cudnn_guard.kv_offsets_scaled_by_query_heads("0.10.2")
  assert cudnn_guard.kv_offsets_scaled_by_query_heads("0.11.0")
  assert not cudnn_guard.kv_offsets_scaled_by_query_heads("0.11.1")
  assert not cudnn_guard.kv_offsets_scaled_by_query_heads("0.11.2")
  assert not cudnn_guard.kv_offsets_scaled_by_query_heads("0.12.0.dev20261101")
  assert cudnn_guard.version_tuple("0.11.0rc1") == (0, 11, 0)


@pytest.mark.parametrize("causal,window", [(True, 0), (False, 0), (True, 8)])
def test_packed_gqa_equals_the_reference_on_a_buggy_jax(monkeypatch, caplog, causal, window):
  q, k, v, seg = _inputs()
  monkeypatch.setattr(cudnn, "dot_product_attention", _fake_packed_kernel(buggy=True))
  monkeypatch.setattr(cudnn_guard, "kv_offsets_scaled_by_query_heads", lambda: True)
  cudnn_guard._SAID.clear()  # pylint: disable=protected-access
  kernel = lambda q, k, v: ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=causal,
                                               window=window, max_segments=4)
  with caplog.at_level("WARNING"):
    got = _loss_and_grads(kernel, q, k, v, seg)
    _loss_and_grads(kernel, q, k, v, seg)
  assert caplog.text.count("repeating the 2 key/value heads to the 8 query heads") == 1
  _assert_matches(got, _loss_and_grads(_reference(seg, causal, window), q, k, v, seg))


def test_the_stand_in_has_the_bug_that_the_guard_repairs(monkeypatch):
  q, k, v, seg = _inputs()
  kernel = lambda q, k, v: ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=True,
                                               window=0, max_segments=4)
  want = _loss_and_grads(_reference(seg, True, 0), q, k, v, seg)
  monkeypatch.setattr(cudnn_guard, "kv_offsets_scaled_by_query_heads", lambda: False)
  monkeypatch.setattr(cudnn, "dot_product_attention", _fake_packed_kernel(buggy=True))
  unguarded = _loss_and_grads(kernel, q, k, v, seg)
  assert not np.allclose(unguarded[0], want[0], rtol=1e-3)  # Rows after the first: wrong keys.
  monkeypatch.setattr(cudnn, "dot_product_attention", _fake_packed_kernel(buggy=False))
  _assert_matches(_loss_and_grads(kernel, q, k, v, seg), want)  # A fixed jax needs no repeat.


def test_unwritten_padding_never_reaches_the_loss_or_a_gradient(monkeypatch):
  q, k, v, seg = _inputs(K=8)
  monkeypatch.setattr(cudnn, "dot_product_attention", _fake_packed_kernel(buggy=False))
  out = ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=True, window=0,
                            max_segments=4)
  assert (np.asarray(out)[0, 60:] == 0).all()  # The stand-in left NaN there.
  kernel = lambda q, k, v: ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=True,
                                               window=0, max_segments=4)
  _assert_matches(_loss_and_grads(kernel, q, k, v, seg),
                  _loss_and_grads(_reference(seg, True, 0), q, k, v, seg))


@pytest.mark.parametrize("causal,window", [(True, 0), (False, 0), (True, 8)])
def test_one_document_a_row_takes_the_public_per_row_length_kernel(monkeypatch, causal, window):
  q, k, v, _ = _inputs()
  seg = np.ones((3, 64), np.int32)
  seg[1, 40:] = 0  # Padding at the end only.
  seg = jnp.asarray(seg)

  def no_packed_layout(*args, **kwargs):
    raise AssertionError("one document a row must not take the packed layout")

  monkeypatch.setattr(cudnn, "dot_product_attention", no_packed_layout)
  monkeypatch.setattr(jax.nn, "dot_product_attention", _fake_public_kernel)
  kernel = lambda q, k, v: ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=causal,
                                               window=window, max_segments=1)
  _assert_matches(_loss_and_grads(kernel, q, k, v, seg),
                  _loss_and_grads(_reference(seg, causal, window), q, k, v, seg))


def test_an_a100_gets_cudnn_for_one_document_a_row_and_xla_for_packed_rows(monkeypatch):
  monkeypatch.setattr(ops, "packed_layout_supported", lambda: False)  # sm_80.
  monkeypatch.setattr(ops, "cudnn_available", lambda: True)
  choose = lambda kind: ops.choose_kernel("auto", kind, platform="gpu", dtype=jnp.bfloat16,
                                          head_dim=64, q_len=1024, kv_len=1024)
  assert choose(ops.LayerKind(causal=True, packed=False)) == "cudnn"
  assert choose(ops.LayerKind(causal=True, packed=True)) == "xla"
  reason = ops.unsupported_reason("cudnn", ops.LayerKind(causal=True), dtype=jnp.bfloat16,
                                  head_dim=64, q_len=1024, kv_len=1024)
  assert "sm_90" in reason and "model.attention_max_segments=1" in reason


def test_one_document_a_row_must_start_at_position_0():
  ops.check_rows({"segment_ids": np.asarray([[1, 1, 0], [0, 0, 0]])}, 1)
  with pytest.raises(DataError, match=r"does not start at position 0 \(segment_ids"):
    ops.check_rows({"segment_ids": np.asarray([[1, 1, 0], [0, 1, 1]])}, 1)
  ops.check_rows({"segment_ids": np.asarray([[0, 1, 1]])}, 2)  # Offsets say where.


@pytest.mark.parametrize("causal,window", [(True, 0), (False, 0), (True, 8)])
def test_full_rows_take_the_plain_call_without_selects(monkeypatch, causal, window):
  """Rows of one document and no padding (rows_packed and rows_padded False): the
  kernel's plain call, no lengths, and no select around it (the HLO has none)."""
  q, k, v, _ = _inputs()
  seg = jnp.ones((3, 64), jnp.int32)
  calls = []

  def plain(query, key, value, *, is_causal=False, local_window_size=None,
            implementation=None, **lengths):
    calls.append(lengths)
    assert implementation == "cudnn" and not lengths  # No lengths: the plain call.
    return _XLA_ATTENTION(query, key, value, is_causal=is_causal,
                          local_window_size=local_window_size, implementation="xla")

  monkeypatch.setattr(cudnn, "dot_product_attention", None)  # Never the packed layout.
  monkeypatch.setattr(jax.nn, "dot_product_attention", plain)
  monkeypatch.setattr(cudnn_guard, "keep_segments", None)  # No select either.
  kernel = lambda q, k, v: ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=causal,
                                               window=window, max_segments=1, padded=False)
  _assert_matches(_loss_and_grads(kernel, q, k, v, seg),
                  _loss_and_grads(_reference(seg, causal, window), q, k, v, seg))
  assert calls


def test_packed_rows_without_padding_need_no_select(monkeypatch):
  """Packed documents filling every row (an LM's training rows): the packed layout with
  no select in or out, and the reference's result."""
  q, k, v, _ = _inputs(K=8)
  seg = np.ones((3, 64), np.int32)
  seg[0, 20:], seg[0, 41:], seg[2, 50:] = 2, 3, 2
  seg = jnp.asarray(seg)
  monkeypatch.setattr(cudnn, "dot_product_attention", _fake_packed_kernel(buggy=False))
  monkeypatch.setattr(cudnn_guard, "keep_segments", None)  # No select in or out.
  kernel = lambda q, k, v: ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=True,
                                               window=0, max_segments=4, padded=False)
  _assert_matches(_loss_and_grads(kernel, q, k, v, seg),
                  _loss_and_grads(_reference(seg, True, 0), q, k, v, seg))


def test_rows_the_step_was_not_built_for_are_refused():
  """A batch with padding or several documents where the layout has none: one line."""
  full = objective_lib.RowLayout(packed=False, padded=False)
  ops.check_rows({"segment_ids": np.ones((2, 4), np.int32)}, 1, full)
  with pytest.raises(DataError, match=r"holds padding .*RowLayout\(packed=False, padded=False"):
    ops.check_rows({"segment_ids": np.asarray([[1, 1, 0, 0]])}, 1, full)
  with pytest.raises(DataError, match=r"holds several documents"):
    ops.check_rows({"segment_ids": np.asarray([[1, 1, 2, 2]])}, 4, full)
  ops.check_rows({"segment_ids": np.asarray([[1, 1, 2, 0]])}, None, full)  # No cuDNN: no rule.


def test_pipelines_declare_their_rows():
  """An LM's training rows are full (packed, never padded); evaluation pads; seq2seq
  packs as data.packing says; a classifier has one padded example a row."""
  from configs import base  # pylint: disable=g-import-not-at-top
  data = base.get_config().data
  get = objective_lib.get
  assert objective_lib.row_layout(get("causal_lm"), data, True) == (True, False)
  assert objective_lib.row_layout(get("masked_lm"), data, True) == (True, False)
  assert objective_lib.row_layout(get("causal_lm"), data, False) == (True, True)
  assert objective_lib.row_layout(get("classification"), data, True) == (False, True)
  data.packing = "pad"
  assert objective_lib.row_layout(get("seq2seq"), data, True) == (False, True)
  assert objective_lib.layout_of_batch({"segment_ids": np.ones((2, 3)), "x": 0}) == (False, False)
