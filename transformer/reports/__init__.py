"""Reports drawn from workdirs' files: no JAX devices needed.

  plots.py    PNG curves of a run's metrics.jsonl
  compare.py  a Markdown table and overlaid curves of several runs (a sweep's)
  long_context.py  tables and PNGs of evaluate --by_position (perplexity by position)
              and --mode=passkey (a length x depth heat map)

May import: config, workdir (metrics_file.py reads metrics.jsonl).
"""
