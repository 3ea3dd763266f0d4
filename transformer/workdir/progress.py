"""What a long mode says while it works: counted progress and timed stages.

One mechanism for every mode that runs longer than a few seconds (evaluate, compile,
passkey, benchmark, average, import, export, translate, ..., and the evaluations inside
training): the lines are absl INFO records of this project, so the console filter
(console.py) shows them bare and `<workdir>/log.txt` keeps them too. Only process 0 of a
multi-process run says them.

- `Progress`: '<what>: 12/40 batches (3.1 batches/s), ETA 9s' at most every
  `EVERY_SECONDS`, then one summary line
  '<what>: 40 batches in 13s (3.1 batches/s)' from `finish`.
- `stage`: '<what> ...' as a stage starts and '<what>: 12.3s' when it ends (compile's
  lowering and XLA compile, an import's reading and saving); with `heartbeat`, a
  '<what>: still running, 1m30s' line meanwhile (a SentencePiece vocabulary's training).

--mode=prepare's line is a Progress of MB read with a `detail` (tasks, tokens/s), said by
a timer thread from counters its workers (or a Ray cluster's tasks) add to. The training
loop's own progress line (training/metrics.py's TrainProgress: MFU, data wait) stays its own.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

from absl import logging

# The most often a Progress line is said. Tests set it to 0 to see a line on a tiny run.
EVERY_SECONDS = 5.0


def _first_process() -> bool:
  """Whether this is process 0 (JAX is not imported here: console.py must run before
  JAX loads, and a mode that never starts JAX is process 0 alone)."""
  jax = sys.modules.get("jax")
  return jax is None or jax.process_index() == 0


def say(line: str) -> None:
  """Logs `line` as a progress record (process 0 only)."""
  if _first_process():
    logging.info("%s", line)


def seconds_text(seconds: float) -> str:
  """2.345 -> '2.3s'; 754 -> '12m34s' (console.format_duration past a minute)."""
  if seconds < 60:
    return f"{seconds:.1f}s"
  from transformer.workdir import console  # pylint: disable=g-import-not-at-top
  return console.format_duration(seconds)


class Progress:
  """Counted progress of one piece of work (see the module docstring)."""

  def __init__(self, what: str, total: float | None = None, unit: str = "items",
               every: float | None = None, clock: Callable[[], float] = time.perf_counter,
               detail: Callable[[], str] | None = None):
    """`what`: the line's head ("evaluate validation"); `total`: None when unknown (no
    ETA then; a float total counts in tenths: MB); `every`: seconds between lines,
    default EVERY_SECONDS at each update; `detail`: more of the line, after the rate."""
    self.what, self.total, self.unit = what, total, unit
    self._every, self._clock, self._detail = every, clock, detail
    self.done = 0
    self._start = self._last = clock()

  def _rate(self, now: float) -> float:
    return self.done / max(now - self._start, 1e-9)

  def seconds(self) -> float:
    """Seconds since the work began (never 0)."""
    return max(self._clock() - self._start, 1e-9)

  def line(self) -> str:
    """'<what>: 12/40 batches (3.1 batches/s), ETA 9s' (no total: '12 batches (...)')."""
    rate = self._rate(self._clock())
    shown = (lambda x: f"{x:,.1f}") if isinstance(self.total, float) else str
    count = (f"{shown(self.done)}/{shown(self.total)}" if self.total is not None
             else shown(self.done))
    text = f"{self.what}: {count} {self.unit} ({rate:.3g} {self.unit}/s)"
    if self._detail is not None:
      text += ", " + self._detail()
    if self.total is not None and self.done < self.total and rate > 0:
      text += f", ETA {seconds_text((self.total - self.done) / rate)}"
    return text

  def update(self, count: int = 1) -> None:
    """Adds `count` finished items; says the line at most every `every` seconds."""
    self.done += count
    now = self._clock()
    every = EVERY_SECONDS if self._every is None else self._every
    if now - self._last >= every:
      self._last = now
      say(self.line())

  def finish(self, extra: str = "") -> None:
    """The summary line: '<what>: 40 batches in 13s (3.1 batches/s)[; extra]'."""
    now = self._clock()
    say(f"{self.what}: {self.done} {self.unit} in {seconds_text(now - self._start)} "
        f"({self._rate(now):.3g} {self.unit}/s)" + (f"; {extra}" if extra else ""))


@contextlib.contextmanager
def stage(what: str, clock: Callable[[], float] = time.perf_counter,
          heartbeat: float = 0.0) -> Iterator[None]:
  """'<what> ...' now and '<what>: 12.3s' when the block ends without an error (an
  error says itself).

  `heartbeat` > 0: '<what>: still running, 1m30s' every that many seconds meanwhile,
  for work that cannot count its progress (a SentencePiece trainer in C++)."""
  say(f"{what} ...")
  start = clock()
  stop = threading.Event()
  beating = None
  if heartbeat > 0:
    def beat() -> None:
      while not stop.wait(heartbeat):
        say(f"{what}: still running, {seconds_text(clock() - start)}")
    beating = threading.Thread(target=beat, daemon=True, name="progress-heartbeat")
    beating.start()
  try:
    yield
  finally:
    stop.set()
    if beating is not None:
      beating.join()
  say(f"{what}: {seconds_text(clock() - start)}")
