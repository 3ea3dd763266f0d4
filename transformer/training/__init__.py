"""Training: the compiled runtime apart from the loop that drives it.

  trainer.py          TrainState, train_step, eval_step, Scorer (eval step alone) and
                      Trainer (init, train and eval steps, sharded; train_steps runs
                      several steps a call), evaluate_split
  loop.py             train_and_evaluate: restore or init, train, evaluate, save, signals,
                      the non-finite guard and resume checks
  fault_injection.py  test-only crash injection (TRANSFORMER_TEST_KILL_AT)
  decode_hook.py      what an evaluation decodes: in-training BLEU and a sample
  optim.py            schedules and AdamW
  metrics.py          metric sums and the progress line (rows go to workdir/metrics_file.py)
  flops.py            model FLOPs per step, device peaks, MFU's denominator

May import: configuration, distributed, hardware, sharding, model, data, inference,
workdir. Never reports/ (plots are drawn by cli/train.py after the loop).
"""
