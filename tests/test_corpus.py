"""Prepared corpora: --mode=prepare's shards, resume, bad input, and training on the ids.

Every test writes its own corpus of a few tens of KB (jsonl.gz, jsonl.zst, parquet,
txt); nothing downloads. Tokenizer: bytes (no training), except where a vocabulary is
the point.
"""

import errno
import gzip
import io
import itertools
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from transformer.config.errors import ConfigError, DataError
from transformer.config.validation import validate
from transformer.data import lm
from transformer.data.corpus import for_config
from transformer.data.corpus import preparation
from transformer.data.corpus import store
from transformer.data.tokenizers import vocabularies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORDS = "the quick brown fox jumps over a lazy dog; naïve café 猫 def return".split()


def _document(rng: random.Random) -> str:
  return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 60)))


def write_corpus(folder: str, documents: int = 120, seed: int = 0) -> list[str]:
  """Four files, one of each format; returns every document's text (txt: the file)."""
  rng = random.Random(seed)
  os.makedirs(folder, exist_ok=True)
  texts = {name: [_document(rng) for _ in range(documents)]
           for name in ("a.jsonl.gz", "b.jsonl.zst", "c.parquet")}
  with gzip.open(os.path.join(folder, "a.jsonl.gz"), "wt", encoding="utf-8") as f:
    f.writelines(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts["a.jsonl.gz"]))
  lines = "".join(json.dumps({"text": t}) + "\n" for t in texts["b.jsonl.zst"])
  with open(os.path.join(folder, "b.jsonl.zst"), "wb") as f:
    f.write(zstandard.ZstdCompressor().compress(lines.encode()))
  pq.write_table(pa.table({"text": texts["c.parquet"]}), os.path.join(folder, "c.parquet"),
                 row_group_size=50)
  txt = "\n".join(_document(rng) for _ in range(documents)) + "\n"
  with open(os.path.join(folder, "d.txt"), "w", encoding="utf-8") as f:
    f.write(txt)
  return texts["a.jsonl.gz"] + texts["b.jsonl.zst"] + texts["c.parquet"] + [txt]


def on_own_corpus(tiny_config, tmp_path, val_fraction: float = 0.2) -> None:
  """The tiny config's data keys for a corpus under tmp_path/src (bytes tokenizer)."""
  tiny_config.data.update(name="corpus", path=str(tmp_path / "src"), tokenizer="bytes",
                          data_dir=str(tmp_path / "data"), prepare_workers=1,
                          val_fraction=val_fraction)
  tiny_config.model.vocab_size = 0


@pytest.fixture
def config(tiny_config, tmp_path):
  """The tiny config on a prepared-corpus dataset of its own (bytes tokenizer)."""
  on_own_corpus(tiny_config, tmp_path)
  write_corpus(tiny_config.data.path)
  return tiny_config


def prepare(config, workers: int = 1):
  tokenizer = for_config.tokenizer_for(config, create=True)
  job = for_config.job_for(config, tokenizer)
  return job, preparation.prepare(job, workers=workers)


def digests(folder: str) -> dict[str, str]:
  """sha256 of every file under `folder` (relative path -> digest)."""
  result = {}
  for directory, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(directory, name)
      result[os.path.relpath(path, folder)] = store.file_digest(path)
  return result


def launch_prepare(config, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
  """`launch.py --mode=prepare` on the tiny config with `config`'s data keys."""
  data = config.data
  args = [sys.executable, "launch.py", "--mode=prepare", "--config=tests/tiny.py:" + data.data_dir,
          "--config.data.name=corpus", f"--config.data.path={data.path}",
          "--config.data.tokenizer=bytes", "--config.model.vocab_size=0",
          f"--config.data.val_fraction={data.val_fraction}", *extra]
  return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env={**os.environ, **(env or {})})


def test_prepared_documents_read_back_as_their_ids_and_split_by_hash(config):
  job, manifest = prepare(config)
  prepared = store.PreparedCorpus.open(job.output)
  assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["kind"] == "bytes"
  assert [f["path"] for f in manifest["sources"]["files"]] == [
      "a.jsonl.gz", "b.jsonl.zst", "c.parquet", "d.txt"]
  texts = write_corpus(str(config.data.path) + "_again")  # The same texts (same seed).
  byte = vocabularies.ByteTokenizer()
  read = {}
  for split in store.SPLITS:
    source = prepared.split(split)
    assert len(source) == manifest["splits"][split]["records"]
    assert sum(len(source[i]["tokens"]) for i in range(len(source))) == source.num_tokens
    for i in range(len(source)):
      tokens = source[i]["tokens"]
      assert tokens[0] == vocabularies.BOS_ID and tokens[-1] == vocabularies.EOS_ID
      read[byte.decode(tokens)] = split
  for text in texts:  # Every document once, in the split its hash chooses.
    expected = "validation" if preparation.is_validation(text, 0.2) else "train"
    assert read[text] == expected
  assert 0 < manifest["splits"]["validation"]["documents"] < manifest["splits"]["train"]["documents"]


def test_a_window_is_the_records_concatenated(config):
  job, _ = prepare(config)
  split = store.PreparedCorpus.open(job.output).split("train")
  stream = np.concatenate([split[i]["tokens"] for i in range(len(split))])
  for start in (0, 5, split.num_tokens // 2, split.num_tokens - 300):
    tokens, docs = split.window(start, 300)
    np.testing.assert_array_equal(tokens, stream[start:start + 300])
    assert docs[0] == 0 and (np.diff(docs) >= 0).all()
    # A new document starts exactly at a bos (except where the window starts).
    np.testing.assert_array_equal(np.diff(docs) == 1, tokens[1:] == vocabularies.BOS_ID)


def test_output_is_identical_whatever_the_worker_count(config, tmp_path):
  job, _ = prepare(config)
  one = digests(job.output)
  result = launch_prepare(config, "--config.data.prepare_workers=2",
                          f"--config.data.data_dir={tmp_path / 'two'}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert re.search(r"prepare: [\d.]+/[\d.]+ MB \(.* MB/s\), 4/4 tasks, .* M tokens/s",
                   result.stderr)
  assert "Prepared corpus: 4 files" in result.stderr
  assert digests(job.output.replace(str(tmp_path / "data"), str(tmp_path / "two"))) == one


def write_large_files(folder: str) -> None:
  """A .jsonl, a .txt and a parquet file of many row groups, each tens of KB."""
  rng = random.Random(1)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "e.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"text": _document(rng)}) + "\n" for _ in range(400))
  with open(os.path.join(folder, "f.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(_document(rng) for _ in range(300)) + "\n")
  pq.write_table(pa.table({"text": [_document(rng) for _ in range(300)]}),
                 os.path.join(folder, "g.parquet"), row_group_size=20)


@pytest.mark.parametrize("workers", [1, 2])
def test_files_split_into_parts_give_the_unsplit_corpus_byte_for_byte(config, tmp_path,
                                                                     monkeypatch, workers):
  """data.prepare_piece_mb splits the large files (a .jsonl at line starts, a .txt at its
  piece windows, parquet by row groups; the compressed ones stay whole): their parts' shards,
  joined, are the unsplit preparation's files exactly, and no part is left behind."""
  monkeypatch.setattr(store, "PIECE_CHARS", 256)  # .txt windows: many in a few KB.
  write_large_files(config.data.path)
  config.data.prepare_piece_mb = 0.0  # Never split: the reference.
  job, whole = prepare(config)
  reference = digests(job.output)
  config.data.update(prepare_piece_mb=0.003, data_dir=str(tmp_path / "parts"))
  split_job, split = prepare(config, workers=workers)
  plans = {name: len(preparation.plan_file(split_job, i))
           for i, name in enumerate(split_job.names)}
  assert plans["a.jsonl.gz"] == plans["b.jsonl.zst"] == 1  # Compressed: whole.
  assert min(plans[n] for n in ("c.parquet", "d.txt", "e.jsonl", "f.txt", "g.parquet")) >= 3
  assert split == whole
  assert digests(split_job.output) == reference  # No parts/ folder left either.


def test_a_rerun_keeps_the_parts_of_a_file_by_content(config, tmp_path, monkeypatch):
  """Parts done, the join not (it failed): a rerun over touched files (other mtimes, the
  same bytes) tokenizes no part again; other bytes under a kept size and mtime redo that
  file's parts (its sha256, hashed by the driver, differs), never 'already done'."""
  monkeypatch.setattr(store, "PIECE_CHARS", 256)
  write_large_files(config.data.path)
  config.data.prepare_piece_mb = 0.003
  join_task = preparation.join_task

  def no_join(job, index):
    raise DataError("the join fails (test)")

  monkeypatch.setattr(preparation, "join_task", no_join)
  with pytest.raises(DataError, match="the join fails"):
    prepare(config)
  for name in os.listdir(config.data.path):  # Touched: same bytes, other mtimes.
    path = os.path.join(config.data.path, name)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
  tokenized = []
  run_task = preparation.run_task
  monkeypatch.setattr(preparation, "run_task",
                      lambda job, piece: tokenized.append(piece) or run_task(job, piece))
  with pytest.raises(DataError, match="the join fails"):
    prepare(config)
  assert [p for p in tokenized if not p.whole] == []  # Every part kept.
  path = os.path.join(config.data.path, "f.txt")
  stat = os.stat(path)
  with open(path, "r+", encoding="utf-8") as f:  # The same size and mtime, other bytes.
    text = f.read()
    f.seek(0)
    f.write(text.replace("the", "THE", 1))
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  tokenized.clear()
  monkeypatch.setattr(preparation, "join_task", join_task)
  job, manifest = prepare(config)
  redone = {job.names[p.file] for p in tokenized if not p.whole}
  assert redone == {"f.txt"}, redone
  assert len([p for p in tokenized if not p.whole]) >= 3  # Every part of f.txt.
  assert {f["path"]: f["sha256"] for f in manifest["sources"]["files"]}["f.txt"] == \
      store.file_digest(path)
  assert not os.path.exists(os.path.join(job.output, "parts"))


@pytest.mark.parametrize("point,status", [
    ("prepare_writing:1", -9), ("prepare_writing:2:SIGINT", 130),
    pytest.param("prepare_written:2", -9, marks=pytest.mark.slow)])
def test_a_killed_preparation_resumes_and_never_uses_a_half_written_shard(config, tmp_path,
                                                                          point, status):
  job, _ = prepare(config)
  clean = digests(job.output)
  config.data.data_dir = str(tmp_path / "killed")
  result = launch_prepare(config, "--config.data.prepare_workers=1",
                          env={"TRANSFORMER_TEST_KILL_AT": point})
  assert result.returncode == status, result.stderr[-2000:]
  point = point.removesuffix(":SIGINT")
  output = job.output.replace(str(tmp_path / "data"), str(tmp_path / "killed"))
  assert not os.path.exists(os.path.join(output, store.MANIFEST))
  with pytest.raises(ConfigError, match="not prepared.*--mode=prepare"):
    for_config.open_for_training(config)
  # The killed task's lock file may stay (a SIGKILL deletes nothing); the rerun's goes.
  done = sorted(n for n in os.listdir(os.path.join(output, store.TASKS)) if n.endswith(".json"))
  assert done == [f"{i:05d}.json" for i in range(int(point[-1]))]
  result = launch_prepare(config, "--config.data.prepare_workers=1")
  assert result.returncode == 0, result.stderr[-2000:]
  assert f"({int(point[-1])} already done)" in result.stderr
  assert digests(output) == clean


def test_a_changed_source_or_another_tokenizer_is_refused_by_identity(config):
  prepare(config)
  prepared, _ = for_config.open_for_training(config)
  assert prepared.manifest["splits"]["train"]["tokens"] > 0
  config.data.tokenizer = "char"
  with pytest.raises(ConfigError, match="no char vocabulary.*--mode=prepare"):
    for_config.open_for_training(config)
  prepare(config)  # Now also prepared for characters: the bytes one is still there.
  config.data.tokenizer = "bytes"
  path = os.path.join(config.data.path, "d.txt")
  with open(path, "a", encoding="utf-8") as f:
    f.write("one more line\n")
  with pytest.raises(ConfigError, match="d.txt changed: .* bytes when prepared"):
    for_config.open_for_training(config)
  os.remove(path)
  with pytest.raises(ConfigError, match=r"removed: \['d.txt'\]"):
    for_config.open_for_training(config)


def test_prepare_sees_bytes_changed_under_a_kept_size_and_mtime(config, caplog):
  """`touch -d` back after an edit of the same size: prepare checks by content (never
  "already done" over it); training's start check says it read size and mtime only."""
  job, before = prepare(config)
  path = os.path.join(config.data.path, "d.txt")
  stat = os.stat(path)
  with open(path, "r+", encoding="utf-8") as f:
    text = f.read()
    f.seek(0)
    f.write(text.replace("the", "THE", 1))
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  assert os.stat(path).st_size == stat.st_size
  caplog.set_level("INFO")
  for_config.open_for_training(config)
  assert "are as prepared by size and mtime (content not read here: --mode=prepare " \
         "checks it by sha256)" in caplog.text
  caplog.clear()
  _, after = prepare(config)
  assert "d.txt is tokenized again: d.txt changed: its content (sha256) differs" in caplog.text
  assert "(3 already done), 1 to tokenize" in caplog.text
  recorded = {f["path"]: f["sha256"] for f in after["sources"]["files"]}
  assert recorded["d.txt"] == store.file_digest(path) != {
      f["path"]: f["sha256"] for f in before["sources"]["files"]}["d.txt"]


def test_a_rerun_keeps_files_whose_bytes_are_the_same_under_other_mtimes(config,
                                                                       monkeypatch):
  """Sources copied again (other mtimes): a rerun hashes such a file, as training's check
  does (store.file_change), instead of tokenizing it again; a changed file of the same
  size is redone."""
  prepare(config)
  for name in os.listdir(config.data.path):  # A new copy: same bytes, other mtimes.
    path = os.path.join(config.data.path, name)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
  tokenized = []
  run_task = preparation.run_task
  monkeypatch.setattr(preparation, "run_task",
                      lambda job, piece: tokenized.append(piece.file) or run_task(job, piece))
  job, manifest = prepare(config)
  assert tokenized == [] and manifest is not None  # Hashed, not tokenized again.
  assert store.sources_change(manifest, job.root, list(job.names)) is None
  # The manifest holds this host's mtimes: training here reads no file to check them.
  assert [f["mtime_ns"] for f in manifest["sources"]["files"]] == [
      os.stat(os.path.join(job.root, n)).st_mtime_ns for n in job.names]
  path = os.path.join(config.data.path, "d.txt")
  with open(path, "r+", encoding="utf-8") as f:  # The same size, other bytes.
    text = f.read()
    f.seek(0)
    f.write(text.replace("the", "THE", 1))
  os.utime(path, ns=(0, 10**9))
  tokenized.clear()
  prepare(config)
  assert tokenized == [3]


def test_a_resume_on_a_corpus_prepared_again_from_renamed_files_is_refused(config, tmp_path,
                                                                          monkeypatch):
  """The same bytes under other names, prepared again: the corpus keeps its folder and
  name, but its records come in another order. A new run reads them as a new corpus; a
  resume is refused in one line (dataset.json's files), before anything is rewritten."""
  from transformer.data import sources  # pylint: disable=g-import-not-at-top
  from transformer.training import resume  # pylint: disable=g-import-not-at-top
  from transformer.workdir import checkpointing  # pylint: disable=g-import-not-at-top
  prepare(config)
  prepared, _ = for_config.open_for_training(config)
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(config.to_json_best_effort())
  sources.save_dataset_record(workdir, prepared.record())
  os.rename(os.path.join(config.data.path, "a.jsonl.gz"),
            os.path.join(config.data.path, "e.jsonl.gz"))
  with pytest.raises(ConfigError, match=r"removed: \['a.jsonl.gz'\]"):
    for_config.open_for_training(config)  # As before: prepare first.
  prepare(config)
  prepared, _ = for_config.open_for_training(config)
  monkeypatch.setattr(checkpointing, "has_checkpoint", lambda workdir: True)
  with pytest.raises(ConfigError) as refused:
    resume.check_config_change(config, workdir, prepared.record())
  assert str(refused.value) == (
      f"Resuming {workdir} on data that is not what it trained on (dataset.json): dataset: "
      f"{prepared.record()['name']!r} -> {prepared.record()['name']!r} (renamed with the "
      "same bytes (records are read in name order): a.jsonl.gz -> e.jsonl.gz); restore the "
      "run's data (or prepare it again from the original files), train in a new --workdir "
      "(config.init_from takes over the parameters), or pass "
      "--config.checkpoint.on_config_change=allow to resume on it anyway")


def test_where_files_are_recorded_they_decide_not_the_name():
  """run_data.same_content, for every kind of record: a corpus or a mixture keeps its
  name when its files are renamed, replaced and prepared again; a catalog dataset has
  only its name; one local file may have any name."""
  from transformer.data import run_data  # pylint: disable=g-import-not-at-top
  digest = {name: name[0] * 64 for name in ("a.txt", "b.txt", "e.txt")}
  corpus_record = {"name": "corpus/src-1/bytes", "files": {"a.txt": digest["a.txt"],
                                                           "b.txt": digest["b.txt"]}}
  renamed = dict(corpus_record, files={"e.txt": digest["a.txt"], "b.txt": digest["b.txt"]})
  assert not run_data.same_content(corpus_record, renamed)
  assert run_data.files_change(corpus_record["files"], renamed["files"]) == (
      "renamed with the same bytes (records are read in name order): a.txt -> e.txt")
  mixture_record = {"name": "mixture/web:0.7+code:0.3", "files": {"web/a.txt": "1" * 64}}
  replaced = dict(mixture_record, files={"web/a.txt": "2" * 64})
  assert not run_data.same_content(mixture_record, replaced)
  assert run_data.files_change(mixture_record["files"], {"web/x.txt": "3" * 64}) == (
      "added: web/x.txt; removed: web/a.txt")
  assert run_data.same_content({"name": "wmt14/de-en/1.0.0"}, {"name": "wmt14/de-en/1.0.0"})
  one = {"name": "local_text/a_1/1.0.0", "files": {"a.txt": "1" * 64}}
  assert run_data.same_content(one, {"name": "local_text/b_1/1.0.0", "files": {"b.txt": "1" * 64}})


def _bad(folder: str, name: str, content: bytes) -> None:
  with open(os.path.join(folder, name), "wb") as f:
    f.write(content)


@pytest.mark.parametrize("name,content,message", [
    ("e.jsonl", b'{"text": "fine"}\n{"text": "a", \n{"text": "b"}\n',
     r"e.jsonl, line 2: malformed JSON"),
    ("e.jsonl", b'{"text": "fine"}\n{"body": "a"}\n', r"e.jsonl, line 2: no string field 'text'"),
    ("e.jsonl", b"", r"e.jsonl, the whole file: the file is empty"),
])
def test_a_bad_record_stops_naming_file_and_line_or_is_skipped_and_counted(config, name,
                                                                          content, message):
  _bad(config.data.path, name, content)
  with pytest.raises(DataError, match=message + ".*data.bad_records='skip'"):
    prepare(config)
  config.data.bad_records = "skip"
  _, manifest = prepare(config)
  assert manifest["skipped_records"] == 1


def _jsonl(documents: int) -> bytes:
  return "".join(json.dumps({"text": f"document {i} " * 20}) + "\n"
                 for i in range(documents)).encode()


def _parquet(documents: int) -> bytes:
  buffer = io.BytesIO()
  pq.write_table(pa.table({"text": [f"document {i} " * 20 for i in range(documents)]}),
                 buffer, row_group_size=100, compression="snappy")
  return buffer.getvalue()


def _flipped(data: bytes, start: int, count: int = 400) -> bytes:
  damaged = bytearray(data)
  for i in range(start, start + count):
    damaged[i] ^= 0x5A
  return bytes(damaged)


_ZST = zstandard.ZstdCompressor().compress(_jsonl(2000))
_GZ = gzip.compress(_jsonl(2000))
_PARQUET = _parquet(1000)


@pytest.mark.parametrize("name,content,message", [
    # Read as "malformed JSON" before, and with bad_records='skip' 894 of 2000 documents.
    ("e.jsonl.zst", _ZST[:len(_ZST) // 2], "damaged compressed file .*ends inside a zstd frame"),
    ("e.jsonl.zst", _ZST[:-3], "damaged compressed file"),
    ("e.jsonl.gz", _GZ[:len(_GZ) // 2], "damaged compressed file"),
    ("e.jsonl.gz", _flipped(_GZ, len(_GZ) // 2), "damaged compressed file"),
    ("e.parquet", _PARQUET[:len(_PARQUET) // 2], "not a readable parquet file"),
    # A row group that does not decode: a pyarrow traceback before.
    ("e.parquet", _flipped(_PARQUET, len(_PARQUET) // 3), "not a readable parquet file "
     r"\(row group"),
    # The last line cut: one "malformed" record skipped before, the rest trained on.
    ("e.jsonl", _jsonl(50)[:-30], r"ends inside a record \(line 50 .*truncated"),
])
def test_a_file_cut_short_or_damaged_is_refused_whole_never_skipped_as_records(
    config, name, content, message):
  """A truncated or corrupted file is the file's fault: one DataError naming it, also
  with data.bad_records='skip' (which is for records, not for half a file)."""
  _bad(config.data.path, name, content)
  config.data.bad_records = "skip"
  with pytest.raises(DataError, match=re.escape(os.path.join(config.data.path, name))
                     + ": " + message):
    prepare(config)


def test_every_frame_of_a_multi_frame_zst_is_read(config):
  """pzstd and concatenated .zst files hold several frames: the reader that checks each
  frame ends (readers._ZstdFrames) reads them all, as zstandard's stream reader did."""
  lines = _jsonl(2000)
  half = lines.index(b"\n", len(lines) // 2) + 1
  _bad(config.data.path, "e.jsonl.zst", zstandard.ZstdCompressor().compress(lines[:half])
       + zstandard.ZstdCompressor().compress(lines[half:]))
  config.data.path = os.path.join(config.data.path, "e.jsonl.zst")
  _, manifest = prepare(config)
  assert sum(s["documents"] for s in manifest["splits"].values()) == 2000


def test_a_split_with_no_tokens_is_refused_at_prepare_and_at_training_start(
    config, monkeypatch):
  """One .txt is one document: all of it lands in one split, the other gets 0 tokens.
  prepare accepted it and training failed at its first evaluation, after training."""
  for name in os.listdir(config.data.path):
    if not name.endswith(".txt"):
      os.remove(os.path.join(config.data.path, name))
  config.data.val_fraction = 0.01
  with pytest.raises(ConfigError, match=r"the validation split of the prepared corpus .* has "
                     r"0 tokens \(train 1 documents, [\d,]+ tokens; validation 0 documents, 0 "
                     r"tokens; 1 source file\(s\), config.data.val_fraction=0.01\).*raise "
                     r"config.data.val_fraction"):
    prepare(config)
  # A corpus prepared before prepare checked this: refused before training starts.
  monkeypatch.setattr(store, "empty_split", lambda manifest, folder: None)
  prepare(config)
  monkeypatch.undo()
  with pytest.raises(ConfigError, match=r"config.data.path=.*the validation split .* 0 "
                     r"tokens.*then run `python launch.py --mode=prepare"):
    for_config.open_for_training(config)


def test_a_shard_missing_from_a_prepared_corpus_is_refused_and_prepare_redoes_it(config):
  job, manifest = prepare(config)
  shard = manifest["splits"]["train"]["shards"][1]["task"]
  os.remove(os.path.join(job.output, "train", shard + ".array_record"))
  with pytest.raises(ConfigError, match=rf"lacks a whole shard that its manifest lists: "
                     rf".*train/{shard}.array_record is missing .*redoes the missing files"):
    for_config.open_for_training(config)
  prepare(config)
  for_config.open_for_training(config)
  # Cut short (here: 0 bytes, as two prepares racing once left one): refused, redone.
  open(os.path.join(job.output, "train", shard + ".array_record"), "wb").close()
  with pytest.raises(ConfigError, match=rf"train/{shard}.array_record is 0 bytes, under "
                     r"array_record's minimum"):
    for_config.open_for_training(config)
  prepare(config)
  for_config.open_for_training(config)


def test_parquet_without_the_key_and_undecodable_bytes(config):
  pq.write_table(pa.table({"body": ["x", "y"]}), os.path.join(config.data.path, "e.parquet"))
  with pytest.raises(DataError, match=r"e.parquet: no column 'text' .*\['body'\]"):
    prepare(config)
  os.remove(os.path.join(config.data.path, "e.parquet"))
  _bad(config.data.path, "f.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
  with pytest.raises(DataError, match=r"f.jsonl, line 2: undecodable UTF-8.*decode_errors"):
    prepare(config)
  config.data.decode_errors = "replace"
  _, manifest = prepare(config)
  assert manifest["replaced_characters"] == 1


def test_a_full_disk_stops_in_one_line_and_a_rerun_finishes(config, monkeypatch):
  from transformer.cli import prepare as prepare_mode  # pylint: disable=g-import-not-at-top
  real = preparation._SplitWriter.finish  # pylint: disable=protected-access
  calls = []

  def full(self):
    calls.append(1)
    if len(calls) == 3:  # As array_record says a failed write (its RuntimeError).
      raise RuntimeError("riegeli write failed: No space left on device")
    return real(self)

  monkeypatch.setattr(preparation._SplitWriter, "finish", full)  # pylint: disable=protected-access
  with pytest.raises(OSError) as raised:
    prepare_mode.main(config, None)
  assert raised.value.errno == errno.ENOSPC and raised.value.flag == "config.data.data_dir"
  assert raised.value.filename == store.sources_folder(config.data)
  monkeypatch.undo()
  assert prepare_mode.main(config, None) == 0
  for_config.open_for_training(config)


def test_a_full_disk_in_a_worker_is_one_error_without_a_thread_traceback(config, monkeypatch):
  """Two workers, one file's shard refused by a full disk: the error, and no
  `InvalidStateError` traceback from the pool's thread before it (3 runs in 4 before)."""
  from transformer.cli import prepare as prepare_mode  # pylint: disable=g-import-not-at-top
  real = preparation._SplitWriter.finish  # pylint: disable=protected-access

  def full(self):  # Inherited by the forked workers: the odd files' train shards fail.
    if "/train/" in self.final and int(os.path.basename(self.final)[:5]) % 2:
      raise RuntimeError("riegeli write failed: No space left on device")
    return real(self)

  for k in range(3):
    write_corpus(os.path.join(config.data.path, str(k)), documents=300, seed=k)
  config.data.prepare_workers = 2
  monkeypatch.setattr(preparation._SplitWriter, "finish", full)  # pylint: disable=protected-access
  thread_errors = []
  monkeypatch.setattr(threading, "excepthook", thread_errors.append)
  for _ in range(3):
    with pytest.raises(OSError) as raised:
      prepare_mode.main(config, None)
    assert raised.value.errno == errno.ENOSPC
  assert not thread_errors, [str(e.exc_value) for e in thread_errors]


def _children(pid: int) -> list[int]:
  """The pids of `pid`'s child processes (Linux /proc)."""
  found = []
  for task in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
        found += [int(child) for child in f.read().split()]
    except FileNotFoundError:  # The thread ended between the listing and the read.
      continue
  return found


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc (Linux)")
def test_workers_die_with_a_killed_prepare(config, tmp_path):
  """SIGKILL to --mode=prepare's process: its workers end too, and the caller's pipe
  closes (before, they waited on their task queue forever: seen after 761 s)."""
  source = tmp_path / "fifos"
  source.mkdir()
  for name in ("a.txt", "b.txt"):  # Reading a FIFO nobody writes: a worker blocks there.
    os.mkfifo(source / name)
  config.data.path = str(source)
  process = subprocess.Popen(
      [sys.executable, "launch.py", "--mode=prepare", "--config=tests/tiny.py:" +
       config.data.data_dir, "--config.data.name=corpus", f"--config.data.path={source}",
       "--config.data.tokenizer=bytes", "--config.model.vocab_size=0",
       "--config.data.prepare_workers=2"], cwd=ROOT, stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  workers = []
  try:
    for line in iter(process.stderr.readline, b""):
      if b"worker process(es)" in line:
        break
    deadline = time.monotonic() + 60
    while len(workers) < 2 and time.monotonic() < deadline:
      workers = _children(process.pid)
      time.sleep(0.1)
    assert len(workers) >= 2, workers
    time.sleep(1)  # The workers have run their initializer and opened the FIFOs.
    process.kill()
    process.communicate(timeout=30)  # EOF: no worker holds the pipe any more.
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{w}") and _state(w) != "Z" for w in workers):
      assert time.monotonic() < deadline, "workers outlived their parent"
      time.sleep(0.1)
  finally:
    process.kill()
    for worker in workers:
      try:
        os.kill(worker, 9)
      except ProcessLookupError:
        pass


def _state(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      return f.read().rsplit(")", 1)[1].split()[0]
  except FileNotFoundError:
    return "Z"


def test_training_rows_come_from_the_ids_and_resume_exactly(config):
  prepare(config)
  prepared, tokenizer = for_config.open_for_training(config)
  split = prepared.split("train")
  for windows in ("packed", "random"):
    dataset = lm.make_lm_dataset(split, tokenizer, text_key="text", vocab_size=384,
                                 seq_len=32, batch_size=4, seed=0, train=True,
                                 windows=windows, prepared=True, num_threads=1)
    it = iter(dataset)
    next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    it.set_state(state)
    for batch in expected:
      again = next(it)
      for key in batch:
        np.testing.assert_array_equal(again[key], batch[key])
    assert batch["inputs"].shape == (4, 32) and batch["segment_ids"].max() >= 1
    # Two processes read different shares.
    rows = [next(iter(lm.make_lm_dataset(split, tokenizer, text_key="text", vocab_size=384,
                                         seq_len=32, batch_size=4, seed=0, train=True,
                                         windows=windows, prepared=True, num_threads=1,
                                         process_index=p, process_count=2)))["inputs"]
            for p in (0, 1)]
    assert not np.array_equal(rows[0], rows[1])


@pytest.mark.parametrize("num_threads", [0, 2])
def test_block_reads_give_the_record_by_record_documents_rows_and_states(config, num_threads):
  """packer.documents (records read in blocks) against packing.documents reading
  split[i] one grain element each, the reader before blocks: the same rows and iterator
  states, in training across epochs, in a finite evaluation, for each of two processes;
  a state saved by either resumes on the other."""
  import grain  # pylint: disable=g-import-not-at-top
  from transformer.data.corpus import packer  # pylint: disable=g-import-not-at-top
  from transformer.data import packing  # pylint: disable=g-import-not-at-top

  class Same(grain.transforms.Map):
    def map(self, element):
      return element

  job, _ = prepare(config)
  prepared = store.PreparedCorpus.open(job.output)
  split = prepared.split("train")
  shuffled = np.random.default_rng(0).permutation(len(split)).tolist()
  for got, index in zip(split.__getitems__(shuffled), shuffled):  # Records of every shard.
    np.testing.assert_array_equal(got["tokens"], split[index]["tokens"])
  for name, train, process_index, process_count in (
      ("train", True, 0, 1), ("validation", False, 0, 1), ("train", False, 1, 2)):
    split = prepared.split(name)
    kwargs = dict(seed=3, train=train, process_index=process_index,
                  process_count=process_count, num_threads=num_threads)
    before = iter(packer.PackedRows(packing.documents(split, Same(), **kwargs), 16))
    blocks = packer.PackedRows(packer.documents(split, **kwargs), 16)
    it, states, rows = iter(blocks), [], []
    for want in itertools.islice(before, 3 * split.num_tokens // 16 if train else None):
      states.append(before.get_state())
      rows.append(next(it))
      assert it.get_state() == states[-1]
      for key in want:
        np.testing.assert_array_equal(rows[-1][key], want[key])
    if not train:
      with pytest.raises(StopIteration):
        next(it)
    for k in (1, len(rows) // 2):  # A state saved by the reader before blocks resumes.
      again = iter(blocks)
      again.set_state(states[k - 1])
      for want in rows[k:k + 40]:
        np.testing.assert_array_equal(next(again)["tokens"], want["tokens"])


def test_corpus_config_checks():
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  config = make_tiny_config("")
  config.data.update(name="corpus", path="")
  with pytest.raises(ConfigError, match="data.path"):
    validate(config)
  config.data.update(path="x", prepare_piece_mb=-1.0)
  with pytest.raises(ConfigError, match=r"data.prepare_piece_mb=-1.0 is invalid"):
    validate(config)
  config.data.update(prepare_piece_mb=64.0, eval_split="test")
  with pytest.raises(ConfigError, match="data.eval_split='test'.*'validation'"):
    validate(config)
  config.data.update(eval_split="validation", bad_records="ignore")
  with pytest.raises(ConfigError, match="data.bad_records"):
    validate(config)


def test_training_on_a_prepared_corpus_runs_no_tokenizer(config, tmp_path, monkeypatch):
  from transformer.training import loop  # pylint: disable=g-import-not-at-top
  prepare(config)

  def no_encoding(self, text):
    raise AssertionError("the training process tokenized text")

  monkeypatch.setattr(vocabularies.ByteTokenizer, "encode", no_encoding)
  config.train.update(num_steps=2, eval_every=2, eval_batches=1)
  config.checkpoint.update(every=2)
  workdir = str(tmp_path / "run")
  loop.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "dataset.json"), encoding="utf-8") as f:
    record = json.load(f)
  assert record["name"].startswith("corpus/src-") and record["name"].endswith("/bytes")
  assert sorted(record["files"]) == ["a.jsonl.gz", "b.jsonl.zst", "c.parquet", "d.txt"]
  from transformer.cli import evaluate  # pylint: disable=g-import-not-at-top
  result = evaluate.evaluate(workdir, max_examples=20, stdout=io.StringIO())
  assert result["dataset"] == record["name"] and result["metrics"]["tokens"] > 0


def test_the_vocabulary_of_init_froms_run_tokenizes_and_keys_the_corpus(config, tmp_path):
  from transformer.data.tokenizers import run_vocabulary  # pylint: disable=g-import-not-at-top
  run = str(tmp_path / "pretrained")
  vocabulary = vocabularies.build_char_vocabulary(["abc ", "def"], str(tmp_path / "chars.json"))
  run_vocabulary.save_tokenizer(run, vocabulary)  # What a run (or --mode=import) leaves.
  config.init_from = run
  job, manifest = prepare(config)  # In this process: a fork here would copy JAX's threads.
  assert manifest["tokenizer"] == run_vocabulary.tokenizer_record(vocabulary)
  assert os.path.basename(job.output).startswith("char-v")
  split = store.PreparedCorpus.open(job.output).split("train")
  ids = np.concatenate([split[i]["tokens"] for i in range(len(split))])
  assert set(np.unique(ids)) <= set(range(vocabulary.vocab_size))
  assert (ids == vocabularies.UNK_ID).any()  # Letters outside "abcdef " are unknown.
  assert for_config.open_for_training(config)[1].vocab_size == vocabulary.vocab_size
  assert store.id_dtype(65_536) == np.uint16 and store.id_dtype(65_537) == np.uint32


def test_long_documents_are_pieces_flagged_first_and_last(config, monkeypatch):
  monkeypatch.setattr(store, "PIECE_CHARS", 64)  # Pieces of <= 64 characters (bytes: .txt).
  job, manifest = prepare(config)
  byte = vocabularies.ByteTokenizer()
  with open(os.path.join(config.data.path, "d.txt"), encoding="utf-8") as f:
    txt = f.read()
  name = [n for n in store.SPLITS if manifest["splits"][n]["shards"][3]["documents"]][0]
  split = store.PreparedCorpus.open(job.output).split(name)
  shard = manifest["splits"][split.name]["shards"][3]  # d.txt's records, in order.
  first = sum(s["records"] for s in manifest["splits"][split.name]["shards"][:3])
  records = range(first, first + shard["records"])
  assert shard["documents"] == 1 and len(records) > len(txt.encode()) // 64
  flags = [split.flags(i) for i in records]
  assert flags == [store.STARTS] + [0] * (len(records) - 2) + [store.ENDS]
  assert "".join(byte.decode(split[i]["tokens"]) for i in records) == txt
  # A window across the pieces of one document is one segment.
  start = sum(len(split[i]["tokens"]) for i in range(first)) + 10
  tokens, docs = split.window(start, 200)
  assert (docs == 0).all() and vocabularies.BOS_ID not in tokens


@pytest.mark.parametrize("row_len", [7, 64])
def test_packed_rows_are_grains_concat_then_split_rows_and_resume_exactly(row_len):
  import grain  # pylint: disable=g-import-not-at-top
  import grain.experimental  # pylint: disable=g-import-not-at-top
  from transformer.data.corpus import packer  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  documents = [{"tokens": rng.integers(4, 300, rng.integers(1, 150)).astype(np.int32)}
               for _ in range(60)]
  source = grain.MapDataset.source(documents).to_iter_dataset()
  expected = list(grain.experimental.ConcatThenSplitIterDataset(
      source, length_struct={"tokens": row_len}))
  rows = list(packer.PackedRows(source, row_len))
  assert len(rows) == len(expected) and rows[-1]["tokens_segment_ids"][-1] == 0
  for row, want in zip(rows, expected):
    assert row.keys() == want.keys()
    for key in row:
      np.testing.assert_array_equal(row[key], want[key])
  it = iter(packer.PackedRows(source, row_len))
  for _ in range(5):
    next(it)
  state = it.get_state()
  again = iter(packer.PackedRows(source, row_len))
  again.set_state(state)
  for want in rows[5:]:
    np.testing.assert_array_equal(next(again)["tokens"], want["tokens"])


def test_prepare_checks_its_config_before_writing(config, tmp_path):
  from transformer.cli import prepare as prepare_mode  # pylint: disable=g-import-not-at-top
  config.data.path = str(tmp_path / "nothing_here")
  with pytest.raises(ConfigError, match="names no corpus file"):
    prepare_mode.check_config(config)
  config.data.update(name="local_text")
  with pytest.raises(ConfigError, match="--mode=prepare prepares a corpus"):
    prepare_mode.check_config(config)
  assert not os.path.exists(config.data.data_dir)


def test_a_new_source_format_is_one_table_entry(tmp_path, monkeypatch):
  """readers.FORMATS is the one place a format lives: an entry (here a made-up .csv of
  one document a line) is found by data.path's search and read, with no other change."""
  from transformer.data.corpus import readers  # pylint: disable=g-import-not-at-top
  csv = readers.Format(".csv", "a line", lambda r: (readers.cut(line) for line in open(
      r.path, encoding="utf-8").read().splitlines()))
  monkeypatch.setattr(readers, "FORMATS", readers.FORMATS + (csv,))
  monkeypatch.setattr(readers, "EXTENSIONS", readers.EXTENSIONS + (".csv",))
  (tmp_path / "a.csv").write_text("first doc\nsecond doc\n", encoding="utf-8")
  (tmp_path / "notes.md").write_text("not a corpus file", encoding="utf-8")
  root, names = readers.source_files(str(tmp_path))
  assert names == ["a.csv"] and readers.format_of("x.jsonl.gz").extension == ".jsonl.gz"
  reader = readers.reader(str(tmp_path / "a.csv"), "a.csv", text_key="text",
                          decode_errors="strict", bad_records="stop",
                          stats=readers.ReadStats())
  assert ["".join(doc) for doc in reader.documents()] == ["first doc", "second doc"]
  with pytest.raises(ConfigError, match=r"x\.tsv is not a corpus file; valid extensions: "
                                        r"\.txt, \.jsonl, .*\.csv"):
    readers.format_of("x.tsv")
