"""One writer per workdir: an exclusive lock held for as long as a command writes into it.

`hold(workdir)` takes `fcntl.flock(LOCK_EX | LOCK_NB)` on `<workdir>/lock` (layout.LOCK)
and writes "PID HOST" into it. A second command on the same workdir fails at once with
`WorkdirInUse`: "workdir <dir> in use by PID N on HOST". What it guarantees:

  - Released on any exit: the kernel drops a flock when the process ends, however it
    ends (an exception, Ctrl-C, SIGKILL, a crash), so a dead process never leaves a
    stale lock behind. The file itself stays (it is part of the workdir, and
    `in_use_by` probes it); its content is only read while someone holds the lock, to
    say who.
  - On one machine (local disks, tmpfs): exclusive.
  - On shared file systems, as far as the file system implements flock: NFSv4 and
    Linux NFS clients map it to NFS byte-range locks, which hold across hosts;
    Lustre only with the `flock` mount option, GCS/S3 FUSE mounts usually not at all.
    A file system that refuses the call (ENOLCK, EOPNOTSUPP) is logged as a warning
    naming the workdir: the run goes on unprotected, never silently.

Only process 0 of a multi-process run takes it (the run's processes share one workdir).

`building(lock_path, what)` is the same lock for a shared cache (a prepared dataset, a
trained vocabulary in data_dir, one source file of a prepared corpus): commands that
would build the same thing at once take it in turn. The first builds; the others log
one line saying whom they wait for, then find the result there and reuse it.

`writing(target, flag)` is the same lock for a command's new output folder (what
--mode=average, import and export write, through files.complete_or_absent): taken
without waiting on `.<name>.lock` beside it, so a second command writing the same
folder at once is refused in one line naming the first (`OutputInUse`), before it
touches the folder or its temporary sibling. These two delete their lock file when the
block ends (safely: see `_exclusive`), so nothing is left beside what they wrote; a
workdir's `lock` stays (see `hold`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from typing import Callable, Iterator

from absl import logging

from transformer.config.errors import ConfigError
from transformer.workdir import layout

# The file system cannot lock: warned about, not an error (see the module docstring).
_NO_LOCKING = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class WorkdirInUse(ConfigError):
  """Another live process holds the workdir's lock."""


class OutputInUse(WorkdirInUse):
  """Another live process is writing the output folder a command was asked to write."""


def _holder(fd: int) -> str:
  """'PID N on HOST' from the lock file, as its holder wrote it."""
  os.lseek(fd, 0, os.SEEK_SET)
  parts = os.read(fd, 4096).decode("utf-8", "replace").split()
  if len(parts) >= 2 and parts[0].isdigit():
    return f"PID {parts[0]} on {parts[1]}"
  return "another process (it has not written its PID yet)"


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
  """Holds `workdir`'s lock for the `with` block (creating the workdir if needed).

  Args:
    workdir: the folder a command is about to write into.

  Raises:
    WorkdirInUse: another live process holds it (exit 2 in launch.py).
    OSError: the workdir cannot be created or the lock file opened (a full disk, no
      permission, a path through a file).
  """
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, layout.LOCK)
  with _exclusive(path, f"this workdir {workdir}", refusal=lambda holder: WorkdirInUse(
      f"workdir {workdir} in use by {holder} ({path} is locked); wait for that command to "
      "finish or stop it, or use another --workdir")):
    yield


@contextlib.contextmanager
def _exclusive(path: str, what: str, *, refusal: Callable[[str], ConfigError] | None = None,
               waiting: Callable[[str], None] | None = None,
               remove: bool = False) -> Iterator[None]:
  """Holds the lock file `path` for the block, signed with this PID and host.

  When another live process holds it: `refusal(holder)` ("PID N on HOST") is raised,
  or (no refusal) `waiting(holder)` is called once and the lock waited for. A file
  system that cannot lock is warned about (`what`: what is then unprotected). With
  `remove`, the file is deleted when the block ends, still locked; whoever locked the
  deleted file meanwhile (it had opened it before) sees that the path is no longer that
  file and tries again on the new one, so two never hold the lock at once and no lock
  file is left behind.
  """
  said = False
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
        holder = _holder(fd)
        if refusal is not None:
          os.close(fd)
          raise refusal(holder) from None
        if not said and waiting is not None:
          waiting(holder)
          said = True
        try:
          fcntl.flock(fd, fcntl.LOCK_EX)  # Blocks until that process finishes or dies.
        except BaseException:
          os.close(fd)
          raise
      elif e.errno in _NO_LOCKING:
        logging.warning("The file system of %s cannot lock %s (%s): nothing stops a second "
                        "command from writing %s at the same time", os.path.dirname(path),
                        path, os.strerror(e.errno), what)
        remove = False  # Unlocked: never delete a file another command may be using.
      else:
        os.close(fd)
        raise
    if not remove or _is_file_at(fd, path):
      break
    os.close(fd)  # Locked a file its holder has just deleted: lock the new one.
  try:
    _sign(fd)
    yield
  finally:
    if remove:
      try:
        os.unlink(path)  # Before the lock is released: see the docstring.
      except FileNotFoundError:
        pass
    os.close(fd)  # Releases the lock (also done by the kernel on any exit).


def _is_file_at(fd: int, path: str) -> bool:
  """Whether the open file `fd` is the file at `path` now (not deleted or replaced)."""
  try:
    there = os.stat(path)
  except FileNotFoundError:
    return False
  mine = os.fstat(fd)
  return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _sign(fd: int) -> None:
  """Writes "PID HOST" into the held lock file, for whoever is refused or waits."""
  os.ftruncate(fd, 0)
  os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode("utf-8"))


def in_use_by(workdir: str) -> str | None:
  """'PID N on HOST' when a live process holds `workdir`'s lock, else None (nothing created).

  Probes with a non-blocking shared lock, released at once: only another command's
  exclusive `hold` makes it fail. A workdir without a lock file (never written), or on
  a file system that cannot lock, is not in use as far as can be known.
  """
  path = os.path.join(workdir, layout.LOCK)
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
        return _holder(fd)
      return None
    fcntl.flock(fd, fcntl.LOCK_UN)
    return None
  finally:
    os.close(fd)


@contextlib.contextmanager
def building(lock_path: str, what: str,
             waiting: Callable[[str], None] | None = None) -> Iterator[None]:
  """Holds the build lock `lock_path` for the block, waiting for another builder first.

  The caller checks again inside the block whether `what` is there already (built by
  the process it waited for), and builds it only if not.

  Args:
    lock_path: the lock file (created if needed, deleted when the block ends).
    what: what is built, for the waiting line ("the dataset local_text/...").
    waiting: says the wait instead of the line below, given "PID N on HOST" (a caller
      that waits for many builds of one holder says it once).

  Raises:
    OSError: the lock file cannot be created (a full disk, no permission).
  """
  os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
  with _exclusive(lock_path, what, remove=True, waiting=waiting or (lambda holder: logging.info(
      "Waiting for %s, which is building %s (%s is locked); it is reused when ready",
      holder, what, lock_path))):
    yield


@contextlib.contextmanager
def writing(target: str, flag: str) -> Iterator[None]:
  """Holds the lock beside the folder `target` while a command writes it; never waits.

  Args:
    target: the output folder (it need not exist; its parent is created).
    flag: the flag that chose it (--output, --workdir, --hf_dir), for the refusal.

  Raises:
    OutputInUse: another live process writes `target` now (exit 2 in launch.py).
    OSError: the lock file cannot be created (no permission, a full disk).
  """
  path = lock_path_beside(target)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with _exclusive(path, target, refusal=lambda holder: OutputInUse(
      f"{flag}={target} is being written by {holder} ({path} is locked); wait for that "
      "command to finish (the folder is then complete, and this command refuses to "
      f"overwrite it) or stop it, or choose another {flag}"), remove=True):
    yield


def lock_path_beside(path: str) -> str:
  """The build lock of `path`: a hidden sibling `.<name>.lock` (readers ignore it)."""
  path = os.path.abspath(path)
  return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")
