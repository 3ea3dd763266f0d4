"""planning/kernels.py: each kernel of a step priced on the chip, summed by part.

A hand-written GPU program (a looped matmul fusion, a cuDNN attention call, the loss
head's fusion, an optimizer fusion, an all-reduce) checks the parts and the formula;
the calibration data (transformer/planning/gpu_calibration.json: the four train steps
measured on an H100, as kernel rows) holds the fitted efficiencies to every measured step
within 1.25x, each efficiency at most its datasheet peak, the floor below every measured
step, and the estimate's range around its point.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from transformer import hardware
from transformer.planning import calibration
from transformer.planning import hlo
from transformer.planning import kernels


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
  result = kernels.breakdown(found, chip, train=True, chip_rates=calibration.rates_for(chip))
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
  chip, rates = hardware.CHIPS["h100"], calibration.rates_for(hardware.CHIPS["h100"])
  found, _, _ = hlo.launches(_STEP)
  matmul = next(l for l in found if l.kind == "matmul triton gemm fusion")
  compute = matmul.flops / (chip.bf16_flops * rates.tensor)
  memory = matmul.bytes / (chip.hbm_bytes_per_second * rates.hbm)
  assert kernels.kernel_seconds(matmul, chip, rates) == pytest.approx(
      max(compute, memory) + rates.launch_seconds)
  f32 = hlo.Launch(instruction=matmul.instruction, times=1, kind=matmul.kind,
                   flops=matmul.flops, opaque_flops=0.0, bytes=0, collective_bytes=0,
                   workspace=0, matmul_dtype="f32")
  # Float32 matmuls run on the TF32 tensor cores (494.5 TFLOP/s dense on an H100).
  assert kernels.kernel_seconds(f32, chip, rates) == pytest.approx(
      f32.flops / (494.5e12 * rates.tf32) + rates.launch_seconds)
  fp8 = dataclasses.replace(f32, matmul_dtype="f8e4m3fn")
  assert kernels.kernel_seconds(fp8, chip, rates) == pytest.approx(
      fp8.flops / (1979e12 * rates.tensor) + rates.launch_seconds)
  result = kernels.breakdown(found, chip, train=True, chip_rates=calibration.rates_for(chip))
  assert result.seconds == pytest.approx(sum(
      l.times * kernels.kernel_seconds(l, chip, rates) for l in found if l.is_kernel))
  lines = kernels.table("train", result)
  assert lines[0].split()[1:] == ["part", "kernels", "TFLOPs", "HBM", "GB", "ms", "share"]
  assert lines[-1].split()[1] == "12" and lines[-1].endswith("100.0%")


def test_tpu_parts_are_priced_at_published_peaks():
  """No TPU kernel was measured: the parts are shares of work, not calibrated time."""
  chip = hardware.CHIPS["tpu v5"]
  result = kernels.breakdown(hlo.launches(_STEP)[0], chip, train=True)
  assert not result.calibrated and calibration.rates_for(chip).launch_seconds == 0.0


def test_eval_steps_have_no_optimizer_part():
  result = kernels.breakdown(hlo.launches(_STEP)[0], hardware.CHIPS["h100"], train=False,
                             chip_rates=calibration.rates_for(hardware.CHIPS["h100"]))
  assert {p.name: p.launches for p in result.parts}["optimizer"] == 0


def test_the_fit_reproduces_every_measured_step_within_1_25x_at_datasheet_bounds():
  """The fitted efficiencies: each a share <= 1 of its unit's datasheet peak, no more of
  them than the measured steps' independent cases, within 1.25x of every step."""
  steps = calibration.load()
  cases = {step["case"] for step in steps.values()}
  assert len(steps) >= 4 and len(calibration.FREE_PARAMETERS) <= len(cases)
  fitted = calibration.fit(steps)
  rates = fitted.best
  assert all(0 < share <= 1 for share in (rates.tensor, rates.tf32, rates.hbm))
  assert all(abs(math.log(r)) <= math.log(1.25) for r in fitted.best_ratios.values()), (
      fitted.best_ratios)
  loo = calibration.leave_one_out(steps)
  assert set(loo) == set(steps) and all(r > 0 for r in loo.values())


def test_a_share_above_the_datasheet_and_too_few_cases_are_refused(tmp_path):
  with pytest.raises(ValueError, match=r"Rates.tf32=1.2: a share of a datasheet peak"):
    dataclasses.replace(kernels.PEAK, tf32=1.2)
  steps = calibration.load()
  one_case = {name: dict(step, case="one") for name, step in steps.items()}
  path = tmp_path / "one_case.json"
  path.write_text(json.dumps(one_case))
  with pytest.raises(ValueError, match=r"1 independent case\(s\).*cannot support 2 fitted"):
    calibration.load(str(path))


def test_the_floor_is_below_every_measured_step_and_the_range_holds_the_point():
  """The floor (each kernel at its roofline at datasheet peaks) is a true lower bound:
  every step measured on the H100 took longer."""
  chip = hardware.CHIPS["h100"]
  for name, step in calibration.load().items():
    found = calibration.launches_of(step["kernels"])
    floor = calibration.floor_seconds(found, chip)
    assert 0 < floor < step["measured_ms"] / 1e3, name
    low, high = calibration.interval(found, chip)
    rates = calibration.rates_for(chip)
    point = sum(l.times * kernels.kernel_seconds(l, chip, rates) for l in found)
    assert floor < low <= point <= high, (name, floor, low, point, high)


def test_the_breakdown_floor_is_each_kernel_at_its_roofline():
  chip = hardware.CHIPS["h100"]
  found = hlo.launches(_STEP)[0]
  result = kernels.breakdown(found, chip, train=True, chip_rates=calibration.rates_for(chip))
  expected = sum(l.times * max(kernels.unit_seconds(l, chip)[:2]) for l in found
                 if l.is_kernel and not l.collective_bytes)
  assert result.floor_seconds == pytest.approx(expected)
  assert result.floor_seconds < result.seconds
  assert sum(dict(result.class_seconds).values()) == pytest.approx(result.seconds)


def test_the_h200_is_priced_at_its_own_bandwidth():
  """Same efficiencies, same compute peaks, its own 4.8 TB/s: a bytes-bound kernel takes
  3.35 / 4.8 of the H100's time."""
  h100, h200 = hardware.CHIPS["h100"], hardware.CHIPS["h200"]
  assert h200.hbm_bytes_per_second == 4.8e12 and h200.hbm_bytes == 141e9
  exp = next(l for l in hlo.launches(_STEP)[0] if l.kind is None and l.bytes > 10000)
  rates = calibration.rates_for(hardware.CHIPS["h200"])
  moved = lambda chip: kernels.kernel_seconds(exp, chip, rates) - rates.launch_seconds
  assert moved(h200) == pytest.approx(moved(h100) * 3.35 / 4.8)


def test_a_kernel_mix_the_measured_steps_lack_is_named():
  """An fp8 matmul was never measured: a step made of them is outside the calibration."""
  chip = hardware.CHIPS["h100"]
  found = hlo.launches(_STEP)[0]
  fp8 = [dataclasses.replace(l, matmul_dtype="f8e4m3fn", flops=l.flops * 1e4)
         if l.kind == "matmul triton gemm fusion" else l for l in found]
  warnings = calibration.mix_warnings(
      kernels.breakdown(fp8, chip, train=True, chip_rates=calibration.rates_for(chip)))
  assert any(w.startswith("fp8 ") and "(measured steps: 0-0%)" in w for w in warnings), warnings
  steps = calibration.load()
  inside = calibration.launches_of(steps["gpt_small_cudnn_32x1024"]["kernels"])
  assert not calibration.mix_warnings(_breakdown_of_rows(inside, chip))


def _breakdown_of_rows(found, chip) -> kernels.Breakdown:
  """A Breakdown of stand-in launches (rows carry no instruction, so no parts)."""
  rates = calibration.rates_for(chip)
  classes = dict.fromkeys(kernels.CLASSES, 0.0)
  for launch in found:
    classes[kernels.kernel_class(launch, chip, rates)] += (
        launch.times * kernels.kernel_seconds(launch, chip, rates))
  return kernels.Breakdown(parts=(), calibrated="x", class_seconds=tuple(classes.items()))


_CUDNN_FORWARD = """HloModule m

ENTRY %main (q: bf16[2,1024,4,64], k: bf16[2,1024,4,64], v: bf16[2,1024,4,64]) -> bf16[2,1024,4,64] {
  %q = bf16[2,1024,4,64]{3,2,1,0} parameter(0)
  %k = bf16[2,1024,4,64]{3,2,1,0} parameter(1)
  %v = bf16[2,1024,4,64]{3,2,1,0} parameter(2)
  %att = (bf16[2,1024,4,64]{3,2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"operation_queue_id":"0","cudnn_fmha_backend_config":{"fmha_scale":0.125,MASK"is_flash_attention":true}}
  ROOT %o = bf16[2,1024,4,64]{3,2,1,0} get-tuple-element(%att), index=0
}
"""


@pytest.mark.parametrize("mask, fraction", [
    ('"mask_type":"CAUSAL",', (16 * 17 / 2) / 16 ** 2),  # 16 tiles of 64 a side.
    ('"mask_type":"PADDING_CAUSAL",', (16 * 17 / 2) / 16 ** 2),
    ('"mask_type":"NO_MASK",', 1.0),
    ("", 1.0)])  # No mask in the call: every block.
def test_cudnn_causal_attention_counts_the_blocks_a_flash_kernel_visits(mask, fraction):
  """A causal flash kernel skips the tiles above the diagonal: counted at 64-wide tiles
  (the smallest cuDNN takes), so the count never exceeds the kernel's work and the floor
  stays a floor."""
  found, _, _ = hlo.launches(_CUDNN_FORWARD.replace("MASK", mask))
  attention = next(l for l in found if l.kind and l.kind.startswith("attention"))
  assert attention.flops == pytest.approx(4.0 * 2 * 4 * 1024 * 1024 * 64 * fraction)
