"""planning/kernels.py: each kernel of a step priced on the chip, summed by part.

A hand-written GPU program (a looped matmul fusion, a cuDNN attention call, the loss
head's fusion, an optimizer fusion, an all-reduce) checks the parts and the formula;
the calibration data (benchmarks/gpu_calibration.json: the four train steps measured on
an H100, as kernel rows) holds the GPU rates to every measured step within 1.25x.
"""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from transformer import hardware
from transformer.planning import hlo
from transformer.planning import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_STEP = """HloModule step

%fused_dot (p0: bf16[64,128], p1: bf16[128,256]) -> bf16[64,256] {
  %p0 = bf16[64,128]{1,0} parameter(0)
  %p1 = bf16[128,256]{1,0} parameter(1)
  ROOT %d = bf16[64,256]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_exp (q0: f32[64,256]) -> f32[64,256] {
  %q0 = f32[64,256]{1,0} parameter(0)
  ROOT %e = f32[64,256]{1,0} exponential(%q0)
}

%fused_update (r0: f32[256], r1: f32[256]) -> f32[256] {
  %r0 = f32[256]{0} parameter(0)
  %r1 = f32[256]{0} parameter(1)
  ROOT %a = f32[256]{0} add(%r0, %r1)
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (t: (s32[], bf16[64,128], bf16[128,256])) -> (s32[], bf16[64,128], bf16[128,256]) {
  %t = (s32[], bf16[64,128], bf16[128,256]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[64,128]{1,0} get-tuple-element(%t), index=1
  %w = bf16[128,256]{1,0} get-tuple-element(%t), index=2
  %g = bf16[64,256]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(train_step)/jvp(Decoder)/block/mlp/wi/dot_general"}, backend_config={"kind":"__triton_gemm"}
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %o = (s32[], bf16[64,128], bf16[128,256]) tuple(%n, %x, %w)
}

%cond (c: (s32[], bf16[64,128], bf16[128,256])) -> pred[] {
  %c = (s32[], bf16[64,128], bf16[128,256]) parameter(0)
  %iv = s32[] get-tuple-element(%c), index=0
  %bound = s32[] constant(4)
  ROOT %lt = pred[] compare(%iv, %bound), direction=LT
}

ENTRY %main (x0: bf16[64,128], w0: bf16[128,256], l0: f32[64,256], q: bf16[2,128,4,64], k: bf16[2,128,4,64], v: bf16[2,128,4,64], u: f32[256], m: f32[256]) -> f32[256] {
  %x0 = bf16[64,128]{1,0} parameter(0)
  %w0 = bf16[128,256]{1,0} parameter(1)
  %l0 = f32[64,256]{1,0} parameter(2)
  %q = bf16[2,128,4,64]{3,2,1,0} parameter(3)
  %k = bf16[2,128,4,64]{3,2,1,0} parameter(4)
  %v = bf16[2,128,4,64]{3,2,1,0} parameter(5)
  %u = f32[256]{0} parameter(6)
  %m = f32[256]{0} parameter(7)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[64,128], bf16[128,256]) tuple(%zero, %x0, %w0)
  %loop = (s32[], bf16[64,128], bf16[128,256]) while(%init), condition=%cond, body=%body
  %att = (bf16[2,128,4,64], u8[0]) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(train_step)/jvp(Decoder)/block/self_attention/self_attention._attend/dot_product_attention_fwd"}
  %ex = f32[64,256]{1,0} fusion(%l0), kind=kLoop, calls=%fused_exp, metadata={op_name="jit(train_step)/jvp()/loss_head/exp"}
  %ar = f32[256]{0} all-reduce(%u), replica_groups={}, to_apply=%sum, metadata={op_name="jit(train_step)/transpose(jvp(Decoder))/psum"}
  ROOT %up = f32[256]{0} fusion(%ar, %m), kind=kLoop, calls=%fused_update, metadata={op_name="jit(train_step)/add"}
}
"""


def test_every_kernel_lands_in_its_part_with_its_launches_flops_and_bytes():
  found, loops, unknown = hlo.launches(_STEP)
  assert loops == {"body": 4} and unknown == 0
  chip = hardware.CHIPS["h100"]
  result = kernels.breakdown(found, chip, train=True)
  parts = {p.name: p for p in result.parts}
  assert parts["matmul"].launches == 4  # The loop's 4 trips.
  assert parts["matmul"].flops == 4 * 2 * 64 * 128 * 256
  assert parts["matmul"].hbm_bytes == 4 * 2 * (64 * 128 + 128 * 256 + 64 * 256)
  assert parts["attention"].launches == 1
  assert parts["attention"].flops == 4 * 2 * 4 * 128 * 128 * 64  # QK^T and PV.
  assert parts["loss"].launches == 1 and parts["loss"].hbm_bytes == 2 * 4 * 64 * 256
  assert parts["collectives"].launches == 1
  assert parts["optimizer"].launches == 1 and parts["optimizer"].hbm_bytes == 3 * 4 * 256
  assert parts["elementwise"].launches == 4  # The loop counter's add, each trip.
  assert result.launches == 12 and result.calibrated


def test_a_kernel_costs_its_slowest_resource_plus_a_launch():
  chip, rates = hardware.CHIPS["h100"], kernels.RATES["h100"]
  found, _, _ = hlo.launches(_STEP)
  matmul = next(l for l in found if l.kind == "matmul triton gemm fusion")
  compute = matmul.flops / (chip.bf16_flops * rates.matmul)
  memory = matmul.bytes / (chip.hbm_bytes_per_second * rates.hbm)
  assert kernels.kernel_seconds(matmul, chip, rates) == pytest.approx(
      max(compute, memory) + rates.launch_seconds)
  f32 = hlo.Launch(instruction=matmul.instruction, times=1, kind=matmul.kind,
                   flops=matmul.flops, opaque_flops=0.0, bytes=0, collective_bytes=0,
                   workspace=0, matmul_dtype="f32")
  assert kernels.kernel_seconds(f32, chip, rates) == pytest.approx(
      f32.flops / (chip.bf16_flops * rates.matmul * rates.matmul_f32) + rates.launch_seconds)
  result = kernels.breakdown(found, chip, train=True)
  assert result.seconds == pytest.approx(sum(
      l.times * kernels.kernel_seconds(l, chip, rates) for l in found if l.is_kernel))
  lines = kernels.table("train", result)
  assert lines[0].split()[1:] == ["part", "kernels", "TFLOPs", "HBM", "GB", "ms", "share"]
  assert lines[-1].split()[1] == "12" and lines[-1].endswith("100.0%")


def test_tpu_parts_are_priced_at_published_peaks():
  """No TPU kernel was measured: the parts are shares of work, not calibrated time."""
  chip = hardware.CHIPS["tpu v5"]
  result = kernels.breakdown(hlo.launches(_STEP)[0], chip, train=True)
  assert not result.calibrated and kernels.rates(chip).launch_seconds == 0.0


def test_eval_steps_have_no_optimizer_part():
  result = kernels.breakdown(hlo.launches(_STEP)[0], hardware.CHIPS["h100"], train=False)
  assert {p.name: p.launches for p in result.parts}["optimizer"] == 0


def test_the_gpu_rates_reproduce_every_measured_step_within_1_25x():
  """benchmarks/gpu_calibration.json: the train steps measured on an H100 (the code of
  then, compiled without a device): the estimate within 1.25x of each."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    import gpu_calibration  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  finally:
    sys.path.pop(0)
  with open(gpu_calibration.DATA, encoding="utf-8") as f:
    steps = json.load(f)
  assert len(steps) >= 4
  ratios = gpu_calibration.ratios(steps, kernels.RATES["h100"])
  assert all(abs(math.log(r)) <= math.log(1.25) for r in ratios.values()), ratios
