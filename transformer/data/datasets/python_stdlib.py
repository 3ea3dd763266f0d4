"""`python_stdlib`: the running interpreter's standard-library sources as a TFDS dataset.

Every Python installation ships this corpus, so the default training data needs no
network. Each example is one `.py` file (`text`, `path`). The dataset is versioned
like any TFDS dataset and written as `array_record`, so it is read without
TensorFlow through `tfds.data_source` / grain, by the same code that reads catalog
datasets. The builder config is named after the interpreter (e.g. `cpython3_11_7`),
so sources from two interpreters land in different directories and never mix.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import sysconfig

import tensorflow_datasets as tfds

# Files under these directory names are not the standard library proper.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
VALIDATION_PERCENT = 5


def interpreter_tag() -> str:
  """Names the running interpreter, e.g. 'cpython3_11_7'."""
  v = sys.version_info
  return f"{platform.python_implementation().lower()}{v.major}_{v.minor}_{v.micro}"


def is_validation(relative_path: str) -> bool:
  """Deterministic split: a file is held out by a hash of its path, not by chance."""
  digest = hashlib.sha256(relative_path.encode("utf-8")).hexdigest()
  return int(digest, 16) % 100 < VALIDATION_PERCENT


class PythonStdlibConfig(tfds.core.BuilderConfig):
  """Which source tree to read; the default is the running interpreter's stdlib."""

  def __init__(self, *, root: str, python_version: str, **kwargs):
    super().__init__(**kwargs)
    self.root = root
    self.python_version = python_version


def current_interpreter_config() -> PythonStdlibConfig:
  """The builder config for the interpreter running this code."""
  return PythonStdlibConfig(
      name=interpreter_tag(), root=sysconfig.get_paths()["stdlib"],
      python_version=sys.version.split()[0],
      description=f"Standard library of {platform.python_implementation()} {sys.version}")


class PythonStdlib(tfds.core.GeneratorBasedBuilder):
  """The `.py` files of a Python standard library, one example per file."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: .py files, sha256(path) % 100 < 5 -> validation."}
  BUILDER_CONFIGS = [current_interpreter_config()]

  def _info(self) -> tfds.core.DatasetInfo:
    # DatasetInfo(...) directly: dataset_info_from_configs() expects a TFDS
    # metadata folder beside the builder's source, which this builder has no need for.
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            "path": tfds.features.Text(),
        }),
        metadata=tfds.core.MetadataDict(
            python_version=self.builder_config.python_version,
            implementation=platform.python_implementation(),
            validation_percent=VALIDATION_PERCENT),
        homepage="https://docs.python.org/3/library/",
    )

  def _source_files(self) -> list[str]:
    root = self.builder_config.root
    if not os.path.isdir(root):
      raise FileNotFoundError(f"python_stdlib: source root {root!r} is not a directory")
    paths = []
    for directory, subdirs, files in os.walk(root):
      subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
      paths.extend(os.path.relpath(os.path.join(directory, f), root)
                   for f in files if f.endswith(".py"))
    return sorted(paths)

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download: the corpus is already on disk.
    paths = self._source_files()
    return {
        "train": self._generate_examples([p for p in paths if not is_validation(p)]),
        "validation": self._generate_examples([p for p in paths if is_validation(p)]),
    }

  def _generate_examples(self, relative_paths: list[str]):
    root = self.builder_config.root
    for relative in relative_paths:
      with open(os.path.join(root, relative), "rb") as f:
        raw = f.read()
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError:
        # A handful of stdlib test fixtures are deliberately in legacy encodings;
        # they are not UTF-8 source text, so they are left out rather than mangled.
        continue
      yield relative, {"text": text, "path": relative}
