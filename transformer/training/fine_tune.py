"""What a run started with `config.init_from` takes from its source: model and tokenizer.

A fine-tuning run's parameters must fit the source checkpoint, and its text must be
tokenized as the source's was, so `take_source_model` gives every model.* key (shape,
positions, vocabulary, never-predict ids, attention kernel, max_len, ...) and the
tokenizer fields data.* the source run's value, before anything is validated:
`--config=configs/gpt_small.py:local --config.init_from=<imported gpt2 run>` fine-tunes
the import. Two kinds of key keep this run's value:
  - the keys set on the command line (`explicit`): the user's on purpose;
  - TASK_KEYS: what the fine-tuning trains on top of the source's body (the head, its
    pooling and classes: an MLM encoder fine-tunes into an SST-2 classifier).
data.seq_len is lowered to the source's model.max_len when the preset's is longer.

`check_parameters_fit` then compares the new model's parameter shapes with the source
checkpoint's (its metadata only, nothing read), before the workdir is created: a key
that cannot carry the parameters is refused in one line naming the keys.

`load_source_params` reads the parameters; a LoRA source's adapters that this model
does not carry (a model without adapters, or with them on other projections) are merged
into their kernels with the source's alpha / r, so the fine-tuned function carries over
instead of the adapters being dropped.

A resumed run (its workdir has a checkpoint) takes the same keys from its own
config.json instead: they were the source's at its start, and the source need not
still exist.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Collection

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
from flax import linen as nn
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from transformer.config.errors import ConfigError
from transformer.data import sources
from transformer.inference import loaded
from transformer.model import lora
from transformer.training import trainer as trainer_lib
from transformer.workdir import checkpointing
from transformer.workdir import init_from as init_from_lib
from transformer.workdir import layout

# model.* keys a fine-tuning run chooses for itself: the task on top of the source's
# body (the classification head is a new parameter; the source's MLM or LM head is
# dropped when the head changes). LoRA's keys (model.lora_*) are a choice of the
# fine-tuning too.
TASK_KEYS = ("model.head", "model.pooling", "model.num_classes")
TASK_PREFIXES = ("model.lora_",)
# model.* keys that move no parameter: never the cause of a shape mismatch.
_NO_PARAMETER_KEYS = ("model.embed_dropout", "model.residual_dropout",
                      "model.attention_dropout", "model.mlp_dropout", "model.dtype",
                      "model.remat", "model.attention_max_segments", "model.moe_aux_loss",
                      "model.moe_z_loss", "model.moe_router_jitter")


def _is_task_key(key: str) -> bool:
  return key in TASK_KEYS or key.startswith(TASK_PREFIXES)


def source_run(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The workdir whose model this run takes: its own on a resume, else init_from's."""
  if workdir and checkpointing.has_checkpoint(workdir) and os.path.isfile(
      os.path.join(workdir, layout.CONFIG)):
    return workdir
  return sources.run_workdir(config.init_from)


def _source_config(config: ml_collections.ConfigDict, run: str) -> ml_collections.ConfigDict:
  """The source run's validated config, or a ConfigError naming config.init_from."""
  if not os.path.isdir(run):
    raise ConfigError(f"config.init_from={config.init_from!r} is invalid: {run} is not a "
                      "directory; expected a run's workdir or one of its "
                      "checkpoints/<step> directories")
  try:
    return loaded.load_config(run)
  except ConfigError as e:
    raise ConfigError(f"config.init_from={config.init_from!r}: {e}") from None


def take_source_model(config: ml_collections.ConfigDict, explicit: Collection[str],
                      workdir: str = "") -> str | None:
  """Gives `config` (in place) the source run's model and tokenizer keys; logs one line.

  Args:
    config: the run's config (a locked ConfigDict may change values); nothing happens
      when config.init_from is "".
    explicit: the keys the command line sets ("model.dropout", ...): they keep their value.
    workdir: this run's workdir; when it has a checkpoint (a resume) the keys come from
      its own config.json.

  Returns:
    The line logged, or None without init_from.

  Raises:
    ConfigError: init_from names no run with a readable config.json.
  """
  if not config.init_from:
    return None
  run = source_run(config, workdir)
  source = _source_config(config, run)
  taken, kept = [], []
  pairs = [(f"model.{field}", config.model, source.model, field) for field in source.model]
  pairs += [(f"data.{field}", config.data, source.data, field)
            for field in loaded.TOKENIZER_FIELDS]
  for key, node, source_node, field in sorted(pairs):
    if _is_task_key(key) or node[field] == source_node[field]:
      continue
    if key in explicit:
      kept.append(key)
    else:
      node[field] = source_node[field]
      taken.append(key)
  max_len = config.model.max_len
  if config.data.seq_len > max_len and "data.seq_len" not in explicit:
    taken.append(f"data.seq_len={max_len} (the preset's {config.data.seq_len} is longer "
                 "than model.max_len)")
    config.data.seq_len = max_len
  origin = (f"this run's own {layout.CONFIG} (a resume)" if run == workdir else run)
  line = (f"init_from: model and tokenizer from {origin} ({len(taken)} keys differ from the "
          "preset's" + (": " + ", ".join(taken) if taken else "")
          + "; set on the command line, kept: " + (", ".join(kept) or "none") + ")")
  logging.info("%s", line)
  return line


def check_parameters_fit(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a model whose parameters the source checkpoint cannot fill, naming the keys.

  Reads only the checkpoint's metadata and traces the model's shapes (no array is made
  or read), so launch.py runs it before the workdir is created. A resume (a workdir with
  its own checkpoint) ignores init_from, and so does this check.

  Raises:
    ConfigError: in one line, the model.* keys that differ from the source run's and the
      number of parameters whose shape they change (with the first few), or init_from's
      path holds no checkpoint.
  """
  if (not config.init_from or not config.model.vocab_size  # 0: the loop checks it later.
      or (workdir and checkpointing.has_checkpoint(workdir))):
    return
  stored = init_from_lib.source_params(config.init_from)
  target = nn.unbox(trainer_lib.abstract_params(config))
  mismatches = init_from_lib.shape_mismatches(target, stored)
  if not mismatches:
    return
  source = _source_config(config, sources.run_workdir(config.init_from)).model
  differ = [f"model.{field}={config.model[field]!r} (the source's {source[field]!r})"
            for field in sorted(source)
            if config.model[field] != source[field]
            and f"model.{field}" not in _NO_PARAMETER_KEYS
            and not loaded.is_inference_model_key(f"model.{field}")]
  raise ConfigError(
      f"config.init_from={config.init_from!r} cannot carry its parameters into this model: "
      + (", ".join(differ) if differ else "its model.* keys")
      + f" {'changes' if len(differ) == 1 else 'change'} the shape of {len(mismatches)} of "
      f"them (first: {mismatches[0]}); set {'it' if len(differ) == 1 else 'them'} as the "
      "source run has, or train without init_from")


def load_source_params(config: ml_collections.ConfigDict,
                       abstract_params: Any) -> tuple[Any, init_from_lib.ParamMatch]:
  """init_from's parameters for this model, a LoRA source's extra adapters merged in.

  Adapters the model carries too (same path) load as they are: a LoRA run continues
  from a LoRA source's adapters. An adapter whose projection this model has without one
  would be dropped, losing what the source learnt, so it is read (replicated: adapters
  are small) and folded into its kernel, kernel + alpha / r * A . B, in the kernel's
  sharding; one line says how many.

  Args:
    config: this run's config (config.init_from set).
    abstract_params: the model's parameters as jax.ShapeDtypeStructs with shardings.

  Returns:
    As `init_from.load_params`: the loaded subtree (adapters merged and removed) and
    the match of paths.
  """
  stored = init_from_lib.flat_paths(init_from_lib.source_params(config.init_from))
  target = init_from_lib.flat_paths(abstract_params)
  orphans = sorted(path[:-1] for path in stored
                   if path[-1] == "lora_a" and path not in target
                   and path[:-1] + ("kernel",) in target)
  if not orphans:
    return init_from_lib.load_params(config.init_from, abstract_params)
  source = _source_config(config, sources.run_workdir(config.init_from)).model
  augmented = dict(target)
  for module in orphans:
    kernel_sharding = target[module + ("kernel",)].sharding
    replicated = (NamedSharding(kernel_sharding.mesh, PartitionSpec())
                  if isinstance(kernel_sharding, NamedSharding) else kernel_sharding)
    for name in lora.ADAPTER_NAMES:
      meta = stored[module + (name,)]
      augmented[module + (name,)] = jax.ShapeDtypeStruct(meta.shape, meta.dtype,
                                                         sharding=replicated)
  loaded_params, match = init_from_lib.load_params(
      config.init_from, traverse_util.unflatten_dict(augmented))
  flat = traverse_util.flatten_dict(loaded_params)
  factor = lora.scale(source)
  kernels = [module + ("kernel",) for module in orphans]
  # One program for every merge (not a compile per projection), the kernels donated so
  # that the merged ones take their place instead of doubling the parameters' memory.
  merge = jax.jit(
      lambda ks, as_, bs: [lora.merged_kernel(k, a, b, factor, xp=jnp).astype(k.dtype)
                           for k, a, b in zip(ks, as_, bs)],
      out_shardings=[flat[k].sharding for k in kernels], donate_argnums=0)
  merged = merge([flat[k] for k in kernels],
                 [flat.pop(module + ("lora_a",)) for module in orphans],
                 [flat.pop(module + ("lora_b",)) for module in orphans])
  flat.update(zip(kernels, merged))
  adapters = {"/".join(m + (n,)) for m in orphans for n in lora.ADAPTER_NAMES}
  logging.info("init_from: merged %d LoRA adapters of %s into their kernels (its alpha / r "
               "= %g): this model carries no adapter there", len(orphans), config.init_from,
               factor)
  return traverse_util.unflatten_dict(flat), dataclasses.replace(
      match, loaded=tuple(p for p in match.loaded if p not in adapters))
