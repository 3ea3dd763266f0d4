"""jax's CUDA plugin on a host without an NVIDIA driver: its console noise, dropped.

With `jax-cuda12-plugin` installed (the compile mode's GPU targets), `import jax` on a
CPU or TPU host prints "Could not find cuda drivers on your machine" lines (three
pairs: jaxlib's GPU extension modules load the plugin's CUDA stubs), and starting the
backends prints a "Jax plugin configuration error" traceback from its CUDA version
check. They come from C++ before logging is set up (file descriptor 2, not
sys.stderr), so no log level stops them. Imports nothing of the project and no jax at
module level: launch.py calls `import_jax_quietly()` before its flags load a config.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Callable, Iterator

NOISE = re.compile(r"Could not find cuda drivers|absl::InitializeLog\(\) is called"
                   # XLA's GPU scheduler compiling for a GPU that is not attached (the
                   # compile mode): its memory estimate for the absent device's limit is
                   # logged as an ERROR ("... gpu_hlo_schedule.cc ... an error in the
                   # calculation!") although the compile succeeds and reports memory itself.
                   r"|gpu_hlo_schedule\.cc.*an error in the calculation")


def driver_present() -> bool:
  """Whether this host has an NVIDIA kernel driver (then the plugin's output is real)."""
  return os.path.exists("/proc/driver/nvidia/version")


@contextlib.contextmanager
def filtered(keep: Callable[[str], None] | None = None) -> Iterator[None]:
  """Takes the plugin's no-driver lines (and libtpu's start-up lines, `NOISE`) off stderr
  while the block runs: each goes to `keep` (console.py: to log.txt) or is dropped.

  File descriptor 2 points at a file for the block and every other line is written
  back afterwards, so use it around short steps (an import, a device query, a
  compile), not around a run whose errors should appear as they happen.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      capture.seek(0)
      for line in capture.read().decode("utf-8", "replace").splitlines():
        if NOISE.search(line):
          if keep is not None:
            keep(line)
        elif line.strip():
          sys.stderr.write(line + "\n")


def import_jax_quietly() -> None:
  """`import jax` without the plugin's noise where no driver is present (else plainly).

  Also skips the plugin's CUDA version check there (JAX_SKIP_CUDA_CONSTRAINTS_CHECK,
  unless the user set it): with no driver it can only fail, and it prints a traceback.
  """
  if "jax" in sys.modules or driver_present():
    import jax  # pylint: disable=g-import-not-at-top,unused-import
    return
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  with filtered():
    import jax  # pylint: disable=g-import-not-at-top,unused-import,redefined-outer-name


def start_backends_quietly() -> None:
  """Starts jax's backends (the first device query) without the plugin's no-driver lines.

  Call it after jax.distributed.initialize, which must come before the backends start.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if driver_present():
    jax.devices()
    return
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  with filtered():
    jax.devices()
