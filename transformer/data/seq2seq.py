"""The encoder-decoder pipeline: (source text, target text) pairs -> packed or padded rows.

  documents -> `inputs_fn` pairs (translation: two language features of one example;
  the offline corpus: consecutive blocks of code) -> each side ids + [eos], length
  policy -> one pair per element -> first-fit packing of whole pairs ("pack") or one
  pair per row ("pad") -> decoder inputs shifted right within each pair -> batch.

Pair k of a packed row has segment id k + 1 on both the source and the target side,
which is what lets cross-attention be masked per pair.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import grain
import grain.experimental
import numpy as np

from transformer.config.data import PACKINGS
from transformer.data import packing
from transformer.data.tokenizers import vocabularies

InputsFn = Callable[[dict[str, Any]], list[tuple[str, str]]]


class TokenizePairs(grain.transforms.Map):
  """example -> `inputs_fn` text pairs -> [{inputs: ids + [eos], targets: ids + [eos]}]."""

  def __init__(self, tokenizer: vocabularies.Tokenizer, inputs_fn: InputsFn, vocab_size: int,
               source_len: int, target_len: int, length_limit: packing.LengthLimit):
    self._tokenizer = tokenizer
    self._inputs_fn = inputs_fn
    self._vocab_size = vocab_size
    self._lengths = {"inputs": source_len, "targets": target_len}
    self._length_limit = length_limit

  def map(self, example: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    pairs = []
    for source, target in self._inputs_fn(example):
      pair = {}
      for field, text in (("inputs", source), ("targets", target)):
        ids = np.append(self._tokenizer.encode(text), vocabularies.EOS_ID)
        ids = self._length_limit.apply(ids, self._lengths[field], field)
        if ids is None:
          break
        pair[field] = packing.checked(ids, self._vocab_size)
      if len(pair) == 2:
        pairs.append(pair)
    return pairs


@dataclasses.dataclass(frozen=True)
class _PadPair:
  """One pair alone in a row, in the key layout that packing produces."""

  source_len: int
  target_len: int

  def __call__(self, pair: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    row = {}
    for field, length in (("inputs", self.source_len), ("targets", self.target_len)):
      padded = packing.pad_to(pair[field], length)
      row[field] = padded["tokens"]
      row[f"{field}_segment_ids"] = padded["segment_ids"]
      row[f"{field}_positions"] = padded["positions"]
    return row


def add_decoder_inputs(row: dict[str, np.ndarray]) -> packing.Batch:
  """Packed pairs -> the model's keys, with targets shifted right within each pair."""
  targets, segments = row["targets"], row["targets_segment_ids"]
  positions = row["targets_positions"]
  shifted = np.concatenate([[vocabularies.BOS_ID], targets[:-1]]).astype(np.int32)
  decoder_inputs = np.where(positions == 0, vocabularies.BOS_ID, shifted)
  return {
      "inputs": row["inputs"],
      "inputs_segment_ids": row["inputs_segment_ids"],
      "inputs_positions": row["inputs_positions"],
      "targets": targets,
      "decoder_inputs": np.where(segments > 0, decoder_inputs, vocabularies.PAD_ID).astype(np.int32),
      "targets_segment_ids": segments,
      "targets_positions": positions,
      "weights": (segments > 0).astype(np.float32),
  }


def make_seq2seq_dataset(source: Any, tokenizer: vocabularies.Tokenizer, *,
                         inputs_fn: InputsFn, vocab_size: int, source_len: int,
                         target_len: int, batch_size: int, seed: int, train: bool,
                         packing_mode: str = "pack", overlong: str = "truncate",
                         process_index: int = 0, process_count: int = 1,
                         num_threads: int = 2) -> grain.IterDataset:
  """The encoder-decoder pipeline over (source text, target text) pairs.

  Each side is tokenized as ids + [eos]; a side longer than its length is truncated
  or its pair dropped (`overlong`), counted and logged. Whole pairs are packed
  first-fit, several to a row (`packing_mode="pack"`), or one to a row ("pad").

  Args:
    source: random-access examples (e.g. `tfds.data_source`).
    tokenizer: maps text to ids.
    inputs_fn: one example -> zero or more (source text, target text) pairs.
    vocab_size: the model's vocabulary size (ids must be below it).
    source_len: encoder tokens per row.
    target_len: decoder tokens per row.
    batch_size, seed, train, process_index, process_count, num_threads: as for
      `lm.make_lm_dataset`.
    packing_mode: "pack" or "pad".
    overlong: "truncate" or "drop".

  Returns:
    A grain IterDataset of dicts with [batch_size, source_len] `inputs`,
    `inputs_segment_ids`, `inputs_positions` and [batch_size, target_len]
    `targets`, `decoder_inputs` (bos, then the targets shifted right, within each
    pair; 0 on padding), `targets_segment_ids`, `targets_positions` (int32) and
    `weights` (float32, 1 on every real target token).
  """
  if packing_mode not in PACKINGS:
    raise ValueError(f"config.data.packing={packing_mode!r} is invalid: valid values are "
                     f"{PACKINGS}")
  limit = packing.LengthLimit(overlong, "seq2seq" if train else "seq2seq eval")
  tokenize = TokenizePairs(tokenizer, inputs_fn, vocab_size, source_len, target_len, limit)
  it = packing.documents(source, tokenize, seed=seed, train=train,
                         process_index=process_index, process_count=process_count,
                         num_threads=num_threads)
  it = grain.experimental.FlatMapIterDataset(it, packing.Unlist(
      packing.shard_size(source, process_index, process_count), train,
      _why_no_pair(inputs_fn, source_len, overlong)))
  if packing_mode == "pack":
    # Documents are already shuffled; unshuffled bins keep the packing deterministic.
    it = grain.experimental.FirstFitPackIterDataset(
        it, length_struct={"inputs": source_len, "targets": target_len},
        num_packing_bins=batch_size, shuffle_bins=False)
  else:
    it = it.map(_PadPair(source_len, target_len))
  it = it.map(add_decoder_inputs)
  return it.batch(batch_size, drop_remainder=train)


def _why_no_pair(inputs_fn: InputsFn, seq_len: int, overlong: str) -> str:
  """What to change when no example yields a pair, for packing.Unlist's error."""
  reasons = []
  if overlong == "drop":
    reasons.append(f"a pair with a side longer than config.data.seq_len={seq_len} tokens is "
                   "dropped (config.data.overlong='drop'): raise config.data.seq_len or set "
                   "config.data.overlong='truncate'")
  if isinstance(inputs_fn, _ContinuationPairs):
    reasons.append("on plain text a pair is two consecutive blocks of whole lines of one "
                   "document, each of up to config.data.continuation_chars="
                   f"{inputs_fn.source_chars} characters, so a document that fits in one "
                   "block gives none: lower config.data.continuation_chars")
  return ("no (source, target) pair came out of them; " +
          ("; ".join(reasons) if reasons else "check the source and target texts") + ".")


@dataclasses.dataclass(frozen=True)
class _TranslationPair:
  """The `inputs_fn` of `translation_pairs` (a class, so it pickles)."""

  source_key: str
  target_key: str

  def __call__(self, example: dict[str, Any]) -> list[tuple[str, str]]:
    return [(packing.text_of(example[self.source_key]),
             packing.text_of(example[self.target_key]))]


def translation_pairs(source_language: str, target_language: str) -> InputsFn:
  """An `inputs_fn` for translation datasets: one example = one sentence pair.

  Args:
    source_language: the feature holding the source text, e.g. "en".
    target_language: the feature holding the target text, e.g. "de".

  Returns:
    example -> [(example[source_language], example[target_language])].
  """
  return _TranslationPair(source_language, target_language)


@dataclasses.dataclass(frozen=True)
class _ContinuationPairs:
  """The `inputs_fn` made by `continuation_pairs` (a class, so it pickles)."""

  text_key: str
  source_chars: int
  target_chars: int

  def __call__(self, example: dict[str, Any]) -> list[tuple[str, str]]:
    lines = packing.text_of(example[self.text_key]).splitlines(keepends=True)
    pairs, start = [], 0
    while start < len(lines):
      source, start = _take_lines(lines, start, self.source_chars)
      target, start = _take_lines(lines, start, self.target_chars)
      if source.strip() and target.strip():
        pairs.append((source, target))
    return pairs


def _take_lines(lines: list[str], start: int, max_chars: int) -> tuple[str, int]:
  """Whole lines from `start`, at least one, up to `max_chars` characters; and the next start."""
  end, size = start, 0
  while end < len(lines) and (end == start or size + len(lines[end]) <= max_chars):
    size += len(lines[end])
    end += 1
  return "".join(lines[start:end]), end


def continuation_pairs(text_key: str, source_chars: int, target_chars: int) -> InputsFn:
  """An `inputs_fn` for the offline corpus: predict the next lines of code from the previous.

  A document's lines are cut, in order and without overlap, into blocks of whole
  lines that alternate source (up to ~`source_chars` characters), target (up to
  ~`target_chars`), source, target, ...; a block holds at least one line, so a
  longer line makes it longer. Each (source, following target) is a pair; a pair
  with a whitespace-only side, or a trailing source without a target, is skipped.

  Args:
    text_key: the example field holding the text.
    source_chars: the budget of a source block, in characters.
    target_chars: the budget of a target block, in characters.

  Returns:
    A deterministic callable: example -> list of (source text, target text).
  """
  return _ContinuationPairs(text_key, source_chars, target_chars)
