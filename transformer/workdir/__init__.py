"""The workdir: the one place that knows a run's files and how they are written.

  layout.py         every file and folder name of a workdir, in one table
  files.py          the one atomic write (temporary file, fsync, 0644, replace)
  checkpointing.py  the Orbax manager (state + data iterator), restore checks, the one
                    parameters-only save path
  orbax_patch.py    the one replacement of a library's internals: Orbax's event loop for a
                    save, drained after a failed write (what, why, for which Orbax, and
                    what to do when Orbax changes)
  init_from.py      config.init_from: parameters matched by path, read into a new model
  averaging.py      the mean of several checkpoints' parameters
  metrics_file.py   metrics.jsonl rows (MetricWriter, read_rows) and TensorBoard events
  wandb_run.py      train.wandb_project: the writer's rows also to a Weights & Biases run
  lock.py           one writer per workdir: an flock held while a command writes
  run_record.py     run.json: parameter count, wall time of each session
  console.py        what the console shows (durations too); the full log in
                    <workdir>/log.txt
  progress.py       what a long mode says while it works: counted progress (done / total,
                    rate, ETA) every few seconds and a summary, timed stages
  kill_points.py    test-only crash injection at named points of a write
                    (TRANSFORMER_TEST_KILL_AT), shared by the training hook and prepare

May import: transformer.config only.
"""
