"""Passkey retrieval: does a decoder LM find a key hidden at some depth of a long context?

The synthetic test of Mohtashami & Jaggi 2023 ("Landmark Attention", the passkey task
that long-context papers since report): an instruction, then filler sentences that
say nothing, with one needle among them at a chosen depth,

  [bos] There is an important info hidden inside a lot of irrelevant text. ...
  The grass is green. The sky is blue. The sun is yellow. Here we go. There and back
  again. The grass is green. ... The pass key is 71432. Remember it. 71432 is the pass
  key. The grass is green. ... What is the pass key? The pass key is 71432

and the model must continue the question with the key. Everything is generated here,
offline, from the run's own tokenizer: `length` is the number of tokens the model
reads (as data.seq_len), so the row is exactly that long whatever the tokenizer; the
filler is cut to fit, and the needle goes at the sentence boundary nearest to `depth`
x the filler (0: right after the instruction, 1: right before the question). The keys
are drawn from `alphabet` by a generator seeded with (seed, length, depth, trial):
the same settings give the same prompts.

Scoring is greedy decoding, computed in one forward pass: a key is retrieved when the
argmax of the model's next-token distribution is the key's token at every one of the
key's positions, given the prompt and the key's earlier tokens (teacher forcing). By
induction this is exactly "greedy decoding of the prompt starts with the key", without
a KV cache (so any length the model's positions allow is scored, past model.max_len
for RoPE). The log-probability of the whole key is reported beside the accuracy, a
graded measure that still moves when accuracy is 0 or 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.data.tokenizers import vocabularies
from transformer.model import objectives
from transformer.model import positions as positions_lib
from transformer.model.models import make_model

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
         "memorize it. I will quiz you about the important information there.")
FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
          "There and back again.")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
DIGITS = "0123456789"


@dataclasses.dataclass(frozen=True)
class PasskeyPrompt:
  """One prompt: `length` + 1 token ids, the key's tokens last.

  Attributes:
    length: the tokens the model reads (tokens[:-1]); it predicts tokens[1:].
    depth: the depth asked for, in [0, 1].
    trial: which of the cell's prompts this is (it seeds the key).
    key: the passkey text.
    tokens: [length + 1] int32 ids: [bos], the instruction, filler with the needle,
      the question and the key.
    key_tokens: how many of the last ids are the key.
    needle_start: the index in `tokens` of the needle's first id.
    placed_depth: the depth the needle got: filler ids before it / all filler ids.
  """

  length: int
  depth: float
  trial: int
  key: str
  tokens: np.ndarray
  key_tokens: int
  needle_start: int
  placed_depth: float


def _encode(tokenizer: vocabularies.Tokenizer, text: str) -> np.ndarray:
  return np.asarray(tokenizer.encode(text), np.int32)


def check_alphabet(tokenizer: vocabularies.Tokenizer, alphabet: str, flag: str) -> None:
  """Refuses an alphabet with a character the tokenizer has no token for (it would be unk)."""
  unknown = [c for c in dict.fromkeys(alphabet) if vocabularies.UNK_ID in _encode(tokenizer, c)]
  if not alphabet or unknown:
    known = "".join(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + DIGITS
                    if vocabularies.UNK_ID not in _encode(tokenizer, c))
    raise ConfigError(
        f"{flag}={alphabet!r}: " + (f"the run's tokenizer has no token for {unknown!r}"
                                    if unknown else "empty")
        + f"; give characters it knows, e.g. {flag}={known[:10]!r}")


def draw_key(seed: int, length: int, depth_index: int, trial: int, digits: int,
             alphabet: str) -> str:
  """The key of one prompt: `digits` characters of `alphabet`, seeded by the whole cell."""
  rng = np.random.default_rng([seed, length, depth_index, trial])
  return "".join(alphabet[i] for i in rng.integers(0, len(alphabet), digits))


def _key_ids(tokenizer: vocabularies.Tokenizer, key: str) -> tuple[np.ndarray, np.ndarray]:
  """(the question's ids, the key's ids), split where the question's own encoding ends.

  The key is encoded after the question as one text ("... The pass key is 71432"), as
  a model reads it; the question keeps its trailing space where the tokenizer has a
  token for it (characters, bytes), so the key's first scored token is the key's.
  """
  full = _encode(tokenizer, " " + QUESTION + " " + key)
  for prefix in (" " + QUESTION + " ", " " + QUESTION):
    question = _encode(tokenizer, prefix)
    if len(question) < len(full) and np.array_equal(full[:len(question)], question):
      return question, full[len(question):]
  raise ConfigError(f"the run's tokenizer encodes {QUESTION!r} differently when the key "
                    "follows it, so the key's tokens cannot be told apart; use "
                    "--passkey_alphabet with characters that start a new token")


def make_prompt(tokenizer: vocabularies.Tokenizer, length: int, depth: float, key: str,
                trial: int = 0) -> PasskeyPrompt:
  """The prompt of `length` model tokens with `key` at `depth` of the filler.

  Raises:
    ConfigError: `length` is too short to hold the instruction, needle, question and key.
  """
  intro = _encode(tokenizer, INTRO)
  needle = _encode(tokenizer, " " + NEEDLE.format(key=key))
  question, key_ids = _key_ids(tokenizer, key)
  fixed = 1 + len(intro) + len(needle) + len(question) + len(key_ids)
  filler_len = length + 1 - fixed
  if filler_len < 0:
    raise ConfigError(f"--passkey_lengths: {length} tokens cannot hold the passkey prompt, "
                      f"which needs at least {fixed - 1} with this tokenizer and key length")
  sentences = [_encode(tokenizer, " " + sentence) for sentence in FILLER]
  pieces, boundaries, total = [], [0], 0
  while total < filler_len:
    piece = sentences[len(pieces) % len(sentences)]
    pieces.append(piece)
    total += len(piece)
    boundaries.append(min(total, filler_len))
  filler = np.concatenate(pieces)[:filler_len] if pieces else np.zeros((0,), np.int32)
  # The sentence boundary nearest to the asked depth (the first of two equally near).
  at = min(boundaries, key=lambda b: abs(b - depth * filler_len))
  tokens = np.concatenate([[vocabularies.BOS_ID], intro, filler[:at], needle, filler[at:],
                           question, key_ids]).astype(np.int32)
  assert len(tokens) == length + 1, (len(tokens), length)
  return PasskeyPrompt(length=length, depth=depth, trial=trial, key=key, tokens=tokens,
                       key_tokens=len(key_ids), needle_start=1 + len(intro) + at,
                       placed_depth=at / filler_len if filler_len else 0.0)


def make_prompts(tokenizer: vocabularies.Tokenizer, lengths: Sequence[int],
                 depths: Sequence[float], trials: int, seed: int, digits: int = 5,
                 alphabet: str = DIGITS) -> list[PasskeyPrompt]:
  """Every (length, depth, trial) prompt, lengths outermost; deterministic in `seed`."""
  return [make_prompt(tokenizer, length, depth,
                      draw_key(seed, length, d, trial, digits, alphabet), trial)
          for length in lengths for d, depth in enumerate(depths) for trial in range(trials)]


def check_settings(lengths: Sequence[int], depths: Sequence[float], trials: int, digits: int,
                   model: Any) -> None:
  """One line for a bad --passkey_* value; `model` is the run's config.model.

  Raises:
    ConfigError: no lengths, a length < 1 or past a learned / sinusoidal position
      table, a depth outside [0, 1], trials or digits < 1.
  """
  if not lengths:
    raise ConfigError("--passkey_lengths is empty: give the context lengths to test, in "
                      "tokens, e.g. --passkey_lengths=256,512,1024")
  for length in lengths:
    if length < 1:
      raise ConfigError(f"--passkey_lengths: {length} is not a length; expected integers "
                        ">= 1 (tokens the model reads)")
    if (positions_lib.POSITIONS[model.position].embedding_table is not None
        and length > model.max_len):
      raise ConfigError(
          f"--passkey_lengths: {length} tokens exceed the model's {model.position} position "
          f"table, model.max_len={model.max_len}: such positions cannot extrapolate; test "
          f"lengths <= {model.max_len}")
  if not depths:
    raise ConfigError("--passkey_depths is empty: give depths in [0, 1], e.g. "
                      "--passkey_depths=0,0.25,0.5,0.75,1")
  for depth in depths:
    if not 0.0 <= depth <= 1.0:
      raise ConfigError(f"--passkey_depths: {depth} is outside [0, 1] (0: the key right "
                        "after the instruction, 1: right before the question)")
  for flag, value in (("--passkey_trials", trials), ("--passkey_digits", digits)):
    if value < 1:
      raise ConfigError(f"{flag}={value}: expected an integer >= 1")


def make_scorer(model_config: ModelConfig, tail: int
                ) -> Callable[[Any, np.ndarray], tuple[jax.Array, jax.Array]]:
  """jit(params, tokens_BT) -> (log p of each of the last `tail` tokens [B, tail], whether
  each is the argmax of its prediction [B, tail]).

  A deterministic forward of the decoder on tokens[:, :-1], one document per row,
  positions 0, 1, ...; only the last `tail` positions are projected to the vocabulary
  (the model's LogitsHead on its final hidden states), so a long prompt never holds
  [B, T, V] logits. model.never_predict rows are left out of the softmax, as the loss
  leaves them out.
  """
  objective = objective_lib.resolve(model_config)
  forward = objectives.make_forward(
      make_model(dataclasses.replace(model_config, deterministic=True, decode=False)),
      objective, hidden=True)
  never = tuple(model_config.never_predict)

  @jax.jit
  def score(params, tokens_BT):
    inputs_BL = tokens_BT[:, :-1]
    batch = {"inputs": inputs_BL, "targets": tokens_BT[:, 1:],
             "segment_ids": jnp.ones_like(inputs_BL),
             "positions": jnp.broadcast_to(jnp.arange(inputs_BL.shape[1]), inputs_BL.shape),
             "weights": jnp.ones(inputs_BL.shape, jnp.float32)}
    (x_BLE, head), targets_BL, _, _ = forward(params, batch)
    logits_BLV = head(x_BLE[:, -tail:])
    targets_BL = targets_BL[:, -tail:]
    if never:
      logits_BLV = logits_BLV.at[..., jnp.asarray(never)].set(-jnp.inf)
    logp_BLV = jax.nn.log_softmax(logits_BLV)
    logp_BL = jnp.take_along_axis(logp_BLV, targets_BL[..., None], axis=-1)[..., 0]
    return logp_BL, jnp.argmax(logits_BLV, axis=-1) == targets_BL

  return score


def score_prompts(scorer: Callable, params: Any, prompts: Sequence[PasskeyPrompt],
                  batch_size: int, progress: Any = None) -> list[tuple[bool, float]]:
  """(retrieved, log p of the key) of each prompt, in order.

  `scorer` is make_scorer's, with a `tail` of at least every prompt's key_tokens.
  Prompts are scored `batch_size` at a time, by length (one compile per length); the
  last batch of a length is filled up with copies of its first prompt, whose scores
  are dropped.
  """
  results: list[tuple[bool, float]] = [(False, 0.0)] * len(prompts)
  by_length: dict[int, list[int]] = {}
  for index, prompt in enumerate(prompts):
    by_length.setdefault(prompt.length, []).append(index)
  for indices in by_length.values():
    for start in range(0, len(indices), batch_size):
      chunk = indices[start:start + batch_size]
      rows = [prompts[i].tokens for i in chunk]
      rows += [rows[0]] * (min(batch_size, len(indices)) - len(rows))
      logp_BL, hit_BL = jax.device_get(scorer(params, np.stack(rows)))
      for row, index in enumerate(chunk):
        k = prompts[index].key_tokens
        results[index] = (bool(np.all(hit_BL[row, -k:])), float(np.sum(logp_BL[row, -k:])))
      if progress is not None:
        progress.update(len(chunk))
  return results


def summarize_cells(prompts: Sequence[PasskeyPrompt],
                    results: Sequence[tuple[bool, float]]) -> list[dict[str, Any]]:
  """One dict per (length, depth): trials, retrieved, accuracy, mean key log p, placed depth."""
  cells: dict[tuple[int, float], list[int]] = {}
  for index, prompt in enumerate(prompts):
    cells.setdefault((prompt.length, prompt.depth), []).append(index)
  out = []
  for (length, depth), indices in cells.items():
    hits = sum(results[i][0] for i in indices)
    out.append({"length": length, "depth": depth, "trials": len(indices), "retrieved": hits,
                "accuracy": hits / len(indices),
                "key_logprob": float(np.mean([results[i][1] for i in indices])),
                "placed_depth": float(np.mean([prompts[i].placed_depth for i in indices]))})
  return out

