"""Data tests: packing, sharding, determinism, iterator state, the stdlib builder, tokenizers.

Everything reads in-memory lists or a temporary directory; nothing touches the
network (the `no_network` fixture makes any socket use fail loudly).
"""

from __future__ import annotations

import collections
import inspect
import json
import json.decoder
import json.encoder
import os
import socket
import string
import textwrap

import ml_collections
import numpy as np
import pytest

from configs import base
from transformer.config.errors import ConfigError
from transformer.data import lm
from transformer.data import packing
from transformer.data.datasets import catalog
from transformer.data.datasets import python_stdlib
from transformer.data.tokenizers import vocabularies

SEQ_LEN, BATCH = 16, 4
BYTES = vocabularies.ByteTokenizer()
TEXTS = ["", "hello world", "naïve café ☕ 日本語 🙂", "def f(x):\n\treturn x\n"] + [
    f"doc {i}: " + "xy" * (i * 3 % 11) for i in range(20)]
KEYS = ("inputs", "targets", "segment_ids", "positions", "weights")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
  """Any attempt to open a connection or resolve a name fails the test."""

  def refuse(*args, **kwargs):
    raise AssertionError(f"test tried to use the network: {args}")

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(socket, "getaddrinfo", refuse)


def lm_dataset(texts=TEXTS, **overrides):
  kwargs = dict(text_key="text", vocab_size=BYTES.vocab_size, seq_len=SEQ_LEN,
                batch_size=BATCH, seed=0, train=False, num_threads=2)
  kwargs.update(overrides)
  return lm.make_lm_dataset([{"text": t} for t in texts], BYTES, **kwargs)


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def row_tokens(batch):
  """The seq_len + 1 packed tokens behind each row: inputs plus the last target."""
  return np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)


# ---------------------------------------------------------------- packed batches


def test_packed_batches_are_well_formed():
  batches = list(lm_dataset())
  assert len(batches) > 2
  saw_padding = saw_boundary = False
  for batch in batches:
    assert set(batch) == set(KEYS)
    rows = batch["inputs"].shape[0]
    assert 1 <= rows <= BATCH
    for k in KEYS:
      assert batch[k].shape == (rows, SEQ_LEN), k
      assert batch[k].dtype == (np.float32 if k == "weights" else np.int32), k
    inputs, targets = batch["inputs"], batch["targets"]
    seg, pos, w = batch["segment_ids"], batch["positions"], batch["weights"]
    assert inputs.min() >= 0 and row_tokens(batch).max() < BYTES.vocab_size

    # Targets are the inputs shifted by one (a row is seq_len + 1 consecutive tokens).
    np.testing.assert_array_equal(targets[:, :-1], inputs[:, 1:])
    # Segment 0 is exactly the padding, which sits at the end of a row.
    np.testing.assert_array_equal(seg == 0, inputs == vocabularies.PAD_ID)
    assert np.all(np.diff(seg, axis=1)[seg[:, 1:] > 0] >= 0)
    assert np.all(seg[:, 0] == 1)
    saw_padding |= bool(np.any(seg == 0))
    for r in range(rows):
      for i in range(SEQ_LEN):
        if seg[r, i] == 0:
          assert pos[r, i] == 0 and w[r, i] == 0
          continue
        starts_segment = i == 0 or seg[r, i] != seg[r, i - 1]
        assert pos[r, i] == (0 if starts_segment else pos[r, i - 1] + 1), (r, i)
        if i + 1 < SEQ_LEN:  # The loss never crosses into the next document or padding.
          same_document = seg[r, i + 1] == seg[r, i]
          assert w[r, i] == float(same_document), (r, i)
          saw_boundary |= not same_document
    # bos is the first token of its document; eos is last, and nothing is predicted from it.
    assert np.all(pos[inputs == vocabularies.BOS_ID] == 0)
    assert np.all(w[inputs == vocabularies.EOS_ID] == 0)
    assert np.all(w[targets == vocabularies.BOS_ID] == 0)
    np.testing.assert_array_equal(w, w.astype(bool))
  assert saw_padding and saw_boundary  # The checks above were not vacuous.


def test_one_eval_pass_holds_every_document_once():
  """Per-document framing: bos + UTF-8 bytes + eos, nothing lost, nothing repeated."""
  stream = np.concatenate([row_tokens(b).ravel() for b in lm_dataset()])
  counts = collections.Counter(stream.tolist())
  assert counts[vocabularies.BOS_ID] == len(TEXTS)
  assert counts[vocabularies.EOS_ID] == len(TEXTS)
  del counts[vocabularies.BOS_ID], counts[vocabularies.EOS_ID], counts[vocabularies.PAD_ID]
  expected = collections.Counter(np.concatenate([BYTES.encode(t) for t in TEXTS]).tolist())
  assert counts == expected
  # Documents that were not split across rows come back whole, framed by bos ... eos.
  text = stream.tolist()
  whole = []
  for start in [i for i, t in enumerate(text) if t == vocabularies.BOS_ID]:
    if vocabularies.EOS_ID in text[start:]:
      end = text.index(vocabularies.EOS_ID, start)
      if vocabularies.PAD_ID not in text[start:end] and vocabularies.BOS_ID not in text[start + 1:end]:
        whole.append(BYTES.decode(text[start + 1:end]))
  assert len(whole) >= len(TEXTS) // 2
  assert set(whole) <= set(TEXTS)


def test_out_of_vocabulary_id_raises_naming_the_id():
  # "z" is byte 122 -> id 126, beyond a 100-entry vocabulary.
  with pytest.raises(ValueError, match=r"token id 126\b.*\[0, 100\)"):
    next(iter(lm_dataset(["z"], vocab_size=100)))


def test_processes_read_disjoint_documents_covering_all():
  markers = string.ascii_uppercase[:24]
  texts = [m * 3 for m in markers]  # Each document is identified by its marker byte.
  seen = []
  for index in range(2):
    tokens = np.concatenate([row_tokens(b).ravel() for b in lm_dataset(
        texts, process_index=index, process_count=2)])
    seen.append({chr(t - vocabularies.NUM_SPECIAL) for t in tokens
                 if t >= vocabularies.NUM_SPECIAL})
  assert not seen[0] & seen[1]
  assert seen[0] | seen[1] == set(markers)
  assert len(seen[0]) == len(seen[1]) == 12


# ---------------------------------------------------------------- determinism and state


def test_training_order_is_seeded():
  first = take(iter(lm_dataset(train=True, seed=3)), 6)
  again = take(iter(lm_dataset(train=True, seed=3)), 6)
  other = take(iter(lm_dataset(train=True, seed=4)), 6)
  assert_batches_equal(first, again)
  assert any(not np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(first, other))
  # Training repeats forever with full batches.
  assert all(b["inputs"].shape == (BATCH, SEQ_LEN) for b in first)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_iterator_state_resumes_exactly(k):
  iterator = iter(lm_dataset(train=True, seed=5))
  take(iterator, k)
  # A checkpoint stores the state as JSON, so it must survive the round trip.
  state = json.loads(json.dumps(iterator.get_state()))
  expected = take(iterator, 5)
  resumed = iter(lm_dataset(train=True, seed=5))  # As after a restart: a new dataset.
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 5), expected)


@pytest.mark.parametrize("num_threads", [0, 2])
def test_reading_in_blocks_gives_grains_elements_and_states(num_threads):
  """packing.read_in_blocks: the elements of `ds.to_iter_dataset()` in order (random_map's
  per-index draws too), its iterator states, and restores from them mid-block, across
  the end of an epoch and at the end of a finite dataset."""
  import grain  # pylint: disable=g-import-not-at-top
  ds = grain.MapDataset.range(23).shuffle(seed=1).random_map(
      lambda i, rng: (i, int(rng.integers(1 << 30))), seed=7)
  for source, count in ((ds, 23), (ds.repeat(None), 60)):  # 60: into the third epoch.
    expected = iter(source.to_iter_dataset(grain.ReadOptions(num_threads=num_threads)))
    blocks = packing.read_in_blocks(source, block=5, num_threads=num_threads)
    it, states, elements = iter(blocks), [], []
    for _ in range(count):
      states.append(it.get_state())
      assert states[-1] == expected.get_state()
      elements.append(next(it))
      assert elements[-1] == next(expected)
    if count == len(source):
      with pytest.raises(StopIteration):
        next(it)
      ended = iter(blocks)  # The end: a restore there ends too.
      ended.set_state(it.get_state())
      with pytest.raises(StopIteration):
        next(ended)
    for k in (0, 3, 5, 11, count - 1):  # Block starts and mid-block.
      again = iter(blocks)
      again.set_state(states[k])
      assert [next(again) for _ in range(count - k)] == elements[k:count]
  # A block read makes its block of elements in one call.
  calls = []
  blocks = packing.read_in_blocks(grain.MapDataset.range(12), block=5, num_threads=0,
                                  read=lambda xs: calls.append(xs) or [x * 2 for x in xs])
  assert list(blocks) == [x * 2 for x in range(12)]
  assert calls == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]


def test_eval_is_one_finite_pass_and_pads_the_last_batch():
  batches = list(lm_dataset(train=False))
  assert_batches_equal(batches, list(lm_dataset(train=False)))  # Ordered and repeatable.
  assert all(b["inputs"].shape[0] == BATCH for b in batches[:-1])
  last = batches[-1]
  assert last["inputs"].shape[0] < BATCH  # TEXTS make 27 rows: 6 full batches + 3 rows.
  padded = packing.pad_batch(last, BATCH)
  n = last["inputs"].shape[0]
  for k in KEYS:
    assert padded[k].shape == (BATCH, SEQ_LEN) and padded[k].dtype == last[k].dtype
    np.testing.assert_array_equal(padded[k][:n], last[k])
    np.testing.assert_array_equal(padded[k][n:], 0)
  assert padded["weights"][n:].sum() == 0
  assert packing.pad_batch(batches[0], BATCH) is batches[0]

  evaluated = list(packing.iterate_eval(lm_dataset(train=False), BATCH, -1))
  assert len(evaluated) == len(batches)
  assert all(b["inputs"].shape == (BATCH, SEQ_LEN) for b in evaluated)
  assert len(list(packing.iterate_eval(lm_dataset(train=False), BATCH, 2))) == 2


# ---------------------------------------------------------------- python_stdlib builder

# sha256-chosen names that land in the 5% validation split, so it is not empty.
VALIDATION_NAMES = ("pkg1/m64.py", "pkg1/m79.py", "pkg2/m107.py")


@pytest.fixture(scope="module")
def stdlib_tree(tmp_path_factory):
  """~30 small .py files plus files the builder must skip; returns (root, {path: text})."""
  root = tmp_path_factory.mktemp("fake_stdlib")
  names = [f"pkg{i % 3}/m{i}.py" for i in range(27)] + list(VALIDATION_NAMES) + ["top.py"]
  expected = {}
  for i, name in enumerate(names):
    text = f'"""Module {i} ✓."""\n\nVALUE = {i}\n\n\ndef f():\n    return VALUE\n'
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text, encoding="utf-8")
    expected[name] = text
  skipped = {
      "site-packages/third_party.py": "x = 1\n",
      "pkg0/site-packages/vendored.py": "x = 1\n",
      "__pycache__/cached.py": "x = 1\n",
      "pkg1/__pycache__/cached.py": "x = 1\n",
      "pkg2/README.txt": "not python\n",
  }
  for name, text in skipped.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  (root / "latin1.py").write_bytes("# caf\xe9 in Latin-1\n".encode("latin-1"))  # Not UTF-8.
  return root, expected


def _decode(value):
  return value.decode("utf-8") if isinstance(value, bytes) else value


def test_python_stdlib_builder(stdlib_tree, tmp_path):
  root, expected = stdlib_tree
  config = python_stdlib.PythonStdlibConfig(name="test", root=str(root),
                                            python_version="3.x.y")
  builder = python_stdlib.PythonStdlib(config=config, data_dir=str(tmp_path))
  builder.download_and_prepare(file_format="array_record")

  splits = {}
  for split in ("train", "validation"):
    source = builder.as_data_source(split)
    examples = [source[i] for i in range(len(source))]
    splits[split] = {_decode(e["path"]): _decode(e["text"]) for e in examples}
    assert len(splits[split]) == len(examples)  # No path twice.
  train, validation = splits["train"], splits["validation"]

  assert not train.keys() & validation.keys()
  assert train.keys() | validation.keys() == expected.keys()  # Skipped files are absent.
  assert set(validation) == {p for p in expected if python_stdlib.is_validation(p)}
  assert set(validation) == set(VALIDATION_NAMES)
  for path, text in {**train, **validation}.items():
    assert text == expected[path], path

  # The interpreter version is recorded with the data, not re-derived from the config.
  reopened = python_stdlib.PythonStdlib(
      config=python_stdlib.PythonStdlibConfig(name="test", root=str(root),
                                              python_version="9.9.9"),
      data_dir=str(tmp_path))
  assert reopened.is_prepared()
  assert reopened.info.metadata["python_version"] == "3.x.y"


def test_is_validation_is_a_stable_five_percent():
  paths = [f"dir{i % 7}/file{i}.py" for i in range(4000)]
  held_out = [p for p in paths if python_stdlib.is_validation(p)]
  assert 0.03 < len(held_out) / len(paths) < 0.07
  assert held_out == [p for p in paths if python_stdlib.is_validation(p)]


# ---------------------------------------------------------------- load_builder


def data_config(**overrides) -> ml_collections.ConfigDict:
  data = base.get_config().data
  data.update(**overrides)
  return data


def test_unknown_dataset_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match="no_such_dataset_xyz"):
    catalog.load_builder(data_config(name="no_such_dataset_xyz", data_dir=str(tmp_path)))


def test_unprepared_catalog_dataset_without_download_is_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match=r"'mnist'.*download") as error:
    catalog.load_builder(data_config(name="mnist", data_dir=str(tmp_path), download=False))
  assert "config.data.download=False" in str(error.value)
  assert not list(tmp_path.glob("**/*.array_record*"))  # Nothing was built.


# ---------------------------------------------------------------- tokenizers


ROUND_TRIP_TEXTS = [
    "def f(x):\n    if x:\n\treturn  x  \n\n\n  # trailing spaces  ",
    "    leading indentation\n        deeper\n",
    " one leading space",
    "naïve café → 日本語 🙂\r\n",
    "",
]


def test_byte_tokenizer_round_trips_unicode():
  for text in ROUND_TRIP_TEXTS:
    ids = BYTES.encode(text)
    assert ids.dtype == np.int32
    assert len(ids) == len(text.encode("utf-8"))
    assert np.all((ids >= vocabularies.NUM_SPECIAL) & (ids < BYTES.vocab_size))
    assert BYTES.decode(ids) == text
  # Special ids are dropped on decode.
  ids = [vocabularies.BOS_ID, *BYTES.encode("ok"), vocabularies.EOS_ID, vocabularies.PAD_ID]
  assert BYTES.decode(ids) == "ok"


def _code_lines(limit: int = 2000) -> list[str]:
  modules = (json, json.decoder, json.encoder, textwrap, string, inspect)
  lines = [line for m in modules for line in inspect.getsource(m).split("\n") if line.strip()]
  assert len(lines) >= limit
  return lines[:limit]


@pytest.fixture(scope="module")
def spm_tokenizer(tmp_path_factory):
  # 400, not 300: byte fallback (256) + specials + every character of the corpus must fit.
  path = tmp_path_factory.mktemp("spm") / "sub" / "spm.model"
  return vocabularies.train_sentencepiece(_code_lines(), 400, str(path), max_sentences=10_000)


def test_sentencepiece_special_ids(spm_tokenizer):
  assert spm_tokenizer.vocab_size == 400
  sp = spm_tokenizer._sp
  assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)
  assert (vocabularies.PAD_ID, vocabularies.EOS_ID, vocabularies.BOS_ID, vocabularies.UNK_ID) == (
      0, 1, 2, 3)
  # The model was written atomically: no temporary file is left beside it.
  directory = os.path.dirname(spm_tokenizer.model_path)
  assert os.listdir(directory) == ["spm.model"]


def test_sentencepiece_round_trips_code(spm_tokenizer):
  reloaded = vocabularies.SentencePieceTokenizer(spm_tokenizer.model_path)
  sample = inspect.getsource(textwrap.dedent) + "\tx = 'tab'\n\n\n"
  for text in ROUND_TRIP_TEXTS + [sample]:
    ids = spm_tokenizer.encode(text)
    assert ids.dtype == np.int32
    assert vocabularies.UNK_ID not in ids  # Byte fallback: nothing is unknown.
    assert ids.size == 0 or (ids.min() >= vocabularies.NUM_SPECIAL and ids.max() < 400)
    assert spm_tokenizer.decode(ids) == text, repr(text)
    np.testing.assert_array_equal(reloaded.encode(text), ids)
  # Code compresses: far fewer pieces than bytes.
  assert len(spm_tokenizer.encode(sample)) < 0.7 * len(sample.encode("utf-8"))


def test_sentencepiece_tokenizer_rejects_other_special_ids(tmp_path):
  import io

  import sentencepiece as spm

  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(_code_lines(500)), model_writer=model,
                                 vocab_size=120, minloglevel=2)  # Default ids: unk=0, bos=1.
  path = tmp_path / "default_ids.model"
  path.write_bytes(model.getvalue())
  with pytest.raises(ValueError, match="special ids"):
    vocabularies.SentencePieceTokenizer(str(path))


def test_sentencepiece_trainer_lines_go_to_the_log_not_the_console(tmp_path, capfd, caplog):
  """Its C++ trainer writes on file descriptor 2 itself: those lines become log records."""
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    vocabularies.train_sentencepiece(_code_lines(2000), 400, str(tmp_path / "spm.model"),
                                   max_sentences=10_000)
  _, stderr = capfd.readouterr()
  assert "trainer_interface.cc" not in stderr  # Nothing of the trainer on the console ...
  native = [r for r in caplog.records if r.name == "sentencepiece"]
  assert len(native) > 20 and any("trainer_interface.cc" in r.getMessage() for r in native)
  assert all(getattr(r, "console", True) is False for r in native)  # ... log.txt only.
