"""--mode=plot: PNG curves of --workdir's metrics.jsonl -> <workdir>/plots/ (no JAX devices)."""

from __future__ import annotations

import ml_collections

from transformer.cli import common
from transformer.reports import plots

STARTS_JAX = False
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("log_steps",)


def main(config: ml_collections.ConfigDict | None, workdir: str) -> int:
  """launch.py --mode=plot (--config is not used); prints the paths written."""
  del config
  print("\n".join(plots.write_plots(workdir, log_steps=common.LOG_STEPS.value)))
  return 0
