"""A run's data sources: the prepared dataset, its tokenizer, and their checks against the config.

`load_sources` is the one entry point: it prepares the dataset (process 0 first),
checks that the features the objective reads exist (text, the two languages of a
translation, a label whose class count matches `model.num_classes`), and loads or
trains the tokenizer, cached beside the data under a name that holds everything
that changes it (split, features, algorithm, vocabulary size, options).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import tensorflow_datasets as tfds
from absl import logging

from transformer import distributed
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.data import packing
from transformer.data import run_data
from transformer.data.corpus import for_config
from transformer.data.corpus import mixture
from transformer.data.datasets import catalog
from transformer.data.tokenizers import run_vocabulary
from transformer.data.tokenizers import vocabularies
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import lock


@dataclasses.dataclass
class DataSources:
  """The prepared dataset and tokenizer a run trains on."""

  builder: tfds.core.DatasetBuilder | None  # None for a prepared corpus.
  tokenizer: vocabularies.Tokenizer
  text_keys: tuple[str, ...]  # The features holding text (two for translation).
  corpus: Any = None  # data.name="corpus": its corpus.PreparedCorpus, or a
  # mixture.MixedCorpus with data.mixture (builder is None).

  @property
  def name(self) -> str:
    """The dataset's full name, for log lines."""
    return self.corpus.record()["name"] if self.corpus else self.builder.info.full_name

  def split(self, split: str) -> Any:
    """A random-access split: a corpus split of token ids, or a TFDS split of text."""
    return self.corpus.split(split) if self.corpus else catalog.data_source(self.builder, split)

  def record(self) -> dict[str, object]:
    """What identifies the data (dataset.json): `dataset_record`, or the corpus's, and
    the tokenizer's identity under "tokenizer" (what `load_workdir_tokenizer` checks)."""
    data = self.corpus.record() if self.corpus else dataset_record(self.builder)
    return {**data, run_data.TOKENIZER: run_vocabulary.tokenizer_identity(self.tokenizer)}


def is_translation(data: ml_collections.ConfigDict) -> bool:
  """Whether the run reads sentence pairs from two language features."""
  return bool(data.source_language or data.target_language)


def text_keys(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The features the objective reads text from: (source, target) or (text_key,)."""
  if is_translation(config.data):
    return (config.data.source_language, config.data.target_language)
  return (config.data.text_key,)


def label_names(source: Any, label_key: str) -> tuple[str, ...]:
  """The class names of a split's ClassLabel feature `label_key` (a labelled text read
  as text-to-text pairs: "text -> label name")."""
  features = source.features if hasattr(source, "features") else None
  label = features[label_key] if features is not None and label_key in features else None
  names = getattr(label, "names", None)
  if not names:
    raise ConfigError(f"config.data.label_key={label_key!r}: the split has no ClassLabel "
                      "feature of that name whose class names could be the targets of "
                      "text-to-text pairs")
  return tuple(names)


def _features_of(builder: tfds.core.DatasetBuilder) -> list[str]:
  return sorted(builder.info.features.keys())


def check_features(config: ml_collections.ConfigDict, builder: tfds.core.DatasetBuilder) -> None:
  """Checks that the dataset has what the objective reads; raises ConfigError naming it."""
  data, name = config.data, config.data.name
  features = builder.info.features
  objective = objective_lib.resolve(config.model)
  if is_translation(data):
    if not objective.reads_pairs:
      readers = [o.name for o in objective_lib.OBJECTIVES.values() if o.reads_pairs]
      raise ConfigError(f"config.data.source_language={data.source_language!r} reads "
                        f"translation pairs, which the objectives {readers} train on, not "
                        f"the {objective.name} objective of model.arch="
                        f"{config.model.arch!r}")
    for key in ("source_language", "target_language"):
      if data[key] not in features:
        raise ConfigError(f"config.data.{key}={data[key]!r} is not a feature of {name}; "
                          f"its features are {_features_of(builder)}")
  elif data.text_key not in features:
    raise ConfigError(f"config.data.text_key={data.text_key!r} is not a feature of {name}; "
                      f"valid: {_features_of(builder)}"
                      + ("; for translation set config.data.source_language and "
                         "config.data.target_language" if objective.translates else ""))
  if objective.classifies:
    if data.label_key not in features:
      raise ConfigError(f"config.data.label_key={data.label_key!r} is not a feature of "
                        f"{name}; valid: {_features_of(builder)}")
    label = features[data.label_key]
    num_classes = getattr(label, "num_classes", None)
    if num_classes is None:
      raise ConfigError(f"config.data.label_key={data.label_key!r}: feature {label!r} of "
                        f"{name} is not a tfds ClassLabel, so its classes are unknown")
    if num_classes != config.model.num_classes:
      raise ConfigError(f"config.model.num_classes={config.model.num_classes} does not match "
                        f"{name}, whose {data.label_key!r} has {num_classes} classes "
                        f"({getattr(label, 'names', None)}); set "
                        f"config.model.num_classes={num_classes}")


def load_tokenizer(config: ml_collections.ConfigDict, builder: tfds.core.DatasetBuilder,
                   keys: tuple[str, ...]) -> vocabularies.Tokenizer:
  """The byte tokenizer, or a character / SentencePiece vocabulary cached beside the data.

  A missing vocabulary is made once from the train split's `keys` features (both
  languages of a translation: one shared vocabulary).
  """
  data = config.data
  if data.tokenizer == "bytes":
    return vocabularies.ByteTokenizer()
  path = os.path.join(str(builder.data_dir), run_vocabulary.cache_name(config, keys))
  if os.path.exists(path):
    logging.info("Tokenizer: %s", path)
    return _cached_tokenizer(data, path)
  # Commands started at once train it once, in turn; the others reuse the file.
  with lock.building(lock.lock_path_beside(path), f"the vocabulary {path}"):
    if os.path.exists(path):
      logging.info("Tokenizer: %s (trained meanwhile by another command)", path)
      return _cached_tokenizer(data, path)
    return _build_tokenizer(config, builder, keys, path)


def _cached_tokenizer(data: ml_collections.ConfigDict, path: str) -> vocabularies.Tokenizer:
  return (vocabularies.CharTokenizer(path) if data.tokenizer == "char"
          else vocabularies.SentencePieceTokenizer(path))


def _build_tokenizer(config: ml_collections.ConfigDict, builder: tfds.core.DatasetBuilder,
                     keys: tuple[str, ...], path: str) -> vocabularies.Tokenizer:
  """Makes the vocabulary file `path` from the train split (the caller holds its lock)."""
  source = catalog.data_source(builder, config.data.train_split)

  def texts():
    for i in range(len(source)):
      example = source[i]
      for key in keys:
        yield packing.text_of(example[key])

  return run_vocabulary.build_vocabulary(config, texts(), path)


def load_sources(config: ml_collections.ConfigDict, tokenizer_workdir: str = "") -> DataSources:
  """Prepares the dataset and tokenizer and checks them against the config.

  With several processes, process 0 prepares first and the others wait, so a data
  dir shared between hosts is written once; hosts with local disks then prepare
  their own copy.

  Args:
    config: the experiment config.
    tokenizer_workdir: a run's workdir whose vocabulary to use instead of the one
      `data.tokenizer` names (fine-tuning keeps its pretraining run's vocabulary).
  """
  if config.data.name == "corpus":  # Token ids prepared by --mode=prepare: nothing to build.
    # data.mixture: several corpora, mixed by weight (data/corpus/mixture.py), one tokenizer.
    open_corpus = mixture.open_for_training if config.data.mixture else for_config.open_for_training
    corpus, tokenizer = open_corpus(config, tokenizer_workdir)
    run_vocabulary.check_vocab_size(config, tokenizer)
    return DataSources(builder=None, tokenizer=tokenizer, text_keys=(), corpus=corpus)
  if jax.process_index() != 0:
    distributed.barrier("data_prepared")  # Wait until process 0 has prepared.
  builder = catalog.load_builder(config.data)
  check_features(config, builder)
  keys = text_keys(config)
  if tokenizer_workdir and os.path.exists(os.path.join(tokenizer_workdir, layout.TOKENIZER_RECORD)):
    tokenizer = run_vocabulary.load_workdir_tokenizer(tokenizer_workdir)
    logging.info("Tokenizer: the vocabulary of %s (%s, %d ids)", tokenizer_workdir,
                 run_vocabulary.tokenizer_kind(tokenizer), tokenizer.vocab_size)
    if run_vocabulary.tokenizer_kind(tokenizer) != config.data.tokenizer:
      logging.warning("config.data.tokenizer=%r is not used: the run keeps the %s "
                      "vocabulary of %s", config.data.tokenizer, run_vocabulary.tokenizer_kind(tokenizer),
                      tokenizer_workdir)
  else:
    if tokenizer_workdir:
      logging.warning("%s has no %s (a run from before vocabularies were saved): using "
                      "data.tokenizer=%r, which must be the vocabulary that run had",
                      tokenizer_workdir, layout.TOKENIZER_RECORD, config.data.tokenizer)
    tokenizer = load_tokenizer(config, builder, keys)
  if jax.process_index() == 0:
    distributed.barrier("data_prepared")
  run_vocabulary.check_vocab_size(config, tokenizer)
  return DataSources(builder=builder, tokenizer=tokenizer, text_keys=keys)


def unbuilt(config: ml_collections.ConfigDict, tokenizer_workdir: str = "") -> str | None:
  """What `load_sources(config, tokenizer_workdir)` would build before reading (a dataset
  not prepared, a vocabulary not trained), in a few words; None when all is there.

  Builds, downloads and trains nothing: for a command that only measures (--mode=compile
  timing the input pipeline), which must never build what the run has not built. A
  prepared corpus is never built by loading (not prepared: a ConfigError there).
  """
  data = config.data
  if data.name == "corpus":
    return None
  builder = catalog.find_builder(data)
  if not builder.is_prepared():
    if not (data.download or builder.name in catalog.OFFLINE_DATASETS
            or data.name in catalog.LOCAL_BUILDERS):
      return None  # Loading builds nothing: it says how to prepare it (ConfigError).
    return f"the dataset {data.name!r} is not prepared yet (in {builder.data_dir_root})"
  if tokenizer_workdir and os.path.exists(os.path.join(tokenizer_workdir,
                                                       layout.TOKENIZER_RECORD)):
    return None  # The run's vocabulary is that workdir's.
  if data.tokenizer == "bytes":
    return None
  path = os.path.join(str(builder.data_dir), run_vocabulary.cache_name(config, text_keys(config)))
  if os.path.exists(path):
    return None
  size = "" if data.tokenizer == "char" else f" of {run_vocabulary.spm_vocab_size(config):,} pieces"
  return f"its {data.tokenizer} vocabulary{size} is not built yet ({path})"


def dataset_record(builder: tfds.core.DatasetBuilder) -> dict[str, object]:
  """What identifies a run's data: the builder's full name and, for local files, each file.

  The full name of a `local_*` builder holds a hash of its files' content, so an edited
  file gives another name; the files' paths and sha256 say which one changed.
  """
  record: dict[str, object] = {"name": builder.info.full_name}
  metadata = builder.info.metadata or {}
  if metadata.get("files"):
    record["files"] = {f["path"]: f["sha256"] for f in metadata["files"]}
  # Absolute: where a relative data.path pointed (run_data). From the builder config,
  # not the metadata, which keeps the path of whichever identical copy built it first.
  source_path = getattr(builder.builder_config, "source_path", None)
  if source_path:
    record["source_path"] = source_path
  return record


def save_dataset_record(workdir: str, record: dict[str, object]) -> None:
  """Writes `dataset_record`'s result into the workdir (layout.DATASET_RECORD)."""
  files.write_atomically(os.path.join(workdir, layout.DATASET_RECORD),
                         json.dumps(record, indent=2, sort_keys=True))


def dataset_change(workdir: str, record: dict[str, object]) -> str | None:
  """How `record` differs from the dataset the run in `workdir` trained on, or None.

  By content (data/run_data.py): a byte-identical copy elsewhere is the same data.
  None also when the workdir has no record (a run from before it was kept).
  """
  return run_data.change(workdir, record)


