"""`local_tsv`: TSV / CSV files as a text-classification dataset.

`config.data.path` is a folder in the GLUE layout (`train.tsv`, `dev.tsv`, or `.csv`
files; `train` -> "train", `dev` / `val` / `valid` -> "validation", `test*` -> the
file's stem) or one file, which is then the train split alone. The features are
`{data.text_key: Text, data.label_key: ClassLabel}`. Columns are found by name when
the first row holds both keys (a header), else by index when both keys are integers
("0", "1"). The label names are the train split's labels, sorted numerically when
they are integers (which must then be exactly 0..K-1), else alphabetically.
TSV is read without quoting (GLUE sentences contain `"`); CSV in the default dialect.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
from typing import Iterator

import ml_collections
import tensorflow_datasets as tfds
from absl import logging

from transformer.config.errors import ConfigError
from transformer.config.errors import DataError
from transformer.data.datasets import local_files

_DIALECTS = {".tsv": {"delimiter": "\t", "quoting": csv.QUOTE_NONE}, ".csv": {}}
_RAGGED_HINTS = {  # The usual cause of a row with the wrong number of cells.
    ".tsv": "TSV is read without quoting, so a tab inside the text splits its cell",
    ".csv": "a cell holding ',' or a newline must be in double quotes, closed",
}
_INTEGER = re.compile(r"0|-?[1-9][0-9]*")  # Canonical integers only: "01" is a name.
_INDEX = re.compile(r"[0-9]+")


@dataclasses.dataclass(frozen=True)
class Columns:
  """Where the text and label cells are in the rows of one file."""

  text: int
  label: int
  width: int  # Cells in every row.
  header: bool  # Whether line 1 is a header (then data starts at line 2).


def _rows(source: local_files.SourceFile, decode_errors: str) -> Iterator[tuple[int, list[str]]]:
  """Yields (first line number of the row, cells) for every row of a TSV/CSV file."""
  text = local_files.read_text(source, decode_errors)
  reader = csv.reader(local_files.lines_with_newlines(text),
                      **_DIALECTS[os.path.splitext(source.path)[1].lower()])
  line = 1
  try:
    for row in reader:
      yield line, row
      line = reader.line_num + 1  # A quoted CSV cell may span several lines.
  except csv.Error as e:
    raise DataError(f"{source.path}:{reader.line_num}: unreadable row ({e}); valid is one "
                    "row per line with cells separated by the delimiter.") from e


def _find_columns(source: local_files.SourceFile, options: dict[str, str],
                  is_train: bool) -> Columns | None:
  """Finds the text and label columns from the first row; None: the file has no labels."""
  text_key, label_key = options["text_key"], options["label_key"]
  first = next(_rows(source, options["decode_errors"]), (1, None))[1]
  if first is None:
    raise DataError(f"{source.path}: the file is empty; expected a header row with "
                    f"{text_key!r} and {label_key!r}, then one row per example.")
  keys = f"config.data.text_key={text_key!r} and config.data.label_key={label_key!r}"
  if text_key in first and label_key in first:
    return Columns(first.index(text_key), first.index(label_key), len(first), True)
  if not is_train and text_key in first:
    return None  # A header without the label column: GLUE's unlabelled test.tsv.
  if _INDEX.fullmatch(text_key) and _INDEX.fullmatch(label_key):
    text, label = int(text_key), int(label_key)
    if text < len(first) <= label and not is_train:
      return None  # Too few columns to hold the label: an unlabelled split.
    for key, index in (("text_key", text), ("label_key", label)):
      if index >= len(first):
        raise ConfigError(f"config.data.{key}={options[key]!r} is invalid: {source.path} "
                          f"has {len(first)} columns in line 1, so valid indices are "
                          f"0..{len(first) - 1}.")
    return Columns(text, label, len(first), False)
  raise ConfigError(f"{keys} do not both name columns of {source.path}: its first row "
                    f"(line 1) has the cells {first}. Valid: two of those header cells, or "
                    "two column indices such as '0' and '1' for a file without a header.")


def _examples(source: local_files.SourceFile, columns: Columns, options: dict[str, str],
              dropped: local_files.DropLog) -> Iterator[tuple[int, str, str]]:
  """Yields (line, text, label) per data row, checking each row's shape and cells."""
  rows = _rows(source, options["decode_errors"])
  if columns.header:
    next(rows)
  for line, row in rows:
    if not row:  # A blank line; nothing to classify.
      dropped.add(f"{source.path}:{line}")
      continue
    if len(row) != columns.width:
      hint = _RAGGED_HINTS[os.path.splitext(source.path)[1].lower()]
      raise DataError(
          f"{source.path}:{line}: the row has {len(row)} cells, expected {columns.width} "
          f"like {'the header' if columns.header else 'the first row'} (line 1); {hint}.")
    for key, index in (("text_key", columns.text), ("label_key", columns.label)):
      if not row[index].strip():
        raise DataError(f"{source.path}:{line}: the {options[key]!r} cell (config.data.{key}) "
                        "is empty; valid is a non-empty text and label in every row.")
    yield line, row[columns.text], row[columns.label]


def _label_names(source: local_files.SourceFile, labels: dict[str, int]) -> list[str]:
  """Sorted label names; integers must be exactly 0..K-1. `labels`: label -> first line."""
  if not all(_INTEGER.fullmatch(label) for label in labels):
    return sorted(labels)
  names = sorted(labels, key=int)
  for label in names:
    if not 0 <= int(label) < len(names):
      raise DataError(
          f"{source.path}:{labels[label]}: label {label!r} is out of range: integer labels "
          f"must be exactly 0..{len(names) - 1} (one per class); found {names}.")
  return names


def _plan_splits(data: ml_collections.ConfigDict, path: str) -> dict[str, str]:
  """Split -> relative file name, from the folder's file stems (or one file -> train)."""
  if not os.path.isdir(path):
    if os.path.splitext(path)[1].lower() not in _DIALECTS:
      raise ConfigError(f"config.data.path={data.path!r} is invalid: local_tsv reads .tsv "
                        "or .csv files.")
    logging.info("local_tsv: %s is one file: it is the train split; there is no "
                 "validation split.", path)
    return {"train": os.path.basename(path)}
  plan: dict[str, str] = {}
  names = local_files.list_files(path, recursive=False)
  for name in names:
    stem, ext = os.path.splitext(name)
    split = (local_files.split_for_stem(stem, os.path.join(path, name))
             if ext.lower() in _DIALECTS else None)
    if split is None:
      logging.warning("local_tsv: ignoring %s: not <split>.tsv / <split>.csv with split "
                      "train, dev/val/valid or test*.", os.path.join(path, name))
      continue
    if split in plan:
      raise ConfigError(f"config.data.path={data.path!r} is invalid: {plan[split]} and "
                        f"{name} are both split {split!r}; keep one.")
    plan[split] = name
  if "train" not in plan:
    raise ConfigError(f"config.data.path={data.path!r} is invalid: local_tsv needs a "
                      f"train.tsv or train.csv in {path}; found {names}.")
  return plan


def make_builder(data: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Returns the (possibly not yet prepared) builder for the files at data.path.

  Reads the train file (its labels name the classes) and the first row of the others.

  Args:
    data: the `config.data` ConfigDict (`path`, `data_dir`, `text_key`, `label_key`,
      `decode_errors`).

  Returns:
    A `LocalTsv` builder whose config is named after the files' content.

  Raises:
    ConfigError: unusable `data.path`, or keys that name no column.
    DataError: bad train-file content (ragged rows, empty cells, labels not 0..K-1).
  """
  local_files.check_options(data)
  if not data.label_key or not data.text_key or data.text_key == data.label_key:
    raise ConfigError(
        f"config.data.text_key={data.text_key!r}, config.data.label_key="
        f"{data.label_key!r} are invalid: classification needs two different columns, "
        "config.data.text_key and config.data.label_key (e.g. 'sentence' and 'label' for "
        "GLUE, or '0' and '1' by index for a file without a header).")
  path = local_files.require_path(data, "local_tsv", "file_or_dir",
                                  "a .tsv/.csv file or a folder with train.tsv, dev.tsv")
  root = path if os.path.isdir(path) else os.path.dirname(path)
  plan = _plan_splits(data, path)
  files = local_files.hash_files(root, sorted(plan.values()))
  by_name = {f.relative_path: f for f in files}
  options = {"decode_errors": data.decode_errors, "text_key": data.text_key,
             "label_key": data.label_key}
  columns = {}
  for split, name in plan.items():
    found = _find_columns(by_name[name], options, is_train=split == "train")
    if found is None:
      logging.warning("local_tsv: not building split %r: %s has no %r column "
                      "(config.data.label_key), so it has no labels.", split,
                      by_name[name].path, data.label_key)
    else:
      columns[split] = found
  train = by_name[plan["train"]]
  labels: dict[str, int] = {}  # Label -> the first line it is on.
  for line, _, label in _examples(train, columns["train"], options, local_files.DropLog("")):
    labels.setdefault(label, line)
  if not labels:
    raise DataError(f"{train.path}: the train split has no rows after the header; valid "
                    "is at least one labelled row.")
  config = local_files.make_config(
      path, LocalTsv.VERSION, files, options,
      layout={"plan": plan, "columns": columns, "label_names": _label_names(train, labels)})
  return LocalTsv(config=config, data_dir=data.data_dir or None)


class LocalTsv(local_files.LocalFilesBuilder):
  """Rows of TSV/CSV files as (text, class label) examples, in row order."""

  RELEASE_NOTES = {"1.0.0": "One example per row; labels named by the train split."}

  def _features(self):
    options = self.builder_config.options
    return {options["text_key"]: tfds.features.Text(),
            options["label_key"]: tfds.features.ClassLabel(
                names=self.builder_config.layout["label_names"])}

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download: the files are already on disk.
    config = self.builder_config
    logging.info("local_tsv: building %s from %s (%d files)", config.name,
                 config.source_path, len(config.files))
    return {split: self._generate_examples(split, config.file(config.layout["plan"][split]),
                                           columns)
            for split, columns in config.layout["columns"].items()}

  def _generate_examples(self, split: str, source: local_files.SourceFile, columns: Columns):
    """Yields (row index, {text_key: text, label_key: class index}) for one file."""
    options = self.builder_config.options
    names = self.builder_config.layout["label_names"]
    index_of = {name: i for i, name in enumerate(names)}
    dropped = local_files.DropLog("blank lines")
    count = 0
    for line, text, label in _examples(source, columns, options, dropped):
      if label not in index_of:
        raise DataError(f"{source.path}:{line}: label {label!r} in column "
                        f"{options['label_key']!r} is not a label of the train split; "
                        f"valid: {names}.")
      yield count, {options["text_key"]: text, options["label_key"]: index_of[label]}
      count += 1
    dropped.log("local_tsv", split)
    if not count:
      raise DataError(f"{source.path}: split {split!r} has no rows after the header; "
                      "valid is at least one labelled row.")
    self._record_split(split, {"file": source.relative_path, "examples": count,
                               "dropped_blank": dropped.count})
