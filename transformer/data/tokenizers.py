"""Tokenizers with fixed special ids: pad=0, eos=1, bos=2, unk=3, and a mask id.

`SentencePieceTokenizer` wraps a model trained on the train split and cached
beside the data (mask=4, the first piece after the specials); `ByteTokenizer`
maps UTF-8 bytes to ids 4..259, puts the mask at 260 and needs no training
(handy for quick CPU runs). No text ever encodes to the mask id: only masked-LM
input pipelines write it.
"""

from __future__ import annotations

import io
import os
from typing import Iterable, Protocol

import numpy as np
import sentencepiece as spm
from absl import logging

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
NUM_SPECIAL = 4
MASK_PIECE = "<mask>"  # SentencePiece control symbol; never matched in text.


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


def train_sentencepiece(lines: Iterable[str], vocab_size: int, model_path: str,
                        max_sentences: int) -> SentencePieceTokenizer:
  """Trains a SentencePiece model on `lines` and writes it atomically to `model_path`.

  Whitespace is kept as is (identity normalization, no whitespace folding) so that
  code indentation survives; newline and tab are pieces of their own and any other
  unseen character falls back to bytes, so nothing maps to unk. The mask is a
  control symbol, not a user-defined one, so a literal "<mask>" in the text is
  spelled out in ordinary pieces instead of becoming the mask id; control symbols
  come first, so it gets id NUM_SPECIAL = 4, then newline = 5 and tab = 6.
  """
  logging.info("Training SentencePiece (vocab %d) on up to %d lines -> %s",
               vocab_size, max_sentences, model_path)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
      model_type="unigram", pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
      input_sentence_size=max_sentences, shuffle_input_sentence=True,
      normalization_rule_name="identity", remove_extra_whitespaces=False,
      allow_whitespace_only_pieces=True, split_digits=True, byte_fallback=True,
      control_symbols=[MASK_PIECE], user_defined_symbols=["\n", "\t"],
      character_coverage=0.9999,
      hard_vocab_limit=True, max_sentence_length=16384, num_threads=os.cpu_count() or 1,
      minloglevel=0)  # SentencePiece's own progress lines: training can take minutes.
  os.makedirs(os.path.dirname(model_path), exist_ok=True)
  tmp_path = f"{model_path}.tmp.{os.getpid()}"
  with open(tmp_path, "wb") as f:
    f.write(model.getvalue())
  os.replace(tmp_path, model_path)  # Atomic: a killed run never leaves half a model.
  return SentencePieceTokenizer(model_path)
