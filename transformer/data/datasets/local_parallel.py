"""`local_parallel`: line-aligned `<split>.<lang>` files as a translation dataset.

`config.data.path` is a folder such as Multi30k's: `train.en`, `train.de`, `val.en`,
`val.de`, `test_2016_flickr.en`, ... Line i of every language file of a split is one
example with one Text feature per language code. `train` -> "train", `val` / `valid`
/ `dev` -> "validation", `test*` -> the file's stem. Pairs with an empty or
whitespace-only side are dropped, counted and logged; the text is otherwise kept as
is (only the newline is removed).
"""

from __future__ import annotations

import os

import ml_collections
import tensorflow_datasets as tfds
from absl import logging

from transformer.config.errors import ConfigError
from transformer.config.errors import DataError
from transformer.data.datasets import local_files


def _plan_splits(root: str, names: list[str]) -> dict[str, dict[str, str]]:
  """Split -> language -> file name, checked: a train split, the same >= 2 languages."""
  plan: dict[str, dict[str, str]] = {}
  ignored = []
  for name in names:
    stem, _, lang = name.partition(".")
    split = local_files.split_for_stem(stem, os.path.join(root, name)) if lang else None
    if split is None or not lang or "." in lang:
      ignored.append(name)
      continue
    if lang in plan.get(split, {}):
      raise ConfigError(f"config.data.path={root!r} is invalid: {plan[split][lang]} and "
                        f"{name} are both the {lang!r} side of split {split!r}; keep one.")
    plan.setdefault(split, {})[lang] = name
  if ignored:
    logging.warning("local_parallel: ignoring files in %s not named <split>.<lang> with "
                    "split train, val/valid/dev or test*: %s", root,
                    local_files.first_locations(ignored))
  found = "; ".join(f"{split}: {sorted(langs)}" for split, langs in sorted(plan.items()))
  languages = {frozenset(langs) for langs in plan.values()}
  if "train" not in plan or len(languages) != 1 or len(next(iter(languages))) < 2:
    raise ConfigError(
        f"config.data.path={root!r} is invalid: local_parallel needs files <split>.<lang> "
        "with a train split and the same two or more languages in every split (e.g. "
        f"train.en, train.de, val.en, val.de); found {found or 'no such files'}.")
  return plan


def make_builder(data: ml_collections.ConfigDict) -> tfds.core.DatasetBuilder:
  """Returns the (possibly not yet prepared) builder for the files at data.path.

  Args:
    data: the `config.data` ConfigDict (`path`, `data_dir`, `decode_errors`).

  Returns:
    A `LocalParallel` builder whose config is named after the files' content.

  Raises:
    ConfigError: `data.path` is not a folder of consistent `<split>.<lang>` files.
  """
  local_files.check_options(data)
  root = local_files.require_path(
      data, "local_parallel", "dir",
      "a folder of line-aligned <split>.<lang> files (e.g. train.en, train.de)")
  plan = _plan_splits(root, local_files.list_files(root, recursive=False))
  names = sorted(name for langs in plan.values() for name in langs.values())
  config = local_files.make_config(
      root, LocalParallel.VERSION, local_files.hash_files(root, names),
      options={"decode_errors": data.decode_errors},
      layout={"plan": plan, "languages": sorted(plan["train"])})
  return LocalParallel(config=config, data_dir=data.data_dir or None)


class LocalParallel(local_files.LocalFilesBuilder):
  """Line-aligned parallel text, one Text feature per language, in line order."""

  RELEASE_NOTES = {"1.0.0": "One example per aligned line; pairs with an empty side dropped."}

  def _features(self):
    return {lang: tfds.features.Text() for lang in self.builder_config.layout["languages"]}

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download: the files are already on disk.
    config = self.builder_config
    logging.info("local_parallel: building %s from %s (%d files)", config.name,
                 config.source_path, len(config.files))
    return {split: self._generate_examples(split, files)
            for split, files in config.layout["plan"].items()}

  def _generate_examples(self, split: str, files: dict[str, str]):
    """Yields (line index, {lang: line}) for the aligned lines of one split."""
    config = self.builder_config
    sources = {lang: config.file(name) for lang, name in sorted(files.items())}
    lines = {lang: local_files.lines_with_newlines(
        local_files.read_text(source, config.options["decode_errors"]))
             for lang, source in sources.items()}
    first = next(iter(sources))
    for lang, source in sources.items():
      if len(lines[lang]) != len(lines[first]):
        raise DataError(
            f"{sources[first].path} has {len(lines[first])} lines but {source.path} has "
            f"{len(lines[lang])}; the files of split {split!r} must be line-aligned "
            "(line i of each is one example), so their line counts must be equal.")
    logging.info("local_parallel: split %r: %s: %d lines each", split,
                 ", ".join(s.path for s in sources.values()), len(lines[first]))
    dropped = local_files.DropLog("pairs with an empty or whitespace-only side")
    count = 0
    for i in range(len(lines[first])):
      example = {lang: local_files.strip_newline(lines[lang][i]) for lang in sources}
      empty = [lang for lang, text in example.items() if not text.strip()]
      if empty:
        dropped.add(f"{sources[empty[0]].path}:{i + 1} ({'/'.join(empty)} empty)")
        continue
      count += 1
      yield i, example
    dropped.log("local_parallel", split)
    if not count:
      raise DataError(f"local_parallel: split {split!r} has no example: "
                      f"{', '.join(s.path for s in sources.values())} hold no line pair "
                      "whose sides are all non-empty.")
    self._record_split(split, {"lines": len(lines[first]), "examples": count,
                               "dropped_empty": dropped.count})
