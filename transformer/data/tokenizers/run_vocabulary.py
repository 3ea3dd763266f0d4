"""A run's vocabulary: built from texts, saved into its workdir, loaded back and checked.

What every mode that reads a run's tokenizer goes through (training's resume and
init_from, inference/loaded.py, a prepared corpus's run): `save_tokenizer` copies the
vocabulary file into the workdir with its record (layout.TOKENIZER_RECORD: kind, size,
sha256), `load_workdir_tokenizer` rebuilds it from there and refuses one that is not the
run's own (against the record, the run's dataset.json and its config.json);
`build_vocabulary` trains a character or SentencePiece vocabulary (data.tokenizer), and
`cache_name` names it by everything that changes it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable

import ml_collections
from absl import logging

from transformer.config import denoisers
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.data import run_data
from transformer.data.tokenizers import hf_vocab
from transformer.data.tokenizers import sentinels
from transformer.data.tokenizers import vocabularies
from transformer.workdir import files
from transformer.workdir import layout

MIN_SPM_VOCAB = 300  # 256 byte-fallback pieces + specials + some real pieces.
VOCAB_MULTIPLE = 128  # model.vocab_size=0 rounds the tokenizer's size up to this.


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


def build_vocabulary(config: ml_collections.ConfigDict, texts: Iterable[str],
                     path: str) -> vocabularies.Tokenizer:
  """A character or SentencePiece vocabulary (data.tokenizer) made from `texts` into `path`."""
  data = config.data
  if data.tokenizer == "char":
    return vocabularies.build_char_vocabulary(texts, path)
  size = spm_vocab_size(config)
  if size < MIN_SPM_VOCAB:  # Checked here: models that never train one may be smaller.
    key = "data.spm_vocab_size" if data.spm_vocab_size else "model.vocab_size"
    raise ConfigError(f"config.{key}={size} is too small for SentencePiece: it needs >= "
                      f"{MIN_SPM_VOCAB} pieces (256 byte-fallback pieces and the special ids "
                      "come first); use a larger vocabulary, or data.tokenizer='char' or "
                      "'bytes'")
  lines = (line for text in texts for line in text.split("\n") if line.strip())
  return vocabularies.train_sentencepiece(lines, size, path,
                                        data.spm_train_sentences, data.spm_model_type)


def needed_vocab_size(config: ml_collections.ConfigDict,
                      tokenizer: vocabularies.Tokenizer) -> int:
  """The ids the model's embedding must hold: the tokenizer's, and a text-to-text
  objective's sentinels and paradigm tokens after them (sentinels.py)."""
  transform = objective_lib.resolve(config.model).transform
  if not transform:
    return tokenizer.vocab_size
  return sentinels.vocab_size_needed(tokenizer,
                                     *denoisers.extra_id_counts(transform, config.train))


def check_vocab_size(config: ml_collections.ConfigDict, tokenizer: vocabularies.Tokenizer) -> None:
  """model.vocab_size (when set) must hold every id of the tokenizer (and the objective's
  sentinels and paradigm tokens)."""
  needed = needed_vocab_size(config, tokenizer)
  size, kind = config.model.vocab_size, tokenizer_kind(tokenizer)
  if not size or needed <= size:
    return
  if needed == tokenizer.vocab_size:
    raise ConfigError(
        f"config.model.vocab_size={size} is smaller than the {kind} tokenizer's vocabulary "
        f"({tokenizer.vocab_size}); expected >= {tokenizer.vocab_size}, or 0 to take the "
        f"tokenizer's size rounded up to a multiple of {VOCAB_MULTIPLE}")
  objective = objective_lib.resolve(config.model)
  count, paradigms = denoisers.extra_id_counts(objective.transform, config.train)
  raise ConfigError(
      f"config.model.vocab_size={size} has no room for model.objective="
      f"{objective.name!r}'s {count} sentinels (train.num_sentinels)"
      f"{f' and {paradigms} paradigm tokens' if paradigms else ''} after the {kind} "
      f"tokenizer's {tokenizer.vocab_size} ids: it needs >= {needed}, or 0 to take that "
      f"size rounded up to a multiple of {VOCAB_MULTIPLE}")


def resolved_vocab_size(config: ml_collections.ConfigDict, tokenizer: vocabularies.Tokenizer) -> int:
  """model.vocab_size, or for 0 the ids needed (needed_vocab_size) rounded up to
  VOCAB_MULTIPLE."""
  if config.model.vocab_size:
    return config.model.vocab_size
  return -(-needed_vocab_size(config, tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def _vocabulary_file(tokenizer: vocabularies.Tokenizer) -> str | None:
  return getattr(tokenizer, "model_path", None) or getattr(tokenizer, "path", None)


def tokenizer_kind(tokenizer: vocabularies.Tokenizer) -> str:
  """The data.tokenizer name of a tokenizer object."""
  if isinstance(tokenizer, vocabularies.CharTokenizer):
    return "char"
  if isinstance(tokenizer, vocabularies.SentencePieceTokenizer):
    return "sentencepiece"
  if isinstance(tokenizer, hf_vocab.HFTokenizer):
    return "huggingface"  # Imported with a model (interop/hf/importer.py); never trained here.
  return "bytes"


def tokenizer_record(tokenizer: vocabularies.Tokenizer) -> dict[str, object]:
  """What identifies a tokenizer: its kind, size and the sha256 of its vocabulary file."""
  record: dict[str, object] = {"kind": tokenizer_kind(tokenizer),
                               "vocab_size": tokenizer.vocab_size}
  path = _vocabulary_file(tokenizer)
  if path:
    with open(path, "rb") as f:
      record["sha256"] = hashlib.sha256(f.read()).hexdigest()
    record["file"] = os.path.basename(path)
  return record


def tokenizer_identity(tokenizer: vocabularies.Tokenizer) -> dict[str, object]:
  """`tokenizer_record` without the file name: kind, size and content (dataset.json keeps
  it, so that a vocabulary pair copied over the run's own is told apart)."""
  return {k: v for k, v in tokenizer_record(tokenizer).items() if k != "file"}


def save_tokenizer(workdir: str, tokenizer: vocabularies.Tokenizer) -> None:
  """Copies the vocabulary into `workdir` with its record, so the run is self-contained."""
  record = tokenizer_record(tokenizer)
  path = _vocabulary_file(tokenizer)
  target = os.path.join(workdir, os.path.basename(path)) if path else ""
  if path and os.path.abspath(path) != os.path.abspath(target):  # A resume reads the copy.
    with open(path, "rb") as f:
      files.write_atomically(target, f.read())
  files.write_atomically(os.path.join(workdir, layout.TOKENIZER_RECORD), json.dumps(record, indent=2))


def run_workdir(init_from: str) -> str:
  """The workdir of `config.init_from` (a workdir, or one of its checkpoints/<step>)."""
  path = os.path.abspath(init_from)
  if os.path.basename(os.path.dirname(path)) == layout.CHECKPOINTS:
    return os.path.dirname(os.path.dirname(path))
  return path


def load_workdir_tokenizer(workdir: str) -> vocabularies.Tokenizer:
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
    tokenizer = vocabularies.ByteTokenizer()
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
    tokenizer = hf_vocab.from_kind(kind, path)
  else:
    raise ConfigError(f"{record_path}: tokenizer kind {kind!r} is unknown; valid: "
                      f"{hf_vocab.TOKENIZER_KINDS}")
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


def _sentencepiece_options(tokenizer: vocabularies.SentencePieceTokenizer) -> dict[str, object]:
  """The options a SentencePiece model was trained with, read from the model file itself."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tokenizer._sp.serialized_model_proto())  # pylint: disable=protected-access
  spec = proto.trainer_spec
  return {"data.spm_vocab_size": spec.vocab_size,
          "data.spm_model_type": sentencepiece_model_pb2.TrainerSpec.ModelType.Name(
              spec.model_type).lower(),
          "data.spm_train_sentences": spec.input_sentence_size}


def _check_against_config(workdir: str, kind: str, tokenizer: vocabularies.Tokenizer) -> None:
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
