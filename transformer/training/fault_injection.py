"""Test-only crash injection for the training loop (a power cut at a chosen point).

A hook (hooks.py) that registers itself: with TRANSFORMER_TEST_KILL_AT set, every run
gets one; unset, none. tests/test_crash_safety.py sets the variable and reruns the
command to check that the run recovers exactly. transformer/training/__init__.py
imports this module, so that any use of the loop (launch.py, a test worker) has it.
"""

from __future__ import annotations

from typing import Any

from transformer.training import hooks
from transformer.workdir import kill_points


class KillAt(kill_points.KillPoints, hooks.Hook):
  """The training loop's hook over workdir/kill_points.py's points: during_eval,
  during_save, after_save and after_step call it at their step."""

  def after_eval(self, step: int, state: Any, metrics: dict[str, float]) -> None:
    self("during_eval", step)

  def after_save(self, step: int, checkpointer: Any) -> None:
    self("during_save", step)
    self("after_save", step, first=checkpointer.wait)

  def after_call(self, step: int, state: Any) -> None:
    self("after_step", step)


@hooks.register
def _from_environment() -> KillAt | None:
  """A run's KillAt when the variable is set (an invalid value raises ValueError)."""
  kill_at = KillAt.from_env()
  return kill_at if kill_at.point else None
