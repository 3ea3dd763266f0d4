"""Validation of the data.* fields: tokenizer, packing, local files, translation pairs.

A step of `validation.validate`, after the model (some checks read model.arch,
model.head and model.max_len). The data/ package implements what it allows.
"""

from __future__ import annotations

import ml_collections

from transformer.config import denoisers
from transformer.config import objective as objective_lib
from transformer.config.checks import check_choice, check_int, check_rate, is_number
from transformer.config.errors import fail
from transformer.config.model import TABLE_POSITIONS

TOKENIZERS = ("sentencepiece", "bytes", "char")
SPM_MODEL_TYPES = ("unigram", "bpe")
PACKINGS = ("pack", "pad")
LM_WINDOWS = ("packed", "random")
OVERLONG_POLICIES = ("truncate", "drop")
DECODE_ERRORS = ("strict", "replace")
# The datasets built from data.path: data/datasets/catalog.py's LOCAL_BUILDERS (held equal by a test).
LOCAL_DATASETS = ("local_text", "local_parallel", "local_tsv")
CORPUS = "corpus"  # Token ids prepared by --mode=prepare from the files at data.path.
CORPUS_SPLITS = ("train", "validation")  # The splits --mode=prepare writes (data/corpus/store.py).
BAD_RECORDS = ("stop", "skip")  # What data/corpus/readers.py does with a malformed record.


def validate_data(config: ml_collections.ConfigDict) -> None:
  """The data.* fields, and how they fit the model (its objective, positions, vocabulary)."""
  d, data, model = "data.", config.data, config.model
  check_choice(config, d + "tokenizer", TOKENIZERS)
  check_choice(config, d + "spm_model_type", SPM_MODEL_TYPES)
  check_choice(config, d + "packing", PACKINGS)
  check_choice(config, d + "lm_windows", LM_WINDOWS)
  check_choice(config, d + "overlong", OVERLONG_POLICIES)
  check_choice(config, d + "decode_errors", DECODE_ERRORS)
  check_choice(config, d + "bad_records", BAD_RECORDS)
  check_int(config, d + "prepare_workers", 0)
  for key in ("seq_len", "batch_size", "spm_train_sentences", "continuation_chars"):
    check_int(config, d + key, 1)
  # num_threads 0: grain reads in the thread that asks (the prefetch thread in training).
  for key in ("spm_vocab_size", "shuffle_rows", "prefetch", "num_threads"):
    check_int(config, d + key, 0)
  check_rate(config, d + "mask_rate")
  if not is_number(data.val_fraction) or not 0.0 < data.val_fraction < 1.0:
    fail(d + "val_fraction", data.val_fraction, "expected a fraction in (0, 1)")
  if data.lm_windows == "random" and data.shuffle_rows:
    fail(d + "shuffle_rows", data.shuffle_rows, "random LM windows (data.lm_windows="
          "'random') are already drawn independently: set data.shuffle_rows=0, or "
          "data.lm_windows='packed'")
  objective = objective_lib.resolve(model)
  if data.lm_windows == "random" and (not objective.generates or objective.transform):
    fail(d + "lm_windows", "random", "random windows are a causal-LM sampling (model.arch="
          f"'decoder', model.head='lm'), not for the {objective.name} objective of "
          f"model.arch={model.arch!r}, model.head={model.head!r}; use 'packed'")
  if objective.transform:
    denoisers.validate_denoising(config, objective.transform, model.arch)
  if objective.classifies and not data.label_key:
    fail(d + "label_key", "", "a classification head needs the dataset's label feature "
          "(e.g. 'label' for glue/sst2 and imdb_reviews)")
  if not data.name:
    fail(d + "name", data.name, "expected a TFDS dataset name such as 'python_stdlib', or "
          f"one of {LOCAL_DATASETS} with data.path")
  if data.mixture:
    parse_mixture(data.mixture)  # One line naming the component that is wrong.
    if data.name != CORPUS:
      fail(d + "mixture", data.mixture, f"a mixture is of prepared corpora: set data.name="
           f"{CORPUS!r} (data.name={data.name!r})")
    if data.path:
      fail(d + "path", data.path, "data.mixture gives each corpus its path; clear data.path")
  elif data.name in LOCAL_DATASETS + (CORPUS,) and not data.path:
    fail(d + "path", data.path, f"data.name={data.name!r} builds a dataset from local "
          "files: set data.path to the file or folder" + (" (or a glob)" if
                                                           data.name == CORPUS else ""))
  if data.path and data.name not in LOCAL_DATASETS + (CORPUS,):
    fail(d + "path", data.path, f"only the local datasets {LOCAL_DATASETS} and {CORPUS!r} "
          f"read data.path, and data.name={data.name!r}; set data.name or clear data.path")
  _validate_corpus(config)
  if bool(data.source_language) != bool(data.target_language):
    fail(d + "source_language" if not data.source_language else d + "target_language", "",
          "translation needs both data.source_language and data.target_language "
          f"(got {data.source_language!r} -> {data.target_language!r})")
  if data.source_language and data.source_language == data.target_language:
    fail(d + "target_language", data.target_language, "must differ from "
          "data.source_language")
  if model.vocab_size == 0 and data.tokenizer == "sentencepiece" and not data.spm_vocab_size:
    fail(d + "spm_vocab_size", 0, "with model.vocab_size=0 (take the tokenizer's size), "
          "SentencePiece needs its own size: set data.spm_vocab_size, e.g. 8000")
  # Position tables have max_len rows; a lookup past the end returns NaN, not an error.
  if data.seq_len > model.max_len and model.position in TABLE_POSITIONS:
    fail(d + "seq_len", data.seq_len,
          f"must be <= model.max_len={model.max_len} with {model.position} positions")


def _validate_corpus(config: ml_collections.ConfigDict) -> None:
  """data.name="corpus": its splits, objective and data.prepare_piece_mb."""
  d, data = "data.", config.data
  if not is_number(data.prepare_piece_mb) or data.prepare_piece_mb < 0:
    fail(d + "prepare_piece_mb", data.prepare_piece_mb, "expected a number of megabytes >= 0 "
         "(a larger source file is prepared in parts of about this size; 0: never split)")
  if data.name != CORPUS:
    return
  for key in ("train_split", "eval_split"):
    if data[key] not in CORPUS_SPLITS:
      fail(d + key, data[key], f"a prepared corpus has the splits {CORPUS_SPLITS}")
  objective = objective_lib.resolve(config.model)
  if not (objective.streams or objective.transform):  # Windows of the token stream.
    fail(d + "name", CORPUS, "a prepared corpus holds token ids for language modelling "
         f"(model.head='lm'), not for the {objective.pipeline} objective of model.arch="
         f"{config.model.arch!r}, model.head={config.model.head!r}")


# data.mixture's example, in its messages.
MIXTURE_EXAMPLE = "web:0.7:/data/fineweb,code:0.2:/data/the-stack,books:0.1:/data/books"


def parse_mixture(spec: str) -> tuple[tuple[str, float, str], ...]:
  """data.mixture "name:weight:path,..." -> ((name, weight, path), ...), in order.

  A path may hold colons (gs://...): only the first two of a component split it. Raises
  ConfigError naming the component that is wrong and the syntax.
  """
  syntax = f"write name:weight:path, comma-separated, e.g. {MIXTURE_EXAMPLE!r}"
  components, names = [], set()
  for part in str(spec).split(","):
    fields = part.strip().split(":", 2)
    if len(fields) != 3 or not all(f.strip() for f in fields):
      fail("data.mixture", spec, f"component {part.strip()!r} is not name:weight:path; {syntax}")
    name, weight, path = (f.strip() for f in fields)
    if not name.replace("_", "").replace("-", "").isalnum():
      fail("data.mixture", spec, f"component name {name!r} must be letters, digits, '_' or "
           f"'-' (it names the component's metrics); {syntax}")
    if name in names:
      fail("data.mixture", spec, f"component name {name!r} appears twice; {syntax}")
    try:
      value = float(weight)
    except ValueError:
      value = float("nan")
    if not 0 < value < float("inf"):
      fail("data.mixture", spec, f"component {name!r} has weight {weight!r}, expected a "
           f"positive number (weights need not add up to 1); {syntax}")
    names.add(name)
    components.append((name, value, path))
  if len(components) < 2:
    fail("data.mixture", spec, f"a mixture needs at least two corpora; for one, set "
         f"data.path instead; {syntax}")
  return tuple(components)
