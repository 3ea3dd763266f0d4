"""data.prefetch: calls built ahead in a thread, the position of the calls taken, errors and
stopping (transformer/training/prefetch.py). The loop's exact resume with it is in
test_train.py (test_resume_is_exact)."""

import os
import subprocess
import sys
import threading
import time

import grain
import numpy as np
import pytest

from transformer.config.errors import DataError
from transformer.training import loop
from transformer.training import prefetch
from transformer.training import trainer as trainer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(count=1000):
  """A grain iterator of one-row batches {"x": [[i]]}, whose state is its next index."""
  return iter(grain.MapDataset.range(count).map(lambda i: {"x": np.array([[i]])})
              .to_iter_dataset())


class _Placements:
  """A `place` that records what it placed (from whichever thread) and returns it as is."""

  def __init__(self):
    self.placed, self.threads = [], set()

  def __call__(self, batch, stacked):
    self.placed.append((batch["x"].ravel().tolist(), stacked))
    self.threads.add(threading.current_thread().name)
    return batch

  def wait_for(self, count, timeout=60):
    deadline = time.time() + timeout
    while len(self.placed) < count:
      assert time.time() < deadline, f"only {len(self.placed)} of {count} calls were built"
      time.sleep(0.01)


def _threads(name="prefetch-train"):
  return [t for t in threading.enumerate() if t.name == name]


def test_calls_follow_the_loop_and_the_state_is_of_the_calls_taken():
  """From step 4 with 3 steps a call up to 10: calls of 2, 3 and 1 steps (the next
  multiple first), built two ahead by the thread; get_state() is where the taken ones end."""
  assert list(prefetch.call_lengths(4, 10, 3)) == [2, 3, 1]
  rows, place = _rows(), _Placements()
  batches = prefetch.CallBatches(rows, place, start_step=4, num_steps=10, steps_per_call=3,
                                 depth=2)
  try:
    first = next(batches)
    assert (first.steps, first.batch["x"].ravel().tolist()) == (2, [0, 1])
    assert first.batch["x"].shape == (2, 1, 1)  # [steps, B, ...]: stacked for train_steps.
    place.wait_for(3)  # The thread built the two calls after it, without being asked.
    assert place.placed == [([0, 1], True), ([2, 3, 4], True), ([5], False)]
    assert place.threads == {"prefetch-train"}
    assert rows.get_state() == {"next_index": 6}  # The rows of every call built ...
    assert batches.get_state() == {"next_index": 2}  # ... the position saved: those taken.

    # set_state drops the calls built ahead; the steps continue from the calls taken.
    batches.set_state({"next_index": 1})
    second = next(batches)
    assert (second.steps, second.batch["x"].ravel().tolist()) == (3, [1, 2, 3])
    assert batches.get_state() == second.position == {"next_index": 4}
    third = next(batches)
    assert (third.steps, third.batch["x"].ravel().tolist()) == (1, [4])
    with pytest.raises(StopIteration):  # num_steps reached.
      next(batches)
  finally:
    batches.close()
  assert not _threads()


def test_without_prefetch_the_same_calls_are_built_when_taken():
  """data.prefetch=0: no thread; each next() builds its call, so nothing is ahead."""
  built = {}
  for depth in (0, 2):
    rows, place = _rows(), _Placements()
    batches = prefetch.CallBatches(rows, place, start_step=0, num_steps=7, steps_per_call=3,
                                   depth=depth)
    with batches:
      built[depth] = [(c.steps, c.batch["x"].ravel().tolist(), c.position) for c in batches]
      if depth == 0:
        assert place.threads == {threading.current_thread().name}
        assert rows.get_state() == batches.get_state() == {"next_index": 7}
  assert built[0] == built[2] == [(3, [0, 1, 2], {"next_index": 3}),
                                  (3, [3, 4, 5], {"next_index": 6}),
                                  (1, [6], {"next_index": 7})]


class _BrokenRows(grain.DatasetIterator):
  """Rows 0, 1, ... until `broken`, whose read raises a DataError."""

  def __init__(self, broken):
    super().__init__()
    self.next_index, self.broken = 0, broken

  def __next__(self):
    if self.next_index == self.broken:
      raise DataError(f"row {self.broken} is broken (the pipeline's message)")
    self.next_index += 1
    return {"x": np.array([[self.next_index - 1]])}

  def get_state(self):
    return {"next_index": self.next_index}

  def set_state(self, state):
    self.next_index = state["next_index"]


def test_an_error_in_the_thread_is_raised_by_next_with_its_message():
  """The thread's exception reaches the loop's thread at the call it broke, itself."""
  batches = prefetch.CallBatches(_BrokenRows(3), _Placements(), start_step=0, num_steps=10,
                                 steps_per_call=2, depth=2)
  try:
    assert next(batches).batch["x"].ravel().tolist() == [0, 1]  # Built before row 3.
    with pytest.raises(DataError, match=r"^row 3 is broken \(the pipeline's message\)$"):
      next(batches)
    deadline = time.time() + 30
    while _threads() and time.time() < deadline:
      time.sleep(0.01)
    assert not _threads()  # The thread ended with its error.
    with pytest.raises(StopIteration):
      next(batches)
  finally:
    batches.close()


def test_close_stops_a_thread_waiting_to_build_more():
  """A thread two calls ahead of a loop that stops (its last step, SIGTERM, an error)."""
  place = _Placements()
  batches = prefetch.CallBatches(_rows(), place, start_step=0, num_steps=10**9,
                                 steps_per_call=1, depth=2)
  next(batches)
  place.wait_for(3)
  assert _threads()
  started = time.time()
  batches.close()
  assert not _threads() and time.time() - started < 10
  with pytest.raises(StopIteration):
    next(batches)
  batches.close()  # Idempotent.


def test_a_process_that_never_closes_it_exits_at_once():
  """The thread is a daemon: an interpreter that exits with it running does not hang."""
  code = ("import grain, numpy as np, sys\n"
          "from transformer.training import prefetch\n"
          "rows = iter(grain.MapDataset.range(10).repeat(None).map(lambda i: {'x': np.array([i])})"
          ".to_iter_dataset())\n"
          "batches = prefetch.CallBatches(rows, lambda b, s: b, start_step=0, num_steps=10**9, "
          "steps_per_call=1, depth=2)\n"
          "next(batches)\n"
          "print('left running', flush=True)\n"
          "sys.exit(0)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "left running" in result.stdout


def test_an_error_placing_a_batch_in_the_thread_stops_the_run_with_it(tiny_config, tmp_path,
                                                                      monkeypatch):
  """In the loop: the placement of step 3's batch fails in the thread; train_and_evaluate
  raises that error (not a hang, not another one), and no thread is left running."""
  global_batch = trainer_lib.Scorer.global_batch
  placed = []

  def failing_global_batch(self, local_batch, stacked=False, rows=None):
    if threading.current_thread().name == "prefetch-train":
      placed.append(stacked)
      if len(placed) == 3:
        raise ValueError("placing the batch of step 3 failed (the original message)")
    return global_batch(self, local_batch, stacked, rows)

  monkeypatch.setattr(trainer_lib.Scorer, "global_batch", failing_global_batch)
  tiny_config.train.eval_at_start = False
  with pytest.raises(ValueError, match=r"^placing the batch of step 3 failed \(the original "
                                       r"message\)$"):
    loop.train_and_evaluate(tiny_config, str(tmp_path / "run"))
  assert not _threads() and not _threads("prefetch-eval")
