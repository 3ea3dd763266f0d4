"""data.mixture: prepared corpora mixed by weight with grain's IterDataset.mix
(data/corpus/mixture.py): the syntax's one-line errors, the exact realised counts, determinism,
exact resume, and a training run that logs the proportions."""

import gzip
import json
import os

import grain
import numpy as np
import pytest

from test_corpus import write_corpus
from transformer.cli import prepare as prepare_mode
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.data import pipeline
from transformer.data import sources
from transformer.data.corpus import mixture
from transformer.data.tokenizers import vocabularies


@pytest.mark.parametrize("spec, message", [
    ("web:0.7:/a", "needs at least two corpora"),
    ("web:0.7:/a,code:-1:/b", "component 'code' has weight '-1', expected a positive number"),
    ("web:0.7:/a,code:x:/b", "component 'code' has weight 'x'"),
    ("web:0.7:/a,web:0.3:/b", "component name 'web' appears twice"),
    ("web:0.7:/a,code/b", "component 'code/b' is not name:weight:path"),
])
def test_a_bad_mixture_is_one_line_naming_the_component(tiny_config, spec, message):
  tiny_config.data.update(name="corpus", mixture=spec)
  with pytest.raises(ConfigError, match=r"^config\.data\.mixture=.*" + message):
    validate(tiny_config)


def test_a_mixture_needs_a_corpus_and_no_data_path(tiny_config):
  tiny_config.data.update(mixture="web:0.7:/a,code:0.3:gs://bucket/b:c")
  with pytest.raises(ConfigError, match=r"data.mixture=.*set data.name='corpus'"):
    validate(tiny_config)
  tiny_config.data.update(name="corpus", path="/a")
  with pytest.raises(ConfigError, match=r"data.path='/a' is invalid: data.mixture gives"):
    validate(tiny_config)
  tiny_config.data.path = ""
  validate(tiny_config)
  assert [c.path for c in mixture.components(tiny_config)] == ["/a", "gs://bucket/b:c"]


@pytest.mark.parametrize("weights", [(0.7, 0.2, 0.1), (1, 1), (0.33, 0.5, 0.17), (3, 0.01)])
def test_row_counts_are_the_rows_grain_chose(weights):
  """row_counts (what the metrics report) against grain's own interleave, row by row."""
  names = [f"c{i}" for i in range(len(weights))]
  parts = {name: grain.MapDataset.range(10 ** 6).map(lambda _, n=name: n).to_iter_dataset()
           for name in names}
  chosen = iter(grain.IterDataset.mix(parts, dict(zip(names, weights))))
  seen = [next(chosen) for _ in range(1500)]
  for rows in (1, 7, 100, 999, 1500):
    assert mixture.row_counts(weights, rows) == [seen[:rows].count(n) for n in names], rows


def _uppercase_corpus(folder: str, documents: int = 150) -> None:
  """Documents of 'X' words: their byte ids never occur in write_corpus's documents."""
  os.makedirs(folder, exist_ok=True)
  with gzip.open(os.path.join(folder, "x.jsonl.gz"), "wt", encoding="utf-8") as f:
    for i in range(documents):
      f.write(json.dumps({"text": " ".join(["XXX"] * (5 + i % 40))}) + "\n")


@pytest.fixture
def mixed(tiny_config, tmp_path):
  """The tiny config on a mixture of two small corpora, prepared by --mode=prepare."""
  write_corpus(str(tmp_path / "web"))
  _uppercase_corpus(str(tmp_path / "upper"))
  tiny_config.data.update(name="corpus", tokenizer="bytes", data_dir=str(tmp_path / "data"),
                          prepare_workers=1, val_fraction=0.2,
                          mixture=f"web:0.75:{tmp_path / 'web'},upper:0.25:{tmp_path / 'upper'}")
  tiny_config.model.vocab_size = 384
  prepare_mode.check_config(tiny_config)
  assert prepare_mode.main(tiny_config, None) == 0
  return tiny_config


def _train_rows(config):
  data = sources.load_sources(config)
  return iter(pipeline.make_dataset(config, "causal_lm", data.split("train"), data.tokenizer,
                                    train=True, batch_size=4, split="train"))


def test_the_mixture_is_deterministic_in_proportion_and_resumes_exactly(mixed):
  x_id = vocabularies.ByteTokenizer().encode("X")[0]
  first, again = _train_rows(mixed), _train_rows(mixed)
  batches = [next(first) for _ in range(10)]
  for batch in batches:  # The same rows, in the same order, from a fresh pipeline.
    np.testing.assert_array_equal(next(again)["inputs"], batch["inputs"])
  # Rows from `upper` hold its 'X' ids, rows from `web` never do: the realised count of
  # each component is exactly what row_counts (and the metrics) say.
  from_upper = [bool((row == x_id).any()) for batch in batches for row in batch["inputs"]]
  assert sum(from_upper) == mixture.row_counts([0.75, 0.25], 40)[1] == 10
  assert mixture.realised(mixed, 40) == {"mixture_web": 0.75, "mixture_upper": 0.25}
  # Exact resume: the mixture's position and each component's are in the state.
  state = first.get_state()
  expected = [next(first) for _ in range(3)]
  resumed = _train_rows(mixed)
  resumed.set_state(json.loads(json.dumps(state)))  # As a checkpoint stores it.
  for batch in expected:
    got = next(resumed)
    for key in batch:
      np.testing.assert_array_equal(got[key], batch[key])


def test_a_run_on_a_mixture_logs_the_realised_proportions_and_resumes_exactly(mixed,
                                                                              tmp_path):
  """4 steps straight == 2 steps, then the same command to 4: the same losses and data
  position (the mixture's and each corpus's, in the checkpoint's data state)."""
  from transformer.training import loop  # pylint: disable=g-import-not-at-top
  mixed.train.update(num_steps=4, eval_every=2, eval_batches=1)
  mixed.checkpoint.update(every=2)
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  loop.train_and_evaluate(mixed, straight)
  mixed.train.num_steps = 2
  loop.train_and_evaluate(mixed, resumed)
  mixed.train.num_steps = 4
  loop.train_and_evaluate(mixed, resumed)

  def rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      return [row for row in map(json.loads, f) if "loss" in row]

  assert [(r["step"], r["loss"]) for r in rows(straight)] == [
      (r["step"], r["loss"]) for r in rows(resumed)]
  for row in rows(straight):  # 8 rows a step: 6 web, 2 upper.
    assert row["mixture_web"] == 0.75 and row["mixture_upper"] == 0.25
  data = os.path.join("checkpoints", "4", "data", "process_0-of-1.json")
  with open(os.path.join(straight, data), encoding="utf-8") as f, \
       open(os.path.join(resumed, data), encoding="utf-8") as g:
    saved = json.load(f)
    assert saved == json.load(g)
  assert "upper" in json.dumps(saved) and "web" in json.dumps(saved)
  with open(os.path.join(straight, "dataset.json"), encoding="utf-8") as f:
    record = json.load(f)
  assert record["name"] == "mixture/web:0.75+upper:0.25"
  assert set(record["components"]) == {"web", "upper"} and "upper/x.jsonl.gz" in record["files"]


def test_the_logged_proportions_count_this_processs_input_share_not_the_process_count(
    tiny_config, monkeypatch):
  """Two processes across a tensor axis both read all 8 rows of a step (one input share,
  sharding.input_shard): after step 1 each mixed 8 rows (5 and 3 at 0.6 / 0.4), not 4."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer.training import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  from transformer.training import reporting  # pylint: disable=g-import-not-at-top
  tiny_config.data.update(name="corpus", mixture="web:0.6:/a,code:0.4:/b")
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  written = {}
  writer = type("Writer", (), {"write": lambda self, step, row: written.update({step: row})})()
  reporter = reporting.Reporter(tiny_config, writer, metrics_lib.TrainProgress(0, 6, 256),
                                local_rows=tiny_config.data.batch_size)
  host = {"loss_sum": 20.0, "weight_sum": 10.0, "objective_sum": 20.0, "correct_sum": 5.0,
          "learning_rate": 1e-3,
          "grad_norm": 1.0, "param_norm": 3.0, "update_norm": 0.1}
  reporter.report_call(reporting.DispatchedCall(1, 1, host, shown=True), None)
  assert mixture.row_counts([0.6, 0.4], 8) == [5, 3]  # 4 rows would give 3 and 1.
  assert (written[1]["mixture_web"], written[1]["mixture_code"]) == (5 / 8, 3 / 8)
