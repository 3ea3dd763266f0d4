"""The attention kernels against the einsum reference, the kernel choice, and dropout.

Splash attention (a Pallas TPU kernel) runs here through Pallas's interpreter; cuDNN
cannot run on a CPU, so its test checks what it is given (no dense mask, causality as
the kernel's mask type, packed documents as segment lengths and offsets).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from configs import base
from transformer.config import attention as attention_table
from transformer.config.errors import DataError
from transformer.config.model import ModelConfig
from transformer.model import attention_ops as ops
from transformer.model import dropout as dropout_lib
from transformer.model import splash as splash_lib


def _qkv(L=128, H=4, K=2, D=32, B=2, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(B, L, H, D)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(B, L, K, D)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, L, K, D)), jnp.float32)
  return q, k, v


def _segments(B=2, L=128, packed=True):
  seg = np.ones((B, L), np.int32)
  if packed:
    seg[0, 50:] = 2
    seg[0, 100:] = 0  # Padding.
  seg[1, 120:] = 0
  return jnp.asarray(seg)


@pytest.mark.parametrize("causal,window,packed,kv_heads", [
    (True, 0, True, 2),      # Packed causal GQA (a decoder LM's training row).
    (False, 0, True, 4),     # Packed bidirectional (an encoder's).
    (True, 16, False, 1),    # A sliding window, multi-query.
])
def test_splash_equals_the_reference_forward_and_gradient(causal, window, packed, kv_heads):
  q, k, v = _qkv(K=kv_heads)
  seg = _segments(packed=packed)
  mask = ops.make_attention_mask(seg, seg, causal=causal, window=window)
  real = (np.asarray(seg) != 0)[:, :, None, None]  # Padded queries' rows are undefined.

  def loss(fn):
    return lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v), 0.0) ** 2)

  splash = lambda q, k, v: splash_lib.splash_attention(q, k, v, ops.Segments(seg, seg),
                                                     causal=causal, window=window,
                                                     interpret=True)
  reference = lambda q, k, v: ops.einsum_attention(q, k, v, mask)
  np.testing.assert_allclose(np.where(real, splash(q, k, v), 0),
                             np.where(real, reference(q, k, v), 0), atol=2e-5)
  for got, want in zip(jax.grad(loss(splash), argnums=(0, 1, 2))(q, k, v),
                       jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)


def test_segment_lengths_and_offsets_by_hand():
  seg = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1], [0] * 8])
  lengths, offsets = ops.segment_lengths_and_offsets(seg, 32)
  assert lengths.shape == (3, 8) and offsets.shape == (3, 9)  # M = min(32, L).
  np.testing.assert_array_equal(lengths[:, :4], [[3, 2, 1, -1], [8, -1, -1, -1],
                                                 [-1, -1, -1, -1]])
  np.testing.assert_array_equal(offsets[:, :4], [[0, 3, 5, -1], [0, -1, -1, -1],
                                                 [-1, -1, -1, -1]])
  assert (np.asarray(offsets)[:, 4:] == -1).all()
  lengths, offsets = ops.segment_lengths_and_offsets(seg, 3)  # The softmax stats' M.
  assert lengths.shape == (3, 3) and offsets.shape == (3, 4)
  np.testing.assert_array_equal(lengths[0], [3, 2, 1])
  np.testing.assert_array_equal(offsets[0], [0, 3, 5, -1])


def test_rows_with_more_documents_than_the_cudnn_layout_holds_are_refused():
  seg = np.asarray([[1, 1, 2, 2, 3, 4, 0, 0], [1] * 8])
  ops.check_rows({"segment_ids": seg, "tokens": seg * 9}, 4)  # 4 documents: fine.
  ops.check_rows({"segment_ids": seg}, None)  # No cuDNN packed layout: no limit.
  with pytest.raises(DataError, match=r"holds 4 packed documents \(inputs_segment_ids\), "
                     r"more than config\.model\.attention_max_segments=3.*at least 4"):
    ops.check_rows({"inputs_segment_ids": seg[None]}, 3)  # Stacked batches too.


def test_packed_rows_limit_only_where_cudnn_serves(monkeypatch):
  monkeypatch.setattr(ops, "packed_layout_supported", lambda: True)
  monkeypatch.setattr(ops, "cudnn_available", lambda: True)
  model = base.get_config().model
  model.update(vocab_size=64, dtype="bfloat16", attention_max_segments=7)
  config = ModelConfig.from_config(model)
  assert ops.packed_rows_limit(config, "gpu") == 7
  assert ops.packed_rows_limit(config, "cpu") is None
  assert ops.packed_rows_limit(config, "tpu") is None
  assert ops.packed_rows_limit(config, "gpu", context_shards=2) is None  # xla serves it.
  as_f32 = dataclasses.replace(config, dtype=jnp.float32)  # cuDNN refuses it: xla, no limit.
  assert ops.packed_rows_limit(as_f32, "gpu") is None


def test_cudnn_gets_the_mask_as_the_kernels_own(monkeypatch):
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=g-import-not-at-top
  seen = {}

  def fake(query, key, value, bias=None, mask=None, q_seqlen=None, kv_seqlen=None,
           q_offsets=None, kv_offsets=None, **kwargs):
    seen.update(bias=bias, mask=mask, q_seqlen=q_seqlen, q_offsets=q_offsets,
                kv_offsets=kv_offsets, **kwargs)
    return query

  monkeypatch.setattr(cudnn, "dot_product_attention", fake)
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv())
  seg = _segments()
  ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=True, window=8, max_segments=4)
  assert seen["q_seqlen"].shape == (seg.shape[0], 4)  # M = 4 segments a row, not L.
  assert seen["bias"] is None and seen["mask"] is None  # No dense [B, 1, L, S], no dbias.
  assert seen["mask_type"] == cudnn.MaskType.PADDING_CAUSAL
  assert seen["sliding_window_length"] == 8 and seen["qkv_layout"] == "BTNH"
  np.testing.assert_array_equal(seen["q_seqlen"][0, :3], [50, 50, -1])
  np.testing.assert_array_equal(seen["q_offsets"][0, :3], [0, 50, -1])
  ops.cudnn_attention(q, k, v, ops.Segments(seg, seg), causal=False, window=0,
                      max_segments=4)
  assert seen["mask_type"] == cudnn.MaskType.PADDING and seen["sliding_window_length"] is None


def test_auto_picks_the_platforms_fused_kernel_and_falls_back_per_layer_kind(caplog,
                                                                             monkeypatch):
  monkeypatch.setattr(ops, "packed_layout_supported", lambda: True)  # An H100's.
  monkeypatch.setattr(ops, "cudnn_available", lambda: True)
  choose = lambda kind, platform, dtype=jnp.bfloat16, head_dim=64, length=2048: (
      ops.choose_kernel("auto", kind, platform=platform, dtype=dtype, head_dim=head_dim,
                        q_len=length, kv_len=length))
  causal = ops.LayerKind(causal=True)
  assert choose(causal, "gpu") == "cudnn" and choose(causal, "cuda") == "cudnn"
  assert choose(causal, "tpu") == "splash"
  assert choose(causal, "cpu") == "xla"
  # What a kernel cannot serve falls back, per layer kind, and says why once.
  ops._FALLBACKS_SAID.clear()  # pylint: disable=protected-access
  with caplog.at_level("WARNING"):
    assert choose(causal, "gpu", dtype=jnp.float32) == "xla"
    assert choose(causal, "gpu", dtype=jnp.float32) == "xla"
  assert caplog.text.count("bfloat16 or float16") == 1
  assert choose(causal, "gpu", head_dim=256) == "xla"
  assert choose(ops.LayerKind(causal=True, has_bias=True), "tpu") == "xla"  # T5 / ALiBi.
  assert choose(ops.LayerKind(causal=True, softcap=50.0), "gpu") == "einsum"  # Gemma 2.
  assert choose(ops.LayerKind(causal=True, softcap=50.0), "tpu") == "splash"  # Splash caps.
  assert choose(ops.LayerKind(causal=False, dropout=True), "tpu") == "einsum"
  assert choose(ops.LayerKind(causal=True, decoding=True), "gpu") == "xla"
  assert choose(causal, "tpu", length=100) == "xla"  # Not a multiple of splash's block.
  assert choose(ops.LayerKind(causal=False, window=8), "gpu") == "xla"
  monkeypatch.setattr(ops, "packed_layout_supported", lambda: False)  # An A100's.
  assert choose(causal, "gpu") == "xla"
  monkeypatch.setattr(ops, "packed_layout_supported", lambda: True)
  monkeypatch.setattr(ops, "cudnn_available", lambda: False)  # A CPU host without cuDNN.
  assert choose(causal, "gpu") == "xla"


def test_an_explicit_kernel_that_cannot_serve_is_refused_before_compiling():
  text = ops.check_explicit("cudnn", [ops.LayerKind(causal=True)], dtype=jnp.float32,
                            head_dim=64, seq_len=128)
  assert text.startswith("config.model.attention_impl='cudnn' is invalid")
  assert "bfloat16" in text and "'auto'" in text
  assert ops.check_explicit("cudnn", [ops.LayerKind(causal=True)], dtype=jnp.bfloat16,
                            head_dim=64, seq_len=128) is None  # The device is not its to know.
  assert "not a multiple of 128" in ops.check_explicit(
      "splash", [ops.LayerKind(causal=True)], dtype=jnp.bfloat16, head_dim=64, seq_len=100)
  # A decoding step falls back whatever the choice (it is not a kernel call).
  assert ops.check_explicit("splash", [ops.LayerKind(causal=True, decoding=True)],
                            dtype=jnp.float32, head_dim=64, seq_len=100) is None
  with pytest.raises(ValueError, match="cannot compute this attention here"):
    ops.choose_kernel("cudnn", ops.LayerKind(causal=True), platform="gpu", dtype=jnp.float32,
                      head_dim=64, q_len=128, kv_len=128)


def test_dropout_is_flax_dropout_on_cpu():
  x = jnp.ones((4, 64, 32))
  rngs = {"dropout": jax.random.PRNGKey(3)}
  ours = dropout_lib.Dropout(0.3, deterministic=False).apply({}, x, rngs=rngs)
  flax = nn.Dropout(0.3, deterministic=False).apply({}, x, rngs=rngs)
  np.testing.assert_array_equal(ours, flax)  # Same class name, same stream, same numbers.
  assert dropout_lib.Dropout(0.3, deterministic=True).apply({}, x) is x
  assert not dropout_lib.hashed_bits()  # This CPU host.


def test_hashed_dropout_keeps_its_share_and_recomputes_its_mask_for_the_gradient():
  """Off the CPU the mask is a hash of the index: the keep share is the rate's (to
  sampling error), different seeds draw unrelated masks, and the gradient's mask is the
  forward's (recomputed, not saved: the VJP's only residual is the seed)."""
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 256, 512)) + 3.0  # Never 0.
  seed = jnp.asarray([12345, 678], jnp.uint32)
  y, vjp = jax.vjp(lambda x: dropout_lib.hashed_dropout(x, seed, 0.1), x)
  kept = np.asarray(y != 0)
  assert abs(kept.mean() - 0.9) < 0.002  # 1M elements: sampling sd 3e-4.
  np.testing.assert_allclose(np.asarray(y)[kept], np.asarray(x)[kept] / 0.9, rtol=1e-6)
  (g,) = vjp(jnp.ones_like(x))
  np.testing.assert_array_equal(np.asarray(g != 0), kept)
  np.testing.assert_allclose(np.asarray(g)[kept], 1 / 0.9, rtol=1e-6)
  other = np.asarray(dropout_lib.keep_mask(jnp.asarray([12346, 678], jnp.uint32), x.shape, 0.9))
  both = (kept & other).mean()
  assert abs(both - 0.81) < 0.003  # Independent masks: 0.9 x 0.9.
  rows, columns = kept.mean(axis=(1, 2)), kept.mean(axis=(0, 1))
  assert rows.std() < 0.01 and abs(columns.mean() - 0.9) < 0.002  # No striping.
  assert dropout_lib._forward(x, seed, 0.1)[1] is seed  # pylint: disable=protected-access


def test_hashed_dropout_draws_the_gradients_mask_behind_a_barrier():
  """The backward's mask hangs on the seed through an optimization barrier: XLA cannot
  share the forward's mask, which on a GPU it wrote to HBM as a boolean array and read
  back (gpt_small 32 x 1024 on an H100: 96.70 -> 95.82 GB a step without that array)."""
  x = jnp.ones((4, 8), jnp.float32)
  seed = jnp.asarray([1, 2], jnp.uint32)
  _, vjp = jax.vjp(lambda x: dropout_lib.hashed_dropout(x, seed, 0.5), x)
  jaxpr = jax.make_jaxpr(vjp)(x)
  text = str(jaxpr)
  assert "optimization_barrier" in text, text


def test_hashed_dropout_is_the_same_on_every_mesh_partition():
  """The mask depends on the global index only: rows, length or features split over 8
  devices give the unsplit mask (threefry's partitionable mode has the same property)."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  x = jnp.ones((8, 64, 32))
  seed = jnp.asarray([7, 9], jnp.uint32)
  whole = dropout_lib.hashed_dropout(x, seed, 0.25)
  mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 2, 2), ("a", "b", "c"))
  for spec in (P("a", "b", "c"), P(("a", "b", "c")), P(None, ("a", "b"), "c")):
    placed = jax.device_put(x, NamedSharding(mesh, spec))
    split = jax.jit(lambda x: dropout_lib.hashed_dropout(x, seed, 0.25))(placed)
    np.testing.assert_array_equal(split, whole)


def test_accelerators_take_the_hashed_mask(monkeypatch):
  """The module and the einsum attention's weights draw the hashed mask off the CPU."""
  monkeypatch.setattr(dropout_lib, "hashed_bits", lambda: True)
  x = jnp.ones((4, 64, 32))
  key = jax.random.PRNGKey(3)
  ours = dropout_lib.Dropout(0.3, deterministic=False).apply({}, x, rngs={"dropout": key})
  assert abs(float((ours != 0).mean()) - 0.7) < 0.02
  want = dropout_lib.drop(x, key, 0.3)
  np.testing.assert_array_equal(want, dropout_lib.hashed_dropout(
      x, jax.random.bits(key, (2,), jnp.uint32), 0.3))


def test_splash_blocks_divide_the_length_per_context_shard():
  """One rule (config/attention.py) for validation, the kernel and planning/hlo.py:
  multiples of 128, at most 512, dividing the length; per context shard a zig-zag chunk
  where 128 tiles it, else the shard's rows (seq_len 256 over 2 shards: chunks of 64)."""
  blocks = attention_table.splash_blocks
  assert blocks(2048, 2048) == (512, 512)
  assert blocks(640, 640) == (128, 128)  # min(512, L) = 512 did not divide 640.
  assert blocks(768, 384) == (384, 384)
  assert blocks(256, 256, 2) == (128, 256)  # Was 64: "block_q must be a multiple of 128".
  assert blocks(4096, 4096, 4) == (512, 512)
  assert "not a multiple of 128" in blocks(100, 128)
  assert "per context shard, of 2" in blocks(384, 384, 2)  # 192 rows a shard.
  assert blocks(384, 384, 3) == (128, 384)  # Chunks of 64; a shard's 128 rows.
  sizes = splash_lib.block_sizes(640, 640)
  assert (sizes.block_q, sizes.block_kv, sizes.block_q_dkv, sizes.block_kv_dq) == (128,) * 4


def test_splash_lengths_validation_accepts_are_served_and_auto_falls_back_once(caplog):
  """Explicit splash on a length it cannot tile is a ConfigError naming the key; a length
  validation accepts builds and matches the reference; `auto` on a TPU falls back to
  xla for the rest, saying so once."""
  from transformer.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from transformer.config.validation import validate  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.model.update(attention_impl="splash", max_len=640)
  config.data.seq_len = 640
  validate(config)
  config.data.seq_len = 320
  with pytest.raises(ConfigError, match=r"config\.model\.attention_impl='splash' is invalid: "
                     r"cannot serve data\.seq_len=320.*'auto'"):
    validate(config)
  config.data.seq_len = 384  # 128 tiles it, but not its 2 context shards' 192 rows.
  config.mesh.shape = (("data", 1), ("fsdp", 1), ("tensor", 1), ("context", 2))
  with pytest.raises(ConfigError, match=r"per context shard, of 2"):
    validate(config)
  q, k, v = _qkv(L=640, H=2, K=1, D=8, B=1)
  seg = jnp.ones((1, 640), jnp.int32)
  got = splash_lib.splash_attention(q, k, v, ops.Segments(seg, seg), causal=True, window=0,
                                    interpret=True)
  want = ops.einsum_attention(q, k, v, ops.make_attention_mask(seg, seg, causal=True))
  np.testing.assert_allclose(got, want, atol=2e-5)
  ops._FALLBACKS_SAID.clear()  # pylint: disable=protected-access
  with caplog.at_level("WARNING"):
    for _ in range(2):
      assert ops.choose_kernel("auto", ops.LayerKind(causal=True), platform="tpu",
                               dtype=jnp.bfloat16, head_dim=64, q_len=320, kv_len=320) == "xla"
  assert caplog.text.count("not a multiple of 128") == 1


def test_cross_attention_is_a_cross_kind_in_training_not_only_when_decoding(monkeypatch):
  """LayerKind.cross comes from the module (an encoder-decoder's cross-attention), so a
  context-sharded source's keys are never put through the queries' zig-zag."""
  from transformer.model.models import make_model  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.model.update(arch="encoder_decoder", head="lm", d_model=16, num_heads=2,
                      mlp_dim=32, num_layers=1, num_decoder_layers=1, vocab_size=64,
                      max_len=16, dtype="float32")
  model = make_model(ModelConfig.from_config(config.model))
  seen = []
  real = ops.dot_product_attention
  monkeypatch.setattr(ops, "dot_product_attention",
                      lambda *a, kind, **kw: seen.append(kind) or real(*a, kind=kind, **kw))
  tokens = jnp.ones((1, 16), jnp.int32)
  model.init(jax.random.PRNGKey(0), tokens, tokens, tokens, tokens, tokens, tokens)
  assert [(k.causal, k.cross) for k in seen] == [(False, False), (True, False), (False, True)]


def test_cudnn_on_a_host_without_a_gpu_says_so(monkeypatch):
  """Issue 42: on a CPU host the reason is the missing GPU, not a missing pip package."""
  monkeypatch.setattr(ops, "cudnn_available", lambda: False)
  reason = ops.unsupported_reason(
      "cudnn", ops.LayerKind(causal=True), dtype=jnp.bfloat16, head_dim=64,
      q_len=128, kv_len=128)
  assert reason == ("cuDNN attention runs on NVIDIA GPUs and this host has none (jax's "
                    "backend is cpu); compiling for a GPU target here (--mode=compile) needs "
                    "nvidia-cudnn-cu12 installed")


# ------------------------------------------------------------ a prefix LM's mask

def _prefix_rows(B=2, L=128, seed=0):
  """Packed rows: segments of random lengths, each with a prefix of random length (its
  first tokens), positions restarting per segment, padding at the end of row 0."""
  rng = np.random.default_rng(seed)
  seg, pos, prefix = (np.zeros((B, L), np.int32) for _ in range(3))
  for b in range(B):
    start, segment = 0, 1
    end = L - 9 if b == 0 else L  # Row 0 ends in padding (segment 0, no prefix).
    while start < end:
      length = min(int(rng.integers(5, 40)), end - start)
      seg[b, start:start + length] = segment
      pos[b, start:start + length] = np.arange(length)
      prefix[b, start:start + int(rng.integers(0, length + 1))] = 1
      start, segment = start + length, segment + 1
  return seg, pos, prefix


def _brute_force_prefix_mask(seg, pos, prefix):
  """T5's decoder_causal_attention written out: q sees k iff same segment and
  (pos_k <= pos_q or both in the prefix)."""
  B, L = seg.shape
  mask = np.zeros((B, 1, L, L), bool)
  for b in range(B):
    for q in range(L):
      for k in range(L):
        mask[b, 0, q, k] = seg[b, q] == seg[b, k] and (
            pos[b, k] <= pos[b, q] or bool(prefix[b, q] and prefix[b, k]))
  return mask


def test_the_prefix_mask_is_t5s_decoder_causal_attention():
  seg, pos, prefix = _prefix_rows(L=48)
  mask = ops.make_attention_mask(jnp.asarray(seg), jnp.asarray(seg), causal=True,
                                 q_positions=jnp.asarray(pos), kv_positions=jnp.asarray(pos),
                                 q_prefix=jnp.asarray(prefix), kv_prefix=jnp.asarray(prefix))
  np.testing.assert_array_equal(np.asarray(mask), _brute_force_prefix_mask(seg, pos, prefix))
  # The prefix changes the mask (some prefix token sees a later one), and without a
  # prefix the rule is the causal mask.
  causal = ops.make_attention_mask(jnp.asarray(seg), jnp.asarray(seg), causal=True,
                                   q_positions=jnp.asarray(pos), kv_positions=jnp.asarray(pos))
  assert (np.asarray(mask) & ~np.asarray(causal)).any()
  np.testing.assert_array_equal(np.asarray(causal),
                                _brute_force_prefix_mask(seg, pos, np.zeros_like(prefix)))
  with pytest.raises(ValueError, match="prefix mask needs causal"):
    ops.make_attention_mask(jnp.asarray(seg), jnp.asarray(seg), causal=False,
                            q_prefix=jnp.asarray(prefix), kv_prefix=jnp.asarray(prefix))


def test_xla_serves_the_prefix_mask_as_the_reference_forward_and_gradient():
  """Packed prefix-LM rows through the dispatch: xla equals einsum, values and gradients,
  and the prefix reaches the output (it differs from the plain causal one)."""
  q, k, v = _qkv()
  seg, pos, prefix = (jnp.asarray(a) for a in _prefix_rows())
  mask = ops.make_attention_mask(seg, seg, causal=True, q_positions=pos, kv_positions=pos,
                                 q_prefix=prefix, kv_prefix=prefix)
  kind = ops.LayerKind(causal=True, prefix=True)
  real = (np.asarray(seg) != 0)[:, :, None, None]

  def loss(impl, mask):
    def f(q, k, v):
      out = ops.dot_product_attention(q, k, v, impl=impl, kind=kind, mask_B1LS=mask,
                                      segments=ops.Segments(seg, seg))
      return jnp.sum(jnp.where(real, out, 0.0) ** 2)
    return f

  reference = jax.value_and_grad(loss("einsum", mask), argnums=(0, 1, 2))(q, k, v)
  for impl in ("xla", "auto"):  # auto on a CPU: xla.
    got = jax.value_and_grad(loss(impl, mask), argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(got[0], reference[0], rtol=1e-5)
    for g, r in zip(got[1], reference[1]):
      np.testing.assert_allclose(g, r, atol=2e-4, rtol=1e-4)
  causal = ops.make_attention_mask(seg, seg, causal=True, q_positions=pos, kv_positions=pos)
  assert abs(float(loss("einsum", causal)(q, k, v)) - float(reference[0])) > 1e-3


def test_only_the_dense_kernels_serve_a_prefix_and_auto_falls_back(monkeypatch):
  monkeypatch.setattr(ops, "packed_layout_supported", lambda: True)  # An H100's.
  monkeypatch.setattr(ops, "cudnn_available", lambda: True)
  kind = ops.LayerKind(causal=True, prefix=True)
  for platform in ("gpu", "tpu", "cpu"):
    assert ops.choose_kernel("auto", kind, platform=platform, dtype=jnp.bfloat16,
                             head_dim=64, q_len=1024, kv_len=1024) == "xla"
  assert [n for n, k in attention_table.KERNELS.items() if k.prefix] == ["xla", "einsum"]
  for fused in ("cudnn", "splash"):
    text = ops.check_explicit(fused, [ops.LayerKind(causal=False), kind],
                              dtype=jnp.bfloat16, head_dim=64, seq_len=1024)
    assert text.startswith(f"config.model.attention_impl={fused!r} is invalid")
    assert "prefix LM's mask" in text and "xla, einsum" in text and "\n" not in text
