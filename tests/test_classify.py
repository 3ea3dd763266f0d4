"""--mode=classify: a class and its probability per line, as evaluate scores the same texts."""

import io
import math
import os

import pytest

from tiny import make_tiny_config
from transformer.cli import classify
from transformer.cli import evaluate
from transformer.config.errors import ConfigError
from transformer.training import loop

POSITIVE = ("good", "great", "fine", "lovely", "superb")
NEGATIVE = ("bad", "awful", "poor", "dreadful", "dull")


def _rows(count: int, offset: int) -> list[tuple[str, int]]:
  return [(f"a {(POSITIVE if i % 2 else NEGATIVE)[(i + offset) % 5]} film {i}", i % 2)
          for i in range(count)]


@pytest.fixture(scope="module")
def classifier(tfds_data_dir, tmp_path_factory):
  """A tiny decoder classifier trained 4 steps on a local TSV; (workdir, dev rows)."""
  root = tmp_path_factory.mktemp("classify")
  folder = root / "tsv"
  os.makedirs(folder)
  dev = _rows(12, 1)
  for name, rows in (("train.tsv", _rows(48, 0)), ("dev.tsv", dev)):
    (folder / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows),
                               encoding="utf-8")
  config = make_tiny_config(tfds_data_dir)
  config.data.update(name="local_tsv", path=str(folder), text_key="sentence",
                     label_key="label", data_dir=str(root / "data"))
  config.model.update(head="classification", pooling="last", num_classes=2)
  config.train.update(num_steps=4, eval_every=4, eval_batches=-1)
  config.checkpoint.every = 4
  workdir = str(root / "run")
  loop.train_and_evaluate(config, workdir)
  return workdir, dev


def test_classify_agrees_with_evaluate_on_the_same_texts(classifier, tmp_path, caplog):
  workdir, dev = classifier
  record = evaluate.evaluate(workdir, output=str(tmp_path / "eval.json"), stdout=io.StringIO())
  stdin = io.TextIOWrapper(io.BytesIO("".join(t + "\n" for t, _ in dev).encode()))
  out = io.StringIO()
  with caplog.at_level("INFO"):
    predictions = classify.classify(workdir, stdin=stdin, stdout=out,
                                    class_names=["negative", "positive"])
  assert f"classify: {len(dev)} lines in " in caplog.text  # The summary (workdir/progress.py).
  lines = out.getvalue().splitlines()
  assert len(lines) == len(dev) == len(predictions)
  for line, (label, probability) in zip(lines, predictions):
    assert line == f"{label}\t{probability:.4f}\t{['negative', 'positive'][label]}"
    assert 0.5 <= probability <= 1.0  # The argmax of two classes.
  correct = sum(label == gold for (label, _), (_, gold) in zip(predictions, dev))
  # The same texts encoded as the pipeline encodes them: the same accuracy.
  assert correct / len(dev) == pytest.approx(record["metrics"]["accuracy"])
  # And the same probabilities: two classes, so p(gold) is p or 1 - p; its mean NLL is
  # evaluate's loss (a different encoding, [bos]/[eos] or truncation, would move it).
  nll = [-math.log(p if label == gold else 1.0 - p)
         for (label, p), (_, gold) in zip(predictions, dev)]
  assert sum(nll) / len(nll) == pytest.approx(record["metrics"]["loss"], rel=1e-4)


def test_classify_refuses_other_models_and_wrong_class_names(classifier):
  workdir, _ = classifier
  with pytest.raises(ConfigError, match=r"--class_names lists 3 names but the model has "
                     r"model\.num_classes=2"):
    classify.classify(workdir, stdin=io.StringIO("x\n"), stdout=io.StringIO(),
                      class_names=["a", "b", "c"])
