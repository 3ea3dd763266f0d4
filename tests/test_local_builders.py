"""Tests of the `local_text`, `local_parallel` and `local_tsv` builders.

Small files written to `tmp_path` cover splitting, caching and every bad input; the
last tests build the real corpora in ../shared/data when they are present (and skip,
naming the path, when not: the builders never need them).
"""

from __future__ import annotations

import logging
import os
import random

import grain
import pytest

from configs import base
from transformer.config.errors import ConfigError
from transformer.config.errors import DataError
from transformer.data.datasets import local_parallel
from transformer.data.datasets import local_text
from transformer.data.datasets import local_tsv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


def make_data(data_dir, path, **overrides):
  """config.data for `path`, preparing into `data_dir` (never ~/tensorflow_datasets)."""
  data = base.get_config().data
  data.path = str(path)
  data.data_dir = str(data_dir)
  data.update(overrides)
  return data


def build(module, data):
  """The sequence the catalog runs: make the builder, prepare it once as array_record."""
  builder = module.make_builder(data)
  if not builder.is_prepared():
    builder.download_and_prepare(file_format="array_record")
  return builder


def read(builder, split):
  """The examples of a split, in order, through the random-access source grain reads."""
  source = builder.as_data_source(split=split)
  return [{k: v.decode("utf-8") if isinstance(v, bytes) else int(v)
           for k, v in source[i].items()} for i in range(len(source))]


def write(path, content):
  path.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(content, str):
    content = content.encode("utf-8")
  path.write_bytes(content)
  return path


def sample_text(num_lines, seed=0):
  """Lines of 0 to ~300 characters, some non-ASCII, some empty."""
  rng = random.Random(seed)
  words = "lorem ipsum dolor sit amet é 日本".split()
  return "".join(" ".join(words[:rng.randint(0, 7)]) * rng.randint(1, 9) + "\n"
                 for _ in range(num_lines))


# ---------------------------------------------------------------- local_text


def test_text_blocks_pack_whole_lines_up_to_the_limit():
  assert list(local_text.text_blocks("ab\ncd\nef\n", max_chars=6)) == ["ab\ncd\n", "ef\n"]
  assert list(local_text.text_blocks("ab\ncde\nf", max_chars=6)) == ["ab\n", "cde\nf"]
  assert list(local_text.text_blocks("abcdefgh\nij\n", max_chars=3)) == [
      "abc", "def", "gh\n", "ij\n"]


def test_text_blocks_are_whole_lines_that_concatenate_to_the_text():
  text = sample_text(2000) + "x" * 5000 + "\nlast line without newline"
  blocks = list(local_text.text_blocks(text))
  assert "".join(blocks) == text
  assert max(map(len, blocks)) <= local_text.BLOCK_CHARS
  short = [b for b in blocks if "x" * 100 not in b]
  assert len(short) > 10
  for block, following in zip(blocks, blocks[1:]):
    if block in short and following in short:
      # Greedy: a block ends at a newline, and the next line would not have fit.
      assert block.endswith("\n")
      assert len(block) + len(following.split("\n")[0]) + 1 > local_text.BLOCK_CHARS
  assert ["x" * 2048, "x" * 2048] == [b for b in blocks if b == "x" * 2048]


def test_text_one_file_is_split_by_position_like_nanogpt(tmp_path):
  text = sample_text(3000)
  # Named like a split on purpose: one file is always split by position.
  path = write(tmp_path / "in" / "train.txt", text)
  builder = build(local_text, make_data(tmp_path / "tfds", path, val_fraction=0.25))
  assert set(builder.info.features) == {"text", "starts_document", "ends_document"}
  assert set(builder.info.splits) == {"train", "validation"}
  cut = int(len(text) * 0.75)
  train, validation = read(builder, "train"), read(builder, "validation")
  assert "".join(e["text"] for e in train) == text[:cut]
  assert "".join(e["text"] for e in validation) == text[cut:]
  assert len(train) > 10 and len(validation) > 3
  # Each split's part of the file is one document cut into blocks.
  for examples in (train, validation):
    assert [e["starts_document"] for e in examples] == [1] + [0] * (len(examples) - 1)
    assert [e["ends_document"] for e in examples] == [0] * (len(examples) - 1) + [1]
  assert builder.info.splits["train"].num_examples == len(train)
  metadata = builder.info.metadata
  assert metadata["source_path"] == str(path)
  assert metadata["files"][0]["path"] == "train.txt"
  assert metadata["splits"]["train"]["characters"] == cut


def test_text_folder_with_split_names(tmp_path):
  files = {"train_a.txt": "alpha\nbeta\n", "more/train_b.txt": "gamma\n",
           "valid.txt": "delta\n", "dev_extra.txt": "epsilon\n", "test.txt": "zeta\n",
           ".hidden.txt": "never\n", ".git/train.txt": "never\n"}
  for name, text in files.items():
    write(tmp_path / "corpus" / name, text)
  builder = build(local_text, make_data(tmp_path / "tfds", tmp_path / "corpus"))
  assert set(builder.info.splits) == {"train", "validation", "test"}
  joined = {s: "".join(e["text"] for e in read(builder, s)) for s in builder.info.splits}
  # Sorted relative paths: "more/train_b.txt" < "train_a.txt"; dev_extra < valid.
  assert joined == {"train": "gamma\nalpha\nbeta\n", "validation": "epsilon\ndelta\n",
                    "test": "zeta\n"}
  # Every file fits in one block, so each example is a whole document.
  assert all(e["starts_document"] == e["ends_document"] == 1
             for s in builder.info.splits for e in read(builder, s))
  assert len(builder.info.metadata["files"]) == 5  # Hidden files are not inputs.


def test_text_folder_without_split_names_splits_every_file_by_position(tmp_path):
  a, c = sample_text(400, seed=1), sample_text(300, seed=2)
  write(tmp_path / "corpus" / "a.txt", a)
  write(tmp_path / "corpus" / "b" / "c.md", c)
  builder = build(local_text, make_data(tmp_path / "tfds", tmp_path / "corpus"))
  train = "".join(e["text"] for e in read(builder, "train"))
  validation = "".join(e["text"] for e in read(builder, "validation"))
  cut_a, cut_c = int(len(a) * 0.9), int(len(c) * 0.9)
  assert train == a[:cut_a] + c[:cut_c]
  assert validation == a[cut_a:] + c[cut_c:]


def test_text_config_errors(tmp_path):
  tfds_dir = tmp_path / "tfds"
  with pytest.raises(ConfigError, match=r"config\.data\.path='' .*set config\.data\.path"):
    local_text.make_builder(make_data(tfds_dir, ""))
  with pytest.raises(ConfigError, match=r"nowhere.*no such file or folder"):
    local_text.make_builder(make_data(tfds_dir, tmp_path / "nowhere"))
  (tmp_path / "empty_dir").mkdir()
  with pytest.raises(ConfigError, match=r"empty_dir holds no"):
    local_text.make_builder(make_data(tfds_dir, tmp_path / "empty_dir"))
  path = write(tmp_path / "one.txt", "text\n")
  with pytest.raises(ConfigError, match=r"decode_errors='ignore'.*'strict', 'replace'"):
    local_text.make_builder(make_data(tfds_dir, path, decode_errors="ignore"))
  with pytest.raises(ConfigError, match=r"val_fraction=0\.0 .*one\.txt by position.*\(0, 1\)"):
    local_text.make_builder(make_data(tfds_dir, path, val_fraction=0.0))
  write(tmp_path / "mixed" / "train.txt", "a\n")
  write(tmp_path / "mixed" / "notes.txt", "b\n")
  with pytest.raises(ConfigError, match=r"these are not: notes\.txt"):
    local_text.make_builder(make_data(tfds_dir, tmp_path / "mixed"))


def test_text_empty_file_and_empty_split_are_data_errors(tmp_path):
  write(tmp_path / "corpus" / "a.txt", "some text\n")
  write(tmp_path / "corpus" / "b.txt", "")
  with pytest.raises(DataError, match=r"corpus/b\.txt: the file is empty"):
    build(local_text, make_data(tmp_path / "tfds", tmp_path / "corpus"))
  # 5 characters: int(5 * 0.9) = 4 for train, 1 for validation; 1 character: no train.
  tiny = write(tmp_path / "tiny.txt", "x")
  with pytest.raises(DataError, match=r"split 'train' is empty: .*tiny\.txt"):
    build(local_text, make_data(tmp_path / "tfds", tiny))


def test_text_same_files_reuse_the_build_and_edits_rebuild(tmp_path):
  path = write(tmp_path / "Tiny Corpus.txt", sample_text(200))
  data = make_data(tmp_path / "tfds", path)
  first = build(local_text, data)
  name = first.builder_config.name
  assert name.startswith("tiny_corpus_txt_") and len(name) == len("tiny_corpus_txt_") + 12
  record = next(p for p in os.listdir(first.data_dir) if "train.array_record" in p)
  mtime = os.path.getmtime(os.path.join(first.data_dir, record))

  again = local_text.make_builder(data)
  assert again.is_prepared()
  assert again.builder_config.name == name and str(again.data_dir) == str(first.data_dir)
  again.download_and_prepare(file_format="array_record")  # Must reuse, not rewrite.
  assert os.path.getmtime(os.path.join(first.data_dir, record)) == mtime

  write(path, sample_text(200) + "one more line\n")
  edited = local_text.make_builder(data)
  assert edited.builder_config.name != name and not edited.is_prepared()
  data.val_fraction = 0.2  # Changes a positional split, so it changes the name.
  assert local_text.make_builder(data).builder_config.name != edited.builder_config.name


def test_decode_errors_strict_names_the_place_and_replace_decodes(tmp_path, caplog):
  # 4 undecodable bytes: two lone ones at offset 12, then a truncated 3-byte sequence.
  raw = b"ok\nline two \xff\xfe here\n\xe6\x97\nend\n"
  path = write(tmp_path / "bad.txt", raw)
  with pytest.raises(DataError, match=r"bad\.txt:2: undecodable UTF-8 at byte offset 12 "
                     r".*4 undecodable bytes in total.*decode_errors='replace'"):
    build(local_text, make_data(tmp_path / "tfds", path))
  caplog.set_level(logging.WARNING)
  builder = build(local_text, make_data(tmp_path / "tfds", path, decode_errors="replace"))
  text = "".join(e["text"] for s in ("train", "validation") for e in read(builder, s))
  assert text == raw.decode("utf-8", "replace") == "ok\nline two \ufffd\ufffd here\n\ufffd\nend\n"
  assert "bad.txt: 4 undecodable bytes decoded as U+FFFD (first at line 2" in caplog.text


# ---------------------------------------------------------------- local_parallel


def write_parallel(folder, files):
  for name, lines in files.items():
    write(folder / name, "".join(line + "\n" for line in lines))
  return folder


def test_parallel_splits_languages_and_dropped_pairs(tmp_path, caplog):
  folder = write_parallel(tmp_path / "m30k", {
      "train.en": ["A dog .", "  spaced  ", "", "Front stroke.", "Two", "Three"],
      "train.de": ["Ein Hund .", " gesperrt ", "leer", "@@", " \t", "Drei"],
      "val.en": ["one"], "val.de": ["eins"],
      "test_2016_flickr.en": ["x", "y"], "test_2016_flickr.de": ["X", "Y"],
  })
  write(folder / "README.md", "not a language\n")
  caplog.set_level(logging.WARNING)
  builder = build(local_parallel, make_data(tmp_path / "tfds", folder))
  assert set(builder.info.features) == {"de", "en"}
  assert set(builder.info.splits) == {"train", "validation", "test_2016_flickr"}
  assert read(builder, "train") == [
      {"en": "A dog .", "de": "Ein Hund ."}, {"en": "  spaced  ", "de": " gesperrt "},
      {"en": "Front stroke.", "de": "@@"}, {"en": "Three", "de": "Drei"}]
  assert read(builder, "validation") == [{"en": "one", "de": "eins"}]
  assert len(read(builder, "test_2016_flickr")) == 2
  assert builder.info.metadata["splits"]["train"]["dropped_empty"] == 2
  assert "dropped 2 pairs" in caplog.text
  assert f"{folder}/train.en:3 (en empty), {folder}/train.de:5 (de empty)" in caplog.text
  assert "README.md" in caplog.text  # Ignored files are named, not silently skipped.


def test_parallel_reads_back_through_grain(tmp_path):
  folder = write_parallel(tmp_path / "p", {"train.en": [f"s{i}" for i in range(20)],
                                           "train.fr": [f"p{i}" for i in range(20)]})
  builder = build(local_parallel, make_data(tmp_path / "tfds", folder))
  dataset = grain.MapDataset.source(builder.as_data_source(split="train")).shuffle(seed=0)
  pairs = sorted((e["en"].decode(), e["fr"].decode()) for e in dataset)
  assert pairs == sorted((f"s{i}", f"p{i}") for i in range(20))


def test_parallel_strips_only_the_newline(tmp_path):
  folder = tmp_path / "crlf"
  write(folder / "train.en", "one \r\n\ttwo\r\nthree")  # CRLF, no final newline.
  write(folder / "train.de", " eins\r\nzwei \r\ndrei\n")
  builder = build(local_parallel, make_data(tmp_path / "tfds", folder))
  assert read(builder, "train") == [{"en": "one ", "de": " eins"},
                                    {"en": "\ttwo", "de": "zwei "},
                                    {"en": "three", "de": "drei"}]


def test_parallel_line_count_mismatch_names_both_files(tmp_path):
  folder = write_parallel(tmp_path / "p", {"train.en": ["a", "b", "c"], "train.de": ["a", "b"]})
  with pytest.raises(DataError, match=r"p/train\.de has 2 lines but .*p/train\.en has 3"):
    build(local_parallel, make_data(tmp_path / "tfds", folder))


@pytest.mark.parametrize("files, match", [
    ({"train.en": ["a"], "train.de": ["b"], "val.en": ["c"]},
     r"same two or more languages.*found train: \['de', 'en'\]; validation: \['en'\]"),
    ({"val.en": ["a"], "val.de": ["b"]}, r"with a train split.*found validation"),
    ({"train.en": ["a"]}, r"found train: \['en'\]"),
    ({"train.en": ["a"], "train.de": ["b"], "test-2016.en": ["c"]},
     r"test-2016\.en: the file's stem 'test-2016' .*letters, digits and '_'"),
    ({"train.en": ["a"], "train.de": ["b"], "val.en": ["c"], "dev.en": ["d"]},
     r"dev\.en and val\.en are both the 'en' side of split 'validation'"),
])
def test_parallel_config_errors(tmp_path, files, match):
  folder = write_parallel(tmp_path / "p", files)
  with pytest.raises(ConfigError, match=match):
    local_parallel.make_builder(make_data(tmp_path / "tfds", folder))


def test_parallel_needs_a_folder(tmp_path):
  path = write(tmp_path / "train.en", "a\n")
  with pytest.raises(ConfigError, match=r"train\.en' is invalid: local_parallel needs a "
                     r"folder.*not a file"):
    local_parallel.make_builder(make_data(tmp_path / "tfds", path))


# ---------------------------------------------------------------- local_tsv


def test_tsv_glue_folder(tmp_path, caplog):
  folder = tmp_path / "glue"
  write(folder / "train.tsv", 'sentence\tlabel\nit \'s "great" \t1\nawful \t0\n\nfine \t1\n')
  write(folder / "dev.tsv", "sentence\tlabel\nok \t0\n")
  write(folder / "test.tsv", "index\tsentence\n0\tunlabelled \n")
  caplog.set_level(logging.WARNING)
  builder = build(local_tsv, make_data(tmp_path / "tfds", folder, text_key="sentence",
                                       label_key="label"))
  assert set(builder.info.splits) == {"train", "validation"}
  assert set(builder.info.features) == {"sentence", "label"}
  assert builder.info.features["label"].names == ["0", "1"]
  assert read(builder, "train") == [{"sentence": 'it \'s "great" ', "label": 1},
                                    {"sentence": "awful ", "label": 0},
                                    {"sentence": "fine ", "label": 1}]
  assert read(builder, "validation") == [{"sentence": "ok ", "label": 0}]
  assert f"{folder}/test.tsv has no 'label' column" in caplog.text
  assert f"dropped 1 blank lines; first at {folder}/train.tsv:4" in caplog.text


def test_tsv_one_csv_file_by_index_with_alphabetical_labels(tmp_path):
  path = write(tmp_path / "reviews.csv", 'pos,"good, really"\nneg,bad\npos,"two\nlines"\n')
  builder = build(local_tsv, make_data(tmp_path / "tfds", path, text_key="1", label_key="0"))
  assert set(builder.info.splits) == {"train"}
  assert builder.info.features["0"].names == ["neg", "pos"]
  assert read(builder, "train") == [{"1": "good, really", "0": 1}, {"1": "bad", "0": 0},
                                    {"1": "two\nlines", "0": 1}]


def test_tsv_integer_labels_sort_numerically_and_must_be_0_to_k_minus_1(tmp_path):
  rows = "".join(f"text {i}\t{i % 11}\n" for i in range(30))
  path = write(tmp_path / "eleven.tsv", "text\tlabel\n" + rows)
  builder = local_tsv.make_builder(make_data(tmp_path / "tfds", path, label_key="label"))
  assert builder.info.features["label"].names == [str(i) for i in range(11)]
  path = write(tmp_path / "one_based.tsv", "text\tlabel\na\t1\nb\t2\nc\t1\n")
  with pytest.raises(DataError, match=r"one_based\.tsv:3: label '2' is out of range.*0\.\.1"):
    local_tsv.make_builder(make_data(tmp_path / "tfds", path, label_key="label"))


@pytest.mark.parametrize("train, dev, match", [
    ("text\tlabel\na\t0\nb\t1\tx\n", None, r"train\.tsv:3: the row has 3 cells, expected 2"),
    ("text\tlabel\na\t0\n\t1\n", None, r"train\.tsv:3: the 'text' cell .*is empty"),
    ("text\tlabel\na\t0\nb\t \n", None, r"train\.tsv:3: the 'label' cell .*is empty"),
    ("text\tlabel\na\t0\nb\t1\n", "text\tlabel\nc\t1\nd\t2\n",
     r"dev\.tsv:3: label '2' in column 'label' is not a label of the train split; "
     r"valid: \['0', '1'\]"),
    ("text\tlabel\n", None, r"train\.tsv: the train split has no rows"),
    ("", None, r"train\.tsv: the file is empty"),
])
def test_tsv_data_errors_name_file_and_line(tmp_path, train, dev, match):
  write(tmp_path / "d" / "train.tsv", train)
  if dev is not None:
    write(tmp_path / "d" / "dev.tsv", dev)
  with pytest.raises(DataError, match=match):
    build(local_tsv, make_data(tmp_path / "tfds", tmp_path / "d", label_key="label"))


def test_tsv_config_errors(tmp_path):
  path = write(tmp_path / "d" / "train.tsv", "sentence\tlabel\na\t0\n")
  tfds_dir = tmp_path / "tfds"
  with pytest.raises(ConfigError, match=r"label_key='' .*classification needs.*'label' for GLUE"):
    local_tsv.make_builder(make_data(tfds_dir, path))  # The base config's keys.
  with pytest.raises(ConfigError, match=r"text_key='text' and config\.data\.label_key='label' "
                     r"do not both name columns of .*train\.tsv: .*\['sentence', 'label'\]"):
    local_tsv.make_builder(make_data(tfds_dir, path, label_key="label"))
  with pytest.raises(ConfigError, match=r"label_key='5' is invalid: .*valid indices are 0\.\.1"):
    local_tsv.make_builder(make_data(tfds_dir, path, text_key="0", label_key="5"))
  with pytest.raises(ConfigError, match=r"needs a train\.tsv or train\.csv"):
    write(tmp_path / "e" / "dev.tsv", "sentence\tlabel\na\t0\n")
    local_tsv.make_builder(make_data(tfds_dir, tmp_path / "e", text_key="sentence",
                                     label_key="label"))


def test_tsv_caching_follows_keys_and_content(tmp_path):
  path = write(tmp_path / "train.tsv", "a\tb\nx\t0\ny\t1\n")
  data = make_data(tmp_path / "tfds", path, text_key="a", label_key="b")
  first = build(local_tsv, data)
  assert local_tsv.make_builder(data).is_prepared()
  swapped = local_tsv.make_builder(make_data(tmp_path / "tfds", path, text_key="b",
                                             label_key="a"))
  assert swapped.builder_config.name != first.builder_config.name


# ---------------------------------------------------------------- the real corpora


def shared_path(name):
  path = os.path.join(SHARED_DATA, name)
  if not os.path.exists(path):
    pytest.skip(f"shared data not present: {path}")
  return path


@pytest.fixture(scope="module")
def real_data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tfds_real")


@pytest.fixture(scope="module")
def tiny_shakespeare(real_data_dir):
  path = shared_path("tiny_shakespeare/input.txt")
  return path, build(local_text, make_data(real_data_dir, path))


@pytest.fixture(scope="module")
def multi30k(real_data_dir):
  return build(local_parallel, make_data(real_data_dir, shared_path("multi30k")))


@pytest.fixture(scope="module")
def sst2(real_data_dir):
  return build(local_tsv, make_data(real_data_dir, shared_path("sst2"),
                                    text_key="sentence", label_key="label"))


def test_real_tiny_shakespeare_splits_like_nanogpt(tiny_shakespeare):
  path, builder = tiny_shakespeare
  with open(path, encoding="utf-8") as f:
    text = f.read()
  train = "".join(e["text"] for e in read(builder, "train"))
  validation = "".join(e["text"] for e in read(builder, "validation"))
  assert (len(text), len(train), len(validation)) == (1_115_394, 1_003_854, 111_540)
  assert train + validation == text


def test_real_multi30k_line_counts(multi30k):
  splits = multi30k.info.splits
  assert {s: splits[s].num_examples for s in splits} == {
      "train": 29_000, "validation": 1_014, "test_2016_flickr": 1_000}
  assert sorted(multi30k.info.features) == ["de", "en"]
  train = multi30k.as_data_source(split="train")
  # The upstream "@@" placeholders stay (not empty), on lines 16510 and 16664.
  assert train[16509]["de"] == b"@@" and train[16663]["de"] == b"@@"
  assert train[0]["en"] == b"Two young, White males are outside near many bushes."


def test_real_sst2_counts_and_labels(sst2):
  assert {s: sst2.info.splits[s].num_examples for s in sst2.info.splits} == {
      "train": 67_349, "validation": 872}
  assert sst2.info.features["label"].names == ["0", "1"]
  dev = sst2.as_data_source(split="validation")
  assert dev[0]["sentence"] == b"it 's a charming and often affecting journey . "
  assert int(dev[0]["label"]) == 1
  assert sum(int(dev[i]["label"]) for i in range(len(dev))) == 444  # GLUE: 444 positive.
