"""Text in, text out: translating and continuing with a trained model, and scoring the output.

  text -> ids (a source: ids + [eos]; a prompt: [bos] + ids, as in training)
  -> length policy (decode.overlong) -> sorted by length into batches of
  decode.batch_size, each padded to a power-of-two width bucket -> decoding.generate
  / generate_seq2seq -> ids up to eos -> tokenizer.decode, back in input order

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

from transformer.config.decode import DECODE_OVERLONG
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.data import packing
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
    model_config: an encoder-decoder's ModelConfig.
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
    return decoding.generate_seq2seq(
        model_config, params, tokens_BW, real_BW, max_length_offset=decode.max_length_offset,
        **search_options(decode, None if rng is None else jax.random.fold_in(rng, index)))

  return _decode_batches(run, sources_ids, decode.batch_size, limit, vocabularies.EOS_ID,
                         progress)


def translate_texts(model_config: ModelConfig, params: Any, tokenizer: vocabularies.Tokenizer,
                    texts: Sequence[str], decode: ml_collections.ConfigDict,
                    policy: LengthPolicy, *, names: Sequence[str] | None = None,
                    rng: jax.Array | None = None,
                    progress: progress_lib.Progress | None = None) -> list[str]:
  """Translates sentences; an empty (or whitespace-only) sentence gives "".

  Args:
    model_config, params, decode, rng: as for `translate_ids`.
    tokenizer: the run's tokenizer (`run_vocabulary.load_workdir_tokenizer`).
    texts: the sentences.
    policy: the length policy; sources are ids + [eos] as in training, at most
      `policy.limit` tokens (a truncated one keeps its first limit - 1 ids and eos).
    names: how warnings name each sentence ("line 12"); default "sentence <i + 1>".
    progress: counts finished sentences (empty ones included).

  Returns:
    The detokenized translations, in input order.
  """
  names = names or [f"sentence {i + 1}" for i in range(len(texts))]
  kept, ids = [], []
  for i, text in enumerate(texts):
    if not text.strip():
      continue
    tokens = tokenizer.encode(text)
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
    texts_out[i] = tokenizer.decode(output)
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
