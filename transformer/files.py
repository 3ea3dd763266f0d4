"""Rewriting a workdir's small files (config.json, tokenizer.json, the vocabulary) safely.

A rewrite goes to a temporary file beside the target, which then replaces it in one
`os.replace`: a full disk or a kill mid-write leaves the old file whole, never a
truncated one. A file that already holds the content is not touched (its mtime
stays), so rerunning a command changes nothing that did not change.
"""

from __future__ import annotations

import os


def write_atomically(path: str, content: str | bytes) -> bool:
  """Makes `path` hold `content`; returns whether it was written (False: it already did).

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
  except FileNotFoundError:
    pass
  temporary = f"{path}.tmp{os.getpid()}"
  try:
    with open(temporary, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.remove(temporary)
    raise
  return True
