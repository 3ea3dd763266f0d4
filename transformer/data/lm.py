"""Language-modelling pipelines: causal LM (GPT) and masked LM (BERT).

  documents -> tokenize ([bos] text [eos], id-range check; a document cut into pieces,
               like local_text's blocks, gets [bos] on its first piece and [eos] on
               its last only)
  causal:  concat-then-split into rows of seq_len + 1 -> inputs / targets shifted by one
           (or, training with data.lm_windows="random", nanoGPT's sampling: rows at
           uniformly random offsets into the concatenated documents)
  masked:  concat-then-split into rows of seq_len -> seeded BERT masking per row
  -> (optional window shuffle of rows, training) -> batch

Packed rows give every example its own segment: examples are shuffled, so the
piece beside another in a row is rarely the text that came before it. Random
windows read the split in order, so a window there runs across the cut between
two pieces of one document, as nanoGPT's windows do over its one stream.
"""

from __future__ import annotations

import time
from typing import Any

import grain
import grain.experimental
import numpy as np
from absl import logging

from transformer.data import packing
from transformer.data.corpus import mixture
from transformer.data.corpus import packer
from transformer.data.tokenizers import vocabularies

# Enough random windows never to run out: grain needs a finite length.
_NUM_RANDOM_WINDOWS = 2 ** 62
_WINDOWS_BLOCK = 64  # Random windows (rows) a grain reader thread makes a call.


def starts_document(example: dict[str, Any]) -> bool:
  """False for a later piece of a document cut into examples (`local_text` blocks)."""
  return bool(example.get("starts_document", True))


def ends_document(example: dict[str, Any]) -> bool:
  """False for a piece of a document that the next example continues."""
  return bool(example.get("ends_document", True))


class Tokenize(grain.transforms.Map):
  """text -> [bos] + ids + [eos], with every id checked against the model's vocabulary.

  An example that is a piece of a longer document (`local_text` cuts files into
  blocks) gets [bos] only if it starts the document and [eos] only if it ends it.
  """

  def __init__(self, tokenizer: vocabularies.Tokenizer, text_key: str, vocab_size: int):
    self._tokenizer = tokenizer
    self._text_key = text_key
    self._vocab_size = vocab_size

  def map(self, example: dict[str, Any]) -> dict[str, np.ndarray]:
    ids = self._tokenizer.encode(packing.text_of(example[self._text_key]))
    tokens = np.concatenate([[vocabularies.BOS_ID] if starts_document(example) else [], ids,
                             [vocabularies.EOS_ID] if ends_document(example) else []])
    return {"tokens": packing.checked(tokens, self._vocab_size)}


def packed_rows(source: Any, tokenizer: vocabularies.Tokenizer, *, text_key: str,
                 vocab_size: int, row_len: int, seed: int, train: bool, shuffle_rows: int,
                 process_index: int, process_count: int, num_threads: int,
                 prepared: bool = False) -> grain.IterDataset:
  """Tokenized documents concatenated and split into rows of `row_len` with segment ids."""
  if prepared:  # The same documents read in blocks, rows cut by numpy slices (corpus/packer.py).
    it = packer.PackedRows(packer.documents(
        source, seed=seed, train=train, process_index=process_index,
        process_count=process_count, num_threads=num_threads), row_len)
  else:
    it = packing.documents(source, Tokenize(tokenizer, text_key, vocab_size), seed=seed,
                           train=train, process_index=process_index,
                           process_count=process_count, num_threads=num_threads)
    it = grain.experimental.ConcatThenSplitIterDataset(it, length_struct={"tokens": row_len})
  if train and shuffle_rows > 1:
    # Consecutive rows of one long document are alike; a corpus of few, long documents
    # (TFDS tiny_shakespeare has one per split) needs its rows mixed, not only its documents.
    it = grain.experimental.WindowShuffleIterDataset(it, window_size=shuffle_rows,
                                                     seed=seed + process_index)
  return it


def _token_stream(source: Any, tokenize: Tokenize, *, process_index: int,
                  process_count: int) -> tuple[np.ndarray, np.ndarray]:
  """This process's examples, tokenized in order and concatenated: (tokens, document ids).

  Consecutive pieces of one document (an example that does not start its document,
  read right after the example before it in the source) share a document id, so
  windows attend across the cut; with several processes, each reads every
  process_count-th example and its pieces stay apart.
  """
  indices = range(process_index, len(source), process_count)
  tokens, doc_ids, started, last_log = [], [], time.monotonic(), time.monotonic()
  doc = -1
  for index in indices:
    example = source[index]
    ids = tokenize.map(example)["tokens"]
    if starts_document(example) or process_count > 1 or not tokens:
      doc += 1
    tokens.append(ids)
    doc_ids.append(np.full(len(ids), doc, np.int32))
    if time.monotonic() - last_log > 30:
      last_log = time.monotonic()
      logging.info("random LM windows: tokenized %d/%d examples", len(tokens), len(indices))
  if not tokens:
    raise ValueError("random LM windows: the training split has no documents")
  stream, docs = np.concatenate(tokens), np.concatenate(doc_ids)
  logging.info("random LM windows: %d examples in %d documents, %d tokens in memory "
               "(%.1f s)", len(tokens), doc + 1, len(stream), time.monotonic() - started)
  return stream, docs


class _RandomWindow(grain.transforms.RandomMap):
  """Index -> a row of `row_len` tokens at a uniformly random offset of the stream.

  The offset comes from grain's per-index seeded generator, so the rows are the same
  after a restore from a saved iterator state. Documents inside a window keep their
  boundaries: segment ids 1, 2, ... and positions restarting at each document (a
  window that starts inside a document numbers its positions from the window start,
  as nanoGPT does).
  """

  def __init__(self, stream: np.ndarray, doc_ids: np.ndarray, row_len: int):
    if len(stream) < row_len:
      raise ValueError(f"random LM windows: the training split has {len(stream)} tokens, "
                       f"fewer than one row of {row_len}; lower data.seq_len")
    self._stream, self._doc_ids, self._row_len = stream, doc_ids, row_len

  def random_map(self, index: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    del index  # The generator is already seeded by it.
    start = int(rng.integers(0, len(self._stream) - self._row_len + 1))
    window = slice(start, start + self._row_len)
    return window_row(self._stream[window], self._doc_ids[window])


def window_row(tokens: np.ndarray, docs: np.ndarray) -> dict[str, np.ndarray]:
  """A window of the token stream and its tokens' document ids -> a row with segment ids
  1, 2, ... and positions restarting at each document (from the window start for the
  first)."""
  new_doc = np.concatenate([[True], docs[1:] != docs[:-1]])
  steps = np.arange(len(tokens))
  doc_start = np.maximum.accumulate(np.where(new_doc, steps, 0))
  return {"tokens": tokens,
          "tokens_segment_ids": np.cumsum(new_doc).astype(np.int32),
          "tokens_positions": (steps - doc_start).astype(np.int32)}


class _CorpusWindow(grain.transforms.RandomMap):
  """_RandomWindow over a prepared corpus split: windows read by random access.

  Offsets are uniform over this process's contiguous share of the split's token
  stream (`process_count` equal ranges), so no process holds or scans the split.
  """

  def __init__(self, split: Any, row_len: int, process_index: int, process_count: int):
    share = split.num_tokens // process_count
    if share < row_len:
      raise ValueError(f"random LM windows: the {split.name} split has {split.num_tokens} "
                       f"tokens, {share} a process, fewer than one row of {row_len}; lower "
                       "data.seq_len")
    self._split, self._row_len = split, row_len
    self._first = process_index * share
    self._last = self._first + share - row_len  # The last start inside the share.

  def random_map(self, index: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    del index  # The generator is already seeded by it.
    start = int(rng.integers(self._first, self._last + 1))
    return window_row(*self._split.window(start, self._row_len))


def _random_windows(source: Any, tokenizer: vocabularies.Tokenizer, *, text_key: str,
                    vocab_size: int, row_len: int, seed: int, process_index: int,
                    process_count: int, num_threads: int,
                    prepared: bool = False) -> grain.IterDataset:
  """Training rows drawn like nanoGPT's get_batch: random offsets, with replacement."""
  if prepared:
    windows = _CorpusWindow(source, row_len, process_index, process_count)
  else:
    stream, doc_ids = _token_stream(source, Tokenize(tokenizer, text_key, vocab_size),
                                    process_index=process_index, process_count=process_count)
    windows = _RandomWindow(stream, doc_ids, row_len)
  window_seed = int(np.random.SeedSequence((seed, process_index)).generate_state(1)[0])
  ds = grain.MapDataset.range(_NUM_RANDOM_WINDOWS).random_map(windows, seed=window_seed)
  # Each row's window is drawn from its own index's generator: blocks change no row.
  return packing.read_in_blocks(ds, block=_WINDOWS_BLOCK, num_threads=num_threads)


def _split_inputs_targets(row: dict[str, np.ndarray]) -> packing.Batch:
  """A packed row of seq_len + 1 tokens -> next-token inputs, targets and loss weights."""
  tokens, segments = row["tokens"], row["tokens_segment_ids"]
  return {
      "inputs": tokens[:-1],
      "targets": tokens[1:],
      "segment_ids": segments[:-1],
      "positions": row["tokens_positions"][:-1],
      # A target counts only when it continues the same (non-padding) document.
      "weights": ((segments[:-1] == segments[1:]) & (segments[:-1] > 0)).astype(np.float32),
  }


def make_lm_dataset(source: Any, tokenizer: vocabularies.Tokenizer, *, text_key: str,
                    vocab_size: int, seq_len: int, batch_size: int, seed: int,
                    train: bool, shuffle_rows: int = 0, windows: str = "packed",
                    process_index: int = 0, process_count: int = 1,
                    num_threads: int = 2, prepared: bool = False) -> grain.IterDataset:
  """The causal-LM pipeline over any random-access source of text examples.

  Args:
    source: random-access examples (e.g. `tfds.data_source`), each a dict with text.
    tokenizer: maps text to ids.
    text_key: the example field holding the text.
    vocab_size: the model's vocabulary size (ids must be below it).
    seq_len: tokens per model row.
    batch_size: rows per batch on this process.
    seed: shuffle seed.
    train: repeat forever (reshuffled each epoch); otherwise one pass, last batch kept.
    shuffle_rows: training only: shuffle packed rows within windows of this many.
    windows: training only: "packed" (concatenate-then-split) or "random" (rows at
      uniformly random offsets into this process's documents concatenated in order,
      nanoGPT's sampling; the split's tokens are held in memory).
    process_index: this JAX process; it reads only every process_count-th example.
    process_count: number of JAX processes.
    num_threads: grain read/tokenize threads.
    prepared: `source` is a prepared corpus split (data/corpus/store.py) of token ids: no
      tokenizer runs; random windows read it by random access, never hold it. A
      mixture.MixtureSplit (data.mixture): each component's rows, mixed by weight.

  Returns:
    A grain IterDataset of dicts with [batch_size, seq_len] `inputs`, `targets`,
    `segment_ids`, `positions` (int32) and `weights` (float32).
  """
  def rows(split: Any, index: int) -> grain.IterDataset:
    if train and windows == "random":
      return _random_windows(split, tokenizer, text_key=text_key, vocab_size=vocab_size,
                             row_len=seq_len + 1, seed=mixture.component_seed(seed, index),
                             process_index=process_index, process_count=process_count,
                             num_threads=num_threads, prepared=prepared)
    return packed_rows(split, tokenizer, text_key=text_key, vocab_size=vocab_size,
                        row_len=seq_len + 1, seed=mixture.component_seed(seed, index),
                        train=train, shuffle_rows=shuffle_rows, process_index=process_index,
                        process_count=process_count, num_threads=num_threads,
                        prepared=prepared)

  it = mixture.mix_rows(source, rows)  # data.mixture: the components' rows by weight.
  return it.map(_split_inputs_targets).batch(batch_size, drop_remainder=train)


class _MaskTokens(grain.transforms.RandomMap):
  """BERT corruption of a packed row, drawn from grain's per-row seeded generator.

  Each real token (not padding, bos, eos or unk) is chosen with probability
  `mask_rate`; a chosen token becomes the mask id 80% of the time, a uniformly
  random non-special id other than the mask 10%, and stays itself 10%. The loss is
  taken exactly at the chosen positions.
  """

  def __init__(self, mask_id: int, tokenizer_vocab_size: int, mask_rate: float):
    self._mask_id = mask_id
    self._tokenizer_vocab_size = tokenizer_vocab_size
    self._mask_rate = mask_rate

  def random_map(self, row: dict[str, np.ndarray], rng: np.random.Generator) -> packing.Batch:
    tokens, segments = row["tokens"], row["tokens_segment_ids"]
    eligible = (segments > 0) & (tokens >= vocabularies.NUM_SPECIAL)
    chosen = eligible & (rng.random(tokens.shape) < self._mask_rate)
    action = rng.random(tokens.shape)
    # Uniform over [NUM_SPECIAL, vocab) minus the mask: draw from one id fewer, skip it.
    random_ids = rng.integers(vocabularies.NUM_SPECIAL, self._tokenizer_vocab_size - 1,
                              tokens.shape, dtype=np.int32)
    random_ids += (random_ids >= self._mask_id).astype(np.int32)
    inputs = np.where(chosen & (action < 0.8), self._mask_id,
                      np.where(chosen & (action < 0.9), random_ids, tokens))
    return {
        "inputs": inputs.astype(np.int32),
        "targets": tokens,
        "weights": chosen.astype(np.float32),
        "segment_ids": segments,
        "positions": row["tokens_positions"],
    }


def make_mlm_dataset(source: Any, tokenizer: vocabularies.Tokenizer, *, text_key: str,
                     vocab_size: int, seq_len: int, batch_size: int, seed: int,
                     train: bool, mask_rate: float = 0.15, shuffle_rows: int = 0,
                     process_index: int = 0, process_count: int = 1,
                     num_threads: int = 2, prepared: bool = False) -> grain.IterDataset:
  """The BERT-style masked-LM pipeline: packed [bos] text [eos] rows, seeded masking.

  The masks come from grain's `random_map`, seeded by (`seed`, `process_index`) and
  the row's index in the stream: the same rows get the same masks in every
  evaluation and after a restore from a saved iterator state.

  Args:
    source, tokenizer, text_key, vocab_size, seq_len, batch_size, seed, train,
      shuffle_rows, process_index, process_count, num_threads, prepared: as for
      `make_lm_dataset`.
    mask_rate: the fraction of real tokens to corrupt and predict.

  Returns:
    A grain IterDataset of dicts with [batch_size, seq_len] `inputs` (corrupted),
    `targets` (original ids), `segment_ids`, `positions` (int32) and `weights`
    (float32, 1 exactly at the chosen positions).
  """
  if not vocabularies.NUM_SPECIAL <= tokenizer.mask_id < min(tokenizer.vocab_size, vocab_size):
    raise ValueError(f"mask id {tokenizer.mask_id} is outside [{vocabularies.NUM_SPECIAL}, "
                     f"{min(tokenizer.vocab_size, vocab_size)})")
  it = mixture.mix_rows(source, lambda split, index: packed_rows(
      split, tokenizer, text_key=text_key, vocab_size=vocab_size, row_len=seq_len,
      seed=mixture.component_seed(seed, index), train=train, shuffle_rows=shuffle_rows,
      process_index=process_index, process_count=process_count, num_threads=num_threads,
      prepared=prepared))
  # Fold in the process: otherwise every host would draw the same mask pattern per row.
  mask_seed = int(np.random.SeedSequence((seed, process_index)).generate_state(1)[0])
  it = it.random_map(_MaskTokens(tokenizer.mask_id, tokenizer.vocab_size, mask_rate),
                     seed=mask_seed)
  return it.batch(batch_size, drop_remainder=train)
