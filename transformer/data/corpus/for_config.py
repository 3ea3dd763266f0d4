"""A config's prepared corpus: its tokenizer, its folder, and the checks before training.

Shared by `--mode=prepare` (cli/prepare.py: may train the vocabulary, then tokenizes)
and training (`sources.load_sources` for data.name="corpus": finds the prepared ids,
refuses sources or a tokenizer changed since, and never tokenizes).

The tokenizer is chosen as for the other datasets: the vocabulary of `init_from`'s run
(an imported Hugging Face tokenizer.json, or any run's) or of the run being resumed;
else `data.tokenizer`: bytes, or a character / SentencePiece vocabulary trained once on
a sample of the corpus and kept in the corpus's sources folder.
"""

from __future__ import annotations

import os
from typing import Iterator

import ml_collections
from absl import logging

from transformer.config.errors import ConfigError
from transformer.data.corpus import preparation
from transformer.data.corpus import readers
from transformer.data.corpus import store
from transformer.data.tokenizers import run_vocabulary
from transformer.data.tokenizers import vocabularies
from transformer.workdir import layout
from transformer.workdir import lock


def _sample(config: ml_collections.ConfigDict, root: str, names: list[str]) -> Iterator[str]:
  """Texts to train a vocabulary on: each file's first documents, an equal share of lines."""
  data = config.data
  budget = max(1, data.spm_train_sentences // len(names))
  stats = readers.ReadStats()
  for name in names:
    lines = 0
    reader = readers.reader(os.path.join(root, name), name, text_key=data.text_key,
                                decode_errors=data.decode_errors,
                                bad_records=data.bad_records, stats=stats)
    for document in reader.documents():
      for piece in document:
        yield piece
        lines += piece.count("\n") + 1
      if lines >= budget:
        break


def tokenizer_for(config: ml_collections.ConfigDict, tokenizer_workdir: str = "", *,
                  create: bool) -> vocabularies.Tokenizer:
  """The corpus's tokenizer; with `create`, a missing vocabulary is trained on a sample.

  Args:
    config: the experiment config (data.name="corpus").
    tokenizer_workdir: a run whose vocabulary to use (a resumed run, or init_from's).
    create: train a missing character / SentencePiece vocabulary (--mode=prepare);
      otherwise a missing one is a ConfigError naming the prepare command.
  """
  data = config.data
  workdir = tokenizer_workdir or (run_vocabulary.run_workdir(config.init_from)
                                  if config.init_from else "")
  if workdir and os.path.exists(os.path.join(workdir, layout.TOKENIZER_RECORD)):
    tokenizer = run_vocabulary.load_workdir_tokenizer(workdir)
    logging.info("Tokenizer: the vocabulary of %s (%s, %d ids)", workdir,
                 run_vocabulary.tokenizer_kind(tokenizer), tokenizer.vocab_size)
    return tokenizer
  if data.tokenizer == "bytes":
    return vocabularies.ByteTokenizer()
  folder = store.sources_folder(data)
  path = os.path.join(folder, run_vocabulary.cache_name(config, (data.text_key,)))
  make = vocabularies.CharTokenizer if data.tokenizer == "char" else vocabularies.SentencePieceTokenizer
  if os.path.exists(path):
    return make(path)
  if not create:
    raise ConfigError(f"config.data.name='corpus': data.path={data.path!r} is not prepared "
                      f"(no {data.tokenizer} vocabulary {path}); run "
                      f"`{store.prepare_command()}` first")
  os.makedirs(folder, exist_ok=True)
  with lock.building(lock.lock_path_beside(path), f"the vocabulary {path}"):
    if os.path.exists(path):
      return make(path)
    root, names = readers.source_files(data.path)
    logging.info("Training the %s vocabulary on a sample of %s -> %s", data.tokenizer,
                 data.path, path)
    return run_vocabulary.build_vocabulary(config, _sample(config, root, names), path)


def vocabulary_file(tokenizer: vocabularies.Tokenizer) -> str:
  """The tokenizer's vocabulary file, "" for bytes."""
  return getattr(tokenizer, "model_path", None) or getattr(tokenizer, "path", None) or ""


def job_for(config: ml_collections.ConfigDict, tokenizer: vocabularies.Tokenizer) -> preparation.Job:
  """The preparation of `config`'s corpus with `tokenizer`."""
  data = config.data
  root, names = readers.source_files(data.path)
  record = run_vocabulary.tokenizer_record(tokenizer)
  return preparation.Job(
      root=root, names=tuple(names),
      output=os.path.join(store.sources_folder(data), store.tokenizer_key(record)),
      text_key=data.text_key, decode_errors=data.decode_errors, bad_records=data.bad_records,
      val_fraction=float(data.val_fraction), tokenizer_kind=record["kind"],
      tokenizer_path=vocabulary_file(tokenizer), tokenizer_record=record,
      piece_bytes=int(float(data.prepare_piece_mb) * 1e6),
      dtype=store.id_dtype(tokenizer.vocab_size).name)


def open_for_training(config: ml_collections.ConfigDict, tokenizer_workdir: str = "",
                      tokenizer: vocabularies.Tokenizer | None = None
                      ) -> tuple[store.PreparedCorpus, vocabularies.Tokenizer]:
  """The prepared corpus of `config` and its tokenizer, checked; reads no shard.

  `tokenizer`: given, the corpus must be prepared with it (data.mixture: the first
  component's); else `tokenizer_for` finds it.

  Raises:
    ConfigError: not prepared (or not finished, or for another tokenizer), or its
      source files changed since; the message says what and names the prepare command.
  """
  data = config.data
  tokenizer = tokenizer or tokenizer_for(config, tokenizer_workdir, create=False)
  record = run_vocabulary.tokenizer_record(tokenizer)
  root, names = readers.source_files(data.path)
  folder = os.path.join(store.sources_folder(data), store.tokenizer_key(record))
  if not os.path.exists(os.path.join(folder, store.MANIFEST)):
    parent = os.path.dirname(folder)
    others = sorted(d for d in (os.listdir(parent) if os.path.isdir(parent) else [])
                    if os.path.exists(os.path.join(parent, d, store.MANIFEST)))
    tasks = os.path.join(folder, store.TASKS)
    # *.json: a task's lock file (.<task>.lock) beside them is not a task done.
    done = len([n for n in os.listdir(tasks) if n.endswith(".json")]) if os.path.isdir(
        tasks) else 0
    what = (f"prepared for another tokenizer ({', '.join(others)}), not for this "
            f"{record['kind']} one ({store.tokenizer_key(record)})" if others else
            f"not prepared in {folder} ({done} of {len(names)} files done)")
    raise ConfigError(f"config.data.name='corpus': data.path={data.path!r} is {what}; run "
                      f"`{store.prepare_command()}` first")
  prepared = store.PreparedCorpus.open(folder)
  change = (store.tokenizer_change(prepared.manifest, record)
            or store.sources_change(prepared.manifest, root, names))
  if change:
    raise ConfigError(f"config.data.path={data.path!r} changed since it was prepared in "
                      f"{folder} ({change}); run `{store.prepare_command()}` again")
  for key in ("train_split", "eval_split"):
    prepared.split(data[key])  # A ConfigError naming the valid splits.
  # Prepared before prepare checked it, or its files deleted since: said before training.
  problem = store.empty_split(prepared.manifest, folder)
  if problem:
    raise ConfigError(f"config.data.path={data.path!r}: {problem}; then run "
                      f"`{store.prepare_command()}` again")
  missing = store.missing_shards(prepared.manifest, folder)
  if missing:
    raise ConfigError(f"config.data.path={data.path!r}: the prepared corpus {folder} lacks "
                      f"a whole shard that its manifest lists: {missing[0]}"
                      + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                      + " (deleted, not copied whole, or cut short); run "
                      f"`{store.prepare_command()}` again: it redoes the missing files")
  # Says what was checked: size and mtime, not the content (store.file_change).
  logging.info("Corpus: %s (%s ids; train %d tokens, validation %d tokens); its %d source "
               "files are as prepared by size and mtime (content not read here: "
               "--mode=prepare checks it by sha256)", folder, prepared.dtype.name,
               prepared.manifest["splits"]["train"]["tokens"],
               prepared.manifest["splits"]["validation"]["tokens"], len(names))
  return prepared, tokenizer
