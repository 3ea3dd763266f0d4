"""The one way this project writes a file it must not leave half-written.

A write goes to a fresh temporary file beside the target (created exclusively, so two
writers never share one), is flushed and fsynced, made readable like any file the
user creates (mode 0644; a temporary file would be 0600), and then replaces the
target in one `os.replace`; the directory is fsynced after it where the platform
allows. A full disk or a kill mid-write leaves the old file whole, never a truncated
one. A file that already holds the content is not touched (its mtime stays), so
rerunning a command changes nothing that did not change. Used for config.json, the
tokenizer files, evaluation results, translations and run records alike.

`disk_errors_as_oserror` is the other half: a full disk met inside a library (Orbax,
TFDS) becomes an OSError naming the path, which launch.py says in one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from typing import Iterator

_MODE = 0o644  # rw-r--r--: results and workdir files are for everyone to read.


def write_atomically(path: str, content: str | bytes) -> bool:
  """Makes `path` hold `content`; returns whether it was written (False: it already did).

  Creates the parent directory if needed.

  Args:
    path: the file to write.
    content: text (written as UTF-8) or bytes.

  Raises:
    OSError: the write failed (e.g. ENOSPC); `path` is then as it was before.
  """
  data = content.encode("utf-8") if isinstance(content, str) else content
  try:
    with open(path, "rb") as f:
      if f.read() == data:
        return False
  except (FileNotFoundError, NotADirectoryError):
    pass
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
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.remove(temporary)
    raise
  _fsync_directory(directory)
  return True


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


# How a full disk reads inside libraries' errors: Orbax/tensorstore (RESOURCE_EXHAUSTED
# with the OS error in the text), TFDS ("Failed to finalize writing of split" raised
# from the OSError): a ValueError or RuntimeError, not an OSError.
_DISK_FULL = {errno.ENOSPC: ("No space left on device", "OS error 28", "ENOSPC"),
              errno.EDQUOT: ("Disk quota exceeded", "OS error 122", "EDQUOT")}
DISK_FULL_ERRNOS = tuple(_DISK_FULL)


@contextlib.contextmanager
def disk_errors_as_oserror(path: str) -> Iterator[None]:
  """Turns a library's full-disk error while it writes under `path` into an OSError.

  As OSError(ENOSPC or EDQUOT, path) launch.py says it in one line, naming `path`,
  instead of the library's tracebacks. The error and its causes are searched for the
  OS error; any other error passes unchanged.
  """
  try:
    yield
  except OSError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    chain, cause = [], e
    while cause is not None and len(chain) < 10:
      chain.append(cause)
      cause = cause.__cause__ or cause.__context__
    for number, marks in _DISK_FULL.items():
      if any(getattr(c, "errno", None) == number or any(m in str(c) for m in marks)
             for c in chain):
        raise OSError(number, os.strerror(number), path) from None
    raise
