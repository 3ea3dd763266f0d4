"""launch.py's modes, one module each, with the flags it owns and a `main(config, workdir)`.

  train.py      --mode=train: the loop, then the run's plots
  evaluate.py   --mode=evaluate (--split, --max_examples, --by_position)
  passkey.py    --mode=passkey (--passkey_lengths, --passkey_depths, ...): retrieval of a
                key hidden in filler, a length x depth table and heat map
  benchmark.py  --mode=benchmark (--tasks, --limit, --per_request): HellaSwag, PIQA, ARC,
                LAMBADA, ... by log-likelihood (transformer/evaluation/)
  translate.py  --mode=translate (--input)
  generate.py   --mode=generate (--prompt; --input, --output as translate)
  classify.py   --mode=classify (--input, --class_names): a class and its probability a line
  average.py    --mode=average
  hf_import.py  --mode=import
  hf_export.py  --mode=export
  plot.py       --mode=plot
  sweep.py      --mode=sweep (--sweep): one launch.py process per grid point
  sweep_spec.py --sweep's grid or JSON file -> every run's overrides, name and validated
                config (build_runs), before the first run starts
  sweep_devices.py --devices_per_run: the host's GPUs / TPU chips / CPU cores, each arm's
                slot and environment; a run that dies with the sweep (stop_with_the_parent)
  sweep_ray.py  --devices_per_run with --ray_address: each arm a Ray task with its resources
  compare.py    --mode=compare (--compare_dirs)
  compile.py    --mode=compile (--topology, --mesh_search, ...): the steps compiled for a
                TPU slice on this host, fits or not, how fast (transformer/planning/)
  keys.py       --mode=keys: every config key with its value and base.py's comment
  prepare.py    --mode=prepare: data.path's corpus tokenized once into token-id shards
                (data.name="corpus"; data/corpus*.py, docs/corpus.md)
  common.py     flags several modes share (--input, --output, --checkpoint_step, decode flags)
                and their file handling
  usage.py      flag, config-file and disk/permission mistakes in one line; the table of
                which modes read which flag (check_mode_flags); --help's list of modes
                (modes_help)

Each module's docstring starts `--mode=<name>: ` and one sentence: launch.py --help
lists the modes with it (usage.modes_help). Each module sets SHARED_FLAGS, the cli/common.py flags it reads (with the flags its own
module defines: the table launch.py refuses every other flag with), and STARTS_JAX
(plot, compare, keys, sweep, prepare and compile start no devices of this host's run: compile
uses libtpu's abstract TPU devices). May import
every other part of the package; nothing imports cli/ but launch.py.
"""
