"""--mode=compare: a Markdown table and overlaid curves of --compare_dirs (or the runs in
--workdir) -> <workdir>/compare.md and compare_*.png (no JAX devices).

Exit status: 0; 1 when runs the sweep in --workdir recorded as started (sweep.json) have
no folder any more: compare.md compares the others and lists those as missing, and one
line names each with its expected folder (a comparison that silently lost a finished
run would read as complete).
"""

from __future__ import annotations

import sys

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
  return run(COMPARE_DIRS.value, workdir, common.LOG_STEPS.value)


def run(compare_dirs: list[str], workdir: str, log_steps: bool = False) -> int:
  """Compares `compare_dirs`, or the runs in `workdir`; returns the exit status."""
  runs = compare_dirs or compare.find_runs(workdir)
  missing = [] if compare_dirs else compare.missing_runs(workdir)
  print(compare.compare(runs, workdir, log_steps=log_steps, missing=missing))
  if missing:
    sys.stdout.flush()
    sys.stderr.write(f"compare: {compare.missing_line(missing)}\n")
    return 1
  return 0
