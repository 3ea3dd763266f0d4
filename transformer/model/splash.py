"""Pallas splash attention (jax.experimental.pallas.ops.tpu.splash_attention), the TPU
kernel of config/attention.py's table: plain, and per context shard.

Causal and local masks are mask objects (blocks they rule out are never loaded), packed
documents are segment ids, grouped-query k/v one MQA kernel per k/v head. The kernel's
block sizes are config/attention.py's `splash_blocks` (the rule validation checks and
planning/hlo.py's cost accounting reads). Both functions run in a `jax.shard_map` over
the mesh's batch, length and head shards (context.operand_specs: rows that do not divide
the batch axes, model.init's one row, stay whole). On a CPU they run through Pallas's
interpreter (`interpret`), which is how the tests hold them to the einsum reference.

Shape letters as in the package legend (transformer/model/__init__.py).
"""

from __future__ import annotations

import jax
import numpy as np

from transformer.config import attention as attention_table
from transformer.model import context


def splash_mask(causal: bool, window: int, q_len: int, kv_len: int, heads: int,
                 q_order: np.ndarray | None = None):
  """The mask object of one MQA kernel; `q_order` gives each query row's position in the
  natural order when the rows are permuted (context parallelism's zig-zag)."""
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
  shape = (q_len, kv_len)
  if window:
    one = masks.LocalMask(shape, window_size=(window - 1, 0 if causal else window - 1),
                          offset=0)
  elif causal:
    one = masks.CausalMask(shape)
  else:
    return masks.MultiHeadMask([masks.FullMask(shape)] * heads)  # Order-free.
  if q_order is not None:
    # A computable mask evaluates mask_function(q_sequence[rows], cols), in numpy when
    # the block tables are built and in the kernel: rows in the zig-zag order, keys in
    # the natural one (MaxText's load-balanced causal mask does the same).
    one.q_sequence = np.asarray(q_order, np.int32)
  return masks.MultiHeadMask([one] * heads)


def block_sizes(q_len: int, kv_len: int, shards: int = 1):
  """The kernel's BlockSizes: config/attention.py's `splash_blocks` for every pass."""
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  blocks = attention_table.splash_blocks(q_len, kv_len, shards)
  if isinstance(blocks, str):  # choose_kernel and validation refuse this first.
    raise ValueError(blocks)
  bq, bkv = blocks
  return sk.BlockSizes(block_q=bq, block_kv_compute=bkv, block_kv=bkv, block_q_dkv=bq,
                       block_kv_dkv=bkv, block_kv_dkv_compute=bkv, block_q_dq=bq,
                       block_kv_dq=bkv)


def _rows(kernel, q_BLHD, k_BSKD, v_BSKD, q_seg_BL, kv_seg_BS) -> jax.Array:
  """An MQA splash `kernel` over each row and each k/v head (its G query heads)."""
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  _, L, H, D = q_BLHD.shape
  K = k_BSKD.shape[2]
  G = H // K
  scale = 1.0 / np.sqrt(D)

  def row(q_LHD, k_SKD, v_SKD, q_seg_L, kv_seg_S):
    q_KGLD = (q_LHD * scale).astype(q_LHD.dtype).reshape(L, K, G, D).transpose(1, 2, 0, 3)
    k_KSD, v_KSD = k_SKD.transpose(1, 0, 2), v_SKD.transpose(1, 0, 2)
    ids = sk.SegmentIds(q=q_seg_L, kv=kv_seg_S)
    out_KGLD = jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=ids))(
        q_KGLD, k_KSD, v_KSD)
    return out_KGLD.transpose(2, 0, 1, 3).reshape(L, H, D)

  return jax.vmap(row)(q_BLHD, k_BSKD, v_BSKD, q_seg_BL, kv_seg_BS)


def splash_attention(q_BLHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array,
                     segments, *, causal: bool, window: int, softcap: float = 0.0,
                     interpret: bool = False) -> jax.Array:
  """Pallas splash attention, in shard_map over the mesh's batch and head shards.

  The kernel takes one row [H, L, D] at a time (vmapped over the row's batch shard) and
  its mask as an object, so blocks the causal or local mask rules out are never loaded.
  Grouped-query attention: one MQA kernel per k/v head over its G query heads, so k/v
  are never repeated. `interpret` runs the kernel through Pallas's interpreter (CPU tests).
  """
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  q_spec, kv_spec = context.operand_specs(q_BLHD.shape[0])
  seg_spec = P(q_spec[0], q_spec[1])
  kv_seg_spec = P(kv_spec[0], kv_spec[1])

  def local(q_BLHD, k_BSKD, v_BSKD, q_seg_BL, kv_seg_BS):
    L, H = q_BLHD.shape[1:3]
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    kernel = sk.make_splash_mqa(
        splash_mask(causal, window, L, S, H // K), block_sizes=block_sizes(L, S),
        head_shards=1, q_seq_shards=1, attn_logits_soft_cap=softcap or None,
        interpret=interpret)

    return _rows(kernel, q_BLHD, k_BSKD, v_BSKD, q_seg_BL, kv_seg_BS)

  # The mask in the kernels' op_name: the compile mode counts their FLOPs over the
  # blocks the mask keeps (planning/hlo.py), which the compiled program does not say.
  scope = f"splash_mask_{'causal' if causal else 'full'}" + (f"_window{window}" if window else "")
  with jax.named_scope(scope):
    if jax.sharding.get_abstract_mesh().empty:
      return local(q_BLHD, k_BSKD, v_BSKD, segments.q_BL, segments.kv_BS)
    return jax.shard_map(local, in_specs=(q_spec, kv_spec, kv_spec, seg_spec, kv_seg_spec),
                         out_specs=q_spec, check_vma=False)(
                             q_BLHD, k_BSKD, v_BSKD, segments.q_BL, segments.kv_BS)


def context_splash_attention(q_BLHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array,
                             segments, *, causal: bool, window: int,
                             softcap: float, cross: bool, interpret: bool) -> jax.Array:
  """Splash attention with the length sharded over the context axes (context.py).

  Each shard all-gathers the keys, values and key segment ids and puts them back in the
  natural order (unzigzag, a local reshape; a cross-attention's source is in it already).
  The mask is the whole [L, S] one with its rows in the zig-zag order (`splash_mask`'s
  q_order), cut into the shards' rows by splash itself (`q_seq_shards`): the block tables
  travel into the shard_map beside q (`manual_sharding_spec`), so each shard skips
  exactly the blocks its own queries cannot see, and every shard has the same work.
  """
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  axes, shards = context.axes(), context.size()
  mesh = jax.sharding.get_abstract_mesh()
  q_spec, kv_spec = context.operand_specs(q_BLHD.shape[0])
  _, L, H, _ = q_BLHD.shape
  S, K = k_BSKD.shape[1], k_BSKD.shape[2]
  q_order = np.asarray(context.zigzag(np.arange(L)[None], shards))[0]
  # A full mask (bidirectional, no window) is the same for every shard's rows, whatever
  # their order: each shard runs one kernel over its own L / n rows, its tables whole on
  # every shard. (Cut by q_seq_shards, jax 0.10.2's process_mask fails on a mask without
  # partial blocks: "need at least one array to concatenate".)
  full = not causal and not window
  kernel = sk.make_splash_mqa(
      splash_mask(causal, window, L // shards if full else L, S, H // K,
                  q_order=None if full else q_order),
      # Query blocks within a zig-zag chunk (L / 2n) where one tiles it (splash_blocks).
      block_sizes=block_sizes(L, S, shards), head_shards=1,
      q_seq_shards=1 if full else shards,
      attn_logits_soft_cap=softcap or None, interpret=interpret)
  kernel_spec = kernel.manual_sharding_spec(
      NamedSharding(mesh, P(None, None) if full else P(None, axes)))

  def local(kernel, q_BLHD, k_BSKD, v_BSKD, q_seg_BL, kv_seg_BS):
    k_BSKD, v_BSKD, kv_seg_BS = (jax.lax.all_gather(a, axes, axis=1, tiled=True)
                                 for a in (k_BSKD, v_BSKD, kv_seg_BS))
    if not cross:  # Self-attention: the keys were in the zig-zag order too.
      k_BSKD, v_BSKD, kv_seg_BS = (context.unzigzag(a, shards)
                                   for a in (k_BSKD, v_BSKD, kv_seg_BS))
    return _rows(kernel, q_BLHD, k_BSKD, v_BSKD, q_seg_BL, kv_seg_BS)

  # As in splash_attention, plus the shard count: the compile mode counts each shard's
  # kernel over the blocks its zig-zag rows keep (planning/hlo.py).
  scope = (f"splash_mask_{'causal' if causal else 'full'}" + (f"_window{window}" if window else "")
           + f"_zigzag{shards}")
  with jax.named_scope(scope):
    return jax.shard_map(
        local, in_specs=(kernel_spec, q_spec, kv_spec, kv_spec, P(q_spec[0], q_spec[1]),
                         P(kv_spec[0], kv_spec[1])),
        out_specs=q_spec, check_vma=False)(kernel, q_BLHD, k_BSKD, v_BSKD, segments.q_BL,
                                           segments.kv_BS)
