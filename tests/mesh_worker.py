"""One training run of the tiny config on a given mesh, for test_crash_safety.py's mesh test.

A process of its own because the number of simulated CPU devices is fixed when JAX
starts (the caller sets XLA_FLAGS=--xla_force_host_platform_device_count=N). Writes
to --out what the run restored: the step, every array of the state as numpy, and the
mesh each array was placed on, so the test can compare it with the checkpoint.
"""

import argparse
import ast
import json
import os
import sys

import numpy as np
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.workdir import checkpointing  # pylint: disable=g-import-not-at-top,wrong-import-position
from transformer.training import loop  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--mesh", required=True, help='e.g. (("data",2),("fsdp",4),("tensor",1))')
  parser.add_argument("--num_steps", type=int, required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  logging.set_verbosity(logging.INFO)  # As under absl.app: the progress lines show.

  config = make_tiny_config(args.data_dir)
  config.mesh.shape = ast.literal_eval(args.mesh)
  config.train.update(num_steps=args.num_steps, eval_every=2)
  config.checkpoint.update(every=2, async_save=False)

  restore_latest = checkpointing.Checkpointer.restore_latest

  def recording_restore_latest(self, abstract_state, data_iterator):
    restored = restore_latest(self, abstract_state, data_iterator)
    if restored is not None:
      step, state = restored
      leaves = jax.tree_util.tree_leaves_with_path(state)
      names = [jax.tree_util.keystr(path) for path, _ in leaves]
      np.savez(args.out + ".npz", **{f"a{i}": np.asarray(x) for i, (_, x) in enumerate(leaves)})
      with open(args.out + ".json", "w", encoding="utf-8") as f:
        json.dump({"step": step, "names": names,
                   "meshes": [dict(x.sharding.mesh.shape) for _, x in leaves],
                   "devices": [len(x.sharding.device_set) for _, x in leaves]}, f)
    return restored

  checkpointing.Checkpointer.restore_latest = recording_restore_latest
  loop.train_and_evaluate(config, args.workdir)


if __name__ == "__main__":
  main()
