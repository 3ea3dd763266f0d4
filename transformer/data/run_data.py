"""Which data a run trained on, and whether the data a command reads now is the same.

A training run records its data identity in `<workdir>/dataset.json`
(layout.DATASET_RECORD, written by `sources.save_dataset_record`): the TFDS full name
and, for the `local_*` builders and prepared corpora, the sha256 of every input file
and the absolute path the run read them from (`source_path`), and the identity of the
tokenizer it trained with (TOKENIZER, checked by `run_vocabulary.load_workdir_tokenizer`).
Everything that reads a run against data compares through here:

  - `same_content`: identity by content. A `local_*` dataset's name holds its file
    name and folder-relative paths, so a byte-identical copy in another folder or
    under another name gets another name; the content (the files' sha256; for a
    folder, with their relative paths, which decide the splits) is what the run
    trained on, so it is the same data. An edited file is not.
  - `change`: how a dataset differs from the run's, or None (the resume check in
    training/loop.py and the modes that read a run's data both use it), noting a
    path change in one log line when the content is the same.
  - `resolve_path`: a run's relative `data.path` resolved the way the run resolved
    it (to the absolute path it recorded), not against today's current directory.

Imports only workdir/layout: data/sources.py builds on it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import logging

from transformer.workdir import layout

TOKENIZER = "tokenizer"  # dataset.json's key of the tokenizer's identity (kind, size, sha256).


def read_record(workdir: str) -> dict[str, Any] | None:
  """The run's dataset.json, or None when it has none (a run from before it was kept).

  A --mode=import workdir's holds the tokenizer's identity alone (no "name": no data).
  """
  path = os.path.join(workdir, layout.DATASET_RECORD)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _kind_and_version(name: str) -> tuple[str, str]:
  """('local_text', '1.0.0') from 'local_text/<config>/1.0.0'; the config part is dropped."""
  parts = str(name).split("/")
  return parts[0], parts[-1] if len(parts) > 2 else ""


def same_content(saved: dict[str, Any], record: dict[str, Any]) -> bool:
  """Whether two dataset records name the same data: the same files' content, or for
  data without files (a catalog dataset, a record older than the files) the same name.

  Content: the same builder and version, and the same sha256 for every file; with
  several files their relative paths must match too (file names decide the splits of
  a folder, and a prepared corpus's record order), while a single file may have any
  name. The name alone is not enough where files are recorded: a prepared corpus's
  name is its folder's (keyed by data.path), the same after its files were renamed or
  replaced and prepared again.
  """
  old, new = saved.get("files") or {}, record.get("files") or {}
  if not old or not new:
    return saved.get("name") == record.get("name")  # A catalog dataset: its name is its identity.
  if _kind_and_version(saved.get("name", "")) != _kind_and_version(record.get("name", "")):
    return False
  if len(old) == 1 and len(new) == 1:
    return list(old.values()) == list(new.values())
  return old == new


def identity(record: dict[str, Any]) -> dict[str, Any]:
  """What `same_content` decides on, one key per line, with the tokenizer's identity:
  what the processes of one run must agree on (distributed.agree), wherever each one
  finds its files (a relative data.path, a copy on each host's disk)."""
  files = record.get("files") or {}
  result: dict[str, Any] = {}
  if "name" in record:  # A record of the tokenizer alone has none.
    result["dataset"] = ("/".join(_kind_and_version(record["name"])) if files
                         else record["name"])
  result.update({f"file {path} (sha256)": digest for path, digest in sorted(files.items())})
  for key, value in sorted((record.get(TOKENIZER) or {}).items()):
    result[f"tokenizer {key}"] = value
  return result


def same_as_run(workdir: str, record: dict[str, Any]) -> bool:
  """Whether the run in `workdir` recorded its data and `record` has the same content."""
  saved = read_record(workdir)
  return saved is not None and "name" in saved and same_content(saved, record)


def change(workdir: str, record: dict[str, Any]) -> str | None:
  """How `record` differs from the dataset the run in `workdir` trained on, or None.

  None also when the workdir has no record (a run from before it was kept). The same
  content read from another path is no change; it is logged in one line.
  """
  saved = read_record(workdir)
  if saved is None or "name" not in saved:  # No data recorded (an import's tokenizer alone).
    return None
  if same_content(saved, record):
    before, now = saved.get("source_path"), record.get("source_path")
    if saved.get("name") != record.get("name") or (before and now and before != now):
      logging.info("The data is the same content as %s's dataset (sha256 of every file "
                   "equal), read from %s (the run read %s)", workdir,
                   now or record.get("name"), before or saved.get("name"))
    return None
  result = f"dataset: {saved.get('name')!r} -> {record['name']!r}"
  old, new = saved.get("files") or {}, record.get("files") or {}
  if old or new:
    result += f" ({files_change(old, new)})"
  if saved.get("source_path") and saved.get("source_path") != record.get("source_path"):
    result += f" (the run read {saved['source_path']}, this reads {record.get('source_path')})"
  return result


def files_change(old: dict[str, str], new: dict[str, str]) -> str:
  """How two {relative path: sha256} maps differ, a rename (the same bytes under
  another name) said as one: 'renamed with the same bytes ...: a.txt -> e.txt; changed: b.txt'."""
  removed = sorted(p for p in old if p not in new)
  added = sorted(p for p in new if p not in old)
  renamed = []
  for path in list(removed):
    match = next((p for p in added if new[p] == old[path]), None)
    if match is not None:
      renamed.append(f"{path} -> {match}")
      removed.remove(path)
      added.remove(match)
  parts = [("renamed with the same bytes (records are read in name order)", renamed),
           ("changed", sorted(p for p in set(old) & set(new) if old[p] != new[p])),
           ("added", added), ("removed", removed)]
  return "; ".join(f"{what}: {', '.join(paths)}" for what, paths in parts if paths) or "none"


def resolve_path(workdir: str, data_path: str) -> str:
  """A run's `data.path` as the run resolved it.

  A relative path was resolved against the training command's current directory,
  which the run records as the absolute `source_path` in dataset.json. When that file
  is still there it is used, wherever the command reading the run runs from; when it
  is gone, the path resolves against the current directory as before, and the
  content check (`change`) refuses whatever other file that names.

  Args:
    workdir: the run's workdir.
    data_path: `data.path` from the run's config.json.

  Returns:
    The path to read: `data_path` itself unless it is relative and the run recorded
    where it pointed.
  """
  if not data_path or os.path.isabs(os.path.expanduser(data_path)):
    return data_path
  saved = read_record(workdir) or {}
  recorded = saved.get("source_path")
  here = os.path.abspath(data_path)
  if not recorded or recorded == here:
    return data_path
  if os.path.exists(recorded):
    logging.info("config.data.path=%r is relative: using %s, where the run read it (%s), "
                 "not %s", data_path, recorded, layout.DATASET_RECORD, here)
    return recorded
  logging.warning("config.data.path=%r: the run read %s, which is gone; trying %s (its "
                  "content must match %s)", data_path, recorded, here, layout.DATASET_RECORD)
  return data_path
