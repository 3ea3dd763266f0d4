"""--mode=average: the mean of the newest --average_last checkpoints -> a new workdir --output."""

from __future__ import annotations

import json
import os
import shutil

import jax
import ml_collections
from absl import logging

from transformer import distributed
from transformer.cli import common
from transformer.config.errors import ConfigError
from transformer.inference import loaded
from transformer.workdir import checkpointing
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import progress

STARTS_JAX = True
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("output", "average_last", "checkpoint_step")


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=average (--config is not used)."""
  del config
  average(workdir, common.OUTPUT.value, average_last=common.AVERAGE_LAST.value,
          checkpoint_step=common.CHECKPOINT_STEP.value)


def average(workdir: str, output: str, *, average_last: int,
            checkpoint_step: int | None = None) -> str:
  """Writes the mean of the newest `average_last` checkpoints' parameters as a new run.

  The new workdir holds config.json, the tokenizer files, `averaged.json` (the source
  run and steps) and one checkpoint, `checkpoints/<newest averaged step>/state`, with
  only the parameters: the other modes and `config.init_from` read it; it cannot
  resume training (no optimizer state). A LoRA run's checkpoints are averaged with
  their adapters merged into the kernels, so the new run has no adapters
  (model.lora_rank=0 in its config.json). The source workdir is only read. The new
  workdir is complete or absent (workdir/files.py's `complete_or_absent`).

  Args:
    workdir: the run to average.
    output: the new workdir; must not exist or be empty.
    average_last: N >= 1 checkpoints (the paper: 5 for base, 20 for big).
    checkpoint_step: the newest checkpoint of the average; None: the run's newest.

  Returns:
    The path of the new checkpoint directory.

  Raises:
    ConfigError: output is the source or not empty, or there are too few checkpoints.
    OSError: the machine refused a write (a full disk), naming --output.
  """
  if not output:
    raise ConfigError("--mode=average needs --output=DIR, the new workdir to write")
  source, target = os.path.abspath(workdir), os.path.abspath(output)
  if target == source or target.startswith(source + os.sep):
    raise ConfigError(f"--output={output!r} is inside the source workdir {source}, which "
                      "is never modified; choose another directory")
  if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
    raise ConfigError(f"--output={output!r} exists and is not an empty directory; choose a "
                      "new one (nothing is overwritten)")
  if average_last < 1:
    raise ConfigError(f"--average_last={average_last}: say how many checkpoints to average "
                      "(>= 1; the paper averages 5 for base, 20 for big)")
  run = loaded.load_run(workdir, checkpoint_step=checkpoint_step, average_last=average_last)
  step = run.step
  writer = jax.process_index() == 0
  # Complete or absent: a full disk or Ctrl-C leaves no partial --output to refuse later.
  with files.complete_or_absent(target, "--output", writer=writer,
                                barrier=distributed.barrier) as partial:
    if writer:
      for name in (layout.CONFIG, layout.TOKENIZER_RECORD, layout.DATASET_RECORD):
        if name == layout.DATASET_RECORD and not os.path.exists(os.path.join(source, name)):
          continue  # A run from before dataset.json was kept.
        # dataset.json too: evaluating the averaged run checks its data as the source's.
        shutil.copyfile(os.path.join(source, name), os.path.join(partial, name))
      with open(os.path.join(source, layout.CONFIG), encoding="utf-8") as f:
        source_config = json.load(f)
      if source_config["model"].get("lora_rank") != run.config.model.lora_rank:
        # A LoRA run's mean has its adapters merged (loaded.load_run): the new run is
        # the model without adapters, every other key as the source has it.
        source_config["model"]["lora_rank"] = run.config.model.lora_rank
        files.write_atomically(os.path.join(partial, layout.CONFIG),
                               json.dumps(source_config, indent=2))
      with open(os.path.join(source, layout.TOKENIZER_RECORD), encoding="utf-8") as f:
        vocabulary = json.load(f).get("file")
      if vocabulary:
        shutil.copyfile(os.path.join(source, vocabulary), os.path.join(partial, vocabulary))
      files.write_atomically(os.path.join(partial, layout.AVERAGED),
                             json.dumps({"source": source, "steps": run.steps}, indent=2))
    # Every process writes its shards of the parameters.
    checkpoints = os.path.join(partial, layout.CHECKPOINTS)
    with files.disk_errors_as_oserror(checkpoints, "--output"), \
        progress.stage(f"average: writing the parameters to {target}"):
      checkpointing.save_params(checkpoints, step, run.params)
  path = os.path.join(target, layout.CHECKPOINTS, str(step))
  logging.info("Wrote the %s of %s to %s", run.checkpoint_label(), source, path)
  if jax.process_index() == 0:
    print(f"Wrote the {run.checkpoint_label()} of {source} to {path}", flush=True)
  return path
