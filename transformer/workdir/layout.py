"""Every file and folder name of a workdir, in one table.

A training run's workdir (launch.py --mode=train):

  config.json            the resolved config (CONFIG)
  tokenizer.json         which vocabulary the run uses (TOKENIZER_RECORD), beside the
                         vocabulary file it names; hf_tokenizer.json for an imported model
  dataset.json           which prepared dataset the run trains on (DATASET_RECORD): its
                         TFDS name, which for local files hashes their content, and
                         the tokenizer's identity (an import's holds that alone)
  checkpoints/<step>/    Orbax checkpoints: state/ (TrainState) and data/ (iterator)
  checkpoints_bad/       checkpoints found damaged, moved aside on restore
  metrics.jsonl          one JSON row per logged step (METRICS)
  tensorboard/           the same scalars as TensorBoard events
  run.json               parameter count and each (re)start's wall time
  plots/*.png            curves of metrics.jsonl
  peak_flops.json        the measured matmul rate MFU divides by (CPU)
  log.txt                every log line of every (re)start
  wandb_run.json         with train.wandb_project: the W&B run's id, so that a resume
                         continues the same W&B run (WANDB_RUN); wandb/ its local files
  lock                   "PID HOST" of the command writing into the workdir, flock-ed
                         while it runs (LOCK; workdir/lock.py)
  averaged.json          in a workdir written by --mode=average: its source and steps
  eval_<split>_step<N>.json   --mode=evaluate's result

A sweep's folder adds sweep.json (its runs, in order) and compare.md. Nothing else in
the package spells these names: import them from here.
"""

CONFIG = "config.json"
TOKENIZER_RECORD = "tokenizer.json"
HF_TOKENIZER = "hf_tokenizer.json"
DATASET_RECORD = "dataset.json"
CHECKPOINTS = "checkpoints"
STATE = "state"  # Item of a checkpoint: the TrainState (or only its params).
DATA = "data"  # Item of a checkpoint: the input pipeline's position.
FILE_SIZES = "file_sizes.json"  # In each checkpoint: the size of every file, to spot damage.
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
RUN_RECORD = "run.json"
PLOTS = "plots"
PEAK_FLOPS = "peak_flops.json"
LOG = "log.txt"
WANDB_RUN = "wandb_run.json"
WANDB = "wandb"  # W&B's own folder (its offline runs, logs), unless WANDB_DIR is set.
LOCK = "lock"
AVERAGED = "averaged.json"
SWEEP_RECORD = "sweep.json"
COMPARE = "compare.md"
BAD_CHECKPOINTS = "checkpoints_bad"
