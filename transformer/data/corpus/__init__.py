"""Prepared corpora (data.name="corpus"): tokenized once by --mode=prepare, read by id.

  store.py        a prepared corpus on disk: its folder, manifest, identity checks and the
                  random-access reader of its shards (CorpusSplit, PreparedCorpus)
  readers.py      the source files: FORMATS (one record per format: .txt, .jsonl,
                  .jsonl.gz, .jsonl.zst, .parquet), which files data.path names, and each
                  file read as streamed documents (bad records in one line)
  preparation.py  --mode=prepare's tasks, worker processes, resume and manifest
  pieces.py       a large source file as parts (byte ranges, row groups), and their
                  shards joined into the file's
  on_ray.py       --ray_address: the tasks on a Ray cluster's nodes (the node checks,
                  retries, progress); the only module that imports Ray
  for_config.py   a config's corpus: its tokenizer, prepare job, and the checks before
                  training opens it
  packer.py       packed rows of token arrays (grain's concat-then-split, by slices)
  mixture.py      data.mixture: prepared corpora mixed by weight (grain's mix)

May import: config, workdir, data/tokenizers, data/run_data.py; not data/sources.py.
"""
