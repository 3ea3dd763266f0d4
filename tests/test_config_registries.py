"""Each choice key's valid values are one table: validation, the code and --mode=keys agree.

config/ is the ground of the package and may not import model/ or training/, so
where the implementing table holds their code (activation functions, architecture
classes, positions, norm placements and types, init families, sinusoidal layouts,
schedule builders, routers) validation keeps the names and this file holds
the two equal. REMAT_POLICIES is the table itself, read by every user. A new value
is one entry in the implementing table plus its name in config/: forgetting either
fails here, naming the key.

`ModelConfig` is generated from configs/base.py's model block; the tests below pin
that it has exactly those fields, each read from the config.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import typing

import jax
import pytest

from configs import base
from transformer.cli import keys
from transformer.config import data as data_config
from transformer.config import decode as decode_config
from transformer.config import model as model_config
from transformer.config import modern as modern_config
from transformer.config import moe as moe_config
from transformer.config import objective as objective_lib
from transformer.config import train as train_config
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.data.datasets import catalog
from transformer.model import initializers
from transformer.model import layers
from transformer.model import mlp
from transformer.model import models
from transformer.model import moe
from transformer.model import norms
from transformer.model import positions
from transformer.planning import search
from transformer.training import optim


def _rejected_listing(key: str) -> list[str]:
  """The valid values validation's message lists for `key` set to an unknown name."""
  config = base.get_config()
  *group, field = key.split(".")  # A top-level key (init_from_optimizer) has no group.
  (config[group[0]] if group else config)[field] = "no_such_value"
  with pytest.raises(ConfigError) as error:
    validate(config)
  message = str(error.value)
  assert message.startswith(f"config.{key}='no_such_value' is invalid: valid values are "), (
      message)
  return re.findall(r"'([^']*)'", message.split("valid values are ", 1)[1])


# (key, the names validation lists, the implementing table's names).
REGISTRIES = [
    ("model.remat", model_config.REMAT_POLICIES, tuple(layers.REMAT_POLICIES)),
    ("model.activation", model_config.ACTIVATIONS, tuple(mlp.ACTIVATION_FNS)),
    ("model.arch", model_config.ARCHS, tuple(models.ARCHITECTURES)),
    ("model.moe_router", moe_config.MOE_ROUTERS, tuple(moe.ROUTERS)),
    ("model.norm_type", model_config.NORM_TYPES, tuple(norms.NORM_TYPES)),
    ("model.position", model_config.POSITIONS, tuple(positions.POSITIONS)),
    ("model.norm", model_config.NORMS, tuple(norms.NORM_PLACEMENTS)),
    ("model.init", model_config.INITS, tuple(initializers.INITS)),
    ("model.sinusoidal_layout", model_config.SINUSOIDAL_LAYOUTS,
     tuple(positions.SINUSOIDAL_LAYOUTS)),
    ("model.rope_scaling", modern_config.ROPE_SCALINGS, tuple(positions.ROPE_SCALINGS)),
    ("optimizer.schedule", train_config.SCHEDULES, tuple(optim.SCHEDULES)),
]


@pytest.mark.parametrize("key,names,table", REGISTRIES, ids=[r[0] for r in REGISTRIES])
def test_validation_accepts_exactly_the_implemented_names(key, names, table):
  assert tuple(names) == table, f"config.{key}: validation lists {names}, the code {table}"
  assert _rejected_listing(key) == list(table)


def test_remat_policies_are_one_table():
  """Validation, the blocks and the mesh search read the same dict, not copies."""
  assert layers.REMAT_POLICIES is model_config.REMAT_POLICIES
  assert search.REMAT_POLICIES is model_config.REMAT_POLICIES
  config = base.get_config()
  with pytest.raises(ConfigError, match="valid: " + re.escape(str(list(
      model_config.REMAT_POLICIES)))):
    search.mesh_search(config, None, [], ("no_such_policy",))


def test_gated_activations_are_activations():
  assert set(model_config.GATED_ACTIVATIONS) <= set(mlp.ACTIVATION_FNS)


def test_table_positions_are_the_positions_with_an_embedding_table():
  """data.seq_len's bound by model.max_len (config/data.py) covers every table position."""
  tables = tuple(name for name, position in positions.POSITIONS.items()
                 if position.embedding_table is not None)
  assert model_config.TABLE_POSITIONS == tables


# Keys the model code reads through their table (POSITIONS[cfg.position].rotary, ...):
# comparing one with a name outside config/ (validation) is a branch beside the table.
TABLE_READ_KEYS = ("position", "norm", "init", "sinusoidal_layout")


def _compared_keys(source: str) -> list[int]:
  """Lines comparing a `<x>.position` (or another TABLE_READ_KEYS attribute) with anything."""
  return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
          and any(isinstance(operand, ast.Attribute) and operand.attr in TABLE_READ_KEYS
                  for operand in (node.left, *node.comparators))]


def test_the_code_reads_the_tables_not_the_names():
  package = pathlib.Path(model_config.__file__).resolve().parents[1]
  found = [f"{path.relative_to(package)}:{line}" for path in sorted(package.rglob("*.py"))
           if path.relative_to(package).parts[0] != "config"
           for line in _compared_keys(path.read_text(encoding="utf-8"))]
  assert not found, f"ask the table's entry (e.g. POSITIONS[cfg.position].rotary): {found}"
  assert _compared_keys('a = cfg.position == "rope" or config.norm in ("pre", "post")') == [1, 1]


def test_objectives_table_covers_the_topologies_and_the_objective_code():
  """(arch, head) -> objective: every arch is a model class, every objective has inputs."""
  pairs = [pair for o in objective_lib.OBJECTIVES.values() for pair in o.pairs]
  archs = set(arch for arch, _ in pairs)
  heads = {head for _, head in pairs}
  assert archs == set(model_config.ARCHS)
  assert heads == set(model_config.HEADS) == set(_rejected_listing("model.head"))
  assert all(objective_lib.of(arch, head, o.name).model_inputs
             for o in objective_lib.OBJECTIVES.values() for arch, head in o.pairs)
  # Text-to-text entries are converted onto the topologies CONVERTERS names.
  assert {a for o in objective_lib.OBJECTIVES.values() if o.transform
          for a, _ in o.pairs} == set(objective_lib.CONVERTERS)
  assert _rejected_listing("model.objective") == list(objective_lib.OBJECTIVE_NAMES)


def test_local_datasets_are_the_catalog_builders():
  """data.name's local datasets (which read data.path) are catalog.LOCAL_BUILDERS' keys."""
  assert data_config.LOCAL_DATASETS == tuple(catalog.LOCAL_BUILDERS)


def test_attention_impls_are_the_kernels_and_jax_implements_its_two():
  """xla and cudnn go through jax's own implementations; the rest are attention_ops.py's."""
  annotation = jax.nn.dot_product_attention.__annotations__["implementation"]
  if isinstance(annotation, str):  # A postponed annotation: resolve it.
    annotation = typing.get_type_hints(jax.nn.dot_product_attention)["implementation"]
  jax_names = {name for arg in typing.get_args(annotation) for name in typing.get_args(arg)}
  assert jax_names, annotation
  assert {"xla", "cudnn"} <= jax_names
  assert _rejected_listing("model.attention_impl") == list(model_config.ATTENTION_IMPLS)


# Choice keys whose base.py comment (what --mode=keys prints) names every valid value.
DOCUMENTED_CHOICES = [
    ("model.arch", model_config.ARCHS),
    ("model.head", model_config.HEADS),
    ("model.remat", tuple(model_config.REMAT_POLICIES)),
    ("model.position", model_config.POSITIONS),
    ("model.norm", model_config.NORMS),
    ("model.norm_type", model_config.NORM_TYPES),
    ("model.activation", model_config.ACTIVATIONS),
    ("model.init", model_config.INITS),
    ("model.sinusoidal_layout", model_config.SINUSOIDAL_LAYOUTS),
    ("model.attention_impl", model_config.ATTENTION_IMPLS),
    ("model.rope_scaling", modern_config.ROPE_SCALINGS),
    ("model.mlp", moe_config.MLPS),
    ("model.moe_router", moe_config.MOE_ROUTERS),
    ("model.moe_dispatch", moe_config.MOE_DISPATCHES),
    ("optimizer.schedule", train_config.SCHEDULES),
    ("init_from_optimizer", train_config.INIT_FROM_OPTIMIZERS),
    ("data.tokenizer", data_config.TOKENIZERS),
    ("data.spm_model_type", data_config.SPM_MODEL_TYPES),
    ("data.packing", data_config.PACKINGS),
    ("data.overlong", data_config.OVERLONG_POLICIES),
    ("data.lm_windows", data_config.LM_WINDOWS),
    ("data.decode_errors", data_config.DECODE_ERRORS),
    ("decode.overlong", decode_config.DECODE_OVERLONG),
]


@pytest.mark.parametrize("key,names", DOCUMENTED_CHOICES, ids=[c[0] for c in DOCUMENTED_CHOICES])
def test_mode_keys_documents_every_valid_value(key, names):
  comment = keys.documented_keys()[key]
  missing = [name for name in names if not re.search(rf"\b{re.escape(name)}\b", comment)]
  assert not missing, f"configs/base.py's comment on {key} does not name {missing}: {comment}"
  assert _rejected_listing(key) == list(names)


def test_model_config_fields_are_base_model_keys():
  """One field per configs/base.py model.* key the modules read, plus the two modes."""
  declared = set(base.get_config().model.keys())
  fields = {f.name for f in dataclasses.fields(model_config.ModelConfig)}
  assert set(model_config.NOT_MODEL_FIELDS) <= declared
  assert fields == declared - set(model_config.NOT_MODEL_FIELDS) | set(model_config.MODE_FLAGS)


def test_model_config_reads_each_field_from_the_config():
  """from_config copies every key (or its resolution), and modes derive by replace."""
  config = base.get_config().model
  config.vocab_size = 97
  config.num_kv_heads = 0
  config.moe_mlp_dim = 0
  cfg = model_config.ModelConfig.from_config(config)
  resolved = {"num_kv_heads": config.num_heads, "head_dim": config.d_model // config.num_heads,
              "num_decoder_layers": config.num_layers, "moe_mlp_dim": config.mlp_dim,
              "rope_local_max_wavelength": config.rope_max_wavelength,
              "dtype": model_config.resolve_dtype(config.dtype),
              "param_dtype": model_config.resolve_dtype(config.param_dtype)}
  for field in dataclasses.fields(cfg):
    if field.name in model_config.MODE_FLAGS:
      continue
    expected = resolved.get(field.name, config[field.name])
    assert getattr(cfg, field.name) == expected, field.name
  decoding = dataclasses.replace(cfg, deterministic=True, decode=True)
  assert (decoding.decode, decoding.deterministic, cfg.decode) == (True, True, False)
  assert hash(decoding) != hash(cfg) and decoding.d_model == cfg.d_model
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.d_model = 1  # type: ignore[misc]


def test_attention_impls_are_the_kernels():
  """model.attention_impl's values are config/attention.py's table, and every kernel
  there has its code in attention_ops.py (and nothing else has), a per-shard call exactly
  where the table says it serves context parallelism."""
  from transformer.config import attention  # pylint: disable=g-import-not-at-top
  from transformer.model import attention_ops  # pylint: disable=g-import-not-at-top
  assert model_config.ATTENTION_IMPLS == ("auto",) + tuple(attention.KERNELS)
  assert tuple(attention_ops.KERNEL_FUNCTIONS) == tuple(attention.KERNELS)
  for name, kernel in attention.KERNELS.items():
    assert (attention_ops.KERNEL_FUNCTIONS[name].per_shard is not None) == kernel.context, name
