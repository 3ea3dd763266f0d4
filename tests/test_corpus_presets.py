"""The real-corpus presets (gpt_small.py:fineweb, llama.py:1b_fineweb): their docstrings
say how to get and prepare the corpus, and their data.* read a FineWeb-shaped parquet.
Nothing downloads: the test writes the parquet."""

import importlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs import base
from transformer.cli import prepare as prepare_mode
from transformer.config.validation import validate
from transformer.data import pipeline
from transformer.data import sources
from transformer.data.tokenizers import run_vocabulary


@pytest.mark.parametrize("preset, arg", [("gpt_small", "fineweb"), ("llama", "1b_fineweb")])
def test_the_real_corpus_presets_say_how_to_get_and_prepare_their_corpus(preset, arg,
                                                                         tmp_path):
  """Each real-corpus preset's docstring holds the download and prepare commands, the
  expected tokens and disk size; its data.* prepares a FineWeb-shaped parquet as is."""
  module = importlib.import_module(f"configs.{preset}")
  for needed in ("huggingface-cli download HuggingFaceFW/fineweb-edu", '"sample/10BT/*"',
                 f"--mode=prepare --config=configs/{preset}.py:{arg}", "B tokens", " GB "):
    assert needed in module.__doc__, needed
  config = module.get_config(arg)
  validate(config)
  assert config.data.name == "corpus" and config.data.path.endswith("sample/10BT")
  # FineWeb-Edu's columns (text, id, url, score, ...): the preset reads `text`.
  folder = tmp_path / "sample" / "10BT"
  folder.mkdir(parents=True)
  pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(40)],
                           "id": [str(i) for i in range(40)],
                           "score": [3.5] * 40}), str(folder / "000_00000.parquet"))
  config.data.update(path=str(folder), data_dir=str(tmp_path / "data"), tokenizer="bytes",
                     prepare_workers=1, val_fraction=0.1)
  assert prepare_mode.main(config, None) == 0
  data = sources.load_sources(config)
  assert data.corpus.manifest["splits"]["train"]["documents"] > 0
  # Its rows, read by the default grain reader threads (no longer slower than none).
  assert config.data.num_threads == base.get_config().data.num_threads > 0
  config.model.vocab_size = run_vocabulary.resolved_vocab_size(config, data.tokenizer)
  config.data.seq_len = 32
  batch = next(iter(pipeline.make_dataset(config, "causal_lm", data.split("train"),
                                          data.tokenizer, train=True, batch_size=4)))
  assert batch["inputs"].shape == (4, 32) and batch["weights"].sum() > 0
