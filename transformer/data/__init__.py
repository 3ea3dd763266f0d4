"""Datasets, tokenizers and the grain pipeline: a run's rows from its config.

The entry is sources.py (load_sources: the dataset and tokenizer a run reads, checked
against its config); pipeline.py turns them into an objective's grain dataset. The rest
are parts, by concern:

  sources.py         a run's dataset + tokenizer, checked against the config (the entry)
  pipeline.py        Objective.pipeline -> its grain dataset (PIPELINES)
  lm.py              causal and masked LM rows
  seq2seq.py         translation / continuation pairs, packed or padded
  classification.py  one labelled example per row
  denoise.py         text-to-text rows (span corruption, prefix LM, UL2): windows or pairs
                     denoised, then converted onto an encoder-decoder or a decoder
  packing.py         reading (in blocks), shuffling, length policy, padding, eval batches
  run_data.py        a run's data identity (dataset.json) by content; relative paths
  text_encoding.py   bytes that are plainly not UTF-8 text (UTF-16/32, gzip, NULs): one
                     line naming the file, the likely encoding and how to convert it
  datasets/          data.name -> a prepared TFDS builder: the catalog, the offline corpus,
                     the builders over local files
  corpus/            prepared corpora (data.name="corpus", --mode=prepare): token-id shards,
                     their readers, a config's corpus, mixtures
  tokenizers/        the vocabulary kinds (byte, character, SentencePiece), an imported
                     model's tokenizer, and a run's vocabulary saved in its workdir

Imports run downwards: sources.py and pipeline.py use the parts; corpus/ uses
tokenizers/ and run_data.py; corpus/ and datasets/ use text_encoding.py, which imports
nothing; datasets/ and tokenizers/ use neither of the others (tests/test_layout.py
checks that no module reaches one that reaches it back, lazy imports included).
May import: config, distributed, workdir.
"""
