"""T5's sentinel ids and UL2's paradigm tokens: ids after a tokenizer's vocabulary.

The one rule for their ids (`sentinel_id`, `paradigm_id`): sentinel i (the text
`<extra_id_i>`) is base + num_sentinels - 1 - i, T5's order (extra_id_0 is the last id),
where base is the tokenizer's vocabulary size; UL2's paradigm tokens [R], [S], [X]
follow the sentinels. A tokenizer that already holds T5's `<extra_id_N>` pieces (an
imported T5 tokenizer.json: `piece_id`) keeps its own ids for them. `encode` and
`decode` read and write those texts, so that a prompt can hold sentinels and an output
shows them; span corruption writes them into its examples (data/denoise.py).
"""

from __future__ import annotations

import re
from typing import Iterable

import numpy as np

from transformer.config.denoisers import UL2_PARADIGMS
from transformer.data.tokenizers import vocabularies

_EXTRA = re.compile(r"<extra_id_(\d+)>|(\[[RSX]\])")


def _own_id(tokenizer: vocabularies.Tokenizer, piece: str) -> int | None:
  """The tokenizer's own id of `piece` (an imported T5 vocabulary's), or None."""
  piece_id = getattr(tokenizer, "piece_id", None)
  return piece_id(piece) if piece_id is not None else None


def base_size(tokenizer: vocabularies.Tokenizer) -> int:
  """The first id after the tokenizer's vocabulary: where the extra ids start."""
  return tokenizer.vocab_size


def sentinel_id(tokenizer: vocabularies.Tokenizer, i: int, num_sentinels: int) -> int:
  """The id of sentinel i (`<extra_id_i>`), 0 <= i < num_sentinels."""
  if not 0 <= i < num_sentinels:
    raise ValueError(f"sentinel {i} is outside [0, train.num_sentinels={num_sentinels})")
  own = _own_id(tokenizer, f"<extra_id_{i}>")
  return own if own is not None else base_size(tokenizer) + num_sentinels - 1 - i


def sentinel_ids(tokenizer: vocabularies.Tokenizer, num_sentinels: int) -> np.ndarray:
  """[num_sentinels] int32: sentinel i's id at index i."""
  return np.asarray([sentinel_id(tokenizer, i, num_sentinels) for i in range(num_sentinels)],
                    np.int32)


def _added_sentinels(tokenizer: vocabularies.Tokenizer, num_sentinels: int) -> int:
  """How many extra ids the sentinels the tokenizer lacks take after its vocabulary.

  Sentinel i without an id of the tokenizer's own takes base + num_sentinels - 1 - i, so
  the added ids are [base, base + num_sentinels - first), `first` the lowest such i: a
  vocabulary with 8 of T5's pieces asked for 100 sentinels adds 92 ids (0 with all 100).
  """
  first = next((i for i in range(num_sentinels)
                if _own_id(tokenizer, f"<extra_id_{i}>") is None), num_sentinels)
  return num_sentinels - first


def paradigm_id(tokenizer: vocabularies.Tokenizer, index: int, num_sentinels: int) -> int:
  """The id of UL2's paradigm token UL2_PARADIGMS[index] ([R], [S], [X]): right after
  the sentinels (after the vocabulary, for one that holds T5's own)."""
  own = _own_id(tokenizer, UL2_PARADIGMS[index])
  if own is not None:
    return own
  return base_size(tokenizer) + _added_sentinels(tokenizer, num_sentinels) + index


def vocab_size_needed(tokenizer: vocabularies.Tokenizer, num_sentinels: int,
                      paradigms: int) -> int:
  """The model vocabulary that holds the tokenizer's ids, `num_sentinels` sentinels
  (none to add for a vocabulary with all of T5's own, the rest after it) and `paradigms`
  paradigm tokens."""
  # Every id, not one: a vocabulary holding only some of T5's pieces adds the others.
  ids = [sentinel_id(tokenizer, i, num_sentinels) for i in range(num_sentinels)]
  ids += [paradigm_id(tokenizer, i, num_sentinels) for i in range(paradigms)]
  return max([tokenizer.vocab_size - 1] + ids) + 1


def encode(tokenizer: vocabularies.Tokenizer, text: str, num_sentinels: int) -> np.ndarray:
  """`tokenizer.encode`, with each `<extra_id_N>` (and [R], [S], [X]) as its id."""
  pieces, start = [], 0
  for match in _EXTRA.finditer(text):
    pieces.append(tokenizer.encode(text[start:match.start()]))
    if match.group(1) is not None:
      pieces.append([sentinel_id(tokenizer, int(match.group(1)), num_sentinels)])
    else:
      pieces.append([paradigm_id(tokenizer, UL2_PARADIGMS.index(match.group(2)),
                                 num_sentinels)])
    start = match.end()
  pieces.append(tokenizer.encode(text[start:]))
  return np.concatenate([np.asarray(p, np.int32) for p in pieces])


def decode(tokenizer: vocabularies.Tokenizer, ids: Iterable[int], num_sentinels: int) -> str:
  """`tokenizer.decode`, with each sentinel (paradigm) id written `<extra_id_N>` ([R], ...)."""
  names = {sentinel_id(tokenizer, i, num_sentinels): f"<extra_id_{i}>"
           for i in range(num_sentinels)}
  names.update({paradigm_id(tokenizer, i, num_sentinels): p
                for i, p in enumerate(UL2_PARADIGMS)})
  text, run = [], []
  for i in ids:
    if int(i) in names:
      text += [tokenizer.decode(run), names[int(i)]]
      run = []
    else:
      run.append(int(i))
  return "".join(text + [tokenizer.decode(run)])
