"""What a run prints for people, and the full log it keeps in the workdir.

The console (stderr, absl's handler) shows this project's INFO lines bare (the
progress line, evaluations, what the run is doing), and warnings and errors from
any library with their level in front, minus a few known harmless ones. Library
INFO chatter ("Unable to initialize backend 'tpu'", Orbax saves, TFDS builds), TFDS
progress bars and SentencePiece's native trainer lines stay off it (the latter go to
the log through `native_stderr_to_log`). `<workdir>/log.txt` gets every record at INFO
and above in absl's full format (level, date, time, thread, file:line), appended
across restarts, so nothing filtered from the console is lost.

On a host with no TPU and no GPU attached (`quiet_absent_accelerators`, before JAX
loads), JAX starts its CPU backend only, so libtpu's "unexpected worker hostname" and
the CUDA plugin's "Unable to load CUDA" lines never appear, and the CUDA plugin's
"Could not find cuda drivers" line from loading JAX goes to log.txt only. A host with
an accelerator's device node, or a JAX_PLATFORMS the user set, is left as it is.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
from typing import Iterator

from absl import logging as absl_logging

from transformer import accelerator
from transformer import plugin_noise
from transformer.workdir import layout

# This file is transformer/workdir/console.py: the package is one folder up, launch.py two.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LAUNCH = os.path.join(os.path.dirname(_PACKAGE_DIR.rstrip(os.sep)), "launch.py")

# Library warnings that tell a user of this project nothing (still written to log.txt):
# (a directory in the logging file's path, message prefix).
QUIET_WARNINGS = (
    # Every local dataset has a custom config, and a fresh build has no info file yet.
    ("/tensorflow_datasets/", "Using custom data configuration"),
    ("/tensorflow_datasets/", "Variant folder"),
)



def is_project_record(record: logging.LogRecord) -> bool:
  """Whether the record was logged by this project's code (not by a library)."""
  return record.pathname.startswith(_PACKAGE_DIR) or record.pathname == _LAUNCH


_FULL_DISK_MARKS = ("No space left on device", "OS error 28", "Disk quota exceeded")


def _library_full_disk_report(record: logging.LogRecord) -> bool:
  """A library's record (Orbax's background threads log each failed write with its
  traceback) about a full disk: kept in log.txt, off the console."""
  if is_project_record(record):
    return False
  text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
  return any(mark in text for mark in _FULL_DISK_MARKS)


def show_on_console(record: logging.LogRecord) -> bool:
  """The console filter: project INFO, everyone's warnings and errors, minus the quiet ones.

  A record logged with `extra={"console": False}` goes to the log file only.
  """
  if not getattr(record, "console", True):
    return False
  if record.levelno < logging.WARNING:
    return is_project_record(record)
  if _library_full_disk_report(record):
    return False  # The command stops with one "No space left on device" line instead.
  if record.levelno >= logging.ERROR or is_project_record(record):
    return True
  message = record.getMessage()
  return not any(directory in record.pathname and message.startswith(prefix)
                 for directory, prefix in QUIET_WARNINGS)


class ConsoleFormatter(logging.Formatter):
  """INFO as the bare message; anything else with its level first ("WARNING: ...")."""

  def format(self, record: logging.LogRecord) -> str:
    message = super().format(record)
    if record.levelno == logging.INFO:
      return message
    return f"{logging.getLevelName(record.levelno)}: {message}"


class FullFormatter(logging.Formatter):
  """absl's prefix ('I1122 07:27:17.465503 139835658365824 train.py:411] ') on every record."""

  def format(self, record: logging.LogRecord) -> str:
    return absl_logging.get_absl_log_prefix(record) + super().format(record)


class _EarlyRecords(logging.Handler):
  """The first 1,000 records logged before the workdir is known, for the log file.

  (JAX's backend start-up, say: `log_to_file` writes them first.)
  """

  def __init__(self):
    super().__init__(logging.INFO)
    self.records: list[logging.LogRecord] = []

  def emit(self, record: logging.LogRecord) -> None:
    if len(self.records) < 1000:
      self.records.append(record)


_early_records = _EarlyRecords()


class _LogFile(logging.FileHandler):
  """log.txt. A write that fails (a full disk) ends the file with one console warning,
  instead of logging's traceback on the console for every record after it."""

  def handleError(self, record: logging.LogRecord) -> None:
    error = sys.exc_info()[1]
    if not isinstance(error, OSError):
      super().handleError(record)
      return
    logging.getLogger().removeHandler(self)
    absl_logging.warning("No longer writing %s: %s", self.baseFilename, error)


_startup_lines: list[str] = []  # Captured while JAX loaded; logged by setup_console.


_cpu_only = False  # Whether quiet_absent_accelerators took this host for CPU-only.
# Set beside JAX_PLATFORMS=cpu when quiet_absent_accelerators chose it (child processes see it).
_SET_BY_US = "TRANSFORMER_JAX_PLATFORMS_SET"
_console_ready = False  # Whether setup_console has run.


def quiet_absent_accelerators(root: str = "") -> bool:
  """Before JAX loads: on a host without accelerators, starts only JAX's CPU backend.

  Otherwise every command would print libtpu's and the CUDA plugin's complaints that
  there is no TPU or GPU (the test requirements install both). JAX is imported here
  with file descriptor 2 captured (`_startup_lines_kept`): the CUDA plugin's "no
  driver" line goes to the log; any other line is written back to stderr.

  Args:
    root: prefix of the device paths (tests point it at a fake /dev).

  Returns:
    Whether the host was taken for CPU-only (JAX_PLATFORMS set to "cpu").
  """
  global _cpu_only
  # A JAX_PLATFORMS this function set in a parent process (a sweep's runs, launch.py
  # processes of their own, inherit it) is not the user's: the child quiets its start
  # as the parent did (else every sweep child printed the plugin's lines).
  ours = os.environ.get(_SET_BY_US) == os.environ.get("JAX_PLATFORMS") == "cpu"
  if (("JAX_PLATFORMS" in os.environ and not ours) or accelerator.attached_accelerators(root)
      or "jax" in sys.modules):
    return False  # The user's choice, a real TPU/GPU host, or too late to choose.
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ[_SET_BY_US] = "cpu"
  _cpu_only = True
  with _startup_lines_kept():
    import jax  # pylint: disable=g-import-not-at-top,unused-import
  return True


@contextlib.contextmanager
def backends_starting() -> Iterator[None]:
  """Around the first JAX device query (launch.py): on a CPU-only host, the CUDA plugin
  library that JAX loads then prints its "no driver" line; it goes to the log."""
  with _startup_lines_kept() if _cpu_only else contextlib.nullcontext():
    yield


def _startup_lines_kept():
  """fd 2 captured (plugin_noise.filtered): the harmless start-up lines kept for the log."""
  return plugin_noise.filtered(keep=_kept)


def _kept(line: str) -> None:
  _startup_lines.append(line)
  if _console_ready:  # Else setup_console logs them, once its filter is in place.
    _log_startup_lines()


def _log_startup_lines() -> None:
  for line in _startup_lines:  # Off the console, into log.txt (quiet_absent_accelerators).
    logging.getLogger("jax_startup").info("%s", line, extra={"console": False})
  _startup_lines.clear()


def setup_console() -> None:
  """Applies the console format and filter to absl's stderr handler; hides TFDS progress bars.

  Records from now on are also kept for the log file that `log_to_file` opens.
  """
  handler = absl_logging.get_absl_handler()
  handler.setFormatter(ConsoleFormatter())
  handler.addFilter(show_on_console)
  logging.getLogger().addHandler(_early_records)
  global _console_ready
  _console_ready = True
  _log_startup_lines()
  # Nested tqdm bars written to a file or a pipe are a wall of "\x1b[A" lines; the
  # builders log what they prepare instead.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  tfds.display_progress_bar(False)


def log_to_file(workdir: str, process_index: int = 0) -> logging.Handler | None:
  """Appends every record at INFO and above to `<workdir>/log.txt` in absl's full format.

  Process k > 0 of a multi-process run writes `log_process<k>.txt` beside it. Returns
  the handler (attached to the root logger), or None if the file cannot be opened
  (e.g. a remote workdir), which is logged as a warning.
  """
  name = layout.LOG if process_index == 0 else f"log_process{process_index}.txt"
  path = os.path.join(workdir, name)
  try:
    os.makedirs(workdir, exist_ok=True)
    handler = _LogFile(path, mode="a", encoding="utf-8")
  except OSError as e:
    absl_logging.warning("Not keeping a log file at %s: %s", path, e)
    return None
  handler.setLevel(logging.INFO)
  handler.setFormatter(FullFormatter())
  root = logging.getLogger()
  root.removeHandler(_early_records)
  for record in _early_records.records:
    handler.handle(record)
  _early_records.records.clear()
  root.addHandler(handler)
  return handler


@contextlib.contextmanager
def stdout_to_log(logger_name: str) -> Iterator[None]:
  """Sends what a library prints on stdout inside the block to the log as INFO lines.

  For libraries that `print` progress (TFDS's "Downloading and preparing dataset
  ..."): it reaches the log file only (not the console), and stdout stays for
  results.
  """
  buffer = io.StringIO()
  try:
    with contextlib.redirect_stdout(buffer):
      yield
  finally:
    logger = logging.getLogger(logger_name)
    for line in buffer.getvalue().splitlines():
      if line.strip():
        logger.info("%s", line, extra={"console": False})


@contextlib.contextmanager
def native_stderr_to_log(logger_name: str) -> Iterator[None]:
  """Sends what native code writes on file descriptor 2 inside the block to the log.

  For C++ libraries that log on stderr themselves (SentencePiece's trainer prints
  hundreds of INFO lines): the lines go to log.txt as INFO records of `logger_name`,
  not to the console. Python's own records keep reaching the console meanwhile: absl's
  handler writes to a copy of the original stderr for the duration of the block.
  """
  sys.stderr.flush()
  original = os.dup(2)
  handler = absl_logging.get_absl_handler().python_handler
  previous_stream = handler.stream
  console = os.fdopen(os.dup(original), "w", encoding="utf-8", errors="replace")
  captured = tempfile.TemporaryFile()
  try:
    handler.setStream(console)
    os.dup2(captured.fileno(), 2)
    yield
  finally:
    sys.stderr.flush()
    os.dup2(original, 2)
    os.close(original)
    handler.setStream(previous_stream)
    console.close()
    captured.seek(0)
    logger = logging.getLogger(logger_name)
    for line in captured.read().decode("utf-8", "replace").splitlines():
      if line.strip():
        logger.info("%s", line, extra={"console": False})
    captured.close()


def format_duration(seconds: float) -> str:
  """12345 -> '3h25m45s'."""
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
