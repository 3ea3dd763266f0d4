"""Reading a corpus source file as documents, streamed, with bad records said in one line.

  .txt                    the whole file is one document, read 1 MiB at a time
  .jsonl / .gz / .zst     one JSON object a line; `text_key` holds the document
  .parquet                one row a document, column `text_key`, a row group at a time

A file cut short or damaged is a DataError naming it ("damaged compressed file", "not a
readable parquet file", "ends inside a record"), whatever data.bad_records says: it is
the file that is wrong, not a record to skip. A .gz or .zst stream that ends inside its
last frame, a frame that does not decode, a parquet footer or row group that does not
read, and a .jsonl whose last line is cut (no newline, not JSON) are each refused; every
frame of a multi-frame .zst (pzstd, concatenated files) is read, not only the first.

`reader(path, ...).documents()` yields each document as an iterator of pieces of at most about
store.PIECE_CHARS characters, cut after a newline where there is one, so memory stays
bounded whatever a file or a document holds. A reader may read a part of its file (a
byte range of a .txt or .jsonl, a range of parquet row groups: `Format.pieces` says how a
format divides, data/corpus/pieces.py plans the parts): the parts' documents and pieces,
one after the other, are exactly the whole file's. A .txt is cut at fixed windows of
store.PIECE_CHARS bytes (after the window's last newline), so a part that begins at a
window's edge cuts its text where the whole file's reading does. A malformed record (a line that is not a
JSON object with a string `text_key`, a null parquet value, a parquet file without the
column, an empty file) stops with a DataError naming the file and the line or row group,
or is skipped and counted with `bad_records="skip"`. Undecodable UTF-8 follows
`data.decode_errors` as the local datasets do: stop saying where, or U+FFFD (counted).
Bytes that are plainly not UTF-8 text (UTF-16 / UTF-32 with or without a byte-order
mark, gzip under a .txt name, NUL bytes) stop whatever it says (data/text_encoding.py).
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import os
import stat
import zlib
from typing import IO, Callable, Iterator

from absl import logging

from transformer.config.errors import ConfigError, DataError
from transformer.data import text_encoding
from transformer.data.corpus import store

_SKIP_HINT = "set config.data.bad_records='skip' to skip such records (counted)"


@dataclasses.dataclass
class ReadStats:
  """What reading a file met besides documents (summed into the manifest)."""

  skipped_records: int = 0
  replaced_characters: int = 0
  empty_documents: int = 0


def cut(text: str, limit: int = 0) -> Iterator[str]:
  """`text` in pieces of at most `limit` (0: store.PIECE_CHARS) characters, each ending
  after a newline if it can."""
  limit = limit or store.PIECE_CHARS
  start = 0
  while len(text) - start > limit:
    end = text.rfind("\n", start, start + limit) + 1 or start + limit
    yield text[start:end]
    start = end
  if start < len(text):
    yield text[start:]


class _Reader:
  """One file's records; `bad` stops or counts, `decode` follows data.decode_errors."""

  def __init__(self, path: str, name: str, text_key: str, decode_errors: str,
               bad_records: str, stats: ReadStats, span: tuple[int, int] | None = None):
    self.path, self.name, self.text_key = path, name, text_key
    self.decode_errors, self.bad_records, self.stats = decode_errors, bad_records, stats
    self.span = span  # (start, end): bytes (.txt, .jsonl) or row groups (.parquet); None: all.
    # A .txt part inside its one document: whether the document began before the part
    # (its first piece, which decides the split, is then `head`) and goes on after it.
    self.continues_before, self.continues_after, self.head = False, False, ""
    self._raw: IO[bytes] | None = None  # The file as stored, for the bytes read so far.
    self._decoded = False  # Whether decode() has seen this reader's first bytes.
    self._start = 0  # Where in the stored file this part's bytes begin.
    self._parquet_done = 0

  def position(self) -> int:
    """Bytes of the stored (maybe compressed) file read so far (of this part): the
    progress line's MB/s."""
    if self._raw is not None and not self._raw.closed:
      return max(self._raw.tell() - self._start, 0)
    return self._parquet_done

  def bad(self, where: str, what: str) -> None:
    """A malformed record: DataError (stop) or one more skipped (skip)."""
    if self.bad_records == "stop":
      raise DataError(f"{self.path}, {where}: {what}; {_SKIP_HINT}")
    self.stats.skipped_records += 1

  def decode(self, data: bytes, where: str) -> str:
    # UTF-16 / UTF-32, compressed or binary data: refused whatever data.decode_errors says
    # (read as UTF-8 it would be a NUL every other token, or noise).
    # Byte-order marks and magic numbers only at the file's start (part 0, or the whole
    # file); a later part's NUL bytes are still found.
    wrong = text_encoding.problem(data, self.path,
                                  first=not self._decoded and self._start == 0)
    self._decoded = True
    if wrong:
      raise DataError(wrong)
    try:
      return data.decode("utf-8")
    except UnicodeDecodeError as e:
      if self.decode_errors == "strict":
        raise DataError(f"{self.path}, {where}: undecodable UTF-8 at byte {e.start} "
                        f"({data[e.start:e.start + 4]!r}); "
                        f"{text_encoding.legacy_hint(self.path)}, or set "
                        "config.data.decode_errors='replace' to read such bytes as U+FFFD "
                        "(counted)") from None
      text = data.decode("utf-8", errors="replace")
      self.stats.replaced_characters += text.count("\ufffd") - data.count(
          "\ufffd".encode())
      return text

  def documents(self) -> Iterator[Iterator[str]]:
    # A regular file only: a FIFO or device reports 0 bytes and is read as it streams.
    if os.path.isfile(self.path) and not stat.S_ISFIFO(os.stat(self.path).st_mode) and (
        os.path.getsize(self.path) == 0):
      self.bad("the whole file", "the file is empty (0 bytes)")
      return
    yield from format_of(self.name).documents(self)

  def _text(self) -> Iterator[str]:
    """The pieces between window cuts `text_cut(k)`; a part [start, end) of whole windows
    yields those of its windows (and says where its document began and ends)."""
    size, window = os.path.getsize(self.path), store.PIECE_CHARS
    start, end = self.span or (0, size)
    with open(self.path, "rb") as f:
      self._raw, self._start = f, start
      first, last = start // window, -(-min(end, size) // window)
      position = _text_cut(f, first, size)
      if first > 0:  # The document's first piece decides its split: read it, uncounted.
        self.continues_before = True
        self.head = _quiet_decode(_read_at(f, 0, _text_cut(f, 1, size)))
      self.continues_after = last * window < size
      for k in range(first + 1, last + 1):
        cut_at = _text_cut(f, k, size)
        yield self.decode(_read_at(f, position, cut_at - position), f"byte {position}")
        position = cut_at

  def _jsonl(self, decompress: Callable[[IO[bytes]], IO[bytes]]) -> Iterator[Iterator[str]]:
    """One JSON object a line, the stored bytes read through `decompress`."""
    self._raw = open(self.path, "rb")  # pylint: disable=consider-using-with
    start, end = self.span or (0, None)
    if start:  # A part: its lines are those that begin in [start, end).
      self._raw.seek(start - 1)
      self._raw.readline()  # The end of a line that began before `start` (maybe only its \n).
      self._start = start
    position = self._raw.tell()
    try:
      with decompress(self._raw) as f, self._raw:
        for number, line in enumerate(f, 1):
          if end is not None and position >= end:
            break
          line_start, position = position, position + len(line)
          if not line.strip():
            continue
          # Line numbers count from the file's start; a later part does not know them.
          where = f"line {number}" if not start else f"the line at byte {line_start}"
          try:
            record = json.loads(self.decode(line, where))
          except json.JSONDecodeError as e:
            if not line.endswith(b"\n"):
              # The last line, cut: a file copied or written only in part, never a record
              # to skip (data.bad_records='skip' would train on what is left, silently).
              raise DataError(f"{self.path}: ends inside a record ({where} has no "
                              f"newline and is not JSON: {e.msg}); the file is truncated: "
                              "copy or download it again") from None
            self.bad(where, f"malformed JSON ({e.msg} at column {e.colno})")
            continue
          if not isinstance(record, dict) or not isinstance(record.get(self.text_key), str):
            what = (f"no string field {self.text_key!r} (config.data.text_key; its fields: "
                    f"{sorted(record)[:10]})" if isinstance(record, dict)
                    else f"a JSON {type(record).__name__}, not an object")
            self.bad(where, what)
            continue
          yield cut(record[self.text_key])
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # A truncated or damaged .gz, .zst.
      raise DataError(f"{self.path}: damaged compressed file ({e})") from None
    except Exception as e:  # zstandard.ZstdError is not an OSError.
      if type(e).__name__ == "ZstdError":
        raise DataError(f"{self.path}: damaged compressed file ({e})") from None
      raise

  def _parquet(self) -> Iterator[Iterator[str]]:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    try:
      parquet = pq.ParquetFile(self.path)
    except Exception as e:  # pylint: disable=broad-except  (pyarrow.ArrowInvalid and kin)
      raise DataError(f"{self.path}: not a readable parquet file ({e})") from None
    names = parquet.schema_arrow.names
    if self.text_key not in names:
      if self.bad_records == "stop":
        raise DataError(f"{self.path}: no column {self.text_key!r} (config.data.text_key; "
                        f"its columns: {names[:10]}); {_SKIP_HINT}")
      self.stats.skipped_records += parquet.metadata.num_rows
      return
    groups = range(*(self.span or (0, parquet.num_row_groups)))
    for group in groups:
      try:
        column = parquet.read_row_group(group, columns=[self.text_key]).column(0)
      except Exception as e:  # pylint: disable=broad-except  (ArrowInvalid, OSError, ...)
        raise DataError(f"{self.path}: not a readable parquet file (row group {group} of "
                        f"{parquet.num_row_groups}: {str(e).splitlines()[0]}); copy or "
                        "download it again") from None
      for row, value in enumerate(column.to_pylist()):
        if isinstance(value, bytes):
          value = self.decode(value, f"row group {group} row {row}")
        if not isinstance(value, str):
          self.bad(f"row group {group} row {row}",
                   f"column {self.text_key!r} holds {type(value).__name__}, not text")
          continue
        yield cut(value)
      self._parquet_done = (os.path.getsize(self.path) * (group + 1 - groups.start)
                            // parquet.num_row_groups)


class _ZstdFrames(io.RawIOBase):
  """A .zst file decompressed, every frame of it; EOFError when it ends inside a frame.

  zstandard's stream_reader stops after the first frame and says nothing when the file
  ends inside one (a truncated copy then read as a shorter file, its cut last line as a
  "malformed" record); gzip raises EOFError for the same, and so does this.
  """

  _CHUNK = 1 << 16  # Compressed bytes a read takes: its output stays a few MiB.

  def __init__(self, raw: IO[bytes]):
    super().__init__()
    import zstandard  # pylint: disable=g-import-not-at-top
    self._raw, self._make = raw, zstandard.ZstdDecompressor
    self._frame = self._make().decompressobj()
    self._inside = False  # Whether the current frame has begun and not ended.
    self._out = b""

  def readable(self) -> bool:
    return True

  def _feed(self, data: bytes) -> None:
    self._out = self._frame.decompress(data)
    self._inside = not self._frame.eof
    while self._frame.eof and self._frame.unused_data:  # The next frame's first bytes.
      rest = self._frame.unused_data
      self._frame = self._make().decompressobj()
      self._out += self._frame.decompress(rest)
      self._inside = not self._frame.eof
    if self._frame.eof:
      self._frame = self._make().decompressobj()

  def readinto(self, buffer) -> int:
    while not self._out:
      data = self._raw.read(self._CHUNK)
      if not data:
        if self._inside:
          raise EOFError("the file ends inside a zstd frame: it is truncated")
        return 0
      self._feed(data)
    count = min(len(buffer), len(self._out))
    buffer[:count] = self._out[:count]
    self._out = self._out[count:]
    return count


def _read_at(f: IO[bytes], offset: int, count: int) -> bytes:
  f.seek(offset)
  return f.read(count)


def _text_cut(f: IO[bytes], k: int, size: int) -> int:
  """Where a .txt's k-th piece ends: after the last newline of window k ([(k-1)W, kW),
  W = store.PIECE_CHARS), else at kW backed off to a whole UTF-8 character; 0 for k = 0
  and the file's size past its end. A function of window k alone, so any part that
  begins at a window's edge finds the cuts the whole file's reading makes."""
  window = store.PIECE_CHARS
  if k <= 0 or k * window >= size:
    return 0 if k <= 0 else size
  data = _read_at(f, (k - 1) * window, window)
  newline = data.rfind(b"\n")
  return (k - 1) * window + (newline + 1 if newline >= 0 else window - _partial_utf8(data))


def _quiet_decode(data: bytes) -> str:
  """A piece decoded for its hash only (its errors are said and counted where it is read)."""
  return data.decode("utf-8", errors="replace")


def _partial_utf8(data: bytes) -> int:
  """How many bytes at the end of `data` begin a UTF-8 character not yet complete."""
  for back in range(1, min(4, len(data)) + 1):
    byte = data[-back]
    if byte & 0xC0 != 0x80:  # A lead byte (or ASCII): is its character complete?
      need = 1 if byte < 0x80 else 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4
      return back if need > back else 0
  return 0


def reader(path: str, name: str, *, text_key: str, decode_errors: str, bad_records: str,
           stats: ReadStats, span: tuple[int, int] | None = None) -> _Reader:
  """A source file's reader: `.documents()` yields each document as an iterator of its
  text pieces; `.position()` is how many of the file's bytes were read.

  Args:
    path: the file.
    name: its path relative to the corpus root (decides the format by extension).
    text_key: the jsonl field / parquet column with the text.
    decode_errors: "strict" or "replace" (data.decode_errors).
    bad_records: "stop" or "skip" (data.bad_records).
    stats: counts of skipped records and replaced characters, added to.
    span: a part of the file, (start, end) in its format's `pieces` unit (None: all).

  Raises:
    DataError: a malformed record (with "stop"), undecodable text (with "strict"), a
      damaged compressed or parquet file; the message names the file and where.
  """
  return _Reader(path, name, text_key, decode_errors, bad_records, stats, span)


@dataclasses.dataclass(frozen=True)
class Format:
  """One kind of corpus source file: its extension, what a document is in it, and how a
  _Reader yields its documents (each an iterator of text pieces)."""

  extension: str
  document: str
  documents: Callable[[_Reader], Iterator[Iterator[str]]]
  # How a large file is divided into parts that run as tasks of their own: "bytes"
  # (byte ranges, a .jsonl's cut at line starts, a .txt's at store.PIECE_CHARS windows),
  # "row_groups" (parquet), "" (whole: a compressed stream cannot be entered midway).
  pieces: str = ""


def _plain(raw: IO[bytes]) -> IO[bytes]:
  return raw


# The corpus formats, one record each: a new one is its reader and an entry here; the
# accepted extensions, the messages and --mode=prepare's help follow from this table.
FORMATS: tuple[Format, ...] = (
    Format(".txt", "the whole file", lambda r: iter([r._text()]), "bytes"),  # pylint: disable=protected-access
    Format(".jsonl", "a JSON object a line", lambda r: r._jsonl(_plain), "bytes"),  # pylint: disable=protected-access
    Format(".jsonl.gz", "a JSON object a line, gzip-compressed",
           lambda r: r._jsonl(lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"))),  # pylint: disable=protected-access
    Format(".jsonl.zst", "a JSON object a line, zstd-compressed (every frame)",
           lambda r: r._jsonl(lambda raw: io.BufferedReader(_ZstdFrames(raw)))),  # pylint: disable=protected-access
    Format(".parquet", "a row (column data.text_key), a row group at a time",
           lambda r: r._parquet(), "row_groups"),  # pylint: disable=protected-access
)
EXTENSIONS = tuple(f.extension for f in FORMATS)


def format_of(name: str) -> Format:
  """The format of a file by its extension (the longest that matches)."""
  matches = [f for f in FORMATS if name.endswith(f.extension)]
  if not matches:
    raise ConfigError(f"{name} is not a corpus file; valid extensions: {', '.join(EXTENSIONS)}")
  return max(matches, key=lambda f: len(f.extension))


def source_files(path: str) -> tuple[str, list[str]]:
  """(root, sorted relative paths) of the corpus files that `data.path` names.

  A folder: every file with a supported extension under it, recursively; a glob: the
  matching files (relative to the glob's fixed leading folder); a file: that file.

  Raises:
    ConfigError: nothing matches, or a file has an unsupported extension.
  """
  path = os.path.abspath(os.path.expanduser(path))
  if os.path.isdir(path):
    root = path
    every = [os.path.join(d, f) for d, _, names in os.walk(path) for f in names
             if not f.startswith(".")]
    found = [f for f in every if f.endswith(EXTENSIONS)]
    if len(found) < len(every):  # Said, not silent: a README beside the shards is common.
      logging.info("config.data.path=%r: %d files without a corpus extension (%s) are not "
                   "read, e.g. %s", path, len(every) - len(found), ", ".join(EXTENSIONS),
                   sorted(set(every) - set(found))[0])
  else:
    root = path
    while glob.has_magic(root):
      root = os.path.dirname(root)
    root = root if os.path.isdir(root) else os.path.dirname(root)
    found = [f for f in glob.glob(path, recursive=True) if os.path.isfile(f)]
    unsupported = sorted(f for f in found if not f.endswith(EXTENSIONS))
    if unsupported:
      raise ConfigError(f"config.data.path={path!r}: {unsupported[0]} is not a corpus file; "
                        f"valid extensions: {', '.join(EXTENSIONS)}")
  if not found:
    raise ConfigError(f"config.data.path={path!r} names no corpus file (valid extensions: "
                      f"{', '.join(EXTENSIONS)})")
  return root, sorted(os.path.relpath(f, root) for f in found)
