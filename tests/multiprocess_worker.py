"""One JAX process of the real multi-process CPU run in test_multiprocess.py.

Starts jax.distributed on localhost (gloo collectives) through the same
`transformer.distributed.initialize` that launch.py calls, trains the tiny config
and writes what it saw (per-step losses and eval metrics, digests of the rows it
read) to --out. TRANSFORMER_TEST_KILL_AT (see transformer/training/fault_injection.py) in its
environment kills it at a named point.
"""

import argparse
import hashlib
import json
import os
import sys
import threading

from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer import distributed  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.workdir import metrics_file  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.training import loop  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.training import trainer as trainer_lib  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  parser = argparse.ArgumentParser()
  for name in ("process_id", "port", "num_steps", "fail_at_batch"):
    parser.add_argument(f"--{name}", type=int, default=-1)
  for name in ("workdir", "data_dir", "out"):
    parser.add_argument(f"--{name}", required=True)
  parser.add_argument("--heartbeat_timeout_seconds", type=int, default=10)
  parser.add_argument("--eval_batches", type=int, default=0, help="0: the tiny config's")
  parser.add_argument("--text_path", default="", help="train on local_text files here")
  parser.add_argument("--steps_per_call", type=int, default=1,
                      help="train.steps_per_call (a row every such many steps)")
  parser.add_argument("--mesh", default="", help="mesh.shape as JSON [[name, size], ...]")
  parser.add_argument("--num_processes", type=int, default=2,
                      help="1: this process alone, no jax.distributed (the reference)")
  args = parser.parse_args()
  logging.set_verbosity(logging.INFO)  # As under absl.app: the progress lines show.

  if args.num_processes > 1:
    distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                           num_processes=args.num_processes, process_id=args.process_id,
                           heartbeat_timeout_seconds=args.heartbeat_timeout_seconds)
  # "threads": the thread that built each batch of "rows" (data.prefetch builds training
  # batches on its own thread while evaluation's come from the main one, so the two
  # streams interleave in no fixed order; each stream's own order is fixed).
  seen = {"metrics": [], "rows": [], "threads": []}
  global_batch, write = trainer_lib.Trainer.global_batch, metrics_file.MetricWriter.write

  def recording_global_batch(self, local, stacked=False, rows=None):
    layout = rows  # The row layout to check against (`rows` below are the batch's rows).
    if len(seen["rows"]) == args.fail_at_batch:
      raise RuntimeError(f"injected failure in process {args.process_id}")
    rows = local["inputs"].reshape(-1, local["inputs"].shape[-1])  # Stacked or not.
    seen["rows"].append([hashlib.sha1(row.tobytes()).hexdigest() for row in rows])
    seen["threads"].append("main" if threading.current_thread() is threading.main_thread()
                           else "background")
    return global_batch(self, local, stacked=stacked, rows=layout)

  def recording_write(self, step, values):
    seen["metrics"].append({"step": int(step), **values})
    return write(self, step, values)

  trainer_lib.Trainer.global_batch = recording_global_batch
  metrics_file.MetricWriter.write = recording_write

  config = make_tiny_config(args.data_dir)
  config.train.num_steps = args.num_steps
  config.checkpoint.every = 2
  config.train.eval_every = 2
  if args.eval_batches:
    config.train.eval_batches = args.eval_batches
  if args.text_path:
    config.data.update(name="local_text", path=args.text_path)
  if args.mesh:
    config.mesh.shape = tuple(tuple(axis) for axis in json.loads(args.mesh))
  if args.steps_per_call > 1:  # Stacked batches: [k, rows, length] from each process.
    config.train.update(steps_per_call=args.steps_per_call, log_every=args.steps_per_call)
  with distributed.fail_together():  # As launch.py does.
    loop.train_and_evaluate(config, args.workdir)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(seen, f)


if __name__ == "__main__":
  main()
