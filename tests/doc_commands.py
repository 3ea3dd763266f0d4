"""The commands and Python snippets of README.md and docs/*.md, as tests/test_docs.py reads them.

What counts as a command (the rule, so that no list of lines is needed):
  - every line of a fenced block labelled bash / sh / shell / console;
  - an unlabelled fenced block whose every statement starts like a command (`python`,
    `pip`, `bash`, `echo`, `mkdir`, `NAME=value`), or, for a console transcript, the
    lines that start with the prompt `$ ` (the rest is the output it shows);
  - an inline span in backticks that starts with `python `, `pip install ` or
    `tensorboard `.
A fenced block labelled python is a snippet; other labels (json, text) and unlabelled
blocks that are not commands (docs/layout.md's file tree, an error message) are not read.

A statement is one logical line: `\\`-continued lines joined, `# comments` dropped,
split at `&&` and `;`; a pipe (`echo ... | python launch.py ...`) stays one statement.
`NAME=value` statements set variables that later statements of the same page read as
`$NAME` (as the shell would); `NAME=value python ...` is an environment prefix.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND_LABELS = ("bash", "sh", "shell", "console")
_COMMAND_START = re.compile(r"^(?:(?:python3?|pip|bash|echo|printf|mkdir|head|cat)(?:\s|$)"
                            r"|[A-Za-z_][A-Za-z0-9_]*=)")
_FENCE = re.compile(r"^\s*```(\S*)\s*$")
_INLINE = re.compile(r"`((?:python3? |pip install |tensorboard )[^`]*)`")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=", re.S)


@dataclasses.dataclass(frozen=True)
class Command:
  """One statement of a doc: where it is, its text as written, and what it runs."""

  path: str  # Relative to the repository: docs/modes.md.
  line: int  # 1-based line where the statement starts.
  text: str  # As written, continuations joined, comments dropped, whitespace collapsed.
  block: int  # The fenced block's index in its file (-1: inline in the prose).
  env: tuple[tuple[str, str], ...]  # NAME=value prefixes (XLA_FLAGS=...).
  argv: tuple[str, ...]  # The words after the environment prefix, $VARs expanded.
  stdin: str | None  # `echo TEXT | ...`: TEXT; else None.
  stdout: str | None  # `... > PATH`: PATH; else None (`2>/dev/null` is dropped).
  output: tuple[str, ...] = ()  # A console transcript's lines shown after the command.

  @property
  def where(self) -> str:
    return f"{self.path}:{self.line}"


@dataclasses.dataclass(frozen=True)
class Snippet:
  """One ```python block."""

  path: str
  line: int
  code: str

  @property
  def where(self) -> str:
    return f"{self.path}:{self.line}"


def doc_files() -> list[str]:
  """README.md and every docs/*.md (a page added later is read too)."""
  return ["README.md"] + sorted(os.path.relpath(p, ROOT)
                                for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _blocks(lines: list[str]):
  """(label, first body line index, body lines) of each fenced block; the prose lines."""
  blocks, prose, i = [], [], 0
  while i < len(lines):
    match = _FENCE.match(lines[i])
    if not match:
      prose.append((i, lines[i]))
      i += 1
      continue
    end = i + 1
    while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
      end += 1
    blocks.append((match.group(1).lower(), i + 1, lines[i + 1:end]))
    i = end + 1
  return blocks, prose


def _logical_lines(start: int, body: list[str], transcript: bool):
  """(0-based line index, text, output lines) of each logical line: continuations joined;
  in a console transcript only the `$ ` lines (and their continuations), each with the
  output lines shown after it."""
  out, i = [], 0
  while i < len(body):
    line = body[i].rstrip()
    if transcript:
      if not line.lstrip().startswith("$ "):
        if out:
          out[-1][2].append(line)
        i += 1
        continue
      line = line.lstrip()[2:]
    first = i
    while line.endswith("\\") and i + 1 < len(body):
      i += 1
      line = line[:-1] + " " + body[i].strip()
    out.append((start + first, line, []))
    i += 1
  return out


def _without_comment(line: str) -> str:
  """The line up to its first `#` outside quotes (a shell comment)."""
  quote = None
  for k, ch in enumerate(line):
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch == "#" and (k == 0 or line[k - 1].isspace()):
      return line[:k]
  return line


def _statements(line: str) -> list[str]:
  """A logical line split at `&&` and `;` outside quotes."""
  parts, current, quote, k = [], "", None, 0
  while k < len(line):
    ch = line[k]
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif line.startswith("&&", k) or ch == ";":
      parts.append(current)
      current = ""
      k += 2 if ch == "&" else 1
      continue
    current += ch
    k += 1
  parts.append(current)
  return [" ".join(p.split()) for p in parts if p.strip()]


def _expand(text: str, variables: dict[str, str]) -> str:
  """$NAME / ${NAME} replaced by the block's variables (unknown ones stay as written)."""
  return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                lambda m: variables.get(m.group(1), m.group(0)), text)


def _command(path: str, line: int, text: str, block: int, variables: dict[str, str],
             output: tuple[str, ...] = ()) -> Command | None:
  """The Command of one statement; None for `NAME=value` alone (it sets a variable)."""
  stdin = None
  expanded = _expand(text, variables)
  if "|" in expanded and expanded.startswith("echo "):
    left, _, expanded = expanded.partition("|")
    stdin = " ".join(shlex.split(left)[1:])
  words = shlex.split(expanded)
  env = []
  while words and _ASSIGNMENT.match(words[0]):
    name, _, value = words.pop(0).partition("=")
    env.append((name, value))
  if not words:  # W=runs/x: a variable for the statements after it.
    variables.update(env)
    return None
  stdout = None
  if "2>/dev/null" in words:
    words.remove("2>/dev/null")
  if ">" in words[:-1]:
    stdout = words[words.index(">") + 1]
    del words[words.index(">"):words.index(">") + 2]
  return Command(path, line + 1, text, block, tuple(env), tuple(words), stdin, stdout,
                 output)


def _is_command_block(label: str, body: list[str]) -> tuple[bool, bool]:
  """(holds commands, is a console transcript) by the module docstring's rule."""
  if label in COMMAND_LABELS:
    return True, any(line.lstrip().startswith("$ ") for line in body)
  if label:
    return False, False
  if any(line.lstrip().startswith("$ ") for line in body):
    return True, True
  logical = [_without_comment(t).strip() for _, t, _ in _logical_lines(0, body, False)]
  statements = [s for line in logical for s in _statements(line)]
  return bool(statements) and all(_COMMAND_START.match(s) for s in statements), False


def extract(path: str) -> tuple[list[Command], list[Snippet]]:
  """Every command and Python snippet of one doc (a path relative to the repository)."""
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    lines = f.read().split("\n")
  blocks, prose = _blocks(lines)
  commands, snippets = [], []
  variables: dict[str, str] = {}  # A reader keeps one shell open for the page.
  for index, (label, start, body) in enumerate(blocks):
    if label == "python":
      snippets.append(Snippet(path, start + 1, "\n".join(body) + "\n"))
      continue
    is_commands, transcript = _is_command_block(label, body)
    if not is_commands:
      continue
    for line, logical, output in _logical_lines(start, body, transcript):
      for statement in _statements(_without_comment(logical)):
        command = _command(path, line, statement, index, variables, tuple(output))
        if command is not None:
          commands.append(command)
  for line, text in prose:
    for match in _INLINE.finditer(text):
      statement = " ".join(match.group(1).split())
      commands.append(_command(path, line, statement, -1, {}))
  return commands, snippets


def all_commands() -> tuple[list[Command], list[Snippet]]:
  """extract() of every doc_files() page, in file order."""
  commands, snippets = [], []
  for path in doc_files():
    c, s = extract(path)
    commands += c
    snippets += s
  return commands, snippets
