"""The training loop: restore or init, train, evaluate, save, and stop cleanly.

Resume order (one place): build the abstract sharded state -> if a checkpoint
exists, restore the state into those shardings and move the data iterator to the
saved position -> start building batches from there (prefetch.CallBatches, whose
position later checkpoints save) -> continue with range(state.step, num_steps). A
checkpoint saved after step s holds the post-update state with state.step == s.

One iteration of the loop, as a story (nanodo's train.py shape): take the next
call's batch (built and placed ahead, while the previous calls ran: prefetch.py) ->
the previous call ended: stop there if a signal asked (signals.py; so Ctrl-C stops
within the call it came in, at the cost of the host's dispatch of each call after the
previous one ends rather than queued behind it) -> dispatch a call of
train.steps_per_call steps -> report the previous call's metrics, fetched while this
one runs -> evaluate if due (skipped when stopping) -> save if due (or stopping) ->
the hooks' after_call. What it reads between iterations is one `LoopState`. Beside it:
signals.py (stop requests), resume.py (the run's vocabulary and config checks),
reporting.py (rows, the progress line, the non-finite guard) and hooks.py (what runs
at known points: decoding at an evaluation, the tests' crash points).
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any, Callable, Sequence

import grain
import jax
import ml_collections
from absl import logging

from transformer import distributed
from transformer import sharding
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.data import pipeline
from transformer.data import run_data
from transformer.data import sources
from transformer.data.tokenizers import run_vocabulary
from transformer.model import fp8
from transformer.training import benchmark_hook
from transformer.training import decode_hook
from transformer.training import fine_tune
from transformer.training import hooks as hooks_lib
from transformer.training import metrics as metrics_lib
from transformer.training import optim
from transformer.training import prefetch
from transformer.training import reporting
from transformer.training import resume
from transformer.training import signals
from transformer.training.trainer import Trainer, TrainState, batch_share, evaluate_split
from transformer.workdir import checkpointing
from transformer.workdir import files
from transformer.workdir import init_from
from transformer.workdir import layout
from transformer.workdir import metrics_file
from transformer.workdir import progress as progress_lib
from transformer.workdir import run_record


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       hooks: Sequence[hooks_lib.Hook] = ()) -> dict[str, float]:
  """Trains `config` in `workdir`, resuming from its latest checkpoint if there is one.

  Args:
    config: the experiment config (configs/base.py lists every key).
    workdir: where checkpoints, metrics.jsonl, TensorBoard events and config.json go.
    hooks: called at the loop's points after its own and the registered ones (hooks.py).

  Returns:
    The last training metrics merged with the last evaluation metrics.

  Raises:
    signals.Interrupted: SIGINT or SIGTERM stopped the run (signals.py).
  """
  with signals.StopRequest() as stop:
    try:
      return _train_and_evaluate(config, workdir, stop, hooks)
    except signals.Aborted as e:  # A second signal: the files are closed, nothing is half written.
      raise signals.Interrupted(checkpointing.newest_complete_step(workdir), e.signum,
                                aborted=True) from None


@dataclasses.dataclass(frozen=True)
class _Run:
  """What one training session works with: built once by `_train_and_evaluate`."""
  config: ml_collections.ConfigDict  # model.vocab_size resolved.
  workdir: str
  trainer: Trainer
  checkpointer: checkpointing.Checkpointer
  writer: metrics_file.MetricWriter
  train_iter: grain.DatasetIterator  # Rows; prefetch.CallBatches takes over after the restore.
  eval_data: Any  # An iterable of the eval split's batches (pipeline.make_dataset).
  objective: objective_lib.Objective
  local_batch_size: int
  write_run_files: Callable[[], None]
  stop: signals.StopRequest
  hooks: Sequence[hooks_lib.Hook]


def _datasets(config: ml_collections.ConfigDict, objective: objective_lib.Objective,
              data_sources: sources.DataSources,
              share: sharding.InputShard) -> tuple[Any, Any]:
  """This process's training iterator (checked to yield a batch) and evaluation dataset.

  Each process reads its devices' share of the rows: the same share as the processes
  across a tensor or context axis from it (batch_share).
  """
  data_kwargs = dict(batch_size=share.rows, process_index=share.index,
                     process_count=share.count)
  train_data, eval_data = (
      pipeline.make_dataset(config, objective, data_sources.split(split),
                            data_sources.tokenizer, train=train, split=split, **data_kwargs)
      for split, train in ((config.data.train_split, True), (config.data.eval_split, False)))
  train_iter = iter(train_data)
  # One batch now, then back: a pipeline that yields nothing (every example dropped)
  # fails in seconds with its DataError, not after the model has compiled.
  first_position = train_iter.get_state()
  next(train_iter)
  train_iter.set_state(first_position)
  return train_iter, eval_data


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        stop: signals.StopRequest,
                        hooks: Sequence[hooks_lib.Hook]) -> dict[str, float]:
  """train_and_evaluate with its signal handlers installed."""
  validate(config)
  mesh = sharding.make_mesh(config.mesh)
  share = batch_share(config, mesh)  # This process's rows of every batch.
  local_batch_size = share.rows
  is_chief = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  logging.info("Mesh %s over %d devices (%d processes)", dict(mesh.shape),
               jax.device_count(), jax.process_count())

  # A resumed run keeps its own vocabulary, never one derived again from edited data
  # under its trained embeddings (a changed dataset is refused just below).
  data_sources = sources.load_sources(config, resume.vocabulary_workdir(config, workdir))
  config = resume.resolve_vocab_size(config, data_sources.tokenizer)
  dataset = data_sources.record()  # The tokenizer's identity too.
  # Every process of the run: the same resolved config, workdir, data and tokenizer,
  # or each stops here in one line naming the key (process 0's files would say
  # otherwise only what process 0 read).
  distributed.agree({"config": {**run_record.flat_config(config),
                                "--workdir": os.path.abspath(workdir)},
                     "data": run_data.identity(dataset)}, ConfigError)
  resume.check_config_change(config, workdir, dataset)
  complete = resume.already_complete(workdir, config.train.num_steps)
  if complete is not None:
    # Nothing to train: say so without building (and compiling) the model.
    logging.info("%s is already complete: its checkpoint %d reaches train.num_steps=%d, so "
                 "there is nothing to train (a larger --config.train.num_steps continues "
                 "it)", workdir, complete, config.train.num_steps)
    return metrics_file.latest_values(workdir)

  def write_run_files() -> None:
    """The resolved config, the vocabulary and the data identity: later commands
    rebuild from them. Written only once the restore succeeded, so a failed resume
    leaves every file of the workdir as it was; a second signal waits for them."""
    with stop.deferred():
      if is_chief:
        files.write_atomically(os.path.join(workdir, layout.CONFIG),
                               config.to_json_best_effort(indent=2))
        run_vocabulary.save_tokenizer(workdir, data_sources.tokenizer)
        sources.save_dataset_record(workdir, dataset)

  objective = objective_lib.resolve(config.model)
  logging.info("Objective: %s on %s (%s tokenizer, vocabulary %d, model.vocab_size %d)",
               objective.name, data_sources.name,
               run_vocabulary.tokenizer_kind(data_sources.tokenizer),
               data_sources.tokenizer.vocab_size, config.model.vocab_size)
  train_iter, eval_data = _datasets(config, objective, data_sources, share)
  # train.benchmarks' tasks, read and encoded before anything compiles (None when off).
  benchmarks = benchmark_hook.make_hook(config, data_sources.tokenizer)
  trainer = Trainer.create(config, mesh)
  if benchmarks is not None:
    benchmarks.start(trainer)
  checkpointer = checkpointing.Checkpointer(workdir, config.checkpoint)
  writer = metrics_file.MetricWriter(workdir, enabled=is_chief, config=config)
  run = _Run(config=config, workdir=workdir, trainer=trainer, checkpointer=checkpointer,
             writer=writer, train_iter=train_iter, eval_data=eval_data, objective=objective,
             local_batch_size=local_batch_size, write_run_files=write_run_files, stop=stop,
             hooks=[decode_hook.DecodeAtEvaluation(config, workdir, trainer.model_config,
                                                   writer),
                    *([benchmarks] if benchmarks is not None else []),
                    *hooks_lib.registered(), *hooks])
  try:
    return _train_loop(run)
  finally:  # Also on errors: finish a pending checkpoint write and flush the metrics.
    with stop.deferred():
      if not stop.abandoned:  # Given up by a third signal: closing would wait for it.
        checkpointer.close()
      writer.close()


@dataclasses.dataclass
class LoopState:
  """What the loop knows between its iterations, beside the train state."""
  dispatched: int  # Steps run so far: the last step of the newest call.
  calls: int = 0  # Calls dispatched since this (re)start.
  unreported: reporting.DispatchedCall | None = None  # Its metrics are not fetched yet.
  sums: dict[str, Any] | None = None  # Training sums since the last row.
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # The result so far.

  def report(self, reporter: reporting.Reporter, final: bool = False) -> None:
    """Reports the dispatched call not reported yet, if any; `final`: its last step
    gets a row, kept beside the newest evaluation's metrics."""
    if self.unreported is None:
      return
    call = dataclasses.replace(self.unreported, shown=True) if final else self.unreported
    self.sums, summary = reporter.report_call(call, self.sums)
    self.unreported = None
    if final:
      self.metrics = {**self.metrics, **(summary or {})}
    else:  # A row replaces the previous row (and the evaluation merged into it).
      self.metrics = summary or self.metrics


def _train_loop(run: _Run) -> dict[str, float]:
  """Restore or init, then train, evaluate and save until train.num_steps or a stop."""
  config, num_steps = run.config, run.config.train.num_steps
  record = run_record.RunRecord(run.workdir, enabled=run.writer.enabled)  # Parameters, time.
  interrupted = None
  with run.trainer.context():
    state, restored = _restore_or_init(run)
    run.write_run_files()  # Only now: the restore (or init) succeeded.
    start_step = int(jax.device_get(state.step))
    # One row per step: rows a stopped run wrote after this checkpoint are dropped.
    kept_rows = run.writer.resume(start_step if restored else -1)
    guard = reporting.NonFiniteGuard(
        config.optimizer.skip_nonfinite,
        total=int(sum(row.get("skipped_updates", 0) for row in kept_rows)))
    lora = bool(run.trainer.model_config.lora_rank)
    weights = fp8.split_state(state.params)[0]  # fp8's scaling state is no weight.
    count, trainable = metrics_lib.log_parameter_count(
        weights, run.trainer.model_config,
        optim.split_trainable(weights, lora)[0] if lora else None)
    record.update(start_step, parameters=count, trainable_parameters=trainable)
    progress = reporting.make_progress(config, run.workdir, run.trainer.model_config,
                                       run.objective, start_step)
    reporting.hint_steps_per_call(config)
    reporter = reporting.Reporter(config, run.writer, progress, run.local_batch_size, guard)

    # train.steps_per_call steps run as one compiled call (the same updates; less
    # per-call overhead, which dominates small models on a CPU). A call ends at the next
    # multiple of steps_per_call, which every cadence is (config/train.py), or at
    # num_steps (prefetch.call_lengths). Its batch was built and placed by a thread
    # while the previous calls ran (data.prefetch calls ahead; a checkpoint saves the
    # position of the rows taken). A call's metrics are fetched while the next call
    # runs, so logging never stalls the device.
    batches = prefetch.CallBatches(
        run.train_iter, run.trainer.train_batch, start_step=start_step,
        num_steps=num_steps, steps_per_call=config.train.steps_per_call,
        depth=config.data.prefetch)
    try:  # Started here: the first call's batch is built during the evaluation at 0.
      if start_step == 0 and config.train.eval_at_start:  # The baseline later evals beat.
        eval_metrics = evaluate_split(run.trainer, state.params, run.eval_data,
                                      run.local_batch_size, _eval_progress(config, 0))
        logging.info("eval at step 0: %s", reporting.format_metrics(eval_metrics))
        run.writer.write(0, eval_metrics)

      loop = LoopState(dispatched=start_step)
      saved = start_step if restored else None  # The step of the newest checkpoint.
      stopping = False
      while loop.dispatched < num_steps:
        before = batches.get_state()
        call = progress.next_batch(batches)  # Its wait: data_wait_fraction.
        if loop.calls and _stop_requested(run, state, loop.dispatched):
          # A signal during the call that just ended: none other is dispatched (Ctrl-C
          # stops within the compiled call it came in), and its rows stay untrained.
          batches.untake(call, before)
          stopping = True
          break
        run.stop.running(loop.dispatched + 1, loop.dispatched + call.steps,
                         config.train.steps_per_call, config.train.log_every, num_steps)
        state, call_metrics = _dispatch(run, state, call)
        loop.dispatched += call.steps
        loop.calls += 1
        step = loop.dispatched
        loop.report(reporter)  # The previous call's.
        # The first two calls after a (re)start are always shown: the second has an ETA.
        loop.unreported = reporting.DispatchedCall(step, call.steps, call_metrics,
                                                   loop.calls <= 2)
        if step % config.train.eval_every == 0 or step == num_steps:
          if step < num_steps and _stop_requested(run, state, step):
            logging.warning("Skipping the evaluation due at step %d: the run stops there",
                            step)
            stopping = True
            break
          loop.report(reporter)  # Checked first: a non-finite state is never evaluated.
          loop.metrics = {**loop.metrics, **_evaluate(run, state, step)}
          progress.restart_clock()  # Throughput and MFU are of training alone.
        if step % config.checkpoint.every == 0 or step == num_steps:
          loop.report(reporter)  # Checked first: a non-finite step is never saved.
          _save(run, state, step, record, batches)
          saved = step
        for hook in run.hooks:
          hook.after_call(step, state)
      if stopping:
        loop.report(reporter)  # Checked first: a non-finite step is never saved.
        if saved != loop.dispatched:
          _save(run, state, loop.dispatched, record, batches)
        logging.warning("Stopped at step %d; rerun the same command to resume.",
                        loop.dispatched)
        interrupted = signals.Interrupted(loop.dispatched, run.stop.signum)
      loop.report(reporter, final=True)  # The last step is always shown.
      if interrupted is None and run.stop.requested:
        # A signal during the last call or its save: nothing is left to resume, and
        # "Stopped at step N; rerun" beside "finished" (exit 0) said two things.
        logging.warning("%s came as the run finished: all %d steps are trained and "
                        "saved (checkpoint %d); nothing was cut short, nothing to resume",
                        signal.Signals(run.stop.signum).name, num_steps, loop.dispatched)
    finally:  # Every exit (the end, a stop, an error) ends the thread.
      batches.close()
  if interrupted is not None:
    raise interrupted
  return loop.metrics


def _stop_requested(run: _Run, state: TrainState, step: int) -> bool:
  """Whether to stop at `step`, the end of the call that produced `state`: waits for the
  call to end (so a signal during it is seen before anything else is dispatched), then
  asks the stop request (several processes decide together: signals.py)."""
  jax.block_until_ready(state)
  return run.stop.should_stop(step, run.config.train.log_every)


def _restore_or_init(run: _Run) -> tuple[TrainState, bool]:
  """The train state to start from, and whether it is this run's own checkpoint."""
  config, checkpointer, trainer = run.config, run.checkpointer, run.trainer
  # Unfinished, incomplete or corrupt checkpoints are moved aside, newest first.
  restored = checkpointer.restore_latest(trainer.abstract_state, run.train_iter)
  if restored is None and config.init_from:
    # Fine-tuning: parameters whose path the source run has take its values (read
    # into this run's shardings); the step and Adam's moments start fresh. Loading
    # first lets a shape mismatch fail before init compiles.
    loaded, _ = fine_tune.load_source_params(config, trainer.abstract_state.params)
    state = trainer.init(jax.random.PRNGKey(config.seed))
    state = state.replace(params=init_from.merge_params(state.params, loaded))
    logging.info("Starting at step 0 in %s from the parameters of config.init_from=%r",
                 run.workdir, config.init_from)
  elif restored is None:
    state = trainer.init(jax.random.PRNGKey(config.seed))
    if checkpointer.set_aside:
      logging.warning("Starting from scratch in %s: no usable checkpoint is left (%d "
                      "moved to %s)", run.workdir, len(checkpointer.set_aside),
                      checkpointer.bad_directory)
    else:
      logging.info("Starting from scratch in %s", run.workdir)
  else:
    # A run's own checkpoint wins: rerunning a fine-tuning command resumes it.
    latest, state = restored
    logging.info("Resumed from checkpoint %d in %s", latest, checkpointer.directory)
    if config.init_from:
      logging.info("Ignoring config.init_from=%r: resuming this run's own checkpoint",
                   config.init_from)
  return state, restored is not None


def _dispatch(run: _Run, state: TrainState,
              call: prefetch.Call) -> tuple[TrainState, Any]:
  """Runs `call`'s steps as one compiled call; their metrics stay on the device."""
  if call.steps == 1:
    return run.trainer.train_step(state, call.batch)
  return run.trainer.train_steps(state, call.batch)


# An evaluation inside training says its count and ETA this often (none if shorter).
EVAL_PROGRESS_SECONDS = 10.0


def _eval_progress(config: ml_collections.ConfigDict, step: int) -> progress_lib.Progress:
  """The evaluation's counted progress, as --mode=evaluate's (a long one was minutes
  without a line)."""
  batches = config.train.eval_batches
  return progress_lib.Progress(f"eval at step {step}", batches if batches > 0 else None,
                               "batches", every=EVAL_PROGRESS_SECONDS)


def _evaluate(run: _Run, state: TrainState, step: int) -> dict[str, float]:
  """Evaluates `state` on the eval split; the after_eval hooks may add to the row."""
  eval_metrics = evaluate_split(run.trainer, state.params, run.eval_data,
                                run.local_batch_size, _eval_progress(run.config, step))
  for hook in run.hooks:  # decode_hook's first: eval_bleu, logged translations, a sample.
    hook.after_eval(step, state, eval_metrics)
  logging.info("eval at step %d: %s", step, reporting.format_metrics(eval_metrics))
  run.writer.write(step, eval_metrics)
  return eval_metrics


def _save(run: _Run, state: TrainState, step: int, record: run_record.RunRecord,
          batches: prefetch.CallBatches) -> None:
  """Saves a checkpoint of `state` after `step`; a second signal waits until it is whole.

  The data position saved is `batches`' (the rows of the calls taken so far, not of
  those built ahead).
  """
  with run.stop.deferred():
    run.writer.sync()  # Rows up to `step` are not rewritten after a resume from it.
    run.checkpointer.save(step, state, batches)
    record.update(step)
    for hook in run.hooks:
      hook.after_save(step, run.checkpointer)
