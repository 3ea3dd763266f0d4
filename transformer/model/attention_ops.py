"""The attention kernels: which one computes softmax(Q K^T / sqrt(D) + bias) V, and how.

`attention.py` owns the projections, RoPE, norms and the KV cache; this module owns the
product itself (MaxText's AttentionOp / Attention split). Each kernel gets the mask the
way it wants it, so that a fused kernel skips what is masked instead of computing and
discarding it:

  einsum  plain einsums, float32 softmax: the reference; any bias, softcap, dropout
  xla     jax.nn.dot_product_attention(implementation="xla") with the dense boolean mask
  cudnn   cuDNN flash attention on NVIDIA GPUs: causality as the kernel's mask type,
          packed documents as per-segment lengths and offsets (sm_90+), or with
          model.attention_max_segments=1 one document a row as per-row lengths
          (jax.nn.dot_product_attention, any cuDNN GPU), a sliding window as its window,
          grouped-query k/v passed as they are (repeated on jax < 0.11.1: cudnn_guard.py)
  splash  Pallas splash attention on TPUs (splash.py): causal and local masks as mask
          objects (fully masked blocks are skipped), packed documents as segment ids,
          grouped-query k/v as one MQA kernel per k/v head; blocks from the lengths
  auto    cudnn on GPUs, splash on TPUs, xla elsewhere; where the chosen kernel cannot
          serve a layer kind (a T5/ALiBi bias, softcapping, attention dropout, a decoding
          step, a prefix LM's mask, a head size, length or dtype it rejects) that layer
          kind falls back to xla (einsum where only einsum can) and the reason is logged once

What each kernel can serve (its platform, the layer kinds it takes, its dtype, head-size
and block rules) is config/attention.py's KERNELS table, the one place validation,
`auto` and planning/ read; KERNEL_FUNCTIONS here binds each name to its code. Adding a
kernel: its code, its KERNEL_FUNCTIONS entry, its KERNELS entry (docs/layout.md).

With the sequence sharded over a context axis (context.py), `context_attention` runs the
einsum or xla kernel per shard on the shard's queries and all-gathered keys/values, and
splash.context_splash_attention splash per shard with the load-balanced mask; cuDNN
cannot serve there ("auto" uses xla on a GPU then, saying so once).

An explicit fused kernel that cannot serve the config is a ConfigError before anything
compiles (`check_explicit`, and config/attention.py's `validate_lengths` for the
lengths), naming the field and what would work.

Shape letters: B batch, L query length, S key length, H query heads, K key/value heads,
G query heads per key/value head (H // K), D head dim.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import linen as nn

from transformer import accelerator
from transformer.config import attention as attention_table
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError, DataError
from transformer.model import context
from transformer.model import cudnn_guard
from transformer.model import dropout as dropout_lib
from transformer.model import positions
from transformer.model import splash

# config/attention.py's table says what each kernel can compute; KERNEL_FUNCTIONS below
# binds each name to its code (tests/test_config_registries.py holds the two equal).
LayerKind = attention_table.LayerKind


class Segments(NamedTuple):
  """What a fused kernel needs instead of a dense mask: integer segment ids per token
  (0 padding; packed documents 1, 2, ...). Causality and the window are static."""
  q_BL: jax.Array
  kv_BS: jax.Array


def unsupported_reason(kernel: str, kind: LayerKind, *, dtype, head_dim: int,
                       q_len: int | None, kv_len: int | None,
                       hardware: bool = True, context: int = 1) -> str | None:
  """Why `kernel` cannot compute this call, or None when it can: the table's rule
  (config/attention.py), then with `hardware` what the device being compiled for lacks
  (config checks know no device); `context` is how many shards the sequence is cut into."""
  if kernel not in KERNEL_FUNCTIONS:
    raise ValueError(f"unknown attention kernel {kernel!r}; valid: {tuple(KERNEL_FUNCTIONS)}")
  reason = attention_table.unsupported_reason(
      kernel, kind, dtype=jnp.dtype(dtype).name, head_dim=head_dim, q_len=q_len,
      kv_len=kv_len, context=context)
  device_check = KERNEL_FUNCTIONS[kernel].device_reason
  if reason is None and hardware and device_check is not None:
    reason = device_check(kind)
  return reason


def _cudnn_device_reason(kind: LayerKind) -> str | None:
  if not cudnn_available():
    if jax.default_backend() not in ("gpu", "cuda"):  # The hint must hold on this host.
      return (f"cuDNN attention runs on NVIDIA GPUs and this host has none (jax's backend "
              f"is {jax.default_backend()}); compiling for a GPU target here "
              "(--mode=compile) needs nvidia-cudnn-cu12 installed")
    return ("cuDNN is not installed (pip install nvidia-cudnn-cu12; jax[cuda12] brings it "
            "on a GPU host)")
  if kind.packed and not packed_layout_supported():
    return ("cuDNN's packed layout (packed documents as segment offsets) needs an sm_90 "
            "(Hopper) GPU or newer; rows of one document each (padding at the end) run "
            "on any cuDNN GPU with model.attention_max_segments=1")
  return None


@functools.lru_cache(maxsize=None)
def cudnn_available() -> bool:
  """Whether jax finds cuDNN (a GPU host's jax[cuda12] has it; a CPU host compiling for a
  GPU target has it only with nvidia-cudnn-cu12 installed)."""
  try:
    # pylint: disable-next=g-import-not-at-top
    from jax._src.cudnn import fused_attention_stablehlo as cudnn
    return bool(cudnn.check_cudnn_version())
  except Exception:  # pylint: disable=broad-except  (no plugin, no library: not there)
    return False


# GPUs of compute capability 9.0 or newer by device kind, for a compile-only target
# (a deviceless compile's abstract mesh names its device kind, not its capability).
_HOPPER_OR_NEWER = ("H100", "H200", "H800", "H20", "GH200", "B100", "B200", "B300", "GB200")


def packed_layout_supported() -> bool:
  """Whether the GPU being compiled for runs cuDNN's packed layout (sm_90 or newer): a
  real GPU by its capability, a compile-only target (--mode=compile) by its kind."""
  if jax.default_backend() == "gpu":
    capability = getattr(jax.devices()[0], "compute_capability", "0.0")
    return tuple(int(x) for x in str(capability).split(".")[:2]) >= (9, 0)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:  # No target named (a bare trace): jax's own check decides when it lowers.
    return True
  return any(name in str(mesh.abstract_device.device_kind) for name in _HOPPER_OR_NEWER)


_FALLBACKS_SAID: set[tuple[str, str]] = set()


def choose_kernel(impl: str, kind: LayerKind, *, platform: str, dtype, head_dim: int,
                  q_len: int | None, kv_len: int | None, context: int = 1) -> str:
  """The kernel that computes a call: `impl` itself, or for "auto" the platform's fused
  kernel where it can serve `kind`, else xla (einsum where only einsum can). An explicit
  kernel that cannot serve raises ValueError (check_explicit says it before compiling)."""
  if impl != "auto" and not (kind.decoding and not attention_table.KERNELS[impl].decoding):
    reason = unsupported_reason(impl, kind, dtype=dtype, head_dim=head_dim, q_len=q_len,
                                kv_len=kv_len, context=context)
    if reason:  # What the config allowed but the device cannot (an sm_80 GPU, say).
      raise ConfigError(f"config.model.attention_impl={impl!r} cannot compute this attention here: "
                        f"{reason}; use model.attention_impl='auto' (falls back per layer "
                        "kind) or 'xla'")
    return impl
  # An explicit fused kernel serves training and evaluation; a decoding step (a KV cache)
  # falls back like "auto" (check_explicit said so before compiling).
  fused = impl if impl != "auto" else attention_table.fused_kernel(platform)
  if fused is None:
    return "xla" if unsupported_reason("xla", kind, dtype=dtype, head_dim=head_dim,
                                       q_len=q_len, kv_len=kv_len) is None else "einsum"
  reason = unsupported_reason(fused, kind, dtype=dtype, head_dim=head_dim, q_len=q_len,
                              kv_len=kv_len, context=context)
  if reason is None:
    return fused
  fallback = "xla" if unsupported_reason("xla", kind, dtype=dtype, head_dim=head_dim,
                                         q_len=q_len, kv_len=kv_len) is None else "einsum"
  said = (f"{'cross' if kind.cross else 'self'}-{'causal' if kind.causal else 'bidir'}"
          f"{'-prefix' if kind.prefix else ''}"
          f"{'-decode' if kind.decoding else ''}", reason)
  if said not in _FALLBACKS_SAID:  # Once per layer kind and reason, not once per layer.
    _FALLBACKS_SAID.add(said)
    logging.warning("model.attention_impl=%r: %s attention uses %s, not %s: %s",
                    impl, said[0], fallback, fused, reason)
  return fallback


def layer_kinds(config) -> list[LayerKind]:
  """The attention calls a ModelConfig's model makes in training and evaluation."""
  has_bias = positions.POSITIONS[config.position].self_attention_bias is not None
  packed = config.attention_max_segments > 1 and config.rows_packed
  common = dict(has_bias=has_bias, softcap=config.attention_softcap,
                dropout=config.attention_dropout > 0, packed=packed)
  causal = {"decoder": (True,), "encoder": (False,), "encoder_decoder": (False, True)}
  # A decoder whose objective feeds it a `prefix` field (a prefix LM, config/objective.py)
  # attends through the prefix mask; an encoder-decoder's decoder never does.
  prefix = config.arch == "decoder" and "prefix" in objective_lib.resolve(config).model_inputs
  kinds = [LayerKind(causal=c, prefix=prefix and c, **common)
           for c in causal.get(config.arch, (True, False))]
  if config.sliding_window:
    kinds += [dataclasses.replace(k, window=config.sliding_window) for k in kinds]
  if config.arch == "encoder_decoder":
    kinds.append(LayerKind(causal=False, cross=True, softcap=config.attention_softcap,
                           dropout=config.attention_dropout > 0, packed=packed))
  return kinds


def check_explicit(impl: str, kinds: list[LayerKind], *, dtype, head_dim: int,
                   seq_len: int | None) -> str | None:
  """The ConfigError text for an explicit fused kernel that cannot serve one of the
  model's attention kinds (training and evaluation calls; decoding falls back), or None."""
  if impl not in attention_table.FUSED:
    return None
  for kind in kinds:
    if kind.decoding:
      continue
    reason = unsupported_reason(impl, kind, dtype=dtype, head_dim=head_dim, q_len=seq_len,
                                kv_len=seq_len, hardware=False)
    if reason:
      return (f"config.model.attention_impl={impl!r} is invalid for this model: {reason}; "
              f"use model.attention_impl='auto' (falls back per layer kind) or 'xla'")
  return None


def make_attention_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array, *,
                        causal: bool, q_positions: jax.Array | None = None,
                        kv_positions: jax.Array | None = None, window: int = 0,
                        q_prefix: jax.Array | None = None,
                        kv_prefix: jax.Array | None = None) -> jax.Array:
  """Builds a boolean [B, 1, L, S] mask: True where a query may attend to a key.

  Segment ids are integers: 0 is padding, packed documents are 1, 2, ... A query
  attends only to keys of its own segment, so packed documents never see each
  other and real tokens never see padding. With `causal`, a query also sees only
  keys at positions <= its own (positions default to the array index). With a
  `window` > 0 (local attention) a query sees only keys less than `window` positions
  away: its own and the window - 1 before it when causal (Mistral, Gemma 2), either
  side otherwise.

  With `q_prefix` and `kv_prefix` (a prefix LM, causal only) a query may also attend
  to a later key when both are in their segment's prefix: query q sees key k iff they
  share a segment and (pos_k <= pos_q or (prefix_q and prefix_k)), T5/seqio's
  `decoder_causal_attention`. A window then bounds the distance either side.

  Args:
    q_segment_ids: [B, L] segment ids of the queries.
    kv_segment_ids: [B, S] segment ids of the keys.
    causal: whether to forbid attending to later positions.
    q_positions: optional [B, L] positions of the queries.
    kv_positions: optional [B, S] positions of the keys.
    window: the sliding window in positions; 0 = no window.
    q_prefix: optional [B, L] int or bool, nonzero on the queries in a prefix.
    kv_prefix: optional [B, S] int or bool, nonzero on the keys in a prefix.

  Returns:
    A [B, 1, L, S] boolean mask (the 1 broadcasts over heads).
  """
  if (q_prefix is None) != (kv_prefix is None) or (q_prefix is not None and not causal):
    raise ValueError("a prefix mask needs causal=True and both q_prefix and kv_prefix")
  mask_BLS = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
  if causal or window:
    if q_positions is None:
      q_positions = jnp.broadcast_to(jnp.arange(q_segment_ids.shape[1]), q_segment_ids.shape)
    if kv_positions is None:
      kv_positions = jnp.broadcast_to(jnp.arange(kv_segment_ids.shape[1]), kv_segment_ids.shape)
    distance_BLS = q_positions[:, :, None] - kv_positions[:, None, :]
    if causal:
      sees_BLS = distance_BLS >= 0
      if q_prefix is not None:
        sees_BLS |= (q_prefix[:, :, None] != 0) & (kv_prefix[:, None, :] != 0)
      mask_BLS &= sees_BLS
    if window:
      one_sided = causal and q_prefix is None
      mask_BLS &= (distance_BLS if one_sided else jnp.abs(distance_BLS)) < window
  return mask_BLS[:, None, :, :]


def einsum_attention(q_BLHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array,
                     mask_B1LS: jax.Array, *, bias_BHLS: jax.Array | None = None,
                     softcap: float = 0.0, dropout_rate: float = 0.0,
                     dropout_rng: jax.Array | None = None) -> jax.Array:
  """Reference softmax(QK^T / sqrt(D) + bias + mask) V in plain einsums, softmax in float32.

  With `softcap` > 0 the scaled scores become softcap * tanh(scores / softcap) before
  the bias and the mask (Gemma 2).
  """
  B, L, H, D = q_BLHD.shape
  K = k_BSKD.shape[2]
  # Grouped-query attention: each of the K kv heads serves H // K query heads.
  q_BLKGD = q_BLHD.reshape(B, L, K, H // K, D)
  logits_BKGLS = jnp.einsum("blkgd,bskd->bkgls", q_BLKGD, k_BSKD).astype(jnp.float32)
  logits_BKGLS = logits_BKGLS / jnp.sqrt(jnp.float32(D))
  if softcap:
    logits_BKGLS = softcap * jnp.tanh(logits_BKGLS / softcap)
  if bias_BHLS is not None:
    bias_BKGLS = jnp.broadcast_to(bias_BHLS, (B, H) + bias_BHLS.shape[2:]).reshape(
        B, K, H // K, L, bias_BHLS.shape[-1])  # Not -1: L may be 0 (a cache-filling call).
    logits_BKGLS = logits_BKGLS + bias_BKGLS.astype(jnp.float32)
  mask_B11LS = mask_B1LS[:, :, None, :, :]
  logits_BKGLS = jnp.where(mask_B11LS, logits_BKGLS, jnp.finfo(jnp.float32).min)
  probs_BKGLS = jax.nn.softmax(logits_BKGLS, axis=-1)
  if dropout_rate > 0.0:
    probs_BKGLS = dropout_lib.drop(probs_BKGLS, dropout_rng, dropout_rate)
  out_BLKGD = jnp.einsum("bkgls,bskd->blkgd", probs_BKGLS.astype(v_BSKD.dtype), v_BSKD)
  return out_BLKGD.reshape(B, L, H, D)


def segment_lengths_and_offsets(segment_ids_BL: jax.Array, max_segments: int
                                ) -> tuple[jax.Array, jax.Array]:
  """cuDNN's packed layout from segment ids: per row, each segment's length [B, M] and
  start [B, M + 1], -1 past the row's last segment; M = min(max_segments, L).

  Segments are the runs of equal non-zero ids (packing writes each document as one
  run); padding (0) belongs to no segment. M sizes the kernel's softmax statistics,
  float32 [B * M, H, L] kept per layer for the backward pass: M = L would make them as
  large as the scores flash attention exists to avoid (1.5 GiB a layer for gpt_small at
  32 x 1024). Rows with more segments are refused on the host (check_rows).
  """
  B, L = segment_ids_BL.shape
  M = min(max_segments, L)
  real_BL = segment_ids_BL != 0
  previous_BL = jnp.pad(segment_ids_BL, ((0, 0), (1, 0)))[:, :-1]
  starts_BL = real_BL & (segment_ids_BL != previous_BL)
  # The k-th start of a row goes to slot k; the other slots stay -1.
  slot_BL = jnp.where(starts_BL, jnp.cumsum(starts_BL, axis=1) - 1, M + 1)  # M + 1: dropped.
  index_BL = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
  rows_BL = jnp.broadcast_to(jnp.arange(B)[:, None], (B, L))
  offsets_BM = jnp.full((B, M + 1), -1, jnp.int32).at[rows_BL, slot_BL].set(
      index_BL, mode="drop")
  # A segment's length: its real tokens (a run's ids are equal; later ids start later).
  lengths_BM = jnp.zeros((B, M + 1), jnp.int32).at[
      rows_BL, jnp.where(real_BL, jnp.cumsum(starts_BL, axis=1) - 1, M)].add(
          1, mode="drop")[:, :M]
  lengths_BM = jnp.where(offsets_BM[:, :M] >= 0, lengths_BM, -1)
  return lengths_BM, offsets_BM


def cudnn_attention(q_BLHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array,
                    segments: Segments, *, causal: bool, window: int,
                    max_segments: int, padded: bool = True) -> jax.Array:
  """cuDNN flash attention with the mask as the kernel's own: causal as its mask type,
  padding and packed documents as per-segment lengths and offsets (`max_segments` > 1,
  the packed layout: sm_90+, and jax's private module, since jax.nn.dot_product_attention
  takes no offsets in 0.10 or 0.11) or, with `max_segments` == 1, each row's length
  (the public jax.nn.dot_product_attention; any cuDNN GPU); the window as its sliding
  window. No dense [B, 1, L, S] array exists, so no bias gradient either.

  `padded`: whether a row may hold padding (model config's rows_padded, from the input
  pipeline). Tokens of no segment are zeros in and out, by a select (cudnn_guard.py: the
  packed kernel never writes them); rows without padding need none, and one document a
  row without padding is the kernel's plain call (no lengths, as torch's is_causal). On
  jax < 0.11.1 grouped-query k/v are repeated to the query heads for the packed layout
  (its k/v offsets are scaled by the query heads).
  """
  one_document = min(max_segments, q_BLHD.shape[1]) == 1
  if one_document and not padded:
    return jax.nn.dot_product_attention(
        q_BLHD, k_BSKD, v_BSKD, is_causal=causal,
        local_window_size=(window - 1, 0) if window else None, implementation="cudnn")
  keep = cudnn_guard.keep_segments if padded else lambda x, ids: x
  q_BLHD = keep(q_BLHD, segments.q_BL)
  k_BSKD = keep(k_BSKD, segments.kv_BS)
  v_BSKD = keep(v_BSKD, segments.kv_BS)
  if one_document:
    # One document a row from position 0 (check_rows refuses others): its length.
    lengths = lambda ids: jnp.sum(ids != 0, axis=1, dtype=jnp.int32)
    out_BLHD = jax.nn.dot_product_attention(
        q_BLHD, k_BSKD, v_BSKD, is_causal=causal,
        query_seq_lengths=lengths(segments.q_BL), key_value_seq_lengths=lengths(segments.kv_BS),
        local_window_size=(window - 1, 0) if window else None, implementation="cudnn")
    return keep(out_BLHD, segments.q_BL)
  # pylint: disable-next=g-import-not-at-top
  from jax._src.cudnn import fused_attention_stablehlo as cudnn
  k_BSKD, v_BSKD = cudnn_guard.repeat_kv_for_packed_offsets(k_BSKD, v_BSKD, q_BLHD.shape[2])
  q_lengths, q_offsets = segment_lengths_and_offsets(segments.q_BL, max_segments)
  kv_lengths, kv_offsets = segment_lengths_and_offsets(segments.kv_BS, max_segments)
  mask_type = cudnn.MaskType.PADDING_CAUSAL if causal else cudnn.MaskType.PADDING
  out_BLHD = cudnn.dot_product_attention(
      q_BLHD, k_BSKD, v_BSKD, q_seqlen=q_lengths, kv_seqlen=kv_lengths,
      q_offsets=q_offsets, kv_offsets=kv_offsets,
      scale=float(1.0 / np.sqrt(q_BLHD.shape[-1])), mask_type=mask_type,
      qkv_layout="BTNH", sliding_window_length=window or None)
  return keep(out_BLHD, segments.q_BL)


def context_attention(q_BLHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, *,
                      kernel: str, mask_B1LS: jax.Array, bias_BHLS: jax.Array | None,
                      softcap: float, dropout_rate: float,
                      dropout_rng: jax.Array | None) -> jax.Array:
  """Attention with the length sharded over the context axes (context.py): in a
  `jax.shard_map`, each shard all-gathers the keys and values (tiled, so in the stack's
  order) and attends from its own queries with its rows of the mask and bias.

  The mask and bias were built at the top of the stack from global positions and
  segment ids in the same (zig-zag) order as q/k/v, so a shard's [L / n, S] slab of them
  is exactly what its queries may see. Memory per shard: the whole k/v of the row
  (B, S, K, D) and the [L / n, S] scores of the dense kernels.
  """
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  axes = context.axes()
  q_spec, kv_spec = context.operand_specs(q_BLHD.shape[0])
  rows, length, heads = q_spec[0], q_spec[1], q_spec[2]
  # Every mesh axis that splits the queries: a shard's dropout key folds in its index
  # over all of them, so that row, head and length shards draw different masks (devices
  # that hold the same queries, along an axis not named here, draw the same one).
  split = tuple(a for part in (rows, length, heads)
                for a in (part if isinstance(part, tuple) else (part,) if part else ()))
  mask_spec = P(rows if mask_B1LS.shape[0] > 1 else None, None, length, None)
  operands, specs = [q_BLHD, k_BSKD, v_BSKD, mask_B1LS], [q_spec, kv_spec, kv_spec, mask_spec]
  if bias_BHLS is not None:  # T5's and ALiBi's biases may broadcast over the batch.
    operands.append(bias_BHLS)
    specs.append(P(rows if bias_BHLS.shape[0] > 1 else None,
                   heads if bias_BHLS.shape[1] > 1 else None, length, None))
  if dropout_rng is not None:
    operands.append(dropout_rng)
    specs.append(P())
  bias_BHLS_given, dropout_rng_given = bias_BHLS is not None, dropout_rng is not None

  def local(q_BLHD, k_BSKD, v_BSKD, mask_B1LS, *rest):
    bias_BHLS = rest[0] if bias_BHLS_given else None
    rng = rest[-1] if dropout_rng_given else None
    k_BSKD = jax.lax.all_gather(k_BSKD, axes, axis=1, tiled=True)
    v_BSKD = jax.lax.all_gather(v_BSKD, axes, axis=1, tiled=True)
    if kernel == "einsum":
      if rng is not None:  # Each shard draws its own queries' dropout.
        rng = jax.random.fold_in(rng, jax.lax.axis_index(split))
      return einsum_attention(q_BLHD, k_BSKD, v_BSKD, mask_B1LS, bias_BHLS=bias_BHLS,
                              softcap=softcap, dropout_rate=dropout_rate, dropout_rng=rng)
    if bias_BHLS is not None:
      bias_BHLS = bias_BHLS.astype(q_BLHD.dtype)
    return jax.nn.dot_product_attention(q_BLHD, k_BSKD, v_BSKD, bias=bias_BHLS,
                                        mask=mask_B1LS, implementation="xla")

  return jax.shard_map(local, in_specs=tuple(specs), out_specs=q_spec,
                       check_vma=False)(*operands)


class Call(NamedTuple):
  """One attention call's operands beside q, k and v, as every kernel function takes them."""
  kind: LayerKind
  mask_B1LS: jax.Array | None
  segments: Segments | None
  bias_BHLS: jax.Array | None
  dropout_rate: float
  dropout_rng: jax.Array | None
  max_segments: int
  interpret: bool  # Pallas kernels through the interpreter (a CPU mesh).
  padded: bool = True  # Rows may hold padding (cuDNN's selects; cudnn_attention).


def _xla(q_BLHD, k_BSKD, v_BSKD, call: Call) -> jax.Array:
  bias_BHLS = call.bias_BHLS
  if bias_BHLS is not None:
    bias_BHLS = bias_BHLS.astype(q_BLHD.dtype)
  return jax.nn.dot_product_attention(q_BLHD, k_BSKD, v_BSKD, bias=bias_BHLS,
                                      mask=call.mask_B1LS, implementation="xla")


def _einsum(q_BLHD, k_BSKD, v_BSKD, call: Call) -> jax.Array:
  return einsum_attention(q_BLHD, k_BSKD, v_BSKD, call.mask_B1LS, bias_BHLS=call.bias_BHLS,
                          softcap=call.kind.softcap, dropout_rate=call.dropout_rate,
                          dropout_rng=call.dropout_rng)


def _dense_per_shard(name: str):
  def run(q_BLHD, k_BSKD, v_BSKD, call: Call) -> jax.Array:
    return context_attention(q_BLHD, k_BSKD, v_BSKD, kernel=name, mask_B1LS=call.mask_B1LS,
                             bias_BHLS=call.bias_BHLS, softcap=call.kind.softcap,
                             dropout_rate=call.dropout_rate, dropout_rng=call.dropout_rng)
  return run


def _cudnn(q_BLHD, k_BSKD, v_BSKD, call: Call) -> jax.Array:
  return cudnn_attention(q_BLHD, k_BSKD, v_BSKD, call.segments, causal=call.kind.causal,
                         window=call.kind.window, max_segments=call.max_segments,
                         padded=call.padded)


def _splash(q_BLHD, k_BSKD, v_BSKD, call: Call) -> jax.Array:
  return splash.splash_attention(q_BLHD, k_BSKD, v_BSKD, call.segments,
                                 causal=call.kind.causal, window=call.kind.window,
                                 softcap=call.kind.softcap, interpret=call.interpret)


def _splash_per_shard(q_BLHD, k_BSKD, v_BSKD, call: Call) -> jax.Array:
  return splash.context_splash_attention(
      q_BLHD, k_BSKD, v_BSKD, call.segments, causal=call.kind.causal,
      window=call.kind.window, softcap=call.kind.softcap, cross=call.kind.cross,
      interpret=call.interpret)


class KernelFunctions(NamedTuple):
  """A kernel's code: the call on whole sequences, the call per context shard (None when
  config/attention.py's entry says it does not serve one), what the device must have."""
  run: Callable[[jax.Array, jax.Array, jax.Array, Call], jax.Array]
  per_shard: Callable[[jax.Array, jax.Array, jax.Array, Call], jax.Array] | None
  device_reason: Callable[[LayerKind], str | None] | None = None
  takes_segments: bool = False  # Reads Call.segments, not the dense mask.


# The code of config/attention.py's KERNELS, name by name (the same names, same order).
KERNEL_FUNCTIONS: dict[str, KernelFunctions] = {
    "xla": KernelFunctions(_xla, _dense_per_shard("xla")),
    "einsum": KernelFunctions(_einsum, _dense_per_shard("einsum")),
    "cudnn": KernelFunctions(_cudnn, None, _cudnn_device_reason, takes_segments=True),
    "splash": KernelFunctions(_splash, _splash_per_shard, takes_segments=True),
}


def dot_product_attention(q_BLHD: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, *,
                          impl: str, kind: LayerKind, mask_B1LS: jax.Array | None,
                          segments: Segments | None, bias_BHLS: jax.Array | None = None,
                          dropout_rate: float = 0.0,
                          dropout_rng: jax.Array | None = None,
                          max_segments: int = 1, padded: bool = True) -> jax.Array:
  """softmax(Q K^T / sqrt(D) + bias) V over what the mask allows, by the kernel that
  `choose_kernel` picks for `impl` on the current mesh's platform; with the length
  sharded over a context axis, per shard (KERNEL_FUNCTIONS' `per_shard`).
  `max_segments`: model.attention_max_segments, the packed documents a row may hold
  (cuDNN's layout; 1 for rows of one document); `padded`: whether a row may hold padding
  (the input pipeline's row layout)."""
  platform = accelerator.platform_of_mesh()
  shards = 1 if kind.decoding else context.size()
  kernel = choose_kernel(impl, kind, platform=platform, dtype=q_BLHD.dtype,
                         head_dim=q_BLHD.shape[-1], q_len=q_BLHD.shape[1],
                         kv_len=k_BSKD.shape[1], context=shards)
  functions = KERNEL_FUNCTIONS[kernel]
  if functions.takes_segments and segments is None:
    raise ValueError(f"the {kernel} attention needs the segment ids of its queries and keys")
  call = Call(kind, mask_B1LS, segments, bias_BHLS, dropout_rate, dropout_rng, max_segments,
              interpret=platform == "cpu", padded=padded)
  run = functions.per_shard if shards > 1 else functions.run
  return run(q_BLHD, k_BSKD, v_BSKD, call)


def packed_rows_limit(config, platform: str, context_shards: int = 1) -> int | None:
  """model.attention_max_segments when a training or evaluation attention of `config`'s
  model runs cuDNN's packed layout on `platform` (never with the sequence cut into
  `context_shards` > 1: cuDNN does not serve it), 1 where cuDNN takes one document a row
  (rows_packed False), else None (no limit on packing)."""
  for kind in layer_kinds(config):
    kernel = choose_kernel(config.attention_impl, kind, platform=platform, dtype=config.dtype,
                           head_dim=config.head_dim, q_len=None, kv_len=None,
                           context=context_shards)
    if kernel == "cudnn":
      return config.attention_max_segments if config.rows_packed else 1
  return None


def mesh_packed_rows_limit(config, mesh: jax.sharding.Mesh, rules) -> int | None:
  """packed_rows_limit of `config`'s model on `mesh` (its platform, and the context shards
  the logical `rules` cut a sequence into): what every batch a step reads is checked
  against (training's and evaluation's rows, a benchmark's packed requests)."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):  # Where "length" is sharded.
    shards = context.size()
  return packed_rows_limit(config, mesh.devices.flat[0].platform, shards)


def check_rows(batch: dict, limit: int | None,
               layout: objective_lib.RowLayout = objective_lib.RowLayout()) -> None:
  """Refuses a host batch whose rows hold what the compiled step was not built for:
  padding or several documents where `layout` (the input pipeline's, model config's
  rows_padded / rows_packed) has none, since fused attention then skips them; more than
  `limit` packed documents (cuDNN's packed layout was compiled for at most that many;
  more would be attended wrongly); with `limit` 1 (the per-row-length layout) a row
  whose document does not start at position 0 (the kernel would take its first tokens
  for it). `limit` None: no fused kernel with a segment limit (no limit on packing)."""
  if limit is None:  # No fused kernel reads the layout: every kernel masks by the ids.
    return
  found = objective_lib.layout_of_batch(batch)
  for what, key in (("padding", "padded"), ("several documents", "packed")):
    if getattr(found, key) and not getattr(layout, key):
      raise DataError(
          f"a batch row holds {what} (segment ids), but the step was compiled for the "
          f"input pipeline's rows, which hold none ({layout}): the attention kernels "
          f"skip them. Build the trainer with this batch's layout "
          f"(config.objective.layout_of_batch)")
  for key, ids in batch.items():
    if not key.endswith("segment_ids"):
      continue
    ids = np.asarray(ids)
    previous = np.concatenate([np.zeros_like(ids[..., :1]), ids[..., :-1]], axis=-1)
    most = int(((ids != 0) & (ids != previous)).sum(axis=-1).max(initial=0))
    if most > limit:
      raise DataError(
          f"a batch row holds {most} packed documents ({key}), more than "
          f"config.model.attention_max_segments={limit}, the most cuDNN's packed attention "
          f"layout was compiled for: raise it to at least {most} (its softmax statistics "
          f"take B x that x heads x length float32 per layer) or set "
          f"model.attention_impl='xla'")
    if limit == 1 and ((ids[..., 0] == 0) & (ids != 0).any(axis=-1)).any():
      raise DataError(
          f"a batch row's document does not start at position 0 ({key}, padding first): "
          f"config.model.attention_max_segments=1 gives cuDNN each row's length only; pad at "
          f"the end, raise it (the packed layout, sm_90 GPUs) or set "
          f"model.attention_impl='xla'")
