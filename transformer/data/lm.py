"""Language-modelling pipelines: causal LM (GPT) and masked LM (BERT).

  documents -> tokenize ([bos] text [eos], id-range check)
  causal:  concat-then-split into rows of seq_len + 1 -> inputs / targets shifted by one
  masked:  concat-then-split into rows of seq_len -> seeded BERT masking per row
  -> (optional window shuffle of rows, training) -> batch
"""

from __future__ import annotations

from typing import Any

import grain
import grain.experimental
import numpy as np

from transformer.data import packing
from transformer.data import tokenizers


class Tokenize(grain.transforms.Map):
  """text -> [bos] + ids + [eos], with every id checked against the model's vocabulary."""

  def __init__(self, tokenizer: tokenizers.Tokenizer, text_key: str, vocab_size: int):
    self._tokenizer = tokenizer
    self._text_key = text_key
    self._vocab_size = vocab_size

  def map(self, example: dict[str, Any]) -> dict[str, np.ndarray]:
    ids = self._tokenizer.encode(packing.text_of(example[self._text_key]))
    tokens = np.concatenate([[tokenizers.BOS_ID], ids, [tokenizers.EOS_ID]])
    return {"tokens": packing.checked(tokens, self._vocab_size)}


def _packed_rows(source: Any, tokenizer: tokenizers.Tokenizer, *, text_key: str,
                 vocab_size: int, row_len: int, seed: int, train: bool, shuffle_rows: int,
                 process_index: int, process_count: int,
                 num_threads: int) -> grain.IterDataset:
  """Tokenized documents concatenated and split into rows of `row_len` with segment ids."""
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


def make_lm_dataset(source: Any, tokenizer: tokenizers.Tokenizer, *, text_key: str,
                    vocab_size: int, seq_len: int, batch_size: int, seed: int,
                    train: bool, shuffle_rows: int = 0, process_index: int = 0,
                    process_count: int = 1, num_threads: int = 2) -> grain.IterDataset:
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
    process_index: this JAX process; it reads only every process_count-th example.
    process_count: number of JAX processes.
    num_threads: grain read/tokenize threads.

  Returns:
    A grain IterDataset of dicts with [batch_size, seq_len] `inputs`, `targets`,
    `segment_ids`, `positions` (int32) and `weights` (float32).
  """
  it = _packed_rows(source, tokenizer, text_key=text_key, vocab_size=vocab_size,
                    row_len=seq_len + 1, seed=seed, train=train, shuffle_rows=shuffle_rows,
                    process_index=process_index, process_count=process_count,
                    num_threads=num_threads)
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
    eligible = (segments > 0) & (tokens >= tokenizers.NUM_SPECIAL)
    chosen = eligible & (rng.random(tokens.shape) < self._mask_rate)
    action = rng.random(tokens.shape)
    # Uniform over [NUM_SPECIAL, vocab) minus the mask: draw from one id fewer, skip it.
    random_ids = rng.integers(tokenizers.NUM_SPECIAL, self._tokenizer_vocab_size - 1,
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


def make_mlm_dataset(source: Any, tokenizer: tokenizers.Tokenizer, *, text_key: str,
                     vocab_size: int, seq_len: int, batch_size: int, seed: int,
                     train: bool, mask_rate: float = 0.15, shuffle_rows: int = 0,
                     process_index: int = 0, process_count: int = 1,
                     num_threads: int = 2) -> grain.IterDataset:
  """The BERT-style masked-LM pipeline: packed [bos] text [eos] rows, seeded masking.

  The masks come from grain's `random_map`, seeded by (`seed`, `process_index`) and
  the row's index in the stream: the same rows get the same masks in every
  evaluation and after a restore from a saved iterator state.

  Args:
    source, tokenizer, text_key, vocab_size, seq_len, batch_size, seed, train,
      shuffle_rows, process_index, process_count, num_threads: as for `make_lm_dataset`.
    mask_rate: the fraction of real tokens to corrupt and predict.

  Returns:
    A grain IterDataset of dicts with [batch_size, seq_len] `inputs` (corrupted),
    `targets` (original ids), `segment_ids`, `positions` (int32) and `weights`
    (float32, 1 exactly at the chosen positions).
  """
  if not tokenizers.NUM_SPECIAL <= tokenizer.mask_id < min(tokenizer.vocab_size, vocab_size):
    raise ValueError(f"mask id {tokenizer.mask_id} is outside [{tokenizers.NUM_SPECIAL}, "
                     f"{min(tokenizer.vocab_size, vocab_size)})")
  it = _packed_rows(source, tokenizer, text_key=text_key, vocab_size=vocab_size,
                    row_len=seq_len, seed=seed, train=train, shuffle_rows=shuffle_rows,
                    process_index=process_index, process_count=process_count,
                    num_threads=num_threads)
  # Fold in the process: otherwise every host would draw the same mask pattern per row.
  mask_seed = int(np.random.SeedSequence((seed, process_index)).generate_state(1)[0])
  it = it.random_map(_MaskTokens(tokenizer.mask_id, tokenizer.vocab_size, mask_rate),
                     seed=mask_seed)
  return it.batch(batch_size, drop_remainder=train)
