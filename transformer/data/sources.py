"""A run's data sources: the prepared dataset, its tokenizer, and their checks against the config.

`load_sources` is the one entry point: it prepares the dataset (process 0 first),
checks that the features the objective reads exist (text, the two languages of a
translation, a label whose class count matches `model.num_classes`), and loads or
trains the tokenizer, cached beside the data under a name that holds everything
that changes it (split, features, algorithm, vocabulary size, options).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Iterable

import jax
import ml_collections
import tensorflow_datasets as tfds
from absl import logging

from transformer import distributed
from transformer.config.errors import ConfigError
from transformer.config import objective as objective_lib
from transformer.data import catalog
from transformer.data import hf_tokenizer
from transformer.data import packing
from transformer.data import run_data
from transformer.data import tokenizers
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import lock

MIN_SPM_VOCAB = 300  # 256 byte-fallback pieces + specials + some real pieces.
VOCAB_MULTIPLE = 128  # model.vocab_size=0 rounds the tokenizer's size up to this.


@dataclasses.dataclass
class DataSources:
  """The prepared dataset and tokenizer a run trains on."""

  builder: tfds.core.DatasetBuilder | None  # None for a prepared corpus.
  tokenizer: tokenizers.Tokenizer
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
    return {**data, run_data.TOKENIZER: tokenizer_identity(self.tokenizer)}


def is_translation(data: ml_collections.ConfigDict) -> bool:
  """Whether the run reads sentence pairs from two language features."""
  return bool(data.source_language or data.target_language)


def text_keys(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The features the objective reads text from: (source, target) or (text_key,)."""
  if is_translation(config.data):
    return (config.data.source_language, config.data.target_language)
  return (config.data.text_key,)


def _features_of(builder: tfds.core.DatasetBuilder) -> list[str]:
  return sorted(builder.info.features.keys())


def check_features(config: ml_collections.ConfigDict, builder: tfds.core.DatasetBuilder) -> None:
  """Checks that the dataset has what the objective reads; raises ConfigError naming it."""
  data, name = config.data, config.data.name
  features = builder.info.features
  objective = objective_lib.resolve(config.model)
  if is_translation(data):
    if not objective.translates:
      raise ConfigError(f"config.data.source_language={data.source_language!r} reads "
                        "translation pairs, which need model.arch='encoder_decoder' (objective "
                        f"seq2seq), not the {objective.name} objective of model.arch="
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


def cache_name(config: ml_collections.ConfigDict, keys: tuple[str, ...]) -> str:
  """The tokenizer file name: everything that changes the tokenizer is in it."""
  data = config.data
  keyname = "+".join(keys)
  if data.tokenizer == "char":
    return f"chars_{data.train_split}_{keyname}.json"
  options = f"{data.spm_model_type}|{data.spm_train_sentences}|v3"
  digest = hashlib.sha256(options.encode()).hexdigest()[:8]
  return (f"spm3_{data.spm_model_type}_{data.train_split}_{keyname}_"
          f"v{spm_vocab_size(config)}_{digest}.model")


def spm_vocab_size(config: ml_collections.ConfigDict) -> int:
  """SentencePiece pieces: data.spm_vocab_size, or model.vocab_size when that is 0."""
  return config.data.spm_vocab_size or config.model.vocab_size


def load_tokenizer(config: ml_collections.ConfigDict, builder: tfds.core.DatasetBuilder,
                   keys: tuple[str, ...]) -> tokenizers.Tokenizer:
  """The byte tokenizer, or a character / SentencePiece vocabulary cached beside the data.

  A missing vocabulary is made once from the train split's `keys` features (both
  languages of a translation: one shared vocabulary).
  """
  data = config.data
  if data.tokenizer == "bytes":
    return tokenizers.ByteTokenizer()
  path = os.path.join(str(builder.data_dir), cache_name(config, keys))
  if os.path.exists(path):
    logging.info("Tokenizer: %s", path)
    return _cached_tokenizer(data, path)
  # Commands started at once train it once, in turn; the others reuse the file.
  with lock.building(lock.lock_path_beside(path), f"the vocabulary {path}"):
    if os.path.exists(path):
      logging.info("Tokenizer: %s (trained meanwhile by another command)", path)
      return _cached_tokenizer(data, path)
    return _build_tokenizer(config, builder, keys, path)


def _cached_tokenizer(data: ml_collections.ConfigDict, path: str) -> tokenizers.Tokenizer:
  return (tokenizers.CharTokenizer(path) if data.tokenizer == "char"
          else tokenizers.SentencePieceTokenizer(path))


def _build_tokenizer(config: ml_collections.ConfigDict, builder: tfds.core.DatasetBuilder,
                     keys: tuple[str, ...], path: str) -> tokenizers.Tokenizer:
  """Makes the vocabulary file `path` from the train split (the caller holds its lock)."""
  source = catalog.data_source(builder, config.data.train_split)

  def texts():
    for i in range(len(source)):
      example = source[i]
      for key in keys:
        yield packing.text_of(example[key])

  return build_vocabulary(config, texts(), path)


def build_vocabulary(config: ml_collections.ConfigDict, texts: Iterable[str],
                     path: str) -> tokenizers.Tokenizer:
  """A character or SentencePiece vocabulary (data.tokenizer) made from `texts` into `path`."""
  data = config.data
  if data.tokenizer == "char":
    return tokenizers.build_char_vocabulary(texts, path)
  size = spm_vocab_size(config)
  if size < MIN_SPM_VOCAB:  # Checked here: models that never train one may be smaller.
    key = "data.spm_vocab_size" if data.spm_vocab_size else "model.vocab_size"
    raise ConfigError(f"config.{key}={size} is too small for SentencePiece: it needs >= "
                      f"{MIN_SPM_VOCAB} pieces (256 byte-fallback pieces and the special ids "
                      "come first); use a larger vocabulary, or data.tokenizer='char' or "
                      "'bytes'")
  lines = (line for text in texts for line in text.split("\n") if line.strip())
  return tokenizers.train_sentencepiece(lines, size, path,
                                        data.spm_train_sentences, data.spm_model_type)


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
    from transformer.data import corpus_run  # pylint: disable=g-import-not-at-top (cycle)
    from transformer.data import mixture  # pylint: disable=g-import-not-at-top (cycle)
    # data.mixture: several corpora, mixed by weight (data/mixture.py), one tokenizer.
    open_corpus = mixture.open_for_training if config.data.mixture else corpus_run.open_for_training
    corpus, tokenizer = open_corpus(config, tokenizer_workdir)
    check_vocab_size(config, tokenizer)
    return DataSources(builder=None, tokenizer=tokenizer, text_keys=(), corpus=corpus)
  if jax.process_index() != 0:
    distributed.barrier("data_prepared")  # Wait until process 0 has prepared.
  builder = catalog.load_builder(config.data)
  check_features(config, builder)
  keys = text_keys(config)
  if tokenizer_workdir and os.path.exists(os.path.join(tokenizer_workdir, layout.TOKENIZER_RECORD)):
    tokenizer = load_workdir_tokenizer(tokenizer_workdir)
    logging.info("Tokenizer: the vocabulary of %s (%s, %d ids)", tokenizer_workdir,
                 tokenizer_kind(tokenizer), tokenizer.vocab_size)
    if tokenizer_kind(tokenizer) != config.data.tokenizer:
      logging.warning("config.data.tokenizer=%r is not used: the run keeps the %s "
                      "vocabulary of %s", config.data.tokenizer, tokenizer_kind(tokenizer),
                      tokenizer_workdir)
  else:
    if tokenizer_workdir:
      logging.warning("%s has no %s (a run from before vocabularies were saved): using "
                      "data.tokenizer=%r, which must be the vocabulary that run had",
                      tokenizer_workdir, layout.TOKENIZER_RECORD, config.data.tokenizer)
    tokenizer = load_tokenizer(config, builder, keys)
  if jax.process_index() == 0:
    distributed.barrier("data_prepared")
  check_vocab_size(config, tokenizer)
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
  path = os.path.join(str(builder.data_dir), cache_name(config, text_keys(config)))
  if os.path.exists(path):
    return None
  size = "" if data.tokenizer == "char" else f" of {spm_vocab_size(config):,} pieces"
  return f"its {data.tokenizer} vocabulary{size} is not built yet ({path})"


def check_vocab_size(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer) -> None:
  """model.vocab_size (when set) must hold every id of the tokenizer."""
  if config.model.vocab_size and tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"config.model.vocab_size={config.model.vocab_size} is smaller than the "
        f"{tokenizer_kind(tokenizer)} tokenizer's vocabulary ({tokenizer.vocab_size}); "
        f"expected >= {tokenizer.vocab_size}, or 0 to take the tokenizer's size rounded up "
        f"to a multiple of {VOCAB_MULTIPLE}")


def resolved_vocab_size(config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer) -> int:
  """model.vocab_size, or for 0 the tokenizer's size rounded up to VOCAB_MULTIPLE."""
  if config.model.vocab_size:
    return config.model.vocab_size
  return -(-tokenizer.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def _vocabulary_file(tokenizer: tokenizers.Tokenizer) -> str | None:
  return getattr(tokenizer, "model_path", None) or getattr(tokenizer, "path", None)


def tokenizer_kind(tokenizer: tokenizers.Tokenizer) -> str:
  """The data.tokenizer name of a tokenizer object."""
  if isinstance(tokenizer, tokenizers.CharTokenizer):
    return "char"
  if isinstance(tokenizer, tokenizers.SentencePieceTokenizer):
    return "sentencepiece"
  if isinstance(tokenizer, hf_tokenizer.HFTokenizer):
    return "huggingface"  # Imported with a model (interop/hf/importer.py); never trained here.
  return "bytes"


def tokenizer_record(tokenizer: tokenizers.Tokenizer) -> dict[str, object]:
  """What identifies a tokenizer: its kind, size and the sha256 of its vocabulary file."""
  record: dict[str, object] = {"kind": tokenizer_kind(tokenizer),
                               "vocab_size": tokenizer.vocab_size}
  path = _vocabulary_file(tokenizer)
  if path:
    with open(path, "rb") as f:
      record["sha256"] = hashlib.sha256(f.read()).hexdigest()
    record["file"] = os.path.basename(path)
  return record


def tokenizer_identity(tokenizer: tokenizers.Tokenizer) -> dict[str, object]:
  """`tokenizer_record` without the file name: kind, size and content (dataset.json keeps
  it, so that a vocabulary pair copied over the run's own is told apart)."""
  return {k: v for k, v in tokenizer_record(tokenizer).items() if k != "file"}


def save_tokenizer(workdir: str, tokenizer: tokenizers.Tokenizer) -> None:
  """Copies the vocabulary into `workdir` with its record, so the run is self-contained."""
  record = tokenizer_record(tokenizer)
  path = _vocabulary_file(tokenizer)
  target = os.path.join(workdir, os.path.basename(path)) if path else ""
  if path and os.path.abspath(path) != os.path.abspath(target):  # A resume reads the copy.
    with open(path, "rb") as f:
      files.write_atomically(target, f.read())
  files.write_atomically(os.path.join(workdir, layout.TOKENIZER_RECORD), json.dumps(record, indent=2))


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


def run_workdir(init_from: str) -> str:
  """The workdir of `config.init_from` (a workdir, or one of its checkpoints/<step>)."""
  path = os.path.abspath(init_from)
  if os.path.basename(os.path.dirname(path)) == layout.CHECKPOINTS:
    return os.path.dirname(os.path.dirname(path))
  return path


def load_workdir_tokenizer(workdir: str) -> tokenizers.Tokenizer:
  """The tokenizer a run trained with, rebuilt from the files `save_tokenizer` left in it.

  Only the workdir is read (its layout.TOKENIZER_RECORD and the vocabulary file it names), so
  a run can be evaluated or used without its dataset or the data dir's cache.

  Args:
    workdir: a run's workdir.

  Returns:
    The byte, character or SentencePiece tokenizer of the run.

  Raises:
    ConfigError: the record or the vocabulary file is missing, unreadable, or does not
      match (kind, sha256, vocabulary size).
  """
  record_path = os.path.join(workdir, layout.TOKENIZER_RECORD)
  if not os.path.exists(record_path):
    raise ConfigError(f"{workdir} has no {layout.TOKENIZER_RECORD}, so its vocabulary is unknown; "
                      "expected a workdir written by a training run (train_and_evaluate "
                      "copies the vocabulary and this record into it)")
  with open(record_path, encoding="utf-8") as f:
    record = json.load(f)
  kind = record.get("kind")
  if kind == "bytes":
    tokenizer = tokenizers.ByteTokenizer()
  elif kind in ("char", "sentencepiece", "huggingface"):
    path = os.path.join(workdir, str(record.get("file", "")))
    if not record.get("file") or not os.path.isfile(path):
      raise ConfigError(f"{record_path} names the {kind} vocabulary {record.get('file')!r}, "
                        f"which is not in {workdir}; copy it back from the run's data dir")
    with open(path, "rb") as f:
      digest = hashlib.sha256(f.read()).hexdigest()
    if digest != record.get("sha256"):
      raise ConfigError(f"{path} is not the vocabulary the run trained with: its sha256 is "
                        f"{digest}, {record_path} says {record.get('sha256')}")
    tokenizer = hf_tokenizer.from_kind(kind, path)
  else:
    raise ConfigError(f"{record_path}: tokenizer kind {kind!r} is unknown; valid: "
                      f"{hf_tokenizer.TOKENIZER_KINDS}")
  if tokenizer.vocab_size != record.get("vocab_size"):
    raise ConfigError(f"{record_path} records vocab_size={record.get('vocab_size')} but its "
                      f"{kind} tokenizer has {tokenizer.vocab_size}")
  _check_against_run(workdir, record)
  _check_against_config(workdir, kind, tokenizer)
  return tokenizer


def _check_against_run(workdir: str, record: dict[str, object]) -> None:
  """Refuses a tokenizer.json (and its vocabulary file) that is not the one the run
  trained with, as its dataset.json recorded it when the run started.

  tokenizer.json and its file check each other only: a pair copied from another run
  of the same kind and a size that fits passes them, and _check_against_config. A run
  whose dataset.json predates the record (or a workdir --mode=import wrote, which has
  none) is said in one line and read as is; resuming it records its identity.
  """
  saved = run_data.read_record(workdir) or {}
  expected = saved.get(run_data.TOKENIZER)
  if not isinstance(expected, dict):
    logging.info("%s/%s records no tokenizer identity (written before it was kept, or "
                 "absent): %s is used unchecked; resuming the run records it", workdir,
                 layout.DATASET_RECORD, layout.TOKENIZER_RECORD)
    return
  if any(expected.get(key) != record.get(key) for key in ("kind", "vocab_size", "sha256")):
    shown = lambda r: (f"{r.get('kind')} vocabulary of {r.get('vocab_size')} ids"
                       + (f", sha256 {str(r['sha256'])[:16]}" if r.get("sha256") else ""))
    raise ConfigError(
        f"{workdir}/{layout.TOKENIZER_RECORD} names a {shown(record)} "
        f"({record.get('file') or 'no file'}), but the run trained with a {shown(expected)} "
        f"({workdir}/{layout.DATASET_RECORD}): the tokenizer files were replaced; restore "
        "the run's own tokenizer.json and vocabulary file, or use the run they come from")


def _sentencepiece_options(tokenizer: tokenizers.SentencePieceTokenizer) -> dict[str, object]:
  """The options a SentencePiece model was trained with, read from the model file itself."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tokenizer._sp.serialized_model_proto())  # pylint: disable=protected-access
  spec = proto.trainer_spec
  return {"data.spm_vocab_size": spec.vocab_size,
          "data.spm_model_type": sentencepiece_model_pb2.TrainerSpec.ModelType.Name(
              spec.model_type).lower(),
          "data.spm_train_sentences": spec.input_sentence_size}


def _check_against_config(workdir: str, kind: str, tokenizer: tokenizers.Tokenizer) -> None:
  """Refuses a vocabulary that is not the one the run's own config.json describes.

  tokenizer.json and the file it names agree by sha256, but both may have been copied
  from another run together: then the size, the kind or the options the vocabulary was
  built with (read from the SentencePiece model itself) differ from config.json's. A run
  that took its vocabulary from config.init_from, or imported it, is only checked for
  room in its embedding (model.vocab_size).
  """
  config_path = os.path.join(workdir, layout.CONFIG)
  try:
    with open(config_path, encoding="utf-8") as f:
      config = json.load(f)
    data, model = config["data"], config["model"]
  except (OSError, ValueError, KeyError, TypeError):
    return  # No config.json (yet): nothing to compare; modes that need it say so.
  record = f"{workdir}/{layout.TOKENIZER_RECORD}"
  fix = (f"restore this run's own {layout.TOKENIZER_RECORD} and vocabulary file (they were "
         "replaced together), or use the run they come from")
  size = model.get("vocab_size")
  if isinstance(size, int) and size and tokenizer.vocab_size > size:
    raise ConfigError(f"{record} names a {kind} vocabulary of {tokenizer.vocab_size} ids, but "
                      f"{config_path} has model.vocab_size={size}: it is not this run's "
                      f"vocabulary; {fix}")
  if config.get("init_from") or kind in ("bytes", "huggingface"):
    return  # Kept from the source run, or imported: not built from this config's options.
  if kind != data.get("tokenizer"):
    raise ConfigError(f"{record} names a {kind} vocabulary, but {config_path} has "
                      f"data.tokenizer={data.get('tokenizer')!r}; {fix}")
  if kind == "sentencepiece":
    expected = {"data.spm_vocab_size": data.get("spm_vocab_size") or size,
                "data.spm_model_type": data.get("spm_model_type"),
                "data.spm_train_sentences": data.get("spm_train_sentences")}
    built = _sentencepiece_options(tokenizer)
    differ = [f"{key}={built[key]!r} (config.json: {value!r})"
              for key, value in expected.items() if value is not None and built[key] != value]
    if differ:
      raise ConfigError(f"{record} names a SentencePiece model built with "
                        f"{', '.join(differ)}: it is not this run's vocabulary; {fix}")
