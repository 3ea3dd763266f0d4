"""Trains a model from a config file: `python launch.py --config=configs/gpt_small.py:local`.

Thin by design: parse flags, start jax.distributed when several processes are in
play, log the process/device picture, and call `train_and_evaluate`.
"""

import logging as std_logging
import os

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with an argument: configs/gpt_small.py:local.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where checkpoints, metrics.jsonl, TensorBoard events and config.json "
    "go; default runs/<config name>[_<arg>]. Rerunning with the same workdir resumes.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Start jax.distributed with cluster auto-detection "
    "(TPU pod slices, SLURM, Open MPI).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0, for explicit CPU/GPU clusters.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process, 0..num_processes-1.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", 100, "A peer silent this long ends every process with "
    "an error (no silent hang).")
flags.mark_flags_as_required(["config"])


def default_workdir(config_path: str) -> str:
  """runs/gpt_small_local for configs/gpt_small.py:local."""
  path, _, arg = config_path.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", f"{name}_{arg}" if arg else name)


# Libraries whose INFO lines would bury the progress line; their warnings still show.
_QUIET_LIBRARIES = ("/orbax/", "/tensorflow_datasets/", "/grain/", "/etils/")


def _drop_library_info(record) -> bool:
  # Standard-library levels here: absl.logging.WARNING is absl's own numbering.
  return record.levelno >= std_logging.WARNING or not any(
      lib in record.pathname for lib in _QUIET_LIBRARIES)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_drop_library_info)
  # Imported here so that `--help` stays fast and flags parse before JAX starts.
  import jax  # pylint: disable=g-import-not-at-top
  from transformer import distributed  # pylint: disable=g-import-not-at-top
  from transformer import train  # pylint: disable=g-import-not-at-top

  distributed.initialize(
      auto=_DISTRIBUTED.value, coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
      heartbeat_timeout_seconds=_HEARTBEAT.value)

  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  logging.info("Workdir: %s", os.path.abspath(workdir))
  print(f"Workdir: {os.path.abspath(workdir)}", flush=True)
  logging.info("JAX process %d of %d, %d local / %d global devices (%s)",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count(), jax.devices()[0].platform)
  with distributed.fail_together():
    train.train_and_evaluate(_CONFIG.value, workdir)


if __name__ == "__main__":
  app.run(main)
