"""The compiled runtime of training: the state, the jitted steps, and their shardings.

`Trainer.create(config, mesh)` builds the model, the optimizer and the explicitly
sharded `init`, `train_step` (and `train_steps`, several of them in one call) and
`eval_step` once; `training/loop.py` drives them.
`Scorer` is the evaluation half alone (a model's parameters and the eval step), which
`--mode=evaluate` builds without an optimizer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Iterator

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import linen as nn
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from transformer.config import denoisers as denoisers_lib
from transformer.config import objective as objective_lib
from transformer import sharding
from transformer.config.errors import ConfigError, DataError
from transformer.config.model import ModelConfig
from transformer.data import packing
from transformer.model import attention_ops
from transformer.model import fp8
from transformer.model import objectives
from transformer.model.models import make_model
from transformer.training import metrics as metrics_lib
from transformer.training import optim
from transformer.training import prefetch
from transformer.workdir import checkpointing
from transformer.workdir import progress as progress_lib


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
               z_loss: float = 0.0,
               never_predict: tuple[int, ...] = (),
               moe_aux_loss: float = 0.0,
               moe_z_loss: float = 0.0,
               logits_chunk: int = 0,
               logits_dtype: str = "auto",
               lora: bool = False) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update; returns the new state and metric sums for this batch.

  With `microbatches` = k > 1 the batch is processed as k sequential slices whose
  gradients are summed (gradient accumulation), which equals one step on the whole
  batch: the loss is normalised by the token count of the whole batch either way.

  With `skip_nonfinite` an update whose loss or gradients are not finite is not
  applied: params and optimizer state stay as they were, the step still advances,
  the step's loss sums are zeroed and `skipped_updates` is 1. The logged
  `learning_rate` is the schedule at the optimizer's own update count (which a skipped
  update does not advance), i.e. the rate this update applied, not schedule(step).

  `z_loss` > 0 adds PaLM's z-loss to the objective (metrics.loss_sums), logged as `z_loss`.
  `never_predict` rows are left out of the softmax (see metrics.loss_sums).
  With MoE layers the objective adds `moe_aux_loss` x the load-balancing loss and
  `moe_z_loss` x the router z-loss (metrics.add_moe_sums), logged as moe_* metrics.
  `logits_chunk`: train.logits_chunk, the positions projected to the vocabulary at a time
  when `forward` returns hidden states (metrics.head_loss_sums; 0 = auto), and
  `logits_dtype` (train.logits_dtype) the dtype a chunk's logits are held in.
  With `lora` (model.lora_rank > 0) the gradients, the optimizer state and the update
  cover only optim.split_trainable's trainable half; the frozen base passes through.
  """
  rng = jax.random.fold_in(state.rng, state.step)
  trainable, frozen = optim.split_trainable(state.params, lora)
  # model.quantization="fp8": its scaling state's gradient is its next value.
  trainable, fp8_state = fp8.split_state(trainable)

  def sums_and_grads(micro: dict[str, jax.Array], micro_rng: jax.Array):
    def objective(trained_and_fp8):
      params = optim.join_trainable(optim.join_trainable(*trained_and_fp8), frozen)
      outputs, targets, weights, moe_stats = forward(params, micro,
                                                     rngs={"dropout": micro_rng})
      sums = metrics_lib.objective_sums(outputs, targets, weights, chunk=logits_chunk,
                                        logits_dtype=logits_dtype,
                                        label_smoothing=label_smoothing, z_loss=z_loss,
                                        never_predict=never_predict)
      sums = metrics_lib.add_moe_sums(sums, moe_stats, moe_aux_loss, moe_z_loss)
      return sums["objective_sum"], sums

    (_, sums), (grads, new_fp8) = jax.value_and_grad(objective, has_aux=True)(
        (trainable, fp8_state))
    return sums, grads, new_fp8

  sums, grad_sums, new_fp8 = _summed_over_microbatches(sums_and_grads, batch, rng,
                                                       microbatches)
  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["weight_sum"], 1.0), grad_sums)
  updates, opt_state = tx.update(grads, state.opt_state, trainable)
  weights = optim.join_trainable(optax.apply_updates(trainable, updates), frozen)
  params = optim.join_trainable(weights, new_fp8)
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
      learning_rate=schedule(optim.update_count(state.opt_state)),
      grad_norm=grad_norm,
      param_norm=optax.tree.norm(fp8.split_state(params)[0]),
      update_norm=update_norm)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, sums


def _summed_over_microbatches(sums_and_grads: Callable, batch: dict[str, jax.Array],
                              rng: jax.Array, microbatches: int) -> tuple[Any, Any, Any]:
  """(metric sums, gradient sums, fp8 state) of `sums_and_grads(micro, micro_rng)` over
  the whole batch: in one pass, or as `microbatches` slices scanned in sequence
  (gradient accumulation), slice i with dropout key fold_in(rng, i). The fp8 state is
  the slices' elementwise max: each slice starts from the same state, so that is its
  history with the largest amax of the batch in the newest slot and the same scales."""
  if microbatches == 1:
    return sums_and_grads(batch, rng)
  # Row r goes to micro-batch r % k, so every device holds a slice of each micro-batch.
  def split(x):
    x = x.reshape((x.shape[0] // microbatches, microbatches) + x.shape[1:])
    return jnp.moveaxis(x, 1, 0)

  micro_batches = jax.tree.map(split, batch)

  def accumulate(carry, xs):
    index, micro = xs
    sums, grads, fp8_state = sums_and_grads(micro, jax.random.fold_in(rng, index))
    return (jax.tree.map(jnp.add, carry[:2], (sums, grads))
            + (jax.tree.map(jnp.maximum, carry[2], fp8_state),)), None

  first = jax.tree.map(lambda x: x[0], micro_batches)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                       jax.eval_shape(sums_and_grads, first, rng))
  (sums, grad_sums, fp8_state), _ = jax.lax.scan(
      accumulate, zeros, (jnp.arange(microbatches), micro_batches))
  return sums, grad_sums, fp8_state


def eval_step(params: Any, batch: dict[str, jax.Array], *, forward: Callable,
              never_predict: tuple[int, ...] = (), logits_chunk: int = 0,
              logits_dtype: str = "auto", position_bucket: int = 0,
              num_buckets: int = 0, tag_names: tuple[str, ...] = ()
              ) -> dict[str, jax.Array]:
  """Metric sums of one evaluation batch (the forward of a deterministic model).

  MoE statistics are reported without the per-expert loads (training logs those).
  With `position_bucket` > 0 also the sums per bucket of that many token positions
  (batch["positions"], `num_buckets` buckets; metrics.loss_sums). With `tag_names`
  (a UL2 run's denoiser kinds, config/denoisers.tag_names) and rows that carry
  denoisers.TAG_FIELD (its denoised eval rows; pairs have none), also loss_sum/<name>
  and weight_sum/<name> per kind (metrics.name_tags).
  """
  outputs, targets, weights, moe_stats = forward(params, batch)
  tags = batch.get(denoisers_lib.TAG_FIELD) if tag_names else None
  sums = metrics_lib.objective_sums(
      outputs, targets, weights, chunk=logits_chunk, logits_dtype=logits_dtype,
      never_predict=never_predict,
      positions_BL=batch["positions"] if position_bucket else None, bucket=position_bucket,
      num_buckets=num_buckets, tags_BL=tags,
      num_tags=len(tag_names) + 1 if tags is not None else 0)
  if tags is not None:
    sums = metrics_lib.name_tags(sums, tag_names)
  sums = metrics_lib.add_moe_sums(sums, moe_stats, per_expert=False)
  del sums["objective_sum"]
  return sums


def make_init_fn(model: nn.Module, tx: optax.GradientTransformation, seq_len: int,
                 objective: objectives.ObjectiveLike = "causal_lm", lora: bool = False
                 ) -> Callable[[jax.Array], TrainState]:
  """init(rng) -> TrainState whose params carry logical-axis metadata (boxed).

  With `lora` the optimizer state covers only the trainable half of the parameters
  (optim.split_trainable): a frozen base parameter has no Adam moments.
  """

  def init(rng: jax.Array) -> TrainState:
    params_rng, dropout_rng = jax.random.split(rng)
    batch = objectives.init_batch(objective, 1, seq_len)
    params = model.init({"params": params_rng},
                        *objectives.model_inputs(objective, batch))["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(fp8.split_state(
                          optim.split_trainable(params, lora)[0])[0]),
                      rng=dropout_rng)

  return init


@dataclasses.dataclass
class Scorer:
  """The evaluation half of a run: its mesh, rules, model config and jitted eval step.

  Built alone (`Scorer.create`) from a model's parameter shardings when only scoring
  is needed (--mode=evaluate): no optimizer, no training state.
  """

  config: ml_collections.ConfigDict
  mesh: jax.sharding.Mesh
  rules: tuple
  model_config: ModelConfig
  eval_step: Callable
  batch_sharding: jax.sharding.NamedSharding
  # model.attention_max_segments where cuDNN's packed layout serves an attention on this
  # mesh (each host batch is checked against it), 1 for rows of one document, else None.
  packed_rows_limit: int | None
  # The share of each global batch this process reads (sharding.input_shard).
  input_shard: sharding.InputShard
  # What the eval step's rows may hold (config.objective.row_layout; checked per batch
  # where cuDNN serves, which skips what cannot occur).
  rows: objective_lib.RowLayout

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
             param_shardings: Any, position_bucket: int = 0) -> "Scorer":
    """The jitted eval step of `config.model` for parameters placed as `param_shardings`.

    `position_bucket` > 0 adds the loss sums per bucket of that many positions over
    data.seq_len (metrics.loss_sums; a batch with `positions`: a decoder LM).
    """
    rules = sharding.rules_of(config.mesh, mesh)
    rows = objective_lib.row_layout(objective_lib.resolve(config.model), config.data,
                                    train=False)
    model_config = with_rows(ModelConfig.from_config(config.model), rows)
    return cls(config=config, mesh=mesh, rules=rules, model_config=model_config,
               eval_step=_jit_eval_step(model_config, mesh, rules, param_shardings,
                                        config.train, position_bucket,
                                        config.data.seq_len),
               batch_sharding=sharding.batch_sharding(mesh, rules),
               packed_rows_limit=attention_ops.mesh_packed_rows_limit(model_config, mesh,
                                                                      rules),
               input_shard=sharding.input_shard(mesh, rules), rows=rows)

  @contextlib.contextmanager
  def context(self):
    """Mesh + logical rules in scope, needed while tracing the activation constraints."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def global_batch(self, local_batch: dict[str, np.ndarray], stacked: bool = False,
                   rows: objective_lib.RowLayout | None = None) -> dict[str, jax.Array]:
    """Assembles the global batch from this process's rows (its `input_shard`).

    With `stacked`, every array has a leading axis of consecutive batches ([n, B, ...],
    the input of `Trainer.train_steps`), which stays whole on every device. The rows
    are checked against `rows` (default: the eval step's layout, `self.rows`).
    """
    attention_ops.check_rows(local_batch, self.packed_rows_limit, rows or self.rows)
    placement = stacked_sharding(self.batch_sharding) if stacked else self.batch_sharding
    return sharding.place_batch(local_batch, placement, self.input_shard,
                                row_axis=1 if stacked else 0)


def with_rows(model_config: ModelConfig, rows: objective_lib.RowLayout) -> ModelConfig:
  """The model config for input rows laid out as `rows` (its rows_* mode flags)."""
  return dataclasses.replace(model_config, rows_packed=rows.packed, rows_padded=rows.padded)


def predicted_rows_excluded(model_config: ModelConfig) -> tuple[int, ...]:
  """model.never_predict for objectives that predict vocabulary ids; () for a classifier."""
  if objective_lib.resolve(model_config).classifies:
    return ()  # Its logits are classes, not the vocabulary rows never_predict names.
  return tuple(model_config.never_predict)


def _jit_eval_step(model_config: ModelConfig, mesh: jax.sharding.Mesh, rules: tuple,
                   param_shardings: Any, train_config: ml_collections.ConfigDict,
                   position_bucket: int = 0, seq_len: int = 0) -> Callable:
  """eval_step of a deterministic copy of the model (its rows padded, as evaluation's
  are), jitted with explicit shardings."""
  eval_model = make_model(dataclasses.replace(model_config, deterministic=True,
                                              rows_padded=True))
  objective = objective_lib.resolve(model_config)
  num_buckets = -(-seq_len // position_bucket) if position_bucket > 0 else 0
  tag_names = (denoisers_lib.tag_names(denoisers_lib.denoisers(objective.transform,
                                                               train_config))
               if objective.transform else ())
  return jax.jit(functools.partial(eval_step, forward=objectives.make_forward(
      eval_model, objective, hidden=True), logits_chunk=train_config.logits_chunk,
                                   logits_dtype=train_config.logits_dtype,
                                   never_predict=predicted_rows_excluded(model_config),
                                   position_bucket=position_bucket,
                                   num_buckets=num_buckets, tag_names=tag_names),
                 in_shardings=(param_shardings, sharding.batch_sharding(mesh, rules)),
                 out_shardings=sharding.replicated(mesh))


@dataclasses.dataclass
class Trainer(Scorer):
  """The compiled pieces of a training run, built once from the config and the mesh."""

  state_shardings: Any
  abstract_state: Any
  init: Callable
  train_step: Callable
  # (state, batches with a leading axis of n) -> (state, metrics with that axis): n
  # train_steps in one compiled call (lax.scan), the same updates bit for bit.
  train_steps: Callable
  # What the train step's rows may hold (the input pipeline's, or the batch's a caller
  # gave): each training batch is checked against it (train_batch).
  train_rows: objective_lib.RowLayout

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
             rows: objective_lib.RowLayout | None = None) -> "Trainer":
    """Builds the model, optimizer and the jitted, explicitly sharded functions.

    `rows`: what the training rows may hold (default: what the config's input pipeline
    makes, config.objective.row_layout; a benchmark's made-up batch gives its own).
    """
    rules = sharding.rules_of(config.mesh, mesh)
    objective = objective_lib.resolve(config.model)
    rows = rows or objective_lib.row_layout(objective, config.data, train=True)
    model_config = with_rows(ModelConfig.from_config(config.model), rows)
    model = make_model(model_config)
    schedule = optim.make_schedule(config.optimizer, model_config.d_model,
                                   config.train.num_steps)
    tx = optim.make_optimizer(config.optimizer, schedule)
    lora = model_config.lora_rank > 0
    init = make_init_fn(model, tx, config.data.seq_len, objective, lora)

    # Sharded from the first byte: shapes -> logical specs -> mesh shardings -> jit(init).
    boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
    sharding.check_divisible(boxed.params, mesh, rules)  # One line, not IndivisibleError.
    logical_specs = nn.get_partition_spec(boxed)
    state_shardings = sharding.logical_to_shardings(logical_specs, mesh, rules)
    abstract_state = checkpointing.abstract_like(nn.meta.unbox(boxed), state_shardings)
    batch_sharding = sharding.batch_sharding(mesh, rules)
    replicated = sharding.replicated(mesh)
    if jax.process_index() == 0:
      sharding.log_sharding_report(boxed.params, state_shardings.params,
                                   abstract_state.opt_state, state_shardings.opt_state, mesh)

    jit_init = jax.jit(lambda rng: nn.meta.unbox(init(rng)), out_shardings=state_shardings)
    one_step = functools.partial(
        train_step, forward=objectives.make_forward(model, objective, hidden=True), tx=tx,
        schedule=schedule, label_smoothing=config.optimizer.label_smoothing,
        microbatches=config.train.microbatches,
        skip_nonfinite=config.optimizer.skip_nonfinite > 0, z_loss=config.optimizer.z_loss,
        never_predict=predicted_rows_excluded(model_config),
        moe_aux_loss=config.model.moe_aux_loss, moe_z_loss=config.model.moe_z_loss,
        logits_chunk=config.train.logits_chunk, logits_dtype=config.train.logits_dtype,
        lora=lora)
    jit_train = jax.jit(one_step, in_shardings=(state_shardings, batch_sharding),
                        out_shardings=(state_shardings, replicated), donate_argnums=(0,))
    jit_train_steps = jax.jit(
        lambda state, batches: jax.lax.scan(one_step, state, batches),
        in_shardings=(state_shardings, stacked_sharding(batch_sharding)),
        out_shardings=(state_shardings, replicated), donate_argnums=(0,))
    return cls(config=config, mesh=mesh, rules=rules, model_config=model_config,
               eval_step=_jit_eval_step(model_config, mesh, rules, state_shardings.params,
                                        config.train),
               batch_sharding=batch_sharding, state_shardings=state_shardings,
               packed_rows_limit=attention_ops.mesh_packed_rows_limit(model_config, mesh,
                                                                      rules),
               input_shard=sharding.input_shard(mesh, rules), abstract_state=abstract_state,
               init=jit_init, train_step=jit_train, train_steps=jit_train_steps,
               rows=objective_lib.row_layout(objective, config.data, train=False),
               train_rows=rows)

  def train_batch(self, local_batch: dict[str, np.ndarray],
                  stacked: bool = False) -> dict[str, jax.Array]:
    """global_batch for the train step: the rows checked against `train_rows`."""
    return self.global_batch(local_batch, stacked, rows=self.train_rows)


def stacked_sharding(batch_sharding: NamedSharding) -> NamedSharding:
  """The placement of consecutive batches stacked on a leading axis: that axis whole."""
  return NamedSharding(batch_sharding.mesh, PartitionSpec(None, *batch_sharding.spec))


def check_divisible(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> None:
  """`sharding.check_divisible` for `config`'s model on `mesh`, from shapes alone.

  For checks before a workdir is touched (cli/train.py's check_config); Trainer.create
  and the modes that load a run check the parameters they build.

  Raises:
    ConfigError: a weight dimension does not split over its mesh axes.
  """
  sharding.check_divisible(abstract_params(config), mesh,
                           sharding.rules_of(config.mesh, mesh))


def abstract_params(config: ml_collections.ConfigDict) -> Any:
  """`config`'s model parameters as jax.ShapeDtypeStructs (boxed with their logical axes),
  traced from shapes alone: no array is made."""
  objective = objective_lib.resolve(config.model)
  batch = objectives.init_batch(objective, 1, config.data.seq_len)
  model = make_model(ModelConfig.from_config(config.model))
  return jax.eval_shape(model.init, jax.random.PRNGKey(0),
                        *objectives.model_inputs(objective, batch))["params"]


def batch_share(config: ml_collections.ConfigDict,
                mesh: jax.sharding.Mesh) -> sharding.InputShard:
  """This process's share of every global batch: which share it reads (index of count,
  sharding.input_shard) and how many rows (its `rows`, batch_size // count). The one
  place training, evaluation and the reports take a process's rows from.

  Raises:
    ConfigError: the global batch does not split evenly over the data-parallel shards
      and micro-batches, or the mesh cannot be fed (sharding.input_shard).
  """
  rules = sharding.rules_of(config.mesh, mesh)
  ways = sharding.data_parallel_size(mesh, rules)
  batch, micro = config.data.batch_size, config.train.microbatches
  # Each micro-batch is itself split over the data-parallel devices.
  if batch % (ways * micro):
    raise ConfigError(
        f"config.data.batch_size={batch} is invalid: it must be divisible by the "
        f"{ways} data-parallel shards of mesh {dict(mesh.shape)} times "
        f"config.train.microbatches={micro}; e.g. {ways * micro}")
  share = sharding.input_shard(mesh, rules)
  return dataclasses.replace(share, rows=batch // share.count)


def evaluate_split(scorer: Scorer, params: Any, dataset, local_batch_size: int,
                   progress: progress_lib.Progress | None = None) -> dict[str, float]:
  """Loss metrics of the eval split (or its first `train.eval_batches` batches): eval_*.

  Used by the training loop and by --mode=evaluate alike (`scorer` is a Trainer or a
  Scorer; its config supplies train.eval_batches and data.eval_split); `progress`
  counts the batches scored (workdir/progress.py).
  """
  return metrics_lib.summarize(sum_split(scorer, params, dataset, local_batch_size,
                                         progress), prefix="eval_")


def sum_split(scorer: Scorer, params: Any, dataset, local_batch_size: int,
              progress: progress_lib.Progress | None = None) -> dict[str, Any]:
  """The eval step's sums over the split (evaluate_split's), before any mean is taken.

  `progress` (--mode=evaluate's) counts the batches scored.

  Raises:
    DataError: the split produced no batch.
  """
  batches = packing.iterate_eval(dataset, local_batch_size, scorer.config.train.eval_batches)
  if scorer.config.data.prefetch:  # The next host batches built while a batch is scored.
    batches = prefetch.Prefetch(batches, scorer.config.data.prefetch, "prefetch-eval")
  try:
    total = _sum_batches(scorer, params, batches, progress)
  finally:
    if isinstance(batches, prefetch.Prefetch):
      batches.close()
  if total is None:
    raise DataError(f"config.data.eval_split={scorer.config.data.eval_split!r} produced no "
                    "batch to evaluate: the split is empty, or every example was dropped (the "
                    "warnings above say why)")
  return total


def _sum_batches(scorer: Scorer, params: Any, batches: Iterator[dict[str, np.ndarray]],
                 progress: progress_lib.Progress | None = None) -> dict[str, Any] | None:
  """The summed eval metrics of `batches` (None if there are none), every process alike."""
  total = None
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
                           f"config.data.eval_split={scorer.config.data.eval_split!r}; "
                           "the split is smaller than the number of processes")
        local_batch = template
      elif template is None:
        template = jax.tree.map(np.zeros_like, local_batch)  # Weights 0: counts nothing.
    elif local_batch is None:
      break
    sums = scorer.eval_step(params, scorer.global_batch(local_batch))
    total = metrics_lib.add_sums(total, jax.device_get(sums))
    if progress is not None:
      progress.update()
  return total
