"""--mode=prepare: tokenize `data.path`'s corpus once into token-id shards (docs/corpus.md).

  python launch.py --mode=prepare --config=configs/my_corpus.py
  python launch.py --mode=prepare --config=configs/my_corpus.py --ray_address=HOST:PORT
  python launch.py --config=configs/my_corpus.py          # then train on the ids

Takes the training config (data.name="corpus", data.path, data.text_key,
data.tokenizer, data.prepare_workers, data.prepare_piece_mb, data.bad_records); needs no
--workdir and starts no JAX devices. --ray_address runs the tasks on a Ray cluster's nodes
instead of local worker processes (docs/corpus.md: the folders every node must see). A character or SentencePiece vocabulary is trained
first on a sample of the corpus (or init_from's run's vocabulary is used). Rerunning
resumes: finished source files are kept, the others redone. With data.mixture, each
of its corpora is prepared in turn, all with the first one's tokenizer. Exit status: 0 done (or
2 a bad config, record or cluster (one line), 130 / 143 interrupted.
"""

from __future__ import annotations

import os

import ml_collections
from absl import flags
from absl import logging

from transformer.cli import common
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.data.corpus import for_config
from transformer.data.corpus import mixture
from transformer.data.corpus import preparation
from transformer.data.corpus import readers
from transformer.data.corpus import store
from transformer.workdir import files

STARTS_JAX = False
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("ray_address",)


def check_config(config: ml_collections.ConfigDict, workdir: str = "") -> None:
  """The config's keys and values, and that it names a corpus (before anything is written;
  `workdir` is launch.py's common signature: the prepared ids go under data.data_dir)."""
  del workdir
  validate(config)
  if config.data.name != "corpus":
    raise ConfigError(f"--mode=prepare prepares a corpus: config.data.name={config.data.name!r}"
                      " must be 'corpus' (with config.data.path a folder or glob of "
                      f"{', '.join(readers.EXTENSIONS)} files); the TFDS and local_* "
                      "datasets are prepared by the training run itself")
  for one in mixture.component_configs(config):  # data.mixture: each of its corpora.
    readers.source_files(one.data.path)  # Nothing there: one line now.


def main(config: ml_collections.ConfigDict, workdir: str | None) -> int:
  """launch.py --mode=prepare; returns the exit status."""
  del workdir  # The corpus goes under data.data_dir, keyed by its sources and tokenizer.
  # data.mixture: every component with the first one's tokenizer (data/corpus/mixture.py).
  configs = mixture.component_configs(config)
  tokenizer = None
  for one in configs:
    folder = store.sources_folder(one.data)
    with files.disk_errors_as_oserror(folder, "config.data.data_dir"):  # A full disk: one line.
      tokenizer = tokenizer or for_config.tokenizer_for(one, create=True)
      job = for_config.job_for(one, tokenizer)
      workers = one.data.prepare_workers or os.cpu_count() or 1
      # FLAGS[...]: a test calls main without parsing the command line (its default then).
      manifest = preparation.prepare(job, workers=workers,
                                     ray_address=flags.FLAGS[common.RAY_ADDRESS.name].value)
    logging.info("%s\n  in %s", preparation.summary(manifest), job.output)
  return 0
