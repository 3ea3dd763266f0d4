"""Reports drawn from workdirs' files: no JAX devices needed.

  plots.py    PNG curves of a run's metrics.jsonl
  compare.py  a Markdown table and overlaid curves of several runs (a sweep's)

May import: config, workdir (metrics_file.py reads metrics.jsonl).
"""
