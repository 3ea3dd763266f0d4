"""Command-line and machine mistakes said in one line, for launch.py (no traceback).

Two kinds of error are the user's to fix, not bugs, yet would otherwise reach the
console as a Python traceback:
  - flags that fail while absl parses them: a config file that is missing, does not
    parse, or whose `get_config(arg)` rejects its argument; an override of a key
    the config does not declare (`--config.model.nope=1`);
  - a flag the chosen --mode does not read (`--output` with --mode=plot): refused,
    naming the modes that read it (check_mode_flags);
  - the machine refusing a file operation: a full disk, no permission, a read-only
    file system, a path through a regular file, a --workdir that is a file.
Imports nothing heavy: launch.py parses flags before JAX starts.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import textwrap
from types import ModuleType
from typing import Mapping, NoReturn, Sequence

from absl import flags

# errno -> what to do; other OSErrors (a missing file the code expected) stay bugs.
ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "free space on that file system or use another --workdir",
    errno.EDQUOT: "free space within your disk quota or use another --workdir",
    errno.EACCES: "make it writable for this user (chmod / chown) or use another --workdir",
    errno.EPERM: "make it writable for this user (chmod / chown) or use another --workdir",
    errno.EROFS: "the file system is read-only: use another --workdir",
    errno.ENOTDIR: "a part of the path is a file, not a folder: use another --workdir",
}


# Keys that are gone, and what replaced them: given one, the command stops naming it.
RETIRED_KEYS = {
    "data.prepare_shard": ("this host's hand-run share of --mode=prepare's files",
                           "--mode=prepare --ray_address=HOST:PORT (or auto) runs the tasks on "
                           "every node of a Ray cluster (docs/corpus.md)"),
}

# Keys users look for under another name: the key there, and why it lives there.
KEYS_ELSEWHERE = {
    "train.objective": ("model.objective", "the objective decides the model's inputs and "
                        "masks, as model.head does; the noise keys are train.noise_density, "
                        "train.mean_noise_span_length, train.num_sentinels and "
                        "train.ul2_weights (docs/objectives.md)"),
}

_HELP_FLAGS = ("--help", "-help", "--helpshort", "-helpshort", "--helpfull",
               "-helpfull", "--helpxml", "-helpxml")


def _flags_error(message: str) -> NoReturn:
  """Exits like absl's own flag errors: status 1, one FATAL line."""
  sys.stderr.write(f"FATAL Flags parsing error: {message}\n"
                   "Pass --helpshort or --helpfull to see help on flags.\n")
  sys.exit(1)


def _unknown_key(error: Exception, argv: Sequence[str]) -> str:
  """'--config.model.nope: ...' from the AttributeError/KeyError config_flags raises."""
  text = str(error)
  name = re.search(r"'(\w+)", text)
  name = name.group(1) if name else text
  suggestion = re.search(r'Did you mean "(\w+)"', text)
  overrides = [arg.split("=", 1)[0] for arg in argv if arg.startswith("--config.")]
  flag = next((o for o in overrides if name in o.split(".")), "--config.*")
  if flag.removeprefix("--config.") in RETIRED_KEYS:
    was, now = RETIRED_KEYS[flag.removeprefix("--config.")]
    return f"{flag} is retired (it was {was}): {now}"
  if flag.removeprefix("--config.") in KEYS_ELSEWHERE:
    key, why = KEYS_ELSEWHERE[flag.removeprefix("--config.")]
    return f"{flag}: the key is --config.{key} ({why})"
  return (f"{flag}: the config has no key {name!r}"
          + (f" (did you mean {suggestion.group(1)!r}?)" if suggestion else "")
          + ". Every key is declared, with a comment, in configs/base.py.")


def _without_traceback(message: str) -> str:
  """config_flags puts the traceback of get_config's error in the flag error: keep its last line."""
  if "Traceback (most recent call last)" not in message:
    return message
  head = message.split("Error whilst parsing config file")[0]
  last = [line.strip() for line in message.splitlines() if line.strip()][-1]
  return head + last


def preset_path(arg: str) -> str:
  """`--config=configs/gpt_small.py:local` (or `gpt_small.py:local`) with the path of the
  preset shipped with the package when no such file is in the current folder.

  So the installed `transformer` command (pyproject.toml) names a preset as the docs do
  from any folder; a file at that path here wins. Any other argument is returned as is.
  """
  if not arg.startswith("--config=") and not arg.startswith("-config="):
    return arg
  flag, _, value = arg.partition("=")
  path, colon, config_arg = value.partition(":")
  relative = path[len("configs/"):] if path.startswith("configs/") else path
  if os.path.exists(path) or os.sep in relative or not relative.endswith(".py"):
    return arg
  import configs  # pylint: disable=g-import-not-at-top  (the presets' package)
  shipped = os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), relative)
  if not os.path.isfile(shipped):
    return arg  # Not a preset: absl's own "not found" error names the path given.
  return f"{flag}={shipped}{colon}{config_arg}"


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing (the `flags_parser` of `app.run`), every mistake in one line.

  Args:
    argv: the command line, program name first.

  Returns:
    The arguments left after the flags (the program name first).
  """
  argv = [preset_path(arg) for arg in argv]
  try:
    remaining = flags.FLAGS(argv)
  except SystemExit as e:
    # absl's --help, --helpshort and --helpfull print the help, then exit 1: asking for
    # help is not a mistake, so the status is 0.
    if e.code == 1 and any(a.split("=")[0] in _HELP_FLAGS for a in argv[1:]):
      sys.exit(0)
    raise
  except flags.Error as e:
    _flags_error(_without_traceback(str(e)))
  except (AttributeError, KeyError) as e:  # config_flags: an override of an unknown key.
    _flags_error(_unknown_key(e, argv))
  except SyntaxError as e:  # The config file is not Python.
    _flags_error(f"{e.filename}:{e.lineno}: {e.msg} (the --config file does not parse)")
  except OSError as e:  # A missing config file, found while parsing an override.
    _flags_error(f"--config: {' '.join(str(e).split())}")
  config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
  if config is not None:
    try:  # config_flags defers a file it could not read until the config is used.
      config.keys()
    except OSError as e:
      _flags_error(f"--config: {' '.join(str(e).split())}")
  return remaining


def flag_readers(modes: Mapping[str, ModuleType]) -> dict[str, list[str]]:
  """{flag name: the modes that read it} for every flag a mode module or cli/common.py defines.

  A mode reads the flags its own module defines (absl records each flag's module) and
  the cli/common.py flags its SHARED_FLAGS lists. launch.py's own flags (--config,
  --workdir, the jax.distributed ones) and absl's are not in the table.
  """
  readers: dict[str, list[str]] = {}
  for name, module in modes.items():
    own = [flag.name for flag in flags.FLAGS.get_flags_for_module(module.__name__)]
    for flag in own + list(module.SHARED_FLAGS):
      readers.setdefault(flag, []).append(name)
  # cli/common.py's flags that no mode lists still belong to the table (read by none).
  for flag in flags.FLAGS.get_flags_for_module("transformer.cli.common"):
    readers.setdefault(flag.name, [])
  return readers


def check_mode_flags(mode: str, modes: Mapping[str, ModuleType]) -> None:
  """Exits in one line if a flag given on the command line is one `mode` does not read.

  Args:
    mode: the --mode given.
    modes: launch.py's MODES, {mode: its cli module}.
  """
  for flag, readers in sorted(flag_readers(modes).items()):
    if flags.FLAGS[flag].present and mode not in readers:
      taken = (f"only --mode={'/'.join(sorted(readers))} reads it" if readers
               else "no mode reads it")
      _flags_error(f"--{flag} is not used by --mode={mode}: {taken}. Leave it out (or "
                   "choose the mode that uses it).")


def mode_summary(name: str, module: ModuleType) -> str:
  """A mode's one-line description for --help: its module docstring's first paragraph
  after `--mode=<name>: `, with the model_types of a mode that has a MODEL_TYPES list.

  Raises:
    ValueError: the docstring does not start with `--mode=<name>: ` (a new mode must
      describe itself there: --help is made from it).
  """
  head = f"--mode={name}: "
  doc = (module.__doc__ or "").strip()
  if not doc.startswith(head):
    raise ValueError(f"{module.__name__}'s docstring must start with {head!r} and one "
                     "sentence saying what the mode does (launch.py --help prints it)")
  summary = " ".join(doc.split("\n\n")[0][len(head):].split())
  types = getattr(module, "MODEL_TYPES", "")
  return summary + (f" model_type: {types}." if types else "")


def modes_help(modes: Mapping[str, ModuleType], width: int = 90) -> str:
  """The --help list of modes, `--mode=NAME  description` wrapped at `width`, from
  launch.py's MODES (each description from the mode module's docstring)."""
  column = max(len(name) for name in modes) + len("  --mode=") + 2
  lines = []
  for name, module in modes.items():
    lines += textwrap.wrap(mode_summary(name, module), width,
                           initial_indent=f"  --mode={name}".ljust(column),
                           subsequent_indent=" " * column, break_on_hyphens=False,
                           break_long_words=False)
  return "\n".join(lines)


# Modes whose output file can go elsewhere: the fix for an unwritable workdir is --output.
_OUTPUT_MODES = ("evaluate", "translate", "classify", "average")


def environment_error(error: OSError, mode: str = "train", workdir: str = "") -> str | None:
  """One line saying what the machine refused and what to do, or None if not such an error.

  Args:
    error: the refusal.
    mode: the --mode that met it: evaluate, translate and average are pointed at
      --output (the run stays where it is), the others at another --workdir.
    workdir: the command's --workdir; a refusal outside it (the data_dir) is not
      fixed by another --workdir, and the line says so.

  An error carrying `.flag` (workdir/files.py's `named`: --hf_dir, --output,
  --config.data.data_dir, ...) names that flag as the way out instead.
  """
  if (error.errno == errno.EEXIST and error.filename
      and os.path.lexists(error.filename) and not os.path.isdir(error.filename)):
    # os.makedirs on a path that is a file (--workdir=notes.txt): not a folder to use.
    return (f"{error.filename} is a file, not a folder: use another --workdir (or move "
            "the file)")
  if error.errno not in ENVIRONMENT_ERRNOS:
    return None
  where = f": {error.filename}" if error.filename else ""
  fix = ENVIRONMENT_ERRNOS[error.errno]
  flag = getattr(error, "flag", "")
  if flag:  # The writer said which flag (or config key) chose the path (workdir/files.py).
    fix = fix.replace("use another --workdir",
                      "write the result elsewhere with --output=PATH"
                      if flag == "--output" and getattr(error, "result_file", False)
                      else f"choose another {flag}")
    return f"{error.strerror or error}{where}; {fix}."
  if workdir and error.filename and not os.path.abspath(str(error.filename)).startswith(
      os.path.abspath(workdir) + os.sep) and os.path.abspath(str(error.filename)) != (
          os.path.abspath(workdir)):
    # Not the workdir (the dataset cache in data.data_dir, say): another --workdir would
    # not help.
    fix = fix.replace("use another --workdir", "move what is written there elsewhere "
                      "(the dataset cache: --config.data.data_dir)")
  elif mode in _OUTPUT_MODES:
    fix = fix.replace("use another --workdir", "write the result elsewhere with --output=PATH")
  return f"{error.strerror or error}{where}; {fix}."
