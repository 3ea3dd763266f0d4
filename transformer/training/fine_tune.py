"""What a run started with `config.init_from` takes from its source, and how it loads it.

A fine-tuning run's parameters must fit the source checkpoint, and its text must be
tokenized as the source's was, so `take_source_model` gives the model.* keys that say
what the model is (shape, positions, vocabulary, never-predict ids, max_len, ...) and the
tokenizer fields data.* the source run's value, before anything is validated:
`--config=configs/gpt_small.py:local --config.init_from=<imported gpt2 run>` fine-tunes
the import. Three kinds of model.* key keep this run's value:
  - the keys set on the command line (`explicit`): the user's on purpose;
  - TASK_KEYS: what the fine-tuning trains on top of the source's body (the head, its
    pooling and classes: an MLM encoder fine-tunes into an SST-2 classifier; LoRA);
  - config/model.py's RUN_FIELDS: how this run computes and regularises the model
    (attention kernel, layout, remat, dtypes, dropout, MoE loss terms): a GPU fine-tune
    of an import made with einsum attention and dropout 0.1 keeps its own kernel.
data.seq_len is lowered to the source's model.max_len when the preset's is longer. With
config.init_from_optimizer="fine_tune" the optimizer.* keys the command line leaves
alone take FINE_TUNING values (a pretraining preset's peak rate would wreck real
weights). One line says all of it, the optimizer's values included.

`check_parameters_fit` then pairs the new model's parameters with the source
checkpoint's (its metadata only, nothing read; training/source_params.py's `plan`),
before the workdir is created: a key that cannot carry the parameters is refused in one
line naming the keys. `load_source_params` reads them (layouts converted, LoRA adapters
continued, rescaled or folded so that step 0 computes the source's function).

A resumed run (its workdir has a checkpoint) takes the same keys from its own
config.json instead: they were the source's at its start, and the source need not
still exist.
"""

from __future__ import annotations

import math
import os
from typing import Any, Collection

import jax
import ml_collections
from absl import logging
from flax import linen as nn

from transformer.config.errors import ConfigError
from transformer.config.model import RUN_FIELDS
from transformer.data.tokenizers import run_vocabulary
from transformer.inference import loaded
from transformer.training import source_params
from transformer.training import trainer as trainer_lib
from transformer.workdir import checkpointing
from transformer.workdir import init_from as init_from_lib
from transformer.workdir import layout

# model.* keys a fine-tuning run chooses for itself: the task on top of the source's
# body (the classification head is a new parameter; the source's MLM or LM head is
# dropped when the head changes). LoRA's keys (model.lora_*) are a choice of the
# fine-tuning too (source_params.py keeps a LoRA source's function whatever they are).
TASK_KEYS = tuple(f"model.{field}" for field in source_params.TASK_FIELDS)
TASK_PREFIXES = ("model.lora_",)

# The optimizer.* values of a run started with init_from (config.init_from_optimizer=
# "fine_tune"), for each key its command line does not set: pretrained weights move
# little. The peak is Hugging Face Trainer's default learning rate (5e-5; BERT's paper
# 2e-5..5e-5), or peft / QLoRA's 2e-4 with LoRA (adapters start at zero and carry the
# whole update); a short warmup of FINE_TUNING_WARMUP of the steps (peft's
# warmup_ratio=0.03), a cosine decay to 0 at train.num_steps, no weight decay (both
# libraries' default). Betas, epsilon and clipping stay the preset's.
FINE_TUNING_OPTIMIZER = {"schedule": "cosine", "learning_rate": 5e-5, "decay_steps": 0,
                         "min_learning_rate": 0.0, "weight_decay": 0.0}
FINE_TUNING_LORA_LEARNING_RATE = 2e-4
FINE_TUNING_WARMUP = 0.03
# The optimizer.* keys the init_from line shows.
_SHOWN_OPTIMIZER = ("schedule", "learning_rate", "warmup_steps", "weight_decay")


def _is_task_key(key: str) -> bool:
  return key in TASK_KEYS or key.startswith(TASK_PREFIXES)


def _is_run_key(key: str) -> bool:
  return key.startswith("model.") and key.removeprefix("model.") in RUN_FIELDS


def source_run(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The workdir whose model this run takes: its own on a resume, else init_from's."""
  if workdir and checkpointing.has_checkpoint(workdir) and os.path.isfile(
      os.path.join(workdir, layout.CONFIG)):
    return workdir
  return run_vocabulary.run_workdir(config.init_from)


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
  """Gives `config` (in place) the source run's model and tokenizer keys, and fine-tuning
  optimizer values; logs one line saying which.

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
  taken, kept, own = [], [], []
  pairs = [(f"model.{field}", config.model, source.model, field) for field in source.model]
  pairs += [(f"data.{field}", config.data, source.data, field)
            for field in loaded.TOKENIZER_FIELDS]
  for key, node, source_node, field in sorted(pairs):
    if _is_task_key(key) or node[field] == source_node[field]:
      continue
    if key in explicit:
      kept.append(key)
    elif _is_run_key(key):
      own.append(key)
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
          + "; this run's own kernel, layout, precision and regularisation: "
          + (", ".join(own) or "none") + "; set on the command line, kept: "
          + (", ".join(kept) or "none") + "); optimizer: " + _fine_tuning_optimizer(
              config, explicit, source if run == workdir else None))
  logging.info("%s", line)
  return line


def _fine_tuning_optimizer(config: ml_collections.ConfigDict, explicit: Collection[str],
                           resumed: ml_collections.ConfigDict | None) -> str:
  """Sets FINE_TUNING's optimizer values the command line leaves alone (unless
  config.init_from_optimizer="preset"); returns what the init_from line says of them.

  A resume (`resumed`: the run's own config.json) takes them from there instead: the
  values it started with, which a longer train.num_steps (a safe change) must not move.
  """
  opt = config.optimizer
  keys = (*FINE_TUNING_OPTIMIZER, "warmup_steps")
  if config.init_from_optimizer == "fine_tune":
    steps = config.train.num_steps
    values = dict(FINE_TUNING_OPTIMIZER, warmup_steps=min(
        math.ceil(FINE_TUNING_WARMUP * steps), max(steps - 1, 0)))
    if config.model.lora_rank:
      values["learning_rate"] = FINE_TUNING_LORA_LEARNING_RATE
    origin = "fine-tuning values (config.init_from_optimizer='fine_tune')"
    if resumed is not None:
      values = {key: resumed.optimizer[key] for key in keys}
      origin = f"this run's own {layout.CONFIG}, as it started (a resume)"
    for key, value in values.items():
      if f"optimizer.{key}" not in explicit:
        opt[key] = value
  else:
    origin = "the preset's (config.init_from_optimizer='preset')"
  shown = ", ".join(f"{key}={opt[key]!r}" for key in _SHOWN_OPTIMIZER)
  given = [f"optimizer.{key}" for key in keys if f"optimizer.{key}" in explicit]
  return (f"{origin}: {shown}" + (f" (set on the command line: {', '.join(given)})"
                                  if given else ""))


def _plan(config: ml_collections.ConfigDict, abstract: Any) -> tuple[Any, dict, dict]:
  """(source_params.plan's Plan, the checkpoint's flat metadata, the model's flat leaves)."""
  stored = init_from_lib.flat_paths(init_from_lib.source_params(config.init_from))
  source = _source_config(config, run_vocabulary.run_workdir(config.init_from)).model

  def task_params() -> Any:  # This model with the source's head, pooling and classes.
    task_config = config.copy_and_resolve_references()
    for field in source_params.TASK_FIELDS:
      task_config.model[field] = source[field]
    return _shapes(trainer_lib.abstract_params(task_config))

  target = init_from_lib.flat_paths(abstract)
  return source_params.plan(config, source, target, stored, task_params), stored, target


def check_parameters_fit(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses a model whose parameters the source checkpoint cannot fill, naming the keys.

  Reads only the checkpoint's metadata and traces the model's shapes (no array is made
  or read), so launch.py runs it before the workdir is created. A resume (a workdir with
  its own checkpoint) ignores init_from, and so does this check.

  Raises:
    ConfigError: in one line (source_params.plan): the model.* keys that differ from the
      source run's and what they do to its parameters (another shape, new or dropped
      beyond a new head and LoRA, unless config.init_from_partial), or init_from's path
      holds no checkpoint.
  """
  if (not config.init_from or not config.model.vocab_size  # 0: the loop checks it later.
      or (workdir and checkpointing.has_checkpoint(workdir))):
    return
  _plan(config, _shapes(trainer_lib.abstract_params(config)))


def _shapes(boxed: Any) -> Any:
  """Parameters traced with their logical axes, unboxed without sharding constraints
  (nn.unbox's would need a mesh, and the loop calls this inside its own)."""
  return jax.tree.map(lambda x: x.value if isinstance(x, nn.Partitioned) else x, boxed,
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def load_source_params(config: ml_collections.ConfigDict,
                       abstract_params: Any) -> tuple[Any, init_from_lib.ParamMatch]:
  """init_from's parameters for this model (training/source_params.py): matched under
  the unrolled model's names, so scanned and per-layer layouts convert; a LoRA source's
  adapters continue (B rescaled to this run's alpha / r) or fold into their kernels.

  Args:
    config: this run's config (config.init_from set).
    abstract_params: the model's parameters as jax.ShapeDtypeStructs with shardings.

  Returns:
    (loaded, match): the loaded parameters as nested dicts in this model's layout, to
    lay over the initialised ones with `init_from.merge_params`; the match of paths.

  Raises:
    ConfigError: as `check_parameters_fit`.
  """
  plan, stored, target = _plan(config, abstract_params)
  return source_params.load(config.init_from, plan, stored, target), plan.match
