"""Which of init_from's stored values each parameter of the new model takes, and how.

`plan` pairs the source checkpoint's parameters with the new model's under the names
the unrolled model gives them (model/layers.py's `unrolled_view`), so a scanned model
and a per-layer one of the same shape pair up whichever way round: the stored
per-layer leaves are stacked, or a stored stack is split, into the new model's layout.
LoRA adapters keep the function the source computed with them:
  - an adapter this model has too, of the same rank, continues from the source's, its
    B scaled by (source alpha / r) / (this run's alpha / r) when the two differ;
  - an adapter this model has without one, or with one of another rank, is folded into
    its kernel with the source's alpha / r (this model's own adapter there, if any,
    starts at B = 0, adding nothing);
  - this model's adapters that the source lacks start at B = 0.
So the new model's step-0 logits are the source's for every LoRA difference (rank,
alpha, targets) and either layout. Untying a tied source (model.tie_embeddings=False)
likewise starts lm_head/kernel as the source's embedding, transposed.

What may differ without `config.init_from_partial` (a presence or shape the source
does not have): only what the task keys make (model.head, pooling, num_classes: a new
head is initialised, the source's head is dropped), found by tracing the model once
more with the source's task keys, and LoRA adapters (above). Any other parameter new,
dropped or of another shape is refused in one line naming the model.* keys; with the
flag it is initialised (or dropped) and the log says so. A scanned stack is one array
for all its layers, so it is read whole or not at all: part loaded is refused.

`load` reads what the plan needs in the checkpoint's own layout, each array straight
into a sharding derived from its target's, then one jitted program folds adapters,
scales B and stacks or splits layers into the new model's shardings (skipped when the
stored arrays are the new model's as they are).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from transformer.config.errors import ConfigError
from transformer.config.model import RUN_FIELDS
from transformer.model import layers
from transformer.model import lora
from transformer.workdir import init_from as init_from_lib

Path = tuple[str, ...]
# The model.* keys a fine-tuning run chooses as its task: a new head may be new and the
# source's head dropped because of them (training/fine_tune.py keeps them this run's).
TASK_FIELDS = ("head", "pooling", "num_classes", "objective", "prefix_attention")


@dataclasses.dataclass(frozen=True)
class Plan:
  """How the new model's parameters come from the source checkpoint's."""

  match: init_from_lib.ParamMatch  # Under the unrolled model's names.
  # Each loaded parameter of the new model (its own layout): the stored pieces it is
  # made of, in layer order, and whether it is a stack of them (a scanned leaf).
  sources: dict[Path, tuple[layers.LayerPiece, ...]]
  stacked: frozenset[Path]
  merges: tuple[Path, ...]  # Stored modules whose adapters fold into their kernel.
  rescale: dict[Path, float]  # Stored lora_b leaves and their factor.
  factor: float  # The source's alpha / r (merges).
  transposed: frozenset[Path] = frozenset()  # An untied lm_head from a tied embedding.

  def direct(self, stored: dict[Path, Any]) -> bool:
    """Whether the stored leaves are the new model's as they are (no program needed)."""
    return not self.merges and not self.rescale and not self.transposed and all(
        _whole(path, pieces, path in self.stacked, stored)
        for path, pieces in self.sources.items())


def _whole(path: Path, pieces: tuple[layers.LayerPiece, ...], stacked: bool,
           stored: dict[Path, Any]) -> bool:
  """Whether `path`'s value is the stored leaf of the same path, untouched."""
  if not stacked:
    return pieces[0].path == path and pieces[0].index is None
  return (all(p.path == path for p in pieces)
          and [p.index for p in pieces] == list(range(len(pieces)))
          and stored[path].shape[0] == len(pieces))


def _view(flat: dict[Path, Any]) -> dict[Path, layers.LayerPiece]:
  return layers.unrolled_view({path: tuple(leaf.shape) for path, leaf in flat.items()})


def _adapters(target: dict, source: dict) -> tuple[set[Path], set[Path]]:
  """(modules whose adapters continue, modules whose source adapters fold into the
  kernel), as unrolled module paths."""
  continued, merged = set(), set()
  for path in source:
    if path[-1] != "lora_a":
      continue
    module = path[:-1]
    pair = [module + (name,) for name in lora.ADAPTER_NAMES]
    if all(p in target and target[p].shape == source[p].shape for p in pair):
      continued.add(module)
    elif module + ("kernel",) in target and module + ("kernel",) in source:
      merged.add(module)
  return continued, merged


def plan(config: ml_collections.ConfigDict, source: ml_collections.ConfigDict,
         target: dict[Path, Any], stored: dict[Path, Any],
         task_params: Callable[[], Any]) -> Plan:
  """Pairs the new model's parameters with the checkpoint's (names and shapes only).

  Args:
    config: this run's config (model.*, init_from, init_from_partial).
    source: the source run's model.* ConfigDict (its LoRA scale, keys for errors).
    target: the new model's flat parameters ({path: leaf with .shape, .dtype}).
    stored: the checkpoint's flat parameters (Orbax metadata).
    task_params: returns this model's parameters traced with the source's task keys
      (called only when they differ from this run's).

  Raises:
    ConfigError: in one line, naming the model.* keys: parameters of another shape, or
      new or dropped beyond the task's head and LoRA adapters (without
      config.init_from_partial); a scanned stack only partly in the source; no
      parameter shared.
  """
  t_view, s_view = _view(target), _view(stored)
  leaf = lambda view, flat, p: jax.ShapeDtypeStruct(view[p].shape, flat[view[p].path].dtype)
  continued, merged = _adapters(t_view, s_view)
  shared = [p for p in t_view if p in s_view
            and (not lora.is_adapter(p) or p[:-1] in continued)]
  bad = {p: line for p in shared if (line := init_from_lib.mismatch(
      p, leaf(t_view, target, p), leaf(s_view, stored, p)))}
  loaded = [p for p in shared if p not in bad]
  merged = {m for m in merged if m + ("kernel",) not in bad}
  untied = _untied(config, source, t_view, s_view, set(loaded))
  loaded += list(untied)
  new = [p for p in t_view if p not in loaded]
  dropped = [p for p in s_view if p not in t_view and not (
      lora.is_adapter(p) and p[:-1] in merged)]
  unexplained = _beyond_the_task(config, source, t_view, s_view, task_params, new, dropped,
                                 bad)
  if not config.init_from_partial:
    if unexplained[2]:
      _refuse(config, source, "change", f"the shape of {len(unexplained[2])} of them "
              f"(first: {bad[unexplained[2][0]]})", "start them from their initialisation")
    if unexplained[0] or unexplained[1]:
      _refuse(config, source, "leave", _presence(*unexplained[:2]), "start the new ones "
              "from their initialisation and drop the others")
  if not loaded:
    raise init_from_lib.nothing_shared(config.init_from, t_view, s_view)
  sources, stacked = _sources(config, t_view, s_view, set(loaded), untied)
  factor = lora.scale(source) if source.lora_rank else 1.0
  ratio = factor / lora.scale(config.model) if config.model.lora_rank else 1.0
  rescale = {s_view[m + ("lora_b",)].path: ratio for m in continued} if ratio != 1 else {}
  notes = _notes(config, sources, stacked, len(merged), len(continued) * bool(rescale),
                 factor, ratio, unexplained)
  notes += [f"untied: {'/'.join(p)} starts as the source's tied {'/'.join(e)}, transposed "
            "(model.tie_embeddings=False): the logits carry over" for p, e in untied.items()]
  match = init_from_lib.ParamMatch(
      loaded=init_from_lib.path_names(loaded), new=init_from_lib.path_names(new),
      dropped=init_from_lib.path_names(dropped),
      loaded_values=sum(math.prod(t_view[p].shape) for p in loaded), notes=tuple(notes))
  return Plan(match, sources, stacked,
              tuple(sorted({s_view[m + ("lora_a",)].path[:-1] for m in merged})),
              rescale, factor, frozenset(t_view[p].path for p in untied))


def _untied(config: ml_collections.ConfigDict, source: ml_collections.ConfigDict,
            t_view: dict, s_view: dict, loaded: set[Path]) -> dict[Path, Path]:
  """{this model's lm_head kernel: the source's token embedding} when this run unties a
  tied source's output projection: the kernel [E, V] is the embedding [V, E] transposed,
  the function the tied head computed."""
  if not source.tie_embeddings or config.model.tie_embeddings:
    return {}
  untied = {}
  for path in t_view:
    embedding = path[:-2] + ("embedder", "token_embed", "embedding")
    if (path[-2:] == ("lm_head", "kernel") and path not in s_view and embedding in loaded
        and t_view[path].shape == s_view[embedding].shape[::-1]):
      untied[path] = embedding
  return untied


def _beyond_the_task(config: ml_collections.ConfigDict, source: ml_collections.ConfigDict,
                     t_view: dict, s_view: dict, task_params: Callable[[], Any],
                     new: list[Path], dropped: list[Path],
                     bad: dict[Path, str]) -> tuple[list[Path], list[Path], list[Path]]:
  """(new, dropped, reshaped) parameters that neither the task keys nor LoRA explain.

  The model traced with the source's task keys has every parameter this model has
  apart from its head: a new parameter that model has too, a dropped one it lacks too,
  or a reshaped one it has in this model's shape, comes from another key.
  """
  task = t_view
  if any(config.model[k] != source[k] for k in TASK_FIELDS):
    try:
      task = _view(init_from_lib.flat_paths(task_params()))
    except (ConfigError, ValueError):  # The source's task is no task of this model
      pass  # (an MLM head on a decoder): nothing is the task's doing.
  return ([p for p in new if p not in bad and not lora.is_adapter(p) and p in task],
          [p for p in dropped if not lora.is_adapter(p) and p not in task],
          [p for p in bad if p not in task or task[p].shape != s_view[p].shape])


def _sources(config: ml_collections.ConfigDict, t_view: dict, s_view: dict,
             loaded: set[Path], untied: dict[Path, Path]
             ) -> tuple[dict[Path, tuple], frozenset[Path]]:
  """Plan.sources and Plan.stacked: each loaded leaf of the new model and its pieces
  (`untied`: a parameter taken from another path of the source)."""
  leaves: dict[Path, list[tuple[int, Path]]] = {}
  for path, piece in t_view.items():
    leaves.setdefault(piece.path, []).append((piece.index, path))
  sources, stacked = {}, set()
  for path, parts in leaves.items():
    taken = sum(p in loaded for _, p in parts)
    if not taken:
      continue
    if taken < len(parts):
      raise ConfigError(
          f"config.init_from={config.init_from!r}: this model stacks {len(parts)} layers "
          f"in {'/'.join(path)} (model.scan_layers=True) and only {taken} of them come from "
          "the source; a stacked parameter is loaded whole or not at all, so train with "
          "--config.model.scan_layers=False (init_from splits the source's layers) or "
          "with the source's model.num_layers")
    if parts[0][0] is not None:
      stacked.add(path)
      parts.sort()
    sources[path] = tuple(s_view[untied.get(p, p)] for _, p in parts)
  return sources, frozenset(stacked)


def _notes(config: ml_collections.ConfigDict, sources: dict, stacked: frozenset,
           merged: int, rescaled: int, factor: float, ratio: float,
           unexplained: tuple) -> list[str]:
  """The summary's lines on layouts converted, adapters folded or scaled, partial loads."""
  notes = []
  if any(p.index is not None for path in sources if path not in stacked
         for p in sources[path]):
    notes.append("layout: the source's scanned layers split into this model's per-layer "
                 "parameters (model.scan_layers=False)")
  if any(p.index is None for path in stacked for p in sources[path]):
    notes.append("layout: the source's per-layer parameters stacked into this model's "
                 "scanned layers (model.scan_layers=True)")
  if merged:
    notes.append(f"LoRA: {merged} of the source's adapters folded into their kernels with "
                 f"its alpha / r = {factor:g}: this model has no adapter there, or one of "
                 "another rank (which starts at B = 0)")
  if rescaled:
    notes.append(f"LoRA: {rescaled} adapters continue from the source's with B times "
                 f"{ratio:g} (the source's alpha / r = {factor:g}, this run's "
                 f"{factor / ratio:g}): they compute what the source's did")
  if config.init_from_partial and any(unexplained):
    notes.append(f"config.init_from_partial=True: {len(unexplained[0])} new, "
                 f"{len(unexplained[2])} reshaped (initialised) and {len(unexplained[1])} "
                 "dropped beyond a new head and LoRA adapters")
  return notes


def _presence(new: list[Path], dropped: list[Path]) -> str:
  """"which of them are new and dropped": the refusal's middle."""
  parts = []
  for paths, what in ((new, "of this model's parameters new (the source has no value for "
                       "them"), (dropped, "of the source's dropped (this model has no place "
                                 "for them")):
    if paths:
      parts.append(f"{len(paths)} {what}; first: {'/'.join(sorted(paths)[0])})")
  return " and ".join(parts) + ", beyond a new head and LoRA adapters"


def _refuse(config: ml_collections.ConfigDict, source: ml_collections.ConfigDict,
            verb: str, problem: str, partial: str) -> None:
  """The one-line refusal, naming the model.* keys that differ from the source's; `verb`
  ("change", "leave") is conjugated for them."""
  differ = _differing_keys(config.model, source)
  one = len(differ) == 1
  raise ConfigError(
      f"config.init_from={config.init_from!r} cannot carry its parameters into this model: "
      + (", ".join(differ) if differ else "its model.* keys")
      + f" {verb}{'s' if one else ''} {problem}; set {'it' if one else 'them'} as the "
      "source run has, train without init_from, or set --config.init_from_partial=True "
      f"to {partial}")


# model.* keys that never move a parameter (besides RUN_FIELDS): not named as a cause.
_NO_PARAMETER_PREFIXES = ("rope_", "lora_")
_NO_PARAMETER_FIELDS = ("never_predict",) + TASK_FIELDS


def _differing_keys(model: ml_collections.ConfigDict,
                    source: ml_collections.ConfigDict) -> list[str]:
  """"model.<field>=<value> (the source's <value>)" for each field that differs and may
  move a parameter (not RUN_FIELDS, RoPE, LoRA or the task keys)."""
  return [f"model.{field}={model[field]!r} (the source's {source[field]!r})"
          for field in sorted(source) if field in model and model[field] != source[field]
          and field not in RUN_FIELDS and field not in _NO_PARAMETER_FIELDS
          and not field.startswith(_NO_PARAMETER_PREFIXES)]


# ---------------------------------------------------------------- reading


def load(init_from: str, the_plan: Plan, stored: dict[Path, Any],
         abstract: dict[Path, Any]) -> dict:
  """The plan's values, read and placed as the new model's parameters.

  Args:
    init_from: config.init_from.
    the_plan: `plan`'s result.
    stored: the checkpoint's flat parameter metadata.
    abstract: the new model's flat parameters as jax.ShapeDtypeStructs with shardings.

  Returns:
    The loaded parameters as nested dicts (the new model's layout and shardings), to
    lay over the initialised ones with `init_from.merge_params`.
  """
  targets = {}
  for path, pieces in the_plan.sources.items():
    if path in the_plan.transposed:  # Its embedding is read for the embedding itself.
      continue
    for piece in pieces:
      targets.setdefault(piece.path, jax.ShapeDtypeStruct(
          stored[piece.path].shape, abstract[path].dtype, sharding=_sharding(
              abstract[path].sharding, piece.index is not None, path in the_plan.stacked)))
  for module in the_plan.merges:  # Adapters are small: read whole on every device.
    kernel = targets[module + ("kernel",)].sharding
    whole = (NamedSharding(kernel.mesh, PartitionSpec())
             if isinstance(kernel, NamedSharding) else kernel)
    for name in lora.ADAPTER_NAMES:
      meta = stored[module + (name,)]
      targets[module + (name,)] = jax.ShapeDtypeStruct(meta.shape, meta.dtype, sharding=whole)
  restored = init_from_lib.restore_params(init_from, targets, the_plan.match.summary())
  if the_plan.direct(stored):
    return traverse_util.unflatten_dict(restored)

  def build(arrays: dict[Path, jax.Array]) -> dict[Path, jax.Array]:
    arrays = dict(arrays)
    for module in the_plan.merges:
      kernel = module + ("kernel",)
      a, b = (arrays.pop(module + (name,)) for name in lora.ADAPTER_NAMES)
      arrays[kernel] = lora.merged_kernel(arrays[kernel], a, b, the_plan.factor,
                                          xp=jnp).astype(arrays[kernel].dtype)
    for path, ratio in the_plan.rescale.items():
      arrays[path] = (arrays[path] * ratio).astype(arrays[path].dtype)
    out = {}
    for path, pieces in the_plan.sources.items():
      if _whole(path, pieces, path in the_plan.stacked, stored):
        out[path] = arrays[path]
        continue
      parts = [arrays[p.path] if p.index is None else arrays[p.path][p.index] for p in pieces]
      out[path] = (jnp.stack(parts) if path in the_plan.stacked else
                   parts[0].T.astype(abstract[path].dtype) if path in the_plan.transposed
                   else parts[0])
    return out

  # One program, the stored arrays donated: the new layout takes their place instead of
  # doubling the parameters' memory.
  program = jax.jit(build, donate_argnums=0, out_shardings={
      path: abstract[path].sharding for path in the_plan.sources})
  with warnings.catch_warnings():  # A stack split into layers cannot reuse its buffer.
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    return traverse_util.unflatten_dict(program(restored))


def _sharding(target: Any, stored_stacked: bool, target_stacked: bool) -> Any:
  """The sharding to read a stored leaf into, from its target's: a layers axis added in
  front (a stored stack split for a per-layer model) or dropped (per-layer leaves
  stacked), unsharded."""
  if not isinstance(target, NamedSharding) or stored_stacked == target_stacked:
    return target
  spec = tuple(target.spec)
  spec = (None,) + spec if stored_stacked else spec[1:]
  return NamedSharding(target.mesh, PartitionSpec(*spec))
