"""Trains a model, or uses a trained one: `python launch.py --config=configs/gpt_small.py:local`.

{modes}

Config keys: `--mode=keys` lists every key with its value and its comment from
configs/base.py (with --config=..., that preset's values); --config.KEY=VALUE sets one.

Each mode is one module of transformer/cli/ (MODES below) that defines the flags it
owns; the flags several modes share are in transformer/cli/common.py, and each mode
lists those it reads (SHARED_FLAGS): a flag the chosen mode does not read stops the
command in one line naming the modes that do. Every mode but
train and sweep reads the model, vocabulary and checkpoints from --workdir; --config
is then optional and only its data.* and decode.* are used
(transformer/inference/loaded.py says what comes from where). plot and compare need no
--config; they and sweep start no JAX devices (a sweep's runs are processes of their own).

Thin by design: parse flags, start jax.distributed when several processes are in
play, hold the workdir's lock (train and sweep: a second command on the same workdir
stops with "workdir ... in use by PID N on HOST", exit 2), log the process/device
picture, and call the mode's `main`. A mode's `check_config(config, workdir)`, where it has one
(train, sweep), runs before the workdir is created or locked: a failed check creates
nothing. Ctrl-C or SIGTERM outside the training loop ends the command with one line
and 130 / 143, after the cleanups on the way up (outputs are complete or absent), and
then ends without the interpreter's teardown (JAX's threads may still be compiling).
"""

import atexit
import contextlib
import os
import signal
import sys

# SIGINT / SIGTERM that came after the mode had returned successfully, and whether this
# is `python launch.py` (its exit hooks are then guarded too) with its exit status.
_LATE_SIGNALS: list[int] = []
_AS_SCRIPT = {"running": False, "status": None, "interrupted": False}


def _late_signal_at_exit() -> None:
  """A signal during the interpreter's exit, after a command succeeded: one line, 128 +
  the signal. Registered before any library's exit hook, so it runs after all of them;
  after it, in the interpreter's last teardown, signals are ignored."""
  if not _AS_SCRIPT["running"]:
    return
  if not (_LATE_SIGNALS and _AS_SCRIPT["status"] in (None, 0)):
    # Python's finalization puts SIG_DFL back for its handlers (not for SIG_IGN): a
    # signal while JAX's backends are torn down would kill the process, with no line.
    for sig in (signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, signal.SIG_IGN)
    return
  signum = _LATE_SIGNALS[-1]
  sys.stdout.flush()
  sys.stderr.write(_late_signal_line(signum))
  sys.stderr.flush()
  os._exit(128 + signum)  # pylint: disable=protected-access


atexit.register(_late_signal_at_exit)

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from transformer import accelerator
from transformer import gc_tuning
from transformer.workdir import console

# Before anything loads JAX: a host without a TPU or GPU starts JAX's CPU backend only,
# without libtpu's and the CUDA plugin's complaints (a real TPU VM or GPU host, or a
# JAX_PLATFORMS the user set, is left alone).
console.quiet_absent_accelerators()
# On a GPU host: the XLA flags and memory fraction a GPU run should have, where the user
# set none (transformer/accelerator.py lists them and why); logged once the console is up.
_ACCELERATOR_SETTINGS = accelerator.configure_environment()

# The mode modules define their flags on import; JAX's backends start only once a mode
# runs, so flags parse before any device is touched.
from transformer.cli import average  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.cli import benchmark
from transformer.cli import classify
from transformer.cli import common
from transformer.cli import compare
from transformer.cli import compile as compile_mode
from transformer.cli import evaluate
from transformer.cli import generate
from transformer.cli import hf_export
from transformer.cli import hf_import
from transformer.cli import keys
from transformer.cli import passkey
from transformer.cli import plot
from transformer.cli import prepare
from transformer.cli import sweep
from transformer.cli import train
from transformer.cli import translate
from transformer.cli import usage

MODES = {"train": train, "evaluate": evaluate, "translate": translate, "generate": generate,
         "classify": classify, "passkey": passkey, "benchmark": benchmark, "average": average,
         "import": hf_import, "export": hf_export, "plot": plot, "sweep": sweep,
         "compare": compare, "compile": compile_mode, "prepare": prepare, "keys": keys}

# --help prints this docstring: each mode's line is the first sentence of its module's
# docstring (and a Hugging Face mode's model_types come from the family tables).
__doc__ = __doc__.replace("{modes}", usage.modes_help(MODES))

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
    "mode", "train", list(MODES),
    "What to do (each mode is a module of transformer/cli/; --help says what each does); "
    "--mode=keys lists the config keys.")
_NEEDS_CONFIG = ("train", "sweep", "compile", "prepare")
# Modes that need no --workdir: train defaults to runs/<config>; compile, keys and prepare
# (which writes under data.data_dir) write none.
_NO_WORKDIR = ("train", "compile", "keys", "prepare")
# Modes that hold their workdir's lock (workdir/lock.py): those that train into it. The
# others only read a run, or write result files atomically, so they may run beside it
# (evaluate a run while it trains); import refuses a workdir that is not empty.
_LOCKED = ("train", "sweep")
_WORKDIR_OF = {"plot": "a training run's workdir", "sweep": "the sweep's folder",
               "compare": "a sweep's folder, or where compare.md goes with --compare_dirs"}


class Stopped(KeyboardInterrupt):
  """SIGTERM outside the training loop, raised like Ctrl-C's KeyboardInterrupt.

  So every `with` and `finally` on the way up runs (temporary files and folders are
  removed: outputs stay complete or absent) and launch.py ends with one line and 128 +
  the signal. The training loop installs its own handlers while it trains (it saves
  first) and puts these back after.
  """

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _raise_stopped(signum, frame) -> None:
  del frame
  raise Stopped(signum)


def _exit_interrupted(error: KeyboardInterrupt, mode: str) -> None:
  """One line and 130 (Ctrl-C) / 143 (SIGTERM) for a command stopped by a signal.

  The line says what is on disk: nothing partial, or, when the signal came after an
  output was made whole (workdir/files.py notes each), that output's path and flag.
  """
  from transformer.workdir import files  # pylint: disable=g-import-not-at-top
  signum = getattr(error, "signum", signal.SIGINT)
  name = signal.Signals(signum).name
  finished = files.finished_outputs()
  if finished:
    where = ", ".join(f"{path} ({flag})" for path, flag in finished)
    sys.stderr.write(f"\nStopped by {name} after --mode={mode} had written its output "
                     f"completely: {where}; it is whole and usable as is (exit status "
                     f"{128 + signum})\n")
  else:
    sys.stderr.write(f"\nStopped by {name}: --mode={mode} did not finish and left no "
                     "partial output; rerun the same command\n")
  _AS_SCRIPT["interrupted"] = True  # `python launch.py` then ends without teardown.
  sys.exit(128 + signum)


def _exit_without_teardown(status: int) -> None:
  """Ends a `python launch.py` stopped by a signal now, after its one line: no exit
  hooks, no interpreter teardown.

  The signal may have cut the main thread's wait on work that JAX's threads go on with
  (a compile of the decode step, a computation): JAX's exit hook and the interpreter's
  last garbage collection then destroy the backend under that thread, which ends in
  `Fatal Python error: Segmentation fault`, exit 139, after the right line (seen on
  --mode=translate and generate, 1 in 2 tries). Or a second signal gave up a save
  whose Orbax thread the exit would join, forever if it waits on a dead peer
  (workdir/files.py's `abandoned_writes`). Every cleanup of the command (its
  `with` and `finally` blocks: temporary outputs, the workdir lock) has run on the way
  up; what is left is flushing the logs.
  """
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  std_logging.shutdown()  # log.txt's handler flushed and closed.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def _late_signal_line(signum: int) -> str:
  """The line for a signal that came after the command had succeeded."""
  from transformer.workdir import files  # pylint: disable=g-import-not-at-top
  mode = _MODE.value if flags.FLAGS.is_parsed() else "train"
  finished = ", ".join(f"{path} ({flag})" for path, flag in files.finished_outputs())
  return (f"\n{signal.Signals(signum).name} came after --mode={mode} had finished"
          f"{': its output is complete: ' + finished if finished else ''}; nothing was cut "
          f"short (exit status {128 + signum})\n")


def _say_unseen_characters() -> None:
  """One warning for the characters a fixed character vocabulary lacked (they became
  the unknown id), however many texts the mode encoded; nothing when there were none."""
  # Loaded by the modes that encode text.
  vocabularies = sys.modules.get("transformer.data.tokenizers.vocabularies")
  line = vocabularies.unseen_line() if vocabularies is not None else None
  if line:
    logging.warning("%s", line)


def _finished() -> None:
  """From here on a signal is noted, not raised: the mode returned and its outputs are
  whole, so the exit (absl's, JAX's and Orbax's exit hooks) is never cut short by a
  KeyboardInterrupt traceback; run() (or, during the exit, `_late_signal_at_exit`)
  says it in one line."""
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda signum, frame: _LATE_SIGNALS.append(signum))


def _created_by_a_failed_check(workdir: str | None, existed: bool) -> None:
  """Removes a workdir this command created that holds only its lock and log files (and
  an empty checkpoints/).

  A check that fails once the lock is taken (a dataset that cannot be built, an
  indivisible weight found late), or a Ctrl-C before anything was written, then
  still creates nothing.
  """
  from transformer.workdir import layout  # pylint: disable=g-import-not-at-top
  if existed or not workdir or not os.path.isdir(workdir):
    return
  names = set(os.listdir(workdir))
  own = {layout.LOCK, layout.LOG} | {n for n in names if n.startswith("log_process")}
  # The checkpoint manager makes checkpoints/ when it starts: empty, nothing was saved.
  checkpoints = os.path.join(workdir, layout.CHECKPOINTS)
  empty_checkpoints = os.path.isdir(checkpoints) and not os.listdir(checkpoints)
  if empty_checkpoints:
    names.discard(layout.CHECKPOINTS)
  if names <= own:
    for name in names:
      os.remove(os.path.join(workdir, name))
    if empty_checkpoints:
      os.rmdir(checkpoints)
    os.rmdir(workdir)


def default_workdir(config_path: str) -> str:
  """runs/gpt_small_local for configs/gpt_small.py:local."""
  path, _, arg = config_path.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", f"{name}_{arg}" if arg else name)


def check_usage(argv: list[str]) -> str:
  """The parsed command line's checks that need no JAX and no config: the --mode, its
  flags, --config / --workdir / --sweep where the mode needs them; returns the mode.

  Raises app.UsageError (or exits 1 for a flag the mode would ignore). tests/test_docs.py
  runs it on every `python launch.py` command of the docs.
  """
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  mode = _MODE.value
  usage.check_mode_flags(mode, MODES)  # A flag the mode would ignore: one line, exit 1.
  if mode in _NEEDS_CONFIG and _CONFIG.value is None:
    raise app.UsageError(f"--config is required for --mode={mode}")
  if mode not in _NO_WORKDIR and not _WORKDIR.value:
    raise app.UsageError(f"--mode={mode} needs --workdir=DIR, "
                         + _WORKDIR_OF.get(mode, "a trained run"))
  if mode == "sweep" and not sweep.SWEEP.value:
    raise app.UsageError("--mode=sweep needs --sweep='model.norm=pre,post;...' or a JSON file")
  return mode


def main(argv):
  mode = check_usage(argv)
  console.setup_console()  # Project INFO and all warnings, without absl's prefix.
  if mode in ("train", "compile") and _CONFIG.value is not None:
    # A preset's steps_per_call gives way to the cadences the command line sets (a sweep
    # does this for each of its runs, whose processes do it again, alike).
    common.fit_steps_per_call(_CONFIG.value, common.config_overrides())
  if not MODES[mode].STARTS_JAX:
    _run_before_jax(mode)  # Exits.
  _start_jax(mode)
  _run_in_workdir(mode)


def _run_before_jax(mode: str) -> None:
  """A mode that does not start JAX (STARTS_JAX False): its checks, the lock, its main;
  exits with its status."""
  from transformer.config.errors import ConfigError, DataError  # pylint: disable=g-import-not-at-top
  from transformer.workdir import lock  # pylint: disable=g-import-not-at-top
  # Before JAX starts: these read files, and a sweep's runs are launch.py processes of
  # their own that need the accelerators (and jax.distributed) free.
  existed = bool(_WORKDIR.value) and os.path.exists(_WORKDIR.value)
  held = []  # Whether this command held the workdir's lock (so the workdir is its own).
  try:
    # A pod sweep runs on every host over one shared folder: there, each run's process
    # 0 locks the run's workdir instead (the hosts' sweeps share the sweep folder).
    single_host = not (_DISTRIBUTED.value or _NUM_PROCESSES.value)
    locked = mode in _LOCKED and single_host
    check = getattr(MODES[mode], "check_config", None)
    if check is not None:  # A failed check creates nothing: before the lock.
      check(_CONFIG.value, _WORKDIR.value)
    with lock.hold(_WORKDIR.value) if locked else contextlib.nullcontext():
      held.append(locked)
      try:
        code = MODES[mode].main(_CONFIG.value, _WORKDIR.value)
      finally:
        _say_unseen_characters()
      _finished()
  except (ConfigError, DataError) as e:
    if any(held):  # Never another command's workdir (WorkdirInUse).
      _created_by_a_failed_check(_WORKDIR.value, existed)
    sys.stderr.write(f"\n{type(e).__name__}: {e}\n")
    sys.exit(2)
  except OSError as e:
    _exit_environment_error(e, mode, _WORKDIR.value)
  sys.exit(code)


def _start_jax(mode: str) -> None:
  """jax.distributed (the launcher flags), then the backends; exits 2 when they are not
  the accelerator this host was set up for."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer import distributed  # pylint: disable=g-import-not-at-top

  try:
    distributed.initialize(
        auto=_DISTRIBUTED.value, coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
        heartbeat_timeout_seconds=_HEARTBEAT.value,
        # One process per GPU on a host: each claims its own GPU, not all of them.
        local_device_ids=accelerator.local_device_ids(_NUM_PROCESSES.value))
  except ValueError as e:  # Incomplete --coordinator_address/--num_processes/--process_id.
    raise app.UsageError(str(e)) from e
  with console.backends_starting():  # Their start-up lines on a CPU-only host: log only.
    jax.devices()
  for setting in _ACCELERATOR_SETTINGS:
    logging.info("GPU default: %s", setting)
  if jax.default_backend() != "cpu":  # What XLA compiles this run with, whoever set it.
    logging.info("XLA_FLAGS in effect: %s", os.environ.get("XLA_FLAGS", "") or "(none)")
  mismatch = accelerator.backend_mismatch(jax.default_backend())
  if mismatch and mode != "compile":  # compile runs on the CPU on purpose.
    sys.stderr.write(f"\nConfigError: {mismatch}\n")
    sys.exit(2)


def _run_in_workdir(mode: str) -> None:
  """A mode that runs on the started JAX: its checks, the lock, log.txt, its main; a
  user's mistake, a signal, a diverged run or the machine's refusal each end it in one
  line."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer import distributed  # pylint: disable=g-import-not-at-top
  from transformer.config.errors import ConfigError, DataError  # pylint: disable=g-import-not-at-top
  from transformer.workdir import lock  # pylint: disable=g-import-not-at-top

  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  # One writer per workdir (process 0 holds it for the run's processes).
  locked = mode in _LOCKED and jax.process_index() == 0
  existed = os.path.exists(workdir)
  held = []  # Whether this command held the workdir's lock (so the workdir is its own).
  code = 0
  try:
    with distributed.fail_together():
      # Every process: the same command and config, or each stops here in one line.
      distributed.agree(_command_record(workdir), ConfigError)
      check = getattr(MODES[mode], "check_config", None)
      if check is not None:  # A config that fails its checks creates nothing, not even log.txt.
        check(_CONFIG.value, workdir)
      with lock.hold(workdir) if locked else contextlib.nullcontext():
        held.append(locked)
        # Other modes check their workdir; import writes a new one, which must start empty.
        if mode == "train" or (os.path.isdir(workdir) and mode != "import"):
          console.log_to_file(workdir, jax.process_index())  # The full-format log.
        logging.info("Workdir: %s", os.path.abspath(workdir))
        logging.info("JAX process %d of %d, %d local / %d global devices (%s)",
                     jax.process_index(), jax.process_count(), jax.local_device_count(),
                     jax.device_count(), jax.devices()[0].platform)
        try:
          try:
            code = MODES[mode].main(_CONFIG.value, workdir)
          finally:
            _say_unseen_characters()
          _finished()
        except Exception as e:  # pylint: disable=broad-except
          if not isinstance(e, (ConfigError, DataError)):  # Python prints it on the console.
            logging.exception("Stopped by an error", extra={"console": False})
          raise
  except (ConfigError, DataError) as e:
    # A user's mistake, not a bug: the message names the key or file; no traceback.
    logging.error("%s: %s", type(e).__name__, e, extra={"console": False})
    if any(held):  # Never another command's workdir (WorkdirInUse).
      _created_by_a_failed_check(workdir, existed)
    sys.stderr.write(f"\n{type(e).__name__}: {e}\n")
    sys.exit(2)
  except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (Stopped), outside the training loop.
    logging.warning("Stopped by a signal", exc_info=True, extra={"console": False})
    if any(held):
      _created_by_a_failed_check(workdir, existed)  # Stopped before it wrote anything.
    raise  # run() says it in one line.
  except FloatingPointError as e:
    # A diverged run: its own message names the step and what to change; the traceback
    # is in log.txt. Exit 1, not 2: the input was valid, the training was not.
    sys.stderr.write(f"\nFloatingPointError: {e}\n")
    sys.exit(1)
  except OSError as e:  # The machine's: a full disk, no permission (else a bug: re-raised).
    _exit_environment_error(e, mode, workdir)
  if code:  # train: 130 / 143 when a signal stopped it after saving.
    sys.exit(code)


def _command_record(workdir: str) -> dict[str, dict]:
  """What the processes of one run must agree on before anything starts: launch.py's
  and the modes' flags (transformer.cli.*), the workdir (absolute) and the --config
  with its --config.x flags, one key per line (distributed.agree)."""
  from transformer.workdir import run_record  # pylint: disable=g-import-not-at-top
  command = {f"--{flag.name}": flag.value
             for module, module_flags in flags.FLAGS.flags_by_module_dict().items()
             if module == __name__ or module.startswith("transformer.")
             for flag in module_flags if flag.name != "config"}
  command["--workdir"] = os.path.abspath(workdir)
  config = {} if _CONFIG.value is None else run_record.flat_config(_CONFIG.value)
  return {"command": command, "config": config}


def _exit_environment_error(error: OSError, mode: str, workdir: str | None) -> None:
  """Exits 2 with one line for the machine's refusals; re-raises any other OSError (a bug)."""
  message = usage.environment_error(error, mode, workdir or "")
  if message is None:
    raise error
  sys.stderr.write(f"\n{type(error).__name__}: {message}\n")
  sys.exit(2)


def run(argv: list[str] | None = None) -> None:
  """`python launch.py ...` (tests pass argv): parse flags, then main; exits with its status.

  Ctrl-C, or SIGTERM, outside the training loop (which saves first and returns 130 /
  143 itself) ends the command with one line and 130 / 143, after every cleanup on the
  way up has run; the line names the outputs already whole, if any. A signal once the
  mode has returned is noted, not raised (no exit hook is cut short), and said in one
  line with 130 / 143.
  """
  from transformer.workdir import files  # pylint: disable=g-import-not-at-top
  files.forget_finished()
  _LATE_SIGNALS.clear()
  # SIGTERM unwinds like Ctrl-C (cleanup runs; one line, exit 143), not a silent kill.
  previous = {signal.SIGINT: signal.getsignal(signal.SIGINT),
              signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_stopped)}
  try:
    app.run(main, argv=argv, flags_parser=usage.parse_flags)
  except KeyboardInterrupt as e:
    _exit_interrupted(e, _MODE.value if flags.FLAGS.is_parsed() else "train")
  except SystemExit as e:
    if not _LATE_SIGNALS or (e.code not in (None, 0)):
      raise  # Only a command that succeeded has a late signal to say.
    signum = _LATE_SIGNALS.pop()
    _LATE_SIGNALS.clear()
    sys.stderr.write(_late_signal_line(signum))
    sys.exit(128 + signum)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def console_main() -> None:
  """`python launch.py ...` and the installed `transformer ...` command (pyproject.toml):
  run(), then the exit without teardown after a signal."""
  main_module = sys.modules["__main__"]
  if main_module is not sys.modules.get(__name__):  # The installed command's wrapper:
    main_module.__doc__ = __doc__  # absl's --help prints __main__'s docstring.
  _AS_SCRIPT["running"] = True
  # Every mode module is imported: out of the collector's sight from here, and its
  # passes rarer while tracing (transformer/gc_tuning.py says what it saves).
  gc_tuning.tune()
  try:
    run()
  except SystemExit as exit_:
    _AS_SCRIPT["status"] = exit_.code
    from transformer.workdir import files as files_lib  # pylint: disable=g-import-not-at-top
    # Stopped by a signal, or a write given up by a second one (its threads may never end).
    if _AS_SCRIPT["interrupted"] or files_lib.abandoned_writes():
      _exit_without_teardown(int(exit_.code or 0))
    raise
  finally:
    _finished()  # From here a signal is noted and said at the exit, never a traceback.


if __name__ == "__main__":
  console_main()
