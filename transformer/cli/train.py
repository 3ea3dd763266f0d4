"""--mode=train (the default): train_and_evaluate(--config, --workdir); rerunning resumes.

After the loop (finished, or stopped by a signal and saved) process 0 draws the curves
of metrics.jsonl into `<workdir>/plots/`: reporting is called from here, above the
loop, so training never imports the reports.
"""

from __future__ import annotations

import jax
import ml_collections

from transformer import sharding
from transformer.configuration import validate
from transformer.reports import plots
from transformer.training import loop
from transformer.training.trainer import check_batch_size

STARTS_JAX = True


def check_config(config: ml_collections.ConfigDict) -> None:
  """What can be checked before the workdir is touched: keys, values, the mesh, the batch.

  launch.py calls it first, so a config that fails creates nothing (not even log.txt).
  """
  validate(config)
  check_batch_size(config, sharding.make_mesh(config.mesh))


def main(config: ml_collections.ConfigDict, workdir: str) -> None:
  """launch.py --mode=train."""
  loop.train_and_evaluate(config, workdir)
  if jax.process_index() == 0:
    plots.write_plots_after_training(workdir)
