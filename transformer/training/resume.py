"""What a resumed run must keep: its vocabulary, and every key that shapes the model,
the data order or the updates.

`vocabulary_workdir` says where a run's vocabulary comes from (its own workdir on a
resume, which must hold it); `check_config_change` compares a resumed run's config
and data with the ones it started with, before anything is written.
"""

from __future__ import annotations

import copy
import json
import os

import ml_collections
from absl import logging

from transformer.config.errors import ConfigError
from transformer.data import run_data
from transformer.data import sources
from transformer.data.tokenizers import run_vocabulary
from transformer.workdir import checkpointing
from transformer.workdir import layout
from transformer.workdir import run_record


def vocabulary_workdir(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The workdir whose vocabulary this run uses; '' for the one data.tokenizer names.

  A run's vocabulary is part of the run: on a resume (a workdir with a checkpoint) it
  is read from the workdir, never derived again from the data (which may have
  changed), whatever checkpoint.on_config_change says. Fine-tuning keeps the
  vocabulary its parameters were trained with (config.init_from's run).

  Raises:
    ConfigError: the workdir has a checkpoint but no layout.TOKENIZER_RECORD.
  """
  if checkpointing.has_checkpoint(workdir):
    record = os.path.join(workdir, layout.TOKENIZER_RECORD)
    if not os.path.exists(record):
      raise ConfigError(
          f"{record} is missing: it names the vocabulary the checkpoints in {workdir} were "
          "trained with, and a resume never derives another one from the data (whatever "
          "checkpoint.on_config_change says); restore the file from a copy of the run, or "
          "train in a new --workdir (config.init_from takes over the parameters)")
    return workdir
  if config.init_from:
    return run_vocabulary.run_workdir(config.init_from)
  return ""


def resolve_vocab_size(config: ml_collections.ConfigDict,
                        tokenizer) -> ml_collections.ConfigDict:
  """A copy of `config` with model.vocab_size=0 replaced by the tokenizer's (rounded up)."""
  vocab_size = run_vocabulary.resolved_vocab_size(config, tokenizer)
  if vocab_size == config.model.vocab_size:
    return config
  needed = run_vocabulary.needed_vocab_size(config, tokenizer)
  extra = (f" and {needed - tokenizer.vocab_size} sentinel/paradigm ids of model.objective"
           if needed > tokenizer.vocab_size else "")
  logging.info("model.vocab_size=0: using %d (the tokenizer's %d%s rounded up to a "
               "multiple of %d)", vocab_size, tokenizer.vocab_size, extra,
               run_vocabulary.VOCAB_MULTIPLE)
  config = copy.deepcopy(config)  # The caller's config stays as given.
  config.model.vocab_size = vocab_size
  return config


# Keys a resumed run may change: for how long, how often to log, evaluate and save,
# how many steps a compiled call runs, how many calls' batches are built ahead
# (data.prefetch: checkpoints hold the position of the rows taken), decoding, and the
# mesh (placement only: the checkpoint is restored into the new mesh's shardings, and
# no rule changes an array's shape). Every other key shapes the model, the data order
# or the updates.
RESUME_SAFE_KEYS = ("train.num_steps", "train.log_every", "train.eval_every",
                    "train.steps_per_call",
                    "train.eval_batches", "train.eval_at_start", "train.bleu_examples",
                    "train.label_examples",
                    "train.sample_prompt", "train.benchmarks", "train.benchmark_documents",
                    "train.benchmark_every", "checkpoint.every", "checkpoint.keep",
                    "checkpoint.async_save", "checkpoint.on_config_change", "data.num_threads",
                    "data.prefetch", "train.wandb_project", "train.wandb_entity",
                    "train.wandb_mode",
                    # Which kernel computes attention: the same function, no parameter moves.
                    "model.attention_impl")
RESUME_SAFE_PREFIXES = ("decode.", "mesh.")
ON_CONFIG_CHANGE = ("stop", "allow")


def check_config_change(config: ml_collections.ConfigDict, workdir: str,
                         dataset: dict[str, object] | None = None) -> None:
  """On resume, compares `config` (vocab_size resolved) and the data with the run's own.

  Changes to RESUME_SAFE_KEYS and decode.* apply and are logged. Any other change
  stops the run with a ConfigError listing each key with its old and new value,
  unless checkpoint.on_config_change is 'allow'. A dataset other than the one in
  the run's dataset.json (an edited local file) is such a change too. A key only one
  side has (one added to configs/base.py since the run started) is logged. A workdir
  whose config.json has no checkpoint beside it is not a resume: nothing is compared.
  """
  policy = config.checkpoint.on_config_change
  if policy not in ON_CONFIG_CHANGE:
    raise ConfigError(f"config.checkpoint.on_config_change={policy!r} is invalid: valid "
                      "values are " + ", ".join(repr(p) for p in ON_CONFIG_CHANGE) + ".")
  path = os.path.join(workdir, layout.CONFIG)
  if not os.path.exists(path):
    return
  if not checkpointing.has_checkpoint(workdir):
    logging.info("%s is from a run that saved no checkpoint: not a resume, so this config "
                 "replaces it without a comparison", path)
    return
  try:
    with open(path, encoding="utf-8") as f:
      saved = run_record.flatten(json.load(f))
  except (OSError, ValueError) as e:
    logging.warning("Cannot compare the config with the unreadable %s (%s); resuming "
                    "without the check", path, e)
    return
  current = run_record.flat_config(config)
  # With a cosine schedule and decay_steps=0 the decay ends at num_steps: not cadence.
  cosine_length = config.optimizer.schedule == "cosine" and not config.optimizer.decay_steps
  safe, unsafe, one_sided = [], [], []
  for key in sorted(set(saved) | set(current)):
    if key not in saved or key not in current:
      one_sided.append(f"{key} ({'new' if key in current else 'no longer'} in the config)")
      continue
    if saved[key] == current[key]:
      continue
    change = f"{key}: {saved[key]!r} -> {current[key]!r}"
    if key == "train.num_steps" and cosine_length:
      unsafe.append(change + " (the cosine decay length while optimizer.decay_steps=0)")
    elif key in RESUME_SAFE_KEYS or key.startswith(RESUME_SAFE_PREFIXES):
      safe.append(change)
    elif key == "data.path" and dataset and run_data.same_as_run(workdir, dataset):
      safe.append(change + " (the same content as dataset.json records)")
    else:
      unsafe.append(change)
  data_change = sources.dataset_change(workdir, dataset) if dataset else None
  if data_change and not unsafe and policy != "allow":
    # The data alone: one line, as a new run on changed data is refused (data/corpus/for_config.py).
    raise ConfigError(
        f"Resuming {workdir} on data that is not what it trained on "
        f"({layout.DATASET_RECORD}): {data_change}; restore the run's data (or prepare "
        "it again from the original files), train in a new --workdir (config.init_from "
        "takes over the parameters), or pass --config.checkpoint.on_config_change=allow "
        "to resume on it anyway")
  if data_change:
    unsafe.append(data_change)
  if one_sided:
    logging.info("Resuming: keys only one of this config and %s has: %s", path,
                 ", ".join(one_sided))
  if safe:
    logging.info("Resuming with changed settings (applied): %s", "; ".join(safe))
  if unsafe and policy == "allow":
    logging.warning("Resuming with checkpoint.on_config_change='allow' despite changes "
                    "to keys that shape the model, data or updates (applied): %s",
                    "; ".join(unsafe))
  elif unsafe:
    raise ConfigError(
        f"Resuming {workdir} with a config that differs from its config.json in "
        f"{len(unsafe)} key(s) that a resumed run cannot change:\n  " + "\n  ".join(unsafe) +
        "\nRerun with the saved values, or use a new --workdir (config.init_from takes "
        "over the parameters), or pass --config.checkpoint.on_config_change=allow to "
        "resume with the changes anyway.")


def already_complete(workdir: str, num_steps: int) -> int | None:
  """The step of a checkpoint known whole that reaches `num_steps` (nothing to train), or None.

  Only a checkpoint whose file sizes were recorded when its save finished is known
  whole without reading it; any other one goes through the restore, which checks it.
  """
  complete = checkpointing.newest_complete_step(workdir)
  if complete is None or not os.path.exists(
      os.path.join(workdir, layout.CHECKPOINTS, str(complete), layout.FILE_SIZES)):
    return None
  return complete if complete >= num_steps else None
