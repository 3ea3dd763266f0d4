"""Python's garbage collector set for a process that traces and compiles JAX programs.

Tracing a model (jax.jit, Flax's init and apply) allocates millions of short-lived
Python objects. At CPython's default thresholds (700, 10, 10) that starts a collection
every 700 allocations, and every tenth of those also walks the older generation, which
holds everything imported (jax, flax, optax, orbax: a few hundred thousand objects that
live as long as the process). In a profile of a process building the tests' tiny
Trainer and compiling its init (perf, AMD EPYC) the collector was about an eighth of the
samples.

`tune` moves what exists now (the imported modules, the command's flags) out of the
collector's sight (`gc.freeze`: never garbage, never walked again) and collects the
youngest generation every 10,000 allocations instead of 700. Garbage cycles are still
collected, a little later; nothing else changes. What it saves is tracing time: the tiny
training's tracing took 1.46-1.72 s against 1.8-2.0 s in four interleaved comparisons
(fresh processes, AMD EPYC 2 cores; two of them by `python benchmarks/cpu_compile_flags.py
--collector --repeats=5`, the others by a script with the same training), while the whole process's time moved within its noise (0.88x to 1.04x).
The default test run, whose two workers live long on large heaps, took 20m26s and 20m35s
against 21m49s the session before: not an A/B in one session (docs/performance.md).
launch.py calls it once its modules are imported; tests/conftest.py once the tests are
collected.
"""

from __future__ import annotations

import gc

# Allocations between collections of the youngest generation, and how many of those
# before the next older one (CPython's defaults: 700, 10, 10).
THRESHOLDS = (10_000, 50, 100)


def tune() -> None:
  """Freezes the objects alive now and sets `THRESHOLDS`; once per process, after the
  heavy imports (a later call freezes what has been made since, which is harmless)."""
  gc.collect()  # Garbage made so far is freed, not frozen.
  gc.freeze()
  gc.set_threshold(*THRESHOLDS)
