"""`local_text`: plain-text files as a language-modelling dataset (feature `text`).

`config.data.path` is one file, split by position the way nanoGPT splits Tiny
Shakespeare (the first `1 - val_fraction` of the characters -> train, the rest ->
validation), or a folder of files taken recursively. In a folder, files named
`train*`, `val*` / `valid*` / `dev*` and `test*` give those splits; if no file is
named so, every file is split by position. Each split is cut into blocks of whole
lines of at most 2048 characters, in order, so the blocks of a split concatenate to
exactly its text and a shuffled reader (or each of several processes) gets many small
examples, not one huge one.

A file (its part in a split) is still one document: `starts_document` is true only on
its first block and `ends_document` only on its last, so the LM pipeline puts [bos]
and [eos] around the file's text, not around every block (nanoGPT's Tiny Shakespeare
is one stream of characters, with no marks every 2048 of them).
"""

from __future__ import annotations

import os
from typing import Iterator

import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from transformer.config.errors import ConfigError
from transformer.config.errors import DataError
from transformer.data.datasets import local_files

BLOCK_CHARS = 2048
# File-name prefixes that assign a file to a split (checked in this order).
_SPLIT_PREFIXES = (("train", "train"), ("val", "validation"), ("dev", "validation"),
                   ("test", "test"))


def text_blocks(text: str, max_chars: int = BLOCK_CHARS) -> Iterator[str]:
  """Cuts text into runs of whole consecutive lines of at most `max_chars` characters.

  A line longer than `max_chars` is cut into `max_chars`-character pieces. The
  blocks concatenate to exactly `text`.

  Args:
    text: the text to cut.
    max_chars: the longest block.

  Yields:
    The blocks, in order.
  """
  block, size = [], 0
  for line in local_files.lines_with_newlines(text):
    for start in range(0, len(line), max_chars):
      piece = line[start:start + max_chars]
      if block and size + len(piece) > max_chars:
        yield "".join(block)
        block, size = [], 0
      block.append(piece)
      size += len(piece)
  if block:
    yield "".join(block)


def _split_of(relative_path: str) -> str | None:
  name = os.path.basename(relative_path).lower()
  return next((split for prefix, split in _SPLIT_PREFIXES if name.startswith(prefix)), None)


def _plan_splits(root: str, relative_paths: list[str], val_fraction: float,
                 by_name: bool) -> dict[str, list[str]]:
  """Split name -> files; or {"positional": files} when the files have no split names."""
  named = {p: _split_of(p) if by_name else None for p in relative_paths}
  unnamed = [p for p, split in named.items() if split is None]
  if len(unnamed) == len(relative_paths):
    if not 0.0 < val_fraction < 1.0:
      what = (f"the files of {root} (none is named train*/val*/dev*/test*)" if by_name
              else os.path.join(root, relative_paths[0]))
      raise ConfigError(
          f"config.data.val_fraction={val_fraction!r} is invalid: local_text splits {what} "
          "by position and needs a validation fraction in (0, 1), e.g. 0.1.")
    return {"positional": relative_paths}
  if unnamed:
    raise ConfigError(
        f"config.data.path={root!r} is invalid: some files are named after a split "
        "(train*, val*/valid*/dev*, test*) but these are not: "
        f"{local_files.first_locations(unnamed)}. Name every file after its split, "
        "or none (then each file is split by position).")
  plan: dict[str, list[str]] = {}
  for path, split in named.items():
    plan.setdefault(split, []).append(path)
  return plan


def make_builder(data: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Returns the (possibly not yet prepared) builder for the files at data.path.

  Args:
    data: the `config.data` ConfigDict (`path`, `data_dir`, `val_fraction`,
      `decode_errors`).

  Returns:
    A `LocalText` builder whose config is named after the files' content.

  Raises:
    ConfigError: `data.path` is unusable or the files' split names are inconsistent.
  """
  local_files.check_options(data)
  path = local_files.require_path(data, "local_text", "file_or_dir",
                                  "a text file or a folder of text files")
  if os.path.isdir(path):
    root, relative_paths = path, local_files.list_files(path, recursive=True)
    if not relative_paths:
      raise ConfigError(f"config.data.path={data.path!r} is invalid: the folder {path} "
                        "holds no (non-hidden) files; local_text needs text files.")
    plan = _plan_splits(root, relative_paths, data.val_fraction, by_name=True)
  else:  # One file is always split by position, whatever its name.
    root, relative_paths = os.path.dirname(path), [os.path.basename(path)]
    plan = _plan_splits(root, relative_paths, data.val_fraction, by_name=False)
  options = {"decode_errors": data.decode_errors, "block_chars": BLOCK_CHARS}
  if "positional" in plan:
    options["val_fraction"] = data.val_fraction  # Only a positional split depends on it.
  config = local_files.make_config(
      path, LocalText.VERSION, local_files.hash_files(root, relative_paths), options,
      layout={"plan": plan})
  return LocalText(config=config, data_dir=data.data_dir or None)


class LocalText(local_files.LocalFilesBuilder):
  """Plain text files cut into blocks of whole lines (feature `text`), in order; the
  flags `starts_document` / `ends_document` mark each file's first and last block."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {
      "1.0.0": "Blocks of <= 2048 characters of whole lines, in file order.",
      "1.1.0": "`starts_document` / `ends_document`: a file's blocks make one document.",
  }

  def _features(self):
    return {"text": tfds.features.Text(),
            "starts_document": tfds.features.Scalar(np.bool_),
            "ends_document": tfds.features.Scalar(np.bool_)}

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download: the files are already on disk.
    config = self.builder_config
    plan = config.layout["plan"]
    logging.info("local_text: building %s from %s (%d files)", config.name,
                 config.source_path, len(config.files))
    if "positional" in plan:
      cut = 1.0 - config.options["val_fraction"]
      files = plan["positional"]
      return {"train": self._generate_examples("train", files, (0.0, cut)),
              "validation": self._generate_examples("validation", files, (cut, 1.0))}
    return {split: self._generate_examples(split, files, (0.0, 1.0))
            for split, files in plan.items()}

  def _generate_examples(self, split: str, relative_paths: list[str],
                         part: tuple[float, float]):
    """Yields (index, example) for the blocks of the `part` fraction of each file, in order."""
    config = self.builder_config
    index = characters = 0
    for relative in relative_paths:
      source = config.file(relative)
      text = local_files.read_text(source, config.options["decode_errors"])
      if not text:
        raise DataError(f"{source.path}: the file is empty; local_text needs text in "
                        "every file (remove the file or fill it).")
      # nanoGPT: train = text[:int(n * 0.9)], val = the rest; the same int() cut.
      n = len(text)
      text = text[int(n * part[0]):n if part[1] >= 1.0 else int(n * part[1])]
      logging.info("local_text: split %r: %s: %d characters", split, source.path, len(text))
      characters += len(text)
      blocks = list(text_blocks(text))
      for i, block in enumerate(blocks):
        yield index, {"text": block, "starts_document": i == 0,
                      "ends_document": i == len(blocks) - 1}
        index += 1
    if not index:
      paths = ", ".join(config.file(p).path for p in relative_paths)
      raise DataError(f"local_text: split {split!r} is empty: {paths} give it no "
                      "characters; a split needs text (for a positional split: a larger "
                      "file or config.data.val_fraction).")
    self._record_split(split, {"files": len(relative_paths), "characters": characters,
                               "examples": index})
