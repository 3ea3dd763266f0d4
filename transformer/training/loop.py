"""The training loop: restore or init, train, evaluate, save, and stop cleanly.

Resume order (one place): build the abstract sharded state -> if a checkpoint
exists, restore the state into those shardings and move the data iterator to the
saved position -> continue with range(state.step, num_steps). A checkpoint saved
after step s holds the post-update state with state.step == s.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from transformer import sharding
from transformer.configuration import ConfigError, objective_of, validate
from transformer.data import catalog
from transformer.data import pipeline
from transformer.data import sources
from transformer.training import decode_hook
from transformer.training import flops
from transformer.training import metrics as metrics_lib
from transformer.training.fault_injection import KillAt
from transformer.training.trainer import Trainer, check_batch_size, evaluate_split
from transformer.workdir import checkpointing
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import run_record


class Interrupted(Exception):
  """Training stopped by SIGINT/SIGTERM after saving its step; the same command resumes.

  Raised by train_and_evaluate once the checkpoint is written and the files closed, so
  a caller (and a shell: launch.py exits with `exit_status`, 128 + the signal, i.e.
  130 for Ctrl-C and 143 for SIGTERM) can tell an interrupted run from a finished one.
  """

  def __init__(self, step: int, signum: int):
    self.step, self.signum = step, signum
    self.exit_status = 128 + signum
    super().__init__(f"Stopped by {signal.Signals(signum).name} at step {step} after saving "
                     "a checkpoint; rerun the same command to resume")


class _StopRequest:
  """Turns SIGINT/SIGTERM into a flag, so the loop stops after a complete step and saves."""

  def __init__(self):
    self.requested = False
    self.signum = signal.SIGTERM  # Another process's signal: a preemption, as a rule.
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
    self.signum = signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


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
# how many steps a compiled call runs, decoding, and the mesh (placement only: the
# checkpoint is restored into the new mesh's shardings, and no rule changes an array's
# shape). Every other key shapes the model, the data order or the updates.
RESUME_SAFE_KEYS = ("train.num_steps", "train.log_every", "train.eval_every",
                    "train.steps_per_call",
                    "train.eval_batches", "train.eval_at_start", "train.bleu_examples",
                    "train.sample_prompt", "checkpoint.every", "checkpoint.keep",
                    "checkpoint.async_save", "checkpoint.on_config_change", "data.num_threads")
RESUME_SAFE_PREFIXES = ("decode.", "mesh.")
ON_CONFIG_CHANGE = ("stop", "allow")


def _check_config_change(config: ml_collections.ConfigDict, workdir: str,
                         dataset: dict[str, object] | None = None) -> None:
  """On resume, compares `config` (vocab_size resolved) and the data with the run's own.

  Changes to RESUME_SAFE_KEYS and decode.* apply and are logged. Any other change
  stops the run with a ConfigError listing each key with its old and new value,
  unless checkpoint.on_config_change is 'allow'. A dataset other than the one in
  the run's dataset.json (an edited local file) is such a change too. A key only one
  side has (one added to configs/base.py since the run started) is logged. A workdir
  whose config.json has no checkpoint beside it is not a resume: nothing is compared.
  """
  policy = config.checkpoint.on_config_change
  if policy not in ON_CONFIG_CHANGE:
    raise ConfigError(f"config.checkpoint.on_config_change={policy!r} is invalid: valid "
                      "values are " + ", ".join(repr(p) for p in ON_CONFIG_CHANGE) + ".")
  path = os.path.join(workdir, layout.CONFIG)
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
  data_change = sources.dataset_change(workdir, dataset) if dataset else None
  if data_change:
    unsafe.append(data_change)
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
  if (checkpointing.has_checkpoint(workdir)
      and os.path.exists(os.path.join(workdir, layout.TOKENIZER_RECORD))):
    # A resumed run keeps its own vocabulary, never one retrained from edited data
    # under its trained embeddings (a changed dataset is refused just below).
    tokenizer_workdir = workdir
  elif config.init_from:  # Fine-tuning keeps the vocabulary its parameters were trained with.
    tokenizer_workdir = sources.run_workdir(config.init_from)
  data_sources = sources.load_sources(config, tokenizer_workdir)
  config = _resolve_vocab_size(config, data_sources.tokenizer)
  dataset = sources.dataset_record(data_sources.builder)
  _check_config_change(config, workdir, dataset)
  complete = checkpointing.newest_complete_step(workdir)
  # Only a checkpoint whose file sizes were recorded when its save finished is known
  # whole without reading it; any other one goes through the restore, which checks it.
  if complete is not None and not os.path.exists(
      os.path.join(workdir, layout.CHECKPOINTS, str(complete), layout.FILE_SIZES)):
    complete = None
  if complete is not None and complete >= config.train.num_steps:
    # Nothing to train: say so without building (and compiling) the model.
    logging.info("%s is already complete: its checkpoint %d reaches train.num_steps=%d, so "
                 "there is nothing to train (a larger --config.train.num_steps continues "
                 "it)", workdir, complete, config.train.num_steps)
    return _logged_metrics(workdir)

  def write_run_files() -> None:
    """The resolved config, the vocabulary and the data identity: later commands
    rebuild from them. Written only once the restore succeeded, so a failed resume
    leaves every file of the workdir as it was."""
    if is_chief:
      files.write_atomically(os.path.join(workdir, layout.CONFIG),
                             config.to_json_best_effort(indent=2))
      sources.save_tokenizer(workdir, data_sources.tokenizer)
      sources.save_dataset_record(workdir, dataset)

  objective = objective_of(config.model.arch, config.model.head)
  logging.info("Objective: %s on %s (%s tokenizer, vocabulary %d, model.vocab_size %d)",
               objective, data_sources.builder.info.full_name,
               sources.tokenizer_kind(data_sources.tokenizer),
               data_sources.tokenizer.vocab_size, config.model.vocab_size)
  data_kwargs = dict(batch_size=local_batch_size, process_index=jax.process_index(),
                     process_count=jax.process_count())
  train_data, eval_data = (
      pipeline.make_dataset(config, objective,
                            catalog.data_source(data_sources.builder, split),
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
                         objective, local_batch_size, write_run_files)
  finally:  # Also on errors: finish a pending checkpoint write and flush the metrics.
    checkpointer.close()
    writer.close()
  return result


def _train_loop(config, workdir, trainer, checkpointer, writer, train_iter, eval_data,
                objective, local_batch_size, write_run_files) -> dict[str, float]:
  """The loop of train_and_evaluate: restore or init, train, evaluate, save."""
  num_steps = config.train.num_steps
  kill_at = KillAt.from_env()
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
    write_run_files()  # Only now: the restore (or init) succeeded.
    start_step = int(jax.device_get(state.step))
    # One row per step: rows a stopped run wrote after this checkpoint are dropped.
    kept_rows = writer.resume(start_step if restored is not None else -1)
    guard = _NonFiniteGuard(config.optimizer.skip_nonfinite,
                            total=int(sum(row.get("skipped_updates", 0) for row in kept_rows)))
    record.update(start_step, parameters=metrics_lib.log_parameter_count(state.params,
                                                                           trainer.model_config))
    # Tokens the model reads per step (both sides for seq2seq).
    sides = 2 if objective == "seq2seq" else 1
    model_flops = flops.train_flops_per_step(trainer.model_config, config.data.batch_size,
                                             config.data.seq_len)
    peak, peak_source = flops.peak_flops(workdir)
    logging.info("Model FLOPs per step %.4g (flops.py); MFU is against %.4g FLOP/s, the %s",
                 model_flops, peak, peak_source)
    _hint_steps_per_call(config)
    progress = metrics_lib.TrainProgress(start_step, num_steps,
                                    sides * config.data.batch_size * config.data.seq_len,
                                    model_flops, peak)

    if start_step == 0 and config.train.eval_at_start:  # The baseline later evals beat.
      eval_metrics = evaluate_split(trainer, state.params, eval_data, local_batch_size)
      logging.info("eval at step 0: %s", _format(eval_metrics))
      writer.write(0, eval_metrics)

    # train.steps_per_call steps run as one compiled call (the same updates; less
    # per-call overhead, which dominates small models on a CPU). A call ends at the next
    # multiple of steps_per_call, which every cadence is (configuration.py), or at
    # num_steps. `pending` is the previous call (its last step, its step count, its
    # metrics on the device, whether it is among the first two calls of this (re)start),
    # fetched while the next call runs, so logging never stalls the device.
    per_call = config.train.steps_per_call
    pending = None
    train_sums = None
    interrupted = None
    calls = 0
    done = start_step

    def flush():
      nonlocal train_sums, last_metrics, pending
      train_sums, summary = _report_call(pending, train_sums, progress, writer, config, guard)
      last_metrics = summary or last_metrics
      pending = None

    with _StopRequest() as stop:
      while done < num_steps:
        count = min(per_call - done % per_call, num_steps - done)
        if count == 1:
          state, call_metrics = trainer.train_step(
              state, trainer.global_batch(next(train_iter)))
        else:
          rows = [next(train_iter) for _ in range(count)]
          batches = {k: np.stack([row[k] for row in rows]) for k in rows[0]}
          state, call_metrics = trainer.train_steps(
              state, trainer.global_batch(batches, stacked=True))
        done += count
        calls += 1
        if pending is not None:
          flush()
        # The first two calls after a (re)start are always shown: the second has an ETA.
        pending = (done, count, call_metrics, calls <= 2)
        if done % config.train.eval_every == 0 or done == num_steps:
          flush()
          eval_metrics = evaluate_split(trainer, state.params, eval_data, local_batch_size)
          # train.bleu_examples / train.sample_prompt: eval_bleu, logged translations, a sample.
          eval_metrics.update(decode_hook.decode_at_evaluation(
              config, workdir, trainer.model_config, state.params, writer, done))
          kill_at("during_eval", done)
          logging.info("eval at step %d: %s", done, _format(eval_metrics))
          writer.write(done, eval_metrics)
          last_metrics = {**last_metrics, **eval_metrics}
          progress.restart_clock()  # Throughput and MFU are of training alone.
        stopping = stop.should_stop(done, config.train.log_every)
        if done % config.checkpoint.every == 0 or done == num_steps or stopping:
          if pending is not None:  # Checked first: a non-finite step is never saved.
            flush()
          writer.sync()  # Rows up to `done` are not rewritten after a resume from it.
          checkpointer.save(done, state, train_iter)
          record.update(done)
          kill_at("during_save", done)
          kill_at("after_save", done, first=checkpointer.wait)
        if stopping:
          logging.warning("Stopped at step %d; rerun the same command to resume.", done)
          interrupted = Interrupted(done, stop.signum) if done < num_steps else None
          break
        kill_at("after_step", done)
    if pending is not None:  # The last step is always shown.
      _, summary = _report_call(pending[:3] + (True,), train_sums, progress, writer, config,
                                guard)
      last_metrics = {**last_metrics, **(summary or {})}
  if interrupted is not None:
    raise interrupted
  return last_metrics


def _hint_steps_per_call(config: ml_collections.ConfigDict) -> None:
  """On a CPU, says when several steps per call would run the same updates faster.

  XLA:CPU allocates a step's temporaries at every call (fresh pages from the OS above
  glibc's mmap threshold); a call of k steps pays that once (README, Performance).
  """
  if config.train.steps_per_call != 1 or jax.devices()[0].platform != "cpu":
    return
  cadence = math.gcd(config.train.log_every, config.train.eval_every, config.checkpoint.every)
  per_call = max(d for d in range(1, 11) if cadence % d == 0)
  if per_call > 1:
    logging.info("On a CPU, --config.train.steps_per_call=%d runs the same updates faster "
                 "(%d steps per compiled call; README, Performance)", per_call, per_call)


def _logged_metrics(workdir: str) -> dict[str, float]:
  """The newest value of every metric in the run's metrics.jsonl (a finished run's result)."""
  rows, _ = metrics_lib.read_rows(os.path.join(workdir, layout.METRICS))
  latest: dict[str, float] = {}
  for row in sorted(rows, key=lambda r: r["step"]):
    latest.update({k: float(v) for k, v in row.items() if k != "step"})
  return latest


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


def _report_call(pending, train_sums, progress, writer, config, guard):
  """Fetches one call's metrics and reports each of its steps in order (see `_report`)."""
  last, count, device_metrics, shown = pending
  host = jax.device_get(device_metrics)
  # The clock is per call: its steps share its time (the first call only starts it).
  progress.update(last)
  summary = None
  for i in range(count):
    # A call of several steps returns each metric with a leading axis of its steps.
    one = host if count == 1 else {k: v[i] for k, v in host.items()}
    step = last - count + 1 + i
    train_sums, row = _report((step, one), train_sums, progress, writer, config,
                              force=shown and step == last, guard=guard)
    summary = row or summary
  return train_sums, summary


def _report(pending, train_sums, progress, writer, config, force=False, guard=None):
  """Checks a finished step's loss and gradient norm; logs every `train.log_every` steps.

  `pending` is (step, that step's metrics on the host); `_report_call` fetches them and
  updates `progress`, once per call.
  """
  step, host = pending
  host = dict(host)  # Popped below; the caller's dict stays whole.
  guard = guard or _NonFiniteGuard(config.optimizer.skip_nonfinite)
  guard.check(step, host)
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
