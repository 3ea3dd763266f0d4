"""Compiles a run's train, eval and decode steps for a mesh of abstract devices.

Nothing is materialised: the state is `Trainer.abstract_state` (shapes, dtypes and
shardings from `jax.eval_shape`), the batch is `jax.ShapeDtypeStruct`s in the batch
sharding, so a 7B-parameter step compiles on a laptop. What comes back per step is
XLA's own account of the compiled program: `memory_analysis()` (bytes per chip),
`cost_analysis()` (FLOPs and HBM bytes per chip) and the collectives of its HLO text
(`collectives.py`).
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import os
import re
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer.configuration import ConfigError, objective_of, validate
from transformer.inference import decoding
from transformer.inference import text
from transformer.model import objectives
from transformer.training import flops
from transformer.training import trainer as trainer_lib
from transformer.planning import collectives

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
  xla_flops: float  # XLA's count for the compiled program (remat and all).
  hbm_bytes_accessed: float
  collective_bytes: dict[str, int]  # Kind -> bytes a chip moves per step ({} if unknown).
  compile_seconds: float
  collective_error: str | None = None  # Why collective_bytes is unknown, if it is.
  compile_error: str | None = None  # XLA refused to compile it (out of HBM): the message.
  model_flops: float | None = None  # flops.py's count per chip (None for decode).
  tokens: int = 0  # Tokens the step processes (all chips).

  @property
  def total_bytes(self) -> int:
    """Peak footprint: arguments + outputs not aliased to them + temporaries + code."""
    return (self.arguments_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes)


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


def abstract_batch(config: ml_collections.ConfigDict, objective: str,
                   batch_sharding: Any) -> dict[str, jax.ShapeDtypeStruct]:
  """The global training batch as the input pipeline yields it, without data."""
  rows, length = config.data.batch_size, config.data.seq_len
  shapes = {k: (v.shape, v.dtype) for k, v in
            objectives.init_batch(objective, rows, length).items()}
  if objective == "classification":
    shapes.update(label=((rows,), np.int32), weights=((rows,), np.float32))
  else:
    shapes.update(targets=((rows, length), np.int32), weights=((rows, length), np.float32))
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


def _collect(name: str, lowered, start: float, arguments_bytes: int = 0,
             **extra) -> StepCost:
  """Compiles `lowered` and reads XLA's memory and cost analyses of the result."""
  with tempfile.TemporaryDirectory() as dump:
    try:
      # XLA writes the optimised HLO as text itself: `compiled.as_text()` rebuilds it
      # from a proto, which libtpu 0.0.52 refuses for some steps (RET_CHECK ... "async-
      # update instruction should have 1 operands but sees 3": gpt_small on v5p and
      # v6e, the 7B on v5p), and the collective count would be lost.
      compiled = lowered.compile(compiler_options={"xla_dump_to": dump,
                                                   "xla_dump_hlo_as_text": True})
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      return _out_of_memory(name, e, start, arguments_bytes, **extra)
    seconds = time.perf_counter() - start
    dumped = sorted(glob.glob(os.path.join(dump, "*.after_optimizations.txt")))
    hlo_text = None
    if len(dumped) == 1:
      with open(dumped[0], encoding="utf-8") as f:
        hlo_text = f.read()
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # Older JAX: one per program.
  collective_bytes, collective_error = {}, None
  try:
    collective_bytes = collectives.collective_bytes(hlo_text or compiled.as_text())
  except jax.errors.JaxRuntimeError as e:
    # No dump and the proto route failed (above): the step compiled; only the
    # collective count is missing, and the report says so instead of pricing the
    # network at zero silently.
    collective_error = str(e).splitlines()[0]
  return StepCost(
      name=name, arguments_bytes=int(memory.argument_size_in_bytes),
      temp_bytes=int(memory.temp_size_in_bytes), output_bytes=int(memory.output_size_in_bytes),
      alias_bytes=int(memory.alias_size_in_bytes),
      code_bytes=int(memory.generated_code_size_in_bytes),
      xla_flops=float(cost.get("flops", 0.0)),
      hbm_bytes_accessed=float(cost.get("bytes accessed", 0.0)),
      collective_bytes=collective_bytes, collective_error=collective_error,
      compile_seconds=seconds, **extra)


def compile_train(trainer: trainer_lib.Trainer) -> StepCost:
  """The train step on the abstract state and batch."""
  config, chips = trainer.config, trainer.mesh.size
  objective = objective_of(config.model.arch, config.model.head)
  batch = abstract_batch(config, objective, trainer.batch_sharding)
  start = time.perf_counter()
  with trainer.context():
    lowered = trainer.train_step.lower(trainer.abstract_state, batch)
  step_flops = flops.train_flops_per_step(trainer.model_config, config.data.batch_size,
                                          config.data.seq_len)
  sides = 2 if objective == "seq2seq" else 1
  return _collect("train", lowered, start, model_flops=step_flops / chips,
                  arguments_bytes=sum(argument_breakdown(trainer).values()),
                  tokens=sides * config.data.batch_size * config.data.seq_len)


def compile_eval(trainer: trainer_lib.Trainer) -> StepCost:
  """The eval step (a deterministic forward) on abstract params and one batch."""
  config, chips = trainer.config, trainer.mesh.size
  objective = objective_of(config.model.arch, config.model.head)
  batch = abstract_batch(config, objective, trainer.batch_sharding)
  start = time.perf_counter()
  with trainer.context():
    lowered = trainer.eval_step.lower(trainer.abstract_state.params, batch)
  forward = config.data.batch_size * flops.forward_flops_per_sequence(
      trainer.model_config, config.data.seq_len)
  sides = 2 if objective == "seq2seq" else 1
  return _collect("eval", lowered, start, model_flops=forward / chips,
                  tokens=sides * config.data.batch_size * config.data.seq_len)


def decodes(config: ml_collections.ConfigDict) -> bool:
  """Whether the model has a cached decoding step: a decoder LM or an encoder-decoder."""
  return ((config.model.arch == "decoder" and config.model.head == "lm")
          or config.model.arch == "encoder_decoder")


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
  with trainer.context():
    if model_config.arch == "decoder":
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
  return _collect("decode", lowered, start, tokens=tokens)


def build_trainer(config: ml_collections.ConfigDict, mesh) -> trainer_lib.Trainer:
  """Trainer.create on `mesh` (no device is touched), after the mode's input checks.

  Raises:
    ConfigError: the batch does not split over the mesh, or a weight does not.
  """
  trainer_lib.check_batch_size(config, mesh)
  return trainer_lib.Trainer.create(config, mesh)  # Checks that the weights divide first.


def compile_steps(trainer: trainer_lib.Trainer, steps: tuple[str, ...] = STEPS) -> dict[str, StepCost]:
  """The requested steps of `STEPS` (decode only where the model decodes), compiled."""
  unknown = set(steps) - set(STEPS)
  if unknown:
    raise ConfigError(f"--compile_steps has {sorted(unknown)}; valid: {list(STEPS)}")
  compilers = {"train": compile_train, "eval": compile_eval, "decode": compile_decode}
  return {name: compilers[name](trainer) for name in steps
          if name != "decode" or decodes(trainer.config)}


def argument_breakdown(trainer: trainer_lib.Trainer) -> dict[str, int]:
  """Per-chip bytes of the train step's arguments by part, from the abstract shardings.

  The hand count the compiled arguments_bytes is checked against: each leaf's shard
  shape times its item size.
  """
  def per_chip(tree) -> int:
    return sum(int(np.prod(x.sharding.shard_shape(x.shape), dtype=np.int64))
               * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))

  config = trainer.config
  objective = objective_of(config.model.arch, config.model.head)
  state = trainer.abstract_state
  return dict(params=per_chip(state.params), optimizer=per_chip(state.opt_state),
              step_and_rng=per_chip((state.step, state.rng)),
              batch=per_chip(abstract_batch(config, objective, trainer.batch_sharding)))
