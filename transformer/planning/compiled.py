"""Compiles a run's train, eval and decode steps for a mesh of abstract devices.

Nothing is materialised: the state is `Trainer.abstract_state` (shapes, dtypes and
shardings from `jax.eval_shape`), the batch is `jax.ShapeDtypeStruct`s in the batch
sharding, so a 7B-parameter step compiles on a laptop. What comes back per step is
XLA's own account of the compiled program: `memory_analysis()` (bytes per chip),
`cost_analysis()` (FLOPs and HBM bytes per chip, with every loop's trips multiplied
out by hlo.py's count of the program text; on GPU targets, which have no cost
analysis, hlo.py's count itself), the kernels and the collectives of its HLO text.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import glob
import os
import re
import tempfile
import time
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer import accelerator
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.inference import decoding
from transformer.inference import text
from transformer.model import objectives
from transformer.training import flops
from transformer.training import trainer as trainer_lib
from transformer.planning import collectives
from transformer.planning import gpu
from transformer.planning import hlo
from transformer.workdir import progress

STEPS = ("train", "eval", "decode")
@dataclasses.dataclass
class StepCost:
  """One compiled step, per chip. Bytes from memory_analysis, FLOPs from cost_analysis."""

  name: str
  arguments_bytes: int
  temp_bytes: int
  output_bytes: int
  alias_bytes: int  # Outputs written into donated arguments (the train state).
  code_bytes: int
  xla_flops: float  # Hardware FLOPs of the compiled program (remat and all), loops multiplied.
  hbm_bytes_accessed: float  # Loops multiplied too (see _loop_corrected).
  collective_bytes: dict[str, int]  # Kind -> bytes a chip moves per step ({} if unknown).
  compile_seconds: float
  collective_error: str | None = None  # Why collective_bytes is unknown, if it is.
  compile_error: str | None = None  # XLA refused to compile it (out of HBM): the message.
  model_flops: float | None = None  # flops.py's count per chip (None for decode).
  tokens: int = 0  # Tokens the step processes (all chips).
  optimal_seconds: float | None = None  # XLA's TPU cost model, loops multiplied; GPU: None.
  loop_factors: dict[str, float] = dataclasses.field(default_factory=dict)
  cost_source: str = "XLA cost analysis"  # Or "HLO count" (GPU: no cost analysis).
  # Where hbm_bytes_accessed and optimal_seconds come from: cost_source, or (a scanned
  # model) the step unrolled at two small depths, extrapolated (depth.py).
  bytes_source: str = ""
  depth_compile_seconds: float = 0.0  # The unrolled compiles bytes_source needed.
  kernels: dict[str, int] = dataclasses.field(default_factory=dict)  # Kind -> launches.
  # cuDNN attention's workspace, which XLA sizes only on a GPU (hlo.py's estimate; 0
  # where XLA sized it or there is no cuDNN call).
  workspace_bytes: int = 0
  # Every kernel the step launches (hlo.launches: loops multiplied out), for the
  # kernel-by-kernel estimate and its parts (kernels.py); None where no HLO was read.
  launches: list | None = dataclasses.field(default=None, repr=False)

  @property
  def total_bytes(self) -> int:
    """Peak footprint: arguments + outputs not aliased to them + temporaries + code, and
    the cuDNN workspace XLA could not size here."""
    return (self.arguments_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes + self.workspace_bytes)


def target_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` as a run on TPUs resolves it: dtype "auto" is bfloat16 there.

  Raises:
    ConfigError: on an invalid config, or model.vocab_size=0 (the tokenizer's size,
      and this mode builds no tokenizer).
  """
  config = copy.deepcopy(config)
  validate(config)
  if config.model.vocab_size == 0:
    raise ConfigError("config.model.vocab_size=0 means the tokenizer's size, and "
                      "--mode=compile builds no tokenizer: pass the size, e.g. "
                      "--config.model.vocab_size=32768")
  for key in ("dtype", "param_dtype"):
    if config.model[key] == "auto":  # resolve_dtype would see this CPU host.
      config.model[key] = "bfloat16"
  return config


def abstract_batch(config: ml_collections.ConfigDict, objective: objective_lib.Objective,
                   batch_sharding: Any) -> dict[str, jax.ShapeDtypeStruct]:
  """The global training batch as the input pipeline yields it, without data."""
  rows, length = config.data.batch_size, config.data.seq_len
  shapes = {k: (v.shape, v.dtype) for k, v in
            objectives.init_batch(objective, rows, length).items()}
  # A classifier scores one label per row; the others one target per token.
  scored = (rows,) if objective.classifies else (rows, length)
  shapes.update({objective.target: (scored, np.int32), "weights": (scored, np.float32)})
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
          for k, (shape, dtype) in shapes.items()}


# XLA's TPU compiler refuses a program whose temporaries exceed the chip's HBM.
_HBM_OOM = re.compile(r"HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)")


def _out_of_memory(name: str, error: Exception, start: float, arguments_bytes: int,
                   **extra) -> StepCost:
  """The StepCost of a step XLA would not compile for lack of HBM (CompileTimeHbmOom).

  Its temporaries are the figure XLA's message gives (in GiB), its arguments the count
  of the abstract shardings; nothing else is known, so FLOPs and bytes accessed are 0.
  """
  message = str(error).splitlines()[0]
  match = _HBM_OOM.search(str(error))
  temps = int(float(match.group(1)) * 2 ** 30) if match else 0
  return StepCost(name=name, arguments_bytes=arguments_bytes, temp_bytes=temps,
                  output_bytes=0, alias_bytes=0, code_bytes=0, xla_flops=0.0,
                  hbm_bytes_accessed=0.0, collective_bytes={},
                  compile_seconds=time.perf_counter() - start,
                  collective_error=f"not compiled: {message}", compile_error=message,
                  **extra)


_NO_TRITON_TILES = "Couldn't find output tile sizes"


def rejected(name: str, error: Exception) -> ConfigError:
  """XLA's refusal of a step as the one line the user reads, naming what to change.

  A fused-attention kernel that rejects the dtype, head size or mask (cuDNN's, or a
  target without it) is the usual case: model.attention_impl names the alternatives.
  """
  first = next((line for line in str(error).splitlines() if line.strip()), str(error))
  hint = ("set model.attention_impl='xla' (XLA's own attention), or install cuDNN "
          "(pip install nvidia-cudnn-cu12) if it is missing"
          if re.search(r"cudnn|fmha|dot_product_attention|flash", str(error), re.I)
          else "the config compiles for TPUs and CPUs; report the line above with the config")
  what = name if name.endswith("init") else f"the {name} step"
  return ConfigError(f"jax/XLA rejected {what} for this target: {first[:300]}; {hint}")


@contextlib.contextmanager
def cache_writes_for(devices: Any) -> Iterator[None]:
  """JAX's persistent compilation cache kept from programs for `devices` it cannot load.

  A program compiled for devices this process does not have (a TPU or GPU topology on
  a CPU host) is serialised into JAX_COMPILATION_CACHE_DIR like any other, but loading
  it needs a client for those devices: jax 0.10.2's next read of the entry fails
  ("PjRtCompiler must be constructed with a Client to call
  DeserializeLoadedExecutable"), warns and compiles again, on every rerun. Within this
  context such programs are not written (JAX's own threshold, a minimum compile time,
  set out of reach and restored after); programs for this process's devices are
  cached as before. `devices`: the mesh's devices (an array or a sequence).
  """
  local = set(jax.devices())
  if all(device in local for device in np.asarray(devices).flat):
    yield
    return
  # A process-wide setting: a compile on another thread meanwhile is not written either,
  # which costs that program a compile on the next run, nothing more.
  key = "jax_persistent_cache_min_compile_time_secs"
  before = getattr(jax.config, key)
  jax.config.update(key, float("inf"))
  try:
    yield
  finally:
    jax.config.update(key, before)


def _collect(name: str, lowered, start: float, devices: np.ndarray,
             arguments_bytes: int = 0, **extra) -> StepCost:
  """Compiles `lowered` for `devices` (the mesh's) and reads XLA's memory and cost
  analyses of the result."""
  platform = devices.flat[0].platform  # "gpu", "tpu" or "cpu".
  with tempfile.TemporaryDirectory() as dump:
    try:
      # XLA writes the optimised HLO as text itself: `compiled.as_text()` rebuilds it
      # from a proto, which libtpu 0.0.52 refuses for some steps (RET_CHECK ... "async-
      # update instruction should have 1 operands but sees 3": gpt_small on v5p and
      # v6e, the 7B on v5p), and the collective count would be lost.
      options = {"xla_dump_to": dump, "xla_dump_hlo_as_text": True}
      if platform == "gpu":  # The flags a run on that GPU gets (accelerator.py).
        options.update(accelerator.gpu_compiler_options())
      compiling = time.perf_counter()
      try:
        with (gpu.plugin_noise_filtered(), cache_writes_for(devices),
              progress.stage(f"compile: XLA compiling the {name} step")):
          compiled = lowered.compile(compiler_options=options)
      except jax.errors.JaxRuntimeError as e:
        if _NO_TRITON_TILES not in str(e):
          raise
        # Without a device XLA's GPU compiler cannot autotune, and Triton's default
        # tiles fail for some matmul shapes (the decode's [rows x beams x prompt, d]
        # projections); a run would autotune to another kernel. cuBLAS's, as here,
        # is always among the candidates.
        with cache_writes_for(devices):
          compiled = lowered.compile(compiler_options=dict(
              options, xla_gpu_enable_triton_gemm=False))
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise rejected(name, e) from e
      progress.say(f"compile: XLA compiling the {name} step: out of memory after "
                   f"{progress.seconds_text(time.perf_counter() - compiling)}")
      return _out_of_memory(name, e, start, arguments_bytes, **extra)
    seconds = time.perf_counter() - start
    # TPU and CPU name it <module>.after_optimizations.txt, the GPU compiler
    # <module>.sm_9.0a_gpu_after_optimizations.txt.
    dumped = sorted(glob.glob(os.path.join(dump, "*after_optimizations.txt")))
    hlo_text = None
    if len(dumped) == 1:
      with open(dumped[0], encoding="utf-8") as f:
        hlo_text = f.read()
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # Older JAX: one per program.
  collective_bytes, collective_error, counts, found = {}, None, None, None
  try:
    found, counts = _counts(hlo_text or compiled.as_text())
    collective_bytes = collectives.from_counts(counts[0])
  except jax.errors.JaxRuntimeError as e:
    # No dump and the proto route failed (above): the step compiled; only the
    # collective count is missing, and the report says so instead of pricing the
    # network at zero silently.
    collective_error = str(e).splitlines()[0]
  flops, nbytes, optimal, factors = _loop_corrected(cost, counts)
  return StepCost(
      name=name, arguments_bytes=int(memory.argument_size_in_bytes),
      temp_bytes=int(memory.temp_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
      alias_bytes=int(memory.alias_size_in_bytes),
      code_bytes=int(memory.generated_code_size_in_bytes),
      xla_flops=flops, hbm_bytes_accessed=nbytes, optimal_seconds=optimal,
      loop_factors=factors, cost_source="XLA cost analysis" if cost else "HLO count",
      bytes_source="XLA cost analysis" if cost else "HLO count",
      kernels=dict(counts[0].kernels) if counts else {},
      workspace_bytes=counts[0].cudnn_workspace if counts else 0, launches=found,
      collective_bytes=collective_bytes, collective_error=collective_error,
      compile_seconds=seconds, **extra)


def _counts(hlo_text: str) -> tuple[list[hlo.Launch], tuple[hlo.Counts, hlo.Counts]]:
  """The program's kernels (hlo.launches) and hlo.py's counts of it, loops multiplied
  out and loops counted once."""
  found, loops, unknown = hlo.launches(hlo_text)
  return found, (hlo.totals(found, loops, unknown), hlo.count(hlo_text, multiply_loops=False))


def _loop_corrected(cost: dict | None, counts: tuple[hlo.Counts, hlo.Counts] | None
                    ) -> tuple[float, float, float | None, dict[str, float]]:
  """FLOPs, HBM bytes and XLA's optimal_seconds of one step with every loop trip counted.

  XLA's TPU cost analysis counts a while loop's body once (a scanned stack of N layers
  as one layer), and its totals cannot be split by loop. hlo.py counts the same
  program both ways; XLA's totals are scaled by the ratio (its own per-kernel figures
  kept, the loops' share multiplied out), and optimal_seconds by the ratio of compute
  + HBM time, which is what it tracks where nothing is looped. Where XLA gives no cost
  analysis (the GPU compiler without a device), hlo.py's own counts stand.
  """
  if counts is None:
    cost = cost or {}
    optimal = cost.get("optimal_seconds")
    return (float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
            optimal if optimal is not None and optimal > 0 else None, {})
  full, once = counts
  if not cost:
    return full.flops, full.bytes_accessed, None, {}
  ratio = lambda a, b: a / b if b else 1.0
  # XLA's figure of the program with each loop body once, plus hlo.py's count of the
  # trips it left out: exact where the two agree on a body (dots dominate a layer),
  # and XLA's own elementwise and outside-the-loop work kept as XLA counts it; plus
  # the first trip of the kernels XLA cannot see at all (fused attention, hlo.py).
  flops = float(cost.get("flops", 0.0)) + full.flops - once.flops + once.opaque_flops
  nbytes = float(cost.get("bytes accessed", 0.0)) + full.bytes_accessed - once.bytes_accessed
  factors = {"flops": ratio(flops, float(cost.get("flops", 0.0))),
             "bytes": ratio(nbytes, float(cost.get("bytes accessed", 0.0)))}
  optimal = cost.get("optimal_seconds")
  if optimal is not None and optimal <= 0:
    optimal = None  # XLA's "no figure" (negative where its model has no answer).
  if optimal is not None:
    # Weights per unit of work: a TPU chip's ~200 FLOP per HBM byte, so that the factor
    # of the larger time dominates, as in compute + HBM time.
    balance = 200.0
    factors["optimal_seconds"] = ratio(full.flops + balance * full.bytes_accessed,
                                       once.flops + balance * once.bytes_accessed)
    optimal = float(optimal) * factors["optimal_seconds"]
  return flops, nbytes, optimal, factors


def compile_train(trainer: trainer_lib.Trainer) -> StepCost:
  """The train step on the abstract state and batch."""
  config, chips = trainer.config, trainer.mesh.size
  objective = objective_lib.resolve(config.model)
  batch = abstract_batch(config, objective, trainer.batch_sharding)
  start = time.perf_counter()
  with trainer.context(), progress.stage("compile: lowering the train step"):
    lowered = trainer.train_step.lower(trainer.abstract_state, batch)
  step_flops = flops.train_flops_per_step(trainer.model_config, config.data.batch_size,
                                          config.data.seq_len)
  return _collect("train", lowered, start, trainer.mesh.devices,
                  model_flops=step_flops / chips,
                  arguments_bytes=sum(argument_breakdown(trainer).values()),
                  tokens=objective.sides * config.data.batch_size * config.data.seq_len)


def compile_eval(trainer: trainer_lib.Trainer) -> StepCost:
  """The eval step (a deterministic forward) on abstract params and one batch."""
  config, chips = trainer.config, trainer.mesh.size
  objective = objective_lib.resolve(config.model)
  batch = abstract_batch(config, objective, trainer.batch_sharding)
  start = time.perf_counter()
  with trainer.context(), progress.stage("compile: lowering the eval step"):
    lowered = trainer.eval_step.lower(trainer.abstract_state.params, batch)
  forward = config.data.batch_size * flops.forward_flops_per_sequence(
      trainer.model_config, config.data.seq_len)
  return _collect("eval", lowered, start, trainer.mesh.devices,
                  model_flops=forward / chips,
                  tokens=objective.sides * config.data.batch_size * config.data.seq_len)


def decodes(config: ml_collections.ConfigDict) -> bool:
  """Whether the model has a cached decoding step: a decoder LM or an encoder-decoder."""
  return objective_lib.resolve(config.model).decodes


def compile_decode(trainer: trainer_lib.Trainer) -> StepCost:
  """The whole cached decode (prefill or encode, then the search loop) at decode.*.

  Rows: decode.batch_size; beam search keeps beam_size hypotheses per row in the
  cache. A decoder's prompt is the longest that leaves decode.max_new_tokens of
  model.max_len; an encoder-decoder's source is the context the commands use. Inputs
  are host arrays, as the translate/generate commands pass them.
  """
  config, model_config = trainer.config, trainer.model_config
  options = text.search_options(config.decode, rng=None)
  sampling = options.get("temperature", 0.0) > 0
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32) if sampling else None
  search = dict(beam_size=options.get("beam_size"), alpha=options.get("alpha", 0.6),
                temperature=options.get("temperature", 0.0), top_k=options.get("top_k", 0),
                top_p=options.get("top_p", 1.0))
  rows = config.decode.batch_size
  params = trainer.abstract_state.params
  ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  start = time.perf_counter()
  with trainer.context(), progress.stage("compile: lowering the decode step"):
    if objective_lib.resolve(model_config).generates:  # Else it translates.
      steps = min(config.decode.max_new_tokens, model_config.max_len - 1)
      width = model_config.max_len - steps + 1
      lowered = decoding._generate.lower(  # pylint: disable=protected-access
          model_config, params, ints(rows, width), ints(rows), rng, num_steps=steps,
          **search)
      tokens = rows * (width + steps)
    else:
      width = text.source_context(config)
      steps = min(width + config.decode.max_length_offset, model_config.max_len)
      lowered = decoding._generate_seq2seq.lower(  # pylint: disable=protected-access
          model_config, params, ints(rows, width), ints(rows, width), ints(rows), rng,
          num_steps=steps, **search)
      tokens = rows * (width + steps)
  return _collect("decode", lowered, start, trainer.mesh.devices, tokens=tokens)


def build_trainer(config: ml_collections.ConfigDict, mesh) -> trainer_lib.Trainer:
  """Trainer.create on `mesh` (no device is touched), after the mode's input checks.

  Raises:
    ConfigError: the batch does not split over the mesh, or a weight does not.
  """
  trainer_lib.batch_share(config, mesh)
  with gpu.target_capability(mesh):  # init traces the attention for the target GPU.
    return trainer_lib.Trainer.create(config, mesh)  # Checks that the weights divide first.


def compile_steps(trainer: trainer_lib.Trainer, steps: tuple[str, ...] = STEPS) -> dict[str, StepCost]:
  """The requested steps of `STEPS` (decode only where the model decodes), compiled."""
  unknown = set(steps) - set(STEPS)
  if unknown:
    raise ConfigError(f"--compile_steps has {sorted(unknown)}; valid: {list(STEPS)}")
  compilers = {"train": compile_train, "eval": compile_eval, "decode": compile_decode}
  costs = {}
  for name in steps:
    if name == "decode" and not decodes(trainer.config):
      continue
    try:
      with gpu.target_capability(trainer.mesh):
        costs[name] = compilers[name](trainer)
    except (RuntimeError, NotImplementedError) as e:
      # Raised while lowering: a kernel the target cannot build (cuDNN's attention
      # without cuDNN, say). ConfigError is not a RuntimeError and passes through.
      raise rejected(name, e) from e
  return costs


def argument_breakdown(trainer: trainer_lib.Trainer) -> dict[str, int]:
  """Per-chip bytes of the train step's arguments by part, from the abstract shardings.

  The hand count the compiled arguments_bytes is checked against: each leaf's shard
  shape times its item size.
  """
  def per_chip(tree) -> int:
    return sum(int(np.prod(x.sharding.shard_shape(x.shape), dtype=np.int64))
               * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))

  config = trainer.config
  objective = objective_lib.resolve(config.model)
  state = trainer.abstract_state
  return dict(params=per_chip(state.params), optimizer=per_chip(state.opt_state),
              step_and_rng=per_chip((state.step, state.rng)),
              batch=per_chip(abstract_batch(config, objective, trainer.batch_sharding)))
