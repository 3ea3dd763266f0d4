"""The training objective of a run, resolved once from (model.arch, model.head).

An `Objective` says everything the rest of the package used to recompute from the
objective's name: which batch fields feed the model and which it predicts, how many
token sides a step reads, which input pipeline makes its batches, and what the modes
built on it (evaluate's metrics, BLEU, samples, --mode=classify) may do. Code outside
this file asks the resolved entry (`objective.sides`, `objective.classifies`), never
compares names, so a new objective is one `Objective` in `OBJECTIVES` below, plus its
input pipeline in `data/pipeline.py` when it needs a new one (tests/test_objective.py
checks both).

Imports only config.errors (and numpy), so that the configuration, the model and the data
pipeline can all read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from transformer.config.errors import fail


@dataclasses.dataclass(frozen=True)
class Objective:
  """One training objective: what a step feeds the model and what it scores.

  Attributes:
    name: what logs, evaluate's record and messages call it.
    pairs: the (model.arch, model.head) pairs that train this objective.
    model_inputs: the batch fields passed to `model.apply`, in order.
    pipeline: the key of the input pipeline in `data.pipeline.PIPELINES`.
    target: the batch field the logits are scored against ("targets" or "label").
    sides: token sequences a step reads per row (2 for an encoder-decoder's source
      and target), for tokens/s and the step cost.
    classifies: one class per example: the target is (rows,), the logits are classes
      (model.never_predict does not apply), evaluate counts examples, not tokens, and
      reports no perplexity; what --mode=classify needs.
    translates: can read translation pairs (data.source_language/target_language),
      and then report BLEU (train.bleu_examples, --mode=evaluate).
    generates: continues a prompt left to right: training's samples
      (train.sample_prompt) and random LM windows (data.lm_windows='random').
    packs: whether its pipeline's rows may hold several examples: True, False, or the
      data.* key whose value "pack" says so (row_layout).
    streams: its training rows are documents concatenated into one token stream and
      split (data/lm.py, data/corpus_rows.py): full rows, never padded in training; what
      a prepared corpus's token ids (data.name="corpus") can feed.
  """

  name: str
  pairs: tuple[tuple[str, str], ...]
  model_inputs: tuple[str, ...]
  pipeline: str
  target: str = "targets"
  sides: int = 1
  classifies: bool = False
  translates: bool = False
  generates: bool = False
  packs: bool | str = True
  streams: bool = False

  @property
  def decodes(self) -> bool:
    """Whether the model has a cached decoding step (generate or translate)."""
    return self.generates or self.translates


_LM_INPUTS = ("inputs", "segment_ids", "positions")

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("causal_lm", pairs=(("decoder", "lm"),), model_inputs=_LM_INPUTS,
              pipeline="lm", generates=True, streams=True),
    Objective("masked_lm", pairs=(("encoder", "mlm"),), model_inputs=_LM_INPUTS,
              pipeline="mlm", streams=True),
    Objective("seq2seq", pairs=(("encoder_decoder", "lm"),),
              model_inputs=("inputs", "inputs_segment_ids", "inputs_positions",
                            "decoder_inputs", "targets_segment_ids", "targets_positions"),
              sides=2, pipeline="seq2seq", translates=True, packs="packing"),
    Objective("classification", pairs=(("decoder", "classification"),
                                       ("encoder", "classification")),
              model_inputs=_LM_INPUTS, target="label", pipeline="classification",
              classifies=True, packs=False),
)}

# (model.arch, model.head) -> objective: which heads each topology can carry.
_BY_PAIR: dict[tuple[str, str], Objective] = {
    pair: o for o in OBJECTIVES.values() for pair in o.pairs}


def of(arch: str, head: str) -> Objective:
  """The objective a (topology, head) pair trains; raises ConfigError if none."""
  if (arch, head) not in _BY_PAIR:
    valid = sorted(h for a, h in _BY_PAIR if a == arch)
    fail("model.head", head, f"model.arch={arch!r} supports heads {valid}")
  return _BY_PAIR[(arch, head)]


def resolve(model: Any) -> Objective:
  """The objective of `config.model` or a ModelConfig (anything with .arch and .head)."""
  return of(model.arch, model.head)


def get(objective: Objective | str) -> Objective:
  """An entry itself, or the entry of its name (for tests and notebooks)."""
  if isinstance(objective, Objective):
    return objective
  if objective not in OBJECTIVES:
    raise ValueError(f"unknown objective {objective!r}; valid: {sorted(OBJECTIVES)}")
  return OBJECTIVES[objective]


class RowLayout(NamedTuple):
  """What the rows of a batch may hold: several documents (segment ids 1, 2, ...) and
  padding (segment id 0). Fused attention skips what cannot occur (cuDNN: no padding
  selects without padding, its plain causal call for one document a row)."""
  packed: bool = True
  padded: bool = True


def row_layout(objective: Objective, data: Any, train: bool) -> RowLayout:
  """The rows `objective`'s input pipeline makes with `data` (config.data): packed as its
  `packs` says; padded in evaluation (a short final batch gets all-padding rows) and
  wherever one example fills a row or packed pairs leave room (seq2seq, classification).
  A causal or masked LM's training rows are full: documents concatenated and split over
  a stream that repeats forever (data/lm.py, data/corpus/packer.py)."""
  packs = objective.packs
  packed = data[packs] == "pack" if isinstance(packs, str) else packs
  padded = not train or not objective.streams
  return RowLayout(packed=bool(packed), padded=padded)


def layout_of_batch(batch: dict) -> RowLayout:
  """The RowLayout a host batch has (its *segment_ids arrays, numpy): the layout of a
  benchmark's made-up batch, and what the trainer checks real ones against."""
  packed = padded = False
  for key, ids in batch.items():
    if not key.endswith("segment_ids"):
      continue
    ids = np.asarray(ids)
    padded |= bool((ids == 0).any())
    packed |= bool((ids > 1).any())
  return RowLayout(packed=packed, padded=padded)
