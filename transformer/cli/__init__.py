"""launch.py's modes that live in a module of their own, each defining its absl flags.

  compile.py  --mode=compile: compile the steps for a TPU slice on this host, say whether
              they fit and how fast they could run (transformer/planning/).

A mode module imports no jax at its top level: launch.py imports it before parsing flags
and `--help` stays fast. Each has one `run(config) -> int` returning the exit status.
"""
