"""SIGINT / SIGTERM during training: stop after a complete step, save it, exit 128 + signal.

The first signal is a request: the loop finishes the compiled call running now (at
most train.steps_per_call steps; it dispatches no other and skips an evaluation due
at its end; with several processes, they stop together at the first multiple of
train.log_every from there), saves a checkpoint and raises `Interrupted` (launch.py exits 130 for Ctrl-C, 143 for SIGTERM). A second
signal stops at once, without waiting for the step: it raises `Aborted` where the
program is, except inside `StopRequest.deferred()` (a checkpoint being written, the
run's files, the closing of the writers), which ends first, so that nothing half
written is left behind. A third signal there stops at once too (a save that hangs on
a dead peer): the checkpoint being written is left incomplete, and the next start
moves it to checkpoints_bad/ and resumes from the newest complete one; launch.py then
ends without waiting for Orbax's threads (workdir/files.py's `note_abandoned`).
Either way the caller sees one `Interrupted`, whose exit status is that of the last
signal.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from transformer.workdir import files
from transformer.workdir import layout


class Interrupted(Exception):
  """Training stopped by SIGINT/SIGTERM; the same command resumes.

  Raised by train_and_evaluate once the files are closed, so that a caller (and a
  shell: launch.py exits with `exit_status`, 128 + the signal, i.e. 130 for Ctrl-C
  and 143 for SIGTERM) can tell an interrupted run from a finished one.

  Attributes:
    step: the step saved last (the one a rerun resumes from), None if none was.
    signum: the signal that stopped the run (the second one, if there were two).
    aborted: True when a second signal stopped it before the step it was training
      could be saved.
    exit_status: 128 + signum.
  """

  def __init__(self, step: int | None, signum: int, aborted: bool = False):
    self.step, self.signum, self.aborted = step, signum, aborted
    self.exit_status = 128 + signum
    name = signal.Signals(signum).name
    if not aborted:
      message = (f"Stopped by {name} at step {step} after saving a checkpoint; rerun the "
                 "same command to resume")
    elif step is None:
      message = (f"Stopped at once by a second signal ({name}), before any checkpoint was "
                 "saved; rerun the same command to start again")
    else:
      message = (f"Stopped at once by a second signal ({name}); rerun the same command to "
                 f"resume from checkpoint {step}")
    super().__init__(message)


class Aborted(KeyboardInterrupt):
  """A second signal: raised where the program is (a BaseException, like Ctrl-C's, so
  that no library's `except Exception` swallows it); train_and_evaluate turns it
  into `Interrupted`."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


class StopRequest:
  """Turns SIGINT/SIGTERM into a flag (the first) or `Aborted` (the second)."""

  def __init__(self):
    self.requested = False
    self.signum = signal.SIGTERM  # Another process's signal: a preemption, as a rule.
    self._previous = {}
    self._deferring = 0  # Depth of deferred() sections.
    self._abort_pending = False
    self.abandoned = False  # A third signal gave up a write: close nothing that waits on it.
    # What the first signal's line says (the loop's `running`): the compiled call running
    # (its first step, its last), the steps a call, the agreement cadence, the run's end.
    self._call: tuple[int, int] | None = None
    self._steps_per_call, self._every, self._num_steps = 1, 1, None

  def running(self, first: int, last: int, steps_per_call: int, every: int,
              num_steps: int) -> None:
    """The loop dispatches the call of steps `first`..`last`: where a stop would end."""
    self._call = (first, last)
    self._steps_per_call, self._every, self._num_steps = steps_per_call, every, num_steps

  def _where(self) -> str:
    """Where the first signal stops the run, in words (with the steps that is)."""
    per_call = f"train.steps_per_call={self._steps_per_call} steps a call"
    if self._call is None:
      return f"after the first compiled call ({per_call})"
    first, last = self._call
    if jax.process_count() > 1 and last % self._every:  # The processes agree there.
      stop = min(-(-last // self._every) * self._every, self._num_steps)
      return (f"at step {stop}, the first multiple of train.log_every={self._every} from "
              f"the compiled call running now (steps {first}-{last}; {per_call}), where "
              "the processes agree to stop")
    return (f"at step {last}, where the compiled call running now ends (steps "
            f"{first}-{last}: {last - first + 1} step{'s' if last > first else ''}; "
            f"{per_call})")

  def __enter__(self) -> "StopRequest":
    for sig in (signal.SIGINT, signal.SIGTERM):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # Not the main thread (e.g. inside some test runners).
        pass
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def should_stop(self, step: int, every: int) -> bool:
    """Whether to stop after `step`; with several processes, decided together.

    Processes may get the signal at different steps; they compare flags every
    `every` steps (a small all-gather) so that all of them save and stop at the same
    step, as a multi-host checkpoint requires.
    """
    if jax.process_count() == 1:
      return self.requested
    if step % every:
      return False
    flags = multihost_utils.process_allgather(np.asarray(self.requested))
    return bool(np.any(flags))

  @contextlib.contextmanager
  def deferred(self) -> Iterator[None]:
    """A section a second signal does not cut short: it takes effect at the end."""
    self._deferring += 1
    try:
      yield
    finally:
      self._deferring -= 1
    if not self._deferring and self._abort_pending:
      self._abort_pending = False  # Raised once: closing the files later may defer again.
      raise Aborted(self.signum)

  def _handle(self, signum, frame) -> None:
    del frame
    if self.requested:
      self.signum = signum
      if self._deferring and not self._abort_pending:
        logging.warning("Signal %d again: stopping once the files being written are "
                        "whole (once more to stop at once, leaving the checkpoint being "
                        "written incomplete).", signum)
        self._abort_pending = True
        return
      if self._deferring:  # The third: the write may never end (a dead peer).
        self.abandoned = True
        files.note_abandoned("the checkpoint being written is incomplete")
        logging.warning("Signal %d a third time: stopping now; the checkpoint being "
                        "written is left incomplete: the next start moves it to %s/ and "
                        "resumes from the newest complete one.", signum,
                        layout.BAD_CHECKPOINTS)
        self._abort_pending = False  # Raised now, not again as the sections end.
      raise Aborted(signum)
    logging.warning("Signal %d: stopping %s, and saving a checkpoint there; an "
                    "evaluation not started yet is skipped (again to stop at once, "
                    "without saving it).", signum, self._where())
    self.requested = True
    self.signum = signum
