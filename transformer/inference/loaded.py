"""A trained run from its workdir: config, tokenizer and parameters, nothing of training.

What comes from where:
  - `<workdir>/config.json` (written resolved by train_and_evaluate): model.* and
    everything else, with configs/base.py's defaults for keys the run predates; its
    mesh.* too, unless its fixed sizes do not fit the devices here (then all devices
    go data-parallel);
  - `<workdir>/tokenizer.json` and the vocabulary file it names: the tokenizer, always;
  - `<workdir>/checkpoints/<step>/state`: the parameters only, of the newest step, the
    one asked for, or the mean of the newest N (`average_last`, the paper's averaging);
  - an optional config (launch.py --config): its data.* (another dataset or split,
    batch size, seq_len; not the tokenizer fields) and decode.* replace the run's;
  - `decode_overrides` (launch.py's --beam_size, ...): single decode.* fields, over either;
  - `model_overrides` (the --config.model.* flags given on the command line): only the
    fields that move no parameter (INFERENCE_MODEL_KEYS: RoPE's scaling and base, the
    attention kernel, max_len without a learned table), so the checkpoint still fits:
    a model trained at 256 tokens evaluated at 1024 with --config.model.rope_scaling=linear.

Loading builds only the model's parameter shardings (no optimizer, no training state),
so the inference modes (cli/generate.py, translate.py, evaluate.py, average.py) and the
Hugging Face export read a run without touching training. Nothing in the workdir is
written here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from flax import linen as nn

from configs import base
from transformer import distributed
from transformer import sharding
from transformer.config import objective as objective_lib
from transformer.config.decode import validate_decode
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.config.validation import validate
from transformer.data import run_data
from transformer.data import sources
from transformer.data.tokenizers import run_vocabulary
from transformer.data.tokenizers import vocabularies
from transformer.model import lora
from transformer.model import objectives
from transformer.model import positions as positions_lib
from transformer.model.models import make_model
from transformer.workdir import averaging
from transformer.workdir import checkpointing
from transformer.workdir import layout
from transformer.workdir import progress
from transformer.workdir import run_record

# data.* fields that make the tokenizer; a run's own vocabulary always wins over them.
TOKENIZER_FIELDS = ("tokenizer", "spm_vocab_size", "spm_model_type", "spm_train_sentences")
# model.* fields a mode that reads a run may change (--config.model.X on its command line):
# none of them moves or reshapes a parameter. Every RoPE field (how positions turn:
# long-context scaling such as "linear", the base), the attention kernel (the same
# function), and max_len, the positions a model without a learned table may take (a
# learned table has max_len rows in the checkpoint: refused in `_apply_model_overrides`).
INFERENCE_MODEL_PREFIXES = ("model.rope_",)
INFERENCE_MODEL_KEYS = ("model.max_len", "model.attention_impl")


def is_inference_model_key(key: str) -> bool:
  """Whether `key` ("model.rope_scaling") is a model field a reading mode may change."""
  return key in INFERENCE_MODEL_KEYS or key.startswith(INFERENCE_MODEL_PREFIXES)


# ---------------------------------------------------------------- a run from its workdir


def _as_tuples(value: Any, like: Any) -> Any:
  """JSON lists back to the tuples the base config declares (mesh.shape, mesh.rules)."""
  if isinstance(like, tuple) and isinstance(value, list):
    return tuple(_as_tuples(v, ()) if isinstance(v, list) else v for v in value)
  return value


def _vocabulary_kind(workdir: str) -> str | None:
  """The kind of the run's vocabulary as its tokenizer.json records it (None: unreadable)."""
  try:
    with open(os.path.join(workdir, layout.TOKENIZER_RECORD), encoding="utf-8") as f:
      return json.load(f).get("kind")
  except (OSError, ValueError, AttributeError):
    return None


def load_config(workdir: str, config: ml_collections.ConfigDict | None = None,
                model_overrides: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
  """The run's config from `<workdir>/config.json`, with `config`'s data.* and decode.*.

  Keys config.json lacks (a run older than a key) take configs/base.py's default.

  Args:
    workdir: a run's workdir.
    config: optional: its data.* (except the tokenizer fields) and decode.* replace
      the run's.
    model_overrides: optional {"model.key": value}, the --config.model.* flags given on
      the command line: those that differ from the run's must be INFERENCE_MODEL_KEYS.

  Returns:
    A validated, locked ConfigDict.

  Raises:
    ConfigError: no config.json, a key configs/base.py does not declare, an invalid value,
      a model override that would not fit the checkpoint.
  """
  path = os.path.join(workdir, layout.CONFIG)
  if not os.path.isfile(path):
    raise ConfigError(f"{os.path.abspath(workdir)} has no {layout.CONFIG}: expected the workdir "
                      "of a training run (python launch.py --config=... --workdir=DIR writes "
                      "it at start)")
  try:
    with open(path, encoding="utf-8") as f:
      stored = json.load(f)
  except ValueError as e:
    raise ConfigError(f"{path} is not valid JSON ({e}); training writes it whole at every "
                      "start, so it was edited or damaged: restore it (e.g. rerun the "
                      "training command with --config)") from e
  if not isinstance(stored, dict):
    raise ConfigError(f"{path} holds a {type(stored).__name__}, expected the JSON object "
                      "training writes")
  result = base.get_config()
  for section, values in stored.items():
    if section not in result:
      raise ConfigError(f"{path}: key {section!r} is not declared in configs/base.py")
    if not isinstance(values, dict):
      result[section] = values
      continue
    for key, value in values.items():
      if key not in result[section]:
        raise ConfigError(f"{path}: key {section}.{key} is not declared in configs/base.py")
      result[section][key] = _as_tuples(value, result[section][key])
  stored_data = (result.data.name, result.data.path)
  if config is not None:
    logging.info("Using the given config's data.* and decode.*; the model and everything "
                 "else come from %s", path)
    run_tokenizer = {k: result.data[k] for k in TOKENIZER_FIELDS}
    result.data.update(config.data.to_dict())
    result.decode.update(config.decode.to_dict())
    kind = _vocabulary_kind(workdir)
    for key, value in run_tokenizer.items():
      # Said of what the run's vocabulary really is (its tokenizer.json), not of its
      # config.json's field: an import records the base's 'sentencepiece' beside its
      # Hugging Face vocabulary, and data.spm_* concern a SentencePiece one only.
      if result.data[key] != value and (key == "tokenizer" or kind == "sentencepiece"):
        logging.warning("config.data.%s=%r (the given --config's) is not used: the run's "
                        "own %s vocabulary (%s) is", key, result.data[key],
                        kind or "recorded", layout.TOKENIZER_RECORD)
      result.data[key] = value
  if (result.data.name, result.data.path) == stored_data:  # The run's own data.
    result.data.path = run_data.resolve_path(workdir, result.data.path)
  if not result.model.vocab_size:
    raise ConfigError(f"{path} has model.vocab_size=0; train_and_evaluate writes it "
                      "resolved, so this file was not written by a training run")
  _apply_model_overrides(result, model_overrides or {}, path)
  validate(result)  # decode.* included.
  return result


def _apply_model_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any],
                           path: str) -> None:
  """Sets the model.* overrides that differ from the run's; refuses those that cannot apply."""
  for key, value in sorted(overrides.items()):
    field = key.removeprefix("model.")
    if not key.startswith("model.") or field not in config.model:
      raise ConfigError(f"--config.{key}: not a model.* field of configs/base.py")
    stored = config.model[field]
    if value == stored:
      continue  # The training command's own flags, repeated: nothing changes.
    if not is_inference_model_key(key):
      raise ConfigError(
          f"--config.{key}={value!r}: the run's model has {field}={stored!r} ({path}) and "
          "its parameters fit only that; a reading mode may change only the fields that "
          "move no parameter: " + ", ".join(INFERENCE_MODEL_KEYS)
          + ", and " + ", ".join(p + "*" for p in INFERENCE_MODEL_PREFIXES))
    if field == "max_len" and positions_lib.POSITIONS[config.model.position].learned:
      raise ConfigError(
          f"--config.model.max_len={value!r}: the run's learned position table has "
          f"model.max_len={stored} rows and learned positions cannot extrapolate past "
          "them; evaluate at data.seq_len <= that, or use a model with rope / alibi / "
          "relative / none positions")
    logging.info("model.%s=%r for this command (the run trained with %r)", field, value, stored)
    config.model[field] = value


def changed_model_fields(workdir: str, config: ml_collections.ConfigDict) -> dict[str, Any]:
  """{field: value} of `config.model` that differ from the run's config.json (its overrides).

  What a result file names, so that evaluations of one checkpoint with several
  settings (rope_scaling 'none' and 'linear') each keep a file of their own.
  """
  stored = load_config(workdir).model
  return {field: config.model[field] for field in sorted(config.model)
          if config.model[field] != stored[field]}


def check_run_data(workdir: str, config: ml_collections.ConfigDict | None,
                   record: dict[str, Any], mode: str) -> None:
  """Stops when the data a mode reads as the run's own is not what the run trained on.

  The run's own data: no --config, or one whose data.name and data.path name the
  run's. Compared with its dataset.json by content, as a resume compares it
  (data/run_data.py); a --config naming other data is a deliberate choice, only logged.

  Args:
    workdir: the run's workdir.
    config: the given --config, or None.
    record: the data's identity (`sources.DataSources.record()`, `dataset_record`).
    mode: the mode's name, for messages.

  Raises:
    ConfigError: the run's data files were edited (or a relative path now names
      another file), naming what changed and both paths.
  """
  # Every process reads the same data (or each stops naming the file that differs).
  distributed.agree({"data": run_data.identity(record)}, ConfigError)
  stored = load_config(workdir).data
  given = config.data if config is not None else stored
  own = (given.name == stored.name and
         os.path.abspath(run_data.resolve_path(workdir, given.path or "")) ==
         os.path.abspath(run_data.resolve_path(workdir, stored.path or "")))
  difference = sources.dataset_change(workdir, record)
  if difference and not own:
    logging.info("--mode=%s reads %s, not the data %s trained on (the given --config's "
                 "data.*)", mode, record["name"], workdir)
  elif difference:
    raise ConfigError(
        f"--mode={mode}: the data is not what {workdir} trained on ({layout.DATASET_RECORD}): "
        f"{difference}. Restore the run's data, or pass a --config whose data.* name "
        "other data to read it on purpose")


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps of the complete checkpoints under `<workdir>/checkpoints`, oldest first."""
  directory = epath.Path(os.path.abspath(workdir)) / layout.CHECKPOINTS
  if not directory.is_dir():
    return []
  # Finalised steps only: a save still in flight (or killed) has a temporary name.
  return sorted(ocp.utils.step_from_checkpoint_name(p.name)
                for p in ocp.utils.checkpoint_steps_paths(directory))


def select_steps(workdir: str, steps: Sequence[int], checkpoint_step: int | None,
                 average_last: int, checkpoint: ml_collections.ConfigDict) -> list[int]:
  """The checkpoint steps to use: the newest (or `checkpoint_step`) and the N - 1 before it.

  Args:
    workdir: for messages.
    steps: the steps that exist (`checkpoint_steps`).
    checkpoint_step: the step to use (or to end the average at); None: the newest.
    average_last: N > 1 averages N checkpoints; 0 or 1: one checkpoint.
    checkpoint: the run's checkpoint.* (keep bounds how many exist; every spaces them).

  Returns:
    The selected steps, oldest first.

  Raises:
    ConfigError: no checkpoints, an unknown step, or fewer than `average_last`.
  """
  directory = os.path.join(os.path.abspath(workdir), layout.CHECKPOINTS)
  if not steps:
    raise ConfigError(f"{directory} holds no complete checkpoint: train first (a run saves "
                      "every checkpoint.every steps and at its end)")
  listed = ", ".join(map(str, steps))
  if checkpoint_step is None:
    end = len(steps)
  elif checkpoint_step in steps:
    end = steps.index(checkpoint_step) + 1
  else:
    raise ConfigError(f"--checkpoint_step={checkpoint_step}: {directory} has no such "
                      f"checkpoint; its steps are {listed}")
  if average_last < 0:
    raise ConfigError(f"--average_last={average_last} must be >= 0 (0 or 1: no averaging)")
  count = max(average_last, 1)
  if count > end:
    upto = "" if checkpoint_step is None else f" up to step {checkpoint_step}"
    if len(steps) >= checkpoint.keep:
      why = (f"a run keeps only its newest checkpoint.keep={checkpoint.keep}. Train with "
             f"--config.checkpoint.keep={count} (or more) to keep enough")
    else:
      why = (f"the run saved no more (one every checkpoint.every={checkpoint.every} steps and "
             f"at its end; checkpoint.keep={checkpoint.keep} would keep {checkpoint.keep})")
    raise ConfigError(
        f"--average_last={average_last} needs {count} checkpoints but {directory} holds "
        f"{end}{upto} (steps {', '.join(map(str, steps[:end]))}): {why}. Average at most "
        f"{end}.")
  return list(steps[end - count:end])


def _make_mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """The run's mesh; all devices data-parallel when its fixed sizes do not fit here."""
  try:
    return sharding.make_mesh(config.mesh)
  except ConfigError as e:
    logging.warning("%s; using the %d devices here data-parallel instead", e,
                    jax.device_count())
    config.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 1))
    return sharding.make_mesh(config.mesh)


def abstract_params(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> Any:
  """The model's parameters as sharded abstract arrays (shapes only, nothing allocated).

  The same logical specs and rules as a training run's `state.params`, so a
  checkpoint restores into exactly the placement training used.
  """
  model_config = ModelConfig.from_config(config.model)
  model = make_model(dataclasses.replace(model_config, deterministic=True))
  objective = objective_lib.resolve(model_config)
  batch = objectives.init_batch(objective, 1, config.data.seq_len)
  boxed = jax.eval_shape(
      lambda rng: model.init({"params": rng}, *objectives.model_inputs(objective, batch)),
      jax.random.PRNGKey(0))["params"]
  rules = sharding.rules_of(config.mesh, mesh)
  sharding.check_divisible(boxed, mesh, rules)  # One line, not jax's IndivisibleError.
  shardings = sharding.logical_to_shardings(nn.get_partition_spec(boxed), mesh, rules)
  return checkpointing.abstract_like(nn.meta.unbox(boxed), shardings)


# Every mode here may run beside the training run that writes the workdir, whose
# checkpoint manager deletes what falls out of checkpoint.keep as it saves: the chosen
# checkpoint can vanish while it is read (with keep=1, at every save). A reader lock
# the trainer respected would make training wait on readers (or outgrow keep on disk);
# instead a read that lost the race picks again from what exists now. Bounded: a retry
# follows a save, so only a run saving faster than one read runs out of them.
READ_ATTEMPTS = 3


def _read_params(workdir: str, config: ml_collections.ConfigDict, steps: Sequence[int],
                 abstract: Any, mesh: jax.sharding.Mesh,
                 merge_from: ml_collections.ConfigDict | None = None) -> Any:
  """The parameters of `steps` (their mean when several), after the damage check.

  `merge_from`: the LoRA model config the checkpoints were written with, when `abstract`
  is the model without adapters: each checkpoint's adapters are merged into their
  kernels before the mean.
  """
  directory = os.path.join(os.path.abspath(workdir), layout.CHECKPOINTS)
  for step in steps:  # Damage that shows without reading arrays (see checkpointing.py).
    problem = checkpointing.checkpoint_problem(os.path.join(directory, str(step)), ("state",))
    if problem:
      others = [s for s in checkpoint_steps(workdir) if s != step]
      raise ConfigError(f"checkpoint {step} in {directory} is damaged: {problem[1]}. Use "
                        "another one with --checkpoint_step=N"
                        + (f" (the others: {', '.join(map(str, others))})" if others else
                           " (there is no other)"))
  stored, transform = abstract, None
  if merge_from is not None:
    stored = abstract_params(merge_from, mesh)
    transform = jax.jit(lambda p: lora.merge(p, merge_from.model, xp=jnp),
                        out_shardings=jax.tree.map(lambda x: x.sharding, abstract))
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.rules_of(config.mesh, mesh)):
    return averaging.average_params(
        [os.path.join(directory, str(step), layout.STATE) for step in steps],
        stored, os.path.join(workdir, layout.CONFIG), transform=transform,
        result_params=abstract)


def _deleted_while_read(workdir: str, steps: Sequence[int], keep: int) -> int | None:
  """The first of `steps` that training deleted (or is deleting) since it was chosen.

  Gone, no longer listed, or with `keep` newer checkpoints beside it: a step the
  trainer's checkpoint manager removes (mid-deletion its folder is still there).
  """
  now = checkpoint_steps(workdir)
  directory = os.path.join(os.path.abspath(workdir), layout.CHECKPOINTS)
  for step in steps:
    newer = sum(1 for s in now if s > step)
    if (not os.path.isdir(os.path.join(directory, str(step))) or step not in now
        or (keep > 0 and newer >= keep)):
      return step
  return None


@dataclasses.dataclass
class LoadedRun:
  """A trained model ready to use: config, mesh, parameters and tokenizer."""

  workdir: str
  config: ml_collections.ConfigDict
  model_config: ModelConfig
  mesh: jax.sharding.Mesh
  abstract_params: Any  # Shapes and shardings of `params` (what a checkpoint restores into).
  params: Any
  tokenizer: vocabularies.Tokenizer
  steps: list[int]  # The checkpoint(s) the params come from (several: their mean).

  @property
  def step(self) -> int:
    return self.steps[-1]

  @property
  def param_shardings(self) -> Any:
    return jax.tree.map(lambda x: x.sharding, self.abstract_params)

  def checkpoint_label(self) -> str:
    """'checkpoint 400' or 'mean of checkpoints 200, 300, 400'."""
    if len(self.steps) == 1:
      return f"checkpoint {self.step}"
    return f"mean of checkpoints {', '.join(map(str, self.steps))}"

  @contextlib.contextmanager
  def context(self):
    """Mesh + logical rules in scope, needed while tracing the activation constraints."""
    rules = sharding.rules_of(self.config.mesh, self.mesh)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(rules):
      yield

  def require(self, mode: str, serves: Callable[[objective_lib.Objective], bool],
              does: str) -> objective_lib.Objective:
    """The run's objective when `mode` serves it; else one line naming the objectives
    (and topologies) that `serves` accepts.

    Args:
      mode: the mode's name, for the message ("translate").
      serves: whether the mode serves a resolved objective.
      does: what the mode does, for the message ("translates sentences").
    """
    model = self.config.model
    objective = objective_lib.resolve(model)
    if not serves(objective):
      raise ConfigError(
          f"--mode={mode} {does}: it serves {objective_lib.describe(serves)}; "
          f"{self.workdir} holds a {objective.name} model (model.arch={model.arch!r}, "
          f"model.head={model.head!r}, model.objective={model.objective!r})")
    return objective

  def sampling_rng(self, seed: int | None) -> jax.Array | None:
    """The sampling key: `seed`, else the run's config.seed; None when not sampling."""
    if self.config.decode.temperature <= 0:
      return None
    return jax.random.PRNGKey(self.config.seed if seed is None else seed)


def _set_decode(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> None:
  """Sets the decode.* `overrides` (None values ignored) on `config` and validates them."""
  overrides = {k: v for k, v in overrides.items() if v is not None}
  if (overrides.get("temperature", 0) > 0 and overrides.get("beam_size", 1) > 1):
    raise ConfigError(f"--beam_size={overrides['beam_size']} with --temperature="
                      f"{overrides['temperature']}: beam search does not sample; give one")
  for key, value in overrides.items():
    if key not in config.decode:
      raise ConfigError(f"decode override {key!r} is not a decode.* field; valid: "
                        f"{sorted(config.decode)}")
    config.decode[key] = type(config.decode[key])(value)
  validate_decode(config)
  if config.decode.temperature > 0 and config.decode.beam_size > 1:
    logging.info("Sampling at temperature %s: decode.beam_size=%d is not used",
                 config.decode.temperature, config.decode.beam_size)


def load_run(workdir: str, *, config: ml_collections.ConfigDict | None = None,
             checkpoint_step: int | None = None, average_last: int = 0,
             decode_overrides: Mapping[str, Any] | None = None,
             model_overrides: Mapping[str, Any] | None = None) -> LoadedRun:
  """Reads a run's config, tokenizer and parameters (see the module docstring for which from where).

  Args:
    workdir: the run's workdir.
    config: optional config whose data.* and decode.* replace the run's.
    checkpoint_step: the checkpoint to use; None: the newest.
    average_last: N > 1: the mean of the newest N checkpoints (up to checkpoint_step).
    decode_overrides: decode.* fields to set (launch.py's --beam_size, ...); None
      values are ignored.
    model_overrides: {"model.key": value} from --config.model.* flags (load_config).

  Returns:
    The LoadedRun, its parameters in the model's shardings.

  Raises:
    ConfigError: a missing config.json, tokenizer or checkpoint, an unknown step,
      too few checkpoints to average, or a checkpoint that does not fit the model.
  """
  config = load_config(workdir, config, model_overrides)
  _set_decode(config, decode_overrides or {})
  tokenizer = run_vocabulary.load_workdir_tokenizer(workdir)
  mesh = _make_mesh(config)
  merge_from = None
  if config.model.lora_rank and average_last > 1:
    # The mean of several LoRA checkpoints is the mean of their merged kernels (the mean
    # of products A . B is not the product of the means), which no rank-r adapter
    # holds: the averaged run is the model without adapters.
    merge_from, config = config, config.copy_and_resolve_references()
    config.model.lora_rank = 0
    logging.info("Averaging a LoRA run: each checkpoint's adapters are merged into their "
                 "kernels before the mean; the result has no adapters (model.lora_rank=0)")
  abstract = abstract_params(config, mesh)
  for attempt in range(READ_ATTEMPTS):
    steps = select_steps(workdir, checkpoint_steps(workdir), checkpoint_step, average_last,
                         config.checkpoint)
    # Every process: the same run, config, vocabulary and checkpoints (a save finishing
    # between two processes' listings would otherwise give them different steps).
    distributed.agree({"config": {**run_record.flat_config(config),
                                  "--workdir": os.path.abspath(workdir)},
                       "data": run_data.identity(
                           {run_data.TOKENIZER: run_vocabulary.tokenizer_identity(tokenizer)}),
                       "checkpoint": {"steps": steps}}, ConfigError)
    try:
      with progress.stage(f"Reading the parameters of step {steps[-1]}"
                          + (f" (the mean of {len(steps)} checkpoints)" if len(steps) > 1
                             else "")):
        params = _read_params(workdir, config, steps, abstract, mesh, merge_from)
      break
    except Exception as e:  # pylint: disable=broad-except
      gone = _deleted_while_read(workdir, steps, config.checkpoint.keep)
      if not gone:
        raise
      where = (f"checkpoint {gone} of {os.path.abspath(workdir)} was deleted while it was "
               f"read (a training run beside this one keeps only its newest "
               f"checkpoint.keep={config.checkpoint.keep})")
      if checkpoint_step is not None or jax.process_count() > 1:
        # A named step cannot be swapped for another; several processes would each
        # pick on their own. Either way: one line, not the reader's traceback.
        raise ConfigError(f"{where}; run the command again (without --checkpoint_step it "
                          "reads the newest), or stop the training first") from None
      if attempt + 1 == READ_ATTEMPTS:
        raise ConfigError(f"{where}, {READ_ATTEMPTS} times in a row ({type(e).__name__}); "
                          "the run saves faster than this reads: stop it first, or train "
                          "with a larger --config.checkpoint.keep") from None
      logging.warning("%s; reading the newest checkpoint instead", where)
  run = LoadedRun(workdir=workdir, config=config,
                  model_config=ModelConfig.from_config(config.model), mesh=mesh,
                  abstract_params=abstract, params=params, tokenizer=tokenizer, steps=steps)
  logging.info("Loaded %s of %s (%s, arch %s)", run.checkpoint_label(), workdir,
               objective_lib.resolve(config.model).name, config.model.arch)
  return run
