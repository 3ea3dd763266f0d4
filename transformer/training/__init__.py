"""Training: the compiled runtime apart from the loop that drives it.

  trainer.py          TrainState, train_step, eval_step, Scorer (eval step alone) and
                      Trainer (init, train and eval steps, sharded; train_steps runs
                      several steps a call), evaluate_split
  loop.py             train_and_evaluate: restore or init, then dispatch, report, evaluate,
                      save; the loop's state is one LoopState
  prefetch.py         the next calls' batches built and placed in a thread (data.prefetch);
                      its state, which checkpoints save, is the position of the calls taken
  hooks.py            what runs at the loop's known points (after_eval, after_save,
                      after_call) and the registry other modules add hooks to
  signals.py          SIGINT/SIGTERM: stop after a saved step, a second one at once
                      (Interrupted: exit 130 / 143)
  resume.py           what a resume keeps: the run's vocabulary, the config change check,
                      whether a run is already complete
  fine_tune.py        what a run started with init_from takes from its source: the model
                      and tokenizer keys (the command line's, the task's and RUN_FIELDS
                      stay), fine-tuning optimizer values, the parameter-fit check
  source_params.py    which stored value each parameter takes (layouts converted, LoRA
                      continued, rescaled or folded, new / dropped checked) and the read
  reporting.py        rows, the progress line, the non-finite guard, the steps-per-call hint
  fault_injection.py  test-only crash injection (TRANSFORMER_TEST_KILL_AT), a registered hook
  decode_hook.py      what an evaluation decodes: in-training BLEU and a sample (a hook)
  benchmark_hook.py   train.benchmarks: downstream tasks scored at evaluations (a hook,
                      through transformer/evaluation/)
  optim.py            schedules and AdamW
  metrics.py          metric sums and the progress line (rows go to workdir/metrics_file.py)
  head_loss.py        the loss head: vocabulary projection + cross-entropy a chunk at a
                      time, statistics in one pass, its gradient made in the forward
  logit_gradient.py   the logit gradient's formula, one for both heads below and above
  head_pallas.py      the loss head's backward matmuls as Pallas GPU kernels that make
                      the logit gradient inside them (model.loss_head_impl)
  flops.py            model FLOPs per step, device peaks, MFU's denominator

May import: config, distributed, hardware, sharding, model, data, inference,
evaluation, workdir. Never reports/ (plots are drawn by cli/train.py after the loop).
"""

# Registers the test-only crash hook (inert unless TRANSFORMER_TEST_KILL_AT is set), so
# that every entry to the loop has it while the loop itself names no crash point.
from transformer.training import fault_injection  # pylint: disable=unused-import
