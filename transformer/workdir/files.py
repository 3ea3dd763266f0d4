"""The one way this project writes a file it must not leave half-written.

A write goes to a fresh temporary file beside the target (created exclusively, so two
writers never share one), is flushed and fsynced, made readable like any file the
user creates (mode 0644; a temporary file would be 0600), and then replaces the
target in one `os.replace`; the directory is fsynced after it where the platform
allows. A full disk or a kill mid-write leaves the old file whole, never a truncated
one. A file that already holds the content is not touched (its mtime stays), so
rerunning a command changes nothing that did not change. Used for config.json, the
tokenizer files, evaluation results, translations and run records alike.

`write_together` does it for the files of one result (--mode=passkey's JSON and heat map,
evaluate --by_position's JSON and plot): each written whole to its temporary file, then
all renamed; a full disk at any leaves none (a rerun is not refused as "exists").

`complete_or_absent` does the same for a folder (what --mode=average, import and
export write): it is filled under a temporary sibling name and renamed into place at
the end, and removed on any failure (a full disk, Ctrl-C, an error), so the folder is
whole or not there and a retry is never refused as "not empty". Its writer holds the
folder's lock (workdir/lock.py's `writing`) throughout: a second command writing the
same folder at once is refused in one line naming the first (PID, host), and never
removes the first one's temporary folder.

`disk_errors_as_oserror` is the other half: a full disk met inside a library (Orbax,
TFDS) becomes an OSError naming the path, which launch.py says in one line. Both
attach the flag that chooses the path (`error.flag`), which that line names.

`signals_deferred` holds SIGINT / SIGTERM back while a write that other threads share
runs (an Orbax save: its event loops and thread pools keep writing after the main
thread is interrupted, into a folder already removed, with "Event loop is closed"
tracebacks): the write ends, its manager closes, and only then does the signal take
effect, so that `complete_or_absent` removes a folder nobody writes into any more.
The final rename is held back the same way, and each output made whole is noted
(`finished_outputs`), so that a signal after it is reported as what it is: the output
complete at its path, not "left no partial output".
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import threading
import uuid
from typing import Any, Callable, Iterator

from absl import logging

from transformer.config.errors import ConfigError
from transformer.workdir import lock

_MODE = 0o644  # rw-r--r--: results and workdir files are for everyone to read.


def write_atomically(path: str, content: str | bytes, flag: str = "", *,
                     keep_existing: bool = False) -> bool:
  """Makes `path` hold `content`; returns whether it was written (False: it already did).

  Creates the parent directory if needed.

  Args:
    path: the file to write.
    content: text (written as UTF-8) or bytes.
    flag: for a command's result, the flag that chose `path` (--output): a refusal
      names it, and the file is noted as finished (`finished_outputs`) once whole.
    keep_existing: never replace a file that is there (a command's result without
      --overwrite): the whole file is linked into place, which fails if another command
      wrote `path` since the command checked it, so two commands writing one result at
      once give one file and one refusal, never a silent replacement.

  Raises:
    ConfigError: `keep_existing`, and `path` exists (another command wrote it meanwhile).
    OSError: the write failed (e.g. ENOSPC); `path` is then as it was before.
  """
  if flag:
    try:
      with signals_deferred():  # Replaced whole, then noted: a signal sees both or neither.
        written = write_atomically(path, content, keep_existing=keep_existing)
        note_finished(path, flag)
    except OSError as e:
      if e.errno in DISK_FULL_ERRNOS + _REFUSALS and not getattr(e, "flag", ""):
        error = named(e, path, flag)
        error.result_file = True  # A file, not a folder: "write the result elsewhere".
        raise error from None
      raise
    return written
  data = content.encode("utf-8") if isinstance(content, str) else content
  if not keep_existing:
    try:
      with open(path, "rb") as f:
        if f.read() == data:
          return False
    except (FileNotFoundError, NotADirectoryError):
      pass
  temporary = _temporary_copy(path, data)
  try:
    if keep_existing and _linked(temporary, path):
      os.remove(temporary)
    else:
      os.replace(temporary, path)
  except BaseException:
    _remove(temporary)
    raise
  _fsync_directory(os.path.dirname(os.path.abspath(path)))
  return True


def _written_meanwhile(path: str) -> ConfigError:
  return ConfigError(f"{path} was written by another command while this one ran (it exists "
                     "now, whole, and is kept); read it, or pass --overwrite to replace it, "
                     "or choose another --output")


def _linked(temporary: str, path: str) -> bool:
  """Links the whole `temporary` at `path` unless a file is there (one atomic step);
  False where the file system has no hard links (then the caller replaces)."""
  try:
    os.link(temporary, path)
  except FileExistsError:
    raise _written_meanwhile(path) from None
  except OSError as e:
    if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
      raise
    if os.path.lexists(path):  # No links here: checked, then replaced (a narrow window).
      raise _written_meanwhile(path) from None
    return False
  return True


def write_together(contents: list[tuple[str, str | bytes]], flag: str, *,
                   keep_existing: tuple[str, ...] = ()) -> None:
  """Writes several files of one result (a JSON and its PNG) all or none.

  Each is written in full to its temporary file first; only when every one is whole
  are they renamed into place, one after the other, with signals held back. A full
  disk (or any failure) on any of them leaves none of them changed, so a rerun is
  not refused because the first one "exists". Each is noted finished (`flag`).
  `keep_existing`: the files of them (the result, not a plot beside it) never replaced,
  as for `write_atomically`: linked into place; when one is there already (another
  command's), nothing of this result is left (what this call linked is removed again).

  Raises:
    ConfigError: `keep_existing`, and one of the files exists (another command's).
    OSError: a write refused by the machine, named after its file and `flag`.
  """
  temporaries: list[str] = []
  linked: list[str] = []
  current = contents[0][0]  # The file being written: the one an error names.
  try:
    with signals_deferred():
      for current, content in contents:
        data = content.encode("utf-8") if isinstance(content, str) else content
        temporaries.append(_temporary_copy(current, data))
      # The kept ones first: another command's file refuses the result before any
      # other file of it has replaced anything.
      order = sorted(zip(contents, temporaries), key=lambda c: c[0][0] not in keep_existing)
      for (current, _), temporary in order:
        if current in keep_existing and _linked(temporary, current):
          linked.append(current)
          os.remove(temporary)
        else:
          os.replace(temporary, current)
        _fsync_directory(os.path.dirname(os.path.abspath(current)))
      for current, _ in contents:
        note_finished(current, flag)
  except ConfigError:  # Another command's file is there: this result is not written.
    for path in linked + temporaries:
      _remove(path)
    raise
  except OSError as e:
    for temporary in temporaries:
      _remove(temporary)
    if e.errno in DISK_FULL_ERRNOS + _REFUSALS:
      error = named(e, current, flag)
      error.result_file = True  # A file, not a folder: "write the result elsewhere".
      raise error from None
    raise
  except BaseException:
    for temporary in temporaries:
      _remove(temporary)
    raise


def _temporary_copy(path: str, data: bytes) -> str:
  """`data` written, flushed and fsynced (mode 0644) to a new temporary file beside
  `path`; returns its name. On failure nothing is left, and the OSError names `path`."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  # A name no other writer uses, created exclusively ("x"): two processes never share it.
  temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp{uuid.uuid4().hex[:12]}")
  try:
    with open(temporary, "xb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(temporary, _MODE)
  except BaseException as e:
    _remove(temporary)
    if isinstance(e, OSError) and not e.filename:
      # A failed write() names no file: say which one (a full disk's one line needs it).
      raise OSError(e.errno, e.strerror or str(e), path) from None
    raise
  return temporary


def _remove(path: str) -> None:
  if os.path.exists(path):
    os.remove(path)


def _fsync_directory(directory: str) -> None:
  """Makes the rename itself durable (POSIX); a no-op where directories cannot be opened."""
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


PARTIAL_MARK = ".partial"  # In the name of a folder still being written: ".<name>.partial".


def partial_sibling(target: str) -> str:
  """Where `complete_or_absent(target)` fills the folder before renaming it to `target`."""
  target = os.path.abspath(target)
  return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}{PARTIAL_MARK}")


def named(error: OSError, path: str, flag: str) -> OSError:
  """The machine's refusal renamed to `path`, the place the user chose with `flag`."""
  renamed = OSError(error.errno, error.strerror or str(error), path)
  renamed.flag = flag  # Read by cli/usage.py's one-line message.
  return renamed


@contextlib.contextmanager
def complete_or_absent(target: str, flag: str, *, writer: bool = True,
                       barrier: Callable[[str], None] | None = None) -> Iterator[str]:
  """Yields a temporary sibling folder to fill; it becomes `target` only when the block ends.

  `target` must not exist, or be an empty folder (it is then replaced). The sibling
  (`partial_sibling(target)`, one fixed name so that every process of a run writes
  into the same folder) is removed first if an earlier, killed attempt left it, and
  removed again on any failure, Ctrl-C included: `target` is then as before.

  Args:
    target: the folder to produce.
    flag: the flag that chose it (--output, --hf_dir, --workdir), for messages.
    writer: whether this process creates, renames and removes the folder (process 0
      of a multi-process run; the others only write their shards into it).
    barrier: with several processes, called with a name before the folder is used and
      before it is renamed, so that no process writes into a folder not yet there or
      already moved.

  Raises:
    lock.OutputInUse: another command writes `target` now.
    ConfigError: `target` was written (not empty) by another command meanwhile.
    OSError: a write refused by the machine, renamed to `target` with `.flag` set.
  """
  partial = partial_sibling(target)
  sync = barrier or (lambda name: None)
  # The writer holds the lock beside `target` throughout: a second command writing it
  # at once is refused before it touches the folder or `partial` (lock.OutputInUse).
  with lock.writing(target, flag) if writer else contextlib.nullcontext():
    if writer and os.path.exists(target) and (not os.path.isdir(target)
                                              or os.listdir(target)):
      # Checked by the command at its start, and again here under the lock: another
      # command may have written it in between.
      raise ConfigError(f"{flag}={target} exists and is not an empty directory (written "
                        "by another command since this one started); choose a new one "
                        "(nothing is overwritten)")
    with _filled_then_renamed(target, partial, flag, writer, sync) as folder:
      yield folder


@contextlib.contextmanager
def _filled_then_renamed(target: str, partial: str, flag: str, writer: bool,
                         sync: Callable[[str], None]) -> Iterator[str]:
  """`complete_or_absent`'s body, under its lock: `partial` made, yielded, renamed."""
  try:
    if writer:
      if os.path.lexists(partial):
        shutil.rmtree(partial)  # A killed attempt's leftover: never part of a result.
      os.makedirs(partial)
    sync("partial_folder_created")
    yield partial
    sync("partial_folder_written")
    # Held back: a signal at the rename must not be told "no partial output" while the
    # whole folder is in place (and a rerun would be refused as "not empty").
    with signals_deferred():
      if writer:
        os.replace(partial, target)  # An empty `target` folder is replaced; POSIX rename.
        _fsync_directory(os.path.dirname(os.path.abspath(target)))
      note_finished(target, flag)
  except BaseException as e:
    if writer and os.path.lexists(partial):
      with signals_deferred():  # A second Ctrl-C does not leave half a removal behind.
        shutil.rmtree(partial, ignore_errors=True)
    if isinstance(e, OSError) and _refused_here(e, partial):
      raise named(e, target, flag) from None
    raise


# (path, flag) of each output this command made whole, in order: what launch.py's line
# for a signal names (a signal after the output is complete is not "no partial output").
_FINISHED: list[tuple[str, str]] = []


def note_finished(path: str, flag: str) -> None:
  """Notes that the command's output `path` (chosen by `flag`) is complete on disk."""
  _FINISHED.append((os.path.abspath(path), flag))


def finished_outputs() -> list[tuple[str, str]]:
  """(absolute path, flag) of each output made whole so far (that still exists)."""
  return [(path, flag) for path, flag in _FINISHED if os.path.lexists(path)]


def forget_finished() -> None:
  """Starts a new command's record (launch.run calls it; tests run several in a process)."""
  _FINISHED.clear()
  _ABANDONED.clear()


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_deferred(left: str = "") -> Iterator[None]:
  """SIGINT / SIGTERM that arrive in the block take effect when it ends, not inside it;
  a second one takes effect at once.

  For writes that must finish or be undone as a whole before the program unwinds: an
  Orbax save (other threads write for it; interrupting the main thread leaves them
  writing into a folder being removed), a final rename, the removal of a partial
  folder. At the end the handler that was installed before gets the (last) signal:
  Python's raises KeyboardInterrupt, launch.py's raises its `Stopped`, the training
  loop's StopRequest notes a stop request. When the block raises, its error goes on
  and the signal is only logged (the command stops on that error anyway). A no-op
  outside the main thread (signals are only handled there).

  A second signal is the way out of a write that does not end (a save waiting on a dead
  peer): it is given to that handler at once, inside the block, after a line saying
  what is left: `left` ("the folder X is incomplete; the next run removes it"). The
  write is then noted as abandoned (`abandoned_writes`): launch.py ends the process
  without waiting for the threads still writing.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  caught: list[int] = []
  previous: dict[int, Any] = {}

  def note(signum, frame) -> None:
    del frame
    name = signal.Signals(signum).name
    if caught:  # The second: stop now.
      what = left or "the write in progress is left incomplete and is not used"
      logging.warning("%s again: stopping now; %s", name, what)
      _ABANDONED.append(what)
      for sig, handler in previous.items():
        signal.signal(sig, handler)
      _deliver(signum, previous[signum])
      return
    logging.warning("%s: stopping once the write in progress is whole (or removed); "
                    "a second signal stops at once, leaving it incomplete", name)
    caught.append(signum)

  previous.update({sig: signal.signal(sig, note) for sig in _SIGNALS})
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  if caught:
    _deliver(caught[-1], previous[caught[-1]])


# What a second signal left unfinished (signals_deferred, the training loop's save): the
# process then ends without waiting for the threads that still write it.
_ABANDONED: list[str] = []


def note_abandoned(what: str) -> None:
  """Notes that a write was given up by a second signal (`what`: what is left of it)."""
  _ABANDONED.append(what)


def abandoned_writes() -> list[str]:
  """What this command's second signals left unfinished (empty: nothing)."""
  return list(_ABANDONED)


def _deliver(signum: int, handler) -> None:
  """Gives `signum` to `handler` as the signal itself would have."""
  if callable(handler):
    handler(signum, None)
  elif handler == signal.SIG_DFL:
    os.kill(os.getpid(), signum)  # Its default action (the handler is back in place).


def _refused_here(error: OSError, partial: str) -> bool:
  """Whether the machine refused a write into `partial` (not, say, reading a source)."""
  if error.errno in DISK_FULL_ERRNOS:
    # Always a write; shutil.copyfile names its *source* file in a full disk's error.
    return True
  return error.errno in _REFUSALS and bool(error.filename) and (
      os.path.abspath(str(error.filename)) + os.sep).startswith(partial + os.sep)


# How a full disk reads inside libraries' errors: Orbax/tensorstore (RESOURCE_EXHAUSTED
# with the OS error in the text), TFDS ("Failed to finalize writing of split" raised
# from the OSError): a ValueError or RuntimeError, not an OSError.
_DISK_FULL = {errno.ENOSPC: ("No space left on device", "OS error 28", "ENOSPC"),
              errno.EDQUOT: ("Disk quota exceeded", "OS error 122", "EDQUOT")}
DISK_FULL_ERRNOS = tuple(_DISK_FULL)
# Other refusals by the machine that a user fixes by choosing another place.
_REFUSALS = (errno.EACCES, errno.EPERM, errno.EROFS)


@contextlib.contextmanager
def disk_errors_as_oserror(path: str, flag: str = "") -> Iterator[None]:
  """Turns a library's full-disk error while it writes under `path` into an OSError.

  As OSError(ENOSPC or EDQUOT, path) launch.py says it in one line, naming `path`
  (and `flag`, the flag or config key that chose it, when given), instead of the
  library's tracebacks. The error and its causes are searched for the OS error; any
  other error passes unchanged.
  """
  try:
    yield
  except OSError as e:
    if flag and e.errno in DISK_FULL_ERRNOS:
      raise named(e, path, flag) from None
    raise
  except Exception as e:  # pylint: disable=broad-except
    chain, cause = [], e
    while cause is not None and len(chain) < 10:
      chain.append(cause)
      cause = cause.__cause__ or cause.__context__
    for number, marks in _DISK_FULL.items():
      if any(getattr(c, "errno", None) == number or any(m in str(c) for m in marks)
             for c in chain):
        raise named(OSError(number, os.strerror(number), path), path,
                    flag or "") from None
    raise
