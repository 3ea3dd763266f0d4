"""Compile's answer in hours and money: `--tokens=N [--price_per_chip_hour=P]`.

The time to train N tokens is the steps that N takes (the train step's tokens, all chips
together) times the train step's estimate, with its range and its floor the same way;
with a price, the cost is chips x hours x price. On a GPU the range is the estimate's
(calibration.py); on a TPU the estimate is a floor and there is no upper end.
"""

from __future__ import annotations

import dataclasses
import math

from transformer.config.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TrainTime:
  """N tokens on the compiled train step: steps, seconds (point, range, floor), cost."""

  tokens: int
  steps: int
  chips: int
  seconds: float  # At the step's estimate.
  seconds_range: tuple[float, float | None]  # [low, high]; high None: no upper end.
  floor_seconds: float
  price_per_chip_hour: float | None = None

  def cost(self, seconds: float | None) -> float | None:
    """chips x hours x price, or None without a price (or an end)."""
    if self.price_per_chip_hour is None or seconds is None:
      return None
    return self.chips * seconds / 3600 * self.price_per_chip_hour

  def as_json(self) -> dict:
    low, high = self.seconds_range
    return dict(train_tokens=self.tokens, train_steps=self.steps,
                time_to_train_seconds=[low, high], time_to_train_point_seconds=self.seconds,
                time_to_train_floor_seconds=self.floor_seconds,
                price_per_chip_hour=self.price_per_chip_hour,
                cost=([self.cost(low), self.cost(high)]
                      if self.price_per_chip_hour is not None else None),
                cost_point=self.cost(self.seconds), cost_floor=self.cost(self.floor_seconds))


def check(tokens: float | None, price: float | None) -> None:
  """ConfigError naming the flag and what is valid: --tokens a positive count, a price
  only with --tokens and not negative."""
  if tokens is not None and not (tokens >= 1 and math.isfinite(tokens)):
    raise ConfigError(f"--tokens={tokens:g}: the tokens to train, a count >= 1 (e.g. "
                      "--tokens=2e10)")
  if price is not None:
    if tokens is None:
      raise ConfigError(f"--price_per_chip_hour={price:g} needs --tokens=N (the tokens to "
                        "train), which the cost is of")
    if not (price >= 0 and math.isfinite(price)):
      raise ConfigError(f"--price_per_chip_hour={price:g}: a price per chip-hour >= 0 "
                        "(e.g. 2.5)")


def time_to_train(plan, tokens: float, price: float | None) -> TrainTime:
  """TrainTime of `tokens` on the plan's train step; ConfigError when there is none."""
  cost, est = plan.costs.get("train"), plan.estimates.get("train")
  if cost is None or est is None:
    reason = ("the train step was not compiled (--compile_steps)" if cost is None
              else f"XLA refused the train step ({cost.compile_error})")
    raise ConfigError(f"--tokens needs the train step's estimate: {reason}")
  steps = math.ceil(tokens / cost.tokens)
  low, high = est.seconds_range if est.seconds_range else (est.lower_bound_seconds, None)
  return TrainTime(tokens=int(tokens), steps=steps, chips=plan.topology.chips,
                   seconds=steps * est.seconds,
                   seconds_range=(steps * low, steps * high if high is not None else None),
                   floor_seconds=steps * est.lower_bound_seconds,
                   price_per_chip_hour=price)


def _hours(seconds: float | None) -> str:
  if seconds is None:
    return "no upper end"
  hours = seconds / 3600
  return f"{hours:,.1f} h" if hours >= 1 else f"{seconds / 60:,.1f} min"


def lines(result: TrainTime, per_step_tokens: int) -> list[str]:
  """The report's paragraph (an ESTIMATE: the step time is one)."""
  low, high = result.seconds_range
  out = ["", f"Time to train {result.tokens:,} tokens (an ESTIMATE: {result.steps:,} steps "
         f"of {per_step_tokens:,} tokens on {result.chips} chips, at the train step's "
         "estimate):",
         f"  ~{_hours(result.seconds)} (range {_hours(low)} to {_hours(high)}; floor "
         f"{_hours(result.floor_seconds)}: no run is faster)"]
  if result.price_per_chip_hour is not None:
    money = lambda s: "no upper end" if s is None else f"{result.cost(s):,.2f}"
    out.append(f"  cost at {result.price_per_chip_hour:g} a chip-hour ({result.chips} chips "
               f"x hours x price): ~{money(result.seconds)} (range {money(low)} to "
               f"{money(high)}; floor {money(result.floor_seconds)})")
  return out
