"""Test-only crash injection at named points of a write (a power cut at a chosen point).

`KillPoints` reads TRANSFORMER_TEST_KILL_AT once; a write calls it with its point and
index, and it kills the process there. The training loop's hook
(training/fault_injection.py) and --mode=prepare (data/corpus/preparation.py) share it, so
one variable and one parser serve every layer that writes. Inert unless the variable is set.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Callable

from absl import logging


class KillPoints:
  """Test-only crash injection: TRANSFORMER_TEST_KILL_AT="<point>:<step>[:<signal>]", read
  once per run (the signal: SIGKILL by default; SIGINT or SIGTERM as Ctrl-C or a kill;
  SIGSTOP frozen there).

  The process SIGKILLs itself (no cleanup, no flush: as a power cut or an OOM kill) at
  `point` of step `step`: after_step (the step's iteration is over: the hooks'
  after_call), during_eval (evaluated, not yet written: after_eval), during_save
  (after manager.save returned, the async write still in flight: after_save),
  after_save (the write finished: after_save, once checkpointer.wait() returned).
  Tests rerun the command and check that the run recovers exactly.

  --mode=prepare (data/corpus/preparation.py) calls it with the index of a source file for
  its `step`: prepare_writing (a document of that file written, its shard half-written)
  and prepare_written (its shards renamed into place, its task json not yet written).

  TRANSFORMER_TEST_KILL_ONCE=<path>, beside it: the kill happens only in the process that
  creates <path> first, so a task that is retried (on a Ray cluster) dies once, not at
  every attempt.
  """

  POINTS = ("after_step", "during_eval", "during_save", "after_save", "prepare_writing",
            "prepare_written")
  VARIABLE = "TRANSFORMER_TEST_KILL_AT"
  ONCE = "TRANSFORMER_TEST_KILL_ONCE"
  # An optional third field: Ctrl-C, a kill; SIGSTOP freezes the process there (a machine
  # that hangs or is lost) until a test kills it or its node.
  SIGNALS = ("SIGKILL", "SIGINT", "SIGTERM", "SIGSTOP")

  def __init__(self, value: str):
    self.point, self.step, self.signum = None, None, signal.SIGKILL
    if not value:
      return
    point, _, step = value.partition(":")
    step, _, name = step.partition(":")
    if point not in self.POINTS or not step.isdigit() or name not in ("",) + self.SIGNALS:
      raise ValueError(f"{self.VARIABLE}={value!r} is invalid: expected <point>:<step> with "
                       f"point one of {self.POINTS}, e.g. 'after_step:5', optionally "
                       f":<signal> of {self.SIGNALS} (default SIGKILL)")
    self.point, self.step = point, int(step)
    self.signum = getattr(signal, name or "SIGKILL")

  @classmethod
  def from_env(cls) -> "KillPoints":
    return cls(os.environ.get(cls.VARIABLE, ""))

  def __call__(self, point: str, step: int, first: Callable[[], Any] | None = None) -> None:
    """Kills the process if (point, step) is the one asked for, after calling `first`."""
    if point != self.point or step != self.step:
      return
    once = os.environ.get(self.ONCE, "")
    if once:
      try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
      except FileExistsError:
        return  # Killed once already (an earlier attempt of this task).
    if first is not None:
      first()
    logging.warning("%s: killing this process %s %d (%s)", self.VARIABLE, point, step,
                    signal.Signals(self.signum).name)
    logging.flush()
    os.kill(os.getpid(), self.signum)

