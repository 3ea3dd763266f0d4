"""The device mesh and the logical-axis rules that map weights and batches onto it.

Every weight names its axes logically ("embed", "heads", ...); `config.mesh.rules`
maps those names to mesh axes ("data", "fsdp", "tensor", and the optional "expert").
Changing parallelism is a config change, never a code change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import logging as std_logging
import re
from typing import Any, Iterator, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer.config.errors import ConfigError

Rules = Sequence[tuple[str, Any]]


def mesh_shape(shape: Sequence[tuple[str, int]], num_devices: int) -> dict[str, int]:
  """Fills the one -1 in `shape` from the device count and checks the product."""
  sizes = dict(shape)
  fixed = int(np.prod([s for s in sizes.values() if s != -1]))
  for name, size in sizes.items():
    if size == -1:
      if num_devices % fixed:
        raise ConfigError(f"config.mesh.shape={tuple(shape)} is invalid: the fixed axes "
                          f"multiply to {fixed}, which does not divide {num_devices} devices")
      sizes[name] = num_devices // fixed
  if int(np.prod(list(sizes.values()))) != num_devices:
    raise ConfigError(f"config.mesh.shape={tuple(shape)} is invalid: it has "
                      f"{int(np.prod(list(sizes.values())))} slots for {num_devices} devices")
  return sizes


def device_grid(mesh_config: ml_collections.ConfigDict, devices: Sequence[Any],
                num_slices: int = 1) -> np.ndarray:
  """The devices laid out as `config.mesh.shape`, in the interconnect's order.

  `mesh_utils.create_device_mesh` maps every mesh axis onto whole sides of the TPU
  torus (GPU and CPU devices are reshaped as they come); with several slices the data
  axis spans them (`create_hybrid_device_mesh`, data parallel over the data-centre
  network). An axis that is no product of whole sides (8 on a 4x4x4 torus) would split
  a physical ring: that is allowed only with `config.mesh.allow_split_physical_axes`,
  since that axis's collectives then run on part of a ring.

  Raises:
    ConfigError: the product differs from the device count, the data axis does not
      split over the slices, or an axis does not map onto the torus.
  """
  names = tuple(name for name, _ in mesh_config.shape)
  sizes = mesh_shape(mesh_config.shape, len(devices))
  shape = [sizes[n] for n in names]
  # A run saved before the key existed reads as False, the behaviour it had then.
  split = bool(mesh_config.get("allow_split_physical_axes", False))
  if num_slices > 1 and sizes["data"] % num_slices:
    raise ConfigError(f"config.mesh.shape={tuple(mesh_config.shape)} gives data="
                      f"{sizes['data']}, which does not split over --num_slices={num_slices}:"
                      " the data axis spans the slices; make it a multiple of the slice count")
  try:
    if num_slices == 1:
      return mesh_utils.create_device_mesh(shape, devices=devices,
                                           allow_split_physical_axes=split)
    dcn = [num_slices if n == "data" else 1 for n in names]
    ici = [s // d for s, d in zip(shape, dcn)]
    return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices,
                                                allow_split_physical_axes=split)
  except (NotImplementedError, AssertionError, ValueError) as e:
    # mesh_utils' message names the axis index and the torus's remaining sides.
    reason = str(e).split(". ")[0].strip()
    index = re.search(r"logical_axis_index (\d+)", reason)
    if index and int(index.group(1)) < len(names):
      reason = reason.replace(index.group(0), f"axis {names[int(index.group(1))]!r}")
    laid = ", ".join(f"{n}={s}" for n, s in zip(names, shape))
    coords = [getattr(d, "coords", None) for d in devices]
    torus = ""
    if all(c is not None for c in coords):
      torus = " " + "x".join(str(max(c[i] for c in coords) + 1) for i in range(len(coords[0])))
    raise ConfigError(
        f"config.mesh.shape ({laid}) does not map onto the devices' torus{torus}: {reason}. "
        "Give every axis a product of whole torus sides, or set "
        "--config.mesh.allow_split_physical_axes=True to let an axis split a side "
        "(its collectives then use part of a ring)") from e


def make_mesh(mesh_config: ml_collections.ConfigDict,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the (data, fsdp, tensor[, expert, context]) mesh from `config.mesh.shape`.

  With all devices, `device_grid` orders them by the physical topology (TPU/GPU
  interconnect); an explicit subset (tests) is reshaped as given.
  """
  names = tuple(name for name, _ in mesh_config.shape)
  if devices is None:
    array = device_grid(mesh_config, jax.devices())
  else:
    sizes = mesh_shape(mesh_config.shape, len(devices))
    array = np.asarray(devices).reshape([sizes[n] for n in names])
  return Mesh(array, names)


def rules_of(mesh_config: ml_collections.ConfigDict,
             mesh: Mesh | None = None) -> tuple[tuple[str, Any], ...]:
  """The logical rules as hashable tuples (lists from a CLI override become tuples).

  A mesh axis the mesh lacks (the optional "expert") is dropped from every rule, so a
  three-axis mesh keeps working with the base rules. The axes are those of `mesh`
  when given (a mesh built by hand, or a run's saved config with a newer base), else
  those `mesh_config.shape` names.
  """
  present = (set(mesh.axis_names) if mesh is not None
             else {name for name, _ in mesh_config.shape})

  def kept(axes):
    if isinstance(axes, (tuple, list)):
      axes = tuple(a for a in axes if a in present)
      return axes or None
    return axes if axes in present else None

  return tuple((name, kept(axes)) for name, axes in mesh_config.rules)


def logical_to_shardings(logical_specs: Any, mesh: Mesh, rules: Rules) -> Any:
  """Maps a pytree of logical PartitionSpecs to NamedShardings on `mesh`."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """Sharding of any input array whose leading axis is the batch ([B], [B, L], ...)."""
  spec = nn.logical_to_mesh_axes(("batch",), rules)
  return NamedSharding(mesh, spec)


def data_parallel_size(mesh: Mesh, rules: Rules) -> int:
  """How many ways the batch axis is split."""
  spec = batch_sharding(mesh, rules).spec[0]
  axes = spec if isinstance(spec, tuple) else (spec,) if spec else ()
  return int(np.prod([mesh.shape[a] for a in axes]))


@dataclasses.dataclass(frozen=True)
class InputShard:
  """The share of every global batch one process reads: share `index` of `count`.

  Processes whose devices hold the same data shards (a tensor or context axis across
  them) read the same share; the others disjoint ones. `count` divides the
  data-parallel ways, and a process reads batch_size // count rows per batch.
  """

  index: int
  count: int
  rows: int = 0  # Rows of every global batch it reads: batch_size // count (batch_share).


def input_shard(mesh: Mesh, rules: Rules, process_index: int | None = None) -> InputShard:
  """Which share of the batch `process_index` (default: this process) reads on `mesh`.

  A process's share is the set of data shards (positions along the batch axes) its
  devices hold. Processes that hold the same set read the same rows; the global batch is
  the shares in order of their first data shard.

  Raises:
    ConfigError: two processes hold overlapping but different sets of data shards, or
      sets of different sizes: no process could read its rows on its own.
  """
  process_index = jax.process_index() if process_index is None else process_index
  ways = data_parallel_size(mesh, rules)
  # One row per data shard: each device's row index is the data shard it holds.
  index_map = batch_sharding(mesh, rules).devices_indices_map((ways,))
  held: dict[int, set[int]] = {}
  for device, (rows,) in index_map.items():
    held.setdefault(device.process_index, set()).update(range(*rows.indices(ways)))
  if process_index not in held:
    raise ConfigError(f"config.mesh.shape={tuple(mesh.shape.items())}: process "
                      f"{process_index} has no device in the mesh, so it has no rows to read")
  shares = sorted({frozenset(rows) for rows in held.values()}, key=min)
  for i, share in enumerate(shares):
    clash = next((other for other in shares[i + 1:]
                  if other & share or len(other) != len(share)), None)
    if clash is not None:
      first, second = (min(p for p, rows in held.items() if rows == s) for s in (share, clash))
      raise ConfigError(
          f"config.mesh.shape={tuple(mesh.shape.items())} cannot be fed: process {first}'s "
          f"devices hold data shards {sorted(share)} and process {second}'s {sorted(clash)}, "
          "neither the same rows nor disjoint ones of equal size; order mesh.shape so that "
          "each process's devices hold whole data shards (the batch axes outermost)")
  return InputShard(index=shares.index(frozenset(held[process_index])), count=len(shares))


def replicated(mesh: Mesh) -> NamedSharding:
  """Fully replicated sharding on `mesh`."""
  return NamedSharding(mesh, PartitionSpec())


def place_batch(local_batch: dict[str, np.ndarray], placement: NamedSharding,
                shard: InputShard, row_axis: int = 0) -> dict[str, jax.Array]:
  """The global batch from this process's rows (its `shard` of every global batch).

  `placement`: the batch's sharding; `row_axis`: the axis of rows (1 for consecutive
  batches stacked on a leading axis). Evaluation, training and benchmarks
  (transformer/evaluation/) place their batches through here.
  """
  if jax.process_count() == 1:
    # This process's rows are the whole batch: one device_put of the dict (half the
    # host time of an array-by-array assembly, which the next step's compute shares
    # the cores with on a CPU).
    return jax.device_put(local_batch, placement)
  # The global shape is given, never inferred: processes that read the same share
  # (a tensor or context axis across them) hold the same rows, not more of them.

  def global_shape(v: np.ndarray) -> tuple[int, ...]:
    shape = list(v.shape)
    shape[row_axis] *= shard.count
    return tuple(shape)

  return {k: jax.make_array_from_process_local_data(placement, v, global_shape(v))
          for k, v in local_batch.items()}


# Logical axis -> the model.* field whose size it is, for the divisibility message.
_FIELD_OF_AXIS = {"heads": "model.num_heads", "kv_heads": "model.num_kv_heads",
                  "mlp": "model.mlp_dim", "embed": "model.d_model",
                  "vocab": "model.vocab_size", "head_dim": "model.head_dim",
                  "layers": "model.num_layers", "expert": "model.num_experts",
                  "length": "model.max_len", "lora": "model.lora_rank"}


def check_divisible(boxed_params: Any, mesh: Mesh, rules: Rules) -> None:
  """Every sharded weight dimension splits evenly over its mesh axes; else names the field.

  The one divisibility check: every mode that places parameters on a mesh (training's
  Trainer.create, the modes that load a run, --mode=compile) runs it before anything
  compiles, instead of jax's IndivisibleError traceback.

  Args:
    boxed_params: the parameters as `jax.eval_shape(model.init)` gives them (boxed with
      their logical axis names).
    mesh: the mesh they go on.
    rules: the logical rules (`rules_of`).

  Raises:
    ConfigError: naming the model field, its value, the logical axis, the mesh axes
      and their size.
  """
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  for path, box in jax.tree_util.tree_flatten_with_path(boxed_params, is_leaf=is_box)[0]:
    if not is_box(box):
      continue
    shape = box.value.shape
    for dim, name in zip(shape, box.names):
      axes = nn.logical_to_mesh_axes((name,), rules)[0] if name else None
      axes = axes if isinstance(axes, tuple) else (axes,) if axes else ()
      ways = int(np.prod([mesh.shape[a] for a in axes]))
      if dim % ways:
        field = _FIELD_OF_AXIS.get(name, f"the {name!r} dimension")
        raise ConfigError(
            f"{field}={dim} does not divide over mesh axes {axes} of size {ways} (logical "
            f"axis {name!r} of parameter {_path_name(path)}, shape {tuple(shape)}, mesh "
            f"{dict(mesh.shape)}); pick sizes that divide, or change config.mesh.shape / "
            "config.mesh.rules")


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _nbytes(shape, dtype, sharding=None) -> int:
  shape = sharding.shard_shape(shape) if sharding is not None else shape
  return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def sharding_report(boxed_params: Any, param_shardings: Any, abstract_opt_state: Any,
                    opt_shardings: Any) -> tuple[list[str], dict[str, float]]:
  """A compact table of every parameter's logical axes and mesh spec, plus byte counts.

  Repeated layers (`block_0`, `block_1`, ...) collapse into one `block_*` row.

  Returns:
    (lines of the table, stats): stats has total and per-device bytes of the
    parameters and the optimizer state, and the fraction of parameter bytes that
    is not sharded at all (`replicated_fraction`).
  """
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  boxes = jax.tree_util.tree_flatten_with_path(boxed_params, is_leaf=is_box)[0]
  shardings = jax.tree.leaves(param_shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  rows: dict[tuple, int] = {}
  total = per_device = replicated = 0
  for (path, box), shard in zip(boxes, shardings):
    value = box.value if is_box(box) else box
    names = tuple(box.names) if is_box(box) else ()
    nbytes, local = _nbytes(value.shape, value.dtype), _nbytes(value.shape, value.dtype, shard)
    total, per_device = total + nbytes, per_device + local
    replicated += nbytes if local == nbytes else 0
    name = _path_name(path)
    key = (re.sub(r"block_\d+", "block_*", name), value.shape, names, tuple(shard.spec))
    rows[key] = rows.get(key, 0) + 1
  opt_leaves = jax.tree.leaves(abstract_opt_state)
  opt_sh = jax.tree.leaves(opt_shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  opt_total = sum(_nbytes(x.shape, x.dtype) for x in opt_leaves)
  opt_local = sum(_nbytes(x.shape, x.dtype, s) for x, s in zip(opt_leaves, opt_sh))

  width = max(len(k[0]) for k in rows) + 4
  lines = [f"{'parameter':<{width}} {'shape':<18} {'logical axes':<34} mesh spec"]
  for (name, shape, names, spec), count in rows.items():
    label = f"{name} x{count}" if count > 1 else name
    lines.append(f"{label:<{width}} {str(tuple(shape)):<18} "
                 f"{str(names):<34} {spec}")
  mib = 2 ** 20
  lines.append(f"parameters: {total / mib:.1f} MiB total, {per_device / mib:.1f} MiB per device; "
               f"optimizer state: {opt_total / mib:.1f} MiB total, "
               f"{opt_local / mib:.1f} MiB per device")
  stats = dict(param_bytes=total, param_bytes_per_device=per_device,
               opt_bytes=opt_total, opt_bytes_per_device=opt_local,
               replicated_fraction=replicated / max(total, 1))
  return lines, stats


# Depth of `tables_off_the_console` blocks: models built only to be measured.
_QUIET_TABLES = [0]


@contextlib.contextmanager
def tables_off_the_console() -> Iterator[None]:
  """Sharding tables of the models built in the block go to the log file only.

  For models a command builds besides the one it reports on: --mode=compile's depth
  probes and lever / mesh-search trials (each printed its table, three tables on a
  one-device mesh for one compile).
  """
  _QUIET_TABLES[0] += 1
  try:
    yield
  finally:
    _QUIET_TABLES[0] -= 1


def log_sharding_report(boxed_params: Any, param_shardings: Any, abstract_opt_state: Any,
                        opt_shardings: Any, mesh: Mesh) -> dict[str, float]:
  """Logs the sharding table; warns when fsdp > 1 leaves over 2% of parameter bytes whole.

  With every mesh axis 1 (one device) the table shows nothing split: where a log file
  keeps it (the workdir's log.txt), it goes there only, and the console gets one line
  naming the file. With no log file it stays on the console, as with an axis > 1.
  Inside `tables_off_the_console` it goes to the log file only, without a line.
  """
  lines, stats = sharding_report(boxed_params, param_shardings, abstract_opt_state,
                                 opt_shardings)
  split = any(size > 1 for size in mesh.shape.values())
  # (pytest's logging plugin holds one on os.devnull.)
  log_files = [handler.baseFilename for handler in std_logging.getLogger().handlers
               if isinstance(handler, std_logging.FileHandler)
               and handler.baseFilename != os.devnull]
  quiet = _QUIET_TABLES[0] > 0
  on_console = (split or not log_files) and not quiet
  logging.info("Parameter sharding on mesh %s:\n%s", dict(mesh.shape), "\n".join(lines),
               extra={"console": on_console})
  if not on_console and not quiet:
    logging.info("Parameter sharding: every mesh axis is 1 (%s), nothing is split; the "
                 "table is in %s", dict(mesh.shape), log_files[0])
  if mesh.shape.get("fsdp", 1) > 1 and stats["replicated_fraction"] > 0.02:
    logging.warning(
        "fsdp=%d but %.1f%% of parameter bytes are replicated on every device; check "
        "config.mesh.rules (e.g. map 'embed' to 'fsdp') and that sharded dims divide "
        "the mesh.", mesh.shape["fsdp"], 100 * stats["replicated_fraction"])
  return stats
