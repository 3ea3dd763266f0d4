"""Validation of the decode.* fields: search, sampling, lengths.

A step of `validation.validate`, and run again by the modes whose flags change
decode.* after loading a run (translate, generate). inference/decoding.py
implements what it allows.
"""

from __future__ import annotations

import ml_collections

from transformer.config.checks import check_choice, check_float, check_int, is_number
from transformer.config.errors import fail

DECODE_OVERLONG = ("truncate", "error")


def validate_decode(config: ml_collections.ConfigDict) -> None:
  """Checks the decode.* fields (also after command-line flags changed them).

  Temperature > 0 samples (top_k / top_p apply, beam_size is not used); at
  temperature 0, beam_size 1 is greedy and beam_size > 1 is beam search.
  """
  k = "decode."
  for key in ("beam_size", "max_new_tokens", "batch_size"):
    check_int(config, k + key, 1)
  for key in ("max_length_offset", "top_k"):
    check_int(config, k + key, 0)
  check_choice(config, k + "overlong", DECODE_OVERLONG)
  dec = config.decode
  for key in ("alpha", "temperature"):
    check_float(config, k + key, 0)
  if not is_number(dec.top_p) or not 0.0 < dec.top_p <= 1.0:
    fail(k + "top_p", dec.top_p, "expected a probability in (0, 1]")
  if dec.temperature == 0 and (dec.top_k or dec.top_p < 1.0):
    fail(k + ("top_k" if dec.top_k else "top_p"), dec.top_k or dec.top_p,
          "top_k and top_p only apply when sampling: set decode.temperature > 0 "
          "(--temperature), or leave them at 0 and 1.0")
