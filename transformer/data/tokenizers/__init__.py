"""Tokenizers: the vocabulary kinds, an imported model's own, and a run's saved one.

  vocabularies.py    the kinds a run trains or takes: byte, character, SentencePiece
                     (unigram/BPE); the special ids every pipeline assumes
  hf_vocab.py        an imported Hugging Face tokenizer.json, renumbered to those ids
  sentinels.py       T5's sentinel ids and UL2's paradigm tokens after a vocabulary (the
                     one id rule), and text with <extra_id_N> in and out
  run_vocabulary.py  a run's vocabulary: built from texts, saved into its workdir with
                     its record, loaded back and checked (every mode that reads a run)

May import: config, workdir, data/run_data.py; not data/sources.py, corpus/ or datasets/.
"""
