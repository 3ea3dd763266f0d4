"""What a text source's bytes are, when they are plainly not the UTF-8 text a tokenizer reads.

One check for every text reader (a prepared corpus's .txt / .jsonl sources,
data/corpus/readers.py; the local_text / local_tsv / local_parallel files,
data/datasets/local_files.py): UTF-16 or UTF-32 (with a byte-order mark or without one,
found by where the NUL bytes fall), compressed or archive data under a text name (gzip,
zstd, zip, parquet), and other binary data (NUL bytes, which UTF-8 text never holds)
are refused in one line that names the file, the likely encoding and how to convert it
(`iconv -f UTF-16LE -t UTF-8`). Text that is not valid UTF-8 but has no NUL (Latin-1,
Windows-1252) is the readers' own undecodable-UTF-8 error, with `legacy_hint`'s advice;
or, with data.decode_errors='replace', read as U+FFFD, counted.
"""

from __future__ import annotations

import os

# The byte-order marks, longest first (UTF-32-LE's starts with UTF-16-LE's).
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32LE"), (b"\x00\x00\xfe\xff", "UTF-32BE"),
         (b"\xff\xfe", "UTF-16LE"), (b"\xfe\xff", "UTF-16BE"))
# Data that is not text, by its first bytes: what it is, and how to read it instead.
_MAGIC = ((b"\x1f\x8b", "gzip-compressed data", "decompress it (`gunzip -c {path} > "
           "{stem}.txt`), or name it .jsonl.gz if it holds JSON lines"),
          (b"\x28\xb5\x2f\xfd", "zstd-compressed data", "decompress it (`zstd -d -c {path} > "
           "{stem}.txt`), or name it .jsonl.zst if it holds JSON lines"),
          (b"PK\x03\x04", "a zip archive", "unpack it (`unzip {path}`) and name its text files"),
          (b"PAR1", "a parquet file", "name it .parquet (a corpus source reads it)"))
_SAMPLE = 1 << 12  # Bytes around the first NUL that decide UTF-16 / UTF-32 / binary.


def problem(data: bytes, path: str, first: bool) -> str | None:
  """Why `data` (a file's bytes, or a part of them) is not UTF-8 text, or None.

  Args:
    data: the bytes about to be decoded as UTF-8.
    path: the file, for the message.
    first: whether `data` starts the file (byte-order marks and magic numbers are only
      looked for there).

  Returns:
    One line naming `path`, what its bytes look like and how to convert them.
  """
  stem = os.path.splitext(os.path.basename(path))[0]
  if first:
    for mark, encoding in _BOMS:
      if data.startswith(mark):
        return _convert(path, stem, f"{encoding} text (it starts with {encoding}'s byte-order "
                        "mark)", encoding)
    for magic, what, how in _MAGIC:
      if data.startswith(magic):
        return (f"{path} holds {what}, not UTF-8 text: "
                + how.format(path=path, stem=stem))
  at = data.find(b"\x00")
  if at < 0:
    return None
  start = at - at % 4
  sample = data[start:start + _SAMPLE]
  sample = sample[:len(sample) - len(sample) % 4]
  encoding = _wide_encoding(sample)
  if encoding:
    return _convert(path, stem, f"{encoding} text without a byte-order mark (NUL bytes "
                    f"fall where {encoding} puts them, from byte {at})", encoding)
  return (f"{path} is binary data, not UTF-8 text (a NUL byte at byte {at}; text never "
          "holds one): give a UTF-8 text file, or convert it to one")


def _convert(path: str, stem: str, what: str, encoding: str) -> str:
  return (f"{path} is {what}, not UTF-8 text; convert it: `iconv -f {encoding} -t UTF-8 "
          f"{path} > {stem}.utf8.txt` (the tokenizer reads UTF-8)")


def _wide_encoding(sample: bytes) -> str | None:
  """UTF-16LE/BE or UTF-32LE/BE when the NUL bytes of `sample` (a multiple of 4 bytes)
  fall where that encoding puts them for mostly ASCII / Latin text, else None."""
  if len(sample) < 4:
    return None
  columns = [sample[k::4] for k in range(4)]
  zeros = [c.count(0) / len(c) for c in columns]
  high, low = 0.9, 0.1
  if min(zeros[1:]) >= high and zeros[0] <= low:
    return "UTF-32LE"
  if min(zeros[:3]) >= high and zeros[3] <= low:
    return "UTF-32BE"
  odd, even = (zeros[1] + zeros[3]) / 2, (zeros[0] + zeros[2]) / 2
  if odd >= 0.5 and even <= low:
    return "UTF-16LE"
  if even >= 0.5 and odd <= low:
    return "UTF-16BE"
  return None


def legacy_hint(path: str) -> str:
  """The advice for bytes that are not UTF-8 but hold no NUL: an 8-bit encoding."""
  stem = os.path.splitext(os.path.basename(path))[0]
  return ("it is likely an 8-bit encoding such as Latin-1 / Windows-1252: convert it with "
          f"`iconv -f WINDOWS-1252 -t UTF-8 {path} > {stem}.utf8.txt`")
