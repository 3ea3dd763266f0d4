"""--mode=train (the default): train_and_evaluate(--config, --workdir); rerunning resumes.

After the loop (finished, or stopped by a signal and saved) process 0 draws the curves
of metrics.jsonl into `<workdir>/plots/`: reporting is called from here, above the
loop, so training never imports the reports.
"""

from __future__ import annotations

import jax
import ml_collections

from transformer.reports import plots
from transformer.training import loop

STARTS_JAX = True


def main(config: ml_collections.ConfigDict, workdir: str) -> None:
  """launch.py --mode=train."""
  loop.train_and_evaluate(config, workdir)
  if jax.process_index() == 0:
    plots.write_plots_after_training(workdir)
