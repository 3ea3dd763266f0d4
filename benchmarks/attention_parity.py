"""The fused attention kernels against the einsum reference on the device at hand.

On a GPU: cuDNN (bfloat16, float16; the packed layout and, for one document a row, the
per-row-length one) and XLA's `jax.nn.dot_product_attention` (bfloat16, float32). On a
TPU: splash and XLA. Each case (causal, packed documents, padding, a sliding window,
bidirectional, grouped-query and multi-query heads) compares the output and the
gradients of q, k and v with `attention_ops.einsum_attention` computed in float32
(matmul precision "highest") from the same inputs, over the tokens that belong to a
document (padding is zeros by contract). Errors are max |got - want| / max |want| per
array; a case passes when every array is within the tolerance of its dtype (TOLERANCE).
A case the kernel cannot serve is listed with its reason (`unsupported_reason`).

`gqa_packed_unguarded` runs the packed grouped-query case with cudnn_guard's k/v repeat
turned off: on jax < 0.11.1 it is expected to fail (the offset bug), on later jax to pass.
The `..._jax010` cases put jax 0.10's offset scaling (k/v offsets x the query heads) into
the running jax (`emulate_jax010_offsets`), so a GPU with a fixed jax still shows that the
bug reads wrong keys (unguarded: expected to fail) and that the guard repairs it (pass).

  python benchmarks/attention_parity.py                    # on a GPU or TPU host
  python benchmarks/attention_parity.py --json=parity.json     # or --json=- (ROW lines)
  python benchmarks/attention_parity.py --allow_cpu --length=128   # the script itself, here

Without a GPU or TPU (and without --allow_cpu) it says so and exits 0. With --allow_cpu
on a CPU it runs xla and splash (Pallas's interpreter) at small shapes: a dry run of the
script, not of cuDNN. Exit status 1 when a case fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.model import attention_ops as ops
from transformer.model import cudnn_guard
# pylint: enable=g-import-not-at-top,wrong-import-position

# Relative error bound (max abs error over max abs reference) per input dtype: bf16 has
# 8 mantissa bits (2^-8 = 0.4% per rounding), fp16 11; gradients sum over more terms.
TOLERANCE = {"bfloat16": (2e-2, 4e-2), "float16": (5e-3, 1e-2), "float32": (1e-4, 5e-4)}


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  causal: bool = True
  layout: str = "packed"  # packed | padded (one document a row) | full
  window: int = 0
  heads: int = 8
  kv_heads: int = 8
  guard: bool = True  # cudnn_guard's k/v repeat on an affected jax.
  jax010: bool = False  # jax 0.10's k/v offset scaling put into this jax (cuDNN only).


CASES = (
    Case("causal", layout="full"),
    Case("causal_padded", layout="padded"),
    Case("causal_packed"),
    Case("bidir_packed", causal=False),
    Case("bidir_padded", causal=False, layout="padded"),
    Case("window_packed", window=64),
    Case("window_padded", window=64, layout="padded"),
    Case("gqa_packed", heads=32, kv_heads=8),
    Case("gqa_padded", heads=32, kv_heads=8, layout="padded"),
    Case("mqa_packed", heads=8, kv_heads=1),
    Case("gqa_packed_unguarded", heads=32, kv_heads=8, guard=False),
    # 16:4 heads, shapes no other case has: no cached lowering of the unpatched jax serves.
    Case("gqa_packed_jax010", heads=16, kv_heads=4, jax010=True),
    Case("gqa_packed_jax010_unguarded", heads=16, kv_heads=4, guard=False, jax010=True),
)


def segments_for(layout: str, batch: int, length: int) -> np.ndarray:
  """Segment ids [B, L]: documents of uneven lengths (packed), one a row with padding at
  the end (padded), or every token one document (full)."""
  seg = np.ones((batch, length), np.int32)
  if layout == "full":
    return seg
  rng = np.random.default_rng(1)
  for row in range(batch):
    end = length - (length // 8) * (row % 2) - 3 * row  # Some rows padded, some not.
    seg[row, end:] = 0
    if layout == "packed":
      cuts = np.sort(rng.choice(np.arange(8, end - 8), size=3 + row, replace=False))
      for i, cut in enumerate(cuts):
        seg[row, cut:end] = i + 2
  return seg


def kernel_fn(kernel: str, case: Case, seg, max_segments: int, interpret: bool):
  mask = ops.make_attention_mask(seg, seg, causal=case.causal, window=case.window)
  segments = ops.Segments(seg, seg)
  if kernel == "cudnn":
    return lambda q, k, v: ops.cudnn_attention(q, k, v, segments, causal=case.causal,
                                               window=case.window, max_segments=max_segments)
  if kernel == "splash":
    return lambda q, k, v: ops.splash_attention(q, k, v, segments, causal=case.causal,
                                                window=case.window, interpret=interpret)
  if kernel == "xla":
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask,
                                                        implementation="xla")
  return lambda q, k, v: ops.einsum_attention(q, k, v, mask)


def out_and_grads(fn, q, k, v, real, cotangent):
  """The output (padding zeroed) and the gradients of sum(out * cotangent) over documents."""
  def loss(q, k, v):
    out = fn(q, k, v)
    return jnp.sum(jnp.where(real, out, 0).astype(jnp.float32) * cotangent), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return (jnp.where(real, out, 0),) + tuple(grads)


def rel_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if not np.isfinite(got).all():
    return float("inf")
  return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


_REFERENCES: dict = {}


@contextlib.contextmanager
def emulate_jax010_offsets():
  """jax's cuDNN packed layout with jax 0.10's k/v offsets (x query heads, not k/v heads):
  `_fix_seqlen_offsets` of jax >= 0.11.1 wrapped to scale its k/v offsets by H / K."""
  # pylint: disable-next=g-import-not-at-top
  from jax._src.cudnn import fused_attention_stablehlo as fused
  original = fused._fix_seqlen_offsets  # pylint: disable=protected-access

  def as_in_jax010(q_seqlen, kv_seqlen, q_offsets, kv_offsets, query, key):
    out = original(q_seqlen, kv_seqlen, q_offsets, kv_offsets, query, key)
    if fused.get_max_seg_per_batch(q_offsets) <= 1 or query.shape[2] == key.shape[2]:
      return out
    return out[:3] + (out[3] * (query.shape[2] // key.shape[2]),)

  fused._fix_seqlen_offsets = as_in_jax010  # pylint: disable=protected-access
  try:
    yield
  finally:
    fused._fix_seqlen_offsets = original  # pylint: disable=protected-access


def run_case(kernel: str, dtype: str, case: Case, args) -> dict:
  row = dict(kernel=kernel, dtype=dtype, case=case.name, jax=jax.__version__)
  kind = ops.LayerKind(causal=case.causal, window=case.window,
                       packed=case.layout == "packed")
  reason = ops.unsupported_reason(kernel, kind, dtype=jnp.dtype(dtype), head_dim=args.head_dim,
                                  q_len=args.length, kv_len=args.length)
  if case.jax010 and cudnn_guard.kv_offsets_scaled_by_query_heads():
    reason = "this jax scales the k/v offsets by the query heads itself (gqa_packed_unguarded)"
  if reason:
    return dict(row, status="n/a", reason=reason)
  seg = jnp.asarray(segments_for(case.layout, args.batch, args.length))
  rng = np.random.default_rng(0)
  shape = lambda h: (args.batch, args.length, h, args.head_dim)
  q, k, v = (rng.normal(size=shape(h)).astype(np.float32)
             for h in (case.heads, case.kv_heads, case.kv_heads))
  cotangent = jnp.asarray(rng.normal(size=shape(case.heads)), jnp.float32)
  q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
  real = (seg != 0)[:, :, None, None]
  max_segments = 1 if case.layout != "packed" else 16
  original = cudnn_guard.kv_offsets_scaled_by_query_heads
  if not case.guard or case.jax010:  # The guard as jax 0.10 needs it, or none.
    cudnn_guard.kv_offsets_scaled_by_query_heads = lambda version=None: case.guard
  try:
    start = time.perf_counter()
    with emulate_jax010_offsets() if case.jax010 else contextlib.nullcontext():
      got = out_and_grads(kernel_fn(kernel, case, seg, max_segments, args.interpret),
                          q, k, v, real, cotangent)
      jax.block_until_ready(got)
    seconds = time.perf_counter() - start
  except Exception as e:  # pylint: disable=broad-except  (one case's failure is its row)
    return dict(row, status="error", reason=f"{type(e).__name__}: {str(e)[:300]}")
  finally:
    cudnn_guard.kv_offsets_scaled_by_query_heads = original
  key = (case.heads, case.kv_heads, case.layout, case.causal, case.window, dtype)
  if key not in _REFERENCES:
    with jax.default_matmul_precision("highest"):
      _REFERENCES[key] = jax.device_get(out_and_grads(
          kernel_fn("einsum", case, seg, max_segments, args.interpret),
          *(x.astype(jnp.float32) for x in (q, k, v)), real, cotangent))
  want = _REFERENCES[key]
  errors = dict(zip(("out", "dq", "dk", "dv"), (rel_error(g, w) for g, w in zip(got, want))))
  out_tol, grad_tol = TOLERANCE[dtype]
  passed = errors["out"] <= out_tol and max(errors["dq"], errors["dk"], errors["dv"]) <= grad_tol
  expect = ("fail" if not case.guard and kernel == "cudnn" and
            (case.jax010 or cudnn_guard.kv_offsets_scaled_by_query_heads()) else "pass")
  return dict(row, status="pass" if passed else "FAIL", expected=expect, errors=errors,
              tolerance=dict(out=out_tol, grads=grad_tol), seconds_with_compile=seconds)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--length", type=int, default=1024)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--json", default="",
                      help="also write the rows here as JSON ('-': a ROW json line per case on stdout)")
  parser.add_argument("--allow_cpu", action="store_true",
                      help="run xla and interpreted splash on a CPU (a dry run)")
  args = parser.parse_args()
  platform = jax.default_backend()
  print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].device_kind} "
        f"({platform}); cuDNN k/v offset bug in this jax: "
        f"{cudnn_guard.kv_offsets_scaled_by_query_heads()}", flush=True)
  if platform == "gpu":
    plan = [("cudnn", "bfloat16"), ("xla", "bfloat16"), ("cudnn", "float16"), ("xla", "float32")]
  elif platform == "tpu":
    plan = [("splash", "bfloat16"), ("splash", "float32"), ("xla", "bfloat16"),
            ("xla", "float32")]
  elif args.allow_cpu:
    plan = [("xla", "float32"), ("xla", "bfloat16"), ("splash", "float32")]
  else:
    print("no GPU or TPU here: nothing to check (--allow_cpu runs the script's CPU dry run)")
    return 0
  args.interpret = platform == "cpu"
  rows, failed = [], 0
  for kernel, dtype in plan:
    for case in CASES:
      if (not case.guard or case.jax010) and kernel != "cudnn":
        continue
      row = run_case(kernel, dtype, case, args)
      rows.append(row)
      failed += row["status"] in ("FAIL", "error") and row.get("expected") != "fail"
      errors = row.get("errors")
      detail = (" ".join(f"{k} {v:.2e}" for k, v in errors.items()) + f" (tol {row['tolerance']})"
                if errors else row.get("reason", ""))
      print(f"{kernel:7s} {dtype:9s} {case.name:22s} {row['status']:5s} "
            f"{'expected ' + row['expected'] + ' ' if row.get('expected') == 'fail' else ''}"
            f"{detail}", flush=True)
      if args.json == "-":  # As it goes: a step stopped at its budget keeps its rows.
        print("ROW " + json.dumps(row), flush=True)
  passed = sum(r["status"] == "pass" for r in rows)
  print(f"{passed} passed, {failed} failed, "
        f"{sum(r['status'] == 'n/a' for r in rows)} not applicable")
  if args.json and args.json != "-":
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
