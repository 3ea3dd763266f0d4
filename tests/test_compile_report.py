"""--mode=compile's report, every branch rendered from hand-built inputs (nothing compiled).

Each case builds the StepCosts, Estimates and Trials a compile would produce and renders
the console lines and the JSON: a step that fits, one that does not, one XLA refused, the
levers (fitting, not fitting, refused by the checks, refused by XLA), the mesh search,
collectives XLA could not print, and a GPU target without cost analysis.
"""

import json

import pytest

from configs import gpt_small
from transformer import hardware
from transformer.planning import audit
from transformer.planning import collectives
from transformer.planning import compiled
from transformer.planning import estimate as estimate_lib
from transformer.planning import gpu
from transformer.planning import hlo
from transformer.planning import report
from transformer.planning import search
from transformer.planning import topology as topology_lib
from transformer.planning.plan import Plan

GIB = 2 ** 30
V5E = hardware.CHIPS["tpu v5 lite"]
H100 = hardware.CHIPS["h100"]
OOM = "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. HLO temporaries (40.00G) exceeds available HBM (15.75G)"


def _cost(name: str = "train", gib: float = 4.0, **fields) -> compiled.StepCost:
  """A compiled step of `gib` GiB in all (arguments 1 GiB, the rest temporaries)."""
  values = dict(name=name, arguments_bytes=GIB, temp_bytes=int((gib - 1) * GIB),
                output_bytes=GIB // 2, alias_bytes=GIB // 2, code_bytes=0,
                xla_flops=2e12, hbm_bytes_accessed=5e10,
                collective_bytes={"all-reduce": 2 ** 28}, compile_seconds=3.0,
                model_flops=1.5e12, tokens=4096, optimal_seconds=0.02)
  values.update(fields)
  return compiled.StepCost(**values)


def _refused(name: str = "train") -> compiled.StepCost:
  """A step XLA would not compile (compiled._out_of_memory's shape of it)."""
  return compiled._out_of_memory(name, RuntimeError(OOM), start=0.0,  # pylint: disable=protected-access
                                 arguments_bytes=GIB, model_flops=1.5e12, tokens=4096)


def _plan(costs: dict, chip=V5E, topology=None, mesh=None, replicated=(),
          memory_fraction=None) -> Plan:
  topology = topology or topology_lib.Topology("v5e:2x2", "v5e", (2, 2))
  usable = chip.hbm_bytes if memory_fraction is None else int(chip.hbm_bytes * memory_fraction)
  return Plan(config=gpt_small.get_config("local"), topology=topology,
              chip_kind="TPU v5 lite" if chip is V5E else "NVIDIA H100 80GB HBM3",
              chip=chip, mesh=mesh or {"data": 1, "fsdp": 2, "tensor": 2}, costs=costs,
              estimates={name: estimate_lib.estimate(cost, chip, 4)
                         for name, cost in costs.items()},
              breakdown={"params": GIB, "opt_state": 2 * GIB}, replicated=list(replicated),
              usable_bytes=usable, memory_fraction=memory_fraction)


def _render(plan: Plan, levers=None, search_trials=None) -> tuple[str, dict]:
  """The console text (plan, levers, search) and the JSON round-tripped through text."""
  lines = report.plan_lines(plan)
  for step, trials in (levers or {}).items():
    lines += report.trial_lines(f"Levers for the {step} step:", trials, plan.usable_bytes,
                                plan.costs[step].total_bytes)
  if search_trials is not None:
    lines += report.trial_lines("Mesh search:", search_trials, plan.usable_bytes)
  return "\n".join(lines), json.loads(json.dumps(report.to_json(plan, levers, search_trials)))


def test_a_step_that_fits_has_its_verdict_estimate_and_audit():
  text, result = _render(_plan({"train": _cost(gib=4.0), "decode": _cost(
      "decode", gib=2.0, model_flops=None, kernels={"attention (splash)": 4})}))
  assert "fits with 12.00 GiB to spare" in text
  assert ("(another model, not this estimate: XLA's own TPU cost model, optimal_seconds "
          "with loops multiplied out, says 20.00 ms)") in text
  assert "(ESTIMATE = floor, " in text and "-bound at published peaks" in text
  assert "MFU <=" in text
  assert "decode: model" not in text  # Decode has no model-FLOP count.
  assert "Kernels that matter" in text and "attention (splash) x4" in text
  assert "Sharding audit: no parameter or optimizer leaf is replicated." in text
  assert result["steps"]["train"]["fits"] is True
  assert result["steps"]["train"]["estimated_seconds"] > 0
  assert result["steps"]["decode"]["estimated_mfu"] is None


def test_a_step_that_does_not_fit_lists_replicated_leaves():
  leaf = audit.ReplicatedLeaf("params/token_embed/embedding", (32768, 4096), 2 * GIB)
  text, result = _render(_plan({"train": _cost(gib=20.0)}, replicated=[leaf]))
  assert "does not fit by 4.00 GiB" in text
  assert "1 parameter/optimizer leaves are replicated" in text
  assert "params/token_embed/embedding (32768, 4096): 2.00 GiB" in text
  assert result["steps"]["train"]["fits"] is False
  assert result["replicated"][0]["bytes"] == 2 * GIB


def test_a_step_xla_refused_has_no_estimate():
  text, result = _render(_plan({"train": _refused()}))
  assert "XLA refused to compile it: RESOURCE_EXHAUSTED" in text
  assert "train: no estimate: XLA refused to compile it" in text
  train = result["steps"]["train"]
  assert train["fits"] is False and train["compile_error"].startswith("RESOURCE_EXHAUSTED")
  assert train["temp_bytes"] == 40 * GIB  # XLA's own figure from its message.
  assert train["estimated_seconds"] is None and train["collective_bytes"] is None


def test_levers_render_every_outcome_refused_by_xla_included():
  """The crash of issue 39: a lever XLA refused has no estimate, and the table said '~None ms'."""
  plan = _plan({"train": _refused()})
  fitting = search.Trial("model.remat=full", {"model.remat": "full"}, "train",
                         total_bytes=10 * GIB, fits=True, seconds=0.5, mfu=0.4,
                         compile_seconds=2.0)
  too_big = search.Trial("model.scan_layers=True", {}, "train", total_bytes=18 * GIB,
                         seconds=0.6, mfu=None)
  by_xla = search.Trial("train.microbatches=2", {}, "train", total_bytes=30 * GIB,
                        compile_error=OOM, compile_seconds=7.0)
  checks = search.Trial("data.batch_size=2", {}, "train",
                        error="data.batch_size=2 does not split over data*fsdp=4")
  text, result = _render(plan, levers={"train": [fitting, too_big, by_xla, checks]})
  assert "fits with 6.00 GiB to spare; ~500.00 ms, MFU <= 40.0% (compiled in 2 s)" in text
  assert "does not fit by 2.00 GiB; ~600.00 ms" in text
  assert ("30.00 GiB (-11.00 GiB): XLA refused to compile it: RESOURCE_EXHAUSTED" in text
          and "(in 7 s)" in text)
  assert "not possible: data.batch_size=2 does not split" in text
  levers = result["levers"]["train"]
  assert [t["fits"] for t in levers] == [True, False, False, False]
  assert levers[2]["compile_error"] == OOM and levers[2]["estimated_seconds"] is None
  assert levers[3]["error"] and levers[3]["total_bytes"] is None


def test_mesh_search_ranks_and_renders_refused_meshes_last():
  trials = [search.Trial("data=4 fsdp=1 tensor=1 remat=none", {}, "train",
                         total_bytes=30 * GIB, compile_error=OOM),
            search.Trial("data=1 fsdp=4 tensor=1 remat=none", {}, "train",
                         total_bytes=8 * GIB, fits=True, seconds=0.3, mfu=0.5),
            search.Trial("data=1 fsdp=1 tensor=4 remat=none", {}, "train",
                         error="model.num_heads=2 does not split over tensor=4"),
            search.Trial("data=2 fsdp=2 tensor=1 remat=none", {}, "train",
                         total_bytes=20 * GIB, seconds=0.2)]
  ranked = sorted(trials, key=search.rank)
  assert [t.label[:6] for t in ranked] == ["data=1", "data=2", "data=4", "data=1"]
  text, result = _render(_plan({"train": _cost()}), search_trials=ranked)
  assert "Mesh search:" in text and "XLA refused to compile it" in text
  assert "(+" not in text.split("Mesh search:")[1]  # No baseline: no change column.
  assert [t["compile_error"] for t in result["mesh_search"]] == [None, None, OOM, None]


def test_unknown_collectives_say_the_interconnect_bound_is_missing():
  cost = _cost(collective_bytes={}, collective_error="HLO text unavailable")
  text, result = _render(_plan({"train": cost}))
  assert ("collectives per chip: none UNKNOWN (XLA could not print the compiled HLO: HLO "
          "text unavailable; the interconnect bound below is missing)") in text
  assert result["steps"]["train"]["collective_bytes"] is None
  assert result["steps"]["train"]["collective_error"] == "HLO text unavailable"


def test_a_gpu_target_without_cost_analysis_names_its_sources():
  cost = _cost(cost_source="HLO count", optimal_seconds=None,
               bytes_source="the step unrolled at depths 1 and 2, extrapolated",
               depth_compile_seconds=4.0, kernels={"matmul": 12},
               loop_factors={"flops": 2.0}, collective_bytes={"all-reduce": 2 ** 20, collectives.UNKNOWN_TRIPS: 1})
  plan = _plan({"train": cost}, chip=H100, topology=gpu.GpuTopology("h100:2", "h100", 2),
               mesh={"data": 2, "fsdp": 1, "tensor": 1}, memory_fraction=0.75)
  text, result = _render(plan)
  assert "(XLA_PYTHON_CLIENT_MEM_FRACTION)" in text and "chips of NVIDIA H100" in text
  assert "(HLO count, loops multiplied out x2.00)" in text
  assert "HBM bytes 5e+10/chip and optimal_seconds: the step unrolled" in text
  assert "another model, not this estimate" not in text  # GPU: no optimal_seconds.
  assert "1 loop(s) have no known trip count" in text
  assert "no fused-attention kernel listed" in text
  assert "Sharding audit: fsdp = tensor = 1, every weight is replicated by design." in text
  assert result["memory_fraction"] == 0.75 and result["num_slices"] == 1
  assert result["steps"]["train"]["cost_source"] == "HLO count"
  assert result["steps"]["train"]["optimal_seconds"] is None


@pytest.mark.parametrize("spare, words", [(GIB, "fits with 1.00 GiB to spare"),
                                          (-GIB, "does not fit by 1.00 GiB")])
def test_verdict_words(spare, words):
  assert report.verdict(10 * GIB - spare, 10 * GIB) == words


def test_a_trial_xla_refused_carries_its_message_and_no_estimate(monkeypatch):
  """search._try on a step XLA refused (make_plan stubbed with the plan it would return)."""
  refused = _plan({"train": _refused()})
  monkeypatch.setattr(search.plan_lib, "make_plan", lambda *args, **kwargs: refused)
  trial = search._try(gpt_small.get_config("local"), refused.topology, [],  # pylint: disable=protected-access
                      "model.remat=full", {"model.remat": "full"}, "train")
  assert trial.compile_error == OOM.splitlines()[0] and trial.error is None
  assert trial.seconds is None and trial.mfu is None and not trial.fits
  assert trial.total_bytes == refused.costs["train"].total_bytes
  assert search.rank(trial) == (1, float(trial.total_bytes))  # Among those that do not fit.


# A cuDNN attention backward call as XLA's GPU compiler prints it for a compile-only
# H100 (jax 0.10.2, nvidia-cudnn-cu12 9.28; a tiny Llama, packed rows of up to 32
# documents): its workspace, the last result, is u8[0], since cuDNN sizes it on a GPU.
_CUDNN_BACKWARD = (
    "%bwd = (bf16[4,4,256,32]{3,1,2,0}, bf16[4,4,256,32]{3,1,2,0}, "
    "bf16[4,4,256,32]{3,1,2,0}, u8[WORKSPACE]{0}) custom-call(%q, %k, %v, %stats, %o, "
    "%do, %l, %l, %off, %off), custom_call_target=\"__cudnn$fmhaSoftmaxBackward\", "
    "operand_layout_constraints={bf16[4,256,4,32]{3,2,1,0}, bf16[4,256,4,32]{3,2,1,0}, "
    "bf16[4,256,4,32]{3,2,1,0}, f32[128,4,256]{2,1,0}, bf16[4,256,4,32]{3,2,1,0}, "
    "bf16[4,256,4,32]{3,2,1,0}, LENGTHS}")


def _module(call: str) -> str:
  return ("HloModule m\n\nENTRY %main (q: bf16[4,256,4,32]) -> bf16[4,256,4,32] {\n"
          f"  {call}\n  ROOT %r = bf16[4,4,256,32]{{3,1,2,0}} get-tuple-element(%bwd), "
          "index=0\n}\n")


@pytest.mark.parametrize("workspace,lengths,expected", [
    # Packed: lengths [B, M = 32] and offsets [B, M + 1], twice (queries, keys).
    ("0", "s32[4,32]{1,0}, s32[4,32]{1,0}, s32[4,33]{1,0}, s32[4,33]{1,0}",
     4 * 256 * 4 * 32 * (8 * 32 + 4)),
    ("0", "s32[4]{0}, s32[4]{0}", 4 * 256 * 4 * 1 * (8 * 32 + 4)),  # Per-row lengths: M = 1.
    ("3271951360", "s32[4,32]{1,0}, s32[4,32]{1,0}", 0)])  # Sized by XLA on a GPU: nothing to add.
def test_an_unsized_cudnn_workspace_is_estimated_and_counted(workspace, lengths, expected):
  """XLA leaves cuDNN's backward workspace at u8[0] without a GPU; on an H100 it was up
  to 16 GiB (llama:1b): the estimate joins the step's total, and the report says so."""
  text = _module(_CUDNN_BACKWARD.replace("WORKSPACE", workspace).replace("LENGTHS", lengths))
  assert hlo.count(text).cudnn_workspace == expected
  cost = _cost(workspace_bytes=expected)
  assert cost.total_bytes == _cost().total_bytes + expected
  out, data = _render(_plan({"train": cost}, chip=H100, memory_fraction=0.9))
  assert data["steps"]["train"]["workspace_bytes"] == expected
  assert data["steps"]["train"]["total_bytes"] == cost.total_bytes
  assert ("cuDNN attention workspace, an ESTIMATE" in out) == bool(expected)


def _gpu_plan(costs: dict) -> Plan:
  return _plan(costs, chip=H100, topology=gpu.GpuTopology("h100:1", "h100", 1),
               mesh={"data": 1, "fsdp": 1, "tensor": 1}, memory_fraction=0.9)


def _launches():
  from test_kernels import _STEP  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  return hlo.launches(_STEP)[0]


def test_a_gpu_step_has_one_step_time_its_range_and_its_floor(monkeypatch):
  """One step time in the headline, the range of every fit and the floor beside it;
  the JSON carries them; an evaluation step has no MFU."""
  monkeypatch.setattr(report, "xla_attention_note", lambda plan: [])
  costs = {"train": _cost(cost_source="HLO count", optimal_seconds=None,
                          launches=_launches()),
           "eval": _cost("eval", cost_source="HLO count", optimal_seconds=None,
                         launches=_launches())}
  text, result = _render(_gpu_plan(costs))
  train = result["steps"]["train"]
  low, high = train["estimated_seconds_range"]
  assert train["lower_bound_seconds"] < low <= train["estimated_seconds"] <= high
  ms = lambda seconds: f"{seconds * 1e3:.2f} ms"
  assert (f"train: ~{ms(train['estimated_seconds'])} a step (ESTIMATE, range {ms(low)} to "
          f"{ms(high)}; floor >= {ms(train['lower_bound_seconds'])})") in text
  assert train["estimated_mfu"] is not None and "MFU ~" in text.split("eval:")[0]
  assert result["steps"]["eval"]["estimated_mfu"] is None
  eval_line = next(line for line in text.splitlines() if line.startswith("  eval: ~"))
  assert "MFU" not in eval_line and "HFU" not in eval_line
  assert "the total is the estimate above" in text
  assert "A lower bound on step time" not in result["assumptions"]
  assert "the floor is each kernel at its own roofline" in result["assumptions"].lower() or (
      "The floor is each kernel at its own roofline" in result["assumptions"])


def test_a_gpu_target_without_cudnn_says_first_that_it_assumes_xla_attention(monkeypatch):
  from transformer.model import attention_ops  # pylint: disable=g-import-not-at-top
  plan = _gpu_plan({"train": _cost(cost_source="HLO count", optimal_seconds=None)})
  plan.config.model.attention_impl = "auto"
  monkeypatch.setattr(attention_ops, "cudnn_available", lambda: False)
  lines = report.plan_lines(plan)
  assert lines[2].startswith("NOTE: this estimate assumes XLA's attention: "
                             "model.attention_impl='auto'")
  assert "nvidia-cudnn-cu12 is not installed" in lines[2]
  monkeypatch.setattr(attention_ops, "cudnn_available", lambda: True)
  assert not any(line.startswith("NOTE:") for line in report.plan_lines(plan))
  plan.config.model.attention_impl = "xla"  # Asked for XLA's: nothing to say.
  monkeypatch.setattr(attention_ops, "cudnn_available", lambda: False)
  assert not any(line.startswith("NOTE:") for line in report.plan_lines(plan))


def test_time_and_cost_to_train_n_tokens():
  from transformer.planning import budget  # pylint: disable=g-import-not-at-top
  plan = _gpu_plan({"train": _cost(cost_source="HLO count", optimal_seconds=None,
                                   launches=_launches())})
  est = plan.estimates["train"]
  result = budget.time_to_train(plan, 4096 * 1000, 2.5)
  assert result.steps == 1000 and result.seconds == pytest.approx(1000 * est.seconds)
  low, high = result.seconds_range
  assert low == pytest.approx(1000 * est.seconds_range[0])
  assert result.floor_seconds < low <= result.seconds <= high
  fields = json.loads(json.dumps(report.to_json(plan, train_time=result)))
  assert fields["time_to_train_seconds"] == [low, high]
  assert fields["cost_point"] == pytest.approx(1 * result.seconds / 3600 * 2.5)
  assert fields["cost"][1] == pytest.approx(high / 3600 * 2.5) and fields["train_steps"] == 1000
  text = "\n".join(budget.lines(result, 4096))
  assert "Time to train 4,096,000 tokens (an ESTIMATE: 1,000 steps of 4,096 tokens on 1 chips" in text
  assert "cost at 2.5 a chip-hour (1 chips x hours x price)" in text
  tpu = budget.time_to_train(_plan({"train": _cost()}), 4097, None)
  assert tpu.steps == 2 and tpu.seconds_range[1] is None and tpu.cost(tpu.seconds) is None
  assert "no upper end" in "\n".join(budget.lines(tpu, 4096))


@pytest.mark.parametrize("tokens, price, message", [
    (0, None, r"--tokens=0: the tokens to train, a count >= 1"),
    (float("inf"), None, r"--tokens=inf"),
    (None, 2.0, r"--price_per_chip_hour=2 needs --tokens=N"),
    (1e9, -1.0, r"--price_per_chip_hour=-1: a price per chip-hour >= 0"),
])
def test_bad_tokens_and_prices_are_one_line(tokens, price, message):
  from transformer.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from transformer.planning import budget  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=message):
    budget.check(tokens, price)


def test_tokens_without_a_train_step_estimate_are_refused():
  from transformer.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from transformer.planning import budget  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=r"--tokens needs the train step's estimate: XLA "
                     r"refused the train step \(RESOURCE_EXHAUSTED"):
    budget.time_to_train(_plan({"train": _refused()}), 1e9, None)
