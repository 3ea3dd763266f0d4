"""Trains a model, or uses a trained one: `python launch.py --config=configs/gpt_small.py:local`.

  --mode=train (default)  train_and_evaluate(--config, --workdir); rerunning resumes
  --mode=evaluate         loss / perplexity / accuracy (+ sacreBLEU, chrF) on a split
  --mode=translate        --input (or stdin), one sentence a line -> --output (or stdout)
  --mode=generate         continue --prompt (or each stdin line) with a decoder LM
  --mode=average          the mean of the newest --average_last checkpoints -> --output
  --mode=import           a local Hugging Face folder (--hf_dir: GPT-2, BERT, Marian, T5) ->
                          a new --workdir that the other modes and init_from read
  --mode=export           --workdir's GPT-2-shaped decoder -> a Hugging Face folder --hf_dir
  --mode=plot             PNG curves of --workdir's metrics.jsonl -> <workdir>/plots/
  --mode=sweep            one run per point of the --sweep grid, each in a subfolder of
                          --workdir; rerunning resumes it; then compares them
  --mode=compare          a Markdown table and overlaid curves of --compare_dirs (or
                          the runs in --workdir) -> <workdir>/compare.md, compare_*.png
  --mode=compile          --config's steps compiled for a TPU slice (--topology=v5p:4x4x4)
                          on this CPU host: fits or not, step-time estimate -> --output
                          (transformer/cli/compile.py; needs `pip install libtpu`)

Every mode but train and sweep reads the model, vocabulary and checkpoints from --workdir;
--config is then optional and only its data.* and decode.* are used
(transformer/commands.py says what comes from where). plot and compare need no
--config; they and sweep start no JAX devices (a sweep's runs are processes of their own).

Thin by design: parse flags, start jax.distributed when several processes are in
play, log the process/device picture, and call one library function.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from transformer import usage
from transformer.cli import compile as compile_mode  # Defines --topology and its flags.

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
_MODE = flags.DEFINE_enum(
    "mode", "train",
    ["train", "evaluate", "translate", "generate", "average", "plot", "sweep", "compare",
     "import", "export", "compile"],
    "What to do with --workdir; evaluate, translate, generate, average and plot need a "
    "trained workdir.")
_CHECKPOINT_STEP = flags.DEFINE_integer(
    "checkpoint_step", None, "The checkpoint to use (default: the newest).")
_AVERAGE_LAST = flags.DEFINE_integer(
    "average_last", 0, "Use the mean of the parameters of the newest N checkpoints (up "
    "to --checkpoint_step); the paper: 5 for base, 20 for big. 0: no averaging.")
_SPLIT = flags.DEFINE_string("split", "", "evaluate: the split (default data.eval_split).")
_MAX_EXAMPLES = flags.DEFINE_integer(
    "max_examples", 0, "evaluate: score only the split's first N examples (0: all).")
_INPUT = flags.DEFINE_string("input", "", "translate: one sentence a line (default stdin).")
_OUTPUT = flags.DEFINE_string(
    "output", "", "translate: the output file (default stdout); evaluate: the result JSON "
    "(default in the workdir); average: the new workdir; compile: the report as JSON.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Allow replacing an existing --output.")
_PROMPT = flags.DEFINE_string(
    "prompt", None, "generate: the text to continue (default: each line of stdin).")
_SWEEP = flags.DEFINE_string(
    "sweep", "", "sweep: config overrides to grid over, 'model.norm=pre,post;"
    "model.position=rope,alibi', or a JSON file (transformer/sweep.py).")
_COMPARE_DIRS = flags.DEFINE_list(
    "compare_dirs", [], "compare: the workdirs to compare (default: the runs in --workdir).")
_LOG_STEPS = flags.DEFINE_bool("log_steps", False, "plot, compare, sweep: log-scaled step axis.")
_SEED = flags.DEFINE_integer("seed", None, "Sampling seed (default config.seed).")
_HF_DIR = flags.DEFINE_string(
    "hf_dir", "", "import: the Hugging Face model folder to read (config.json + "
    "model.safetensors); export: the folder to write.")
# decode.* fields these flags set, over the workdir's (or --config's) values.
_DECODE_FLAGS = {
    "beam_size": flags.DEFINE_integer("beam_size", None, "decode.beam_size: 1 is greedy."),
    "alpha": flags.DEFINE_float("alpha", None, "decode.alpha: beam length penalty."),
    "max_length_offset": flags.DEFINE_integer(
        "max_length_offset", None, "decode.max_length_offset: output <= source + this."),
    "max_new_tokens": flags.DEFINE_integer(
        "max_new_tokens", None, "decode.max_new_tokens: tokens generate adds."),
    "temperature": flags.DEFINE_float(
        "temperature", None, "decode.temperature: > 0 samples (0: greedy / beam)."),
    "top_k": flags.DEFINE_integer("top_k", None, "decode.top_k: sample among the k likeliest."),
    "top_p": flags.DEFINE_float("top_p", None, "decode.top_p: nucleus sampling mass."),
    "batch_size": flags.DEFINE_integer(
        "decode_batch_size", None, "decode.batch_size: sentences decoded together."),
    "overlong": flags.DEFINE_enum(
        "overlong", None, ["truncate", "error"], "decode.overlong: a source or prompt "
        "longer than the context is truncated (warned) or stops the command."),
}


def default_workdir(config_path: str) -> str:
  """runs/gpt_small_local for configs/gpt_small.py:local."""
  path, _, arg = config_path.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", f"{name}_{arg}" if arg else name)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  mode = _MODE.value
  if mode in ("train", "sweep", "compile") and _CONFIG.value is None:
    raise app.UsageError(f"--config is required for --mode={mode}")
  if mode == "compile":  # No workdir, no jax.distributed: it compiles on this host's CPU.
    sys.exit(compile_mode.run(_CONFIG.value))
  if mode != "train" and not _WORKDIR.value:
    raise app.UsageError(f"--mode={mode} needs --workdir=DIR, "
                         + _WORKDIR_OF.get(mode, "a trained run"))
  if mode == "sweep" and not _SWEEP.value:
    raise app.UsageError("--mode=sweep needs --sweep='model.norm=pre,post;...' or a JSON file")
  # Imported here so that `--help` stays fast and flags parse before JAX starts.
  from transformer import console  # pylint: disable=g-import-not-at-top
  console.setup_console()  # Project INFO and all warnings, without absl's prefix.
  if mode in _FILE_MODES:
    # Before JAX starts: these read files, and a sweep's runs are launch.py processes of
    # their own that need the accelerators (and jax.distributed) free.
    from transformer.configuration import ConfigError, DataError  # pylint: disable=g-import-not-at-top
    try:
      sys.exit(_run_on_files(mode, _WORKDIR.value))
    except (ConfigError, DataError) as e:
      sys.stderr.write(f"\n{type(e).__name__}: {e}\n")
      sys.exit(2)
  import jax  # pylint: disable=g-import-not-at-top
  from transformer import distributed  # pylint: disable=g-import-not-at-top

  try:
    distributed.initialize(
        auto=_DISTRIBUTED.value, coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
        heartbeat_timeout_seconds=_HEARTBEAT.value)
  except ValueError as e:  # Incomplete --coordinator_address/--num_processes/--process_id.
    raise app.UsageError(str(e)) from e

  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  # Other modes check their workdir; import writes a new one, which must start empty.
  if mode == "train" or (os.path.isdir(workdir) and mode != "import"):
    console.log_to_file(workdir, jax.process_index())  # The full-format log.
  logging.info("Workdir: %s", os.path.abspath(workdir))
  logging.info("JAX process %d of %d, %d local / %d global devices (%s)",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count(), jax.devices()[0].platform)
  from transformer.configuration import ConfigError, DataError  # pylint: disable=g-import-not-at-top
  try:
    with distributed.fail_together():
      try:
        _run(mode, workdir)
      except Exception as e:  # pylint: disable=broad-except
        if not isinstance(e, (ConfigError, DataError)):  # Python prints it on the console.
          logging.exception("Stopped by an error", extra={"console": False})
        raise
  except (ConfigError, DataError) as e:
    # A user's mistake, not a bug: the message names the key or file; no traceback.
    logging.error("%s: %s", type(e).__name__, e, extra={"console": False})
    sys.stderr.write(f"\n{type(e).__name__}: {e}\n")
    sys.exit(2)
  except OSError as e:  # The machine's: a full disk, no permission (else a bug: re-raised).
    message = usage.environment_error(e)
    if message is None:
      raise
    sys.stderr.write(f"\n{type(e).__name__}: {message}\n")
    sys.exit(2)


_FILE_MODES = ("plot", "sweep", "compare")
_WORKDIR_OF = {"plot": "a training run's workdir", "sweep": "the sweep's folder",
               "compare": "a sweep's folder, or where compare.md goes with --compare_dirs"}
# Passed on to each run of a sweep: every run is one jax.distributed job.
_LAUNCHER_FLAGS = ("distributed", "coordinator_address", "num_processes", "process_id",
                   "heartbeat_timeout_seconds")


def _run_on_files(mode: str, workdir: str) -> int:
  """plot, compare, sweep: calls the library function of `mode`; returns the exit status."""
  from transformer import compare  # pylint: disable=g-import-not-at-top
  from transformer import plots  # pylint: disable=g-import-not-at-top
  if mode == "plot":
    print("\n".join(plots.write_plots(workdir, log_steps=_LOG_STEPS.value)))
    return 0
  if mode == "compare":
    runs = _COMPARE_DIRS.value or compare.find_runs(workdir)
    print(compare.compare(runs, workdir, log_steps=_LOG_STEPS.value))
    return 0
  from transformer import sweep  # pylint: disable=g-import-not-at-top
  config_flag = flags.FLAGS["config"]
  launcher = [f"--{name}={flags.FLAGS[name].value}" for name in _LAUNCHER_FLAGS
              if flags.FLAGS[name].present]
  return sweep.run_sweep(_CONFIG.value, config_flag.config_filename, workdir, _SWEEP.value,
                         fixed=config_flag.override_values, launcher_flags=launcher,
                         log_steps=_LOG_STEPS.value)


def _run(mode: str, workdir: str) -> None:
  """Calls the library function of `mode`."""
  from transformer import commands  # pylint: disable=g-import-not-at-top
  from transformer import train  # pylint: disable=g-import-not-at-top
  if mode == "train":
    train.train_and_evaluate(_CONFIG.value, workdir)
    return
  if mode in ("import", "export"):
    from transformer import hf_import  # pylint: disable=g-import-not-at-top
    if not _HF_DIR.value:
      raise app.UsageError(f"--mode={mode} needs --hf_dir=DIR, the Hugging Face folder")
    if mode == "import":
      hf_import.import_folder(_HF_DIR.value, workdir, _CONFIG.value)
    else:
      hf_import.export_gpt2(workdir, _HF_DIR.value, checkpoint_step=_CHECKPOINT_STEP.value)
    return
  checkpoint = dict(checkpoint_step=_CHECKPOINT_STEP.value, average_last=_AVERAGE_LAST.value)
  if mode == "average":
    commands.average(workdir, _OUTPUT.value, **checkpoint)
    return
  common = dict(config=_CONFIG.value, seed=_SEED.value,
                decode_overrides={key: flag.value for key, flag in _DECODE_FLAGS.items()},
                **checkpoint)
  if mode == "evaluate":
    commands.evaluate(workdir, split=_SPLIT.value, max_examples=_MAX_EXAMPLES.value,
                      output=_OUTPUT.value, overwrite=_OVERWRITE.value, **common)
  elif mode == "translate":
    commands.translate(workdir, input_path=_INPUT.value, output_path=_OUTPUT.value,
                       overwrite=_OVERWRITE.value, **common)
  else:
    prompts = None if _PROMPT.value is None else [_PROMPT.value]
    commands.generate(workdir, prompts, **common)


def run(argv: list[str] | None = None) -> None:
  """`python launch.py ...` (tests pass argv): parse flags, then main; exits with its status."""
  app.run(main, argv=argv, flags_parser=usage.parse_flags)


if __name__ == "__main__":
  run()
