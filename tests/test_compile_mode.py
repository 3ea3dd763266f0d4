"""--mode=compile: tiny models compiled for a TPU v5e 2x2 slice on this CPU host.

Needs libtpu (requirements-test.txt); without it every test here is skipped with the
reason. Shapes are tiny but tile-aligned (every sharded dimension a multiple of 128
per chip, 8 rows), so that TPU layout padding does not blur the byte counts.
"""

import importlib.util
import json
import os
import re

import numpy as np
import pytest
from absl import flags

import launch  # pylint: disable=unused-import  (defines --output, --mode)
from configs import gpt_small
from transformer.config.errors import ConfigError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install libtpu): XLA's TPU compiler is in it")

TOPOLOGY = "v5e:2x2"
MESH = (("data", 1), ("fsdp", 2), ("tensor", 2))
# Adam's step counts, the train step counter and the rng key are scalars or [2]; a TPU
# lays each out in a whole tile, so the compiled arguments exceed the hand count by this
# much at most.
SCALAR_TILES = 4096


def tiny(arch: str = "decoder"):
  """d_model 256, 2 heads of 128, MLP 512, vocabulary 512, 16 rows of 128 tokens."""
  config = gpt_small.get_config("local")
  config.model.update(d_model=256, num_layers=2, num_heads=2, mlp_dim=512, vocab_size=512,
                      max_len=128, use_bias=False, norm_type="rmsnorm", position="rope")
  config.data.update(seq_len=128, batch_size=16)
  config.decode.update(batch_size=8, beam_size=2, max_new_tokens=4, max_length_offset=4)
  config.mesh.shape = MESH
  if arch == "encoder":
    config.model.update(arch="encoder", head="mlm")
  elif arch == "encoder_decoder":
    config.model.update(arch="encoder_decoder", head="lm", num_decoder_layers=1)
  return config


@pytest.fixture(scope="module")
def devices():
  from transformer.planning import topology  # pylint: disable=g-import-not-at-top
  return topology.parse_topology(TOPOLOGY), topology.topology_devices(
      topology.parse_topology(TOPOLOGY))


def test_decoder_arguments_are_the_hand_count(devices):
  """params x 4 bytes x (1 + 2 Adam slots) / shards + the batch's share, per chip."""
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  topo, devs = devices
  plan = plan_lib.make_plan(tiny(), topo, devs)
  assert set(plan.costs) == {"train", "eval", "decode"}
  # Kernels and the (tied) embedding shard over fsdp x tensor = 4; RMSNorm scales
  # [embed] over fsdp = 2. Per layer: q, k, v, out 256 x 256 and the MLP's 2 x 256 x 512.
  four_way = 2 * (4 * 256 * 256 + 2 * 256 * 512) + 512 * 256
  two_way = 2 * 2 * 256 + 256
  assert four_way + two_way == 1_180_928  # The model's parameter count.
  params_per_chip = (four_way // 4 + two_way // 2) * 4  # float32.
  # inputs, segment_ids, positions, targets (int32) and weights (float32), rows over fsdp.
  batch_per_chip = 5 * 16 * 128 * 4 // 2
  hand = params_per_chip * (1 + 2) + batch_per_chip
  arguments = plan.costs["train"].arguments_bytes
  assert hand <= arguments <= hand + SCALAR_TILES, (arguments, hand)
  assert plan.breakdown["params"] == params_per_chip
  assert plan.all_fit and plan.replicated == []
  train = plan.costs["train"]
  assert train.model_flops > 0 and train.xla_flops > 0 and train.temp_bytes > 0
  # fsdp gathers weights and scatters gradients; the loss sums are all-reduced.
  assert train.collective_bytes["all-gather"] > 0
  assert plan.estimates["train"].seconds > 0 and 0 < plan.estimates["train"].mfu <= 1


@pytest.mark.parametrize("arch", ["encoder", "encoder_decoder"])
def test_encoder_and_encoder_decoder_compile(devices, arch, monkeypatch):
  """Arguments = the shardings' own count (plus scalar tiles); decode only for seq2seq."""
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from transformer.planning import compiled  # pylint: disable=g-import-not-at-top
  topo, devs = devices
  steps = ("train", "decode")
  given = []  # The devices each compile declares to the persistent cache's guard.
  guard = compiled.cache_writes_for
  monkeypatch.setattr(compiled, "cache_writes_for",
                      lambda d: given.append(list(np.asarray(d).flat)) or guard(d))
  plan = plan_lib.make_plan(tiny(arch), topo, devs, steps)
  assert set(plan.costs) == ({"train", "decode"} if arch == "encoder_decoder" else {"train"})
  assert len(given) == len(plan.costs) and all(set(d) == set(devs) for d in given), given
  counted = sum(plan.breakdown.values())
  assert counted <= plan.costs["train"].arguments_bytes <= counted + SCALAR_TILES
  assert plan.all_fit


def _run_mode(config, argv, capsys) -> tuple[int, str, str]:
  """transformer.cli.compile.run(config) with launch.py's flags parsed from `argv`."""
  from transformer.cli import compile as compile_mode  # pylint: disable=g-import-not-at-top
  if not any(arg.startswith("--input_seconds") for arg in argv):
    argv = argv + ["--input_seconds=0"]  # The input measurement: only where a test asks.
  flags.FLAGS(["launch.py", "--mode=compile"] + argv)
  try:
    code = compile_mode.run(config)
  finally:
    flags.FLAGS.unparse_flags()
  out = capsys.readouterr()
  return code, out.out, out.err


def test_too_large_is_reported_not_fitting(tmp_path, capsys, tfds_data_dir, caplog):
  """A v5e chip has 16 GiB: 4 layers of width 8192, replicated, do not fit. The input
  pipeline is measured beside it (planning/input_rate.py)."""
  report = tmp_path / "report.json"
  config = tiny()
  config.model.update(d_model=8192, mlp_dim=32768, num_layers=4, num_heads=64)
  config.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))
  config.data.update(data_dir=tfds_data_dir, num_threads=1)
  # The input stage times only what a run has built (planning/input_rate.py): build it.
  from transformer.data import sources  # pylint: disable=g-import-not-at-top
  sources.load_sources(config)
  with caplog.at_level("INFO"):
    code, out, err = _run_mode(
        config, [f"--topology={TOPOLOGY}", f"--output={report}", "--compile_steps=train",
                 "--notry_levers", "--input_seconds=0.2"], capsys)
  assert code == 1, err[-3000:]
  # Each stage as it starts, then its time (workdir/progress.py), on stderr: stdout is the report.
  for stage in (f"compile: train for {TOPOLOGY} (4 devices)",
                "compile: tracing the model on mesh {'data': 4, 'fsdp': 1, 'tensor': 1}",
                "compile: lowering the train step", "compile: XLA compiling the train step",
                "compile: timing this host's input pipeline (--input_seconds=0.2)"):
    assert f"{stage} ..." in caplog.text, caplog.text
    # (XLA may refuse the train step as out of memory: it says so, with the time.)
    assert re.search(re.escape(stage) + r".*: (out of memory after )?(\d+\.\ds|\d+m\d\ds)$",
                     caplog.text, re.MULTILINE), stage
  assert "does not fit by" in out + err  # absl's app.run may route the report to either.
  assert err.strip().splitlines()[-1].startswith("Does not fit: the train step needs")
  assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # Nothing else written.
  result = json.loads(report.read_text())
  assert result["topology"] == TOPOLOGY and result["chips"] == 4
  assert result["chip_kind"] == "TPU v5 lite" and result["mesh"] == {
      "data": 4, "fsdp": 1, "tensor": 1}
  assert result["config"]["batch_size"] == config.data.batch_size  # What was compiled.
  assert result["config"]["seq_len"] == config.data.seq_len
  train = result["steps"]["train"]
  assert train["fits"] is False and train["total_bytes"] > train["chip_bytes"]
  for key in ("arguments_bytes", "temp_bytes", "output_bytes", "flops_per_chip",
              "collective_bytes", "estimated_seconds", "estimated_hfu", "kernels"):
    assert key in train
  measured = result["input"]  # v5e:2x2 is one host of 4 chips: it builds all 16 rows.
  assert measured["error"] is None and measured["hosts"] == 1
  assert measured["local_batch_size"] == 16 and measured["tokens_per_second"] > 0
  assert "Input: this host's pipeline delivered" in out
  if train["estimated_tokens_per_second"] is not None:
    assert measured["demand_ratio"] == pytest.approx(
        train["estimated_tokens_per_second"] / measured["tokens_per_second"])
    assert ("INPUT-BOUND" in out) == measured["input_bound"] == (measured["demand_ratio"] > 1)
  if train["compile_error"]:  # XLA refused it: no step time is made up for it.
    assert train["estimated_seconds"] is None and train["estimated_mfu"] is None
    assert "no estimate: XLA refused to compile it" in out


@pytest.mark.slow  # Five compiles of a 4-layer model (~45 s on two cores).
def test_scanned_and_unscanned_agree(devices):
  """XLA's TPU cost analysis counts a scanned stack's body once; with every trip
  multiplied out (the bound read from the loop's condition) the same 4-layer model
  scanned and unrolled reports FLOPs and collective bytes within 5%, and HBM bytes
  within 5% once taken from the step unrolled at 1 and 2 layers (depth.py); counted
  per kernel in the scanned body they are not (1.4x here)."""
  from transformer.planning import depth  # pylint: disable=g-import-not-at-top
  from transformer.planning import estimate  # pylint: disable=g-import-not-at-top
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from transformer.planning import topology  # pylint: disable=g-import-not-at-top
  topo, devs = devices
  plans = {}
  for scan in (False, True):
    config = tiny()
    config.model.update(num_layers=4, scan_layers=scan)
    config.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))
    plans[scan] = plan_lib.make_plan(config, topo, devs, ("train",), extrapolate_depth=False)
  unrolled, looped = plans[False].costs["train"], plans[True].costs["train"]
  # What make_plan's extrapolate_depth=True adds to the scanned step, without compiling
  # the scanned step a second time.
  compiled_config = plans[True].config
  scanned = depth.extrapolate(compiled_config, topology.topology_mesh(compiled_config.mesh, devs),
                              {"train": looped})["train"]
  assert unrolled.bytes_source == "XLA cost analysis"  # Nothing scanned: nothing to do.
  assert scanned.loop_factors["flops"] > 2  # The body was counted once by XLA.
  assert scanned.xla_flops == pytest.approx(unrolled.xla_flops, rel=0.05)
  assert estimate.collective_total(scanned) == pytest.approx(
      estimate.collective_total(unrolled), rel=0.05)
  assert scanned.bytes_source == ("XLA cost analysis of the step unrolled at 1 and 2 "
                                  "layers, extrapolated per layer to 4")
  assert scanned.hbm_bytes_accessed == pytest.approx(unrolled.hbm_bytes_accessed, rel=0.05)
  assert looped.hbm_bytes_accessed > 1.2 * unrolled.hbm_bytes_accessed
  assert scanned.optimal_seconds == pytest.approx(unrolled.optimal_seconds, rel=0.05)
  # Memory, FLOPs and collectives stay the scanned program's own.
  assert (scanned.temp_bytes, scanned.xla_flops) == (looped.temp_bytes, looped.xla_flops)


def test_depth_variants_follow_the_layer_period():
  """Interleaved MoE and local/global layers repeat with a period: the unrolled
  compiles are one and two periods deep; each stack of an encoder-decoder gets its own
  slope; a stack no deeper than two periods is compiled at its own depth."""
  from transformer.planning import depth  # pylint: disable=g-import-not-at-top
  config = tiny()
  config.model.update(num_layers=16)
  assert depth.variants(config.model) == [{"num_layers": 1}, {"num_layers": 2}]
  config.model.update(mlp="moe", moe_every=2, sliding_window=64, window_pattern="lllg")
  assert depth.period(config.model) == 4
  assert depth.variants(config.model) == [{"num_layers": 4}, {"num_layers": 8}]
  seq2seq = tiny("encoder_decoder")
  seq2seq.model.update(num_layers=6, num_decoder_layers=2)
  assert depth.variants(seq2seq.model) == [
      {"num_layers": 1, "num_decoder_layers": 1}, {"num_layers": 2, "num_decoder_layers": 1},
      {"num_layers": 1, "num_decoder_layers": 2}]
  # f = 10 + 3 per encoder layer + 5 per decoder layer, from the three compiles.
  values = [10 + 3 + 5, 10 + 6 + 5, 10 + 3 + 10]
  assert depth._line(values, depth.variants(seq2seq.model),  # pylint: disable=protected-access
                     depth.stacks(seq2seq.model)) == 10 + 3 * 6 + 5 * 2


def test_splash_attention_is_counted_from_its_shapes(devices):
  """Pallas's splash kernels are opaque to XLA's cost analysis: counted from their
  shapes, the step's FLOPs stay within a few % of the same model with XLA's attention.
  By hand, per chip: B=4 rows, H=2 heads, L=S=128, D=128, one product m = 2BHLSD; XLA's
  attention does 6m (QK^T, PV; dP, dV, dQ, dK), splash 9m (its dq and dkv kernels each
  recompute QK^T, dkv dP too), and one 128-block per side leaves nothing to skip."""
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  topo, devs = devices
  costs = {}
  for impl in ("xla", "splash"):
    config = tiny()
    config.model.update(num_layers=1, attention_impl=impl)
    config.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))
    costs[impl] = plan_lib.make_plan(config, topo, devs, ("train",)).costs["train"]
  splash, xla = costs["splash"], costs["xla"]
  assert {kind: n for kind, n in splash.kernels.items() if kind.startswith("attention")} == {
      "attention splash_mqa_fwd": 1, "attention splash_mqa_dq": 1,
      "attention splash_mqa_dkv": 1}
  m = 2 * 4 * 2 * 128 * 128 * 128
  assert splash.xla_flops == pytest.approx(xla.xla_flops + 3 * m, rel=0.01)
  assert splash.xla_flops == pytest.approx(xla.xla_flops, rel=0.05)
  assert splash.xla_flops >= splash.model_flops


def test_audit_lists_a_leaf_a_rule_leaves_whole(devices):
  """mlp -> None on a tensor-parallel mesh: the MLP kernels' [mlp] dims are not split,
  but embed -> fsdp still is; with embed -> None too they are whole on every chip."""
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  topo, devs = devices
  config = tiny()
  config.mesh.rules = tuple((name, None if name in ("mlp", "embed") else axes)
                            for name, axes in config.mesh.rules)
  plan = plan_lib.make_plan(config, topo, devs, steps=("eval",))
  paths = [leaf.path for leaf in plan.replicated]
  assert "params/block_0/mlp/wi/kernel" in paths
  assert any(path.startswith("opt_state/") and path.endswith("mlp/wi/kernel")
             for path in paths)
  assert all("query" not in path for path in paths)  # heads -> tensor still splits them.
  wi = next(leaf for leaf in plan.replicated if leaf.path == "params/block_0/mlp/wi/kernel")
  assert wi.shape == (256, 512) and wi.nbytes == 256 * 512 * 4


@pytest.mark.slow  # One compile per mesh and remat policy (~50 s on two cores).
def test_mesh_search_puts_fitting_fastest_first(devices, monkeypatch, caplog):
  from transformer.planning import search  # pylint: disable=g-import-not-at-top
  topo, devs = devices
  config = tiny()
  # tensor=4 splits the heads too; one layer each keeps the compiles short.
  config.model.update(num_heads=4, d_model=512, num_layers=1)
  assert sorted(search.factorisations(4)) == [
      (1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
  # Three of the six meshes (one per tensor size) keep the compiles few; the GPU test
  # searches every mesh of its host through the command line.
  meshes = [(4, 1, 1), (1, 2, 2), (1, 1, 4)]
  monkeypatch.setattr(search, "factorisations", lambda n: meshes)
  with caplog.at_level("INFO"):
    trials = search.mesh_search(config, topo, devs, ("none",))
  assert len(trials) == 3
  assert "compile: trying data=4 fsdp=1 tensor=1 remat=none for the train step" in caplog.text
  assert "compile: mesh search: 3 trials in " in caplog.text
  ranks = [search.rank(t) for t in trials]
  assert ranks == sorted(ranks)
  fitting = [t for t in trials if t.fits]
  assert fitting and all(t.error is None for t in fitting)
  assert [t.seconds for t in fitting] == sorted(t.seconds for t in fitting)


def test_unknown_topology_lists_the_known_ones():
  from transformer.planning import topology  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=r"--topology='v9z:2x2' is unknown.*v5e:4x4 \(v5e-16\)"):
    topology.parse_topology("v9z:2x2")
  assert topology.parse_topology("v5p-64").name == "v5p:2x4x4"


def test_mesh_product_mismatch_names_both_numbers(capsys):
  config = tiny()
  config.mesh.shape = (("data", 1), ("fsdp", 2), ("tensor", 4))
  code, _, err = _run_mode(config, [f"--topology={TOPOLOGY}"], capsys)
  assert code == 2, err[-3000:]
  assert "it has 8 slots for 4 devices" in err


def test_an_axis_that_splits_a_torus_side_names_the_axis_and_the_key(capsys):
  """v5e:4x4 has sides 4 and 4: fsdp 8 would split one, so it is one line unless allowed."""
  from transformer.planning import topology  # pylint: disable=g-import-not-at-top
  config = tiny()
  config.mesh.shape = (("data", 1), ("fsdp", 8), ("tensor", 2))
  code, _, err = _run_mode(config, ["--topology=v5e:4x4", "--compile_steps=train"], capsys)
  assert code == 2, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert "Traceback" not in err
  assert "(data=1, fsdp=8, tensor=2) does not map onto the devices' torus 4x4x1" in last
  # mesh_utils places the axes in its own order; the one it could not place is named.
  assert re.search(r"assignment for axis '(fsdp|tensor)' of size", last), last
  assert "allow_split_physical_axes=True" in last
  config.mesh.allow_split_physical_axes = True
  topo = topology.parse_topology("v5e:4x4")
  mesh = topology.topology_mesh(config.mesh, topology.topology_devices(topo))
  assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 2}
  assert len({d.id for d in mesh.devices.flat}) == 16


def test_heads_not_divisible_by_tensor_names_the_field(devices):
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  topo, devs = devices
  config = tiny()
  config.model.update(num_heads=1, num_kv_heads=1, head_dim=256)
  with pytest.raises(ConfigError, match=r"model.num_(kv_)?heads=1 does not divide over mesh "
                                        r"axes \('tensor',\) of size 2"):
    plan_lib.make_plan(config, topo, devs, steps=("train",))


def test_moe_experts_spread_over_the_expert_axis_move_tokens_all_to_all(devices):
  """Capacity dispatch with experts on their own mesh axis: the report shows the
  all-to-all that carries tokens to their experts, and each chip holds half the experts."""
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  topo, devs = devices
  config = tiny()
  config.model.update(mlp="moe", num_experts=4, experts_per_token=2, moe_dispatch="capacity")
  config.mesh.shape = (("data", 1), ("fsdp", 2), ("tensor", 1), ("expert", 2))
  plan = plan_lib.make_plan(config, topo, devs, ("train",))
  assert plan.all_fit and plan.mesh["expert"] == 2
  assert plan.costs["train"].collective_bytes["all-to-all"] > 0
  # Expert kernels [4, 256, 512] x 2 and [4, 512, 256] per layer split over expert x fsdp.
  expert_params = 2 * 3 * 4 * 256 * 512
  assert plan.breakdown["params"] < (expert_params // 2) * 4  # Not whole on any chip.


def test_a_fine_tuning_config_compiles_the_model_of_its_source(tmp_path, capsys):
  """With init_from the compiled model is the source's (training/fine_tune.py): the
  tiny GPT-2 import's, its data.seq_len lowered to the import's max_len of 32."""
  from transformer.interop.hf import importer  # pylint: disable=g-import-not-at-top
  source = str(tmp_path / "gpt2_hf")
  importer.import_folder(os.path.join(os.path.dirname(__file__), "fixtures", "hf", "gpt2"),
                         source)
  config = tiny()
  config.init_from = source
  report = tmp_path / "report.json"
  code, out, err = _run_mode(config, [f"--topology={TOPOLOGY}", f"--output={report}",
                                      "--compile_steps=train", "--notry_levers"], capsys)
  assert code == 0, err[-3000:]
  assert json.loads(report.read_text())["config"]["seq_len"] == 32
  assert config.model.d_model == 32 and config.model.vocab_size == 304



@pytest.mark.slow  # Two compiles of a 1024-wide model (~30 s on two cores).
def test_a_lora_config_shows_full_fine_tuning_beside_it(tmp_path, capsys):
  """LoRA's saving is shown, not left to a second command: the train step compiled
  without adapters (full fine-tuning) needs more (gradients and Adam moments for every
  weight). Wider than tiny() and 4 rows, so that weights, not the compiled code and
  activations, make the step: 44 MiB with LoRA against 91 MiB in full on v5e:2x2."""
  config = tiny()
  config.model.update(lora_rank=4, lora_alpha=8.0, d_model=1024, num_heads=8, mlp_dim=2048,
                      vocab_size=4096)
  config.data.batch_size = 4
  report = tmp_path / "report.json"
  code, out, err = _run_mode(config, [f"--topology={TOPOLOGY}", f"--output={report}",
                                      "--compile_steps=train", "--notry_levers"], capsys)
  assert code == 0, err[-3000:]
  data = json.loads(report.read_text())
  lora_bytes, full = data["steps"]["train"]["total_bytes"], data["full_fine_tuning"]
  assert full["label"] == "full fine-tuning (model.lora_rank=0)"
  assert full["step"] == "train" and full["total_bytes"] > lora_bytes
  assert "LoRA against full fine-tuning" in out
  assert re.search(r"full fine-tuning \(model.lora_rank=0\)\s+[\d.]+ [MG]iB \(\+[\d.]+ GiB\)",
                   out), out


def test_libtpu_is_not_handed_the_cpu_compilers_flags(monkeypatch):
  """libtpu aborts on an XLA flag it does not register (exit 1, the reason only in
  /tmp/tpu_logs); the tests' own XLA_FLAGS carry --xla_cpu_use_fusion_emitters, so every
  TPU compile test above also runs this path."""
  from transformer.planning import topology  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                     "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0 "
                     "--xla_gpu_enable_triton_gemm=false --xla_cpu_enable_fast_math=true")
  assert topology.drop_cpu_compiler_flags() == ["--xla_cpu_use_fusion_emitters=false",
                                                "--xla_cpu_enable_fast_math=true"]
  assert os.environ["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=8 "
                                     "--xla_backend_optimization_level=0 "
                                     "--xla_gpu_enable_triton_gemm=false")
  assert topology.drop_cpu_compiler_flags() == []


def test_programs_for_devices_this_host_lacks_stay_out_of_jax_persistent_cache(devices):
  """JAX serialises a program compiled for a TPU topology like any other, but cannot load
  it back without that TPU (the next run's read warns "PjRtCompiler must be constructed
  with a Client" and compiles again): compile mode's compiles write none; a program for
  this host's own devices is written as before, and JAX's threshold is restored."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from transformer.planning import compiled  # pylint: disable=g-import-not-at-top
  folder = os.environ["JAX_COMPILATION_CACHE_DIR"]  # tests/conftest.py sets one.
  threshold = jax.config.jax_persistent_cache_min_compile_time_secs

  def written(name):
    return [f for f in os.listdir(folder) if f.startswith(f"jit_{name}-")]

  def topology_probe(x):
    return jnp.sin(x) @ x.T

  def local_probe(x):
    return jnp.cos(x) @ x.T

  _, devs = devices
  mesh = jax.sharding.Mesh(np.asarray(devs).reshape(2, 2), ("a", "b"))
  placed = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("a", "b"))
  lowered = jax.jit(topology_probe, in_shardings=placed).lower(
      jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=placed))
  with compiled.cache_writes_for(mesh.devices):
    assert lowered.compile().memory_analysis() is not None
  assert written("topology_probe") == []
  assert jax.config.jax_persistent_cache_min_compile_time_secs == threshold
  with pytest.raises(RuntimeError, match="probe"):  # Restored when the compile fails too.
    with compiled.cache_writes_for(mesh.devices):
      raise RuntimeError("probe")
  assert jax.config.jax_persistent_cache_min_compile_time_secs == threshold
  cpu = np.asarray(jax.devices()[:1])
  with compiled.cache_writes_for(cpu):
    jax.jit(local_probe).lower(jnp.ones((8, 8))).compile()
  assert len(written("local_probe")) == 1
