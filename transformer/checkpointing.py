"""Orbax checkpoints holding the train state and the data-iterator state together.

Layout: <workdir>/checkpoints/<step>/{state, data}. `state` is the sharded
TrainState (restored straight into its target shardings); `data` is the grain
iterator position of every process, so a resumed run sees exactly the batches
an uninterrupted run would have seen.
"""

from __future__ import annotations

import os
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging


class Checkpointer:
  """Saves and restores (train state, data iterator) pairs under `<workdir>/checkpoints`."""

  def __init__(self, workdir: str, checkpoint: ml_collections.ConfigDict):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=checkpoint.keep, create=True,
        enable_async_checkpointing=checkpoint.async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def save(self, step: int, state: Any, data_iterator: grain.DatasetIterator) -> None:
    """Starts saving `state` and the iterator position as checkpoint `step`.

    The iterator position is read synchronously here, so the caller may keep
    drawing batches while the arrays are written in the background.
    """
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iterator)), force=True)
    logging.info("Saving checkpoint %d to %s", step, self.directory)

  def restore(self, step: int, abstract_state: Any,
              data_iterator: grain.DatasetIterator) -> Any:
    """Restores checkpoint `step` into `abstract_state`'s shapes and shardings.

    The data iterator is moved to the saved position in place.
    """
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=grain.checkpoint.CheckpointRestore(data_iterator)))
    return restored["state"]

  def wait(self) -> None:
    """Blocks until a background save has finished."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Finishes pending saves and releases the manager."""
    self._manager.wait_until_finished()
    self._manager.close()


def abstract_like(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying `shardings`, the restore target for Orbax."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
