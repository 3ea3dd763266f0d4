"""--mode=compare: a Markdown table and overlaid curves of --compare_dirs (or the runs in
--workdir) -> <workdir>/compare.md and compare_*.png (no JAX devices)."""

from __future__ import annotations

import ml_collections
from absl import flags

from transformer.cli import common
from transformer.reports import compare

COMPARE_DIRS = flags.DEFINE_list(
    "compare_dirs", [], "compare: the workdirs to compare (default: the runs in --workdir).")
STARTS_JAX = False
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("log_steps",)


def main(config: ml_collections.ConfigDict | None, workdir: str) -> int:
  """launch.py --mode=compare (--config is not used); prints the table."""
  del config
  runs = COMPARE_DIRS.value or compare.find_runs(workdir)
  print(compare.compare(runs, workdir, log_steps=common.LOG_STEPS.value))
  return 0
