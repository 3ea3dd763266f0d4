"""What every objective's pipeline shares: reading, length limits, packing and batching.

  source -> [this process's slice] -> seeded shuffle -> repeat (training) -> map
  -> (objective-specific rows: packed or padded) -> batch

Packing writes integer segment ids (0 = padding, 1, 2, ... = the examples in the
row) and per-example positions, so attention never crosses examples. Every
iterator is a grain `DatasetIterator`, whose state is saved in every checkpoint.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import grain
import numpy as np
from absl import logging

from transformer.config.data import OVERLONG_POLICIES
from transformer.config.errors import DataError

Batch = dict[str, np.ndarray]


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


def documents(source: Any, transform: grain.transforms.Map, *, seed: int, train: bool,
              process_index: int, process_count: int, num_threads: int) -> grain.IterDataset:
  """This process's share of `source`, shuffled (repeated when training), mapped by `transform`."""
  # Shuffled in eval too, with the fixed seed: a partial evaluation then sees the
  # same representative sample of documents every time, not the first few.
  ds = grain.MapDataset.source(source)[process_index::process_count].shuffle(seed=seed)
  if train:
    ds = ds.repeat(None)  # A new permutation every epoch.
  ds = ds.map(transform)
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=64))


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
