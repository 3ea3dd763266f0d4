"""data.name -> a prepared TFDS builder: the catalog, the offline corpus, local files.

  catalog.py         load_builder: a TFDS catalog name, the offline corpus or a local
                     builder, prepared once (locked); data_source / CheckedSource read it
  python_stdlib.py   the offline corpus: this Python's standard library sources
  local_files.py     what the local builders share (files, content keys, decoding)
  local_text.py      plain text files at data.path (language modelling)
  local_parallel.py  parallel text (translation pairs)
  local_tsv.py       TSV/CSV rows of text and label (classification)

May import: config, workdir, data/packing.py; not data/sources.py, corpus/ or tokenizers/.
"""
