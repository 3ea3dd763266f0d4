"""A large source file as parts that run as tasks of their own, and their shards joined.

A file larger than `data.prepare_piece_mb` is planned as parts (`plan`): byte ranges of a
.jsonl (its lines are those that begin in the range) or a .txt (whole windows of
store.PIECE_CHARS bytes), ranges of a parquet file's row groups, and never a .jsonl.gz /
.jsonl.zst (a compressed stream cannot be entered midway: one part). Each part is a task
(preparation.run_task) that writes its shards under `<output>/parts/`; when every part of
a file is done, `join` writes the file's shards exactly as one task over the whole file
would (the same records in the same order, the same index), writes its task json and
removes the parts. So the corpus is byte-identical whatever the part size, the worker
count or the node count.

A part's json (`parts/tasks/<task>-<part>.json`) records its range and the file's size and
sha256 (hashed once per run by the driver, `Piece.sha256`): a rerun keeps a part only when
the file has the same content (whatever its mtime), the plan is the same and the part's
shard files are whole (store.shard_problem), as for a whole file's task.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import numpy as np

from transformer.data.corpus import readers
from transformer.data.corpus import store

PARTS = "parts"  # The folder of the parts' shards and jsons, under the corpus folder.


@dataclasses.dataclass(frozen=True)
class Piece:
  """One task: part `part` of `parts` of source file `file` (job.names[file])."""

  file: int
  part: int = 0
  parts: int = 1
  span: tuple[int, int] | None = None  # readers' (start, end); None: the whole file.
  size: int = 0  # Bytes of the stored file this part covers (the progress line's share).
  sha256: str = ""  # A part's: the whole file's, hashed once by the driver (its 'done' check).

  @property
  def whole(self) -> bool:
    return self.parts == 1


def part_name(task: str, part: int) -> str:
  """'00007-0003': part 3 of task 00007's file."""
  return f"{task}-{part:04d}"


def plan(path: str, name: str, piece_bytes: int) -> list[Piece]:
  """The parts of one source file (its index is filled in by the caller's `file`).

  Args:
    path: the file.
    name: its name relative to the corpus root (the format, by extension).
    piece_bytes: the most bytes a part holds (0: never split).

  Returns:
    One Piece (the whole file) when it is small or cannot be split, else its parts in order.
  """
  size = os.path.getsize(path)
  kind = readers.format_of(name).pieces
  if not kind or not piece_bytes or size <= piece_bytes:
    return [Piece(file=-1, size=size)]
  if kind == "bytes":
    # A .txt part is whole windows (its cuts are then the whole file's); a .jsonl's
    # range needs no alignment, but the same rule serves both.
    window = store.PIECE_CHARS
    step = max(piece_bytes // window, 1) * window
    starts = list(range(0, size, step))
    spans = [(s, min(s + step, size)) for s in starts]
    sizes = [e - s for s, e in spans]
  else:  # row_groups
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    try:
      groups = pq.ParquetFile(path).metadata.num_row_groups
    except Exception:  # pylint: disable=broad-except  (the task says it in one line)
      return [Piece(file=-1, size=size)]
    count = min(groups, -(-size // piece_bytes))
    if count <= 1:
      return [Piece(file=-1, size=size)]
    bounds = [groups * i // count for i in range(count + 1)]
    spans = list(zip(bounds[:-1], bounds[1:]))
    sizes = [size * (e - s) // groups for s, e in spans]
  return [Piece(file=-1, part=i, parts=len(spans), span=span, size=part_size)
          for i, (span, part_size) in enumerate(zip(spans, sizes))]


def part_record(path: str, name: str, piece: Piece) -> dict[str, Any]:
  """What a part's json says of its file and range (a rerun keeps it only if equal): the
  file's content by the driver's sha256, not its mtime (a touched copy keeps its parts)."""
  return {"path": name, "bytes": os.path.getsize(path), "sha256": piece.sha256,
          "part": piece.part, "parts": piece.parts, "span": list(piece.span or ())}


def part_json(output: str, task: str, part: int) -> str:
  return os.path.join(output, PARTS, store.TASKS, part_name(task, part) + ".json")


def done_part(output: str, task: str, path: str, name: str, piece: Piece) -> dict[str, Any] | None:
  """Part `piece`'s json if it is done for this plan and this file's content (sha256) and
  its shard files are whole (store.shard_problem: not cut short, not 0 bytes)."""
  json_path = part_json(output, task, piece.part)
  if not os.path.exists(json_path):
    return None
  with open(json_path, encoding="utf-8") as f:
    result = json.load(f)
  if result["piece"] != part_record(path, name, piece):
    return None
  stem = part_name(task, piece.part)
  if any(store.shard_problem(os.path.join(output, PARTS), split, stem,
                             result["splits"][split]["records"]) for split in store.SPLITS):
    return None
  return result


def join(writer_for: Any, output: str, task: str, results: list[dict[str, Any]]
         ) -> dict[str, dict[str, int]]:
  """Writes a file's shards from its parts' (in order); returns each split's counts.

  Args:
    writer_for: split -> a new preparation._SplitWriter of the file's final shard.
    output: the corpus folder.
    task: the file's task name.
    results: the parts' jsons, in order.
  """
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  counts = {}
  for split in store.SPLITS:
    writer = writer_for(split)
    for result in results:
      stem = os.path.join(output, PARTS, split, part_name(task, result["piece"]["part"]))
      index = np.load(stem + ".index.npy")
      reader = array_record_module.ArrayRecordReader(stem + ".array_record")
      try:
        records = len(index) - 1
        for first in range(0, records, 1024):  # A block at a time: memory stays bounded.
          last = min(first + 1024, records)
          for i, data in zip(range(first, last), reader.read(list(range(first, last)))):
            writer.write_bytes(data, int(index[i + 1, 0] - index[i, 0]), int(index[i, 1]))
      finally:
        reader.close()
    counts[split] = writer.finish()
  return counts


def remove_parts(output: str, task: str) -> None:
  """Deletes every part of `task` (whatever plan made them: an earlier part size too), and
  the parts folder once nothing is left in it. Called under the file's build lock; a
  part's lock and temporary shard (dot names) are its own task's."""
  for folder in [os.path.join(output, PARTS, store.TASKS)] + [
      os.path.join(output, PARTS, split) for split in store.SPLITS]:
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
      if name.startswith(task + "-"):
        os.remove(os.path.join(folder, name))
  folder = os.path.join(output, PARTS)
  if os.path.isdir(folder) and not any(files for _, _, files in os.walk(folder)):
    shutil.rmtree(folder)
