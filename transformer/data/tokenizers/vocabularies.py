"""Tokenizers with fixed special ids: pad=0, eos=1, bos=2, unk=3, and a mask id.

`SentencePieceTokenizer` wraps a model trained on the train split and cached
beside the data (mask=4, the first piece after the specials; unigram or BPE; for
translation trained jointly on source and target text); `ByteTokenizer` maps UTF-8
bytes to ids 4..259, puts the mask at 260 and needs no training (handy for quick CPU
runs); `CharTokenizer` gives each character of the training split its own id after
the mask (4), as character-level language models do. No text ever encodes to the
mask id: only masked-LM input pipelines write it.

A character vocabulary is fixed once built: a character its text never had encodes
to unk. `CharTokenizer` counts such characters (`UNSEEN`), and launch.py says them in
one line at the end of every command (`unseen_line`): fine-tuning with
config.init_from on edited data, translating or evaluating text with new characters
is never silently lossy.
"""

from __future__ import annotations

import collections
import io
import json
import os
from typing import Iterable, Iterator, Protocol

import numpy as np
import sentencepiece as spm
from absl import logging

from transformer.workdir import console
from transformer.workdir import files
from transformer.workdir import progress

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
NUM_SPECIAL = 4
MASK_PIECE = "<mask>"  # SentencePiece control symbol; never matched in text.
# A SentencePiece training says it is still running this often (progress.stage).
HEARTBEAT_SECONDS = 30.0


class Tokenizer(Protocol):
  """What the pipeline needs from a tokenizer."""

  vocab_size: int
  mask_id: int  # Masked-LM corruption token, in [NUM_SPECIAL, vocab_size).

  def encode(self, text: str) -> np.ndarray:
    """Returns int32 ids without bos/eos."""

  def decode(self, ids: Iterable[int]) -> str:
    """Inverse of encode; special ids are dropped."""


class ByteTokenizer:
  """UTF-8 bytes shifted past the special ids, then the mask id."""

  mask_id = 256 + NUM_SPECIAL
  vocab_size = mask_id + 1

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32) + NUM_SPECIAL

  def decode(self, ids: Iterable[int]) -> str:
    data = bytes(int(i) - NUM_SPECIAL for i in ids if NUM_SPECIAL <= int(i) < self.mask_id)
    return data.decode("utf-8", errors="replace")


# Characters a character vocabulary lacked, with how often this process encoded each
# (to UNK_ID); threads of the input pipeline add to it, launch.py says it once.
UNSEEN: collections.Counter = collections.Counter()


def unseen_line() -> str | None:
  """One line on the characters encoded to unk since the last call (None if none); resets."""
  if not UNSEEN:
    return None
  counts, total = UNSEEN.most_common(), sum(UNSEEN.values())
  UNSEEN.clear()
  shown = ", ".join(f"{c!r} x{n:,}" for c, n in counts[:8])
  more = f" and {len(counts) - 8} more" if len(counts) > 8 else ""
  return (f"{total:,} characters of the text this command encoded ({len(counts)} distinct: "
          f"{shown}{more}) are not in the run's character vocabulary and became the unknown "
          "id (the vocabulary holds the characters of the text it was built from; a run "
          "fine-tuned with config.init_from keeps its source's)")


class CharTokenizer:
  """One id per character of the training text: specials 0..3, mask 4, characters from 5.

  A character the training text never had encodes to unk (3); the vocabulary file
  is JSON ({"chars": "..."}), stored beside the data.
  """

  mask_id = NUM_SPECIAL

  def __init__(self, path: str):
    self.path = path
    with open(path, encoding="utf-8") as f:
      self.chars = json.load(f)["chars"]
    if len(set(self.chars)) != len(self.chars):
      raise ValueError(f"{path}: the character list repeats a character")
    self._ids = {c: i + NUM_SPECIAL + 1 for i, c in enumerate(self.chars)}
    self.vocab_size = NUM_SPECIAL + 1 + len(self.chars)

  def encode(self, text: str) -> np.ndarray:
    ids = self._ids
    encoded = np.fromiter((ids.get(c, UNK_ID) for c in text), dtype=np.int32,
                          count=len(text))
    if (encoded == UNK_ID).any():  # Only an unseen character encodes to unk: counted.
      UNSEEN.update(c for c in text if c not in ids)
    return encoded

  def decode(self, ids: Iterable[int]) -> str:
    first = NUM_SPECIAL + 1
    return "".join(self.chars[int(i) - first] for i in ids
                   if first <= int(i) < self.vocab_size)


def build_char_vocabulary(texts: Iterable[str], path: str) -> CharTokenizer:
  """Collects the characters of `texts` (sorted by code point) and writes them atomically."""
  chars: set[str] = set()
  for text in texts:
    chars.update(text)
  if not chars:
    raise ValueError(f"no characters to build a vocabulary from for {path}")
  files.write_atomically(path, json.dumps({"chars": "".join(sorted(chars))}).encode("utf-8"))
  logging.info("Character vocabulary: %d characters -> %s", len(chars), path)
  return CharTokenizer(path)


class SentencePieceTokenizer:
  """A trained SentencePiece model."""

  def __init__(self, model_path: str):
    self.model_path = model_path
    self._sp = spm.SentencePieceProcessor(model_file=model_path)
    self.vocab_size = self._sp.get_piece_size()
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.bos_id(), self._sp.unk_id())
    if ids != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
      raise ValueError(f"{model_path}: special ids (pad, eos, bos, unk) are {ids}, "
                       f"expected {(PAD_ID, EOS_ID, BOS_ID, UNK_ID)}")
    self.mask_id = self._sp.piece_to_id(MASK_PIECE)  # unk_id when the piece is absent.
    if self.mask_id == UNK_ID or not self._sp.is_control(self.mask_id):
      raise ValueError(f"{model_path}: no {MASK_PIECE!r} control symbol; retrain it with "
                       "train_sentencepiece")

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._sp.encode(text), dtype=np.int32)

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.decode([int(i) for i in ids])


def _with_progress(lines: Iterable[str], every: int = 200_000) -> Iterator[str]:
  """Passes `lines` through, logging how many were read (reading can take minutes)."""
  count = 0
  for count, line in enumerate(lines, 1):
    if count % every == 0:
      logging.info("SentencePiece: read %d lines", count)
    yield line
  logging.info("SentencePiece: read %d lines in total; training", count)


def train_sentencepiece(lines: Iterable[str], vocab_size: int, model_path: str,
                        max_sentences: int, model_type: str = "unigram") -> SentencePieceTokenizer:
  """Trains a SentencePiece model on `lines` and writes it atomically to `model_path`.

  `model_type` is "unigram" or "bpe". For translation, `lines` holds source and
  target sentences together, so both languages share one vocabulary (as the
  paper's shared BPE).

  Whitespace is kept as is (identity normalization, no whitespace folding) so that
  code indentation survives; newline and tab are pieces of their own and any other
  unseen character falls back to bytes, so nothing maps to unk. The mask is a
  control symbol, not a user-defined one, so a literal "<mask>" in the text is
  spelled out in ordinary pieces instead of becoming the mask id; control symbols
  come first, so it gets id NUM_SPECIAL = 4, then newline = 5 and tab = 6.
  """
  logging.info("Training SentencePiece %s (vocab %d) on up to %d lines -> %s",
               model_type, vocab_size, max_sentences, model_path)
  model = io.BytesIO()
  raised: list[BaseException] = []

  def kept(lines: Iterable[str]) -> Iterator[str]:
    # SentencePiece turns what its sentence iterator raises (Ctrl-C's KeyboardInterrupt,
    # SIGTERM, a DataError) into RuntimeError("INTERNAL: ..."): keep the original.
    try:
      yield from lines
    except BaseException as e:
      raised.append(e)
      raise

  try:
    # Its C++ trainer writes ~300 INFO lines on stderr itself: into log.txt, off the
    # console, which gets a line every 30 s instead (minutes without one before).
    with console.native_stderr_to_log("sentencepiece"), progress.stage(
        f"SentencePiece: training {vocab_size:,} {model_type} pieces",
        heartbeat=HEARTBEAT_SECONDS):
      _train_sentencepiece(kept(lines), vocab_size, model, max_sentences, model_type)
  except RuntimeError:
    if raised:
      raise raised[0] from None  # Ctrl-C stays Ctrl-C (exit 130), not an INTERNAL error.
    raise
  # Written only when complete (atomically): an interrupted training leaves no file.
  files.write_atomically(model_path, model.getvalue())
  return SentencePieceTokenizer(model_path)


def _train_sentencepiece(lines, vocab_size, model, max_sentences, model_type) -> None:
  spm.SentencePieceTrainer.train(
      sentence_iterator=_with_progress(lines), model_writer=model, vocab_size=vocab_size,
      model_type=model_type, pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
      input_sentence_size=max_sentences, shuffle_input_sentence=True,
      normalization_rule_name="identity", remove_extra_whitespaces=False,
      allow_whitespace_only_pieces=True, split_digits=True, byte_fallback=True,
      control_symbols=[MASK_PIECE], user_defined_symbols=["\n", "\t"],
      character_coverage=0.9999,
      hard_vocab_limit=True, max_sentence_length=16384, num_threads=os.cpu_count() or 1,
      minloglevel=0)  # SentencePiece's own progress lines: training can take minutes.
