"""The training objective of a run, resolved once from (model.arch, model.head, model.objective).

An `Objective` says everything the rest of the package used to recompute from the
objective's name: which batch fields feed the model and which it predicts, how many
token sides a step reads, which input pipeline makes its batches, and what the modes
built on it (evaluate's metrics, BLEU, samples, --mode=classify) may do. Code outside
this file asks the resolved entry (`objective.sides`, `objective.classifies`), never
compares names, so a new objective is one `Objective` in `OBJECTIVES` below, plus its
input pipeline in `data/pipeline.py` when it needs a new one (tests/test_objective.py
checks both).

Text-to-text objectives have seqio's shape: a transform (data/denoise.py's TRANSFORMS)
turns documents into (inputs, targets) examples, and a converter (CONVERTERS) puts
those examples onto the topology. `model.objective="auto"` keeps the choice of
(model.arch, model.head) that every config made before the key existed.

  model.objective   transform: one example            encoder_decoder  decoder  encoder
  auto              (arch, head)'s own below                yes           yes      yes
  causal_lm         next token of a packed window            -            yes       -
  masked_lm         BERT's 15% corruption of a window        -             -       yes
  seq2seq           a pair (translation; next lines)        yes            -        -
  classification    one text -> one label                    -            yes      yes
  span_corruption   T5: noise spans -> sentinels            yes           yes       -
  prefix_lm         a window split at a uniform point,      yes           yes       -
                    or a pair (translation, labelled TSV)
  ul2               UL2's R / S / X denoisers by            yes           yes       -
                    train.ul2_weights, paradigm token first

Converters: encoder_decoder reads the inputs on the encoder side and the targets on
the decoder side (pairs packed first-fit, one segment id per pair on both sides);
decoder reads [bos] inputs targets in one row, the loss on the targets only, and with
model.prefix_attention="bidirectional" a `prefix` field (1 on [bos] and the inputs)
that makes the inputs attend to each other both ways (T5's prefix LM; "causal" is T5
Table 2's plain language-model arm, no prefix field at all). docs/objectives.md has
the same table with examples.

Imports only config.errors (and numpy), so that the configuration, the model and the data
pipeline can all read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

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
    transform: a text-to-text objective's transform of documents into (inputs,
      targets) examples (data/denoise.py's TRANSFORMS); "" for the others. Its entry is
      converted onto a topology by `resolve` (CONVERTERS), which fills the fields above.
    reads_pairs: can read (inputs, targets) pairs from the data instead of documents:
      translation pairs (data.source_language) or a labelled text (data.label_key)
      written as "text -> label word".
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
  transform: str = ""
  reads_pairs: bool = False

  @property
  def decodes(self) -> bool:
    """Whether the model has a cached decoding step (generate or translate)."""
    return self.generates or self.translates

  @property
  def answers_prompts(self) -> bool:
    """Whether --mode=generate and train.sample_prompt serve it: a decoder LM continues
    a prompt (`generates`); a text-to-text objective on either topology reads it as its
    examples' inputs and decodes their targets (an encoder-decoder: the prompt on the
    encoder side, the answer greedy on the decoder side; sentinels in it are filled)."""
    return self.generates or bool(self.transform)

  @property
  def answers_labels(self) -> bool:
    """Whether a labelled text (data.label_key) trains it as "text -> label word" pairs,
    so that decoding answers with a class name: evaluate's label_accuracy and
    train.label_examples."""
    return self.reads_pairs and bool(self.transform)


_LM_INPUTS = ("inputs", "segment_ids", "positions")
_SEQ2SEQ_INPUTS = ("inputs", "inputs_segment_ids", "inputs_positions",
                   "decoder_inputs", "targets_segment_ids", "targets_positions")


@dataclasses.dataclass(frozen=True)
class Converter:
  """How a text-to-text objective's (inputs, targets) examples become one topology's
  rows (seqio's feature converters): the Objective fields it sets."""
  model_inputs: tuple[str, ...]
  sides: int = 1
  generates: bool = False
  translates: bool = False


# model.arch -> its converter; an arch not here (the encoder) trains no text-to-text
# objective. The decoder's `prefix` field is dropped with model.prefix_attention="causal".
CONVERTERS: dict[str, Converter] = {
    "encoder_decoder": Converter(_SEQ2SEQ_INPUTS, sides=2, translates=True),
    "decoder": Converter(_LM_INPUTS + ("prefix",), generates=True, translates=True),
}
PREFIX_ATTENTIONS = ("bidirectional", "causal")  # model.prefix_attention's values.
_TEXT_TO_TEXT = tuple(((arch, "lm") for arch in CONVERTERS))

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("causal_lm", pairs=(("decoder", "lm"),), model_inputs=_LM_INPUTS,
              pipeline="lm", generates=True, streams=True),
    Objective("masked_lm", pairs=(("encoder", "mlm"),), model_inputs=_LM_INPUTS,
              pipeline="mlm", streams=True),
    Objective("seq2seq", pairs=(("encoder_decoder", "lm"),), model_inputs=_SEQ2SEQ_INPUTS,
              sides=2, pipeline="seq2seq", translates=True, packs="packing",
              reads_pairs=True),
    Objective("classification", pairs=(("decoder", "classification"),
                                       ("encoder", "classification")),
              model_inputs=_LM_INPUTS, target="label", pipeline="classification",
              classifies=True, packs=False),
    Objective("span_corruption", pairs=_TEXT_TO_TEXT, model_inputs=(),
              pipeline="text_to_text", transform="span_corruption"),
    Objective("prefix_lm", pairs=_TEXT_TO_TEXT, model_inputs=(), pipeline="text_to_text",
              transform="prefix_lm", reads_pairs=True),
    Objective("ul2", pairs=_TEXT_TO_TEXT, model_inputs=(), pipeline="text_to_text",
              transform="ul2"),
)}
OBJECTIVE_NAMES = ("auto",) + tuple(OBJECTIVES)  # model.objective's values.

# (model.arch, model.head) -> the objective "auto" picks: which heads each topology can
# carry (the objectives before model.objective existed; text-to-text ones are explicit).
_BY_PAIR: dict[tuple[str, str], Objective] = {
    pair: o for o in OBJECTIVES.values() if not o.transform for pair in o.pairs}


def trains(arch: str, head: str = "") -> list[str]:
  """The objectives model.arch (and model.head, when given) can train, in table order."""
  return [o.name for o in OBJECTIVES.values()
          if any(a == arch and (not head or h == head) for a, h in o.pairs)]


def of(arch: str, head: str, objective: str = "auto",
       prefix_attention: str = "bidirectional") -> Objective:
  """The objective a (topology, head) pair trains under model.objective; raises
  ConfigError naming the key when the topology cannot train it."""
  if objective == "auto":
    if (arch, head) not in _BY_PAIR:
      valid = sorted(h for a, h in _BY_PAIR if a == arch)
      fail("model.head", head, f"model.arch={arch!r} supports heads {valid}")
    return _BY_PAIR[(arch, head)]
  if objective not in OBJECTIVES:
    fail("model.objective", objective, "valid values are "
         + ", ".join(repr(n) for n in OBJECTIVE_NAMES))
  entry = OBJECTIVES[objective]
  if (arch, head) not in entry.pairs:
    can = sorted({a for a, _ in entry.pairs})
    heads = sorted({h for a, h in entry.pairs if a == arch})
    if heads:
      fail("model.head", head, f"model.objective={objective!r} on model.arch={arch!r} "
           f"needs model.head={heads[0]!r}")
    fail("model.objective", objective, f"model.arch={arch!r} cannot train it (it trains "
         f"{trains(arch)}); {objective} trains on model.arch {can}")
  if not entry.transform:
    return entry
  converter = CONVERTERS[arch]
  inputs = converter.model_inputs
  if prefix_attention == "causal":
    inputs = tuple(k for k in inputs if k != "prefix")
  return dataclasses.replace(entry, pairs=((arch, head),), model_inputs=inputs,
                             sides=converter.sides, generates=converter.generates,
                             translates=converter.translates and entry.reads_pairs)


def resolve(model: Any) -> Objective:
  """The objective of `config.model` or a ModelConfig (.arch, .head, .objective and
  .prefix_attention)."""
  return of(model.arch, model.head, model.objective, model.prefix_attention)


def describe(serves: Callable[[Objective], bool]) -> str:
  """The objectives (each with the model.arch that trains it so) for which `serves` is
  true, for a mode's message: "causal_lm (decoder), span_corruption (encoder_decoder,
  decoder)"."""
  parts = []
  for name, entry in OBJECTIVES.items():
    archs = [arch for arch, head in entry.pairs if serves(of(arch, head, name))]
    if archs:
      parts.append(f"{name} ({', '.join(dict.fromkeys(archs))})")
  return ", ".join(parts) or "no objective"


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
