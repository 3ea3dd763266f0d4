"""What every objective's pipeline shares: reading, length limits, packing and batching.

  source -> [this process's slice] -> seeded shuffle -> repeat (training) -> map
  -> (objective-specific rows: packed or padded) -> batch

Packing writes integer segment ids (0 = padding, 1, 2, ... = the examples in the
row) and per-example positions, so attention never crosses examples. Every
iterator is a grain `DatasetIterator`, whose state is saved in every checkpoint.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Sequence

import grain
import numpy as np
from absl import logging

from transformer.config.data import OVERLONG_POLICIES
from transformer.config.errors import DataError

Batch = dict[str, np.ndarray]
BLOCKS_AHEAD = 2  # Blocks read_in_blocks' reader threads keep read ahead.


def text_of(value: str | bytes) -> str:
  """A text feature as str (TFDS sources hold UTF-8 bytes)."""
  return value.decode("utf-8") if isinstance(value, bytes) else value


def checked(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
  """Returns int32 `tokens`, raising if an id is outside the model's [0, vocab_size)."""
  tokens = np.asarray(tokens, dtype=np.int32)
  # JAX's embedding lookup does not fail on out-of-range ids; stop them here instead.
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    raise ValueError(f"token id {int(tokens.max())} (or {int(tokens.min())}) is outside "
                     f"the model vocabulary [0, {vocab_size})")
  return tokens


def document_order(ds: grain.MapDataset, *, seed: int, train: bool, process_index: int,
                   process_count: int) -> grain.MapDataset:
  """This process's share of `ds`, shuffled (repeated when training): the order in which
  every pipeline reads its documents (`documents`; data/corpus/packer.py's blocks)."""
  # Shuffled in eval too, with the fixed seed: a partial evaluation then sees the
  # same representative sample of documents every time, not the first few.
  ds = ds[process_index::process_count].shuffle(seed=seed)
  if train:
    ds = ds.repeat(None)  # A new permutation every epoch.
  return ds


def documents(source: Any, transform: grain.transforms.Map, *, seed: int, train: bool,
              process_index: int, process_count: int, num_threads: int) -> grain.IterDataset:
  """This process's share of `source`, shuffled (repeated when training), mapped by `transform`."""
  ds = document_order(grain.MapDataset.source(source), seed=seed, train=train,
                      process_index=process_index, process_count=process_count)
  ds = ds.map(transform)
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=64))


def read_items(source: Any, indices: Sequence[int]) -> list[Any]:
  """`[source[i] for i in indices]`, by the source's own `__getitems__` where it has one
  (a prepared corpus split, array_record's data source: one block read)."""
  if hasattr(source, "__getitems__"):
    return list(source.__getitems__(indices))
  return [source[i] for i in indices]


class _BlocksIterator(grain.DatasetIterator):
  """The elements of an iterator of blocks (lists) of `block` elements, one at a time.

  Its state is the one grain's own iterator over the elements would have
  (`{"next_index": elements returned}`), so a position saved with or without blocks
  resumes either way; a restore reads the block it points into again and skips to it.
  """

  def __init__(self, parent: grain.DatasetIterator, block: int):
    super().__init__(parent)
    self._block_size = block
    self._block: list[Any] = []
    self._next = 0  # The next element's place in the block.
    self._count = 0  # Elements returned.

  def __next__(self) -> Any:
    if self._next == len(self._block):
      self._block, self._next = next(self._parent), 0
    self._next += 1
    self._count += 1
    return self._block[self._next - 1]

  def get_state(self) -> dict[str, Any]:
    return {"next_index": self._count}

  def set_state(self, state: dict[str, Any]) -> None:
    self._count = state["next_index"]
    block, self._next = divmod(self._count, self._block_size)
    self._parent.set_state({"next_index": block})
    self._block = next(self._parent) if self._next else []


class _Blocks(grain.IterDataset):
  """`read_in_blocks`' dataset: its parent's blocks, unbatched."""

  def __init__(self, parent: grain.IterDataset, block: int):
    super().__init__(parent)
    self._block = block

  def __iter__(self) -> _BlocksIterator:
    return _BlocksIterator(self._parent.__iter__(), self._block)

  def __str__(self) -> str:
    return f"Blocks(block={self._block})"


def read_in_blocks(ds: grain.MapDataset, *, block: int, num_threads: int,
                   read: Callable[[list[Any]], list[Any]] = list) -> grain.IterDataset:
  """The elements of `ds`, in order, as `ds.to_iter_dataset()` gives them, but each of
  grain's `num_threads` reader threads (0: none, read in the caller's thread) makes
  `block` of them a call, through `read(elements)` (a list of as many; by default the
  elements themselves).

  grain's reader threads take an element a call, with its stats and a future each, all
  under the GIL: for elements that cost tens of microseconds (a prepared corpus's record,
  a random window) that was the reading's main cost, and threads made it slower than none.
  """
  blocks = ds.batch(block, batch_fn=read)  # The last block of a finite `ds` may be short.
  return _Blocks(blocks.to_iter_dataset(grain.ReadOptions(
      num_threads=num_threads, prefetch_buffer_size=BLOCKS_AHEAD)), block)


def shard_size(source: Any, process_index: int, process_count: int) -> int:
  """How many examples of `source` this process reads (see `documents`)."""
  return len(range(process_index, len(source), process_count))


class Unlist(grain.experimental.FlatMapTransform):
  """A list of zero or more elements (pairs, rows) per example -> its elements, one each.

  Training repeats its split forever, so if no example yields anything the packer
  or batcher after this would wait forever. So empty lists are counted in a row:
  `examples` of them in an evaluation (the whole split), 2 x `examples` in training
  (at least one whole epoch) stop the run with a DataError saying `what`.
  """

  max_fan_out = 1 << 20  # Only MapDataset.flat_map reads it; the IterDataset one has no limit.

  def __init__(self, examples: int, train: bool, what: str):
    self._limit = max(examples, 1) * (2 if train else 1)
    self._what = what
    self._empty = 0  # Examples in a row that yielded nothing.

  def flat_map(self, elements: list[Any]) -> list[Any]:
    if elements:
      self._empty = 0
    else:
      self._empty += 1
      if self._empty >= self._limit:
        raise DataError(f"{self._empty} examples in a row yielded nothing: {self._what}")
    return elements


class LengthLimit:
  """Applies `data.overlong` to token sequences and counts what it changed, never silently.

  The first overlong example is logged with its length; after that a running count
  is logged at 10, 100, 1000, ... so a long run shows how much was cut or dropped.
  Shared by the grain reader threads of one pipeline, hence the lock.
  """

  def __init__(self, policy: str, what: str):
    if policy not in OVERLONG_POLICIES:
      raise ValueError(f"config.data.overlong={policy!r} is invalid: valid values are "
                       f"{OVERLONG_POLICIES}")
    self.policy = policy
    self._what = what
    self._lock = threading.Lock()
    self.count = 0

  def __getstate__(self):  # Pickled by grain: a lock does not pickle.
    return {k: v for k, v in self.__dict__.items() if k != "_lock"}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def apply(self, ids: np.ndarray, max_len: int, field: str) -> np.ndarray | None:
    """`ids` if it fits, else truncated to `max_len` or None (dropped)."""
    if len(ids) <= max_len:
      return ids
    with self._lock:
      self.count += 1
      count = self.count
    action = "truncated to" if self.policy == "truncate" else "dropped; limit"
    if count == 1:
      logging.warning("%s: an example's %s has %d tokens, %s %d (config.data.overlong=%r; "
                      "raise config.data.seq_len to keep more)", self._what, field, len(ids),
                      action, max_len, self.policy)
    elif np.log10(count).is_integer():
      logging.warning("%s: %d overlong examples so far (%s %d tokens)", self._what, count,
                      action, max_len)
    return ids[:max_len] if self.policy == "truncate" else None


def pad_to(tokens: np.ndarray, length: int) -> dict[str, np.ndarray]:
  """One example alone in a row of `length`: tokens, segment ids (1 / 0) and positions."""
  n = len(tokens)
  pad = length - n
  return {
      "tokens": np.pad(tokens, (0, pad)).astype(np.int32),
      "segment_ids": np.pad(np.ones(n, np.int32), (0, pad)),
      "positions": np.pad(np.arange(n, dtype=np.int32), (0, pad)),
  }


def pad_batch(batch: Batch, batch_size: int) -> Batch:
  """Pads a short final eval batch with all-padding rows (weight 0) to a static shape."""
  missing = batch_size - batch["inputs"].shape[0]
  if missing == 0:
    return batch
  return {k: np.concatenate([v, np.zeros((missing,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}


def iterate_eval(dataset: grain.IterDataset, batch_size: int, num_batches: int) -> Iterator[Batch]:
  """Yields up to `num_batches` (all if -1) padded eval batches from a fresh iterator."""
  for i, batch in enumerate(dataset):
    if i == num_batches:
      return
    yield pad_batch(batch, batch_size)
