"""The denoisers of the text-to-text objectives, their lengths, and their train.* checks.

A text-to-text objective (config/objective.py: span_corruption, prefix_lm, ul2) is a
mixture of denoisers, each a transform of a window of W tokens into (inputs, targets):

  span   T5's span corruption: round(W x density) noise tokens (at least 1, at most
         W - 1) in max(1, round(noise / mean span)) spans; each noise span becomes one
         sentinel in the inputs, each kept span one sentinel in the targets
  prefix the window split at a uniform point into a non-empty prefix (inputs) and the
         rest (targets): T5's prefix LM

Both sides end in eos; a UL2 denoiser's inputs start with its paradigm token. Plain
Python: the window length W that fits data.seq_len on a topology (`window_length`) is
what validation checks before any data is read, and what data/denoise.py cuts windows
by (the one place the lengths are computed).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from transformer.config.checks import is_int, is_number
from transformer.config.errors import fail

UL2_PARADIGMS = ("[R]", "[S]", "[X]")  # Their ids follow the sentinels, in this order.
# An eval row's per-token field: which denoiser kind made the example a token belongs to
# (tag i + 1 is tag_names' i-th, 0 padding); the eval step reports the loss per kind.
TAG_FIELD = "denoiser"


@dataclasses.dataclass(frozen=True)
class Denoiser:
  """One transform of a window into (inputs, targets)."""
  name: str
  prefix: bool = False  # The prefix LM split; else span corruption with the two below.
  mean_span: float = 3.0
  density: float = 0.15
  paradigm: int = -1  # Index into UL2_PARADIGMS of the token the inputs start with; -1 none.


def tag_names(mixture: tuple[tuple[Denoiser, float], ...]) -> tuple[str, ...]:
  """The denoiser kinds evaluation reports a loss of, in tag order: UL2's paradigms R,
  S and X (X's two denoisers together, as they share a paradigm token), whatever their
  weights; () for a mixture of one kind (span corruption, prefix LM): its loss is the
  total."""
  if not any(d.paradigm >= 0 for d, _ in mixture):
    return ()
  return tuple(p.strip("[]") for p in UL2_PARADIGMS)


def tag_of(denoiser: Denoiser) -> int:
  """The tag of the tokens `denoiser`'s examples hold (tag_names' index + 1)."""
  return denoiser.paradigm + 1


def noise_counts(length: int, density: float, mean_span: float) -> tuple[int, int]:
  """T5's random_spans_noise_mask counts for `length` tokens: (noise tokens, spans)."""
  noise = min(max(int(round(length * density)), 1), length - 1)
  spans = max(int(round(noise / mean_span)), 1)
  return noise, spans


def side_lengths(denoiser: Denoiser, length: int) -> tuple[int, int]:
  """The longest (inputs, targets) `denoiser` makes of `length` tokens, eos included."""
  paradigm = 1 if denoiser.paradigm >= 0 else 0
  if denoiser.prefix:  # A split at 1 .. length - 1: either side at most length - 1 tokens.
    return paradigm + length, length
  noise, spans = noise_counts(length, denoiser.density, denoiser.mean_span)
  return paradigm + length - noise + spans + 1, noise + spans + 1


def fits(denoiser: Denoiser, length: int, arch: str, seq_len: int) -> bool:
  """Whether `length` tokens' example fits a row: each side in data.seq_len on an
  encoder-decoder, [bos] + inputs + targets in data.seq_len + 1 on a decoder."""
  inputs, targets = side_lengths(denoiser, length)
  if arch == "decoder":
    return inputs + targets <= seq_len
  return inputs <= seq_len and targets <= seq_len


def window_length(denoisers: tuple[Denoiser, ...], arch: str, seq_len: int) -> int:
  """The most tokens a window may hold for every denoiser's example to fit a row; 1
  (no window) when not even 2 do."""
  for length in range(seq_len, 1, -1):
    if all(fits(d, length, arch, seq_len) for d in denoisers):
      return length
  return 1


def _span(train: Any, **fields: Any) -> Denoiser:
  """Span corruption with train.noise_density and train.mean_noise_span_length."""
  return Denoiser(**{"name": "span", "mean_span": train.mean_noise_span_length,
                     "density": train.noise_density, **fields})


def _ul2(train: Any) -> tuple[tuple[Denoiser, float], ...]:
  r, s, x = (float(w) for w in train.ul2_weights)
  return ((_span(train, name="R", paradigm=0), r),
          (Denoiser("S", prefix=True, paradigm=1), s),
          (Denoiser("X_span32", mean_span=32.0, density=0.15, paradigm=2), x / 2),
          (Denoiser("X_density50", mean_span=3.0, density=0.5, paradigm=2), x / 2))


# Objective.transform -> (config.train -> its (denoiser, weight) mixture).
MIXTURES: dict[str, Callable[[Any], tuple[tuple[Denoiser, float], ...]]] = {
    "span_corruption": lambda train: ((_span(train), 1.0),),
    "prefix_lm": lambda train: ((Denoiser("prefix", prefix=True), 1.0),),
    "ul2": _ul2,
}


def denoisers(transform: str, train: Any) -> tuple[tuple[Denoiser, float], ...]:
  """The (denoiser, weight) mixture of a text-to-text objective's transform."""
  return MIXTURES[transform](train)


def extra_id_counts(transform: str, train: Any) -> tuple[int, int]:
  """(sentinels, paradigm tokens) a transform needs after the tokenizer's vocabulary:
  train.num_sentinels when a denoiser corrupts spans, UL2's paradigms when one has one."""
  mixture = [d for d, _ in denoisers(transform, train)]
  return (train.num_sentinels if any(not d.prefix for d in mixture) else 0,
          len(UL2_PARADIGMS) if any(d.paradigm >= 0 for d in mixture) else 0)


def validate_denoising(config: Any, transform: str, arch: str) -> None:
  """The train.* keys of a text-to-text objective, and whether data.seq_len holds a
  window: one line naming the key, its value and what would be valid."""
  train, t = config.train, "train."
  density, mean = train.noise_density, train.mean_noise_span_length
  if not is_number(density) or not 0.0 < density < 1.0:
    fail(t + "noise_density", density, "expected a fraction of the tokens in (0, 1), "
         "e.g. T5's 0.15")
  if not is_number(mean) or not mean >= 1.0:
    fail(t + "mean_noise_span_length", mean, "expected a number of tokens >= 1, e.g. "
         "T5's 3.0")
  if not is_int(train.num_sentinels) or train.num_sentinels < 1:
    fail(t + "num_sentinels", train.num_sentinels, "expected an integer >= 1 (T5: 100)")
  weights = train.ul2_weights
  if (not isinstance(weights, (tuple, list)) or len(weights) != len(UL2_PARADIGMS)
      or not all(is_number(w) and w >= 0 for w in weights) or not sum(weights) > 0):
    fail(t + "ul2_weights", weights, "expected three weights >= 0 of the R, S and X "
         "denoisers, not all 0, e.g. (1.0, 1.0, 1.0)")
  mixture = tuple(d for d, w in denoisers(transform, train) if w > 0)
  seq_len = config.data.seq_len
  length = window_length(mixture, arch, seq_len)
  if length < 2:
    fail("data.seq_len", seq_len, f"model.objective={transform!r} on model.arch={arch!r} "
         "needs rows that hold an example of a window of at least 2 tokens; raise it")
  for denoiser in mixture:
    if denoiser.prefix:
      continue
    noise, spans = noise_counts(length, denoiser.density, denoiser.mean_span)
    where = (f"a window of {length} tokens (data.seq_len={seq_len}) with density "
             f"{denoiser.density} and mean span {denoiser.mean_span}")
    if spans > length - noise:
      key = t + ("noise_density" if denoiser.name in ("span", "R") else "ul2_weights")
      fail(key, lookup_value(train, key), f"{where} has {spans} noise spans but only "
           f"{length - noise} kept tokens to separate them; lower the density or "
           "raise the mean span length")
    if spans > train.num_sentinels:
      fail(t + "num_sentinels", train.num_sentinels, f"{where} has {spans} noise spans, "
           f"one sentinel each: raise it to at least {spans} (model.vocab_size grows "
           "with it) or lower data.seq_len")


def lookup_value(train: Any, key: str) -> Any:
  """config.train's value of dotted `key` ("train.x")."""
  return train[key.split(".", 1)[1]]
