"""What jax's cuDNN flash attention gets wrong, and the guards `attention_ops.cudnn_attention`
puts around it.

1. **Grouped-query k/v offsets (jax < 0.11.1).** The packed layout (several documents a
   row, as segment lengths and offsets) turns each segment's start into an element offset
   in `_fix_seqlen_offsets` (jax/_src/cudnn/fused_attention_stablehlo.py). jax 0.10.2 and
   0.11.0 multiply the k/v offsets by the QUERY head count (`kv_offsets * N * H`), so with
   fewer k/v heads than query heads every segment that does not start at element 0 (each
   row after the first, each later document of a row) reads keys and values G = H / K
   times too far. jax 0.11.1 multiplies by the k/v head count (`N_kv`); read in the
   wheels of 0.10.2, 0.11.0, 0.11.1 and 0.11.2. On the affected versions the k/v are
   repeated to the query heads before the call (the offsets are then right; the cost is
   G x the k/v memory inside the kernel), and the log says so once.
2. **Positions covered by no segment** (padding) are never written by the packed kernel,
   forward or backward: the output there, and dq/dk/dv there, are whatever the buffer
   held, NaN included. `keep_segments` selects (never multiplies: NaN x 0 is NaN) zeros
   there, on the kernel's inputs (so the select's gradient drops the unwritten dq/dk/dv)
   and on its output.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from absl import logging

# The first jax whose packed cuDNN layout scales the k/v offsets by the k/v head count.
KV_OFFSETS_FIXED_IN = (0, 11, 1)

_SAID: set[str] = set()


def version_tuple(version: str) -> tuple[int, ...]:
  """(0, 11, 2) of "0.11.2" (a suffix such as ".dev20261101" or "rc1" is dropped)."""
  return tuple(int(n) for n in re.match(r"\d+(?:\.\d+)*", version).group().split(".")[:3])


def kv_offsets_scaled_by_query_heads(version: str | None = None) -> bool:
  """Whether jax `version` (default: the running one) has the packed layout's grouped-query
  offset bug (module docstring, point 1)."""
  return version_tuple(version or jax.__version__) < KV_OFFSETS_FIXED_IN


def repeat_kv_for_packed_offsets(k_BSKD: jax.Array, v_BSKD: jax.Array, heads: int
                                 ) -> tuple[jax.Array, jax.Array]:
  """k/v as the packed cuDNN layout of this jax reads them correctly: repeated to the
  `heads` query heads where the offsets are scaled by the query head count (query head h
  uses k/v head h // G, the einsum reference's grouping), unchanged otherwise."""
  kv_heads = k_BSKD.shape[2]
  if kv_heads == heads or not kv_offsets_scaled_by_query_heads():
    return k_BSKD, v_BSKD
  if "gqa" not in _SAID:
    _SAID.add("gqa")
    logging.warning(
        "cuDNN attention: the packed layout of jax before %s scales the key/value offsets "
        "by the query head count (this is jax %s); repeating the %d key/value heads to the "
        "%d query heads before the kernel", ".".join(map(str, KV_OFFSETS_FIXED_IN)),
        jax.__version__, kv_heads, heads)
  groups = heads // kv_heads
  return jnp.repeat(k_BSKD, groups, axis=2), jnp.repeat(v_BSKD, groups, axis=2)


def keep_segments(x_BLHD: jax.Array, segment_ids_BL: jax.Array) -> jax.Array:
  """`x` where the token belongs to a segment (id != 0), exact zeros elsewhere, by a select:
  whatever the kernel left there (NaN included) never reaches the loss or a gradient."""
  return jnp.where((segment_ids_BL != 0)[:, :, None, None], x_BLHD, jnp.zeros((), x_BLHD.dtype))
