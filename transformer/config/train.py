"""Validation of the optimizer.*, train.* and checkpoint.* fields, and init_from.

Steps of `validation.validate`. training/optim.py's SCHEDULES table implements the
names SCHEDULES lists (tests/test_config_registries.py holds them equal).
"""

from __future__ import annotations

import importlib.util

import ml_collections

from transformer.config import objective as objective_lib
from transformer.config.checks import (check_bool, check_choice, check_float, check_int,
                                       check_positive, check_rate, is_number, lookup)
from transformer.config.errors import fail

# train.logits_dtype: "auto" is the model's compute dtype (training/metrics.head_loss_sums).
LOGITS_DTYPES = ("auto", "float32", "bfloat16")

SCHEDULES = ("warmup_rsqrt", "noam", "cosine", "constant")
# train.wandb_mode: W&B's own modes ("" = W&B's default: WANDB_MODE, else online).
WANDB_MODES = ("", "online", "offline")

# config.init_from_optimizer: fine-tuning values (training/fine_tune.py) or the preset's.
INIT_FROM_OPTIMIZERS = ("fine_tune", "preset")


def validate_optimizer(config: ml_collections.ConfigDict) -> None:
  """The optimizer.* fields, and the schedule's length against the run's."""
  o = "optimizer."
  check_choice(config, o + "schedule", SCHEDULES)
  check_int(config, o + "warmup_steps", 0)
  if config.optimizer.schedule == "noam" and config.optimizer.warmup_steps == 0:
    fail(o + "warmup_steps", 0, "the noam schedule divides by warmup; expected >= 1")
  for key in ("learning_rate", "noam_scale", "eps"):
    check_positive(config, o + key)
  for key in ("b1", "b2", "label_smoothing"):
    check_rate(config, o + key)
  check_float(config, o + "z_loss", 0.0)
  for key in ("weight_decay", "grad_clip_norm"):
    check_float(config, o + key, 0)
  check_int(config, o + "decay_steps", 0)
  check_int(config, o + "skip_nonfinite", 0)
  opt = config.optimizer
  min_lr = opt.min_learning_rate
  if not is_number(min_lr) or not 0 <= min_lr <= opt.learning_rate:
    fail(o + "min_learning_rate", min_lr,
          f"expected a float in [0, optimizer.learning_rate={opt.learning_rate}]")
  if opt.schedule == "cosine":
    check_int(config, "train.num_steps", 1)  # The decay length when decay_steps is 0.
    decay_steps = opt.decay_steps or config.train.num_steps
    if decay_steps <= opt.warmup_steps and opt.decay_steps == 0:
      # The decay length is train.num_steps, the key a short run sets: name it first.
      fail("train.num_steps", config.train.num_steps,
            "with optimizer.schedule='cosine' and optimizer.decay_steps=0 the run is the "
            "cosine's length, which must end after the warmup: expected > "
            f"optimizer.warmup_steps={opt.warmup_steps}; set train.num_steps above "
            f"{opt.warmup_steps}, or lower the warmup (e.g. --config.optimizer.warmup_steps="
            f"{max(config.train.num_steps // 10, 0)})")
    if decay_steps <= opt.warmup_steps:
      fail(o + "decay_steps", opt.decay_steps,
            "with optimizer.schedule='cosine' the decay must end after the warmup (it counts "
            f"the warmup too): expected > optimizer.warmup_steps={opt.warmup_steps}")


def validate_train(config: ml_collections.ConfigDict) -> None:
  """The train.* and checkpoint.* cadences, and init_from's type."""
  t = "train."
  check_int(config, t + "num_steps", 1)
  check_int(config, t + "microbatches", 1)
  check_int(config, t + "logits_chunk", 0)
  check_choice(config, t + "logits_dtype", LOGITS_DTYPES)
  check_int(config, t + "log_every", 1)
  check_int(config, t + "eval_every", 1)
  if config.train.eval_batches != -1:
    check_int(config, t + "eval_batches", 1)
  check_int(config, "checkpoint.every", 1)
  check_int(config, "checkpoint.keep", 1)
  check_int(config, t + "steps_per_call", 1)
  check_steps_per_call(config)
  # Only the type here: whether the path holds a usable checkpoint is checked when loading.
  if not isinstance(config.init_from, str):
    fail("init_from", config.init_from, "expected '' or the path of a run's workdir or of "
          "one of its checkpoints/<step> directories")
  check_bool(config, "init_from_partial")
  check_choice(config, "init_from_optimizer", INIT_FROM_OPTIMIZERS)


# The cadences train.steps_per_call must divide (cli/common.fit_steps_per_call reads it too).
STEPS_PER_CALL_CADENCES = ("train.log_every", "train.eval_every", "checkpoint.every")


def check_steps_per_call(config: ml_collections.ConfigDict) -> None:
  """Rows, evaluations and checkpoints fall between calls: each cadence is a multiple."""
  per_call = config.train.steps_per_call
  for key in STEPS_PER_CALL_CADENCES:
    every = lookup(config, key)
    if every % per_call:
      divisors = [d for d in range(1, every + 1) if every % d == 0]
      fail("train.steps_per_call", per_call,
           f"{key}={every} is not a multiple of it: a call runs its steps without a "
           "stop in between, so every logged row, evaluation and checkpoint falls "
           f"between calls; use a divisor of {every} (" + ", ".join(map(str, divisors[:12]))
           + (", ..." if len(divisors) > 12 else "") + f") or make {key} a multiple of "
           f"{per_call}")


def validate_evaluation_hooks(config: ml_collections.ConfigDict) -> None:
  """The train.* fields of the hooks that evaluate during training: BLEU, label
  accuracy, samples."""
  t = "train."
  check_int(config, t + "bleu_examples", 0)
  objective = objective_lib.resolve(config.model)
  if config.train.bleu_examples and not (config.data.source_language and
                                         objective.translates):
    fail(t + "bleu_examples", config.train.bleu_examples, "BLEU is computed for "
          "translation runs: data.source_language and data.target_language set, and an "
          f"objective that reads pairs: {objective_lib.describe(lambda o: o.translates)}")
  check_int(config, t + "label_examples", 0)
  if config.train.label_examples and not (config.data.label_key
                                          and objective.answers_labels):
    fail(t + "label_examples", config.train.label_examples, "label accuracy is computed "
          "for a labelled text trained text-to-text: data.label_key set, and an objective "
          f"that reads it as pairs: {objective_lib.describe(lambda o: o.answers_labels)}"
          f"; this run: data.label_key={config.data.label_key!r}, the {objective.name} "
          f"objective of model.arch={config.model.arch!r}")
  if config.train.sample_prompt and not objective.answers_prompts:
    fail(t + "sample_prompt", config.train.sample_prompt, "samples come from a decoder "
          "LM continuing the prompt or a text-to-text model answering it: "
          f"{objective_lib.describe(lambda o: o.answers_prompts)}; not the "
          f"{objective.name} objective of model.arch={config.model.arch!r}, "
          f"model.head={config.model.head!r}")
  # The task names are checked where the tasks are read (evaluation/tasks.py), before
  # the model compiles: the table of known tasks lives there.
  if not isinstance(config.train.benchmarks, str):
    fail(t + "benchmarks", config.train.benchmarks, "expected comma-separated task names "
          "or .jsonl files in one string (\"\" = off)")
  check_int(config, t + "benchmark_documents", 0)
  check_int(config, t + "benchmark_every", 0)
  model = config.model
  # A model that continues text, or an encoder-decoder (two token sides: the context on
  # the encoder's), whatever it trained on (evaluation/scoring.py's scores_text).
  if config.train.benchmarks.strip() and not (objective.decodes or objective.sides == 2):
    fail(t + "benchmarks", config.train.benchmarks, "benchmarks score continuations by "
          "their log-likelihood under a decoder LM or an encoder-decoder (model.arch="
          f"'decoder' or 'encoder_decoder', head='lm'), not model.arch={model.arch!r}, "
          f"head={model.head!r}")
  every, eval_every = config.train.benchmark_every, config.train.eval_every
  if every % eval_every:
    fail(t + "benchmark_every", every, f"benchmarks run at evaluations: use a multiple of "
          f"train.eval_every={eval_every} (0: every evaluation)")
  validate_wandb(config)


def validate_wandb(config: ml_collections.ConfigDict) -> None:
  """train.wandb_*: strings, a W&B mode, and the wandb package present when a project is
  named (found without importing it: workdir/wandb_run.py imports it when the run starts)."""
  t = "train."
  for key in ("wandb_project", "wandb_entity"):
    if not isinstance(config.train[key], str):
      fail(t + key, config.train[key], "expected a string (\"\" = none)")
  check_choice(config, t + "wandb_mode", WANDB_MODES)
  if config.train.wandb_project and importlib.util.find_spec("wandb") is None:
    fail(t + "wandb_project", config.train.wandb_project, "logging to Weights & Biases "
         "needs the wandb package, which is not installed: pip install wandb (or pip "
         "install -e '.[wandb]'), or leave train.wandb_project empty")
