"""From the config to a run's input pipeline: one grain dataset per objective and split.

The data package, by file:
  catalog.py         data.name -> a prepared TFDS builder (catalog, offline or local files)
  python_stdlib.py   the offline corpus builder
  local_text.py, local_parallel.py, local_tsv.py   builders over files at data.path
  tokenizers.py      byte, character and SentencePiece tokenizers
  sources.py         the dataset + tokenizer of a run, checked against the config
  packing.py         reading, shuffling, length limits, padding and eval batching
  lm.py, seq2seq.py, classification.py             the per-objective transforms
  pipeline.py        this file: objective -> pipeline
"""

from __future__ import annotations

from typing import Any

import grain
import ml_collections

from transformer.data import classification
from transformer.data import lm
from transformer.data import seq2seq
from transformer.data import sources as sources_lib
from transformer.data import tokenizers


def make_dataset(config: ml_collections.ConfigDict, objective: str, source: Any,
                 tokenizer: tokenizers.Tokenizer, *, train: bool, batch_size: int,
                 split: str = "", process_index: int = 0,
                 process_count: int = 1) -> grain.IterDataset:
  """The pipeline of `objective` ("causal_lm", "masked_lm", "seq2seq", "classification").

  Args:
    config: the experiment config; `config.model.vocab_size` must be resolved (> 0).
    objective: from `config.model.objective_of`.
    source: a random-access split, e.g. `builder.as_data_source(split)`.
    tokenizer: from `sources.load_sources`.
    train: training (repeat, shuffle rows, drop the last partial batch) or evaluation.
    batch_size: rows per batch on this process.
    split: the split's name, for messages.
    process_index, process_count: this process's share of the data.

  Returns:
    A grain IterDataset of batches (dicts of numpy arrays).
  """
  data = config.data
  common = dict(vocab_size=config.model.vocab_size, batch_size=batch_size, seed=config.seed,
                train=train, process_index=process_index, process_count=process_count,
                num_threads=data.num_threads)
  if objective == "causal_lm":
    return lm.make_lm_dataset(source, tokenizer, text_key=data.text_key, seq_len=data.seq_len,
                              shuffle_rows=data.shuffle_rows, windows=data.lm_windows,
                              **common)
  if objective == "masked_lm":
    return lm.make_mlm_dataset(source, tokenizer, text_key=data.text_key,
                               seq_len=data.seq_len, mask_rate=data.mask_rate,
                               shuffle_rows=data.shuffle_rows, **common)
  if objective == "seq2seq":
    if sources_lib.is_translation(data):
      inputs_fn = seq2seq.translation_pairs(data.source_language, data.target_language)
    else:
      inputs_fn = seq2seq.continuation_pairs(data.text_key, data.continuation_chars,
                                             data.continuation_chars)
    return seq2seq.make_seq2seq_dataset(
        source, tokenizer, inputs_fn=inputs_fn, source_len=data.seq_len,
        target_len=data.seq_len, packing_mode=data.packing, overlong=data.overlong, **common)
  if objective == "classification":
    return classification.make_classification_dataset(
        source, tokenizer, text_key=data.text_key, label_key=data.label_key,
        num_classes=config.model.num_classes, seq_len=data.seq_len, overlong=data.overlong,
        split=split, **common)
  raise ValueError(f"unknown objective {objective!r}")
