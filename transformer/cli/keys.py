"""--mode=keys: every config key with its value and its comment from configs/base.py.

  python launch.py --mode=keys                       # base.py's defaults
  python launch.py --mode=keys --config=configs/shakespeare_char.py:cpu   # a preset's values

Each line is `key = value  # comment`, grouped as base.py groups them; the comment is
the one base.py declares the key with (on its line, or the comment lines just above
it). Reads files only: starts no JAX devices and needs no --workdir.
"""

from __future__ import annotations

import ast
import os
import re

import ml_collections

from configs import base
from transformer.config.errors import ConfigError

STARTS_JAX = False
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ()
BASE = os.path.abspath(base.__file__)
# `alias.key = value  # comment` (the alias a group is bound to, `opt` for optimizer).
_ASSIGNMENT = re.compile(r"^\s*(\w+)\.(\w+)\s*=")


def _aliases(tree: ast.Module) -> dict[str, str]:
  """{"opt": "optimizer", "config": ""}: the names base.py binds its groups to."""
  aliases = {"config": ""}
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and len(node.targets) == 2:
      alias, attribute = node.targets
      if (isinstance(alias, ast.Name) and isinstance(attribute, ast.Attribute)
          and isinstance(attribute.value, ast.Name) and attribute.value.id == "config"):
        aliases[alias.id] = attribute.attr
  return aliases


def documented_keys(path: str = BASE) -> dict[str, str]:
  """{"model.d_model": "Width of the residual stream.", ...} in base.py's order."""
  with open(path, encoding="utf-8") as f:
    source = f.read()
  aliases = _aliases(ast.parse(source))
  comments: dict[str, str] = {}
  above: list[str] = []  # Comment lines just above an assignment.
  for line in source.splitlines():
    stripped = line.strip()
    if stripped.startswith("#"):
      text = stripped.lstrip("#").strip()
      above = [] if text.startswith("----") else above + [text]
      continue
    match = _ASSIGNMENT.match(line)
    if match and match.group(1) in aliases and not line.rstrip().endswith("ConfigDict()"):
      group = aliases[match.group(1)]
      key = f"{group}.{match.group(2)}" if group else match.group(2)
      _, hash_, trailing = line.partition("  # ")
      comments[key] = trailing.strip() if hash_ else " ".join(above)
    if stripped and not (match is None and stripped.startswith(("(", ")"))):
      above = [] if match else above
  return comments


def _flatten(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, object]:
  out = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def listing(config: ml_collections.ConfigDict | None = None) -> str:
  """The lines --mode=keys prints: `key = value  # comment`, a blank line between groups."""
  values = _flatten(config if config is not None else base.get_config())
  comments = documented_keys()
  undocumented = sorted(set(values) - set(comments))
  if undocumented:  # base.py declares every key with a comment: a key without is a bug.
    raise ConfigError(f"{BASE} has no comment for {', '.join(undocumented)}")
  lines, group = [], None
  for key, comment in comments.items():
    if key not in values:
      continue
    if key.partition(".")[0] != group and "." in key:
      group = key.partition(".")[0]
      lines.append("")
    lines.append(f"{key} = {values[key]!r}  # {comment}")
  return "\n".join(lines).lstrip("\n")


def main(config: ml_collections.ConfigDict | None, workdir: str | None) -> int:
  """launch.py --mode=keys; prints the listing."""
  del workdir
  print(listing(config))
  return 0
