"""--mode=compile for GPU hosts (h100:1, h100:8) on this CPU host, and the loop-aware counts.

The GPU tests need jax's CUDA plugin wheels (requirements-test.txt; no GPU, no driver):
without them they are skipped with the reason. Each tiny GPU compile takes seconds to
tens of seconds on a 2-core host, so there are few of them. The HLO tests read
hand-written program text and need neither.
"""

import importlib.util
import json
import re

import pytest

import launch  # pylint: disable=unused-import  (defines --output, --mode)
from test_compile_mode import _run_mode, tiny
from transformer import accelerator
from transformer.config.errors import ConfigError
from transformer.planning import attention_cost
from transformer.planning import gpu
from transformer.planning import hlo
from transformer.planning import topology

needs_plugin = pytest.mark.skipif(
    gpu.wheels_missing() is not None,
    reason=f"jax's CUDA plugin is not installed ({gpu.INSTALL_HINT}): XLA's GPU compiler")

DATA_PARALLEL = (("data", -1), ("fsdp", 1), ("tensor", 1))


@pytest.fixture(scope="module")
def h100x8():
  topo = topology.parse_topology("h100:8")
  return topo, topology.topology_devices(topo)


@needs_plugin
def test_decoder_on_one_h100_hand_count_memory_fraction_and_kernels(tmp_path, capsys,
                                                                    monkeypatch):
  """Arguments are exactly the shardings' count (no TPU tiles on a GPU); the verdict is
  against 0.9 of the device's memory (the launcher's fraction); the JSON lists the kernels
  by kind."""
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  report = tmp_path / "report.json"
  config = tiny()
  config.mesh.shape = DATA_PARALLEL
  code, out, err = _run_mode(config, ["--topology=h100:1", f"--output={report}",
                                      "--compile_steps=train,decode"], capsys)
  assert code == 0, err[-3000:]
  assert "cuda drivers" not in err  # The plugin's no-driver lines are filtered out.
  result = json.loads(report.read_text())
  assert result["chip_kind"] == "NVIDIA H100 80GB HBM3" and result["chips"] == 1
  assert result["memory_fraction"] == accelerator.GPU_MEMORY_FRACTION == 0.9
  assert result["usable_bytes"] == int(0.9 * 84_929_347_584)  # gpu_targets/h100.txtpb.
  train = result["steps"]["train"]
  assert train["chip_bytes"] == result["usable_bytes"] and train["fits"]
  # params float32 + 2 Adam slots, the batch (5 arrays of 16 x 128, 4 bytes), step, rng.
  params = 1_180_928 * 4
  batch = 5 * 16 * 128 * 4
  counted = sum(result["train_arguments_per_chip"].values())
  assert result["train_arguments_per_chip"]["params"] == params
  assert 0 <= train["arguments_bytes"] - 3 * params - batch <= 64  # step, rng.
  assert train["arguments_bytes"] == counted
  # Hardware FLOPs (the HLO's dots) are the model's count: no remat, every dot counted.
  assert train["xla_flops_per_chip"] == pytest.approx(train["flops_per_chip"], rel=0.02)
  assert train["cost_source"] == "HLO count" and train["optimal_seconds"] is None
  assert sum(n for kind, n in train["kernels"].items() if kind.startswith("matmul")) >= 12
  assert 0 < train["estimated_mfu"] <= 1 and 0 < train["estimated_hfu"] <= 1
  decode = result["steps"]["decode"]
  assert decode["xla_flops_per_chip"] > 0 and decode["kernels"]
  assert "Kernels that matter" in out and "usable = 0.90" in out


@needs_plugin
def test_one_h200_its_memory_bandwidth_range_floor_and_the_time_to_train(tmp_path, capsys,
                                                                         monkeypatch):
  """h200:1: judged against 0.9 of its 141 GB, priced at its 4.8 TB/s; the train step's
  estimate has its range and floor (no lower than the bytes at the bandwidth); --tokens
  and --price_per_chip_hour give the time and cost to train."""
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  report = tmp_path / "report.json"
  config = tiny()
  config.mesh.shape = DATA_PARALLEL
  code, out, err = _run_mode(config, ["--topology=h200:1", f"--output={report}",
                                      "--compile_steps=train", "--tokens=2048000",
                                      "--price_per_chip_hour=4"], capsys)
  assert code == 0, err[-3000:]
  result = json.loads(report.read_text())
  assert result["chip"] == "h200" and result["chip_kind"] == "NVIDIA H200"
  assert result["usable_bytes"] == int(0.9 * 151_397_597_184)  # gpu_targets/h200.txtpb.
  train = result["steps"]["train"]
  low, high = train["estimated_seconds_range"]
  assert train["lower_bound_seconds"] <= low <= train["estimated_seconds"] <= high
  assert train["lower_bound_seconds"] >= train["hbm_bytes_accessed"] / 4.8e12 * 0.999
  assert "4800 GB/s HBM" in out and "a step (ESTIMATE, range" in out
  assert result["train_steps"] == 1000  # 16 x 128 tokens a step.
  assert result["time_to_train_point_seconds"] == pytest.approx(1000 * train["estimated_seconds"])
  assert result["cost_point"] == pytest.approx(
      result["time_to_train_point_seconds"] / 3600 * 4)
  assert "Time to train 2,048,000 tokens" in out


@pytest.mark.parametrize("argv, message", [
    (["--tokens=0"], "ConfigError: --tokens=0: the tokens to train, a count >= 1"),
    (["--price_per_chip_hour=3"], "ConfigError: --price_per_chip_hour=3 needs --tokens=N"),
    (["--tokens=1e9", "--compile_steps=eval"],
     "ConfigError: --tokens needs the train step: --compile_steps=eval leaves it out"),
])
@needs_plugin
def test_bad_tokens_and_price_flags_are_one_line_before_compiling(argv, message, capsys):
  code, _, err = _run_mode(tiny(), ["--topology=h100:1"] + argv, capsys)
  assert code == 2, err[-3000:]
  assert err.strip().splitlines()[-1].startswith(message), err[-3000:]


@needs_plugin
@pytest.mark.parametrize("arch", ["encoder", "encoder_decoder"])
def test_encoder_and_encoder_decoder_on_eight_h100s(h100x8, arch):
  """fsdp over 8 GPUs: arguments are the shardings' own count, weights are gathered."""
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  topo, devs = h100x8
  config = tiny(arch)
  config.model.num_layers = 1  # Each GPU kernel costs compile time; one layer shows it.
  config.mesh.shape = (("data", 1), ("fsdp", 8), ("tensor", 1))
  plan = plan_lib.make_plan(config, topo, devs, ("train",))
  train = plan.costs["train"]
  assert train.arguments_bytes == sum(plan.breakdown.values())
  assert plan.all_fit
  assert train.collective_bytes["all-gather"] + train.collective_bytes["all-to-all"] > 0
  assert 0.7 * train.model_flops <= train.xla_flops <= 1.05 * train.model_flops


@needs_plugin
@pytest.mark.slow  # Five GPU compiles (~30 s on two cores).
def test_scanned_and_unscanned_agree_on_gpu(h100x8):
  """The same 3-layer model, scanned and unrolled: FLOPs and collective bytes within 5%
  (the scanned loop's trips multiplied out), HBM bytes too once taken from the step
  unrolled at 1 and 2 layers (depth.py; counted in the scanned body: 1.1x here)."""
  from transformer.planning import estimate  # pylint: disable=g-import-not-at-top
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  topo, devs = h100x8
  costs = {}
  for scan in (False, True):
    config = tiny()
    config.model.update(num_layers=3, scan_layers=scan)
    config.mesh.shape = DATA_PARALLEL
    costs[scan] = plan_lib.make_plan(config, topo, devs, ("train",),
                                     extrapolate_depth=True).costs["train"]
  assert costs[True].xla_flops == pytest.approx(costs[False].xla_flops, rel=0.05)
  assert costs[True].hbm_bytes_accessed == pytest.approx(costs[False].hbm_bytes_accessed,
                                                         rel=0.05)
  assert costs[True].bytes_source == ("HLO count of the step unrolled at 1 and 2 layers, "
                                      "extrapolated per layer to 3")
  assert estimate.collective_total(costs[True]) == pytest.approx(
      estimate.collective_total(costs[False]), rel=0.05)
  assert costs[True].collective_bytes["loops_with_unknown_trip_count"] == 0


@needs_plugin
@pytest.mark.slow  # One GPU compile per mesh (~17 s on two cores).
def test_mesh_search_on_two_h100s_ranks_the_meshes(tmp_path, capsys):
  """--mesh_search on a GPU host: every data x fsdp x tensor of 2 compiled, those that
  fit ranked fastest first, the one the single head cannot split over refused with why.
  (Two GPUs and one layer: three small compiles keep the default test run short.)"""
  from transformer.planning import search  # pylint: disable=g-import-not-at-top
  report = tmp_path / "report.json"
  config = tiny()
  config.model.update(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=256)
  config.mesh.shape = DATA_PARALLEL
  code, out, err = _run_mode(config, ["--topology=h100:2", "--compile_steps=train",
                                      "--notry_levers", "--mesh_search",
                                      "--search_remat=none", f"--output={report}"], capsys)
  assert code == 0, err[-3000:]
  assert "Mesh search: the train step on 2 chips" in out
  trials = json.loads(report.read_text())["mesh_search"]
  assert len(trials) == len(search.factorisations(2)) == 3
  fitting = [t for t in trials if t["fits"]]
  refused = [t for t in trials if t["error"]]
  assert trials == fitting + refused  # Nothing compiled fails to fit 71 GiB here.
  assert len(fitting) == 2
  assert [t["estimated_seconds"] for t in fitting] == sorted(
      t["estimated_seconds"] for t in fitting)
  assert {t["label"].split(" remat")[0] for t in refused} == {"data=1 fsdp=1 tensor=2"}
  assert all("does not divide over mesh axes ('tensor',)" in t["error"] for t in refused)


def test_gpu_bad_inputs_are_one_line(monkeypatch):
  with pytest.raises(ConfigError, match=r"'b300:8' is not a GPU.*h100:8, h200:8, a100:8.*"
                                        r"TPU slices: v4:2x2x1"):
    topology.parse_topology("b300:8")
  with pytest.raises(ConfigError, match=r"a host holds 1 to 8 h100 GPUs; .*h100:8x2"):
    topology.parse_topology("h100:16")
  with pytest.raises(ConfigError, match=r"--num_slices=2 is for TPU slices.*h100:8x2"):
    topology.parse_topology("h100:8", num_slices=2)
  assert topology.parse_topology("h200:8x2").chips == 16
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.5")
  with pytest.raises(ConfigError, match=r"XLA_PYTHON_CLIENT_MEM_FRACTION='1.5'.*\(0, 1\]"):
    gpu.memory_fraction()
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  assert gpu.INSTALL_HINT in gpu.wheels_missing()
  # jax[cuda13]'s plugin compiles as well (a GPU host with a newer jax).
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name: object() if name == "jax_cuda13_plugin" else None)
  assert gpu.wheels_missing() is None


def test_missing_wheels_name_the_install_command(monkeypatch, capsys):
  monkeypatch.setattr(gpu, "wheels_missing", lambda: "needs " + gpu.INSTALL_HINT)
  code, _, err = _run_mode(tiny(), ["--topology=h100:8"], capsys)
  assert code == 2 and err.strip().splitlines()[-1] == "needs " + gpu.INSTALL_HINT


def test_a_tpu_grid_no_slice_has_is_refused_with_the_nearest():
  with pytest.raises(ConfigError, match=r"no rentable v5p slice has the shape 2x2x3 \(12 "
                                        r"chips\); nearest: v5p:2x2x2 \(8 chips\), "
                                        r"v5p:2x2x4 \(16 chips\); pass --any_slice"):
    topology.parse_topology("v5p:2x2x3")
  assert topology.parse_topology("v5p:2x2x3", any_shape=True).chips == 12
  with pytest.raises(ConfigError, match=r"v5e slice has the shape 3x3.*v5e:2x4.*v5e:4x4"):
    topology.parse_topology("v5e:3x3")
  for name in topology.KNOWN_SLICES.values():
    topology.parse_topology(name)  # Every listed slice is rentable.


# A scan of 3 layers as XLA's TPU compiler prints it: no known_trip_count, the bound in
# the condition's fused compare; each trip runs a [8,16] x [16,32] dot and an
# all-reduce of f32[8,32].
_LOOP_HLO = """HloModule loop

%fused_compare (p0: s32[]) -> pred[] {
  %p0 = s32[] parameter(0)
  %bound = s32[] constant(3)
  ROOT %lt = pred[] compare(%p0, %bound), direction=LT
}

%cond (c: (s32[], f32[8,16])) -> pred[] {
  %c = (s32[], f32[8,16]) parameter(0)
  %iv = s32[] get-tuple-element(%c), index=0
  ROOT %f = pred[] fusion(%iv), kind=kLoop, calls=%fused_compare
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (t: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %t = (s32[], f32[8,16]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[8,16] get-tuple-element(%t), index=1
  %w = f32[16,32] constant({...})
  %y = f32[8,32] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %r = f32[8,32] all-reduce(%y), replica_groups={}, to_apply=%sum
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  %z = f32[8,16] slice(%r), slice={[0:8], [0:16]}
  ROOT %o = (s32[], f32[8,16]) tuple(%n, %z)
}

ENTRY %main (x0: f32[8,16]) -> f32[8,16] {
  %x0 = f32[8,16] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,16]) tuple(%zero, %x0)
  %loop = (s32[], f32[8,16]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,16] get-tuple-element(%loop), index=1
}
"""


def test_trip_count_is_read_from_the_loop_condition():
  counts = hlo.count(_LOOP_HLO)
  assert counts.loops == {"body": 3} and counts.unknown_loops == 0
  assert counts.flops == 3 * 2 * 8 * 32 * 16
  assert counts.collective_bytes["all-reduce"] == 3 * 8 * 32 * 4
  assert counts.kernels == {"matmul dot": 3, "all-reduce": 3}
  once = hlo.count(_LOOP_HLO, multiply_loops=False)
  assert once.flops == 2 * 8 * 32 * 16
  # A counter that steps by 2 from 0 to 3 (XLA's TPU windowed einsums do) runs twice.
  assert hlo.count(_LOOP_HLO.replace("%one = s32[] constant(1)",
                                     "%one = s32[] constant(2)")).loops == {"body": 2}
  # Without the bound the count is unknown: the body counts once and the loop is named.
  unknown = hlo.count(_LOOP_HLO.replace("direction=LT", "direction=NE"))
  assert unknown.unknown_loops == 1 and unknown.flops == once.flops


def test_a_windowed_convolution_counts_only_taps_on_input():
  """XLA's TPU form of a per-head product: a window of 2 over a side of 2 padded by 1
  on each side, 3 outputs x 2 taps, of which 4 land on the input (2 on padding)."""
  text = """HloModule conv

ENTRY %main (a: bf16[1,2,16], b: bf16[2,16,4]) -> bf16[1,3,4] {
  %a = bf16[1,2,16] parameter(0)
  %b = bf16[2,16,4] parameter(1)
  ROOT %c = bf16[1,3,4] convolution(%a, %b), window={size=2 pad=1_1 rhs_reversal=1}, dim_labels=b0f_0io->b0f
}
"""
  # 2 x (batch 1 x features 4) x input features 16 x 4 taps; every tap would be 6.
  assert hlo.count(text).flops == 2 * 4 * 16 * 4


# A splash kernel as XLA's TPU compiler prints it: named by its pallas_call, its kernel
# metadata over several lines, the mask's scope in its op_name; q [B, K, G, L, D] and
# k [B, K, S, D] follow the mask's integer block tables.
_SPLASH_HLO = """HloModule splash

ENTRY %main (t: s32[4,4], q: bf16[2,4,1,1024,64], k: bf16[2,4,1024,64], v: bf16[2,4,1024,64]) -> f32[2,4,1,1024,64] {
  %t = s32[4,4] parameter(0)
  %q = bf16[2,4,1,1024,64] parameter(1)
  %k = bf16[2,4,1024,64] parameter(2)
  %v = bf16[2,4,1024,64] parameter(3)
  ROOT %splash_mqa_fwd_segmented_residuals.1 = f32[2,4,1,1024,64] custom-call(%t, %q, %k, %v), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 256, \\"block_kv\\": 256, \\"block_kv_compute\\": 256, \\"block_q_dq\\": 256, \\"block_kv_dq\\": 256, \\"use_fused_bwd_kernel\\": false}"
}}, metadata={op_name="jit(step)/attend/splash_mask_causal/shard_map/pallas_call"}
}
"""


def test_splash_kernels_are_counted_over_the_blocks_their_mask_keeps():
  """Causal over 4 x 4 blocks of 256: 10 of 16 blocks computed; the forward is 2
  products of 2 x (B K G L D) x S FLOPs each, and XLA's cost analysis sees none."""
  counts = hlo.count(_SPLASH_HLO)
  assert counts.kernels == {"attention splash_mqa_fwd": 1}
  elements = 2 * 4 * 1 * 1024 * 64
  assert counts.flops == counts.opaque_flops == 2 * 2 * elements * 1024 * 10 / 16
  full = hlo.count(_SPLASH_HLO.replace("splash_mask_causal", "splash_mask_full"))
  assert full.flops == 2 * 2 * elements * 1024
  assert attention_cost.visited_fraction(1024, 1024, 1024, 1024, causal=True) == 1.0  # One block.
  # A causal window of 256 over blocks of 256: the diagonal and the one before it.
  assert attention_cost.visited_fraction(1024, 1024, 256, 256, causal=True, window=256) == 7 / 16
  # dq: 3 products per block pair to the forward's 2.
  dq = hlo.count(_SPLASH_HLO.replace("splash_mqa_fwd", "splash_mqa_dq"))
  assert dq.flops == 3 / 2 * counts.flops
  # Without the kernel's metadata: config/attention.py's blocks for 1024 (512 x 512, 3
  # of 4 computed), the rule the kernel is built with.
  bare = hlo.count(re.sub(r'"xprof_metadata":"[^\n]*"', '"x":"{}"', _SPLASH_HLO))
  assert bare.flops == 2 * 2 * elements * 1024 * 3 / 4


def test_context_shards_splash_kernels_are_counted_over_their_zigzag_rows():
  """Four context shards of a 4096-token causal row: each kernel has 1024 query rows (two
  zig-zag chunks of 512) against all 4096 keys, and each computes the whole row's share
  of blocks (136 of 256 at 256 x 256): no shard counts its slab as full, none as the
  first 1024 rows' small triangle."""
  sharded = (_SPLASH_HLO.replace("k: bf16[2,4,1024,64], v: bf16[2,4,1024,64]",
                                 "k: bf16[2,4,4096,64], v: bf16[2,4,4096,64]")
             .replace("%k = bf16[2,4,1024,64]", "%k = bf16[2,4,4096,64]")
             .replace("%v = bf16[2,4,1024,64]", "%v = bf16[2,4,4096,64]")
             .replace("splash_mask_causal/", "splash_mask_causal_zigzag4/"))
  counts = hlo.count(sharded)
  elements = 2 * 4 * 1 * 1024 * 64
  assert counts.flops == pytest.approx(2 * 2 * elements * 4096 * 136 / 256)
  shares = [attention_cost.visited_fraction(1024, 4096, 256, 256, True, 0, attention_cost.zigzag_rows(i, 4, 1024))
            for i in range(4)]
  assert shares == [136 / 256] * 4  # Balanced: the reason for the zig-zag.
  assert attention_cost.visited_fraction(1024, 4096, 256, 256, True) == 10 / 64  # Rows 0..1023.


def _cudnn_installed() -> bool:
  try:
    return importlib.util.find_spec("nvidia.cudnn") is not None
  except ModuleNotFoundError:  # No nvidia.* package at all.
    return False


@needs_plugin
@pytest.mark.skipif(not _cudnn_installed(),
                    reason="cuDNN is not installed (pip install nvidia-cudnn-cu12, 700 MB): "
                           "model.attention_impl=cudnn needs it to compile; CI does not")
def test_cudnn_attention_is_listed_and_counted_from_its_shapes():
  """cuDNN's fused attention is opaque to XLA: the report lists its calls and counts
  their FLOPs from the shapes, so the step's FLOPs stay near the model's count (below
  it by the causal tiles the flash kernel skips, which flops.py's count includes)."""
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  topo = topology.parse_topology("h100:1")
  config = tiny()
  config.model.update(num_layers=1, attention_impl="cudnn")
  config.mesh.shape = DATA_PARALLEL
  train = plan_lib.make_plan(config, topo, topology.topology_devices(topo),
                             ("train",)).costs["train"]
  kinds = [kind for kind in train.kernels if kind.startswith("attention __cudnn$fmha")]
  assert any("Backward" in kind for kind in kinds) and len(kinds) >= 2, train.kernels
  assert 0.7 * train.model_flops <= train.xla_flops <= 1.05 * train.model_flops


def test_a_kernel_the_target_cannot_build_is_one_line_naming_the_field():
  from transformer.planning import compiled  # pylint: disable=g-import-not-at-top
  error = compiled.rejected("train", RuntimeError("cuDNN not found.\nmore lines"))
  assert isinstance(error, ConfigError) and "\n" not in str(error)
  assert "cuDNN not found." in str(error) and "model.attention_impl='xla'" in str(error)


def test_plugin_noise_is_dropped_and_other_lines_kept(capfd):
  """The CUDA plugin's no-driver lines go (written to fd 2 from C++); the rest stays."""
  import os  # pylint: disable=g-import-not-at-top
  from transformer import plugin_noise  # pylint: disable=g-import-not-at-top
  with plugin_noise.filtered():
    os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are "
                b"written to STDERR\n")
    os.write(2, b"I0000 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
                b"GPU will not be used.\n")
    os.write(2, b"a real error\n")
  assert capfd.readouterr().err == "a real error\n"



def test_the_deviceless_schedule_error_line_goes_to_the_log_not_the_console(capfd, caplog):
  """XLA's GPU scheduler, compiling for an absent GPU, logs an ERROR line about its memory
  estimate (issue 57: the 7b compile printed it); the compile mode's filter keeps it for
  log.txt (a file-only record) and the console gets the other lines."""
  import os  # pylint: disable=g-import-not-at-top
  from transformer import plugin_noise  # pylint: disable=g-import-not-at-top
  from transformer.planning import gpu as gpu_lib  # pylint: disable=g-import-not-at-top
  if plugin_noise.driver_present():
    pytest.skip("an NVIDIA driver is present: XLA's lines are real there")
  caplog.set_level("INFO")
  line = (b"E1129 10:21:27.123456 4242 gpu_hlo_schedule.cc:1104] The byte size of input/output "
          b"arguments (1) exceeds the base limit (0). This indicates an error in the "
          b"calculation!\n")
  with gpu_lib.plugin_noise_filtered():
    os.write(2, line)
    os.write(2, b"a real error\n")
  assert capfd.readouterr().err == "a real error\n"
  kept = [r for r in caplog.records if r.name == "xla_gpu_compile"]
  assert [r.getMessage() for r in kept] == [line.decode().rstrip("\n")]
  assert kept[0].console is False  # console.py's file-only mark: log.txt, not the console.
