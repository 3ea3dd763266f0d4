"""A prepared corpus (`data.name="corpus"`): where it lives, its manifest, and its reader.

`--mode=prepare` (cli/prepare.py, data/corpus/preparation.py) tokenizes the files at
`data.path` once into array_record shards of token ids; training reads them here by
random access and never runs a tokenizer. docs/corpus.md has the on-disk format:

  <data_dir>/corpus/<stem>-<sources_key>/                 keyed by the sources
      <vocabulary file>                                    a trained vocabulary, if any
      <tokenizer_key>/manifest.json                        written last: present = complete
      <tokenizer_key>/tasks/<task>.json                    one source file's shards, done
      <tokenizer_key>/<split>/<task>.array_record          one record per document piece
      <tokenizer_key>/<split>/<task>.index.npy             [records + 1, 2] uint64

Opening a corpus reads manifest.json and memory-maps the small index files: the time
to the first batch does not grow with the corpus.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import threading
from typing import Any, Sequence

import numpy as np

from transformer.config.data import CORPUS_SPLITS
from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies

FORMAT = "transformer-corpus/1"
SPLITS = CORPUS_SPLITS  # ("train", "validation"): declared beside the config's checks.
MANIFEST = "manifest.json"
TASKS = "tasks"
STARTS, ENDS = 1, 2  # Index flags: the record starts / ends a document.
PIECE_CHARS = 1 << 20  # Longer documents are tokenized in pieces cut at a newline.
RECORD_OPTIONS = "group_size:1,uncompressed"  # One record per chunk: cheap random reads.


def default_data_dir() -> str:
  """Where prepared data goes when data.data_dir is "" (as TFDS: $TFDS_DATA_DIR or ~)."""
  return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def sources_key(data: Any) -> str:
  """The folder of a corpus's sources: `<stem>-<12 hex>` of what decides its documents."""
  path = os.path.abspath(os.path.expanduser(data.path))
  identity = json.dumps([FORMAT, path, data.text_key, float(data.val_fraction), PIECE_CHARS])
  stem = os.path.basename(path.rstrip("/*").rstrip(os.sep)) or "corpus"
  stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:40]
  return f"{stem}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


def sources_folder(data: Any) -> str:
  """<data_dir>/corpus/<stem>-<sources_key>: the corpus's vocabulary and prepared ids."""
  return os.path.join(os.path.expanduser(data.data_dir or default_data_dir()), "corpus",
                      sources_key(data))


def tokenizer_key(record: dict[str, Any]) -> str:
  """The folder of a tokenizer's ids: its kind, and for a vocabulary file its sha256."""
  kind = record["kind"]
  if kind == "bytes":
    return "bytes"
  return f"{kind}-v{record['vocab_size']}-{str(record.get('sha256', ''))[:8]}"


def id_dtype(vocab_size: int) -> np.dtype:
  """uint16 below 65,536 ids, else uint32."""
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def file_digest(path: str) -> str:
  """sha256 of a file, read in 4 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()


def prepare_command() -> str:
  """The command that prepares the corpus a config names (for error messages)."""
  return "python launch.py --mode=prepare --config=<this config, with the same overrides>"


def file_change(saved: dict[str, Any], root: str, *, by_content: bool = False) -> str | None:
  """How source file `saved["path"]` under `root` differs from `saved` (its entry in a
  task json or the manifest: bytes, mtime_ns, sha256), or None: the one rule of every
  check of a prepared file.

  The size first. Then, `by_content` (--mode=prepare, before it calls a file done): the
  sha256 of the whole file, always (on an AMD EPYC, 2 cores shared with other jobs,
  3.5-4.4 s a GB: docs/corpus.md), so bytes changed under a kept size and mtime
  (`touch -d` back) are seen. Otherwise (training's check at start): the mtime, and a
  file whose mtime alone differs is hashed again, so a copy, a `touch` or another
  host's copy of the same bytes is no change; it reads no file when size and mtime are
  as recorded, so it cannot see an edit that restored both.
  """
  name = saved["path"]
  stat = os.stat(os.path.join(root, name))
  if stat.st_size != saved["bytes"]:
    return f"{name} changed: {saved['bytes']} bytes when prepared, {stat.st_size} now"
  if (by_content or stat.st_mtime_ns != saved["mtime_ns"]) and \
      file_digest(os.path.join(root, name)) != saved["sha256"]:
    return f"{name} changed: its content (sha256) differs from when it was prepared"
  return None


def sources_change(manifest: dict[str, Any], root: str, names: list[str]) -> str | None:
  """What changed in the source files since `manifest` was prepared, or None: files
  added or removed, else the first `file_change`."""
  recorded = {f["path"]: f for f in manifest["sources"]["files"]}
  added, removed = sorted(set(names) - set(recorded)), sorted(set(recorded) - set(names))
  if added or removed:
    return (f"files added: {added[:3] or 'none'}, removed: {removed[:3] or 'none'}"
            + (" (and more)" if len(added) > 3 or len(removed) > 3 else ""))
  return next((change for change in (file_change(recorded[name], root) for name in names)
               if change), None)


def tokenizer_change(manifest: dict[str, Any], record: dict[str, Any]) -> str | None:
  """How the tokenizer `record` (run_vocabulary.tokenizer_record) differs from the manifest's."""
  saved = manifest["tokenizer"]
  for key in ("kind", "vocab_size", "sha256"):
    if saved.get(key) != record.get(key):
      return f"tokenizer {key}: {saved.get(key)!r} when prepared, {record.get(key)!r} now"
  return None


def split_counts(manifest: dict[str, Any]) -> str:
  """'train 3 documents, 1,204 tokens; validation 0 documents, 0 tokens'."""
  return "; ".join(f"{split} {info['documents']:,} documents, {info['tokens']:,} tokens"
                   for split, info in manifest["splits"].items())


def empty_split(manifest: dict[str, Any], folder: str) -> str | None:
  """Why a prepared corpus cannot train and evaluate: a split with no tokens (a corpus
  of one .txt, which is one document, or of fewer documents than 1 / val_fraction);
  None when every split has some. The text names the split, the counts and the fix."""
  empty = [split for split in SPLITS if not manifest["splits"][split]["tokens"]]
  if not empty:
    return None
  fraction = manifest["split_rule"]["val_fraction"]
  files = len(manifest["sources"]["files"])
  fix = ("raise config.data.val_fraction (each document goes to validation with that "
         "probability, by a hash of its start) or give the corpus more documents"
         if "validation" in empty else "lower config.data.val_fraction or give the "
         "corpus more documents")
  return (f"the {' and '.join(empty)} split of the prepared corpus {folder} has 0 tokens "
          f"({split_counts(manifest)}; {files} source file(s), "
          f"config.data.val_fraction={fraction}), so a run would fail at its first "
          f"{'evaluation' if 'validation' in empty else 'step'}; {fix} (a .txt file is "
          "one document: split it into several files or .jsonl records)")


# array_record's own minimum: a complete file (even one of 0 records) is at least this
# big; a smaller one is cut short, and reading it fails ("should be at least 64KB big").
_MIN_SHARD_BYTES = 1 << 16


def shard_problem(folder: str, split: str, task: str, records: int) -> str | None:
  """Why `<split>/<task>`'s shard files in `folder` are not the complete shard of
  `records` records a task json or the manifest lists, or None: a file missing, an
  .array_record under array_record's 64 KiB minimum (cut short, or 0 bytes), an index
  whose rows are not records + 1. Stats and the index's header; no record is read."""
  base = os.path.join(folder, split, task)
  for suffix in (".array_record", ".index.npy"):
    if not os.path.exists(base + suffix):
      return f"{base + suffix} is missing"
  size = os.path.getsize(base + ".array_record")
  if size < _MIN_SHARD_BYTES:
    return (f"{base}.array_record is {size} bytes, under array_record's minimum of "
            f"{_MIN_SHARD_BYTES} (cut short)")
  try:
    rows = np.load(base + ".index.npy", mmap_mode="r").shape[0]
  except (ValueError, OSError) as e:
    return f"{base}.index.npy does not read ({e})"
  if rows != records + 1:
    return f"{base}.index.npy has {rows} rows, {records + 1} expected"
  return None


def missing_shards(manifest: dict[str, Any], folder: str) -> list[str]:
  """Why each shard the manifest lists is not complete in `folder` (deleted, not copied
  whole, cut short): `shard_problem`'s line for each; empty when all are whole."""
  return [problem for split in SPLITS for shard in manifest["splits"][split]["shards"]
          if shard["records"]
          for problem in [shard_problem(folder, split, shard["task"], shard["records"])]
          if problem]


class CorpusSplit:
  """One split of a prepared corpus: a grain random-access source of document pieces.

  `split[i]` is `{"tokens": int32 [bos] ids [eos]}` (bos where the record starts a
  document, eos where it ends one, as `lm.Tokenize` gives for text), so the packed LM
  pipeline reads it unchanged. Records are numbered across the shards in task order.
  """

  def __init__(self, folder: str, name: str, info: dict[str, Any], dtype: np.dtype):
    self.name, self._folder, self._dtype = name, folder, dtype
    self._shards = [s for s in info["shards"] if s["records"]]
    self._first = np.cumsum([0] + [s["records"] for s in self._shards]).tolist()
    self._first_token = np.cumsum([0] + [s["tokens"] for s in self._shards]).tolist()
    self.num_tokens = int(info["tokens"])
    self._readers: list[Any] = [None] * len(self._shards)
    self._indices: list[Any] = [None] * len(self._shards)
    # grain's reader threads share one (thread-safe) array_record reader per shard, as
    # its ArrayRecordDataSource does; the lock only makes each reader open once.
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return self._first[-1]

  def __getstate__(self):  # grain may pickle sources; readers reopen lazily.
    state = dict(self.__dict__)
    state["_readers"] = [None] * len(self._shards)
    state["_indices"] = [None] * len(self._shards)
    del state["_lock"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def _path(self, shard: int, suffix: str) -> str:
    return os.path.join(self._folder, self.name, self._shards[shard]["task"] + suffix)

  def _index(self, shard: int) -> np.ndarray:
    if self._indices[shard] is None:
      with self._lock:
        if self._indices[shard] is None:
          # A plain array over the mapped file: np.memmap's indexing costs more a call.
          self._indices[shard] = np.load(self._path(shard, ".index.npy"),
                                         mmap_mode="r").view(np.ndarray)
    return self._indices[shard]

  def _reader(self, shard: int) -> Any:
    if self._readers[shard] is None:
      from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
      with self._lock:
        if self._readers[shard] is None:
          self._readers[shard] = array_record_module.ArrayRecordReader(
              self._path(shard, ".array_record"), "readahead_buffer_size:0")
    return self._readers[shard]

  def _locate(self, index: int) -> tuple[int, int]:
    if not 0 <= index < len(self):
      raise IndexError(f"record {index} of the {self.name} split ({len(self)} records)")
    shard = bisect.bisect_right(self._first, index) - 1
    return shard, index - self._first[shard]

  def _block(self, where: Sequence[tuple[int, int]]) -> tuple[np.ndarray, list[int], list[int]]:
    """The records at (shard, local) positions, each as `split[i]["tokens"]`, end to end.

    Returns the int32 tokens, the records' bounds in them ([0, ..., len(tokens)]) and
    their STARTS | ENDS flags. The ids of all the records are decoded by one
    np.frombuffer; per record only its read and one slice copy are left (array_record's
    `read(list)` is slower for scattered records: it starts a parallel read per call).
    """
    raw = [self._reader(shard).read([local])[0] for shard, local in where]
    flags = [int(self._index(shard)[local, 1]) for shard, local in where]
    ids = np.frombuffer(b"".join(raw), dtype=self._dtype)
    lengths = [len(r) // self._dtype.itemsize for r in raw]
    bounds = [0]
    for length, flag in zip(lengths, flags):
      bounds.append(bounds[-1] + length + bool(flag & STARTS) + bool(flag & ENDS))
    tokens = np.empty(bounds[-1], np.int32)
    taken = 0  # ids copied so far
    for length, flag, first, end in zip(lengths, flags, bounds, bounds[1:]):
      if flag & STARTS:
        tokens[first], first = vocabularies.BOS_ID, first + 1
      if flag & ENDS:
        tokens[end - 1], end = vocabularies.EOS_ID, end - 1
      tokens[first:end] = ids[taken:taken + length]
      taken += length
    return tokens, bounds, flags

  def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """`[split[i] for i in indices]`, read as one block (data/corpus/packer.py's reader
    threads read a block of shuffled records a call); the tokens are views of one array."""
    tokens, bounds, _ = self._block([self._locate(int(i)) for i in indices])
    return [{"tokens": tokens[a:b]} for a, b in zip(bounds, bounds[1:])]

  def flags(self, index: int) -> int:
    """STARTS | ENDS bits of record `index`."""
    shard, local = self._locate(index)
    return int(self._index(shard)[local, 1])

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return self.__getitems__([index])[0]

  def window(self, start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """`length` tokens of the split's stream from token `start`: (int32 ids, document ids).

    The stream is the records in order, each with its bos / eos (`split[i]`); the
    document ids number the documents the window touches from 0 (a record that starts
    a document starts a new one), from which a caller derives segment ids and positions.
    The records it covers are found in the index and read as one block.
    """
    if not 0 <= start <= self.num_tokens - length:
      raise IndexError(f"window [{start}, {start + length}) is outside the {self.name} "
                       f"split's {self.num_tokens} tokens")
    shard = bisect.bisect_right(self._first_token, start) - 1
    offsets = self._index(shard)[:, 0]
    local = int(np.searchsorted(offsets, start - self._first_token[shard], side="right")) - 1
    skip = start - self._first_token[shard] - int(offsets[local])
    where, covered = [], -skip  # The records the window covers; their tokens in it.
    while covered < length:
      if local == self._shards[shard]["records"]:
        shard, local = shard + 1, 0
        offsets = self._index(shard)[:, 0]
        continue
      where.append((shard, local))
      covered += int(offsets[local + 1] - offsets[local])
      local += 1
    tokens, bounds, flags = self._block(where)
    docs, doc = np.empty(len(tokens), np.int32), 0
    for i, (first, end) in enumerate(zip(bounds, bounds[1:])):
      # The first record is document 0 whatever its flags; a later one that starts a
      # document starts the next.
      doc += bool(i and flags[i] & STARTS)
      docs[first:end] = doc
    return tokens[skip:skip + length], docs[skip:skip + length]


class PreparedCorpus:
  """A prepared corpus folder (`<sources>/<tokenizer_key>`), opened by its manifest."""

  def __init__(self, folder: str, manifest: dict[str, Any]):
    self.folder, self.manifest = folder, manifest
    self.dtype = np.dtype(manifest["dtype"])

  @classmethod
  def open(cls, folder: str) -> "PreparedCorpus":
    """Reads `folder`/manifest.json; ConfigError when it is missing or of another format."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
      raise ConfigError(f"{folder} is not a prepared corpus (no {MANIFEST}): run "
                        f"`{prepare_command()}`")
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
    if manifest.get("format") != FORMAT:
      raise ConfigError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}; "
                        f"prepare it again with `{prepare_command()}`")
    return cls(folder, manifest)

  @property
  def tokenizer_record(self) -> dict[str, Any]:
    """The identity of the tokenizer the ids were made with."""
    return self.manifest["tokenizer"]

  def split(self, name: str) -> CorpusSplit:
    """The `train` or `validation` split."""
    if name not in self.manifest["splits"]:
      raise ConfigError(f"split {name!r} is not in the prepared corpus {self.folder}; "
                        f"valid: {sorted(self.manifest['splits'])}")
    return CorpusSplit(self.folder, name, self.manifest["splits"][name], self.dtype)

  def record(self) -> dict[str, Any]:
    """The run's data identity (dataset.json): the corpus and each file's sha256."""
    return {"name": f"corpus/{os.path.basename(os.path.dirname(self.folder))}/"
                    f"{os.path.basename(self.folder)}",
            "files": {f["path"]: f["sha256"] for f in self.manifest["sources"]["files"]},
            "source_path": self.manifest["sources"]["path"]}
