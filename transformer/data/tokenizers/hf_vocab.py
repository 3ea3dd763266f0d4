"""The tokenizer of an imported Hugging Face model, renumbered to this codebase's ids.

Every pipeline here assumes pad=0, eos=1, bos=2, unk=3 (vocabularies.py). An imported
vocabulary is renumbered once, by `hf_import.vocabulary_map`: its pad, eos, bos and
unk tokens move to ids 0..3 and every other token keeps its order after them; a role
the source vocabulary lacks gets a row of its own (GPT-2 has no pad or unk, and uses
<|endoftext|> as both bos and eos; Marian starts decoding from its pad token). The
map and the tokenizer files travel in one JSON file, `hf_tokenizer.json`, which a
workdir holds like any other vocabulary file (run_vocabulary.save_tokenizer copies it and
records its sha256):

  {"family": "gpt2", "hf_vocab_size": 50257,
   "internal_to_hf": [...],   # per internal id: the source id whose row it holds
   "added": [0, 2, 3],        # internal ids of rows the import added
   "mask": null,              # internal id of the mask token (BERT's [MASK])
   "tokenizer_json": {...},   # a `tokenizers` tokenizer.json (GPT-2 BPE, WordPiece)
   "sentencepiece": null}     # or Marian's {"source", "target" (base64 .spm), "vocab"}

Either tokenizer may be absent (a folder without tokenizer files): the model still
imports, and encoding text then stops with a message.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Iterable

import numpy as np

from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies


class HFTokenizer:
  """Encodes with the source model's own tokenizer; ids are the renumbered ones."""

  def __init__(self, path: str):
    self.path = path  # run_vocabulary.save_tokenizer copies this file into fine-tuning runs.
    with open(path, encoding="utf-8") as f:
      bundle = json.load(f)
    self.family = bundle["family"]
    self.internal_to_hf = np.asarray(bundle["internal_to_hf"], np.int64)
    self.added = frozenset(bundle["added"])
    self.vocab_size = len(self.internal_to_hf)
    self.mask_id = -1 if bundle["mask"] is None else int(bundle["mask"])
    # Each source id maps to the one internal row that is not an added copy of it.
    self.hf_to_internal = np.full(bundle["hf_vocab_size"], vocabularies.UNK_ID, np.int64)
    for internal, hf in enumerate(self.internal_to_hf):
      if internal not in self.added:
        self.hf_to_internal[hf] = internal
    self._special = set(range(vocabularies.NUM_SPECIAL)) | set(self.added)
    self._fast = self._sentencepiece = None
    if bundle.get("tokenizer_json") is not None:
      import tokenizers  # pylint: disable=g-import-not-at-top
      self._fast = tokenizers.Tokenizer.from_str(json.dumps(bundle["tokenizer_json"]))
    elif bundle.get("sentencepiece") is not None:
      self._sentencepiece = _MarianPieces(bundle["sentencepiece"])

  def _require(self) -> None:
    if self._fast is None and self._sentencepiece is None:
      raise ConfigError(f"{self.path}: the imported {self.family} folder had no tokenizer "
                        "files (tokenizer.json, or Marian's source.spm/target.spm/vocab.json), "
                        "so text cannot be encoded; import a folder that has them")

  def encode(self, text: str) -> np.ndarray:
    """Int32 internal ids of `text`, without bos/eos (no [CLS]/[SEP] either)."""
    self._require()
    if self._fast is not None:
      hf_ids = self._fast.encode(text, add_special_tokens=False).ids
    else:
      hf_ids = self._sentencepiece.encode(text)
    return self.hf_to_internal[np.asarray(hf_ids, np.int64)].astype(np.int32)

  def piece_id(self, piece: str) -> int | None:
    """The internal id of one whole token of the source vocabulary (T5's
    `<extra_id_0>`, say), or None when it has no such token (data/tokenizers/sentinels.py)."""
    hf_id = self._fast.token_to_id(piece) if self._fast is not None else None
    if hf_id is None or not 0 <= hf_id < len(self.hf_to_internal):
      return None
    internal = int(self.hf_to_internal[hf_id])
    return None if internal == vocabularies.UNK_ID else internal

  def decode(self, ids: Iterable[int]) -> str:
    """Text of internal ids; the special roles and added rows are dropped."""
    self._require()
    hf_ids = [int(self.internal_to_hf[int(i)]) for i in ids
              if 0 <= int(i) < self.vocab_size and int(i) not in self._special]
    if self._fast is not None:
      return self._fast.decode(hf_ids, skip_special_tokens=True)
    return self._sentencepiece.decode(hf_ids)


class _MarianPieces:
  """Marian's tokenizer: source.spm pieces -> vocab.json ids; ids -> target.spm text."""

  def __init__(self, files: dict[str, Any]):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self._source = spm.SentencePieceProcessor(
        model_proto=base64.b64decode(files["source"]))
    self._target = spm.SentencePieceProcessor(
        model_proto=base64.b64decode(files["target"]))
    self._vocab = files["vocab"]
    self._pieces = {i: p for p, i in self._vocab.items()}
    self._unk = self._vocab.get("<unk>", 1)
    self._specials = {self._vocab.get(p) for p in ("</s>", "<unk>", "<pad>")}

  def encode(self, text: str) -> list[int]:
    return [self._vocab.get(p, self._unk) for p in self._source.encode(text, out_type=str)]

  def decode(self, ids: list[int]) -> str:
    pieces = [self._pieces[i] for i in ids if i in self._pieces and i not in self._specials]
    return self._target.decode_pieces(pieces)


def bundle_from_folder(hf_dir_files: dict[str, str]) -> dict[str, Any] | None:
  """The tokenizer part of a bundle, from a folder's files (name -> path), or None."""
  if "tokenizer.json" in hf_dir_files:
    with open(hf_dir_files["tokenizer.json"], encoding="utf-8") as f:
      return {"tokenizer_json": json.load(f), "sentencepiece": None}
  if all(n in hf_dir_files for n in ("source.spm", "target.spm", "vocab.json")):
    def b64(name):
      with open(hf_dir_files[name], "rb") as f:
        return base64.b64encode(f.read()).decode("ascii")
    with open(hf_dir_files["vocab.json"], encoding="utf-8") as f:
      vocab = json.load(f)
    return {"tokenizer_json": None,
            "sentencepiece": {"source": b64("source.spm"), "target": b64("target.spm"),
                              "vocab": vocab}}
  return None


TOKENIZER_KINDS = ("bytes", "char", "sentencepiece", "huggingface")


def from_kind(kind: str, path: str) -> vocabularies.Tokenizer:
  """A tokenizer rebuilt from its kind (run_vocabulary.tokenizer_kind) and vocabulary file.

  Args:
    kind: one of TOKENIZER_KINDS.
    path: the vocabulary file ("" for bytes).

  Raises:
    ConfigError: an unknown kind.
  """
  if kind == "bytes":
    return vocabularies.ByteTokenizer()
  makers = {"char": vocabularies.CharTokenizer, "huggingface": HFTokenizer,
            "sentencepiece": vocabularies.SentencePieceTokenizer}
  if kind not in makers:
    raise ConfigError(f"tokenizer kind {kind!r} is unknown; valid: {TOKENIZER_KINDS}")
  return makers[kind](path)
