"""transformer/workdir/orbax_patch.py replaces a private Orbax function: these tests fail,
saying what changed, when a new Orbax makes that replacement miss (the function gone,
or no longer what `run_sync` calls) or when requirements.txt moves Orbax's pin away
from the versions the replacement was written for. What the replacement does (a
failed save's other writes end first) is tested in tests/test_races_and_interrupts.py.
"""

from __future__ import annotations

import pathlib
import re
import types

from orbax.checkpoint._src import asyncio_utils

from transformer.workdir import checkpointing  # pylint: disable=unused-import  (installs it)
from transformer.workdir import orbax_patch

ROOT = pathlib.Path(__file__).resolve().parent.parent
WHAT_TO_DO = "read transformer/workdir/orbax_patch.py's docstring: 'When Orbax changes'"


def test_the_private_function_is_there_and_replaced():
  assert callable(getattr(asyncio_utils, orbax_patch.REPLACED, None)), (
      f"this Orbax has no asyncio_utils.{orbax_patch.REPLACED}: the drain of a failed "
      f"save is not installed; {WHAT_TO_DO}")
  assert getattr(asyncio_utils, orbax_patch.REPLACED) is orbax_patch.run_sync_draining


def test_orbax_runs_its_saves_through_the_replaced_function(monkeypatch):
  """A new Orbax whose run_sync no longer calls the function would keep the name and
  skip the replacement: the first test would pass and nothing would be drained."""
  calls = []

  def spy(coro):
    calls.append(coro)
    return orbax_patch.run_sync_draining(coro)

  monkeypatch.setattr(asyncio_utils, orbax_patch.REPLACED, spy)

  async def save():
    return 7

  assert asyncio_utils.run_sync(save()) == 7
  assert len(calls) == 1, (f"asyncio_utils.run_sync no longer runs its coroutine through "
                           f"{orbax_patch.REPLACED}; {WHAT_TO_DO}")


def test_requirements_pin_the_orbax_the_patch_was_written_for():
  pins = re.findall(r"^orbax-checkpoint\s*([^\s#]+)", (ROOT / "requirements.txt").read_text(
      encoding="utf-8"), flags=re.MULTILINE)
  assert pins == [orbax_patch.WRITTEN_FOR], (
      f"requirements.txt pins orbax-checkpoint{pins} but orbax_patch.py was written for "
      f"{orbax_patch.WRITTEN_FOR}; check the replacement against the new Orbax, then "
      f"update WRITTEN_FOR; {WHAT_TO_DO}")


def test_an_orbax_without_the_function_is_reported_not_silently_skipped(caplog):
  """install() on a module that lacks the function: one warning naming it, nothing set."""
  newer = types.ModuleType("orbax.checkpoint._src.asyncio_utils")
  with caplog.at_level("WARNING"):
    problem = orbax_patch.install(newer)
  assert f"has no {orbax_patch.REPLACED}" in problem and "orbax_patch.py" in problem
  assert problem in caplog.text
  assert not hasattr(newer, orbax_patch.REPLACED)
  assert orbax_patch.install(asyncio_utils) == ""  # The real one: installed (again).
