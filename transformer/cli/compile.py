"""--mode=compile: does --config fit a TPU slice or GPU host (--topology=v5p:4x4x4, h100:8),
and how fast could it run? Compiled on this CPU host; -> --output.

  python launch.py --mode=compile --config=configs/gpt_small.py --topology=v5p:4x4x4
  python launch.py --mode=compile --config=configs/gpt_small.py --topology=h100:8
  python launch.py --mode=compile --config=configs/gpt_small.py --topology=h200:1 \
      --tokens=2e10 --price_per_chip_hour=3.5

No TPU or GPU needed. Compiles the train step, the eval step and (decoder LM,
encoder-decoder) the cached decode for the target's abstract devices with XLA's TPU
compiler (`pip install libtpu`) or GPU compiler (jax's CUDA plugin wheels,
planning/gpu.py), on this CPU host, and prints per chip: parameters, optimizer state,
batch and temporaries against the memory a run can use with a verdict; step-time
bounds and an estimated tokens/s, MFU and HFU; the tokens/s this host's input pipeline
delivers beside the step's demand per host ("INPUT-BOUND" when short; --input_seconds);
the kernels that matter; the sharding audit; the levers tried when a step does not fit;
with --mesh_search, every data x fsdp x tensor mesh (and remat policy) compiled and
ranked; for a LoRA config, the train step without adapters beside it (--lora_baseline).
--tokens=N [--price_per_chip_hour=P] adds the time to train N tokens at the train step's
estimate (its range and floor too) and, with a price, its cost (chips x hours x P).
--output=FILE writes the same as JSON. Exit status 0 when every step fits, 1 when one
does not, 2 on bad input (the reason on the last line).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import ml_collections
from absl import flags

from transformer.cli import common

_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "compile: the TPU slice, <generation>:<chips per side> as "
    "jax.experimental.topologies spells it (v4:2x2x1, v5e:4x4, v5p:2x4x4, v6e:2x4) or a "
    "Cloud name (v5p-64); or GPU hosts, <gpu>:<gpus per host>[x<hosts>] (h100:8, h200:8, "
    "a100:8, h100:8x2).")
_ANY_SLICE = flags.DEFINE_bool(
    "any_slice", False, "compile: accept a TPU chip grid that no rentable slice has "
    "(v5p:2x2x3 is refused as a likely typo for 2x2x4 without it).")
_NUM_SLICES = flags.DEFINE_integer(
    "num_slices", 1, "compile: slices of --topology joined over the data-centre network; "
    "the mesh's data axis spans them.")
_MESH_SEARCH = flags.DEFINE_bool(
    "mesh_search", False, "compile: also compile the train step for every data x fsdp x "
    "tensor factorisation of the chip count and each --search_remat policy; print those "
    "that fit, fastest estimate first.")
_SEARCH_REMAT = flags.DEFINE_list(
    "search_remat", ["none", "full"], "compile: the model.remat policies --mesh_search tries.")
_COMPILE_STEPS = flags.DEFINE_list(
    "compile_steps", ["train", "eval", "decode"], "compile: which steps to compile (decode "
    "only for a decoder LM or an encoder-decoder).")
_TRY_LEVERS = flags.DEFINE_bool(
    "try_levers", True, "compile: when a step does not fit, compile it with each lever "
    "(remat, scan_layers, more fsdp, micro-batches, a smaller batch) and show the effect.")
_EXTRAPOLATE_DEPTH = flags.DEFINE_bool(
    "extrapolate_depth", True, "compile: for a scanned model, take HBM bytes and "
    "XLA's optimal_seconds from the steps compiled unrolled at two small depths, "
    "extrapolated per layer (a scanned body's bytes are not counted as the unrolled "
    "layers' are; planning/depth.py); --noextrapolate_depth skips those compiles.")
_LORA_BASELINE = flags.DEFINE_bool(
    "lora_baseline", True, "compile: for a LoRA config (model.lora_rank > 0), also compile "
    "the train step without adapters (full fine-tuning) and show what LoRA saves.")
_TOKENS = flags.DEFINE_float(
    "tokens", None, "compile: tokens to train (e.g. 2e10): the report gives the time that "
    "takes at the train step's estimate, with its range and floor (planning/budget.py).")
_PRICE = flags.DEFINE_float(
    "price_per_chip_hour", None, "compile: with --tokens, the price of one chip for an hour: "
    "the report gives the cost, chips x hours x price.")
_INPUT_SECONDS = flags.DEFINE_float(
    "input_seconds", 3.0, "compile: seconds to time this host's training input pipeline "
    "(after its first batch), reported beside the step's token demand per host; 0 skips it.")


STARTS_JAX = False  # No jax.distributed, no workdir: it compiles on this host's CPU.
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("output",)


def main(config: ml_collections.ConfigDict, workdir: str | None) -> int:
  """launch.py --mode=compile (--workdir is not used)."""
  del workdir
  return run(config)


def run(config: ml_collections.ConfigDict) -> int:
  """Compiles `config` for --topology and prints the report; returns the exit status.

  Args:
    config: the experiment config, with --config.* overrides applied.

  Returns:
    0 when every compiled step fits the chip's memory, 1 when one does not, 2 on bad
    input (unknown topology, a mesh or model that does not split, no libtpu or CUDA
    plugin, a config the target's compiler rejects).
  """
  status = _start_jax_on_this_cpu()
  if status:
    return status
  # Imported once JAX is on this host's CPU (above).
  from transformer.workdir import files  # pylint: disable=g-import-not-at-top
  from transformer.workdir import progress  # pylint: disable=g-import-not-at-top
  from transformer.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from transformer.planning import input_rate  # pylint: disable=g-import-not-at-top
  from transformer.planning import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from transformer.planning import report  # pylint: disable=g-import-not-at-top
  from transformer.planning import topology as topology_lib  # pylint: disable=g-import-not-at-top

  from transformer.planning import budget  # pylint: disable=g-import-not-at-top
  try:
    budget.check(_TOKENS.value, _PRICE.value)
    if _TOKENS.value is not None and "train" not in _COMPILE_STEPS.value:
      raise ConfigError(f"--tokens needs the train step: --compile_steps="
                        f"{','.join(_COMPILE_STEPS.value)} leaves it out")
    # A fine-tuning config compiles the model it would train: init_from's (training/fine_tune.py).
    from transformer.training import fine_tune  # pylint: disable=g-import-not-at-top
    fine_tune.take_source_model(config, common.config_overrides())
    topology = topology_lib.parse_topology(_TOPOLOGY.value, _NUM_SLICES.value,
                                           any_shape=_ANY_SLICE.value)
    devices = topology_lib.topology_devices(topology)
    with progress.stage(f"compile: {', '.join(_COMPILE_STEPS.value)} for {_TOPOLOGY.value} "
                        f"({len(devices)} devices)"):
      plan = plan_lib.make_plan(config, topology, devices, tuple(_COMPILE_STEPS.value),
                                extrapolate_depth=_EXTRAPOLATE_DEPTH.value)
  except ConfigError as e:
    sys.stderr.write(f"ConfigError: {e}\n")
    return 2
  print("\n".join(report.plan_lines(plan)), flush=True)
  train_time = None
  if _TOKENS.value is not None:
    try:
      train_time = budget.time_to_train(plan, _TOKENS.value, _PRICE.value)
    except ConfigError as e:
      sys.stderr.write(f"ConfigError: {e}\n")
      return 2
    print("\n".join(budget.lines(train_time, plan.costs["train"].tokens)), flush=True)
  rate = None
  if _INPUT_SECONDS.value > 0:
    with progress.stage(f"compile: timing this host's input pipeline "
                        f"(--input_seconds={_INPUT_SECONDS.value:g})"):
      rate = input_rate.measure(config, input_rate.hosts_of(devices), _INPUT_SECONDS.value)
    print("\n" + "\n".join(input_rate.lines(rate, plan.train_tokens_per_second)), flush=True)

  failing = [step for step in plan.costs if not plan.fits(step)]
  levers, full = _levers_and_lora_baseline(plan, topology, devices, failing)
  trials = None
  if _MESH_SEARCH.value:
    try:
      trials = _mesh_search(plan, topology, devices)
    except ConfigError as e:
      sys.stderr.write(f"ConfigError: {e}\n")
      return 2

  output = flags.FLAGS.output
  if output:
    result = report.to_json(plan, levers, trials, full, train_time)
    result["input"] = (input_rate.to_json(rate, plan.train_tokens_per_second)
                       if rate is not None else None)
    files.write_atomically(output, json.dumps(result, indent=2),
                           flag="--output")  # A full disk names --output, not --workdir.
    print(f"Report written to {output}")
  if failing:
    worst = max(failing, key=lambda step: plan.costs[step].total_bytes)
    sys.stderr.write(
        f"Does not fit: the {worst} step needs {report.gib(plan.costs[worst].total_bytes)} "
        f"per chip and a {plan.chip.name} chip can use {report.gib(plan.usable_bytes)} "
        f"({', '.join(failing)} {'does' if len(failing) == 1 else 'do'} not fit)\n")
    return 1
  print(f"Fits: every compiled step ({', '.join(plan.costs)}) fits a {plan.chip.name} chip "
        f"on mesh {plan.mesh}.")
  return 0


def _start_jax_on_this_cpu() -> int:
  """0 once JAX has started on this host's CPU; 2 (the reason written to stderr) when
  --topology is missing or its compiler (libtpu, jax's CUDA plugin) is not installed."""
  from transformer import plugin_noise  # pylint: disable=g-import-not-at-top
  from transformer.planning import gpu  # pylint: disable=g-import-not-at-top
  from transformer.planning import topology as topology_lib  # pylint: disable=g-import-not-at-top
  if not _TOPOLOGY.value:
    sys.stderr.write("--mode=compile needs --topology, e.g. --topology=v5p:4x4x4 or "
                     f"h100:8; known slices: {topology_lib.known_topologies()}; GPUs: "
                     f"{', '.join(f'{name}:8' for name in gpu.TARGETS)}\n")
    return 2
  missing = (gpu.wheels_missing() if gpu.is_gpu(_TOPOLOGY.value)
             else topology_lib.libtpu_missing())
  if missing:
    sys.stderr.write(missing + "\n")
    return 2
  # The compile runs on this host's CPU whatever accelerators it has.
  # jax may be imported already (a config file, a test), so its config is set too.
  import jax  # pylint: disable=g-import-not-at-top
  if not os.environ.get("JAX_PLATFORMS"):
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
  plugin_noise.start_backends_quietly()  # jax loads every installed plugin as it starts.
  return 0


def _levers_and_lora_baseline(plan: Any, topology: Any, devices: Any,
                              failing: list[str]) -> tuple[dict[str, Any], Any]:
  """({step: the levers tried} for each step that does not fit (--try_levers), the train
  step without adapters for a LoRA config (--lora_baseline) or None); each printed."""
  from transformer.planning import report  # pylint: disable=g-import-not-at-top
  from transformer.planning import search  # pylint: disable=g-import-not-at-top
  from transformer.workdir import progress  # pylint: disable=g-import-not-at-top
  levers = {}
  if _TRY_LEVERS.value:
    for step in failing:
      levers[step] = search.try_levers(plan.config, topology, devices, plan.mesh, step,
                                       _EXTRAPOLATE_DEPTH.value)
      print("\n".join(report.trial_lines(
          f"Levers for the {step} step, each compiled on its own ({report.gib(plan.costs[step].total_bytes)} "
          "now):", levers[step], plan.usable_bytes, plan.costs[step].total_bytes)),
            flush=True)
  full = None
  if _LORA_BASELINE.value and plan.config.model.lora_rank and "train" in plan.costs:
    with progress.stage("compile: the train step without adapters (full fine-tuning)"):
      full = search.full_fine_tuning(plan.config, topology, devices, _EXTRAPOLATE_DEPTH.value)
    print("\n".join(report.trial_lines(
        f"LoRA against full fine-tuning: the train step without adapters "
        f"({report.gib(plan.costs['train'].total_bytes)} with them; --nolora_baseline "
        "skips it):", [full], plan.usable_bytes, plan.costs["train"].total_bytes)),
          flush=True)
  return levers, full


def _mesh_search(plan: Any, topology: Any, devices: Any) -> list[Any]:
  """--mesh_search: the train step compiled on every mesh (and --search_remat policy),
  printed fastest first; ConfigError when the search cannot start."""
  from transformer.planning import report  # pylint: disable=g-import-not-at-top
  from transformer.planning import search  # pylint: disable=g-import-not-at-top
  trials = search.mesh_search(plan.config, topology, devices,
                              tuple(_SEARCH_REMAT.value), _EXTRAPOLATE_DEPTH.value)
  print("\n".join(report.trial_lines(
      f"Mesh search: the train step on {topology.chips} chips, those that fit fastest "
      "first:", trials, plan.usable_bytes)), flush=True)
  return trials
