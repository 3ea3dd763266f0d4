"""The next calls' batches built and placed while the current call runs (data.prefetch).

Without it the loop builds each call's batch between two calls: it pulls the rows from
the grain iterator, stacks a call's rows ([k, B, ...] for train.steps_per_call = k)
and places them with the step's sharding (a device_put, or the global array assembled
from this process's rows), and only then dispatches the step. `CallBatches` does that
work in a background thread, `data.prefetch` calls ahead of the loop, so that it
overlaps the step the devices are running, on every backend. `Prefetch` is the thread
itself, for any iterator: the evaluation's host batches use it too.

Exact resume. The thread runs ahead of the loop, so the grain iterator's own position
is that of the rows *built*. The thread records the iterator's position after each
call's rows, and `CallBatches.get_state()` is the position after the calls the loop
*took*: what a checkpoint saves (grain's checkpoint handler reads `get_state()`), so a
resumed run sees exactly the rows an uninterrupted run would have seen next. Its
`set_state` drops whatever was built ahead and continues from the position given.

Errors and stopping. An exception in the thread (a DataError from the pipeline, a
failed placement) is raised in the loop's thread by the `next()` that would have
returned its item: the same exception object, message and type. `close()` stops the
thread and waits for the item it is building; the loop calls it on every exit (the
last step, a stop after SIGTERM or SIGINT, an error). The thread is a daemon: an
interpreter that exits some other way never waits for it.
"""

from __future__ import annotations

import copy
import dataclasses
import queue
import threading
from typing import Any, Callable, Generic, Iterator, TypeVar

import grain
import numpy as np
from absl import logging

T = TypeVar("T")

# How often a waiting thread looks at its stop flag (seconds): the longest a close()
# waits for a thread that is not building an item.
_POLL_SECONDS = 0.05
# How long close() waits for the item in progress before it leaves the (daemon) thread.
_CLOSE_SECONDS = 60.0


class Prefetch(Generic[T]):
  """Iterates `items` in a background thread, at most `depth` items ahead of `next()`.

  At most `depth` items are built and not yet taken (the one being built counts), so
  `depth` bounds what waits in memory, device memory included for placed batches.
  Only the thread touches `items` until `close()` returns.
  """

  def __init__(self, items: Iterator[T], depth: int, name: str = "prefetch"):
    if depth < 1:
      raise ValueError(f"Prefetch needs depth >= 1, got {depth}")
    self._items = items
    self._slots = threading.Semaphore(depth)  # One per item built and not yet taken.
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self._stop = threading.Event()
    self._finished = False  # next() has raised StopIteration or the thread's error.
    self._thread = threading.Thread(target=self._produce, name=name, daemon=True)
    self._thread.start()

  def _produce(self) -> None:
    """The thread: builds items while there are free slots, until the end or a stop."""
    try:
      while self._take_slot():
        try:
          item = next(self._items)
        except StopIteration:
          self._queue.put((False, StopIteration()))
          return
        self._queue.put((True, item))
    except BaseException as e:  # pylint: disable=broad-except
      self._queue.put((False, e))  # Raised by the consumer's next(), not lost here.

  def _take_slot(self) -> bool:
    """Waits for a free slot; False once a stop is asked for."""
    while not self._stop.is_set():
      if self._slots.acquire(timeout=_POLL_SECONDS):
        return not self._stop.is_set()
    return False

  def __iter__(self) -> "Prefetch[T]":
    return self

  def __next__(self) -> T:
    if self._finished:
      raise StopIteration
    ok, value = self._queue.get()  # A signal's handler still runs while this waits.
    self._slots.release()
    if ok:
      return value
    self._finished = True
    raise value  # The thread's own exception: its type, message and traceback.

  def close(self, timeout: float = _CLOSE_SECONDS) -> bool:
    """Stops the thread; returns whether it ended within `timeout` seconds.

    Items built and not taken are dropped, and `next()` raises StopIteration from now
    on. Idempotent.
    """
    self._finished = True
    self._stop.set()
    self._thread.join(timeout)
    if self._thread.is_alive():
      logging.warning("The %s thread is still building an item after %.0f s; leaving it "
                      "(a daemon thread: it does not keep the process alive)",
                      self._thread.name, timeout)
      return False
    return True

  @property
  def alive(self) -> bool:
    """Whether the thread is still running."""
    return self._thread.is_alive()


@dataclasses.dataclass(frozen=True)
class Call:
  """One compiled call's input, placed."""
  steps: int  # Optimizer steps the call runs.
  batch: dict[str, Any]  # [B, ...] arrays for one step, [steps, B, ...] for several.
  position: dict[str, Any]  # The row iterator's state after this call's rows.


def call_lengths(start_step: int, num_steps: int, steps_per_call: int) -> Iterator[int]:
  """The steps of each call from `start_step` on.

  A call ends at the next multiple of `steps_per_call` (every cadence is one: see
  config/train.py) or at `num_steps`, so a run resumed from another multiple, or with
  another steps_per_call, first runs a shorter call.
  """
  step = start_step
  while step < num_steps:
    steps = min(steps_per_call - step % steps_per_call, num_steps - step)
    yield steps
    step += steps


class CallBatches(grain.DatasetIterator):
  """The placed input of each call from `start_step` to `num_steps`, `depth` calls ahead.

  `next()` returns a `Call`. A grain DatasetIterator, so that a checkpoint saves it as
  it saves the row iterator: its state is the position after the calls taken. With
  `depth` 0 there is no thread: each `next()` builds its call then and there, the loop
  without prefetch.
  """

  def __init__(self, rows: grain.DatasetIterator,
               place: Callable[[dict[str, np.ndarray], bool], dict[str, Any]], *,
               start_step: int, num_steps: int, steps_per_call: int, depth: int):
    """Starts building from `rows`' current position.

    Args:
      rows: the training rows (one batch of this process's rows each); only this object
        touches it from now until `close()`.
      place: (host batch, stacked) -> the placed batch (Trainer.train_batch).
      start_step: the step the first call starts after (the restored state's step).
      num_steps: train.num_steps; no call goes past it.
      steps_per_call: train.steps_per_call.
      depth: data.prefetch: calls built ahead (0: none, no thread).
    """
    super().__init__()
    self._rows, self._place, self._depth = rows, place, depth
    self._num_steps, self._steps_per_call = num_steps, steps_per_call
    self._next_step = start_step  # Where the next call taken starts.
    self._position = copy.deepcopy(rows.get_state())
    self._start()

  def _calls(self, start_step: int) -> Iterator[Call]:
    """Builds and places the calls from `start_step` on (in the thread, with a depth)."""
    for steps in call_lengths(start_step, self._num_steps, self._steps_per_call):
      rows = [next(self._rows) for _ in range(steps)]
      if steps == 1:
        batch = self._place(rows[0], False)
      else:
        batch = self._place({k: np.stack([row[k] for row in rows]) for k in rows[0]}, True)
      yield Call(steps, batch, copy.deepcopy(self._rows.get_state()))

  def _start(self) -> None:
    calls = self._calls(self._next_step)
    self._source = Prefetch(calls, self._depth, "prefetch-train") if self._depth else calls

  def __next__(self) -> Call:
    call = next(self._source)
    self._position = call.position
    self._next_step += call.steps
    return call

  def untake(self, call: Call, position: dict[str, Any]) -> None:
    """The call taken last will not run (the loop stops): the position goes back to
    `position` (get_state() before it was taken), so a checkpoint saves its rows as
    not trained on."""
    self._position = copy.deepcopy(position)
    self._next_step -= call.steps

  def get_state(self) -> dict[str, Any]:
    """The row iterator's position after the calls taken (not those built ahead)."""
    return copy.deepcopy(self._position)

  def set_state(self, state: dict[str, Any]) -> None:
    """Drops the calls built ahead; the next call's rows start at `state`."""
    self._stop_thread()
    self._rows.set_state(state)
    self._position = copy.deepcopy(state)
    self._start()

  def close(self) -> None:
    """Stops the thread (if any) and ends this iterator; the calls built ahead are dropped.

    The rows iterator stays open (it is the caller's). grain calls this on garbage
    collection too.
    """
    source = getattr(self, "_source", None)  # None if __init__ failed before it.
    if source is not None:
      source.close()  # A Prefetch, or the generator itself without a thread.

  def _stop_thread(self) -> None:
    """close(), then wait as long as it takes: the rows are about to be touched here."""
    self.close()
    while isinstance(self._source, Prefetch) and self._source.alive:
      self._source.close()

  def __enter__(self) -> "CallBatches":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
