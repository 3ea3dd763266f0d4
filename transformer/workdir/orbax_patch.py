"""The one place a library's internals are replaced: Orbax's event loop for a save.

What it replaces: `orbax.checkpoint._src.asyncio_utils._run_sync_via_new_loop`, the
private function through which Orbax's `run_sync` runs a save's (or restore's)
coroutines in a fresh event loop when no loop is running (every save this package
makes). `install()` puts `run_sync_draining` in its place; `run_sync` looks the name
up at each call, so replacing the module attribute is enough.

Why: Orbax gathers a save's tensorstore writes with `asyncio.gather` and closes the
loop as soon as one write fails (a full disk). The other writes go on in C++, then
print "RuntimeError: Event loop is closed" (dozens of tracebacks after the one-line
message) and write files into a folder the caller has already removed. The
replacement first runs the failed loop's remaining tasks to their end (each fails fast
on the same full disk), so a failed save is over when its error reaches the caller; at
most DRAIN_SECONDS (a write that hangs is then cancelled, with a warning). A second
signal (KeyboardInterrupt) is not drained: it stops at once (docs/resume.md).

Written for: orbax-checkpoint 0.12.8, the range requirements.txt pins (WRITTEN_FOR);
the replacement is Orbax's own function (new loop, run_until_complete, close) plus the
drain.

When Orbax changes: tests/test_orbax_patch.py fails, naming what changed, if the
function is gone, if `run_sync` no longer calls it, or if requirements.txt's pin moves
away from WRITTEN_FOR. Then read the new Orbax's `asyncio_utils.run_sync`: if it still
closes its loop on the first failed write (tests/test_races_and_interrupts.py's
full-disk test shows it), replace whatever function now runs the loop and set
WRITTEN_FOR to the new pin; if Orbax drains or cancels the other writes itself, delete
this module and its `install()` call in checkpointing.py. Without the function, a run
still works and logs a warning once: only a full disk's error comes with the tracebacks
above again.

Imports nothing of transformer/.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any, Coroutine

from absl import logging
from orbax.checkpoint._src import asyncio_utils

# The orbax-checkpoint versions this replacement was written and checked for (the pin
# in requirements.txt; tests/test_orbax_patch.py compares them).
WRITTEN_FOR = ">=0.12.8,<0.13"
# The private name replaced in orbax.checkpoint._src.asyncio_utils.
REPLACED = "_run_sync_via_new_loop"
# How long a failed save's other writes are waited for (`run_sync_draining`).
DRAIN_SECONDS = 60


def run_sync_draining(coro: Coroutine[Any, Any, Any]) -> Any:
  """Orbax's `_run_sync_via_new_loop`, but a failure waits for the loop's other tasks
  (at most DRAIN_SECONDS; a KeyboardInterrupt not at all)."""
  loop = asyncio.new_event_loop()
  try:
    asyncio.set_event_loop(loop)
    try:
      return loop.run_until_complete(coro)
    except KeyboardInterrupt:
      raise  # A second signal (files.signals_deferred): stop now, nothing waited for.
    except BaseException:
      pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
      if pending:
        _, still = loop.run_until_complete(asyncio.wait(pending, timeout=DRAIN_SECONDS))
        if still:  # A write that does not end (a dead peer, a hung file system).
          logging.warning("%d writes of the failed save had not ended after %d s; not "
                          "waiting longer (the folder they write is not used)", len(still),
                          DRAIN_SECONDS)
          for task in still:
            task.cancel()
      raise
  finally:
    asyncio.set_event_loop(None)
    loop.close()


def install(module: ModuleType = asyncio_utils) -> str:
  """Replaces `module`'s REPLACED function with run_sync_draining (again: no change).

  Returns:
    "" when installed; else why not (the function is gone), also logged as a warning.
  """
  if not callable(getattr(module, REPLACED, None)):
    problem = (f"{module.__name__} has no {REPLACED} (this Orbax is not the {WRITTEN_FOR} "
               "that transformer/workdir/orbax_patch.py was written for): a save that "
               "fails on a full disk is not drained, and its other writes may print "
               "'Event loop is closed'; see that module's docstring")
    logging.warning("%s", problem)
    return problem
  setattr(module, REPLACED, run_sync_draining)
  return ""
