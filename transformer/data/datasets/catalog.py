"""Where a dataset comes from: `data.name` -> a prepared TFDS builder.

Three kinds of names, one result (a builder whose splits `as_data_source` reads):
  - `python_stdlib`: this project's offline corpus (data/datasets/python_stdlib.py);
  - `local_text`, `local_parallel`, `local_tsv`: files at `data.path`, built into a
    versioned TFDS dataset keyed by their content (data/datasets/local_*.py);
  - anything else: a TFDS catalog name such as `wmt14_translate/de-en`, `glue/sst2`,
    `tiny_shakespeare`, prepared beforehand or downloaded with `data.download=True`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

import ml_collections
import tensorflow_datasets as tfds
from absl import logging

from transformer.config.errors import ConfigError, DataError
from transformer.data import packing
from transformer.data.datasets import local_parallel
from transformer.data.datasets import local_text
from transformer.data.datasets import local_tsv
from transformer.data.datasets import python_stdlib  # pylint: disable=unused-import (registers it)
from transformer.workdir import console
from transformer.workdir import files
from transformer.workdir import lock

OFFLINE_DATASETS = ("python_stdlib",)  # Built from local files; never download.
# Datasets built from the files at data.path, by the builder each function returns.
LOCAL_BUILDERS: dict[str, Callable[[ml_collections.ConfigDict], tfds.core.DatasetBuilder]] = {
    "local_text": local_text.make_builder,
    "local_parallel": local_parallel.make_builder,
    "local_tsv": local_tsv.make_builder,
}


def prepare_instructions(name: str, data_dir: str) -> str:
  """How to prepare a catalog dataset on a machine with network, for error messages."""
  return (f"Prepare it once on a machine with network: `python -c \"import tensorflow_datasets "
          f"as tfds; tfds.builder('{name}', data_dir='{data_dir}').download_and_prepare("
          f"file_format='array_record')\"` (files a dataset needs by hand go in "
          f"{data_dir}/downloads/manual), copy {data_dir} here if needed and set "
          f"config.data.data_dir={data_dir!r}; or set config.data.download=True on a machine "
          "with network.")


# TFDS imports these packages of older builders (glue, wmt*_translate, ...) lazily, and
# without TensorFlow they are not registered until imported: try them in turn.
_LEGACY_PACKAGES = ("text", "translate", "structured", "summarization", "question_answering",
                    "text_simplification")


def _catalog_builder(data: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  error = None
  for package in (None,) + _LEGACY_PACKAGES:
    if package:
      importlib.import_module(f"tensorflow_datasets.{package}")
    try:
      return tfds.builder(data.name, data_dir=data.data_dir or None)
    except tfds.core.registered.DatasetNotFoundError as e:
      error = error or e
  raise ConfigError(
      f"config.data.name={data.name!r} is not a TFDS dataset: {str(error).splitlines()[0]} "
      f"Use 'python_stdlib' (offline), one of {sorted(LOCAL_BUILDERS)} with "
      "config.data.path, or a name from the TFDS catalog.") from error


def find_builder(data: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """`data.name`'s builder as it is, prepared or not: nothing is built or downloaded
  (`builder.is_prepared()` says which; load_builder prepares it).

  Raises:
    ConfigError: unknown dataset.
  """
  make = LOCAL_BUILDERS[data.name] if data.name in LOCAL_BUILDERS else _catalog_builder
  return make(data)


def load_builder(data: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Finds `data.name` and makes sure it is prepared (building local datasets once).

  Raises:
    ConfigError: unknown dataset, missing split, or a catalog dataset that is not
      prepared while `data.download` is False or the download fails; the message
      says how to prepare it.
  """
  make = LOCAL_BUILDERS[data.name] if data.name in LOCAL_BUILDERS else _catalog_builder
  builder = find_builder(data)
  if not builder.is_prepared():
    local = builder.name in OFFLINE_DATASETS or data.name in LOCAL_BUILDERS
    root = str(builder.data_dir_root)
    if not local and not data.download:
      raise ConfigError(f"config.data.name={data.name!r} is not prepared in {root} and "
                        f"config.data.download=False. " + prepare_instructions(data.name, root))
    # Commands started at once on the same new data build it once, in turn: the others
    # wait here, then find it prepared (a builder made anew reads what was written).
    with lock.building(lock.lock_path_beside(str(builder.data_dir)),
                       f"the dataset {builder.info.full_name}"):
      builder = make(data)
      if not builder.is_prepared():
        _prepare(builder, data, local, root)
      else:
        logging.info("Reusing %s, prepared meanwhile by another command", builder.data_dir)
  for key in ("train_split", "eval_split"):
    if data[key] not in builder.info.splits:
      raise ConfigError(f"config.data.{key}={data[key]!r} is not a split of {data.name}; "
                        f"valid: {sorted(builder.info.splits)}")
  return builder


def _prepare(builder: tfds.core.DatasetBuilder, data: ml_collections.ConfigDict, local: bool,
             root: str) -> None:
  """Prepares `builder` once (the caller holds its build lock)."""
  logging.info("Preparing TFDS dataset %s in %s (one time)", builder.info.full_name,
               builder.data_dir)
  try:
    with console.stdout_to_log("tensorflow_datasets"):  # Its size banner: log file only.
      with files.disk_errors_as_oserror(str(builder.data_dir)):  # A full data_dir.
        builder.download_and_prepare(file_format="array_record")
  except Exception as e:  # A catalog download: network, missing manual files, ...
    if isinstance(e, OSError) and e.errno in files.DISK_FULL_ERRNOS:
      raise  # The machine's refusal: launch.py says it in one line.
    if local:
      raise  # This project's builders already say what is wrong.
    raise ConfigError(f"config.data.name={data.name!r}: preparing it in {root} failed "
                      f"({type(e).__name__}: {str(e)[:300]}). "
                      + prepare_instructions(data.name, root)) from e
  # Split info may lack counts (e.g. under tfds.testing.mock_data): say what is known.
  logging.info("Prepared %s: %s", builder.info.full_name, ", ".join(
      f"{name} {split.num_examples:,} examples"
      if isinstance(getattr(split, "num_examples", None), int) else name
      for name, split in builder.info.splits.items()))


# How a damaged prepared file reads in array_record's errors (a truncated or overwritten
# cache: a full disk while copying it, a partial rsync).
_DAMAGED_MARKS = ("Riegeli", "ArrayRecord file", "array_record")


class CheckedSource:
  """A split of a prepared dataset whose damaged files are one DataError, not a traceback.

  Reads like the TFDS data source it wraps (len, [i], a list of indices); an
  array_record read error becomes a DataError naming the cache folder and what to do.
  """

  def __init__(self, source: Any, folder: str):
    self._source, self._folder = source, folder

  def __len__(self) -> int:
    return len(self._source)

  @property
  def features(self) -> Any:
    """The split's TFDS features (a labelled text's class names: sources.label_names)."""
    return self._source.dataset_info.features

  def _damaged(self, error: Exception) -> DataError:
    return DataError(
        f"the prepared dataset in {self._folder} is damaged ({str(error).splitlines()[0]}): "
        f"delete that folder and run again to build it anew (local files and "
        "python_stdlib), or prepare the catalog dataset again")

  def __getitem__(self, index: int) -> Any:
    try:
      return self._source[index]
    except RuntimeError as e:
      if any(mark in str(e) for mark in _DAMAGED_MARKS):
        raise self._damaged(e) from None
      raise

  def __getitems__(self, indices: Sequence[int]) -> Any:
    try:
      return packing.read_items(self._source, indices)
    except RuntimeError as e:
      if any(mark in str(e) for mark in _DAMAGED_MARKS):
        raise self._damaged(e) from None
      raise

  def __repr__(self) -> str:
    return f"CheckedSource({self._source!r})"


def data_source(builder: tfds.core.DatasetBuilder, split: str) -> CheckedSource:
  """`builder.as_data_source(split)`, its damaged files said in one line (CheckedSource)."""
  return CheckedSource(builder.as_data_source(split=split), str(builder.data_dir))
