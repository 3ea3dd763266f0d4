"""Input pipeline speed per objective, beside what the tiny shape's train step consumes.

For each objective the project's grain pipeline (`pipeline.make_dataset`, training mode:
shuffle, tokenize, pack or pad, batch) runs alone at the tiny shape's batch (12 x 64
tokens, both sides for seq2seq), with the byte tokenizer on the offline python_stdlib
corpus (built once, before anything is timed); classification reads a TSV written from
that corpus's short lines with made-up labels. Reported: the setup (sources and
pipeline objects), the time to the first batch from creating the iterator, tokens/s
(the batch's token slots, padding included, as the train step counts them) and how
many times the tiny train step's consumption that is. Rounds alternate ~--seconds of
batches with ~--seconds of tiny steps, so that on a shared machine both see the same
load; the ratio is the median of the rounds' ratios.

  python benchmarks/input_pipeline.py
  python benchmarks/input_pipeline.py --rounds 9 --num_threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable

import jax
import ml_collections
import tensorflow_datasets as tfds

import shapes  # benchmarks/shapes.py; pylint: disable=g-bad-import-order
from configs import base
from transformer.config import objective as objective_lib
from transformer.data import pipeline
from transformer.data import sources

# (objective, model.arch, model.head): the model side decides the objective.
TINY_TOKENS = 12 * 64  # The tiny shape's batch x context.
OBJECTIVES = (("causal_lm", "decoder", "lm"), ("masked_lm", "encoder", "mlm"),
              ("seq2seq", "encoder_decoder", "lm"), ("classification", "encoder",
                                                     "classification"))


def objective_config(arch: str, head: str, data_dir: str, tsv_dir: str,
                     num_threads: int) -> ml_collections.ConfigDict:
  """The tiny shape's batch on the offline corpus (or the TSV for classification)."""
  config = base.get_config()
  config.model.update(arch=arch, head=head, vocab_size=384, max_len=64)
  config.data.update(tokenizer="bytes", seq_len=64, batch_size=12, data_dir=data_dir,
                     num_threads=num_threads)
  if head == "classification":
    config.model.pooling = "cls"
    config.data.update(name="local_tsv", path=tsv_dir, text_key="sentence",
                       label_key="label")
  return config


def write_tsv(corpus_config: ml_collections.ConfigDict, folder: str) -> None:
  """train.tsv / dev.tsv of the corpus's non-empty lines, labelled by length parity."""
  builder = sources.load_sources(corpus_config).builder
  source = builder.as_data_source(split="train")
  lines = []
  for i in range(min(len(source), 300)):
    text = source[i]["text"]
    text = text.decode() if isinstance(text, bytes) else text
    lines += [line.strip() for line in text.splitlines()
              if 0 < len(line.strip()) <= 60 and "\t" not in line]  # No truncation.
  os.makedirs(folder, exist_ok=True)
  for name, part in (("train.tsv", lines[:-500]), ("dev.tsv", lines[-500:])):
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
      f.write("sentence\tlabel\n")
      f.writelines(f"{line}\t{len(line) % 2}\n" for line in part)


def measure_pipeline(config: ml_collections.ConfigDict, rounds: int, seconds: float,
                     tiny_step: Callable[[], float]) -> dict:
  """Setup, first batch, tokens/s, and per round the ratio to the tiny step's consumption.

  Rounds alternate ~`seconds` of batches with `tiny_step()` (seconds per step, timed
  then), so that both see the same load on a shared machine.
  """
  objective = objective_lib.resolve(config.model)
  start = time.perf_counter()
  data_sources = sources.load_sources(config)  # Prepared already (built before timing).
  dataset = pipeline.make_dataset(
      config, objective, data_sources.builder.as_data_source(split="train"),
      data_sources.tokenizer, train=True, split="train", batch_size=config.data.batch_size)
  setup = time.perf_counter() - start
  start = time.perf_counter()
  iterator = iter(dataset)
  next(iterator)
  first = time.perf_counter() - start
  tokens = objective.sides * config.data.batch_size * config.data.seq_len
  rates, ratios = [], []
  for _ in range(rounds):
    batches, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
      next(iterator)
      batches += 1
    rates.append(batches * tokens / (time.perf_counter() - start))
    ratios.append(rates[-1] / (TINY_TOKENS / tiny_step()))
  return dict(objective=objective.name, setup=setup, first=first, tokens_per_second=max(rates),
              ratio=statistics.median(ratios))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=5, help="per objective")
  parser.add_argument("--seconds", type=float, default=1.0, help="of batches per round")
  parser.add_argument("--num_threads", type=int, default=2, help="data.num_threads")
  parser.add_argument("--data_dir", default="", help="TFDS data dir (default "
                      "~/tensorflow_datasets, where the offline corpus is built once)")
  args = parser.parse_args()
  print(shapes.platform_line())
  tfds.display_progress_bar(False)  # The builds' bars are not the benchmark's output.
  tsv_dir = os.path.join(tempfile.mkdtemp(prefix="input_pipeline_"), "tsv")
  configs = {objective: objective_config(arch, head, args.data_dir, tsv_dir,
                                         args.num_threads)
             for objective, arch, head in OBJECTIVES}
  write_tsv(configs["causal_lm"], tsv_dir)
  for config in configs.values():
    sources.load_sources(config)  # Build each dataset once, before anything is timed.

  tiny = shapes.tiny()
  trainer = shapes.make_trainer(tiny)
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    batch = trainer.train_batch(shapes.random_batch(tiny))
    step_times = []

    def tiny_step() -> float:
      nonlocal state
      seconds, state = shapes.run_steps(trainer.train_step, state, batch, steps)
      step_times.append(seconds)
      return seconds

    steps = 2
    tiny_step()  # Compile.
    steps = max(1, round(args.seconds / tiny_step()))
    print(f"batch 12 x 64 tokens, bytes tokenizer, data.num_threads={args.num_threads}; "
          f"{args.rounds} rounds per objective of ~{args.seconds:.0f} s of batches, then "
          f"{steps} tiny steps\n")
    rows = [measure_pipeline(configs[objective], args.rounds, args.seconds, tiny_step)
            for objective, _, _ in OBJECTIVES]
  print("| objective | setup (sources + pipeline) | time to first batch | tokens/s (best round) "
        "| x the tiny step's consumption (median of rounds) |\n|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['objective']} | {r['setup']:.2f} s | {r['first']:.3f} s | "
          f"{r['tokens_per_second']:,.0f} | {r['ratio']:.0f}x |")
  best = min(step_times[2:])
  print(f"\ntiny train step ({shapes.describe(tiny)}): best {1e3 * best:.1f} ms, median "
        f"{1e3 * statistics.median(step_times[2:]):.1f} ms; {TINY_TOKENS / best:,.0f} tokens/s "
        "at the best")


if __name__ == "__main__":
  main()
