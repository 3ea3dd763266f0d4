"""Datasets (TFDS builders and catalog loading), tokenizers and the grain pipeline.

  catalog.py         data.name -> a prepared TFDS builder (catalog, offline, local files)
  python_stdlib.py   TFDS builder for the offline corpus
  local_files.py     what the local builders share; local_text.py (plain text, LM),
                     local_parallel.py (parallel text), local_tsv.py (TSV/CSV labels)
  corpus.py          a prepared corpus (data.name="corpus"): manifest, checks, reader;
                     corpus_read.py (source files), corpus_prepare.py (--mode=prepare),
                     corpus_run.py (a config's corpus and tokenizer), corpus_rows.py
                     (packed rows of its token arrays)
  mixture.py         data.mixture: prepared corpora mixed by weight (grain's mix)
  tokenizers.py      SentencePiece (unigram/BPE, joint), character and byte tokenizers
  hf_tokenizer.py    an imported model's own tokenizer, renumbered to the ids above
  sources.py         a run's dataset + tokenizer, checked against the config
  run_data.py        a run's data identity (dataset.json) by content; relative paths as recorded
  packing.py         reading, shuffling, length policy, padding, eval batches
  lm.py              causal and masked LM rows
  seq2seq.py         translation / continuation pairs, packed or padded
  classification.py  one labelled example per row
  pipeline.py        Objective.pipeline -> its grain dataset (PIPELINES)

May import: config, distributed, workdir.
"""
