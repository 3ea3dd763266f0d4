"""The typed field checks every validation step is built from.

Two kinds: predicates (`is_int`, `is_number`) for checks whose message is particular
to a key, and `check_*` functions that look a dotted key up and fail with the
standard message. Both treat a bool as no number: True is an int to Python, but
`--config.model.d_model=True` is a mistake, not 1.
"""

from __future__ import annotations

from typing import Any, Sequence

import ml_collections

from transformer.config.errors import fail


def is_int(value: Any) -> bool:
  """An int, not a bool."""
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """An int or a float, not a bool."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def lookup(config: ml_collections.ConfigDict, key: str) -> Any:
  """config["a"]["b"] for key "a.b"."""
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def check_choice(config: ml_collections.ConfigDict, key: str, choices: Sequence[str]) -> None:
  """The value at dotted `key` is one of `choices` (a registry's keys, in its order)."""
  value = lookup(config, key)
  if value not in choices:
    fail(key, value, "valid values are " + ", ".join(repr(c) for c in choices))


def check_bool(config: ml_collections.ConfigDict, key: str) -> None:
  """The value at dotted `key` is True or False (not 0 or 1)."""
  value = lookup(config, key)
  if not isinstance(value, bool):
    fail(key, value, "expected True or False")


def check_int(config: ml_collections.ConfigDict, key: str, minimum: int) -> None:
  """The value at dotted `key` is an int (not a bool) >= minimum."""
  value = lookup(config, key)
  if not is_int(value) or value < minimum:
    fail(key, value, f"expected an integer >= {minimum}")


def check_rate(config: ml_collections.ConfigDict, key: str) -> None:
  """The value at dotted `key` is a probability in [0, 1)."""
  value = lookup(config, key)
  if not is_number(value) or not 0.0 <= value < 1.0:
    fail(key, value, "expected a probability in [0, 1)")


def check_float(config: ml_collections.ConfigDict, key: str, minimum: float) -> None:
  """The value at dotted `key` is a number (not a bool) >= minimum."""
  value = lookup(config, key)
  if not is_number(value) or not value >= minimum:
    fail(key, value, f"expected a float >= {minimum}")


def check_positive(config: ml_collections.ConfigDict, key: str) -> None:
  """The value at dotted `key` is a number (not a bool) > 0."""
  value = lookup(config, key)
  if not is_number(value) or not value > 0:
    fail(key, value, "expected a positive float")
