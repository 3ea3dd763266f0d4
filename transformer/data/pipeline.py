"""From the config to a run's input pipeline: one grain dataset per objective and split.

The data package's map is its __init__.py; this module is the last step: each
objective's rows (lm.py, seq2seq.py, classification.py) from a run's sources.
"""

from __future__ import annotations

from typing import Any, Callable

import grain
import ml_collections

from transformer.config import objective as objective_lib
from transformer.config import denoisers
from transformer.data import classification
from transformer.data import denoise
from transformer.data import lm
from transformer.data import seq2seq
from transformer.data import sources as sources_lib
from transformer.data.tokenizers import vocabularies


def _lm(config, source, tokenizer, split, common):
  data = config.data
  return lm.make_lm_dataset(source, tokenizer, text_key=data.text_key, seq_len=data.seq_len,
                            shuffle_rows=data.shuffle_rows, windows=data.lm_windows,
                            prepared=data.name == "corpus", **common)


def _mlm(config, source, tokenizer, split, common):
  data = config.data
  return lm.make_mlm_dataset(source, tokenizer, text_key=data.text_key, seq_len=data.seq_len,
                             mask_rate=data.mask_rate, shuffle_rows=data.shuffle_rows,
                             prepared=data.name == "corpus", **common)


def _seq2seq(config, source, tokenizer, split, common):
  data = config.data
  if sources_lib.is_translation(data):
    inputs_fn = seq2seq.translation_pairs(data.source_language, data.target_language)
  else:
    inputs_fn = seq2seq.continuation_pairs(data.text_key, data.continuation_chars,
                                           data.continuation_chars)
  return seq2seq.make_seq2seq_dataset(
      source, tokenizer, inputs_fn=inputs_fn, source_len=data.seq_len,
      target_len=data.seq_len, packing_mode=data.packing, overlong=data.overlong, **common)


def _classification(config, source, tokenizer, split, common):
  data = config.data
  return classification.make_classification_dataset(
      source, tokenizer, text_key=data.text_key, label_key=data.label_key,
      num_classes=config.model.num_classes, seq_len=data.seq_len, overlong=data.overlong,
      split=split, **common)


def _text_to_text(config, source, tokenizer, split, common):
  data, model = config.data, config.model
  objective = objective_lib.resolve(model)
  inputs_fn = None
  if sources_lib.is_translation(data):  # prefix_lm on pairs (sources.check_features).
    inputs_fn = seq2seq.translation_pairs(data.source_language, data.target_language)
  elif data.label_key:  # A labelled text as "text -> label name".
    inputs_fn = denoise.label_pairs(data.text_key, data.label_key,
                                    sources_lib.label_names(source, data.label_key))
  return denoise.make_text_to_text_dataset(
      source, tokenizer, denoisers=denoisers.denoisers(objective.transform, config.train),
      arch=model.arch, num_sentinels=config.train.num_sentinels, text_key=data.text_key,
      seq_len=data.seq_len, shuffle_rows=data.shuffle_rows, prepared=data.name == "corpus",
      inputs_fn=inputs_fn, overlong=data.overlong,
      prefix="prefix" in objective.model_inputs, **common)


# Objective.pipeline -> (config, source, tokenizer, split, common kwargs) -> batches.
PIPELINES: dict[str, Callable[..., grain.IterDataset]] = {
    "lm": _lm, "mlm": _mlm, "seq2seq": _seq2seq, "classification": _classification,
    "text_to_text": _text_to_text}


def make_dataset(config: ml_collections.ConfigDict, objective: objective_lib.Objective | str,
                 source: Any, tokenizer: vocabularies.Tokenizer, *, train: bool,
                 batch_size: int, split: str = "", process_index: int = 0,
                 process_count: int = 1) -> grain.IterDataset:
  """The input pipeline of `objective` (its entry's `pipeline`) for one split.

  Args:
    config: the experiment config; `config.model.vocab_size` must be resolved (> 0).
    objective: `objective.resolve(config.model)`, or its name.
    source: a random-access split, e.g. `builder.as_data_source(split)`, or a prepared
      corpus split (data.name="corpus": token ids, data/corpus/store.py).
    tokenizer: from `sources.load_sources`.
    train: training (repeat, shuffle rows, drop the last partial batch) or evaluation.
    batch_size: rows per batch on this process.
    split: the split's name, for messages.
    process_index, process_count: which of `process_count` disjoint shares of the rows
      this process reads (sharding.input_shard: one share per distinct set of data
      shards, so processes across a tensor or context axis read the same share).

  Returns:
    A grain IterDataset of batches (dicts of numpy arrays).
  """
  common = dict(vocab_size=config.model.vocab_size, batch_size=batch_size, seed=config.seed,
                train=train, process_index=process_index, process_count=process_count,
                num_threads=config.data.num_threads)
  make = PIPELINES[objective_lib.get(objective).pipeline]
  return make(config, source, tokenizer, split, common)
