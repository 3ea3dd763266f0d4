"""Checkpoint averaging (`--mode=average`, evaluate's `--average`): the mean of several
checkpoints' parameters, read one checkpoint at a time into the model's shardings.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from transformer.config.errors import ConfigError
from transformer.workdir import progress
from transformer.workdir.init_from import flat_paths, path_names

def _restore_all_params(state_dir: str, abstract_params: Any, model_source: str) -> Any:
  """Every parameter of one checkpoint's `state` item, into `abstract_params`'s shardings."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    metadata = handler.metadata(epath.Path(state_dir))
  finally:
    handler.close()
  if "params" not in metadata:
    raise ConfigError(f"{state_dir} holds no 'params' (it has {sorted(metadata)}); expected "
                      "the 'state' item of a checkpoint written by training or averaging")
  stored, wanted = flat_paths(metadata["params"]), flat_paths(abstract_params)
  problems = [f"{'/'.join(p)} is {tuple(stored[p].shape)} in the checkpoint but "
              f"{tuple(wanted[p].shape)} in the model"
              for p in wanted if p in stored and tuple(stored[p].shape) != tuple(wanted[p].shape)]
  missing, extra = path_names(set(wanted) - set(stored)), path_names(set(stored) - set(wanted))
  if missing:
    problems.append(f"missing from the checkpoint: {', '.join(missing)}")
  if extra:
    problems.append(f"not in the model: {', '.join(extra)}")
  if problems:
    raise ConfigError(f"the checkpoint {state_dir} does not match the model of {model_source}: "
                      + "; ".join(problems) + ". Were config.json or the checkpoints replaced?")
  item = {"params": abstract_params}
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
    restored = checkpointer.restore(epath.Path(state_dir), args=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
        partial_restore=True))  # The optimizer state and the step are never read.
  return restored["params"]


def average_params(state_dirs: list[str], abstract_params: Any, model_source: str,
                   transform: Callable[[Any], Any] | None = None,
                   result_params: Any = None) -> Any:
  """The element-wise mean of the parameters of several checkpoints (one: as stored).

  Checkpoint averaging as in the paper (the last 5 checkpoints for the base model,
  20 for big). Only the `params` of each checkpoint are read, one checkpoint at a
  time, straight into the target shardings; the sum is kept in float32, so memory
  holds two copies of the parameters whatever the number of checkpoints.

  Args:
    state_dirs: the `state` items to average, `<workdir>/checkpoints/<step>/state`.
    abstract_params: the model's parameters as jax.ShapeDtypeStructs with shardings
      (`Trainer.abstract_state.params`); the result has their dtypes and shardings.
    model_source: where the model's shapes come from (e.g. the config.json), for errors.
    transform: applied to each checkpoint's parameters before they are summed (a LoRA
      run's adapters merged into their kernels: the mean of the products A . B is not
      the product of the means); None: the parameters as stored.
    result_params: the abstract tree the mean has (dtypes), when `transform` changes
      the tree; None: `abstract_params`.

  Returns:
    The mean parameter tree.

  Raises:
    ConfigError: a checkpoint lacks parameters or its paths or shapes differ from the model's.
  """
  if not state_dirs:
    raise ValueError("average_params needs at least one checkpoint")
  total = None
  reading = progress.Progress("averaging", len(state_dirs), "checkpoints")
  for state_dir in state_dirs:
    params = _restore_all_params(state_dir, abstract_params, model_source)
    if transform is not None:
      params = transform(params)
    if len(state_dirs) == 1:
      return params
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    total = params if total is None else jax.tree.map(jnp.add, total, params)
    reading.update()
  reading.finish()
  logging.info("Averaged the parameters of %d checkpoints: %s", len(state_dirs),
               ", ".join(str(d) for d in state_dirs))
  return jax.tree.map(lambda t, a: (t / len(state_dirs)).astype(a.dtype), total,
                      abstract_params if result_params is None else result_params)
