"""One training run of the tiny config in a process of its own, for test_crash_safety.py.

A process of its own so that TRANSFORMER_TEST_KILL_AT can SIGKILL it: 8 steps, a
checkpoint every 3, an evaluation every 4, a metrics row every step. --sync_save
writes checkpoints in the foreground: a tiny model's steps are so fast that an async
save started at step 3 is often still in flight at step 5.
"""

import argparse
import os
import sys

from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.training import loop  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_STEPS = 8
CHECKPOINT_EVERY = 3
EVAL_EVERY = 4


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--sync_save", action="store_true")
  args = parser.parse_args()
  logging.set_verbosity(logging.INFO)  # As under absl.app: the progress lines show.
  config = make_tiny_config(args.data_dir)
  config.train.update(num_steps=NUM_STEPS, eval_every=EVAL_EVERY, log_every=1)
  config.checkpoint.update(every=CHECKPOINT_EVERY, async_save=not args.sync_save)
  loop.train_and_evaluate(config, args.workdir)


if __name__ == "__main__":
  main()
