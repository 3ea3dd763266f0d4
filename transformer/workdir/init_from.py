"""`config.init_from` (pretrain -> fine-tune): parameters matched by path, read into a new model.

`load_params` reads only the parameters another run's checkpoint shares with the new
model (shapes checked from the checkpoint's metadata before any array is read);
`merge_params` lays them over the freshly initialised ones. `flat_paths` and
`path_names` are the path vocabulary averaging.py shares.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from flax import traverse_util

from transformer.config.errors import ConfigError
from transformer.workdir import layout

_INIT_FROM_EXPECTED = ("expected a run's workdir (its newest checkpoint under "
                       "<workdir>/checkpoints/ is used) or one checkpoint directory "
                       "<workdir>/checkpoints/<step> holding a 'state' item")


@dataclasses.dataclass(frozen=True)
class ParamMatch:
  """How a source checkpoint's parameters pair up with a new model's, by path."""

  loaded: tuple[str, ...]  # In both: the new model takes the stored value.
  new: tuple[str, ...]  # Only in the new model: keeps its initialisation.
  dropped: tuple[str, ...]  # Only in the checkpoint: ignored.
  loaded_values: int  # Scalars in the loaded parameters.
  notes: tuple[str, ...] = ()  # Lines on how values were carried (layout, LoRA).

  def summary(self) -> str:
    """Readable lines: per section, the parameters grouped by top-level module."""
    lines = [f"{len(self.loaded)} parameters loaded ({self.loaded_values:,} values), "
             f"{len(self.new)} new (initialised), {len(self.dropped)} dropped "
             "(only in the checkpoint)"]
    for label, paths in (("loaded", self.loaded), ("new", self.new),
                         ("dropped", self.dropped)):
      # Loaded parameters are the expected bulk: counts suffice. New and dropped ones
      # are the surprises worth reading name by name.
      lines.append(f"  {label + ':':9}{_by_module(paths, names=label != 'loaded')}")
    lines.extend(f"  {note}" for note in self.notes)
    return "\n".join(lines)


def _by_module(paths: tuple[str, ...], names: bool) -> str:
  """Paths grouped by top-level module, "block_0 (16); lm_head (1)"; `names` lists them."""
  groups = collections.defaultdict(list)
  for path in paths:
    module, _, rest = path.partition("/")
    groups[module].append(rest)  # "" for a top-level parameter such as mlm_bias.
  if not groups:
    return "(none)"
  return "; ".join(
      f"{module} ({len(rests)})" + (": " + ", ".join(rests) if names and any(rests) else "")
      for module, rests in sorted(groups.items()))


def _keys(path: tuple) -> tuple[str, ...]:
  """A jax tree path as plain strings: ("block_0", "mlp", "wi", "kernel")."""
  return tuple(str(getattr(k, "key", k)) for k in path)


def flat_paths(tree: Any) -> dict[tuple[str, ...], Any]:
  """{(module, ..., name): leaf} for a nested-dict parameter tree."""
  return {_keys(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def path_names(paths) -> tuple[str, ...]:
  """Sorted "module/.../name" strings, the form the log and errors use."""
  return tuple(sorted("/".join(p) for p in paths))


def _dtype_kind(dtype: Any) -> str:
  """Float widths convert into each other on restore; kinds (int vs float) do not."""
  for kind in (jnp.bool_, jnp.integer, jnp.floating, jnp.complexfloating):
    if jnp.issubdtype(dtype, kind):
      return kind.__name__
  return str(dtype)


def mismatch(path: tuple[str, ...], target: Any, source: Any) -> str | None:
  """"<path> is <shape> <dtype> in the checkpoint but ... in this model" when the two
  leaves (`.shape`, `.dtype`) differ in shape or dtype kind (int vs float), else None."""
  if (tuple(target.shape) == tuple(source.shape)
      and _dtype_kind(target.dtype) == _dtype_kind(source.dtype)):
    return None
  return (f"{'/'.join(path)} is {tuple(source.shape)} {source.dtype} in the checkpoint "
          f"but {tuple(target.shape)} {target.dtype} in this model")


def shape_mismatches(target: Any, source: Any) -> list[str]:
  """`mismatch`'s line for each path both trees hold whose leaves differ; [] when every
  one fits."""
  target_flat, source_flat = flat_paths(target), flat_paths(source)
  found = (mismatch(path, t, source_flat[path]) for path, t in target_flat.items()
           if path in source_flat)
  return [line for line in found if line]


def match_params(target: Any, source: Any, init_from: str = "") -> ParamMatch:
  """Pairs the new model's parameters with a checkpoint's by path (a pure function).

  Args:
    target: the new model's parameter tree; leaves have `.shape` and `.dtype`
      (arrays or jax.ShapeDtypeStructs).
    source: the checkpoint's parameter tree, leaves likewise (e.g. Orbax metadata).
    init_from: the `config.init_from` value, for error messages.

  Returns:
    Which paths are loaded (in both), new (only in target), dropped (only in source).

  Raises:
    ConfigError: a shared path differs in shape or in dtype kind (int vs float),
      naming the path and both shapes; or no path is shared at all.
  """
  target_flat, source_flat = flat_paths(target), flat_paths(source)
  shared = [p for p in target_flat if p in source_flat]
  mismatches = shape_mismatches(target, source)
  if mismatches:
    raise ConfigError(
        f"config.init_from={init_from!r} is invalid: parameters with the same path must "
        f"have the same shape, and {len(mismatches)} differ: " + "; ".join(mismatches) +
        ". Set the model.* fields these depend on as in the source run.")
  if not shared:
    raise nothing_shared(init_from, target_flat, source_flat)
  return ParamMatch(
      loaded=path_names(shared),
      new=path_names(p for p in target_flat if p not in source_flat),
      dropped=path_names(p for p in source_flat if p not in target_flat),
      loaded_values=sum(math.prod(target_flat[p].shape) for p in shared))


def nothing_shared(init_from: str, target: Any, source: Any) -> ConfigError:
  """The error for a checkpoint that shares no parameter path with the model (`target`,
  `source`: their paths, tuples)."""
  return ConfigError(
      f"config.init_from={init_from!r} is invalid: the checkpoint shares no parameter "
      f"path with this model (checkpoint: {_by_module(path_names(source), False)}; "
      f"model: {_by_module(path_names(target), False)}); expected a run of the same "
      "architecture.")


def merge_params(params: Any, loaded: Any) -> Any:
  """`params` with every leaf that `loaded` (a subtree, same paths) holds replaced.

  Args:
    params: the new model's initialised parameter tree.
    loaded: nested dicts holding some of `params`'s paths (from `load_params`).

  Returns:
    A tree with `params`'s structure: loaded values where present, else initialised.
  """
  flat_loaded = flat_paths(loaded)
  unknown = set(flat_loaded) - set(flat_paths(params))
  if unknown:
    raise ValueError(f"loaded parameters not in the model: {path_names(unknown)}")
  return jax.tree_util.tree_map_with_path(
      lambda path, x: flat_loaded.get(_keys(path), x), params)


def _state_directory(init_from: str) -> epath.Path:
  """The `state` item of the checkpoint `config.init_from` names."""
  def fail(problem: str):
    raise ConfigError(f"config.init_from={init_from!r} is invalid: {problem}; "
                      f"{_INIT_FROM_EXPECTED}.")

  root = epath.Path(os.path.abspath(init_from))
  if not root.is_dir():
    fail(f"{root} is not a directory")
  if (root / layout.CHECKPOINTS).is_dir():
    # Finalised steps only: a save still in flight (or killed) has a temporary name.
    steps = ocp.utils.checkpoint_steps_paths(root / layout.CHECKPOINTS)
    if not steps:
      fail(f"{root / 'checkpoints'} holds no complete checkpoint")
    newest = max(steps, key=lambda p: ocp.utils.step_from_checkpoint_name(p.name))
    if not (newest / layout.STATE).is_dir():
      fail(f"its newest checkpoint {newest} has no 'state' item")
    return newest / layout.STATE
  if not (root / layout.STATE).is_dir():
    fail(f"{root} has neither a checkpoints/ folder nor a 'state' item")
  return root / layout.STATE


def _stored_params(init_from: str) -> tuple[epath.Path, Any]:
  """The checkpoint's `state` item and its parameters' metadata (shapes, dtypes; no array)."""
  state_dir = _state_directory(init_from)
  handler = ocp.PyTreeCheckpointHandler()
  try:
    metadata = handler.metadata(state_dir)
  finally:
    handler.close()
  if "params" not in metadata:
    raise ConfigError(f"config.init_from={init_from!r} is invalid: {state_dir} has no "
                      f"'params' (it holds {sorted(metadata)}); {_INIT_FROM_EXPECTED}.")
  return state_dir, metadata["params"]


def source_params(init_from: str) -> Any:
  """The parameter tree `config.init_from`'s checkpoint holds, as metadata (`.shape`,
  `.dtype`): what a check before the workdir is created compares against.

  Raises:
    ConfigError: the path holds no checkpoint with parameters.
  """
  return _stored_params(init_from)[1]


def load_params(init_from: str, abstract_params: Any) -> tuple[Any, ParamMatch]:
  """Reads the parameters a checkpoint shares with a new model, into its shardings.

  Only the `params` subtree is read, and of it only the paths the new model has:
  the checkpoint's metadata gives its parameter tree, so shapes are checked before
  any array is read, and each array is restored straight into the sharding and
  dtype of its target (no full copy on one host).

  Args:
    init_from: `config.init_from`: a run's workdir (its newest checkpoint is used)
      or one checkpoint directory `<workdir>/checkpoints/<step>`.
    abstract_params: the new model's parameters as jax.ShapeDtypeStructs carrying
      shardings (`Trainer.abstract_state.params`).

  Returns:
    (loaded, match): `loaded` holds the shared paths as nested dicts of arrays, to
    lay over the initialised parameters with `merge_params`; `match` lists what was
    loaded, new and dropped.

  Raises:
    ConfigError: the path holds no checkpoint, or a shared parameter's shape differs.
  """
  _, stored = _stored_params(init_from)
  match = match_params(abstract_params, stored, init_from)
  loaded = set(match.loaded)
  restored = restore_params(init_from, {
      path: target for path, target in flat_paths(abstract_params).items()
      if "/".join(path) in loaded}, match.summary())
  return traverse_util.unflatten_dict(restored), match


def restore_params(init_from: str, targets: dict[tuple[str, ...], Any],
                   summary: str) -> dict[tuple[str, ...], Any]:
  """Reads the checkpoint's parameters at `targets`' paths, each into its target.

  Args:
    init_from: `config.init_from` (a run's workdir or one of its checkpoint directories).
    targets: {path in the checkpoint's params: jax.ShapeDtypeStruct with a sharding}:
      each array is read straight into that dtype and sharding (no full copy on one
      host); the checkpoint's other parameters are not read.
    summary: what is loaded, logged with the checkpoint's directory.

  Returns:
    {path: array}, `targets`' paths.
  """
  state_dir = _state_directory(init_from)
  # The restore target: these paths only, as nested dicts under "params"; with
  # partial_restore Orbax skips everything else the checkpoint holds.
  item = {"params": traverse_util.unflatten_dict(targets)}
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
    restored = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
        partial_restore=True))
  logging.info("config.init_from=%r: parameters from %s\n%s", init_from, state_dir,
               summary)
  return traverse_util.flatten_dict(restored["params"])
