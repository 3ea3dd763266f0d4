"""`<workdir>/run.json`: what a run's metrics.jsonl does not hold (parameter counts, wall time).

Also `flatten`, the key-per-line view of a run's config.json that resuming and
comparing runs share.

Written by process 0 of the training loop when it starts and after every checkpoint
save; read by the comparison table (transformer/reports/compare.py). Each invocation of the
training command is a session; a run's wall time is the sum over its sessions since
it last started from step 0 (steps redone after a crash count twice: that time was
spent). A session's time is the training loop's: compiling, evaluating and saving
included; building the dataset and tokenizer excluded (cached, and shared by the
runs of a sweep). A session killed between saves loses its time since the last save.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from transformer.workdir import layout



def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"model.d_model": 256, ...} from nested dicts (a config.json); lists stay values."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat


def flat_config(config: Any) -> dict[str, Any]:
  """A ConfigDict as config.json holds it, flattened: what a resume compares with its
  config.json and the processes of a run exchange (distributed.agree)."""
  return flatten(json.loads(config.to_json_best_effort()))


def read_record(workdir: str) -> dict[str, Any]:
  """The run's record, or {} when it has none (a run older than run.json) or it is unreadable."""
  try:
    with open(os.path.join(workdir, layout.RUN_RECORD), encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


class RunRecord:
  """Keeps run.json up to date for one session; the clock starts at construction."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self._path = os.path.join(workdir, layout.RUN_RECORD)
    self._start = time.perf_counter()
    self._record = read_record(workdir) if enabled else {}
    self._session: dict[str, Any] | None = None

  def update(self, step: int, parameters: int | None = None,
             trainable_parameters: int | None = None) -> None:
    """Records that this session has reached `step` (the first call: where it starts);
    `parameters`: the model's, `trainable_parameters`: those the optimizer updates (fewer
    with LoRA)."""
    if not self.enabled:
      return
    if self._session is None:
      if step == 0:  # A start from scratch: earlier sessions' rows were dropped too.
        self._record = {}
      self._session = {"start_step": int(step)}
      self._record.setdefault("sessions", []).append(self._session)
    if parameters is not None:
      self._record["parameters"] = int(parameters)
    if trainable_parameters is not None:
      self._record["trainable_parameters"] = int(trainable_parameters)
    self._session.update(end_step=int(step),
                         seconds=round(time.perf_counter() - self._start, 3))
    self._record["wall_seconds"] = round(
        sum(s["seconds"] for s in self._record["sessions"]), 3)
    temporary = self._path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as f:
      json.dump(self._record, f, indent=1)
    os.replace(temporary, self._path)


def sessions(workdir: str) -> list[dict[str, Any]]:
  """The sessions run.json lists (each {"start_step", "end_step", "seconds"}), [] if none."""
  found = read_record(workdir).get("sessions")
  return found if isinstance(found, list) else []


def total_seconds(workdir: str, before: list[dict[str, Any]],
                  session_seconds: float) -> float | None:
  """The wall time of every session of the run, this one (`session_seconds`) included.

  Args:
    workdir: the run's workdir.
    before: `sessions(workdir)` read before this session trained: the entry this
      session added since (if any) is replaced by `session_seconds`, which counts
      what run.json leaves out of a session (building the data), so that the total is
      never less than this session alone.
    session_seconds: this session's wall time as the command measured it.

  Returns:
    The seconds, or None when run.json holds no session (nothing was ever trained).
  """
  after = sessions(workdir)
  if not after:
    return None
  added = after != before[:len(after)] or len(after) > len(before)
  earlier = after[:-1] if added else after
  return sum(float(s.get("seconds", 0)) for s in earlier) + session_seconds

