"""Test-only crash injection for the training loop (a power cut at a chosen point).

Unset, each call is one comparison; tests/test_crash_safety.py sets the variable and
reruns the command to check that the run recovers exactly.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Callable

from absl import logging


class KillAt:
  """Test-only crash injection: TRANSFORMER_TEST_KILL_AT="<point>:<step>", read once per run.

  The process SIGKILLs itself (no cleanup, no flush: as a power cut or an OOM kill) at
  `point` of step `step`: after_step (the step's iteration is over), during_eval
  (evaluated, not yet written), during_save (after manager.save returned, the async
  write still in flight), after_save (the write finished). Tests rerun the command
  and check that the run recovers exactly. Unset, a call is one comparison.
  """

  POINTS = ("after_step", "during_eval", "during_save", "after_save")
  VARIABLE = "TRANSFORMER_TEST_KILL_AT"

  def __init__(self, value: str):
    self.point, self.step = None, None
    if not value:
      return
    point, _, step = value.partition(":")
    if point not in self.POINTS or not step.isdigit():
      raise ValueError(f"{self.VARIABLE}={value!r} is invalid: expected <point>:<step> with "
                       f"point one of {self.POINTS}, e.g. 'after_step:5'")
    self.point, self.step = point, int(step)

  @classmethod
  def from_env(cls) -> "KillAt":
    return cls(os.environ.get(cls.VARIABLE, ""))

  def __call__(self, point: str, step: int, first: Callable[[], Any] | None = None) -> None:
    """Kills the process if (point, step) is the one asked for, after calling `first`."""
    if point != self.point or step != self.step:
      return
    if first is not None:
      first()
    logging.warning("%s: killing this process %s %d", self.VARIABLE, point, step)
    logging.flush()
    os.kill(os.getpid(), signal.SIGKILL)
