"""Text-to-text pipelines: documents -> (inputs, targets) examples -> a topology's rows.

seqio's shape (config/objective.py's table): a transform per objective, a converter
per topology.

  documents -> windows of W tokens (lm.packed_rows: tokenized, concatenated and split;
               a prepared corpus's token ids; a mixture's components by weight)
     or pairs (prefix_lm on translation pairs, or a labelled text as "text -> label")
  -> a denoiser drawn per example (config/denoisers.py; ul2: by train.ul2_weights)
     makes (inputs, targets), its noise from grain's per-example seeded generator;
     in evaluation, a ul2 example also carries its denoiser's tag, spread over its
     tokens by the converter (a packed row may hold examples of several denoisers)
  -> encoder_decoder: the two sides packed first-fit, one segment id per example on
     both (seq2seq.py's packing and decoder inputs)
     decoder: [bos] inputs targets as one sequence, next-token inputs and targets,
     the loss on the targets only, `prefix` 1 on [bos] and the inputs, packed first-fit
  -> batch

The noise of example n is drawn from a generator seeded by (seed, process, n) (grain's
random_map over the stream of windows, as lm.py's masked LM): a restored iterator
draws the same noise again, and two processes never draw the same.
"""

from __future__ import annotations

from typing import Any

import grain
import grain.experimental
import numpy as np

from transformer.config import denoisers as denoisers_lib
from transformer.data import lm
from transformer.data import packing
from transformer.data import seq2seq
from transformer.data.corpus import mixture
from transformer.data.tokenizers import sentinels
from transformer.data.tokenizers import vocabularies

Example = dict[str, np.ndarray]
TAG = denoisers_lib.TAG_FIELD  # An example's denoiser tag; in a row, each token's.


def random_spans_noise_mask(length: int, density: float, mean_span: float,
                            rng: np.random.Generator) -> np.ndarray:
  """T5's random_spans_noise_mask: a [length] bool mask of noise spans.

  round(length x density) noise tokens (at least 1, at most length - 1) in
  max(1, round(noise / mean_span)) spans; kept and noise spans alternate, a kept span
  first and a noise span last, each span's length a uniformly random segmentation.
  """
  noise, spans = denoisers_lib.noise_counts(length, density, mean_span)

  def segment_lengths(items: int) -> np.ndarray:
    # T5's _random_segmentation: `spans` non-empty segments of `items`, uniformly.
    first = np.concatenate([[0], rng.permutation(np.arange(items - 1) < spans - 1)])
    return np.bincount(np.cumsum(first), minlength=spans)

  interleaved = np.stack([segment_lengths(length - noise), segment_lengths(noise)],
                         axis=1).reshape(-1)
  span_index = np.repeat(np.arange(2 * spans), interleaved)
  return span_index % 2 == 1


def spans_to_sentinels(tokens: np.ndarray, noise: np.ndarray,
                       sentinel_ids: np.ndarray) -> np.ndarray:
  """T5's noise_span_to_unique_sentinel: each run of `noise` tokens becomes one sentinel
  (the i-th run sentinel_ids[i]); the other tokens stay."""
  first = noise & ~np.concatenate([[False], noise[:-1]])
  out = np.where(first, sentinel_ids[np.cumsum(first) - 1], tokens)
  return out[~noise | first].astype(np.int32)


class Denoise(grain.transforms.RandomMap):
  """A window (lm.packed_rows' row) -> one (inputs, targets) example of a denoiser drawn
  by weight: span corruption or a prefix-LM split, both sides ending in eos, a UL2
  paradigm token first when the denoiser has one."""

  def __init__(self, denoisers: tuple[tuple[denoisers_lib.Denoiser, float], ...],
               tokenizer: vocabularies.Tokenizer, num_sentinels: int, tag: bool = False):
    """`tag`: each example also carries its denoiser's tag (denoisers.TAG_FIELD, a
    scalar the converters spread over its tokens), for evaluation's loss per kind."""
    self._tag = tag
    kept = [(d, w) for d, w in denoisers if w > 0]
    self._denoisers = [d for d, _ in kept]
    weights = np.asarray([w for _, w in kept], np.float64)
    self._weights = weights / weights.sum()
    self._sentinels = sentinels.sentinel_ids(tokenizer, num_sentinels)
    self._paradigms = [sentinels.paradigm_id(tokenizer, i, num_sentinels)
                       for i in range(len(denoisers_lib.UL2_PARADIGMS))]

  def random_map(self, row: dict[str, np.ndarray], rng: np.random.Generator) -> Example:
    tokens = row["tokens"][row["tokens_segment_ids"] > 0]  # Eval's last window: shorter.
    denoiser = self._denoisers[int(rng.choice(len(self._denoisers), p=self._weights))]
    example = denoise(denoiser, tokens, rng, self._sentinels, self._paradigms)
    if self._tag:
      example[TAG] = np.asarray(denoisers_lib.tag_of(denoiser), np.int32)
    return example


def denoise(denoiser: denoisers_lib.Denoiser, tokens: np.ndarray, rng: np.random.Generator,
            sentinel_ids: np.ndarray, paradigm_ids: list[int]) -> Example:
  """One window's (inputs, targets) by `denoiser` (config/denoisers.py), eos-ended."""
  eos = [vocabularies.EOS_ID]
  if len(tokens) < 2:  # Nothing to split or corrupt: all of it is the target.
    inputs, targets = np.zeros(0, np.int32), tokens
  elif denoiser.prefix:
    split = int(rng.integers(1, len(tokens)))
    inputs, targets = tokens[:split], tokens[split:]
  else:
    noise = random_spans_noise_mask(len(tokens), denoiser.density, denoiser.mean_span, rng)
    inputs = spans_to_sentinels(tokens, noise, sentinel_ids)
    targets = spans_to_sentinels(tokens, ~noise, sentinel_ids)
  paradigm = [paradigm_ids[denoiser.paradigm]] if denoiser.paradigm >= 0 else []
  return {"inputs": np.concatenate([paradigm, inputs, eos]).astype(np.int32),
          "targets": np.concatenate([targets, eos]).astype(np.int32)}


def decoder_example(example: Example) -> Example:
  """(inputs, targets) -> one decoder sequence [bos] inputs targets, as next-token
  inputs and targets of the same length: the loss weight 1 on the targets, the prefix
  1 on [bos] and the inputs (seqio's PrefixLMFeatureConverter)."""
  inputs, targets = example["inputs"], example["targets"]
  sequence = np.concatenate([[vocabularies.BOS_ID], inputs, targets]).astype(np.int32)
  steps = np.arange(len(sequence) - 1)
  out = {"inputs": sequence[:-1], "targets": sequence[1:],
         "weights": (steps >= len(inputs)).astype(np.float32),
         "prefix": (steps <= len(inputs)).astype(np.int32)}
  if TAG in example:  # Every token of the example: packed rows mix denoisers.
    out[TAG] = np.full(len(steps), example[TAG], np.int32)
  return out


def tag_targets(example: Example) -> Example:
  """An encoder-decoder example's tag on each of its target tokens (where its loss is)."""
  return {**example, TAG: np.full(len(example["targets"]), example[TAG], np.int32)}


def encoder_decoder_row(row: dict[str, np.ndarray]) -> packing.Batch:
  """Packed pairs -> seq2seq's keys (seq2seq.add_decoder_inputs), the tags kept."""
  out = seq2seq.add_decoder_inputs(row)
  if TAG in row:
    out[TAG] = row[TAG].astype(np.int32)
  return out


class DecoderRow(grain.transforms.Map):
  """Packed decoder sequences -> the model's keys (padding: weight 0, no prefix); the
  `prefix` field only with model.prefix_attention="bidirectional" (`prefix`)."""

  def __init__(self, prefix: bool):
    self._prefix = prefix

  def map(self, row: dict[str, np.ndarray]) -> packing.Batch:
    out = {"inputs": row["inputs"], "targets": row["targets"],
           "segment_ids": row["inputs_segment_ids"], "positions": row["inputs_positions"],
           "weights": row["weights"].astype(np.float32)}
    if self._prefix:
      out["prefix"] = row["prefix"].astype(np.int32)
    if TAG in row:
      out[TAG] = row[TAG].astype(np.int32)
    return out


def pack_examples(examples: grain.IterDataset, arch: str, seq_len: int, batch_size: int,
                  prefix: bool, tagged: bool = False) -> grain.IterDataset:
  """A topology's rows (not yet batched) from (inputs, targets) examples, first-fit
  packed (`prefix`: a decoder's rows carry it); with `tagged` (examples holding
  denoisers.TAG_FIELD) each token carries its example's tag, 0 on padding."""
  tag = (TAG,) if tagged else ()
  if arch == "decoder":
    it = examples.map(decoder_example)
    it = grain.experimental.FirstFitPackIterDataset(
        it, length_struct={k: seq_len for k in ("inputs", "targets", "weights", "prefix") + tag},
        num_packing_bins=batch_size, shuffle_bins=False)
    return it.map(DecoderRow(prefix))
  if tagged:
    examples = examples.map(tag_targets)
  it = grain.experimental.FirstFitPackIterDataset(
      examples, length_struct={k: seq_len for k in ("inputs", "targets") + tag},
      num_packing_bins=batch_size, shuffle_bins=False)
  return it.map(encoder_decoder_row)


class _LabelPair:
  """The `inputs_fn` of a labelled text: (text, the label's name) (a class: it pickles)."""

  def __init__(self, text_key: str, label_key: str, names: tuple[str, ...]):
    self._text_key, self._label_key, self._names = text_key, label_key, names

  def __call__(self, example: dict[str, Any]) -> list[tuple[str, str]]:
    return [(packing.text_of(example[self._text_key]),
             self._names[int(example[self._label_key])])]


def label_pairs(text_key: str, label_key: str, names: tuple[str, ...]) -> seq2seq.InputsFn:
  """An `inputs_fn` for a labelled text: example -> [(text, names[label])]."""
  return _LabelPair(text_key, label_key, tuple(names))


def make_text_to_text_dataset(source: Any, tokenizer: vocabularies.Tokenizer, *,
                              denoisers: tuple[tuple[denoisers_lib.Denoiser, float], ...],
                              arch: str, num_sentinels: int, text_key: str,
                              vocab_size: int, seq_len: int, batch_size: int, seed: int,
                              train: bool, shuffle_rows: int = 0,
                              process_index: int = 0, process_count: int = 1,
                              num_threads: int = 2, prepared: bool = False,
                              inputs_fn: seq2seq.InputsFn | None = None,
                              overlong: str = "truncate",
                              prefix: bool = True) -> grain.IterDataset:
  """A text-to-text objective's pipeline: denoised windows (or given pairs) as rows of
  `arch` (config/objective.py's converters).

  Args:
    source, tokenizer, text_key, vocab_size, seq_len, batch_size, seed, train,
      shuffle_rows, process_index, process_count, num_threads, prepared: as for
      `lm.make_lm_dataset`.
    denoisers: the objective's (denoiser, weight) pairs (config/denoisers.denoisers).
    arch: "encoder_decoder" or "decoder": the converter.
    num_sentinels: train.num_sentinels (sentinel and paradigm ids: sentinels.py).
    inputs_fn: pairs instead of windows (prefix_lm on translation or labelled data):
      example -> [(inputs text, targets text)]; each side ids + [eos], a side too long
      for its row treated by `overlong` (a decoder row holds seq_len // 2 input tokens
      and the rest for the targets).
    overlong: data.overlong, for pairs.
    prefix: a decoder's rows carry the `prefix` field (model.prefix_attention=
      "bidirectional"); without it they are a plain LM's (T5 Table 2's LM arm).

  Returns:
    A grain IterDataset of batches: seq2seq.make_seq2seq_dataset's keys on an
    encoder-decoder; a decoder's `inputs`, `targets`, `segment_ids`, `positions`,
    `prefix` (int32; with `prefix`) and `weights` (float32, 1 on the target tokens only).
    Evaluation's rows of a mixture of kinds (ul2: denoisers.tag_names) also carry
    denoisers.TAG_FIELD (int32, aligned with `targets`): each token's denoiser tag,
    per packed example, 0 on padding; training's never do (its step is unchanged).
  """
  if inputs_fn is not None:
    sides = (seq_len, seq_len) if arch != "decoder" else (seq_len // 2, seq_len - seq_len // 2)
    limit = packing.LengthLimit(overlong, "text-to-text pairs" + ("" if train else " eval"))
    tokenize = seq2seq.TokenizePairs(tokenizer, inputs_fn, vocab_size, *sides, limit)
    it = packing.documents(source, tokenize, seed=seed, train=train,
                           process_index=process_index, process_count=process_count,
                           num_threads=num_threads)
    it = grain.experimental.FlatMapIterDataset(it, packing.Unlist(
        packing.shard_size(source, process_index, process_count), train,
        "no (inputs, targets) pair came out of them; check the text and label features"))
    return pack_examples(it, arch, seq_len, batch_size, prefix).batch(
        batch_size, drop_remainder=train)
  window = denoisers_lib.window_length(tuple(d for d, w in denoisers if w > 0), arch, seq_len)
  it = mixture.mix_rows(source, lambda split, index: lm.packed_rows(
      split, tokenizer, text_key=text_key, vocab_size=vocab_size, row_len=window,
      seed=mixture.component_seed(seed, index), train=train, shuffle_rows=shuffle_rows,
      process_index=process_index, process_count=process_count, num_threads=num_threads,
      prepared=prepared))
  # Fold in the process: otherwise every host would draw the same noise per window.
  noise_seed = int(np.random.SeedSequence((seed, process_index)).generate_state(1)[0])
  tagged = not train and bool(denoisers_lib.tag_names(denoisers))
  it = it.random_map(Denoise(denoisers, tokenizer, num_sentinels, tagged), seed=noise_seed)
  return pack_examples(it, arch, seq_len, batch_size, prefix, tagged).batch(
      batch_size, drop_remainder=train)
