"""The field checks `validate` is built from, and the error they raise.

Below configuration.py and moe_config.py, which both check fields with them (a module
of its own so that moe_config.py can use them without importing configuration.py,
which imports it). configuration.py re-exports `ConfigError`, the name callers import.
"""

from __future__ import annotations

from typing import Any, Sequence

import ml_collections


class ConfigError(ValueError):
  """A configuration value is invalid; the message names the key and valid values."""


def fail(key: str, value: Any, valid: str) -> None:
  """Raises ConfigError naming config.<key>, its value and what would be valid."""
  raise ConfigError(f"config.{key}={value!r} is invalid: {valid}.")


def check_choice(config: ml_collections.ConfigDict, key: str, choices: Sequence[str]) -> None:
  """The value at dotted `key` is one of `choices`."""
  value = lookup(config, key)
  if value not in choices:
    fail(key, value, "valid values are " + ", ".join(repr(c) for c in choices))


def check_int(config: ml_collections.ConfigDict, key: str, minimum: int) -> None:
  """The value at dotted `key` is an int (not a bool) >= minimum."""
  value = lookup(config, key)
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    fail(key, value, f"expected an integer >= {minimum}")


def check_rate(config: ml_collections.ConfigDict, key: str) -> None:
  """The value at dotted `key` is a probability in [0, 1)."""
  value = lookup(config, key)
  if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
    fail(key, value, "expected a probability in [0, 1)")


def check_float(config: ml_collections.ConfigDict, key: str, minimum: float) -> None:
  """The value at dotted `key` is a number (not a bool) >= minimum."""
  value = lookup(config, key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
    fail(key, value, f"expected a float >= {minimum}")


def lookup(config: ml_collections.ConfigDict, key: str) -> Any:
  """config["a"]["b"] for key "a.b"."""
  node = config
  for part in key.split("."):
    node = node[part]
  return node
