"""From a TFDS dataset name to packed, batched, per-process LM rows, with grain.

  TFDS array_record source -> [this process's slice] -> seeded shuffle -> repeat
  -> tokenize (+bos/eos, id-range check) -> concat-then-split packing into rows of
  seq_len + 1 -> (inputs, targets, segment_ids, positions, weights) -> batch.

Packing writes integer segment ids (0 = padding, 1, 2, ... = documents in the row)
and per-document positions, so attention never crosses documents. The iterator is
a grain `DatasetIterator`, whose state is saved in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator

import grain
import jax
import grain.experimental
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from transformer import distributed
from transformer.configuration import ConfigError
from transformer.data import python_stdlib
from transformer.data import tokenizers

Batch = dict[str, np.ndarray]
OFFLINE_DATASETS = ("python_stdlib",)  # Built from local files; never download.


@dataclasses.dataclass
class DataSources:
  """The prepared dataset and tokenizer a run trains on."""

  builder: tfds.core.DatasetBuilder
  tokenizer: tokenizers.Tokenizer


def load_builder(data: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Finds `data.name` in the TFDS catalog (or this project) and makes sure it is prepared.

  Raises:
    ConfigError: unknown dataset, missing split or feature, or a dataset that
      would need a download while `data.download` is False.
  """
  data_dir = data.data_dir or None
  try:
    builder = tfds.builder(data.name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ConfigError(f"config.data.name={data.name!r} is not a TFDS dataset: "
                      f"{str(e).splitlines()[0]} Use 'python_stdlib' (offline) or a name "
                      "from the TFDS catalog.") from e
  if builder.name == "python_stdlib":
    recorded = builder.info.metadata.get("python_version") if builder.is_prepared() else None
    expected = builder.builder_config.python_version
    if recorded is not None and recorded != expected:
      raise ConfigError(f"{builder.data_dir} was built from Python {recorded}, but this is "
                        f"Python {expected}; remove that directory to rebuild it.")
  if not builder.is_prepared():
    if builder.name not in OFFLINE_DATASETS and not data.download:
      raise ConfigError(
          f"config.data.name={data.name!r} is not prepared in {builder.data_dir_root} and "
          "config.data.download=False. Prepare it on a machine with network "
          f"(`tfds build {data.name} --file_format=array_record --data_dir=DIR`) and set "
          "config.data.data_dir=DIR, or set config.data.download=True.")
    logging.info("Preparing TFDS dataset %s in %s (one time)", builder.info.full_name,
                 builder.data_dir)
    builder.download_and_prepare(file_format="array_record")
  for key in ("train_split", "eval_split"):
    if data[key] not in builder.info.splits:
      raise ConfigError(f"config.data.{key}={data[key]!r} is not a split of {data.name}; "
                        f"valid: {sorted(builder.info.splits)}")
  if data.text_key not in builder.info.features:
    raise ConfigError(f"config.data.text_key={data.text_key!r} is not a feature of "
                      f"{data.name}; valid: {sorted(builder.info.features)}")
  return builder


def load_tokenizer(data: ml_collections.ConfigDict, builder: tfds.core.DatasetBuilder,
                   vocab_size: int) -> tokenizers.Tokenizer:
  """The byte tokenizer, or the SentencePiece model cached beside the data (trained once)."""
  if data.tokenizer == "bytes":
    return tokenizers.ByteTokenizer()
  path = os.path.join(str(builder.data_dir),
                      f"spm_{data.train_split}_{data.text_key}_v{vocab_size}.model")
  if os.path.exists(path):
    return tokenizers.SentencePieceTokenizer(path)
  source = builder.as_data_source(split=data.train_split)

  def lines():
    for i in range(len(source)):
      text = source[i][data.text_key]
      text = text.decode("utf-8") if isinstance(text, bytes) else text
      yield from (line for line in text.split("\n") if line.strip())

  return tokenizers.train_sentencepiece(lines(), vocab_size, path, data.spm_train_sentences)


def load_sources(config: ml_collections.ConfigDict) -> DataSources:
  """Prepares the dataset and tokenizer and checks the tokenizer fits the model.

  With several processes, process 0 prepares first and the others wait, so a data
  dir shared between hosts is written once; hosts with local disks then prepare
  their own copy.
  """
  if jax.process_index() == 0:
    builder = load_builder(config.data)
    tokenizer = load_tokenizer(config.data, builder, config.model.vocab_size)
  distributed.barrier("data_prepared")
  if jax.process_index() != 0:
    builder = load_builder(config.data)
    tokenizer = load_tokenizer(config.data, builder, config.model.vocab_size)
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"config.model.vocab_size={config.model.vocab_size} is smaller than the "
        f"{config.data.tokenizer} tokenizer's vocabulary ({tokenizer.vocab_size}); "
        f"expected >= {tokenizer.vocab_size}")
  return DataSources(builder=builder, tokenizer=tokenizer)


class _Tokenize(grain.transforms.Map):
  """text -> [bos] + ids + [eos], with every id checked against the model's vocabulary."""

  def __init__(self, tokenizer: tokenizers.Tokenizer, text_key: str, vocab_size: int):
    self._tokenizer = tokenizer
    self._text_key = text_key
    self._vocab_size = vocab_size

  def map(self, example: dict[str, Any]) -> dict[str, np.ndarray]:
    text = example[self._text_key]
    text = text.decode("utf-8") if isinstance(text, bytes) else text
    ids = self._tokenizer.encode(text)
    tokens = np.concatenate([[tokenizers.BOS_ID], ids, [tokenizers.EOS_ID]]).astype(np.int32)
    # JAX's embedding lookup clamps out-of-range ids silently; stop them here instead.
    if tokens.min() < 0 or tokens.max() >= self._vocab_size:
      raise ValueError(f"token id {int(tokens.max())} (or {int(tokens.min())}) is outside "
                       f"the model vocabulary [0, {self._vocab_size})")
    return {"tokens": tokens}


def _split_inputs_targets(row: dict[str, np.ndarray]) -> Batch:
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
                    train: bool, process_index: int = 0, process_count: int = 1,
                    num_threads: int = 2) -> grain.IterDataset:
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
    process_index: this JAX process; it reads only every process_count-th example.
    process_count: number of JAX processes.
    num_threads: grain read/tokenize threads.

  Returns:
    A grain IterDataset of dicts with [batch_size, seq_len] `inputs`, `targets`,
    `segment_ids`, `positions` (int32) and `weights` (float32).
  """
  # Shuffled in eval too, with the fixed seed: a partial evaluation then sees the
  # same representative sample of documents every time, not the first few files.
  ds = grain.MapDataset.source(source)[process_index::process_count].shuffle(seed=seed)
  if train:
    ds = ds.repeat(None)  # A new permutation every epoch.
  ds = ds.map(_Tokenize(tokenizer, text_key, vocab_size))
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=64))
  it = grain.experimental.ConcatThenSplitIterDataset(it, length_struct={"tokens": seq_len + 1})
  it = it.map(_split_inputs_targets)
  return it.batch(batch_size, drop_remainder=train)


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
