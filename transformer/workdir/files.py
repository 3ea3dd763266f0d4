"""The one way this project writes a file it must not leave half-written.

A write goes to a fresh temporary file beside the target (created exclusively, so two
writers never share one), is flushed and fsynced, made readable like any file the
user creates (mode 0644; a temporary file would be 0600), and then replaces the
target in one `os.replace`; the directory is fsynced after it where the platform
allows. A full disk or a kill mid-write leaves the old file whole, never a truncated
one. A file that already holds the content is not touched (its mtime stays), so
rerunning a command changes nothing that did not change. Used for config.json, the
tokenizer files, evaluation results, translations and run records alike.
"""

from __future__ import annotations

import os
import uuid

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
