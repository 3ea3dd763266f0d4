"""Text in, text out: translating and continuing with a trained model, and scoring the output.

  text -> ids (a source: ids + [eos]; a prompt: [bos] + ids, as in training)
  -> length policy (decode.overlong) -> sorted by length into batches of
  decode.batch_size, each padded to a power-of-two width bucket -> decoding.generate
  / generate_seq2seq -> ids up to eos -> tokenizer.decode, back in input order

A source reaches either topology as its training rows held it (data/denoise.py): an
encoder-decoder reads ids + [eos] on the encoder side and decodes from bos; a decoder
trained on pairs (a prefix LM) reads [bos] ids [eos] as its prompt, bidirectionally
when its objective has a prefix (decoding.prompt_is_prefix), and continues it with the
target. A text-to-text objective's text (span corruption, UL2) writes its sentinels
`<extra_id_N>` in and out (data/tokenizers/sentinels.py).

Every batch has the same number of rows (short ones are filled with one-token rows
whose output is dropped) and widths come from a few buckets, so a file of any mix of
lengths compiles a handful of programs, not one per length. Rows decode independently
(see decoding.py), so neither batching nor order changes a translation.

Scores are sacreBLEU's BLEU and chrF on detokenized text against the raw reference
text, with their signatures. What the training loop decodes at each evaluation is in
training/decode_hook.py.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from transformer.config import objective as objective_lib
from transformer.config.decode import DECODE_OVERLONG
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.data import packing
from transformer.data.tokenizers import sentinels as sentinels_lib
from transformer.data.tokenizers import vocabularies
from transformer.inference import decoding
from transformer.workdir import progress as progress_lib

OVERLONG = DECODE_OVERLONG
MIN_BUCKET = 8  # The narrowest padded width; buckets double from here.
_NAMED_WARNINGS = 10  # Overlong inputs warned about one by one; after that only counted.


# ---------------------------------------------------------------- decode.* settings


def _bad(key: str, value: Any, valid: str) -> ConfigError:
  return ConfigError(f"config.decode.{key}={value!r} is invalid: {valid}")


def search_options(decode: ml_collections.ConfigDict, rng: jax.Array | None) -> dict[str, Any]:
  """decoding.generate[_seq2seq] keywords for decode.*: sampling, greedy or beam search.

  Temperature > 0 samples (with top_k / top_p) and does not use beam_size; at
  temperature 0, beam_size 1 is greedy and beam_size > 1 is beam search with `alpha`.
  """
  if decode.temperature > 0:
    return dict(beam_size=None, temperature=float(decode.temperature), top_k=decode.top_k,
                top_p=float(decode.top_p), rng=rng)
  return dict(beam_size=decode.beam_size if decode.beam_size > 1 else None,
              alpha=float(decode.alpha))


def describe_search(decode: ml_collections.ConfigDict) -> dict[str, Any]:
  """The decoding settings that produced an output, for result files and logs."""
  if decode.temperature > 0:
    return dict(search="sampling", temperature=decode.temperature, top_k=decode.top_k,
                top_p=decode.top_p)
  if decode.beam_size > 1:
    return dict(search="beam", beam_size=decode.beam_size, alpha=decode.alpha)
  return dict(search="greedy")


# ---------------------------------------------------------------- lengths and batches


def source_context(config: ml_collections.ConfigDict) -> int:
  """The longest source or prompt, eos/bos included: min(data.seq_len, model.max_len).

  The model saw no longer rows in training, and learned or sinusoidal position
  tables end at model.max_len.
  """
  return min(config.data.seq_len, config.model.max_len)


def source_limit(config: ml_collections.ConfigDict) -> int:
  """The longest source, eos included: the context for an encoder-decoder; half of it
  for a decoder, whose rows held the source and the target (data/denoise.py's pairs:
  seq_len // 2 source tokens)."""
  context = source_context(config)
  return context // 2 if config.model.arch == "decoder" else context


def source_policy(config: ml_collections.ConfigDict, overlong: str) -> "LengthPolicy":
  """The length policy of sources (translate, evaluate's BLEU, a text-to-text generate)."""
  where = ("half of min(data.seq_len, model.max_len), eos included: a decoder's row "
           "holds the target too" if config.model.arch == "decoder"
           else "min(data.seq_len, model.max_len), eos included")
  return LengthPolicy(overlong, source_limit(config), "source", where)


def sentinel_count(config: ml_collections.ConfigDict) -> int:
  """train.num_sentinels for a text-to-text objective (its texts hold `<extra_id_N>`);
  0 for the others, whose texts are read literally."""
  return config.train.num_sentinels if objective_lib.resolve(config.model).transform else 0


def encode_text(tokenizer: vocabularies.Tokenizer, text: str, num_sentinels: int) -> np.ndarray:
  """Ids of `text`; with `num_sentinels`, each `<extra_id_N>` (and UL2's [R], [S], [X])
  is its sentinel (paradigm) id."""
  if num_sentinels:
    return sentinels_lib.encode(tokenizer, text, num_sentinels)
  return np.asarray(tokenizer.encode(text), np.int32)


def decode_ids(tokenizer: vocabularies.Tokenizer, ids: Sequence[int], num_sentinels: int) -> str:
  """Text of `ids`; with `num_sentinels`, sentinels are written `<extra_id_N>`."""
  if num_sentinels:
    return sentinels_lib.decode(tokenizer, ids, num_sentinels)
  return tokenizer.decode(ids)


class LengthPolicy:
  """Applies decode.overlong to sources and prompts, naming what it cut (the first few)."""

  def __init__(self, overlong: str, limit: int, what: str, hint: str):
    if overlong not in OVERLONG:
      raise _bad("overlong", overlong, f"valid values are {OVERLONG}")
    self.overlong, self.limit, self.what, self.hint = overlong, limit, what, hint
    self.truncated: list[str] = []

  def check(self, length: int, name: str) -> None:
    """Raises (overlong="error") or records a cut (truncate) for an input of `length` tokens."""
    if length <= self.limit:
      return
    message = (f"{name} has {length} tokens, more than the {self.limit} a {self.what} may "
               f"have ({self.hint})")
    if self.overlong == "error":
      raise ConfigError(f"{message}; config.decode.overlong='error'. Shorten or split it, "
                        "or set config.decode.overlong='truncate'")
    self.truncated.append(name)
    if len(self.truncated) <= _NAMED_WARNINGS:
      logging.warning("%s: truncated (config.decode.overlong='truncate')", message)

  def summary(self) -> None:
    """Logs how many inputs were cut when more were than the named ones."""
    if len(self.truncated) > _NAMED_WARNINGS:
      logging.warning("%d %ss were truncated to %d tokens in all (the first %d named above)",
                      len(self.truncated), self.what, self.limit, _NAMED_WARNINGS)


def bucket_width(length: int, limit: int) -> int:
  """The padded width of a batch whose longest row is `length`: a power of two, <= limit."""
  width = MIN_BUCKET
  while width < length:
    width *= 2
  return min(width, limit)


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
  """Indices of `lengths` in batches of similar length, longest first.

  Longest first: the largest program compiles, and runs out of memory if it must,
  before any other work is done.
  """
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _host(x: jax.Array) -> np.ndarray:
  """A decoding output on this host, also when it is sharded over several processes."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _until_eos(row: np.ndarray) -> np.ndarray:
  """A decoded row's tokens before its first eos (the rest is eos and padding)."""
  ends = np.flatnonzero(row == vocabularies.EOS_ID)
  return row[:ends[0]] if ends.size else row[row != vocabularies.PAD_ID]


def _decode_batches(run: Callable[[np.ndarray, np.ndarray, int], jax.Array],
                    inputs: Sequence[np.ndarray], batch_size: int, limit: int,
                    filler: int, progress: progress_lib.Progress | None) -> list[np.ndarray]:
  """Pads `inputs` into length-sorted batches, runs each, returns outputs in input order.

  `run(tokens_BW, real_BW, batch_index)` decodes one batch; a row that only fills the
  batch holds the single token `filler` and its output is dropped.
  """
  outputs: list[np.ndarray] = [np.zeros((0,), np.int32)] * len(inputs)
  if not inputs:
    return outputs
  rows = min(batch_size, len(inputs))
  for index, batch in enumerate(length_sorted_batches([len(x) for x in inputs], rows)):
    width = bucket_width(max(len(inputs[i]) for i in batch), limit)
    tokens_BW = np.zeros((rows, width), np.int32)
    tokens_BW[len(batch):, 0] = filler
    for row, i in enumerate(batch):
      tokens_BW[row, :len(inputs[i])] = inputs[i]
    real_BW = (tokens_BW != vocabularies.PAD_ID).astype(np.int32)
    result_BT = _host(run(tokens_BW, real_BW, index))
    for row, i in enumerate(batch):
      outputs[i] = _until_eos(result_BT[row])
    if progress:
      progress.update(len(batch))
  return outputs


# ---------------------------------------------------------------- translation


def translate_ids(model_config: ModelConfig, params: Any, sources_ids: Sequence[np.ndarray],
                  decode: ml_collections.ConfigDict, limit: int, *,
                  rng: jax.Array | None = None,
                  progress: progress_lib.Progress | None = None) -> list[np.ndarray]:
  """Decodes each source (non-empty ids ending in eos, at most `limit` long) to target ids.

  Args:
    model_config: an encoder-decoder's ModelConfig, or a decoder's trained on pairs
      (its prompt: [bos] source, `_continue_source`).
    params: its parameters (call inside the run's mesh context when they are sharded).
    sources_ids: one id array per sentence.
    decode: config.decode (beam_size, alpha, max_length_offset, temperature, ...).
    limit: the widest padded source.
    rng: PRNG key when sampling; batch b uses fold_in(rng, b).
    progress: counts finished sentences.

  Returns:
    Each sentence's target ids before its eos, in input order.
  """
  def run(tokens_BW, real_BW, index):
    search = search_options(decode, None if rng is None else jax.random.fold_in(rng, index))
    if model_config.arch == "encoder_decoder":
      return decoding.generate_seq2seq(model_config, params, tokens_BW, real_BW,
                                       max_length_offset=decode.max_length_offset, **search)
    return _continue_source(model_config, params, tokens_BW, decode.max_length_offset,
                            search)

  return _decode_batches(run, sources_ids, decode.batch_size, limit, vocabularies.EOS_ID,
                         progress)


def _continue_source(model_config: ModelConfig, params: Any, sources_BW: np.ndarray,
                     max_length_offset: int, search: dict[str, Any]) -> jax.Array:
  """A decoder's targets of right-padded sources: [bos] source (eos included) is the
  prompt, as its training rows began; at most width + max_length_offset tokens, within
  model.max_len's positions."""
  rows, width = sources_BW.shape
  prompts_BP = np.concatenate([np.full((rows, 1), vocabularies.BOS_ID, np.int32),
                               sources_BW], axis=1)
  steps = max(1, min(width + max_length_offset, model_config.max_len - width))
  return decoding.generate(model_config, params, prompts_BP, steps, **search)


def translate_texts(model_config: ModelConfig, params: Any, tokenizer: vocabularies.Tokenizer,
                    texts: Sequence[str], decode: ml_collections.ConfigDict,
                    policy: LengthPolicy, *, names: Sequence[str] | None = None,
                    rng: jax.Array | None = None,
                    progress: progress_lib.Progress | None = None,
                    num_sentinels: int = 0) -> list[str]:
  """Translates sentences; an empty (or whitespace-only) sentence gives "".

  Args:
    model_config, params, decode, rng: as for `translate_ids`.
    tokenizer: the run's tokenizer (`run_vocabulary.load_workdir_tokenizer`).
    texts: the sentences.
    policy: the length policy; sources are ids + [eos] as in training, at most
      `policy.limit` tokens (a truncated one keeps its first limit - 1 ids and eos).
    names: how warnings name each sentence ("line 12"); default "sentence <i + 1>".
    progress: counts finished sentences (empty ones included).
    num_sentinels: `sentinel_count`: > 0 reads and writes `<extra_id_N>` as sentinels.

  Returns:
    The detokenized translations, in input order.
  """
  names = names or [f"sentence {i + 1}" for i in range(len(texts))]
  kept, ids = [], []
  for i, text in enumerate(texts):
    if not text.strip():
      continue
    tokens = encode_text(tokenizer, text, num_sentinels)
    policy.check(len(tokens) + 1, names[i])
    kept.append(i)
    ids.append(np.append(tokens[:policy.limit - 1], vocabularies.EOS_ID).astype(np.int32))
  policy.summary()
  if progress:
    progress.update(len(texts) - len(kept))
  outputs = translate_ids(model_config, params, ids, decode, policy.limit, rng=rng,
                          progress=progress)
  texts_out = [""] * len(texts)
  for i, output in zip(kept, outputs):
    texts_out[i] = decode_ids(tokenizer, output, num_sentinels)
  return texts_out


# ---------------------------------------------------------------- continuation


def continue_texts(model_config: ModelConfig, params: Any, tokenizer: vocabularies.Tokenizer,
                   prompts: Sequence[str], decode: ml_collections.ConfigDict,
                   policy: LengthPolicy, *, max_new_tokens: int,
                   names: Sequence[str] | None = None,
                   rng: jax.Array | None = None,
                   progress: progress_lib.Progress | None = None) -> list[str]:
  """Continues each prompt with a decoder LM; returns the continuations' text.

  A prompt is [bos] + ids, as the training documents begin. `policy.limit` is the
  prompt room, the context minus max_new_tokens - 1; a longer prompt keeps its last
  tokens (the text next to the continuation) when truncated.

  Args:
    model_config: a decoder LM's ModelConfig.
    params: its parameters.
    tokenizer: the run's tokenizer.
    prompts: non-empty texts.
    decode: config.decode; search as `search_options`.
    policy: the length policy over [bos] + ids.
    max_new_tokens: the most tokens added to each prompt.
    names: how messages name each prompt; default "prompt <i + 1>".
    rng: PRNG key when sampling.
    progress: counts finished prompts.

  Returns:
    One continuation per prompt (what follows the prompt, up to eos), in input order.
  """
  names = names or [f"prompt {i + 1}" for i in range(len(prompts))]
  ids = []
  for name, prompt in zip(names, prompts):
    if not prompt:
      raise ConfigError(f"{name} is empty: give text to continue")
    tokens = np.concatenate([[vocabularies.BOS_ID], tokenizer.encode(prompt)]).astype(np.int32)
    policy.check(len(tokens), name)
    ids.append(tokens if len(tokens) <= policy.limit else tokens[len(tokens) - policy.limit:])
  policy.summary()

  def run(tokens_BW, _, index):
    return decoding.generate(
        model_config, params, tokens_BW, max_new_tokens,
        **search_options(decode, None if rng is None else jax.random.fold_in(rng, index)))

  outputs = _decode_batches(run, ids, decode.batch_size, policy.limit, vocabularies.BOS_ID,
                            progress)
  return [tokenizer.decode(output) for output in outputs]


def prompt_policy(config: ml_collections.ConfigDict, max_new_tokens: int,
                  overlong: str) -> LengthPolicy:
  """The length policy of prompts: [bos] + ids + max_new_tokens - 1 within the context."""
  context = source_context(config)
  room = context - max_new_tokens + 1
  if room < 2:  # bos and at least one token of text.
    raise ConfigError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                      f"context of {context} tokens (min(data.seq_len, model.max_len)); "
                      f"expected at most {context - 1}")
  return LengthPolicy(overlong, room, "prompt",
                      f"the context of {context} tokens minus max_new_tokens={max_new_tokens} "
                      "- 1, bos included")


def generate_serves(objective: objective_lib.Objective) -> bool:
  """Whether --mode=generate (and api.Model.generate, training's sample) serve
  `objective`: its `answers_prompts` (a decoder's: it continues prompts; a text-to-text
  one on any topology: it answers them)."""
  return objective.answers_prompts


def generate_texts(config: ml_collections.ConfigDict, model_config: ModelConfig, params: Any,
                   tokenizer: vocabularies.Tokenizer, prompts: Sequence[str],
                   decode: ml_collections.ConfigDict, *, max_new_tokens: int, overlong: str,
                   names: Sequence[str] | None = None, rng: jax.Array | None = None,
                   progress: progress_lib.Progress | None = None) -> list[str]:
  """What --mode=generate (and training's sample) makes of each prompt.

  A causal LM continues [bos] prompt by up to `max_new_tokens` (`continue_texts`). A
  text-to-text model (span corruption, prefix LM, UL2; either topology) reads the prompt
  as its training examples' inputs and answers with their targets (`translate_texts`:
  the encoder's source, or a decoder's [bos] prompt [eos] prefix); a prompt holding
  `<extra_id_N>` gets those sentinels, and the answer shows the spans it fills as
  `<extra_id_0> ... <extra_id_1> ...`. Its length is bounded by decode.max_length_offset
  past the prompt, as a translation's.
  """
  if not objective_lib.resolve(model_config).transform:
    return continue_texts(model_config, params, tokenizer, prompts, decode,
                          prompt_policy(config, max_new_tokens, overlong),
                          max_new_tokens=max_new_tokens, names=names, rng=rng,
                          progress=progress)
  names = names or [f"prompt {i + 1}" for i in range(len(prompts))]
  for name, prompt in zip(names, prompts):
    if not prompt.strip():
      raise ConfigError(f"{name} is empty: give text to fill or answer")
  return translate_texts(model_config, params, tokenizer, prompts, decode,
                         source_policy(config, overlong), names=names, rng=rng,
                         progress=progress, num_sentinels=sentinel_count(config))


# ---------------------------------------------------------------- scores


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
  """sacreBLEU's corpus BLEU and chrF with one reference per sentence, and their signatures.

  Args:
    hypotheses: detokenized system outputs.
    references: the raw reference texts, aligned with `hypotheses`.

  Returns:
    {"bleu", "chrf": floats on a 0-100 scale, "bleu_detail": sacreBLEU's line
    (n-gram precisions, brevity penalty), "bleu_signature", "chrf_signature"}.
  """
  from sacrebleu.metrics import BLEU, CHRF  # pylint: disable=g-import-not-at-top
  if not hypotheses or len(hypotheses) != len(references):
    raise ValueError(f"BLEU needs aligned, non-empty lists; got {len(hypotheses)} "
                     f"hypotheses and {len(references)} references")
  bleu, chrf = BLEU(), CHRF()
  bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
  chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
  return {"bleu": bleu_score.score, "chrf": chrf_score.score,
          "bleu_detail": str(bleu_score), "bleu_signature": str(bleu.get_signature()),
          "chrf_signature": str(chrf.get_signature())}


def source_and_reference_texts(data: ml_collections.ConfigDict, source: Any,
                      max_examples: int = 0) -> tuple[list[str], list[str]]:
  """(source texts, reference texts) of the first `max_examples` (0: all) split examples."""
  count = len(source) if max_examples <= 0 else min(max_examples, len(source))
  texts, references = [], []
  for i in range(count):
    example = source[i]
    texts.append(packing.text_of(example[data.source_language]))
    references.append(packing.text_of(example[data.target_language]))
  return texts, references


def labelled_texts(data: ml_collections.ConfigDict, source: Any, names: Sequence[str],
                   max_examples: int = 0) -> tuple[list[str], list[str]]:
  """(texts, their label names) of the first `max_examples` (0: all) examples of a
  labelled split (data.text_key, data.label_key; `names` its class names), as the
  text-to-text pairs train on them."""
  count = len(source) if max_examples <= 0 else min(max_examples, len(source))
  texts, labels = [], []
  for i in range(count):
    example = source[i]
    texts.append(packing.text_of(example[data.text_key]))
    labels.append(names[int(example[data.label_key])])
  return texts, labels


def label_scores(outputs: Sequence[str], labels: Sequence[str],
                 names: Sequence[str]) -> dict[str, float]:
  """A labelled text answered text-to-text: `label_accuracy`, the share of `outputs`
  that are exactly their label's name (surrounding spaces aside), and `label_unknown`,
  the share that name no class of `names` (--mode=evaluate and in-training
  train.label_examples both score so)."""
  words = [output.strip() for output in outputs]
  return {"label_accuracy": sum(w == l for w, l in zip(words, labels)) / len(labels),
          "label_unknown": sum(w not in names for w in words) / len(labels)}
