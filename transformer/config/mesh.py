"""Validation of the mesh.* fields: the device mesh's axes and the logical-axis rules.

A step of `validation.validate`; sharding.py builds the mesh and the rules from
what it allows. LOGICAL_AXES is the vocabulary every weight and activation is
labelled with (model/), MESH_AXES the axes a mesh.shape must name.
"""

from __future__ import annotations

import ml_collections

from transformer.config import attention
from transformer.config.checks import is_int
from transformer.config.errors import fail

MESH_AXES = ("data", "fsdp", "tensor")
# Mesh axes a mesh.shape may leave out (a rule naming one maps to None then).
OPTIONAL_MESH_AXES = ("expert", "context")
LOGICAL_AXES = ("batch", "length", "activation_length", "embed", "heads", "kv_heads",
                "head_dim", "mlp", "vocab", "layers", "expert", "lora")


def validate_mesh(config: ml_collections.ConfigDict) -> None:
  """mesh.shape names each mesh axis once with a valid size; mesh.rules map known axes."""
  shape = config.mesh.shape
  # Shape first: ('data', 2) is what (("data", 2)) parses to (one pair, no outer tuple).
  pairs = isinstance(shape, (tuple, list)) and all(
      isinstance(axis, (tuple, list)) and len(axis) == 2 and isinstance(axis[0], str)
      and is_int(axis[1]) for axis in shape)
  if not pairs:
    fail("mesh.shape", shape, "expected a tuple of (name, size) pairs, one for each of "
          f"{MESH_AXES}, e.g. ((\"data\", -1), (\"fsdp\", 1), (\"tensor\", 1))")
  names = [axis[0] for axis in shape]
  optional = [n for n in names if n in OPTIONAL_MESH_AXES]
  if sorted(set(names) - set(optional)) != sorted(MESH_AXES) or len(set(names)) != len(names):
    fail("mesh.shape", shape, f"expected one (name, size) pair for each of {MESH_AXES}, "
          f"and optionally one for {OPTIONAL_MESH_AXES}")
  sizes = [axis[1] for axis in shape]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    fail("mesh.shape", shape, "sizes must be positive, with at most one -1")
  rules = config.mesh.rules
  if not (isinstance(rules, (tuple, list))
          and all(isinstance(r, (tuple, list)) and len(r) == 2 for r in rules)):
    fail("mesh.rules", rules, "expected a tuple of (logical axis, mesh axes) pairs")
  for logical, mesh_axes in rules:
    if logical not in LOGICAL_AXES:
      fail("mesh.rules", logical, f"logical axes are {LOGICAL_AXES}")
    targets = mesh_axes if isinstance(mesh_axes, (tuple, list)) else (mesh_axes,)
    for target in targets:
      if target is not None and target not in MESH_AXES + OPTIONAL_MESH_AXES:
        fail("mesh.rules", (logical, mesh_axes),
              f"mesh axes are {MESH_AXES + OPTIONAL_MESH_AXES} or None")


# The kernels a sequence sharded over "context" can run (model/attention_ops.py
# context_attention, context_splash_attention); "auto" picks one of them there.
CONTEXT_ATTENTION_IMPLS = ("auto",) + tuple(
    name for name, kernel in attention.KERNELS.items() if kernel.context)


def length_axes(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The mesh axes the first "length" rule names that mesh.shape has (model/context.py)."""
  present = {name for name, _ in config.mesh.shape}
  for logical, mesh_axes in config.mesh.rules:
    if logical == "length":
      targets = mesh_axes if isinstance(mesh_axes, (tuple, list)) else (mesh_axes,)
      return tuple(t for t in targets if t in present)
  return ()


def validate_context(config: ml_collections.ConfigDict) -> None:
  """Context parallelism (docs/scaling.md#context-parallelism): the sequence splits into
  2 chunks per shard, and attention can run on it; after validate_mesh."""
  sizes = dict(config.mesh.shape)
  context = sizes.get("context", 1)
  if context == -1:
    fail("mesh.shape", ("context", -1), "give the context axis a fixed size (e.g. "
         "(\"context\", 4)); -1 belongs on a batch axis such as data")
  axes = length_axes(config)
  if context > 1 and "context" not in axes:
    fail("mesh.rules", ("length", dict(config.mesh.rules).get("length")),
         f"mesh.shape has (\"context\", {context}) but no rule shards 'length' over it; "
         "add (\"length\", \"context\") (configs/base.py) or drop the axis")
  shards = 1
  for axis in axes:
    shards *= max(sizes.get(axis, 1), 1)
  seq_len = config.data.seq_len
  if shards > 1 and seq_len % (2 * shards):
    fail("data.seq_len", seq_len, f"must be a multiple of 2 x {shards} = {2 * shards}: "
         f"mesh.shape {tuple((a, sizes[a]) for a in axes)} cuts each sequence into "
         f"{shards} context shards of two chunks each (the zig-zag order); pick such a "
         "data.seq_len or a context size that divides it")
  impl = config.model.attention_impl
  if shards > 1 and impl not in CONTEXT_ATTENTION_IMPLS:
    fail("model.attention_impl", impl, f"cannot attend across {shards} context shards "
         f"(mesh.shape context={shards}); use one of {CONTEXT_ATTENTION_IMPLS}, or "
         "(\"context\", 1)")
  attention.validate_lengths(config, shards)  # Splash's blocks, per shard.
  for key, weights, logical in (("mlp_impl", "the MLP's weights", ("embed", "mlp")),
                                ("loss_head_impl", "the head's weight", ("vocab", "embed"))):
    if config.model[key] == "pallas":
      _validate_pallas(config, shards, key, weights, logical)


def _validate_pallas(config: ml_collections.ConfigDict, shards: int, key: str,
                     weights: str, logical: tuple[str, ...]) -> None:
  """model.<key>='pallas' (model/mlp_pallas.py, training/head_pallas.py) takes `weights`
  whole and the tokens merged: no mesh axis of size > 1 under the `logical` axes' rules,
  no context shards."""
  sizes = dict(config.mesh.shape)
  for name, mesh_axes in config.mesh.rules:
    targets = mesh_axes if isinstance(mesh_axes, (tuple, list)) else (mesh_axes,)
    split = [t for t in targets if name in logical and sizes.get(t, 1) > 1]
    if split:
      fail(f"model.{key}", "pallas", f"its kernels take {weights} whole, but mesh.rules "
           f"shard {name!r} over {split} (mesh.shape {tuple(config.mesh.shape)}); use "
           f"model.{key}='auto' (XLA's there) or 'xla'")
  if shards > 1:
    fail(f"model.{key}", "pallas", f"its kernels need a layer's tokens on one axis, but "
         f"the sequence is cut into {shards} context shards; use model.{key}='auto' "
         "or 'xla'")
