"""--sweep's spec (cli/sweep.py's docstring says its forms) -> every run's overrides,
workdir name and validated config, before any run starts.

  build_runs(config, "model.norm=pre,post;model.position=learned,rope")

A grid `key=v1,v2;key2=v3,v4` or a JSON file (a grid or a list of runs); each value
takes the type of the key's value in the config; every run's config is validated as its
own launch.py process will see it. Each bad spec is one ConfigError naming the key (and
the run).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from typing import Any, Mapping, Sequence

import ml_collections

from transformer.cli import common
from transformer.config.checks import is_int, is_number
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.training import fine_tune

_TRUE, _FALSE = ("true", "t", "yes", "1"), ("false", "f", "no", "0")


@dataclasses.dataclass(frozen=True)
class SweepArm:
  """One run of a sweep: its overrides (key -> command-line value), name and config."""

  overrides: dict[str, str]
  name: str
  config: ml_collections.ConfigDict

  @property
  def label(self) -> str:
    return ",".join(f"{key}={value}" for key, value in self.overrides.items())


def _bad_spec(message: str) -> ConfigError:
  return ConfigError(f"--sweep: {message}")


def _read_spec_file(path: str) -> list[dict[str, Any]]:
  """A JSON grid {key: [values]} or list of runs [{key: value}] -> the runs' overrides."""
  try:
    with open(path, encoding="utf-8") as f:
      spec = json.load(f)
  except (OSError, ValueError) as e:
    raise _bad_spec(f"cannot read the JSON sweep file {path} ({e})") from e
  if isinstance(spec, dict):
    for key, values in spec.items():
      if not isinstance(values, list) or not values:
        raise _bad_spec(f"{path}: config.{key} needs a non-empty list of values, got "
                        f"{values!r}")
    return [dict(zip(spec, combination)) for combination in itertools.product(*spec.values())]
  if isinstance(spec, list) and spec and all(isinstance(r, dict) and r for r in spec):
    return spec
  raise _bad_spec(f"{path} must hold a grid {{\"model.norm\": [\"pre\", \"post\"]}} or a "
                  "non-empty list of runs [{\"model.norm\": \"pre\"}, ...]")


def parse_spec(spec: str) -> list[dict[str, Any]]:
  """The overrides of each run, {key: value}: raw strings from a grid, JSON values from a file.

  Raises:
    ConfigError: a malformed spec, naming the part and the syntax.
  """
  spec = spec.strip()
  if spec.endswith(".json"):
    return _read_spec_file(spec)
  if not spec:
    raise _bad_spec("empty; expected e.g. --sweep='model.norm=pre,post;model.position=rope,"
                    "alibi' or the path of a .json file")
  grid: dict[str, list[str]] = {}
  for part in spec.split(";"):
    key, equals, values = (s.strip() for s in part.partition("="))
    if not equals or not key:
      raise _bad_spec(f"{part.strip()!r} is not key=value1,value2 (e.g. model.norm=pre,post)")
    key = key.removeprefix("config.")
    if key in grid:
      raise _bad_spec(f"config.{key} appears twice; list all its values once")
    items = [v.strip() for v in values.split(",")]
    if not values or any(not v for v in items):
      raise _bad_spec(f"config.{key} has an empty value in {part.strip()!r}: expected "
                      f"{key}=value1,value2 (an empty string needs a JSON sweep file)")
    duplicates = sorted({v for v in items if items.count(v) > 1})
    if duplicates:
      raise _bad_spec(f"config.{key} lists {', '.join(duplicates)} twice")
    grid[key] = items
  return [dict(zip(grid, combination)) for combination in itertools.product(*grid.values())]


def _field(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
  """The ConfigDict that holds `key` and the key's last part; ConfigError if there is none."""
  node, parts = config, key.split(".")
  for depth, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      where = ".".join(["config"] + parts[:depth])
      valid = (", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict)
               else "none: it is not a group")
      raise _bad_spec(f"config.{key} is not a config key; the keys of {where} are: {valid}")
    if depth < len(parts) - 1:
      node = node[part]
  if isinstance(node[parts[-1]], ml_collections.ConfigDict):
    raise _bad_spec(f"config.{key} is a group of keys ({', '.join(sorted(node[parts[-1]]))}); "
                    "sweep one of them")
  return node, parts[-1]


def _typed(key: str, value: Any, current: Any) -> Any:
  """`value` (a grid's string or a JSON value) as the type of the key's `current` value."""
  def wrong(expected: str) -> ConfigError:
    return _bad_spec(f"config.{key}={value!r} is invalid: expected {expected}, the type of "
                     f"its value {current!r} in the config")

  text = value.strip() if isinstance(value, str) else None
  if isinstance(current, bool):
    if isinstance(value, bool):
      return value
    if text is not None and text.lower() in _TRUE + _FALSE:
      return text.lower() in _TRUE
    raise wrong("true or false")
  if isinstance(current, int):
    if is_int(value):
      return value
    if text is not None and re.fullmatch(r"[+-]?\d+", text.replace("_", "")):
      return int(text)
    raise wrong("an integer")
  if isinstance(current, float):
    if is_number(value):
      return float(value)
    try:
      return float(text)
    except (TypeError, ValueError):
      raise wrong("a number") from None
  if isinstance(current, str):
    if text is None:
      raise wrong("a string")
    return value
  if isinstance(current, tuple):
    if isinstance(value, (list, tuple)):
      return _tuples(value)
    raise wrong("a tuple, written as a JSON list in a JSON sweep file")
  raise _bad_spec(f"config.{key} holds {current!r} ({type(current).__name__}): sweeping it "
                  "is not supported; set it with a --config flag")


def _tuples(value: Any) -> Any:
  """JSON lists -> tuples, nested (mesh.shape, mesh.rules)."""
  return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def as_flag(value: Any) -> str:
  """How ml_collections' command-line parser reads `value` back."""
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, (int, float, tuple)):
    return repr(value)
  return str(value)


def _run_names(all_overrides: Sequence[dict[str, str]]) -> list[str]:
  """`norm=post+position=rope`: the last part of each key, the full key where those collide."""
  keys = list(dict.fromkeys(key for overrides in all_overrides for key in overrides))
  short = {key: key.rsplit(".", 1)[-1] for key in keys}
  clash = {key for key in keys if list(short.values()).count(short[key]) > 1}
  names = []
  for overrides in all_overrides:
    # Characters a shell or --compare_dirs would trip on become one "_" each run.
    parts = [f"{key if key in clash else short[key]}="
             + (re.sub(r"[^A-Za-z0-9._-]+", "_", value).strip("_") or "_")
             for key, value in overrides.items()]
    names.append("+".join(parts))
  for name in names:
    if names.count(name) > 1:
      raise _bad_spec(f"two runs would share the workdir {name!r}; make their values differ")
  return names


def build_runs(config: ml_collections.ConfigDict, spec: str,
               fixed: Mapping[str, Any] = ()) -> list[SweepArm]:
  """Every run's config from `config` and the spec, each validated before any run starts.

  Args:
    config: the sweep's base config (--config with its --config.x flags applied).
    spec: the --sweep value (see the module docstring).
    fixed: the keys set by --config.x flags, which a sweep must not also vary.

  Returns:
    The runs, in sweep order.

  Raises:
    ConfigError: naming the key (and the run) of the first problem.
  """
  all_overrides = []
  for raw in parse_spec(spec):
    overrides = {}
    for key, value in raw.items():
      key = key.removeprefix("config.")
      if key in fixed:
        raise _bad_spec(f"config.{key} is both swept and set by --config.{key}; drop one")
      node, last = _field(config, key)
      overrides[key] = _typed(key, value, node[last])
    all_overrides.append(overrides)
  flags = [{k: as_flag(v) for k, v in o.items()} for o in all_overrides]
  runs = []
  for index, (overrides, as_flags, name) in enumerate(
      zip(all_overrides, flags, _run_names(flags)), 1):
    run_config = config.copy_and_resolve_references()
    for key, value in overrides.items():
      node, last = _field(run_config, key)
      node[last] = value
    run = SweepArm(as_flags, name, run_config)
    # As the run's own launch.py process will (its keys and --config.x flags are its
    # command line's), so that the config recorded here is the one it trains.
    common.fit_steps_per_call(run_config, set(fixed) | set(overrides),
                              where=f"--sweep run {index}/{len(flags)} ({run.label})")
    try:
      # init_from's model and tokenizer, as the run's own check_config takes them.
      fine_tune.take_source_model(run_config, set(fixed) | set(overrides))
      validate(run_config)
    except ConfigError as e:
      raise ConfigError(f"--sweep run {index}/{len(flags)} ({run.label}): {e}") from None
    runs.append(run)
  return runs
