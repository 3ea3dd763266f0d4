"""From a TFDS dataset name to packed, batched, per-process rows, with grain.

Three objectives share one front end (`_documents`):

  TFDS array_record source -> [this process's slice] -> seeded shuffle -> repeat
  -> tokenize (id-range check) -> ...

  causal LM (`make_lm_dataset`): +bos/eos, concat-then-split into rows of
    seq_len + 1 -> (inputs, targets, segment_ids, positions, weights) -> batch.
  masked LM (`make_mlm_dataset`): +bos/eos, concat-then-split into rows of seq_len
    -> seeded BERT masking per row -> batch.
  seq2seq (`make_seq2seq_dataset`): `inputs_fn` turns an example into (source,
    target) text pairs -> each +eos -> first-fit packing of whole pairs -> decoder
    inputs shifted right within each pair -> batch.

Packing writes integer segment ids (0 = padding, 1, 2, ... = documents or pairs in
the row) and per-segment positions, so attention never crosses documents. Every
iterator is a grain `DatasetIterator`, whose state is saved in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterator

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
  # (python_stdlib needs no version check here: its config is named after the
  # interpreter, so another Python reads and writes another directory.)
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
  if data.label_key and data.label_key not in builder.info.features:
    raise ConfigError(f"config.data.label_key={data.label_key!r} is not a feature of "
                      f"{data.name}; valid: {sorted(builder.info.features)}")
  if data.text_key not in builder.info.features:
    raise ConfigError(f"config.data.text_key={data.text_key!r} is not a feature of "
                      f"{data.name}; valid: {sorted(builder.info.features)}")
  return builder


def load_tokenizer(data: ml_collections.ConfigDict, builder: tfds.core.DatasetBuilder,
                   vocab_size: int) -> tokenizers.Tokenizer:
  """The byte tokenizer, or the SentencePiece model cached beside the data (trained once)."""
  if data.tokenizer == "bytes":
    return tokenizers.ByteTokenizer()
  # "spm2": models with the <mask> symbol. Older "spm_" files lack it; never reuse them.
  path = os.path.join(str(builder.data_dir),
                      f"spm2_{data.train_split}_{data.text_key}_v{vocab_size}.model")
  if os.path.exists(path):
    return tokenizers.SentencePieceTokenizer(path)
  source = builder.as_data_source(split=data.train_split)

  def lines():
    for i in range(len(source)):
      text = _text(source[i][data.text_key])
      yield from (line for line in text.split("\n") if line.strip())

  return tokenizers.train_sentencepiece(lines(), vocab_size, path, data.spm_train_sentences)


def load_sources(config: ml_collections.ConfigDict) -> DataSources:
  """Prepares the dataset and tokenizer and checks the tokenizer fits the model.

  With several processes, process 0 prepares first and the others wait, so a data
  dir shared between hosts is written once; hosts with local disks then prepare
  their own copy.
  """
  if jax.process_index() != 0:
    distributed.barrier("data_prepared")  # Wait until process 0 has prepared.
  builder = load_builder(config.data)
  tokenizer = load_tokenizer(config.data, builder, config.model.vocab_size)
  if jax.process_index() == 0:
    distributed.barrier("data_prepared")
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"config.model.vocab_size={config.model.vocab_size} is smaller than the "
        f"{config.data.tokenizer} tokenizer's vocabulary ({tokenizer.vocab_size}); "
        f"expected >= {tokenizer.vocab_size}")
  return DataSources(builder=builder, tokenizer=tokenizer)


def _text(value: str | bytes) -> str:
  """A text feature as str (TFDS sources hold UTF-8 bytes)."""
  return value.decode("utf-8") if isinstance(value, bytes) else value


def _checked(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
  """Returns int32 `tokens`, raising if an id is outside the model's [0, vocab_size)."""
  tokens = np.asarray(tokens, dtype=np.int32)
  # JAX's embedding lookup clamps out-of-range ids silently; stop them here instead.
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    raise ValueError(f"token id {int(tokens.max())} (or {int(tokens.min())}) is outside "
                     f"the model vocabulary [0, {vocab_size})")
  return tokens


def _documents(source: Any, transform: grain.transforms.Map, *, seed: int, train: bool,
               process_index: int, process_count: int, num_threads: int) -> grain.IterDataset:
  """This process's share of `source`, shuffled (repeated when training), mapped by `transform`."""
  # Shuffled in eval too, with the fixed seed: a partial evaluation then sees the
  # same representative sample of documents every time, not the first few files.
  ds = grain.MapDataset.source(source)[process_index::process_count].shuffle(seed=seed)
  if train:
    ds = ds.repeat(None)  # A new permutation every epoch.
  ds = ds.map(transform)
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=64))


class _Tokenize(grain.transforms.Map):
  """text -> [bos] + ids + [eos], with every id checked against the model's vocabulary."""

  def __init__(self, tokenizer: tokenizers.Tokenizer, text_key: str, vocab_size: int):
    self._tokenizer = tokenizer
    self._text_key = text_key
    self._vocab_size = vocab_size

  def map(self, example: dict[str, Any]) -> dict[str, np.ndarray]:
    ids = self._tokenizer.encode(_text(example[self._text_key]))
    tokens = np.concatenate([[tokenizers.BOS_ID], ids, [tokenizers.EOS_ID]])
    return {"tokens": _checked(tokens, self._vocab_size)}


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
  it = _documents(source, _Tokenize(tokenizer, text_key, vocab_size), seed=seed, train=train,
                  process_index=process_index, process_count=process_count,
                  num_threads=num_threads)
  it = grain.experimental.ConcatThenSplitIterDataset(it, length_struct={"tokens": seq_len + 1})
  it = it.map(_split_inputs_targets)
  return it.batch(batch_size, drop_remainder=train)


# ---------------------------------------------------------------- masked LM


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

  def random_map(self, row: dict[str, np.ndarray], rng: np.random.Generator) -> Batch:
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
                     train: bool, mask_rate: float = 0.15, process_index: int = 0,
                     process_count: int = 1, num_threads: int = 2) -> grain.IterDataset:
  """The BERT-style masked-LM pipeline: packed [bos] text [eos] rows, seeded masking.

  The masks come from grain's `random_map`, seeded by (`seed`, `process_index`) and
  the row's index in the stream: the same rows get the same masks in every
  evaluation and after a restore from a saved iterator state.

  Args:
    source, tokenizer, text_key, vocab_size, seq_len, batch_size, seed, train,
      process_index, process_count, num_threads: as for `make_lm_dataset`.
    mask_rate: the fraction of real tokens to corrupt and predict.

  Returns:
    A grain IterDataset of dicts with [batch_size, seq_len] `inputs` (corrupted),
    `targets` (original ids), `segment_ids`, `positions` (int32) and `weights`
    (float32, 1 exactly at the chosen positions).
  """
  if not tokenizers.NUM_SPECIAL <= tokenizer.mask_id < min(tokenizer.vocab_size, vocab_size):
    raise ValueError(f"mask id {tokenizer.mask_id} is outside [{tokenizers.NUM_SPECIAL}, "
                     f"{min(tokenizer.vocab_size, vocab_size)})")
  it = _documents(source, _Tokenize(tokenizer, text_key, vocab_size), seed=seed, train=train,
                  process_index=process_index, process_count=process_count,
                  num_threads=num_threads)
  it = grain.experimental.ConcatThenSplitIterDataset(it, length_struct={"tokens": seq_len})
  # Fold in the process: otherwise every host would draw the same mask pattern per row.
  mask_seed = int(np.random.SeedSequence((seed, process_index)).generate_state(1)[0])
  it = it.random_map(_MaskTokens(tokenizer.mask_id, tokenizer.vocab_size, mask_rate),
                     seed=mask_seed)
  return it.batch(batch_size, drop_remainder=train)


# ---------------------------------------------------------------- sequence to sequence


class _TokenizePairs(grain.transforms.Map):
  """example -> `inputs_fn` text pairs -> [{inputs: ids + [eos], targets: ids + [eos]}]."""

  def __init__(self, tokenizer: tokenizers.Tokenizer,
               inputs_fn: Callable[[dict[str, Any]], list[tuple[str, str]]],
               vocab_size: int, source_len: int, target_len: int):
    self._tokenizer = tokenizer
    self._inputs_fn = inputs_fn
    self._vocab_size = vocab_size
    self._source_len = source_len
    self._target_len = target_len

  def _encode(self, text: str, max_len: int) -> np.ndarray:
    ids = np.append(self._tokenizer.encode(text), tokenizers.EOS_ID)[:max_len]
    return _checked(ids, self._vocab_size)

  def map(self, example: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    return [{"inputs": self._encode(source, self._source_len),
             "targets": self._encode(target, self._target_len)}
            for source, target in self._inputs_fn(example)]


class _Unlist(grain.experimental.FlatMapTransform):
  """A list of pairs -> the pairs, one element each."""

  max_fan_out = 1 << 20  # Only MapDataset.flat_map reads it; the IterDataset one has no limit.

  def flat_map(self, pairs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    return pairs


def _add_decoder_inputs(row: dict[str, np.ndarray]) -> Batch:
  """Packed pairs -> the model's keys, with targets shifted right within each pair."""
  targets, segments = row["targets"], row["targets_segment_ids"]
  positions = row["targets_positions"]
  shifted = np.concatenate([[tokenizers.BOS_ID], targets[:-1]]).astype(np.int32)
  decoder_inputs = np.where(positions == 0, tokenizers.BOS_ID, shifted)
  return {
      "inputs": row["inputs"],
      "inputs_segment_ids": row["inputs_segment_ids"],
      "inputs_positions": row["inputs_positions"],
      "targets": targets,
      "decoder_inputs": np.where(segments > 0, decoder_inputs, tokenizers.PAD_ID).astype(np.int32),
      "targets_segment_ids": segments,
      "targets_positions": positions,
      "weights": (segments > 0).astype(np.float32),
  }


def make_seq2seq_dataset(source: Any, tokenizer: tokenizers.Tokenizer, *,
                         inputs_fn: Callable[[dict[str, Any]], list[tuple[str, str]]],
                         vocab_size: int, source_len: int, target_len: int,
                         batch_size: int, seed: int, train: bool, process_index: int = 0,
                         process_count: int = 1, num_threads: int = 2) -> grain.IterDataset:
  """The encoder-decoder pipeline over (source text, target text) pairs.

  Each side is tokenized as ids + [eos] and truncated to its length. Whole pairs
  are packed first-fit, several to a row; pair k of a row has segment id k + 1 on
  both the source and the target side, which is what lets cross-attention be
  masked per pair.

  Args:
    source: random-access examples (e.g. `tfds.data_source`).
    tokenizer: maps text to ids.
    inputs_fn: one example -> zero or more (source text, target text) pairs.
    vocab_size: the model's vocabulary size (ids must be below it).
    source_len: encoder tokens per row.
    target_len: decoder tokens per row.
    batch_size, seed, train, process_index, process_count, num_threads: as for
      `make_lm_dataset`.

  Returns:
    A grain IterDataset of dicts with [batch_size, source_len] `inputs`,
    `inputs_segment_ids`, `inputs_positions` and [batch_size, target_len]
    `targets`, `decoder_inputs` (bos, then the targets shifted right, within each
    pair; 0 on padding), `targets_segment_ids`, `targets_positions` (int32) and
    `weights` (float32, 1 on every real target token).
  """
  tokenize = _TokenizePairs(tokenizer, inputs_fn, vocab_size, source_len, target_len)
  it = _documents(source, tokenize, seed=seed, train=train, process_index=process_index,
                  process_count=process_count, num_threads=num_threads)
  it = grain.experimental.FlatMapIterDataset(it, _Unlist())
  # Documents are already shuffled; unshuffled bins keep the packing deterministic.
  it = grain.experimental.FirstFitPackIterDataset(
      it, length_struct={"inputs": source_len, "targets": target_len},
      num_packing_bins=batch_size, shuffle_bins=False)
  it = it.map(_add_decoder_inputs)
  return it.batch(batch_size, drop_remainder=train)


@dataclasses.dataclass(frozen=True)
class _ContinuationPairs:
  """The `inputs_fn` made by `continuation_pairs` (a class, so it pickles)."""

  text_key: str
  source_chars: int
  target_chars: int

  def __call__(self, example: dict[str, Any]) -> list[tuple[str, str]]:
    lines = _text(example[self.text_key]).splitlines(keepends=True)
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


def continuation_pairs(text_key: str, source_chars: int,
                       target_chars: int) -> Callable[[dict[str, Any]], list[tuple[str, str]]]:
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


# ---------------------------------------------------------------- classification


class _TokenizeLabeled(grain.transforms.Map):
  """(text, label) -> one padded row: [bos] ids [eos] truncated to seq_len, and the label."""

  def __init__(self, tokenizer: tokenizers.Tokenizer, text_key: str, label_key: str,
               vocab_size: int, seq_len: int, num_classes: int):
    self._tokenize = _Tokenize(tokenizer, text_key, vocab_size)
    self._label_key = label_key
    self._seq_len = seq_len
    self._num_classes = num_classes

  def map(self, example: dict[str, Any]) -> Batch:
    tokens = self._tokenize.map(example)["tokens"][: self._seq_len]
    label = int(example[self._label_key])
    if not 0 <= label < self._num_classes:
      raise ValueError(f"label {label} is outside [0, model.num_classes={self._num_classes})")
    length = len(tokens)
    pad = self._seq_len - length
    return {
        "inputs": np.pad(tokens, (0, pad)).astype(np.int32),
        "segment_ids": np.pad(np.ones(length, np.int32), (0, pad)),
        "positions": np.pad(np.arange(length, dtype=np.int32), (0, pad)),
        "label": np.int32(label),
        "weights": np.float32(1.0),
    }


def make_classification_dataset(source: Any, tokenizer: tokenizers.Tokenizer, *,
                                text_key: str, label_key: str, num_classes: int,
                                vocab_size: int, seq_len: int, batch_size: int, seed: int,
                                train: bool, process_index: int = 0, process_count: int = 1,
                                num_threads: int = 2) -> grain.IterDataset:
  """One example per row (no packing: a row has one label), padded to seq_len.

  Returns:
    A grain IterDataset of dicts with [batch_size, seq_len] `inputs`, `segment_ids`,
    `positions` and [batch_size] `label` (int32) and `weights` (float32).
  """
  transform = _TokenizeLabeled(tokenizer, text_key, label_key, vocab_size, seq_len,
                               num_classes)
  it = _documents(source, transform, seed=seed, train=train, process_index=process_index,
                  process_count=process_count, num_threads=num_threads)
  return it.batch(batch_size, drop_remainder=train)


def make_dataset(config: ml_collections.ConfigDict, objective: str, source: Any,
                 tokenizer: tokenizers.Tokenizer, *, train: bool, batch_size: int,
                 process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """The pipeline of `objective` ("causal_lm", "masked_lm", "seq2seq", "classification")."""
  data = config.data
  common = dict(vocab_size=config.model.vocab_size, batch_size=batch_size, seed=config.seed,
                train=train, process_index=process_index, process_count=process_count,
                num_threads=data.num_threads)
  if objective == "causal_lm":
    return make_lm_dataset(source, tokenizer, text_key=data.text_key, seq_len=data.seq_len,
                           **common)
  if objective == "masked_lm":
    return make_mlm_dataset(source, tokenizer, text_key=data.text_key, seq_len=data.seq_len,
                            mask_rate=data.mask_rate, **common)
  if objective == "seq2seq":
    inputs_fn = continuation_pairs(data.text_key, data.continuation_chars,
                                   data.continuation_chars)
    return make_seq2seq_dataset(source, tokenizer, inputs_fn=inputs_fn,
                                source_len=data.seq_len, target_len=data.seq_len, **common)
  if objective == "classification":
    return make_classification_dataset(
        source, tokenizer, text_key=data.text_key, label_key=data.label_key,
        num_classes=config.model.num_classes, seq_len=data.seq_len, **common)
  raise ValueError(f"unknown objective {objective!r}")


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
