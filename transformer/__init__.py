"""A JAX/Flax codebase for the Transformer family: one block, three topologies.

From the ground up (each part imports only those above it in this list;
tests/test_layout.py holds the table and enforces it):

  config/           validate(config) by concern (model, moe, data, decode, train, mesh),
                    the choice registries, the training objectives (one Objective
                    each), ConfigError, the frozen ModelConfig
  distributed.py    jax.distributed start, barriers, failing together
  hardware.py       the one table of accelerator chips: memory, peaks, bandwidths
  accelerator.py    what a GPU/TPU run needs before JAX starts (XLA flags, memory
                    fraction) and checks after (the backend that started, its platform)
  plugin_noise.py   jax's CUDA plugin on a host with no driver: its console lines dropped
  gc_tuning.py      Python's garbage collector set for a process that traces programs
  sharding.py       the device mesh, logical-axis rules, the sharding report, the rows
                    each process reads (input_shard)
  workdir/          the one place that knows a workdir's files: names, atomic writes,
                    checkpoints, run record, console and log
  model/            attention, positions, layers, the three topologies, objectives
  data/             datasets (TFDS builders, catalog, local files), tokenizers, pipelines
  inference/        a trained run loaded without training; decoding; text in and out
  training/         the compiled step and Trainer, the loop, optimizer, metrics, FLOPs
  reports/          plots of a run, comparison tables of several
  interop/hf/       Hugging Face folders in and out, one module per family
  planning/         before renting: the steps compiled for a TPU slice or GPU host, fits
                    and speed
  cli/              launch.py's modes, one module each, with the flags they own
  api.py            the Python API for a notebook (docs/python.md): load a run, generate,
                    score, evaluate, build a model from a config
"""
