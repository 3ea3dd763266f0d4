"""The errors a user can act on: a bad config value, unusable input data.

The ground of the package: every other module raises through `fail`, so each message
has one shape, "config.<key>=<value> is invalid: <what would be valid>.".
"""

from __future__ import annotations

from typing import Any, NoReturn


class ConfigError(ValueError):
  """A configuration value is invalid; the message names the key and valid values."""


class DataError(ValueError):
  """Input data is unusable; the message names the file, line and field, and what is valid."""


def fail(key: str, value: Any, valid: str) -> NoReturn:
  """Raises ConfigError naming config.<key>, its value and what would be valid."""
  raise ConfigError(f"config.{key}={value!r} is invalid: {valid}.")
