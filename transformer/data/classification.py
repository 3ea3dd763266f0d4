"""The classification pipeline: one labelled example per row, padded (a row has one label).

  documents -> [bos] text [eos] (id-range check, length policy) + label check -> pad -> batch
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np

from transformer.config.errors import DataError
from transformer.data import lm
from transformer.data import packing
from transformer.data.tokenizers import vocabularies


class _TokenizeLabeled(grain.transforms.Map):
  """(text, label) -> [bos] ids [eos] with `overlong` applied, and the checked label."""

  def __init__(self, tokenizer: vocabularies.Tokenizer, text_key: str, label_key: str,
               vocab_size: int, seq_len: int, num_classes: int,
               length_limit: packing.LengthLimit, split: str):
    self._tokenize = lm.Tokenize(tokenizer, text_key, vocab_size)
    self._text_key = text_key
    self._label_key = label_key
    self._seq_len = seq_len
    self._num_classes = num_classes
    self._length_limit = length_limit
    self._split = split

  def map(self, example: dict[str, Any]) -> list[packing.Batch]:
    label = int(example[self._label_key])
    if not 0 <= label < self._num_classes:
      # GLUE's test splits carry label -1: they have no labels to train or score on.
      raise DataError(
          f"split {self._split!r}: label {label} is outside [0, model.num_classes="
          f"{self._num_classes}) (feature {self._label_key!r}, text: "
          f"{packing.text_of(example[self._text_key])[:80]!r}); a split without "
          "labels (label -1) cannot be trained or evaluated on")
    tokens = self._length_limit.apply(self._tokenize.map(example)["tokens"], self._seq_len,
                                      "text")
    if tokens is None:
      return []
    row = packing.pad_to(tokens, self._seq_len)
    return [{"inputs": row["tokens"], "segment_ids": row["segment_ids"],
             "positions": row["positions"], "label": np.int32(label),
             "weights": np.float32(1.0)}]


def make_classification_dataset(source: Any, tokenizer: vocabularies.Tokenizer, *,
                                text_key: str, label_key: str, num_classes: int,
                                vocab_size: int, seq_len: int, batch_size: int, seed: int,
                                train: bool, overlong: str = "truncate", split: str = "",
                                process_index: int = 0, process_count: int = 1,
                                num_threads: int = 2) -> grain.IterDataset:
  """One example per row (no packing: a row has one label), padded to seq_len.

  Args:
    source, tokenizer, text_key, vocab_size, seq_len, batch_size, seed, train,
      process_index, process_count, num_threads: as for `lm.make_lm_dataset`.
    label_key: the example field holding the integer class.
    num_classes: labels must lie in [0, num_classes).
    overlong: a text longer than seq_len is "truncate"d or "drop"ped (counted, logged).
    split: the split's name, for messages.

  Returns:
    A grain IterDataset of dicts with [batch_size, seq_len] `inputs`, `segment_ids`,
    `positions` and [batch_size] `label` (int32) and `weights` (float32).
  """
  limit = packing.LengthLimit(overlong, f"classification {split}".strip())
  transform = _TokenizeLabeled(tokenizer, text_key, label_key, vocab_size, seq_len,
                               num_classes, limit, split)
  it = packing.documents(source, transform, seed=seed, train=train,
                         process_index=process_index, process_count=process_count,
                         num_threads=num_threads)
  # A list of zero (dropped) or one row per example.
  it = grain.experimental.FlatMapIterDataset(it, packing.Unlist(
      packing.shard_size(source, process_index, process_count), train,
      f"every example of split {split!r} was dropped as longer than config.data.seq_len="
      f"{seq_len} tokens (config.data.overlong={overlong!r}): raise config.data.seq_len or "
      "set config.data.overlong='truncate'."))
  return it.batch(batch_size, drop_remainder=train)

