"""Text that is plainly not the UTF-8 a tokenizer reads is refused in one line, everywhere.

UTF-16 / UTF-32 with or without a byte-order mark, gzip under a .txt name, NUL bytes:
--mode=prepare's readers and the local_text / local_tsv datasets refuse them naming the
file, the likely encoding and the conversion (data/text_encoding.py); before, UTF-16-LE
without a mark prepared with exit 0 into a NUL every other token, and UTF-16 with one was
told to set decode_errors='replace'. Latin-1 says how to convert it, or is replaced and
counted with decode_errors='replace'. An empty file is its own line.
"""

from __future__ import annotations

import gzip
import os

import pytest

from test_corpus import on_own_corpus, prepare
from test_local_builders import build, make_data
from transformer.config.errors import DataError
from transformer.data import text_encoding
from transformer.data.datasets import local_text
from transformer.data.datasets import local_tsv

TEXT = "".join(f"{i} the quick brown fox jumps over the lazy dog\n" for i in range(300))

# name -> (bytes, the start of the message after the file's path)
MEMBERS = {
    "utf16le_no_bom": (TEXT.encode("utf-16-le"), " is UTF-16LE text without a byte-order mark"),
    "utf16be_no_bom": (TEXT.encode("utf-16-be"), " is UTF-16BE text without a byte-order mark"),
    "utf16_bom": (TEXT.encode("utf-16"), " is UTF-16LE text (it starts with UTF-16LE's "
                  "byte-order mark)"),
    "utf16be_bom": (b"\xfe\xff" + TEXT.encode("utf-16-be"), " is UTF-16BE text (it starts"),
    "utf32_bom": (TEXT.encode("utf-32"), " is UTF-32LE text (it starts with UTF-32LE's"),
    "utf32be_no_bom": (TEXT.encode("utf-32-be"), " is UTF-32BE text without a byte-order"),
    "gzip": (gzip.compress(TEXT.encode()), " holds gzip-compressed data, not UTF-8 text: "
             "decompress it"),
    "binary": (bytes(range(256)) * 40, " is binary data, not UTF-8 text (a NUL byte at "
               "byte 0"),
    "nul_inside_utf8": (TEXT.encode() + b"\x00" + TEXT.encode(), " is binary data, not "
                        "UTF-8 text (a NUL byte at byte"),
}
_HOW = {"utf16le_no_bom": "UTF-16LE", "utf16be_no_bom": "UTF-16BE", "utf16_bom": "UTF-16LE",
        "utf16be_bom": "UTF-16BE", "utf32_bom": "UTF-32LE", "utf32be_no_bom": "UTF-32BE"}


@pytest.fixture
def corpus(tiny_config, tmp_path):
  on_own_corpus(tiny_config, tmp_path, val_fraction=0.5)
  os.makedirs(tiny_config.data.path)
  return tiny_config


def _write(path, raw: bytes) -> str:
  with open(path, "wb") as f:
    f.write(raw)
  return str(path)


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_prepare_refuses_text_that_is_not_utf8_naming_file_and_encoding(corpus, member):
  raw, says = MEMBERS[member]
  path = _write(os.path.join(corpus.data.path, "a.txt"), raw)
  _write(os.path.join(corpus.data.path, "b.txt"), TEXT.encode())
  for decode_errors in ("strict", "replace"):  # Never read as text, whatever it says.
    corpus.data.decode_errors = decode_errors
    with pytest.raises(DataError) as raised:
      prepare(corpus)
    message = str(raised.value)
    assert message.startswith(path + says), message
    assert "\n" not in message and "decode_errors" not in message
    if member in _HOW:
      assert f"`iconv -f {_HOW[member]} -t UTF-8 {path} > a.utf8.txt`" in message


def test_prepare_refuses_utf16_json_lines(corpus):
  path = _write(os.path.join(corpus.data.path, "a.jsonl"),
                '{"text": "one"}\n{"text": "two"}\n'.encode("utf-16-le"))
  with pytest.raises(DataError, match=rf"^{path} is UTF-16LE text without a byte-order"):
    prepare(corpus)


@pytest.mark.parametrize("member", ["utf16le_no_bom", "utf16_bom", "gzip", "binary"])
def test_local_text_and_tsv_refuse_it_too(tmp_path, member):
  raw, says = MEMBERS[member]
  path = _write(tmp_path / "a.txt", raw)
  with pytest.raises(DataError) as raised:
    build(local_text, make_data(tmp_path / "tfds", path, decode_errors="replace"))
  assert str(raised.value).startswith(path + says), str(raised.value)
  assert "decode_errors" not in str(raised.value)
  tsv = tmp_path / "tsv"
  tsv.mkdir()
  header = "text\tlabel\n" + "".join(f"row {i}\t{i % 2}\n" for i in range(40))
  path = _write(tsv / "train.tsv", header.encode("utf-16-le") if member != "gzip"
                else gzip.compress(header.encode()))
  with pytest.raises(DataError, match=r"train\.tsv (is UTF-16LE text|holds gzip)"):
    data = make_data(tmp_path / "tfds2", str(tsv))
    data.update(text_key="text", label_key="label")
    build(local_tsv, data)


def test_latin1_says_how_to_convert_or_is_replaced_and_counted(corpus):
  path = _write(os.path.join(corpus.data.path, "a.txt"), "café crème\n".encode("latin-1") * 50)
  _write(os.path.join(corpus.data.path, "b.txt"), TEXT.encode())
  with pytest.raises(DataError, match=r"a\.txt, byte 0: undecodable UTF-8 at byte 3 .*likely "
                     r"an 8-bit encoding such as Latin-1 / Windows-1252: convert it with "
                     rf"`iconv -f WINDOWS-1252 -t UTF-8 {path} > a.utf8.txt`, or set "
                     r"config.data.decode_errors='replace'"):
    prepare(corpus)
  corpus.data.decode_errors = "replace"
  _, manifest = prepare(corpus)
  assert manifest["replaced_characters"] == 100  # é and è of 50 lines, each one U+FFFD.


def test_an_empty_file_is_its_own_line(corpus):
  _write(os.path.join(corpus.data.path, "a.txt"), b"")
  _write(os.path.join(corpus.data.path, "b.txt"), TEXT.encode())
  with pytest.raises(DataError, match=r"a\.txt, the whole file: the file is empty"):
    prepare(corpus)


def test_utf8_text_and_its_byte_order_mark_are_not_refused():
  assert text_encoding.problem(TEXT.encode(), "a.txt", first=True) is None
  assert text_encoding.problem(b"\xef\xbb\xbf" + TEXT.encode(), "a.txt", first=True) is None
  assert text_encoding.problem("猫 naïve\n".encode() * 100, "a.txt", first=True) is None
