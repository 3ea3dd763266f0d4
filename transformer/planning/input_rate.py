"""What this host's input pipeline delivers, beside what the step would consume.

`--mode=compile` estimates the train step's tokens/s on the target (estimate.py); a run
is input-bound when each host's pipeline cannot build its share of those tokens as fast.
`measure` builds the training pipeline a run of the same config would (the dataset and
tokenizer as `sources.load_sources` prepares them, rows and batches as
`pipeline.make_dataset` makes them for one process of `hosts`), takes batches for a few
seconds and counts their tokens as the step does (rows x seq_len x the objective's
sides, padding included). It is a measurement on this machine, under its current load:
the host of the rented run may be faster or slower.

It builds nothing the run has not built: a dataset not yet prepared or a vocabulary
not yet trained (a 128,256-piece SentencePiece for llama:1b, minutes for :7b's 32k)
skips the measurement with one line saying what is missing and how to measure. Any
failure of the pipeline is one line of the report, never the end of it.
"""

from __future__ import annotations

import dataclasses
import time

import ml_collections

from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError, DataError
from transformer.data import pipeline
from transformer.data import sources
from transformer.data.tokenizers import run_vocabulary


@dataclasses.dataclass(frozen=True)
class InputRate:
  """One host's pipeline measured, or why it was not."""

  hosts: int  # Hosts of the target: each builds batch_size / hosts rows a step.
  local_batch_size: int
  tokens_per_second: float | None = None  # None: not measured (see `error`).
  batches: int = 0  # Taken after the first, over `seconds`.
  seconds: float = 0.0
  first_batch_seconds: float = 0.0  # Building the pipeline and its first batch.
  error: str | None = None  # Why it failed (the data is not there, the pipeline raised).
  skipped: str | None = None  # Why it was not tried: it would build what the run has not.

  def demand_ratio(self, demand_tokens_per_second: float) -> float | None:
    """What one host must deliver per second over what it delivered; > 1: input-bound."""
    if not self.tokens_per_second or demand_tokens_per_second <= 0:
      return None
    return demand_tokens_per_second / self.hosts / self.tokens_per_second


def hosts_of(devices) -> int:
  """The hosts (JAX processes) the target's devices belong to."""
  return len({device.process_index for device in devices})


def measure(config: ml_collections.ConfigDict, hosts: int, seconds: float) -> InputRate:
  """Times this host's training pipeline for `seconds` after its first batch.

  Args:
    config: the experiment config (its data.* as a training run reads them).
    hosts: the target's hosts; this host builds one process's share of each batch.
    seconds: how long to take batches after the first (the first is timed apart: it
      includes opening the dataset and, for nanoGPT-style windows, tokenizing it).

  Returns:
    The rate; `skipped` set (and no rate) when reading would build the dataset or the
    vocabulary first (sources.unbuilt); `error` set when the data is not there to be
    read (a catalog dataset not downloaded: the message says how to prepare it) or the
    pipeline failed.
  """
  local = max(1, config.data.batch_size // hosts)
  started = time.perf_counter()
  # A fine-tuning run reads its source run's vocabulary, as training does.
  vocabulary = run_vocabulary.run_workdir(config.init_from) if config.init_from else ""
  try:
    missing = sources.unbuilt(config, vocabulary)
    if missing:
      return InputRate(hosts, local, skipped=(
          f"{missing}, and timing the pipeline would build it here; a training run (or "
          "--mode=prepare for a corpus) builds it, then --mode=compile times it "
          "(--input_seconds=0 skips this)"))
    data_sources = sources.load_sources(config, vocabulary)
    config = ml_collections.ConfigDict(config.to_dict())  # vocab_size resolved on a copy.
    config.model.vocab_size = run_vocabulary.resolved_vocab_size(config, data_sources.tokenizer)
    objective = objective_lib.resolve(config.model)
    split = config.data.train_split
    batches = iter(pipeline.make_dataset(
        config, objective, data_sources.split(split),
        data_sources.tokenizer, train=True, split=split, batch_size=local, process_index=0,
        process_count=hosts))
    next(batches)
    first = time.perf_counter() - started
    count, start = 0, time.perf_counter()
    while count == 0 or time.perf_counter() - start < seconds:
      next(batches)
      count += 1
    elapsed = time.perf_counter() - start
  except (ConfigError, DataError) as e:
    return InputRate(hosts, local, error=f"{type(e).__name__}: {e}")
  except Exception as e:  # pylint: disable=broad-except  (one line of the report, not its end)
    return InputRate(hosts, local, error=f"the pipeline failed: {type(e).__name__}: "
                     f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}")
  tokens = count * local * config.data.seq_len * objective.sides
  return InputRate(hosts, local, tokens_per_second=tokens / elapsed, batches=count,
                   seconds=elapsed, first_batch_seconds=first)


def lines(rate: InputRate, demand_tokens_per_second: float | None) -> list[str]:
  """The report's input lines: the demand beside the measured rate, and a verdict."""
  if rate.skipped is not None:
    return [f"Input: not measured: {rate.skipped}"]
  if rate.error is not None:
    return [f"Input: not measured: {rate.error}"]
  per_host = ("" if rate.hosts == 1 else
              f" (its share on each of {rate.hosts} hosts: {rate.local_batch_size} rows a step)")
  out = [f"Input: this host's pipeline delivered ~{rate.tokens_per_second:,.0f} tokens/s"
         f"{per_host} over {rate.seconds:.1f} s ({rate.batches} batches; the first after "
         f"{rate.first_batch_seconds:.1f} s), measured on this machine under its current load"]
  ratio = (rate.demand_ratio(demand_tokens_per_second)
           if demand_tokens_per_second is not None else None)
  if ratio is None:
    out.append("  (no train-step estimate to set it beside)")
    return out
  demand = demand_tokens_per_second / rate.hosts
  if ratio > 1:
    out.append(f"  INPUT-BOUND: the step at its estimate needs ~{demand:,.0f} tokens/s per "
               f"host, {ratio:.1f}x what the pipeline delivered; more data.num_threads, a "
               "prepared corpus (docs/corpus.md) or a faster tokenizer, or a faster host, "
               "before renting")
  else:
    out.append(f"  keeps up: the step at its estimate needs ~{demand:,.0f} tokens/s per host, "
               f"{100 * ratio:.0f}% of what the pipeline delivered (the estimate is a lower "
               "bound on step time, so the real need is at most this)")
  return out


def to_json(rate: InputRate, demand_tokens_per_second: float | None) -> dict:
  """The --output report's "input" entry."""
  ratio = (rate.demand_ratio(demand_tokens_per_second)
           if demand_tokens_per_second is not None else None)
  return dict(hosts=rate.hosts, local_batch_size=rate.local_batch_size,
              tokens_per_second=rate.tokens_per_second, batches=rate.batches,
              seconds=rate.seconds, first_batch_seconds=rate.first_batch_seconds,
              demand_tokens_per_second_per_host=(
                  None if demand_tokens_per_second is None
                  else demand_tokens_per_second / rate.hosts),
              demand_ratio=ratio, input_bound=None if ratio is None else ratio > 1,
              error=rate.error, skipped=rate.skipped)
