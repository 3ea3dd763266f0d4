"""What the `local_*` TFDS builders share: finding, hashing, decoding and naming files.

Each `local_*` builder reads files the user points `config.data.path` at. Its
BuilderConfig is made on the fly and named `<slug of the basename>_<12 hex>`, where
the hash covers the builder's version, the options that change the output and the
relative path and sha256 of every input file. So edited files build into a new
directory, two corpora never share one, and the same files reuse what was prepared.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import json
import os
import re
from typing import Any, Sequence

import ml_collections
import tensorflow_datasets as tfds
from absl import logging

from transformer.config.errors import ConfigError
from transformer.config.errors import DataError
from transformer.data import text_encoding

DECODE_ERRORS = ("strict", "replace")
# TFDS split names are used as file and proto names: keep them to word characters.
_SPLIT_NAME = re.compile(r"[A-Za-z0-9_]+")
_VALIDATION_STEMS = ("val", "valid", "validation", "dev")
_LOCATIONS_LOGGED = 5  # Drop logs and error messages list this many file:line places.
# (path, sha256) of files whose U+FFFD replacements were logged: a file read twice
# (both ends of a positional split, a TSV's header and rows) is reported once.
_REPLACEMENTS_LOGGED: set[tuple[str, str]] = set()
# (path, sha256) of files whose byte-order mark was reported (once per file, as above).
_BOMS_LOGGED: set[tuple[str, str]] = set()
UTF8_BOM = "\ufeff"


def strip_bom(text: str, where: str, logged: set[tuple[str, str]] | None = None,
              key: tuple[str, str] | None = None) -> str:
  """`text` without a leading UTF-8 byte-order mark, said once per `key` when one is dropped.

  Windows editors start UTF-8 files with U+FEFF; kept, it would be a character of the
  first line (a BOM-only line would get a translation, the character tokenizer an
  unknown id). Every text input (training files, --input, stdin, --prompt) drops it.

  Args:
    text: decoded text.
    where: the file (or "stdin", "--prompt") named in the log line.
    logged: keys already reported (None: report every time).
    key: what identifies this input in `logged`.
  """
  if not text.startswith(UTF8_BOM):
    return text
  if logged is None or key not in logged:
    if logged is not None:
      logged.add(key)
    logging.info("%s starts with a UTF-8 byte-order mark (U+FEFF): dropped, not read as text",
                 where)
  return text[len(UTF8_BOM):]


@dataclasses.dataclass(frozen=True)
class SourceFile:
  """One input file: where it is and what its content hashed to."""

  root: str  # The folder the relative path is relative to.
  relative_path: str
  sha256: str
  num_bytes: int
  # Whether it starts with a UTF-8 byte-order mark, which read_text drops: such a file's
  # builds are named apart from those made before BOMs were dropped (make_config).
  has_bom: bool = False

  @property
  def path(self) -> str:
    return os.path.join(self.root, self.relative_path)


class LocalFilesConfig(tfds.core.BuilderConfig):
  """A builder config made for one set of files; its name hashes their content.

  Not a dataclass field list on purpose (like `python_stdlib`): TFDS logs the
  config's repr, which then stays one line however many files there are.
  """

  def __init__(self, *, source_path: str, files: Sequence[SourceFile],
               options: dict[str, Any], layout: dict[str, Any], **kwargs):
    super().__init__(**kwargs)
    self.source_path = source_path
    self.files = tuple(files)
    self.options = dict(options)  # Hashed: these change the output.
    self.layout = dict(layout)  # Derived from files and options, so not hashed again.
    self._by_path = {f.relative_path: f for f in self.files}

  def file(self, relative_path: str) -> SourceFile:
    """The input file with this relative path."""
    return self._by_path[relative_path]


class LocalFilesBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the `local_*` builders: DatasetInfo with provenance, examples kept in order."""

  VERSION = tfds.core.Version("1.0.0")

  def _features(self) -> dict[str, tfds.features.FeatureConnector]:
    raise NotImplementedError

  def _info(self) -> tfds.core.DatasetInfo:
    config = self.builder_config
    return tfds.core.DatasetInfo(
        builder=self,
        description=type(self).__doc__,
        features=tfds.features.FeaturesDict(self._features()),
        metadata=tfds.core.MetadataDict(
            source_path=config.source_path,
            options=config.options,
            files=[{"path": f.relative_path, "sha256": f.sha256, "bytes": f.num_bytes}
                   for f in config.files],
            splits={}),  # Filled with counts while building.
        # Examples stay in file order (keys are running indices), so example i of a
        # split is the i-th block / line / row; readers shuffle, the files need not.
        disable_shuffling=True,
    )

  def _record_split(self, split: str, counts: dict[str, Any]) -> None:
    """Logs a built split's counts and keeps them in the DatasetInfo metadata."""
    self.info.metadata["splits"][split] = counts
    logging.info("%s: split %r: %s", self.name, split,
                 ", ".join(f"{k}={v}" for k, v in counts.items()))


def check_options(data: ml_collections.ConfigDict) -> None:
  """Raises ConfigError unless `data.decode_errors` is a known policy."""
  if data.decode_errors not in DECODE_ERRORS:
    raise ConfigError(f"config.data.decode_errors={data.decode_errors!r} is invalid: "
                      f"valid values are {', '.join(map(repr, DECODE_ERRORS))}.")


def require_path(data: ml_collections.ConfigDict, dataset: str, kinds: str,
                 expected: str) -> str:
  """Checks `data.path` and returns it as an absolute path.

  Args:
    data: the `config.data` ConfigDict.
    dataset: the dataset name, for messages.
    kinds: what is accepted: "file", "dir" or "file_or_dir".
    expected: what the builder wants there, in words, for messages.

  Returns:
    The absolute, normalised path.

  Raises:
    ConfigError: the path is empty, missing, or of the wrong kind.
  """
  prefix = f"config.data.path={data.path!r} is invalid: {dataset} needs {expected}"
  if not data.path:
    raise ConfigError(f"{prefix}; set config.data.path.")
  path = os.path.abspath(os.path.expanduser(data.path))
  if not os.path.exists(path):
    raise ConfigError(f"{prefix}, but there is no such file or folder.")
  if os.path.isdir(path) and "dir" not in kinds:
    raise ConfigError(f"{prefix}, not a folder.")
  if not os.path.isdir(path) and "file" not in kinds:
    raise ConfigError(f"{prefix}, not a file.")
  return path


def list_files(root: str, recursive: bool) -> list[str]:
  """Relative paths of the files under `root`, sorted, hidden files and folders left out."""
  if not recursive:
    return sorted(name for name in os.listdir(root)
                  if not name.startswith(".") and os.path.isfile(os.path.join(root, name)))
  paths = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
    paths.extend(os.path.relpath(os.path.join(directory, name), root)
                 for name in names if not name.startswith("."))
  return sorted(paths)


def hash_files(root: str, relative_paths: Sequence[str]) -> list[SourceFile]:
  """Reads every file once and returns it with its sha256 and size."""
  files = []
  for relative in relative_paths:
    with open(os.path.join(root, relative), "rb") as f:
      raw = f.read()
    files.append(SourceFile(root, relative, hashlib.sha256(raw).hexdigest(), len(raw),
                            raw.startswith(UTF8_BOM.encode("utf-8"))))
  return files


def make_config(source_path: str, version: tfds.core.Version, files: Sequence[SourceFile],
                options: dict[str, Any], layout: dict[str, Any]) -> LocalFilesConfig:
  """Names a config `<slug>_<12 hex>` after the path, the version, the options and the files.

  Args:
    source_path: the absolute `data.path`; its basename gives the readable slug.
    version: the builder's VERSION (a new version never reuses an old build).
    files: every input file with its content hash.
    options: the settings that change the output (hashed, and kept in the metadata).
    layout: what the builder derived from the files (split assignment, labels, ...).

  Returns:
    The builder config.
  """
  fingerprint = json.dumps({
      "version": str(version),
      "options": options,
      # A BOM file's entry says so: its older builds kept the mark as text. Other files'
      # names, and so every existing build, are unchanged.
      "files": [[f.relative_path, f.sha256] + (["bom dropped"] if f.has_bom else [])
                for f in files],
  }, sort_keys=True)
  digest = hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:12]
  slug = re.sub(r"[^a-z0-9]+", "_", os.path.basename(source_path).lower()).strip("_")
  return LocalFilesConfig(
      name=f"{slug or 'data'}_{digest}", description=f"Built from {source_path}",
      source_path=source_path, files=files, options=options, layout=layout)


def split_for_stem(stem: str, path: str) -> str | None:
  """The split a `<stem>.<ext>` file belongs to: train, validation, test* or None.

  Raises:
    ConfigError: a `test*` stem that is not a valid TFDS split name.
  """
  lower = stem.lower()
  if lower == "train":
    return "train"
  if lower in _VALIDATION_STEMS:
    return "validation"
  if lower.startswith("test"):
    if not _SPLIT_NAME.fullmatch(stem):
      raise ConfigError(f"{path}: the file's stem {stem!r} would be the split name, but "
                        "split names may hold only letters, digits and '_'; rename it "
                        "(e.g. test_2016).")
    return stem
  return None


def read_text(source: SourceFile, decode_errors: str) -> str:
  """Reads a file as UTF-8, checking it is the content that was hashed.

  Args:
    source: the file and the sha256 its config was named after.
    decode_errors: "strict" (raise on undecodable bytes) or "replace" (U+FFFD, logged).

  Returns:
    The decoded text, without a leading byte-order mark (strip_bom).

  Raises:
    DataError: the file changed since it was hashed, or (strict) it is not UTF-8.
  """
  with open(source.path, "rb") as f:
    raw = f.read()
  if hashlib.sha256(raw).hexdigest() != source.sha256:
    raise DataError(f"{source.path}: the file changed while the dataset was being "
                    "built; build again once it no longer changes.")
  key = (source.path, source.sha256)
  # UTF-16 / UTF-32, compressed or binary data: refused whatever decode_errors says.
  wrong = text_encoding.problem(raw, source.path, first=True)
  if wrong:
    raise DataError(wrong)
  try:
    return strip_bom(raw.decode("utf-8"), source.path, _BOMS_LOGGED, key)
  except UnicodeDecodeError:
    pass  # Fall through to count and locate every undecodable byte.
  text, num_bad, first = _decode_replacing(raw)
  text = strip_bom(text, source.path, _BOMS_LOGGED, key)
  line = raw.count(b"\n", 0, first) + 1
  if decode_errors == "strict":
    raise DataError(
        f"{source.path}:{line}: undecodable UTF-8 at byte offset {first} (0-based, from "
        f"the start of the file); the file has {num_bad} undecodable bytes in total. "
        f"Valid is UTF-8 text: {text_encoding.legacy_hint(source.path)}, or set "
        "config.data.decode_errors='replace' to read them as U+FFFD (counted).")
  if key not in _REPLACEMENTS_LOGGED:
    _REPLACEMENTS_LOGGED.add(key)
    logging.warning("%s: %d undecodable bytes decoded as U+FFFD (first at line %d, byte "
                    "offset %d)", source.path, num_bad, line, first)
  return text


def _decode_replacing(raw: bytes) -> tuple[str, int, int]:
  """Decodes like errors="replace"; also returns the bad-byte count and the first offset."""
  view, pieces, num_bad, first, start = memoryview(raw), [], 0, -1, 0
  while True:
    try:
      pieces.append(codecs.utf_8_decode(view[start:], "strict", True)[0])
      return "".join(pieces), num_bad, first
    except UnicodeDecodeError as e:
      # Decoding stopped at e.start; keep what came before, replace the bad bytes.
      pieces.append(codecs.utf_8_decode(view[start:start + e.start], "strict", True)[0])
      pieces.append("\ufffd")
      first = start + e.start if first < 0 else first
      num_bad += e.end - e.start
      start += e.end


def lines_with_newlines(text: str) -> list[str]:
  """Splits on "\\n" only (unlike str.splitlines, which also splits on \\f, \\x1c, ...).

  Each line keeps its "\\n", so "".join(lines) == text, and line i is line i + 1 of
  `wc -l` / an editor.
  """
  pieces = text.split("\n")
  lines = [piece + "\n" for piece in pieces[:-1]]
  if pieces[-1]:
    lines.append(pieces[-1])  # A last line without a newline.
  return lines


def strip_newline(line: str) -> str:
  """Removes the line's "\\n" (and the "\\r" of a CRLF file), nothing else."""
  line = line[:-1] if line.endswith("\n") else line
  return line[:-1] if line.endswith("\r") else line


class DropLog:
  """Counts what a builder leaves out and remembers where, so nothing goes silently."""

  def __init__(self, what: str):
    self.what = what
    self.count = 0
    self.locations: list[str] = []

  def add(self, location: str) -> None:
    self.count += 1
    if len(self.locations) < _LOCATIONS_LOGGED:
      self.locations.append(location)

  def log(self, dataset: str, split: str) -> None:
    if self.count:
      logging.warning("%s: split %r: dropped %d %s; first at %s", dataset, split,
                      self.count, self.what, ", ".join(self.locations))


def first_locations(items: Sequence[str]) -> str:
  """Joins the first few of many locations for a message."""
  more = f" and {len(items) - _LOCATIONS_LOGGED} more" if len(items) > _LOCATIONS_LOGGED else ""
  return ", ".join(items[:_LOCATIONS_LOGGED]) + more
