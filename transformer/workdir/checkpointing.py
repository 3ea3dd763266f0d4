"""Orbax checkpoints holding the train state and the data-iterator state together.

Layout: <workdir>/checkpoints/<step>/{state, data}. `state` is the sharded
TrainState (restored straight into its target shardings); `data` is the grain
iterator position of every process, so a resumed run sees exactly the batches
an uninterrupted run would have seen.

A checkpoint whose save never finished, or that is incomplete or corrupt (a missing
item, unreadable metadata, a file whose size differs from the one recorded in its
`file_sizes.json` when the save finished, an array file that fails to read), is never loaded:
`Checkpointer.restore_latest` moves it to `<workdir>/checkpoints_bad/<step>-<reason>`
(never deletes it) and restores the next older one.

Parameter matching for `config.init_from` is in init_from.py, averaging in averaging.py.
"""

from __future__ import annotations

import json
import logging as std_logging
import os
import re
from typing import Any

import grain
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from orbax.checkpoint._src.metadata import array_metadata_store
from etils import epath
from jax.experimental import multihost_utils

from transformer.config.errors import ConfigError
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import orbax_patch


# A failed save's other writes end before its error goes up (Orbax's event loop, replaced
# there: what, why, for which Orbax, and what to do when Orbax changes).
orbax_patch.install()

# Orbax splits each replicated array into one slice per replica and has every replica
# write its slice ("replica-parallel" saving; on by default except on GPUs). For a slice
# of a few KB that is one device-side slicing op and transfer each for nothing: a
# 2-layer model's state on 8 devices, 170 arrays, took 0.218 s a save; with slices
# below this size written whole by one replica, 0.032-0.037 s (benchmarks/
# checkpoint_save.py, AMD EPYC, 2 cores). Large arrays are still spread over the replicas. Otherwise the handler is Orbax's default
# one, its per-array metadata store (state/array_metadatas/) included: that argument has
# no public constructor, hence the _src import.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _not_the_override_warning(record: std_logging.LogRecord) -> bool:
  """Orbax warns 'Type handler registry type ... overriding jax.Array' on every import
  (before the console is set up, so on every mode's console): the override is ours."""
  return "Type handler registry type" not in record.getMessage()


std_logging.getLogger("absl").addFilter(_not_the_override_warning)
try:
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(
          min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES,
          array_metadata_store=array_metadata_store.Store()), override=True)
finally:
  std_logging.getLogger("absl").removeFilter(_not_the_override_warning)


class Checkpointer:
  """Saves and restores (train state, data iterator) pairs under `<workdir>/checkpoints`."""

  def __init__(self, workdir: str, checkpoint: ml_collections.ConfigDict):
    self.directory = os.path.join(os.path.abspath(workdir), layout.CHECKPOINTS)
    self.bad_directory = os.path.join(os.path.abspath(workdir), layout.BAD_CHECKPOINTS)
    self.set_aside: list[str] = []  # Where restore_latest moved unusable checkpoints.
    self._unrecorded: list[int] = []  # Saved by this run, file sizes not yet recorded.
    self._options = ocp.CheckpointManagerOptions(
        max_to_keep=checkpoint.keep, create=True,
        enable_async_checkpointing=checkpoint.async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=self._options)

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def save(self, step: int, state: Any, data_iterator: grain.DatasetIterator) -> None:
    """Starts saving `state` and the iterator position as checkpoint `step`.

    The iterator position is read synchronously here, so the caller may keep
    drawing batches while the arrays are written in the background.
    """
    self.wait()  # Orbax waits for the previous save here anyway; then its sizes are noted.
    with files.disk_errors_as_oserror(self.directory):
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=grain.checkpoint.CheckpointSave(data_iterator)), force=True)
    self._unrecorded.append(step)
    logging.info("Saving checkpoint %d to %s", step, self.directory)

  def restore(self, step: int, abstract_state: Any,
              data_iterator: grain.DatasetIterator) -> Any:
    """Restores checkpoint `step` into `abstract_state`'s shapes and shardings.

    The data iterator is moved to the saved position in place.
    """
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=grain.checkpoint.CheckpointRestore(data_iterator)))
    return restored[layout.STATE]

  def restore_latest(self, abstract_state: Any,
                     data_iterator: grain.DatasetIterator) -> tuple[int, Any] | None:
    """Restores the newest usable checkpoint; unusable ones are moved aside, newest first.

    A save that never finished, a checkpoint with a missing item, unreadable
    metadata or a file whose size differs from the one recorded when its save
    finished (all found before any array is read), and one whose restore fails go
    to `<workdir>/checkpoints_bad/<step>-<reason>`, logged with the reason, and the
    next older checkpoint is tried. Every process calls this; process 0 moves.

    Args:
      abstract_state: the restore target (shapes, dtypes and shardings).
      data_iterator: moved to the restored checkpoint's position in place (left
        where it was when None is returned).

    Returns:
      (step, state) of the checkpoint restored, or None when no usable one is left.

    Raises:
      ConfigError: a readable checkpoint holds arrays of other shapes than
        `abstract_state` (another model or optimizer): a config change, not damage.
    """
    self._move_aside(_unusable_checkpoints(self.directory))
    start = data_iterator.get_state()
    while (step := self._manager.latest_step()) is not None:
      try:
        _check_shapes(os.path.join(self.directory, str(step)), step, abstract_state)
        _check_process_count(os.path.join(self.directory, str(step)), step)
        state, problem = self.restore(step, abstract_state, data_iterator), None
      except ConfigError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        # Damage shows as tensorstore, JSON or key errors; out of memory is not damage.
        if "RESOURCE_EXHAUSTED" in str(e):
          raise
        state, problem = None, f"restoring it failed: {type(e).__name__}: {e}"
      if _all_processes_agree(problem is None):
        return step, state
      data_iterator.set_state(start)
      self._move_aside([(os.path.join(self.directory, str(step)), f"{step}-unreadable",
                         problem or "restoring it failed on another process")])
    return None

  def _move_aside(self, unusable: list[tuple[str, str, str]]) -> None:
    """Moves (path, name, why) checkpoints to checkpoints_bad/<name>; re-reads the steps."""
    if jax.process_count() > 1:  # All have looked at the directory before anything moves.
      multihost_utils.sync_global_devices("checkpoints inspected")
    if unusable and jax.process_index() == 0:
      os.makedirs(self.bad_directory, exist_ok=True)
    for path, name, why in unusable:
      destination = os.path.join(self.bad_directory, name)
      suffix = 1
      while os.path.exists(destination):  # Never overwrite an earlier bad copy.
        destination = os.path.join(self.bad_directory, f"{name}.{suffix}")
        suffix += 1
      if jax.process_index() == 0:
        os.rename(path, destination)
      logging.warning("Skipping checkpoint %s: %s. Moved it to %s (nothing is deleted).",
                      os.path.basename(path), why, destination)
      self.set_aside.append(destination)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("checkpoints moved aside")
    if unusable:  # The manager caches the step list: a new one sees the directory as is.
      self._manager.close()
      self._manager = ocp.CheckpointManager(self.directory, options=self._options)

  def wait(self) -> None:
    """Blocks until a background save has finished; records its files' sizes."""
    with files.disk_errors_as_oserror(self.directory):
      self._manager.wait_until_finished()
    for step in self._unrecorded:
      step_dir = os.path.join(self.directory, str(step))
      if jax.process_index() == 0 and os.path.isdir(step_dir):  # Not yet garbage-collected.
        _record_file_sizes(step_dir)
    self._unrecorded = []

  def close(self) -> None:
    """Finishes pending saves and releases the manager."""
    self.wait()
    with files.disk_errors_as_oserror(self.directory):
      self._manager.close()


def abstract_like(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying `shardings`, the restore target for Orbax."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def has_checkpoint(workdir: str) -> bool:
  """Whether `<workdir>/checkpoints` holds a finalized checkpoint (usable or not)."""
  return bool(ocp.utils.checkpoint_steps_paths(os.path.join(workdir, layout.CHECKPOINTS)))


def newest_complete_step(workdir: str) -> int | None:
  """The step of the newest complete, undamaged checkpoint in `workdir`, or None.

  Only file names and sizes are read (no arrays): cheap enough to ask before compiling.
  """
  directory = os.path.join(workdir, layout.CHECKPOINTS)
  if not has_checkpoint(workdir):
    return None
  steps = sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True)
  for step in steps:  # Finalised ones have bare step names; damaged ones are skipped.
    if checkpoint_problem(os.path.join(directory, str(step))) is None:
      return step
  return None


# Written beside the items of each checkpoint once its save has finished: every file's
# size, so that a file truncated later (a full disk, a copy cut short) is found before
# a restore reads it. A checkpoint without it (the run died first) is restored unchecked.


def save_params(directory: str, step: int, params: Any) -> str:
  """Writes a parameters-only checkpoint `<directory>/<step>/state` ({"params": params}).

  What --mode=average and --mode=import write: the other modes and config.init_from
  read it; it cannot resume training (no optimizer state). Every process writes its
  shards, synchronously. Returns the step's directory.

  SIGINT / SIGTERM wait until the save has ended and the manager is closed
  (`files.signals_deferred`): Orbax writes from threads of its own, which an
  interrupted main thread would leave writing into a folder its caller removes. A
  second signal stops at once (a save that hangs on a dead peer): the folder is left
  incomplete, never renamed into place, and removed by the next run.
  """
  with files.signals_deferred(left=f"the checkpoint being written in {directory} is "
                              "incomplete and is not used; the next run of the command "
                              "removes it"):
    manager = ocp.CheckpointManager(
        directory, options=ocp.CheckpointManagerOptions(create=True,
                                                        enable_async_checkpointing=False))
    try:
      manager.save(step, args=ocp.args.Composite(
          **{layout.STATE: ocp.args.StandardSave({"params": params})}))
    finally:
      manager.close()
  return os.path.join(directory, str(step))


def _record_file_sizes(step_dir: str) -> None:
  sizes = {}
  for item in (layout.STATE, layout.DATA):
    for folder, _, names in os.walk(os.path.join(step_dir, item)):
      for name in names:
        path = os.path.join(folder, name)
        sizes[os.path.relpath(path, step_dir)] = os.path.getsize(path)
  temporary = os.path.join(step_dir, layout.FILE_SIZES + ".tmp")
  with open(temporary, "w", encoding="utf-8") as f:
    json.dump(sizes, f, indent=0, sort_keys=True)
  os.replace(temporary, os.path.join(step_dir, layout.FILE_SIZES))


def checkpoint_problem(step_dir: str,
                       items: tuple[str, ...] = (layout.STATE,
                                                 layout.DATA)) -> tuple[str, str] | None:
  """(reason, detail) if a finalized checkpoint is visibly incomplete or corrupt, else None.

  Checks what can be checked without reading arrays: the `items` are there (commands
  that read only parameters need only "state"; an averaged run has no "data"), every
  JSON metadata file parses, and every file has the size recorded when the save
  finished. Other damage to array data shows only when it is read.
  """
  for item in items:
    if not os.path.isdir(os.path.join(step_dir, item)):
      return f"missing-{item}", f"its '{item}' item is missing"
  metadata = [os.path.join(step_dir, layout.FILE_SIZES),
              os.path.join(step_dir, "_CHECKPOINT_METADATA"),
              os.path.join(step_dir, layout.STATE, "_METADATA"),
              os.path.join(step_dir, layout.STATE, "_sharding")]
  for folder, suffix in ((os.path.join(step_dir, layout.STATE, "array_metadatas"), ""),
                         (os.path.join(step_dir, layout.DATA), ".json")):
    if os.path.isdir(folder):
      metadata += [os.path.join(folder, name) for name in sorted(os.listdir(folder))
                   if name.endswith(suffix)]
  for path in metadata:
    if not os.path.isfile(path):
      continue
    try:
      with open(path, encoding="utf-8") as f:
        json.load(f)
    except (OSError, ValueError) as e:
      return "bad-metadata", f"{os.path.relpath(path, step_dir)} is unreadable ({e})"
  if os.path.exists(os.path.join(step_dir, layout.FILE_SIZES)):
    with open(os.path.join(step_dir, layout.FILE_SIZES), encoding="utf-8") as f:
      recorded = json.load(f)
    for name, size in sorted(recorded.items()):
      path = os.path.join(step_dir, name)
      if not os.path.isfile(path):
        return "missing-file", f"{name} is missing"
      if os.path.getsize(path) != size:
        return "truncated", f"{name} has {os.path.getsize(path)} bytes, {size} when saved"
  return None


def _unusable_checkpoints(directory: str) -> list[tuple[str, str, str]]:
  """(path, name under checkpoints_bad, why) of each unfinished or visibly damaged step."""
  if not os.path.isdir(directory):
    return []
  finalized = {p.name for p in ocp.utils.checkpoint_steps_paths(directory)}
  unusable = []
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if not os.path.isdir(path):
      continue
    if name in finalized:
      problem = checkpoint_problem(path)
      if problem:
        unusable.append((path, f"{name}-{problem[0]}", problem[1]))
    elif name.isdigit() or ocp.utils.TMP_DIR_SUFFIX in name:
      step = name.split(".")[0]
      unusable.append((path, f"{step}-unfinished",
                       "its save never finished (the run stopped while writing it)"))
  return unusable


def _check_shapes(step_dir: str, step: int, abstract_state: Any) -> None:
  """Raises ConfigError if checkpoint `step` holds arrays of other shapes than the target.

  Reading the metadata may fail on a damaged checkpoint; that error propagates as is.
  """
  handler = ocp.PyTreeCheckpointHandler()
  try:
    metadata = handler.metadata(epath.Path(step_dir) / layout.STATE)
  finally:
    handler.close()
  tree = getattr(metadata, "tree", metadata)
  stored = sorted(tuple(x.shape) for x in jax.tree.leaves(tree))
  wanted = sorted(tuple(x.shape) for x in jax.tree.leaves(abstract_state))
  if stored != wanted:
    raise ConfigError(
        f"checkpoint {step} in {os.path.dirname(step_dir)} holds {len(stored)} arrays that do "
        f"not match the {len(wanted)} of this config's model and optimizer state (a changed "
        "model.* or optimizer.* key?). Resume with the run's config (its config.json), or "
        "start a new workdir with config.init_from to take over its parameters.")


def _check_process_count(step_dir: str, step: int) -> None:
  """Raises ConfigError if checkpoint `step` holds the data positions of another process count.

  Each process saves its own data-iterator position (`data/process_<i>-of-<n>.json`);
  a run with another number of processes has no position to resume from. That is a
  changed launch, not a damaged checkpoint: nothing is moved aside.
  """
  names = os.listdir(os.path.join(step_dir, layout.DATA))
  counts = {int(m.group(1)) for m in map(re.compile(r"process_\d+-of-(\d+)\.json$").match,
                                        names) if m}
  if counts and jax.process_count() not in counts:
    raise ConfigError(
        f"checkpoint {step} in {os.path.dirname(step_dir)} was written by "
        f"{', '.join(map(str, sorted(counts)))} processes and this run has "
        f"{jax.process_count()}: each process resumes its own position in the data. Resume "
        "with the same number of processes (the number of devices and the mesh may change), "
        "or start a new workdir with config.init_from to take over the parameters.")


def _all_processes_agree(ok: bool) -> bool:
  """True if `ok` on every process (so all of them skip the same checkpoint)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))
