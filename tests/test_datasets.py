"""Every dataset family trains: TFDS catalog names (mock data), local files, tokenizers, checks.

Catalog datasets are never downloaded here: `tfds.testing.mock_data` serves random
examples with the real features (glue/sst2's sentence/label/idx, wmt14's de/en, ...).
"""

from __future__ import annotations

import json
import os
import shutil
from unittest import mock

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import base
from transformer.config.errors import ConfigError, DataError
from transformer.data import classification
from transformer.data import seq2seq
from transformer.data import sources
from transformer.data.datasets import catalog
from transformer.data.tokenizers import run_vocabulary
from transformer.data.tokenizers import vocabularies
from transformer.training import loop
from transformer.workdir import layout
from tiny import subprocess_env

BYTES = vocabularies.ByteTokenizer()


def tiny(config, data_dir, **data):
  """Shrinks any config to a 2-layer, 32-wide model that trains 4 steps in seconds."""
  config.model.update(d_model=32, num_layers=2, num_decoder_layers=0, num_heads=2, mlp_dim=64,
                      max_len=32, vocab_size=0, embed_dropout=0.0, residual_dropout=0.0,
                      attention_dropout=0.0, attention_impl="xla")
  config.data.update(data_dir=data_dir, seq_len=32, batch_size=8, num_threads=1, **data)
  config.optimizer.update(schedule="warmup_rsqrt", warmup_steps=2, learning_rate=3e-3)
  config.train.update(num_steps=4, log_every=1, eval_every=2, eval_batches=2,
                      eval_at_start=True, steps_per_call=1)
  config.checkpoint.update(every=2, keep=2)
  return config


def rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


# ---------------------------------------------------------------- TFDS catalog, mocked


@pytest.fixture
def mocked_catalog():
  """mock_data serves examples; prepared splits are reported as train/validation/test."""
  splits = {name: object() for name in ("train", "validation", "test")}
  with tfds.testing.mock_data(num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE), \
       mock.patch.object(tfds.core.DatasetInfo, "splits", new_callable=mock.PropertyMock,
                         return_value=splits):
    yield


@pytest.mark.parametrize("name,arch,head,data", [
    ("glue/sst2", "encoder", "classification",
     dict(text_key="sentence", label_key="label", tokenizer="bytes")),
    ("imdb_reviews", "decoder", "classification",
     dict(text_key="text", label_key="label", tokenizer="char", eval_split="test")),
    ("wmt14_translate/de-en", "encoder_decoder", "lm",
     dict(source_language="en", target_language="de", tokenizer="sentencepiece",
          spm_vocab_size=320, spm_model_type="bpe")),
    ("wmt17_translate/de-en", "encoder_decoder", "lm",
     dict(source_language="de", target_language="en", tokenizer="bytes", packing="pad")),
    ("tiny_shakespeare", "decoder", "lm", dict(tokenizer="char", shuffle_rows=8)),
    ("lm1b", "encoder", "mlm", dict(tokenizer="bytes", eval_split="test")),
])
def test_catalog_datasets_train(mocked_catalog, tmp_path, name, arch, head, data):
  config = tiny(base.get_config(), str(tmp_path / "tfds"), name=name, download=True, **data)
  config.model.update(arch=arch, head=head, pooling="mean" if head == "classification" else "")
  result = loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert np.isfinite(result["eval_loss"])
  assert [r["step"] for r in rows(str(tmp_path / "run")) if "eval_loss" in r] == [0, 2, 4]
  with open(tmp_path / "run" / "config.json", encoding="utf-8") as f:
    assert json.load(f)["model"]["vocab_size"] % run_vocabulary.VOCAB_MULTIPLE == 0  # Resolved.


def test_class_count_must_match_the_dataset(mocked_catalog, tmp_path):
  config = tiny(base.get_config(), str(tmp_path), name="glue/sst2", text_key="sentence",
                label_key="label", tokenizer="bytes", download=True)
  config.model.update(arch="encoder", head="classification", pooling="cls", num_classes=3)
  with pytest.raises(ConfigError, match=r"config\.model\.num_classes=3 does not match "
                     r"glue/sst2, whose 'label' has 2 classes"):
    loop.train_and_evaluate(config, str(tmp_path / "run"))


def test_missing_language_lists_the_features(mocked_catalog, tmp_path):
  config = tiny(base.get_config(), str(tmp_path), name="wmt14_translate/de-en",
                source_language="en", target_language="fr", tokenizer="bytes", download=True)
  config.model.update(arch="encoder_decoder")
  with pytest.raises(ConfigError, match=r"config\.data\.target_language='fr' is not a feature "
                     r"of wmt14_translate/de-en; its features are \['de', 'en'\]"):
    loop.train_and_evaluate(config, str(tmp_path / "run"))


def test_translation_needs_an_objective_that_reads_pairs(mocked_catalog, tmp_path):
  config = tiny(base.get_config(), str(tmp_path), name="wmt14_translate/de-en",
                source_language="en", target_language="de", tokenizer="bytes", download=True)
  with pytest.raises(ConfigError, match=r"which the objectives \['seq2seq', 'prefix_lm'\] "
                     r"train on, not the causal_lm objective"):
    loop.train_and_evaluate(config, str(tmp_path / "run"))


def test_failed_download_says_how_to_prepare(tmp_path):
  data = base.get_config().data
  data.update(name="tiny_shakespeare", data_dir=str(tmp_path), download=True)
  with mock.patch.object(tfds.core.DatasetBuilder, "download_and_prepare",
                         side_effect=OSError("[Errno -3] Temporary failure in name resolution")):
    with pytest.raises(ConfigError, match=r"preparing it in .* failed \(OSError: .*name "
                       r"resolution\)\. Prepare it once on a machine with network") as error:
      catalog.load_builder(data)
  assert "downloads/manual" in str(error.value)


def test_unprepared_dataset_names_command_and_data_dir(tmp_path):
  data = base.get_config().data
  data.update(name="tiny_shakespeare", data_dir=str(tmp_path), download=False)
  with pytest.raises(ConfigError, match=r"not prepared in .*download_and_prepare\("
                     r"file_format='array_record'\)") as error:
    catalog.load_builder(data)
  assert str(tmp_path) in str(error.value)


# ---------------------------------------------------------------- tokenizers


def test_char_tokenizer_vocabulary_is_the_training_characters(tmp_path):
  tok = vocabularies.build_char_vocabulary(["hello", "world!"], str(tmp_path / "chars.json"))
  assert tok.chars == "!dehlorw"
  assert tok.vocab_size == vocabularies.NUM_SPECIAL + 1 + 8
  ids = tok.encode("hello?")
  assert ids[-1] == vocabularies.UNK_ID  # Unseen character.
  assert (ids[:-1] > tok.mask_id).all()
  assert tok.decode(ids) == "hello"  # Specials (unk) are dropped.
  assert vocabularies.CharTokenizer(str(tmp_path / "chars.json")).encode("dew").tolist() == \
      tok.encode("dew").tolist()


def test_joint_sentencepiece_covers_both_languages(tmp_path):
  english = ["the cat sits on the mat", "a dog runs in the park"] * 50
  german = ["die Katze sitzt auf der Matte", "ein Hund läuft im Park"] * 50
  tok = vocabularies.train_sentencepiece(english + german, 340, str(tmp_path / "joint.model"),
                                       1000, model_type="bpe")
  for text in (english[0], german[1]):
    ids = tok.encode(text)
    assert vocabularies.UNK_ID not in ids.tolist()
    assert tok.decode(ids) == text
  # Both languages got multi-character pieces from the one shared vocabulary.
  assert len(tok.encode("Katze")) < 5 and len(tok.encode(" park")) < 4


def test_tokenizer_cache_name_holds_what_changes_it():
  config = base.get_config()
  config.data.update(tokenizer="sentencepiece", spm_model_type="bpe", spm_vocab_size=8000)
  name = run_vocabulary.cache_name(config, ("en", "de"))
  assert name.startswith("spm3_bpe_train_en+de_v8000_")
  config.data.spm_train_sentences = 10
  assert run_vocabulary.cache_name(config, ("en", "de")) != name


def test_vocab_size_zero_rounds_the_tokenizer_up():
  config = base.get_config()
  config.model.vocab_size = 0
  assert run_vocabulary.resolved_vocab_size(config, BYTES) == 384  # 261 -> 384.
  config.model.vocab_size = 300
  assert run_vocabulary.resolved_vocab_size(config, BYTES) == 300


def test_model_vocabulary_smaller_than_the_tokenizer_names_both(tiny_config, tmp_path):
  tiny_config.model.vocab_size = 200
  with pytest.raises(ConfigError, match=r"config\.model\.vocab_size=200 is smaller than the "
                     r"bytes tokenizer's vocabulary \(261\); expected >= 261, or 0"):
    loop.train_and_evaluate(tiny_config, str(tmp_path / "run"))


# ---------------------------------------------------------------- length policy and packing


def test_overlong_examples_are_truncated_or_dropped_and_counted():
  examples = [{"text": "x" * n, "label": 0} for n in (3, 40, 5, 50)]
  kept = {}
  for policy in ("truncate", "drop"):
    ds = classification.make_classification_dataset(
        examples, BYTES, text_key="text", label_key="label", num_classes=2,
        vocab_size=BYTES.vocab_size, seq_len=10, batch_size=4, seed=0, train=False,
        overlong=policy)
    batches = list(ds)
    kept[policy] = sum(len(b["label"]) for b in batches)
    lengths = sorted(int(s.sum()) for b in batches for s in b["segment_ids"])
    assert max(lengths) <= 10
  assert kept == {"truncate": 4, "drop": 2}


def test_pad_mode_puts_one_pair_per_row():
  pairs = [{"src": f"source {i}", "tgt": f"target {i}"} for i in range(6)]
  ds = seq2seq.make_seq2seq_dataset(
      pairs, BYTES, inputs_fn=seq2seq.translation_pairs("src", "tgt"),
      vocab_size=BYTES.vocab_size, source_len=16, target_len=16, batch_size=3, seed=0,
      train=False, packing_mode="pad")
  batches = list(ds)
  assert sum(len(b["inputs"]) for b in batches) == 6
  for batch in batches:
    assert set(np.unique(batch["inputs_segment_ids"]).tolist()) == {0, 1}
    for row, target in zip(batch["inputs"], batch["targets"]):
      assert BYTES.decode(row).startswith("source ")
      assert BYTES.decode(target).startswith("target ")
  packed = list(seq2seq.make_seq2seq_dataset(
      pairs, BYTES, inputs_fn=seq2seq.translation_pairs("src", "tgt"),
      vocab_size=BYTES.vocab_size, source_len=32, target_len=32, batch_size=3, seed=0,
      train=False, packing_mode="pack"))
  assert max(int(b["inputs_segment_ids"].max()) for b in packed) > 1  # Several per row.


def test_label_outside_the_classes_names_the_split():
  ds = classification.make_classification_dataset(
      [{"text": "a", "label": -1}], BYTES, text_key="text", label_key="label",
      num_classes=2, vocab_size=BYTES.vocab_size, seq_len=8, batch_size=1, seed=0,
      train=False, split="test")
  with pytest.raises(DataError, match=r"split 'test': label -1 is outside \[0, "
                     r"model\.num_classes=2\).*without labels"):
    next(iter(ds))


# ---------------------------------------------------------------- local files, end to end

SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "shared", "data")


def write_local_files(root) -> dict[str, str]:
  """Small files of each local family; returns data.name -> data.path."""
  words = ["the", "cat", "sees", "a", "dog", "and", "runs", "home", "fast", "slowly"]
  rng = np.random.default_rng(0)
  sentences = [" ".join(rng.choice(words, size=rng.integers(3, 9))) for _ in range(120)]
  (root / "text.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
  parallel = root / "parallel"
  parallel.mkdir()
  for split, part in (("train", sentences[:100]), ("val", sentences[100:])):
    (parallel / f"{split}.en").write_text("\n".join(part) + "\n", encoding="utf-8")
    (parallel / f"{split}.de").write_text("\n".join(s.upper() for s in part) + "\n",
                                          encoding="utf-8")
  tsv = root / "tsv"
  tsv.mkdir()
  for split, part in (("train", sentences[:100]), ("dev", sentences[100:])):
    lines = ["sentence\tlabel"] + [f"{s}\t{int('cat' in s)}" for s in part]
    (tsv / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
  return {"local_text": str(root / "text.txt"), "local_parallel": str(parallel),
          "local_tsv": str(tsv)}


LOCAL_CASES = {  # data.name -> (arch, head, data fields)
    "local_text": ("decoder", "lm", dict(tokenizer="char")),
    "local_parallel": ("encoder_decoder", "lm",
                       dict(source_language="en", target_language="de", tokenizer="bytes")),
    "local_tsv": ("encoder", "classification",
                  dict(text_key="sentence", label_key="label", tokenizer="bytes")),
}


@pytest.mark.parametrize("name", sorted(LOCAL_CASES))
def test_local_datasets_train(tmp_path, name):
  path = write_local_files(tmp_path)[name]
  arch, head, data = LOCAL_CASES[name]
  config = tiny(base.get_config(), str(tmp_path / "tfds"), name=name, path=path, **data)
  config.model.update(arch=arch, head=head, pooling="cls" if head == "classification" else "")
  result = loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert np.isfinite(result["eval_loss"]) and result["eval_tokens"] > 0


@pytest.mark.parametrize("name,relative", [
    ("local_text", "tiny_shakespeare/input.txt"),
    ("local_parallel", "multi30k"),
    ("local_tsv", "sst2"),
])
def test_local_datasets_train_on_shared_data(tmp_path_factory, name, relative):
  path = os.path.join(SHARED_DATA, relative)
  if not os.path.exists(path):
    pytest.skip(f"shared dataset not present: {path} (the repository never requires it)")
  arch, head, data = LOCAL_CASES[name]
  data_dir = str(tmp_path_factory.getbasetemp() / "shared_tfds")
  config = tiny(base.get_config(), data_dir, name=name, path=path, **data)
  config.model.update(arch=arch, head=head, pooling="cls" if head == "classification" else "")
  config.train.update(num_steps=2, eval_every=2, eval_batches=1)
  workdir = str(tmp_path_factory.mktemp("run"))
  result = loop.train_and_evaluate(config, workdir)
  assert np.isfinite(result["eval_loss"])


def test_masked_lm_then_init_from_classification(tmp_path):
  """BERT's workflow: MLM on the sentences of a TSV set, then fine-tune on its labels."""
  path = write_local_files(tmp_path)["local_tsv"]
  data_dir = str(tmp_path / "tfds")
  pretrain = tiny(base.get_config(), data_dir, name="local_tsv", path=path,
                  text_key="sentence", label_key="label", tokenizer="bytes")
  pretrain.model.update(arch="encoder", head="mlm")
  loop.train_and_evaluate(pretrain, str(tmp_path / "mlm"))

  finetune = tiny(base.get_config(), data_dir, name="local_tsv", path=path,
                  text_key="sentence", label_key="label", tokenizer="bytes")
  finetune.model.update(arch="encoder", head="classification", pooling="cls")
  finetune.init_from = str(tmp_path / "mlm")
  finetune.seed = 1  # Another init: without init_from the blocks would differ by ~0.1.
  finetune.train.update(num_steps=2, eval_every=2)
  result = loop.train_and_evaluate(finetune, str(tmp_path / "cls"))
  assert 0.0 <= result["eval_accuracy"] <= 1.0

  # The fine-tuned run started from the MLM encoder: its blocks moved from the MLM
  # values by only 2 steps of at most ~lr each, while a fresh init is far from them.
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  restore = lambda run, step: ocp.StandardCheckpointer().restore(
      str(tmp_path / run / "checkpoints" / str(step) / "state"))["params"]
  mlm, cls = restore("mlm", 4), restore("cls", 2)
  assert "mlm_bias" in mlm and "mlm_bias" not in cls and "classification_head" in cls
  kernel = ("block_0", "self_attention", "query", "kernel")
  get = lambda tree: np.asarray(tree[kernel[0]][kernel[1]][kernel[2]][kernel[3]])
  assert np.abs(get(cls) - get(mlm)).max() < 0.02
  assert np.abs(get(mlm)).max() > 0.02  # Not trivially small weights.


def test_launch_reports_a_data_mistake_without_traceback(tmp_path):
  """A user error through launch.py: exit 2, the key named, no Python traceback."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  result = subprocess.run(
      [sys.executable, os.path.join(root, "launch.py"),
       "--config=configs/shakespeare_char.py:cpu", f"--config.data.path={tmp_path}/missing.txt",
       f"--config.data.data_dir={tmp_path}/tfds", f"--workdir={tmp_path}/run"],
      cwd=root, capture_output=True, text=True, timeout=300, check=False,
      env=subprocess_env())
  assert result.returncode == 2, result.stderr[-2000:]
  assert "config.data.path=" in result.stderr and "missing.txt" in result.stderr
  assert "Traceback" not in result.stderr


def test_init_from_keeps_the_source_runs_vocabulary(tmp_path):
  """A fine-tune reads the source run's vocabulary: trained on another text, its own
  character vocabulary would give the same embedding shape (128) other meanings."""
  path = write_local_files(tmp_path)["local_text"]
  data_dir = str(tmp_path / "tfds")
  first = tiny(base.get_config(), data_dir, name="local_text", path=path, tokenizer="char")
  first.train.update(num_steps=2, eval_every=2)
  loop.train_and_evaluate(first, str(tmp_path / "a"))
  record = lambda run: json.loads((tmp_path / run / layout.TOKENIZER_RECORD).read_text())
  assert record("a")["kind"] == "char" and len(record("a")["sha256"]) == 64
  assert (tmp_path / "a" / record("a")["file"]).exists()  # The vocabulary travels with the run.

  (tmp_path / "other.txt").write_text("XYZ xyz 0123456789\n" * 200, encoding="utf-8")
  second = tiny(base.get_config(), data_dir, name="local_text",
                path=str(tmp_path / "other.txt"), tokenizer="bytes")
  second.init_from = str(tmp_path / "a" / "checkpoints" / "2")
  second.train.update(num_steps=2, eval_every=2)
  loop.train_and_evaluate(second, str(tmp_path / "b"))
  assert record("b") == record("a")  # Not the bytes tokenizer the config names.
  second.train.num_steps = 3  # Resuming the fine-tune reads its own copy.
  loop.train_and_evaluate(second, str(tmp_path / "b"))
  assert record("b") == record("a")
  # Each run's dataset.json holds the identity of the vocabulary it trained with ...
  identity = {k: v for k, v in record("a").items() if k != "file"}
  for run in ("a", "b"):
    assert json.loads((tmp_path / run / layout.DATASET_RECORD).read_text())["tokenizer"] == identity

  # ... so another character run's pair copied over a's (it fits model.vocab_size) is
  # refused by every command that reads a's vocabulary: resume, init_from, the modes.
  other = tmp_path / "other_run"
  run_vocabulary.save_tokenizer(str(other), vocabularies.build_char_vocabulary(
      ["XYZ xyz 0123456789\n"], str(tmp_path / record("a")["file"])))
  for name in (layout.TOKENIZER_RECORD, record("a")["file"]):
    shutil.copy(other / name, tmp_path / "a" / name)
  replaced = r"a/tokenizer.json names a char vocabulary of 23 ids.*the tokenizer files were replaced"
  first.train.num_steps = 3
  with pytest.raises(ConfigError, match=replaced):
    loop.train_and_evaluate(first, str(tmp_path / "a"))
  second.init_from = str(tmp_path / "a")
  with pytest.raises(ConfigError, match=replaced):
    loop.train_and_evaluate(second, str(tmp_path / "c"))
  from transformer.inference import loaded  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=replaced):
    loaded.load_run(str(tmp_path / "a"))


def test_a_run_without_a_recorded_vocabulary_identity_is_read_and_said_once(tmp_path, caplog):
  """A run whose dataset.json predates the tokenizer's identity (or has no dataset.json,
  as an import) is read as its tokenizer.json says, in one line; when it has one, a
  vocabulary pair from another run is refused naming both."""
  run = tmp_path / "run"
  vocabulary = vocabularies.build_char_vocabulary(["abc"], str(tmp_path / "chars.json"))
  run_vocabulary.save_tokenizer(str(run), vocabulary)
  sources.save_dataset_record(str(run), {"name": "local_text/x/1.0.0"})
  with caplog.at_level("INFO"):
    assert run_vocabulary.load_workdir_tokenizer(str(run)).vocab_size == vocabulary.vocab_size
  assert [r.getMessage() for r in caplog.records if "identity" in r.getMessage()] == [
      f"{run}/dataset.json records no tokenizer identity (written before it was kept, or "
      "absent): tokenizer.json is used unchecked; resuming the run records it"]
  sources.save_dataset_record(str(run), {"name": "local_text/x/1.0.0", "tokenizer":
                                         run_vocabulary.tokenizer_identity(vocabulary)})
  assert run_vocabulary.load_workdir_tokenizer(str(run)).vocab_size == vocabulary.vocab_size
  run_vocabulary.save_tokenizer(str(run), vocabularies.build_char_vocabulary(
      ["xyz"], str(tmp_path / "other" / "chars.json")))
  with pytest.raises(ConfigError, match=(
      r"^.*run/tokenizer.json names a char vocabulary of 8 ids, sha256 [0-9a-f]{16} "
      r"\(chars.json\), but the run trained with a char vocabulary of 8 ids, sha256 "
      r"[0-9a-f]{16} \(.*run/dataset.json\): the tokenizer files were replaced; restore")):
    run_vocabulary.load_workdir_tokenizer(str(run))


def test_too_small_sentencepiece_vocabulary_is_named(tmp_path):
  path = write_local_files(tmp_path)["local_text"]
  config = tiny(base.get_config(), str(tmp_path / "tfds"), name="local_text", path=path,
                tokenizer="sentencepiece", spm_vocab_size=100)
  with pytest.raises(ConfigError, match=r"config\.data\.spm_vocab_size=100 is too small for "
                     r"SentencePiece: it needs >= 300"):
    loop.train_and_evaluate(config, str(tmp_path / "run"))


def test_a_vocabulary_swapped_with_its_record_is_refused_against_config_json(tmp_path):
  """Issue 42: another run's tokenizer.json and SentencePiece model copied in together
  agree by sha256; config.json's data.spm_vocab_size (and data.tokenizer) do not."""

  rng = np.random.default_rng(0)  # Varied words: enough pieces for 330.
  lines = [" ".join("".join(rng.choice(list("abcdefghijklmnop"), 4)) for _ in range(12))
           for _ in range(800)]
  run, other = tmp_path / "run", tmp_path / "other"
  for folder, size in ((run, 320), (other, 330)):
    folder.mkdir()
    model = vocabularies.train_sentencepiece(iter(lines), size, str(tmp_path / f"{size}.model"),
                                           max_sentences=1000)
    run_vocabulary.save_tokenizer(str(folder), model)
  config = base.get_config()
  config.data.update(tokenizer="sentencepiece", spm_vocab_size=320, spm_train_sentences=1000)
  config.model.vocab_size = 384
  (run / "config.json").write_text(config.to_json_best_effort(), encoding="utf-8")
  assert run_vocabulary.load_workdir_tokenizer(str(run)).vocab_size == 320
  for name in ("tokenizer.json", "330.model"):  # The other run's pair, copied in together.
    shutil.copy(other / name, run / name)
  with pytest.raises(ConfigError, match=(
      r"run/tokenizer.json names a SentencePiece model built with data.spm_vocab_size=330 "
      r"\(config.json: 320\): it is not this run's vocabulary; restore this run's own")):
    run_vocabulary.load_workdir_tokenizer(str(run))
  config.data.tokenizer = "char"  # A config.json of another kind: the kind is named.
  (run / "config.json").write_text(config.to_json_best_effort(), encoding="utf-8")
  with pytest.raises(ConfigError, match=r"names a sentencepiece vocabulary, but .*config.json "
                                        r"has data.tokenizer='char'"):
    run_vocabulary.load_workdir_tokenizer(str(run))
  config.data.tokenizer, config.model.vocab_size = "sentencepiece", 300  # No room for 330.
  (run / "config.json").write_text(config.to_json_best_effort(), encoding="utf-8")
  with pytest.raises(ConfigError, match=r"vocabulary of 330 ids, but .*config.json has "
                                        r"model.vocab_size=300"):
    run_vocabulary.load_workdir_tokenizer(str(run))
