"""The training loop: sharded init, jitted train/eval steps, checkpoints and resume.

Resume order (one place): build the abstract sharded state -> if a checkpoint
exists, restore the state into those shardings and move the data iterator to the
saved position -> continue with range(state.step, num_steps). A checkpoint saved
after step s holds the post-update state with state.step == s.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import math
import os
import signal
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import linen as nn
from jax.experimental import multihost_utils

from transformer import checkpointing
from transformer import evaluation
from transformer import files
from transformer import flops
from transformer import metrics as metrics_lib
from transformer import optim
from transformer import plots
from transformer import run_record
from transformer import sharding
from transformer import objectives
from transformer.configuration import (ConfigError, DataError, ModelConfig, objective_of,
                                        validate)
from transformer.data import packing
from transformer.data import pipeline
from transformer.data import sources
from transformer.models import make_model


@flax.struct.dataclass
class TrainState:
  """Everything a step reads and writes; a pytree that Orbax saves as is."""

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # Base dropout key; each step folds its step number in.


def train_step(state: TrainState, batch: dict[str, jax.Array], *, forward: Callable,
               tx: optax.GradientTransformation, schedule: optax.Schedule,
               label_smoothing: float, microbatches: int = 1,
               skip_nonfinite: bool = False,
               z_loss: float = 0.0) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update; returns the new state and metric sums for this batch.

  With `microbatches` = k > 1 the batch is processed as k sequential slices whose
  gradients are summed (gradient accumulation), which equals one step on the whole
  batch: the loss is normalised by the token count of the whole batch either way.

  With `skip_nonfinite` an update whose loss or gradients are not finite is not
  applied: params and optimizer state stay as they were, the step still advances,
  the step's loss sums are zeroed and `skipped_updates` is 1.

  `z_loss` > 0 adds PaLM's z-loss to the objective (metrics.loss_sums), logged as `z_loss`.
  """
  rng = jax.random.fold_in(state.rng, state.step)

  def sums_and_grads(micro: dict[str, jax.Array], micro_rng: jax.Array):
    def objective(params):
      logits, targets, weights = forward(params, micro, rngs={"dropout": micro_rng})
      sums = metrics_lib.loss_sums(logits, targets, weights, label_smoothing, z_loss)
      return sums["objective_sum"], sums

    (_, sums), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    return sums, grads

  if microbatches == 1:
    sums, grad_sums = sums_and_grads(batch, rng)
  else:
    # Row r goes to micro-batch r % k, so every device holds a slice of each micro-batch.
    def split(x):
      x = x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])
      return jnp.moveaxis(x, 1, 0)

    micro_batches = jax.tree.map(split, batch)

    def accumulate(carry, xs):
      index, micro = xs
      out = sums_and_grads(micro, jax.random.fold_in(rng, index))
      return jax.tree.map(jnp.add, carry, out), None

    first = jax.tree.map(lambda x: x[0], micro_batches)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                         jax.eval_shape(sums_and_grads, first, rng))
    (sums, grad_sums), _ = jax.lax.scan(
        accumulate, zeros, (jnp.arange(microbatches), micro_batches))

  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["weight_sum"], 1.0), grad_sums)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  grad_norm, update_norm = optax.tree.norm(grads), optax.tree.norm(updates)
  if skip_nonfinite:
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(sums["loss_sum"])
    if_finite = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    params = if_finite(params, state.params)
    opt_state = if_finite(opt_state, state.opt_state)
    update_norm = jnp.where(finite, update_norm, 0.0)
    sums = {k: jnp.where(finite, v, jnp.zeros_like(v)) for k, v in sums.items()}
    sums["skipped_updates"] = 1.0 - finite.astype(jnp.float32)
  sums.update(
      learning_rate=schedule(state.step),
      grad_norm=grad_norm,
      param_norm=optax.tree.norm(params),
      update_norm=update_norm)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, sums


def eval_step(params: Any, batch: dict[str, jax.Array], *,
              forward: Callable) -> dict[str, jax.Array]:
  """Metric sums of one evaluation batch (the forward of a deterministic model)."""
  sums = metrics_lib.loss_sums(*forward(params, batch))
  del sums["objective_sum"]
  return sums


def make_init_fn(model: nn.Module, tx: optax.GradientTransformation, seq_len: int,
                 objective: str = "causal_lm") -> Callable[[jax.Array], TrainState]:
  """init(rng) -> TrainState whose params carry logical-axis metadata (boxed)."""

  def init(rng: jax.Array) -> TrainState:
    params_rng, dropout_rng = jax.random.split(rng)
    batch = objectives.init_batch(objective, 1, seq_len)
    params = model.init({"params": params_rng},
                        *objectives.model_inputs(objective, batch))["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=dropout_rng)

  return init


@dataclasses.dataclass
class Trainer:
  """The compiled pieces of a run, built once from the config and the mesh."""

  config: ml_collections.ConfigDict
  mesh: jax.sharding.Mesh
  rules: tuple
  model_config: ModelConfig
  state_shardings: Any
  abstract_state: Any
  init: Callable
  train_step: Callable
  eval_step: Callable
  batch_sharding: jax.sharding.NamedSharding

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> "Trainer":
    """Builds the model, optimizer and the jitted, explicitly sharded functions."""
    rules = sharding.rules_of(config.mesh)
    model_config = ModelConfig.from_config(config.model)
    model = make_model(model_config)
    eval_model = make_model(dataclasses.replace(model_config, deterministic=True))
    objective = objective_of(model_config.arch, model_config.head)
    schedule = optim.make_schedule(config.optimizer, model_config.d_model,
                                   config.train.num_steps)
    tx = optim.make_optimizer(config.optimizer, schedule)
    init = make_init_fn(model, tx, config.data.seq_len, objective)

    # Sharded from the first byte: shapes -> logical specs -> mesh shardings -> jit(init).
    boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
    logical_specs = nn.get_partition_spec(boxed)
    state_shardings = sharding.logical_to_shardings(logical_specs, mesh, rules)
    abstract_state = checkpointing.abstract_like(nn.meta.unbox(boxed), state_shardings)
    batch_sharding = sharding.batch_sharding(mesh, rules)
    replicated = sharding.replicated(mesh)
    if jax.process_index() == 0:
      sharding.log_sharding_report(boxed.params, state_shardings.params,
                                   abstract_state.opt_state, state_shardings.opt_state, mesh)

    jit_init = jax.jit(lambda rng: nn.meta.unbox(init(rng)), out_shardings=state_shardings)
    jit_train = jax.jit(
        functools.partial(train_step, forward=objectives.make_forward(model, objective),
                          tx=tx, schedule=schedule,
                          label_smoothing=config.optimizer.label_smoothing,
                          microbatches=config.train.microbatches,
                          skip_nonfinite=config.optimizer.skip_nonfinite > 0,
                          z_loss=config.optimizer.z_loss),
        in_shardings=(state_shardings, batch_sharding),
        out_shardings=(state_shardings, replicated), donate_argnums=(0,))
    jit_eval = jax.jit(functools.partial(
        eval_step, forward=objectives.make_forward(eval_model, objective)),
                       in_shardings=(state_shardings.params, batch_sharding),
                       out_shardings=replicated)
    return cls(config=config, mesh=mesh, rules=rules, model_config=model_config,
               state_shardings=state_shardings, abstract_state=abstract_state,
               init=jit_init, train_step=jit_train, eval_step=jit_eval,
               batch_sharding=batch_sharding)

  @contextlib.contextmanager
  def context(self):
    """Mesh + logical rules in scope, needed while tracing the activation constraints."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def global_batch(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Assembles the global batch from this process's rows."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in local_batch.items()}


class _StopRequest:
  """Turns SIGINT/SIGTERM into a flag, so the loop stops after a complete step and saves."""

  def __init__(self):
    self.requested = False
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGINT, signal.SIGTERM):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # Not the main thread (e.g. inside some test runners).
        pass
    return self

  def should_stop(self, step: int, every: int) -> bool:
    """Whether to stop after `step`; with several processes, decided together.

    Processes may get the signal at different steps; they compare flags every
    `every` steps (a small all-gather) so that all of them save and stop at the same
    step, as a multi-host checkpoint requires.
    """
    if jax.process_count() == 1:
      return self.requested
    if step % every:
      return False
    flags = multihost_utils.process_allgather(np.asarray(self.requested))
    return bool(np.any(flags))

  def _handle(self, signum, frame):
    del frame
    if self.requested:  # A second Ctrl-C: stop at once.
      raise KeyboardInterrupt
    logging.warning("Signal %d: stopping after this step and saving a checkpoint "
                    "(again to abort without saving).", signum)
    self.requested = True

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class _KillAt:
  """Test-only crash injection: TRANSFORMER_TEST_KILL_AT="<point>:<step>", read once per run.

  The process SIGKILLs itself (no cleanup, no flush: as a power cut or an OOM kill) at
  `point` of step `step`: after_step (the step's iteration is over), during_eval
  (evaluated, not yet written), during_save (after manager.save returned, the async
  write still in flight), after_save (the write finished). Tests rerun the command
  and check that the run recovers exactly. Unset, a call is one comparison.
  """

  POINTS = ("after_step", "during_eval", "during_save", "after_save")
  VARIABLE = "TRANSFORMER_TEST_KILL_AT"

  def __init__(self, value: str):
    self.point, self.step = None, None
    if not value:
      return
    point, _, step = value.partition(":")
    if point not in self.POINTS or not step.isdigit():
      raise ValueError(f"{self.VARIABLE}={value!r} is invalid: expected <point>:<step> with "
                       f"point one of {self.POINTS}, e.g. 'after_step:5'")
    self.point, self.step = point, int(step)

  @classmethod
  def from_env(cls) -> "_KillAt":
    return cls(os.environ.get(cls.VARIABLE, ""))

  def __call__(self, point: str, step: int, first: Callable[[], Any] | None = None) -> None:
    """Kills the process if (point, step) is the one asked for, after calling `first`."""
    if point != self.point or step != self.step:
      return
    if first is not None:
      first()
    logging.warning("%s: killing this process %s %d", self.VARIABLE, point, step)
    logging.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def check_batch_size(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> int:
  """Returns this process's rows per batch; the global batch must split evenly."""
  rules = sharding.rules_of(config.mesh)
  ways = sharding.data_parallel_size(mesh, rules)
  batch, micro = config.data.batch_size, config.train.microbatches
  # Each micro-batch is itself split over the data-parallel devices.
  unit = int(np.lcm(ways * micro, jax.process_count()))
  if batch % unit:
    raise ConfigError(
        f"config.data.batch_size={batch} is invalid: it must be divisible by the "
        f"{ways} data-parallel shards of mesh {dict(mesh.shape)} times "
        f"config.train.microbatches={micro}, and by {jax.process_count()} processes; "
        f"e.g. {unit}")
  return batch // jax.process_count()


def evaluate(trainer: Trainer, params: Any, dataset, local_batch_size: int) -> dict[str, float]:
  """Runs the eval split (or its first `train.eval_batches` batches); returns eval_* metrics."""
  total = None
  batches = packing.iterate_eval(dataset, local_batch_size, trainer.config.train.eval_batches)
  template = None  # An all-padding batch for a process whose eval shard ran out first.
  while True:
    local_batch = next(batches, None)
    if jax.process_count() > 1:
      # Shards of the eval split differ in length; every process must run the same
      # number of (collective) eval steps, so they agree on when to stop.
      more = multihost_utils.process_allgather(np.asarray(local_batch is not None))
      if not np.any(more):
        break
      if local_batch is None:
        if template is None:
          raise ValueError(f"process {jax.process_index()} got no eval batch from "
                           f"config.data.eval_split={trainer.config.data.eval_split!r}; "
                           "the split is smaller than the number of processes")
        local_batch = template
      elif template is None:
        template = jax.tree.map(np.zeros_like, local_batch)  # Weights 0: counts nothing.
    elif local_batch is None:
      break
    sums = trainer.eval_step(params, trainer.global_batch(local_batch))
    total = metrics_lib.add_sums(total, jax.device_get(sums))
  if total is None:
    raise DataError(f"config.data.eval_split={trainer.config.data.eval_split!r} produced no "
                    "batch to evaluate: the split is empty, or every example was dropped (the "
                    "warnings above say why)")
  return metrics_lib.summarize(total, prefix="eval_")


def _resolve_vocab_size(config: ml_collections.ConfigDict,
                        tokenizer) -> ml_collections.ConfigDict:
  """A copy of `config` with model.vocab_size=0 replaced by the tokenizer's (rounded up)."""
  vocab_size = sources.resolved_vocab_size(config, tokenizer)
  if vocab_size == config.model.vocab_size:
    return config
  logging.info("model.vocab_size=0: using %d (the tokenizer's %d rounded up to a multiple "
               "of %d)", vocab_size, tokenizer.vocab_size, sources.VOCAB_MULTIPLE)
  config = copy.deepcopy(config)  # The caller's config stays as given.
  config.model.vocab_size = vocab_size
  return config


# Keys a resumed run may change: for how long, how often to log, evaluate and save,
# decoding, and the mesh (placement only: the checkpoint is restored into the new
# mesh's shardings, and no rule changes an array's shape). Every other key shapes the
# model, the data order or the updates.
RESUME_SAFE_KEYS = ("train.num_steps", "train.log_every", "train.eval_every",
                    "train.eval_batches", "train.eval_at_start", "train.bleu_examples",
                    "train.sample_prompt", "checkpoint.every", "checkpoint.keep",
                    "checkpoint.async_save", "checkpoint.on_config_change", "data.num_threads")
RESUME_SAFE_PREFIXES = ("decode.", "mesh.")
ON_CONFIG_CHANGE = ("stop", "allow")


def _check_config_change(config: ml_collections.ConfigDict, workdir: str) -> None:
  """On resume, compares `config` (vocab_size resolved) with the run's config.json.

  Changes to RESUME_SAFE_KEYS and decode.* apply and are logged. Any other change
  stops the run with a ConfigError listing each key with its old and new value,
  unless checkpoint.on_config_change is 'allow'. A key only one side has (one added
  to configs/base.py since the run started) is logged. A workdir whose config.json
  has no checkpoint beside it is not a resume: nothing is compared.
  """
  policy = config.checkpoint.on_config_change
  if policy not in ON_CONFIG_CHANGE:
    raise ConfigError(f"config.checkpoint.on_config_change={policy!r} is invalid: valid "
                      "values are " + ", ".join(repr(p) for p in ON_CONFIG_CHANGE) + ".")
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return
  if not checkpointing.has_checkpoint(workdir):
    logging.info("%s is from a run that saved no checkpoint: not a resume, so this config "
                 "replaces it without a comparison", path)
    return
  try:
    with open(path, encoding="utf-8") as f:
      saved = run_record.flatten(json.load(f))
  except (OSError, ValueError) as e:
    logging.warning("Cannot compare the config with the unreadable %s (%s); resuming "
                    "without the check", path, e)
    return
  current = run_record.flatten(json.loads(config.to_json_best_effort()))
  # With a cosine schedule and decay_steps=0 the decay ends at num_steps: not cadence.
  cosine_length = config.optimizer.schedule == "cosine" and not config.optimizer.decay_steps
  safe, unsafe, one_sided = [], [], []
  for key in sorted(set(saved) | set(current)):
    if key not in saved or key not in current:
      one_sided.append(f"{key} ({'new' if key in current else 'no longer'} in the config)")
      continue
    if saved[key] == current[key]:
      continue
    change = f"{key}: {saved[key]!r} -> {current[key]!r}"
    if key == "train.num_steps" and cosine_length:
      unsafe.append(change + " (the cosine decay length while optimizer.decay_steps=0)")
    elif key in RESUME_SAFE_KEYS or key.startswith(RESUME_SAFE_PREFIXES):
      safe.append(change)
    else:
      unsafe.append(change)
  if one_sided:
    logging.info("Resuming: keys only one of this config and %s has: %s", path,
                 ", ".join(one_sided))
  if safe:
    logging.info("Resuming with changed settings (applied): %s", "; ".join(safe))
  if unsafe and policy == "allow":
    logging.warning("Resuming with checkpoint.on_config_change='allow' despite changes "
                    "to keys that shape the model, data or updates (applied): %s",
                    "; ".join(unsafe))
  elif unsafe:
    raise ConfigError(
        f"Resuming {workdir} with a config that differs from its config.json in "
        f"{len(unsafe)} key(s) that a resumed run cannot change:\n  " + "\n  ".join(unsafe) +
        "\nRerun with the saved values, or use a new --workdir (config.init_from takes "
        "over the parameters), or pass --config.checkpoint.on_config_change=allow to "
        "resume with the changes anyway.")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains `config` in `workdir`, resuming from its latest checkpoint if there is one.

  Args:
    config: the experiment config (configs/base.py lists every key).
    workdir: where checkpoints, metrics.jsonl, TensorBoard events and config.json go.

  Returns:
    The last training metrics merged with the last evaluation metrics.
  """
  validate(config)
  mesh = sharding.make_mesh(config.mesh)
  local_batch_size = check_batch_size(config, mesh)
  is_chief = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  logging.info("Mesh %s over %d devices (%d processes)", dict(mesh.shape),
               jax.device_count(), jax.process_count())

  tokenizer_workdir = ""
  if config.init_from:  # Fine-tuning keeps the vocabulary its parameters were trained with.
    resuming = (checkpointing.has_checkpoint(workdir)
                and os.path.exists(os.path.join(workdir, sources.TOKENIZER_RECORD)))
    tokenizer_workdir = workdir if resuming else sources.run_workdir(config.init_from)
  data_sources = sources.load_sources(config, tokenizer_workdir)
  config = _resolve_vocab_size(config, data_sources.tokenizer)
  _check_config_change(config, workdir)  # Before config.json is rewritten below.
  if is_chief:  # The resolved config and the vocabulary: later commands rebuild from them.
    files.write_atomically(os.path.join(workdir, "config.json"),
                           config.to_json_best_effort(indent=2))
    sources.save_tokenizer(workdir, data_sources.tokenizer)
  objective = objective_of(config.model.arch, config.model.head)
  logging.info("Objective: %s on %s (%s tokenizer, vocabulary %d, model.vocab_size %d)",
               objective, data_sources.builder.info.full_name,
               sources.tokenizer_kind(data_sources.tokenizer),
               data_sources.tokenizer.vocab_size, config.model.vocab_size)
  data_kwargs = dict(batch_size=local_batch_size, process_index=jax.process_index(),
                     process_count=jax.process_count())
  train_data, eval_data = (
      pipeline.make_dataset(config, objective,
                            data_sources.builder.as_data_source(split=split),
                            data_sources.tokenizer, train=train, split=split, **data_kwargs)
      for split, train in ((config.data.train_split, True), (config.data.eval_split, False)))
  train_iter = iter(train_data)
  # One batch now, then back: a pipeline that yields nothing (every example dropped)
  # fails in seconds with its DataError, not after the model has compiled.
  first_position = train_iter.get_state()
  next(train_iter)
  train_iter.set_state(first_position)

  trainer = Trainer.create(config, mesh)
  checkpointer = checkpointing.Checkpointer(workdir, config.checkpoint)
  writer = metrics_lib.MetricWriter(workdir, enabled=is_chief)

  try:
    result = _train_loop(config, workdir, trainer, checkpointer, writer, train_iter, eval_data,
                         objective, local_batch_size)
  finally:  # Also on errors: finish a pending checkpoint write and flush the metrics.
    checkpointer.close()
    writer.close()
  if is_chief:  # At the end, or stopped by a signal: <workdir>/plots/*.png.
    plots.write_plots_after_training(workdir)
  return result


def _train_loop(config, workdir, trainer, checkpointer, writer, train_iter, eval_data,
                objective, local_batch_size) -> dict[str, float]:
  """The loop of train_and_evaluate: restore or init, train, evaluate, save."""
  num_steps = config.train.num_steps
  kill_at = _KillAt.from_env()
  record = run_record.RunRecord(workdir, enabled=writer.enabled)  # Parameters, wall time.
  last_metrics: dict[str, float] = {}
  with trainer.context():
    # Unfinished, incomplete or corrupt checkpoints are moved aside, newest first.
    restored = checkpointer.restore_latest(trainer.abstract_state, train_iter)
    if restored is None and config.init_from:
      # Fine-tuning: parameters whose path the source run has take its values (read
      # into this run's shardings); the step and Adam's moments start fresh. Loading
      # first lets a shape mismatch fail before init compiles.
      loaded, _ = checkpointing.load_params(config.init_from, trainer.abstract_state.params)
      state = trainer.init(jax.random.PRNGKey(config.seed))
      state = state.replace(params=checkpointing.merge_params(state.params, loaded))
      logging.info("Starting at step 0 in %s from the parameters of config.init_from=%r",
                   workdir, config.init_from)
    elif restored is None:
      state = trainer.init(jax.random.PRNGKey(config.seed))
      if checkpointer.set_aside:
        logging.warning("Starting from scratch in %s: no usable checkpoint is left (%d "
                        "moved to %s)", workdir, len(checkpointer.set_aside),
                        checkpointer.bad_directory)
      else:
        logging.info("Starting from scratch in %s", workdir)
    else:
      # A run's own checkpoint wins: rerunning a fine-tuning command resumes it.
      latest, state = restored
      logging.info("Resumed from checkpoint %d in %s", latest, checkpointer.directory)
      if config.init_from:
        logging.info("Ignoring config.init_from=%r: resuming this run's own checkpoint",
                     config.init_from)
    start_step = int(jax.device_get(state.step))
    # One row per step: rows a stopped run wrote after this checkpoint are dropped.
    kept_rows = writer.resume(start_step if restored is not None else -1)
    guard = _NonFiniteGuard(config.optimizer.skip_nonfinite,
                            total=int(sum(row.get("skipped_updates", 0) for row in kept_rows)))
    record.update(start_step, parameters=metrics_lib.log_parameter_count(state.params))
    # Tokens the model reads per step (both sides for seq2seq).
    sides = 2 if objective == "seq2seq" else 1
    model_flops = flops.train_flops_per_step(trainer.model_config, config.data.batch_size,
                                             config.data.seq_len)
    peak, peak_source = flops.peak_flops(workdir)
    logging.info("Model FLOPs per step %.4g (flops.py); MFU is against %.4g FLOP/s, the %s",
                 model_flops, peak, peak_source)
    progress = metrics_lib.Progress(start_step, num_steps,
                                    sides * config.data.batch_size * config.data.seq_len,
                                    model_flops, peak)

    if start_step == 0 and config.train.eval_at_start:  # The baseline later evals beat.
      eval_metrics = evaluate(trainer, state.params, eval_data, local_batch_size)
      logging.info("eval at step 0: %s", _format(eval_metrics))
      writer.write(0, eval_metrics)

    pending = None  # (step, device metrics) of the previous step, fetched one step late.
    train_sums = None
    with _StopRequest() as stop:
      for step in range(start_step, num_steps):
        batch = trainer.global_batch(next(train_iter))
        state, step_metrics = trainer.train_step(state, batch)
        # Fetch step t-1's metrics while step t runs, so logging never stalls the device.
        if pending is not None:
          # The first two steps after a (re)start are always shown: the second has an ETA.
          train_sums, summary = _report(pending, train_sums, progress, writer, config,
                                        force=pending[0] - start_step <= 2, guard=guard)
          last_metrics = summary or last_metrics
        pending = (step + 1, step_metrics)
        done = step + 1
        if done % config.train.eval_every == 0 or done == num_steps:
          train_sums, summary = _report(pending, train_sums, progress, writer, config,
                                        force=done - start_step <= 2, guard=guard)
          last_metrics = summary or last_metrics
          pending = None
          eval_metrics = evaluate(trainer, state.params, eval_data, local_batch_size)
          # train.bleu_examples / train.sample_prompt: eval_bleu, logged translations, a sample.
          eval_metrics.update(evaluation.decode_at_evaluation(
              config, workdir, trainer.model_config, state.params, writer, done))
          kill_at("during_eval", done)
          logging.info("eval at step %d: %s", done, _format(eval_metrics))
          writer.write(done, eval_metrics)
          last_metrics = {**last_metrics, **eval_metrics}
          progress.restart_clock()  # Throughput and MFU are of training alone.
        stopping = stop.should_stop(done, config.train.log_every)
        if done % config.checkpoint.every == 0 or done == num_steps or stopping:
          if pending is not None:  # Checked first: a non-finite step is never saved.
            train_sums, summary = _report(pending, train_sums, progress, writer, config,
                                          force=done - start_step <= 2, guard=guard)
            last_metrics = summary or last_metrics
            pending = None
          writer.sync()  # Rows up to `done` are not rewritten after a resume from it.
          checkpointer.save(done, state, train_iter)
          record.update(done)
          kill_at("during_save", done)
          kill_at("after_save", done, first=checkpointer.wait)
        if stopping:
          logging.warning("Stopped at step %d; rerun the same command to resume.", done)
          break
        kill_at("after_step", done)
    if pending is not None:
      _, summary = _report(pending, train_sums, progress, writer, config, force=True,
                           guard=guard)
      last_metrics = {**last_metrics, **(summary or {})}
  return last_metrics


def _format(metrics: dict[str, float]) -> str:
  return " | ".join(f"{k} {v:.4g}" for k, v in metrics.items())


class _NonFiniteGuard:
  """Stops at a non-finite step; with optimizer.skip_nonfinite=N, at N skipped in a row.

  Fed every step's fetched metrics in order; the loop checks a step before it
  evaluates or saves its state, so a non-finite state never reaches a checkpoint.
  """

  def __init__(self, limit: int, total: int = 0):
    self.limit = limit  # 0: stop at the first; else skipping is on (see train_step).
    self.total = total  # Skipped updates in the whole run (restored from metrics.jsonl).
    self.streak: list[int] = []  # Steps skipped in a row, up to the latest.

  def check(self, step: int, host: dict[str, Any]) -> None:
    """Raises FloatingPointError naming the step(s) when the run must stop."""
    if float(host.get("skipped_updates", 0.0)) > 0:
      self.streak.append(step)
      self.total += 1
      logging.warning("Step %d: non-finite loss or gradients, update skipped (%d in a row "
                      "of at most optimizer.skip_nonfinite=%d; %d in the run)", step,
                      len(self.streak), self.limit, self.total)
      if len(self.streak) >= self.limit:
        raise FloatingPointError(
            f"Non-finite loss or gradients at {len(self.streak)} steps in a row (steps "
            f"{', '.join(map(str, self.streak))}), optimizer.skip_nonfinite={self.limit}: "
            "stopping. Their updates were skipped; the newest checkpoint holds finite "
            "parameters. Lower the learning rate or check the data at these steps.")
      return
    self.streak = []
    loss = float(host["loss_sum"]) / max(float(host["weight_sum"]), 1.0)
    grad_norm = float(host.get("grad_norm", 0.0))
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
      raise FloatingPointError(
          f"Non-finite training loss {loss} or gradient norm {grad_norm} at step {step}; "
          "the state after it was not saved (the newest checkpoint is from before it). "
          f"Metrics: {json.dumps({k: float(v) for k, v in host.items()})}. Lower the "
          "learning rate, or set optimizer.skip_nonfinite=N to skip such updates.")


def _report(pending, train_sums, progress, writer, config, force=False, guard=None):
  """Checks a finished step's loss and gradient norm; logs every `train.log_every` steps."""
  step, device_metrics = pending
  host = jax.device_get(device_metrics)
  guard = guard or _NonFiniteGuard(config.optimizer.skip_nonfinite)
  guard.check(step, host)
  progress.update(step)
  # Norms and the learning rate are per-step values: keep the latest, not a sum.
  per_step = {k: host.pop(k) for k in ("learning_rate", "grad_norm", "param_norm",
                                       "update_norm")}
  host.pop("objective_sum")
  train_sums = metrics_lib.add_sums(train_sums, host)
  if step % config.train.log_every and not force and step != config.train.num_steps:
    return train_sums, None
  summary = metrics_lib.summarize(train_sums)
  summary.update({k: float(v) for k, v in per_step.items()})
  summary.update(progress.rates())  # seconds_per_step, tokens_per_second, mfu.
  line = progress.line(step, summary)
  if guard.limit:
    summary["skipped_total"] = float(guard.total)
    line += f" | skipped {summary['skipped_updates']:.0f} ({guard.total} in the run)"
  logging.info("%s", line)
  writer.write(step, summary)
  return None, summary
