"""Packed rows of a prepared corpus: grain's concat-then-split, without its per-token cost.

The rows are exactly those of `grain.experimental.ConcatThenSplitIterDataset` over the
same documents (tests/test_corpus.py holds them equal): documents concatenated in order
and cut into rows of `row_len`; each piece in a row gets its own segment id (1, 2, ...)
and positions from 0; a document cut at a row's end continues, as a new segment, at the
start of the next row; a finite stream's last row is padded (segment 0). Prepared
documents are already token arrays, so a row is a few numpy slices: grain's generic
packer, written for any nested features, spends most of the read time (docs/corpus.md).

The state is the parent's state before the current document plus the tokens of it
already used: a restore reads that document again and skips them, so resume is exact.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np


class _RowsIterator(grain.DatasetIterator):
  """Rows of `row_len` from an iterator of {"tokens": int32 array} documents."""

  def __init__(self, parent: grain.DatasetIterator, row_len: int):
    super().__init__(parent)
    self._row_len = row_len
    self._document: np.ndarray | None = None  # The document being cut into rows.
    self._used = 0  # Its tokens already in rows.
    self._before = parent.get_state()  # The parent's state before that document.

  def _next_document(self) -> bool:
    self._before = self._parent.get_state()
    try:
      self._document = next(self._parent)["tokens"]
    except StopIteration:
      self._document = None
      return False
    self._used = 0
    return True

  def __next__(self) -> dict[str, np.ndarray]:
    row_len = self._row_len
    tokens = np.zeros(row_len, np.int32)
    segments = np.zeros(row_len, np.int32)
    positions = np.zeros(row_len, np.int32)
    filled, segment = 0, 0
    while filled < row_len:
      if self._document is None or self._used == len(self._document):
        if not self._next_document():
          if filled == 0:
            raise StopIteration
          break  # The stream's last row: padded.
        if not len(self._document):
          continue
      take = min(row_len - filled, len(self._document) - self._used)
      segment += 1
      tokens[filled:filled + take] = self._document[self._used:self._used + take]
      segments[filled:filled + take] = segment
      positions[filled:filled + take] = np.arange(take, dtype=np.int32)
      filled += take
      self._used += take
    return {"tokens": tokens, "tokens_segment_ids": segments, "tokens_positions": positions}

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._before, "used": self._used,
            "in_document": self._document is not None}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self._before, self._document, self._used = state["parent"], None, 0
    if state["in_document"]:
      self._next_document()
      self._used = state["used"]


class PackedRows(grain.IterDataset):
  """`ConcatThenSplitIterDataset(parent, length_struct={"tokens": row_len})`'s rows for
  documents that are one token array each (a prepared corpus's records)."""

  def __init__(self, parent: grain.IterDataset, row_len: int):
    super().__init__(parent)
    self._row_len = row_len

  def __iter__(self) -> _RowsIterator:
    return _RowsIterator(self._parent.__iter__(), self._row_len)

  def __str__(self) -> str:
    return f"PackedRows(row_len={self._row_len})"
