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

The documents come from `documents`: the same records in the same order as
`packing.documents` would give (its `document_order` over record numbers), but grain's
reader threads each read a block of `BLOCK` records a call (`CorpusSplit.__getitems__`
through `packing.read_in_blocks`), not one: grain's per-element work (stats, a future per
element, all under the GIL) cost more than reading a record, so its threads were slower
than none.
"""

from __future__ import annotations

import functools
from typing import Any

import grain
import numpy as np

from transformer.data import packing


# Records a reader thread reads a call (any size gives the same documents): fewer, larger
# blocks mean fewer hand-overs of the GIL between the reader threads and the packer. With
# the blocks read ahead, about (packing.BLOCKS_AHEAD + 1) x BLOCK = 192 records are in
# memory (grain reading one at a time held 64 + 1): ~1 MB for FineWeb's ~1k-token
# documents, at most 192 pieces of corpus.PIECE_CHARS characters.
BLOCK = 64


def documents(split: Any, *, seed: int, train: bool, process_index: int, process_count: int,
              num_threads: int) -> grain.IterDataset:
  """`packing.documents(split, ...)`'s documents of a prepared corpus split, read in blocks.

  Args:
    split: a corpus.CorpusSplit (or any random-access source; `packing.read_items` reads
      a block by its `__getitems__` where it has one).
    seed, train, process_index, process_count: as for `packing.documents`.
    num_threads: grain reader threads, each reading a block of `BLOCK` records a call.

  Returns:
    A grain IterDataset of {"tokens": int32 array}, in `packing.documents`' order, with
    its iterator state. The ids are below the tokenizer's size, which
    run_vocabulary.check_vocab_size held to the model's vocabulary: nothing is checked per record.
  """
  order = packing.document_order(grain.MapDataset.range(len(split)), seed=seed, train=train,
                                 process_index=process_index, process_count=process_count)
  return packing.read_in_blocks(order, block=BLOCK, num_threads=num_threads,
                                read=functools.partial(packing.read_items, split))


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
