"""What runs beside the training loop, called at known points of each call.

The loop calls every hook at each point, in list order:

  after_eval(step, state, metrics)  an evaluation of `state` ran; its row is not written
                                    yet, and a hook may add metrics to it (decode_hook.py
                                    adds eval_bleu)
  after_save(step, checkpointer)    a checkpoint's save returned (an async write may still
                                    be in flight: `checkpointer.wait()` ends it)
  after_call(step, state)           a call's iteration is over and the run goes on (not
                                    after the last step, nor after a stop)

`step` is the last step the call ran. The loop's hooks are its own (decoding at an
evaluation), those a caller passes to train_and_evaluate, and those `registered()`
returns: a module registers a factory with `register`, as fault_injection.py does
for the tests' crash points, so the loop never names them.
"""

from __future__ import annotations

from typing import Any, Callable


class Hook:
  """A hook's points; each does nothing unless overridden."""

  def after_eval(self, step: int, state: Any, metrics: dict[str, float]) -> None:
    """After the evaluation at `step`, before its row is written; may add to `metrics`."""

  def after_save(self, step: int, checkpointer: Any) -> None:
    """After checkpointer.save(step, ...) returned."""

  def after_call(self, step: int, state: Any) -> None:
    """After a call's iteration (its evaluation and save included) when the run goes on."""


_FACTORIES: list[Callable[[], Hook | None]] = []


def register(factory: Callable[[], Hook | None]) -> Callable[[], Hook | None]:
  """Adds a factory whose hook (None: none) joins every run that starts afterwards."""
  _FACTORIES.append(factory)
  return factory


def registered() -> list[Hook]:
  """The hooks of the registered factories, made for one run."""
  return [hook for hook in (factory() for factory in _FACTORIES) if hook is not None]
