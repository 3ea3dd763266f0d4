"""The processes of one run must agree (transformer/distributed.py's `agree`): the
comparison itself, and the exchange simulated for two processes. The real two-process
runs are in test_multiprocess.py (slow)."""

import hashlib
import json
import os
import types

import jax
import pytest

from transformer import distributed
from transformer.config.errors import ConfigError
from transformer.data import run_data


def test_the_first_differing_key_and_process_in_one_line():
  same = {"config": {"seed": 1, "model.d_model": 32}, "data": {"dataset": "x"}}
  assert distributed.first_difference([same, same, same]) is None
  other = {"config": {"seed": 2, "model.d_model": 32}, "data": {"dataset": "x"}}
  assert distributed.first_difference([same, same, other]) == (
      "config differs between processes: seed is 1 on process 0 and 2 on process 2; every "
      "process of a run must be started with the same command and read the same files")
  # Several keys: the first (sorted) is named, the others counted; a key one lacks.
  paths = [{"config": {"data.path": "/a", "seed": 1}},
           {"config": {"data.path": "/b", "seed": 2, "data.mixture": ""}}]
  assert distributed.first_difference(paths).startswith(
      'config differs between processes: data.mixture is absent on process 0 and "" on '
      'process 1 (2 other key(s) differ too: data.path, seed);')


def test_per_process_keys_may_differ_and_no_other():
  assert set(distributed.PER_PROCESS_KEYS) == {"--process_id", "data.prepare_workers"}
  records = [{"command": {"--process_id": i, "--mode": "train"},
              "config": {"data.prepare_workers": 4 + i}}
             for i in range(2)]
  assert distributed.first_difference(records) is None
  records[1]["command"]["--mode"] = "evaluate"
  assert distributed.first_difference(records).startswith(
      'command differs between processes: --mode is "train" on process 0 and "evaluate" '
      "on process 1;")


def test_data_identity_names_the_file_not_where_each_process_found_it():
  """Each process's copy of the data may lie elsewhere (a relative data.path, a host's own
  disk); the content decides. A catalog dataset is its name."""
  record = {"name": "local_text/train-abc/1.0.0", "source_path": "/host0/text",
            "files": {"train.txt": "1" * 64, "val.txt": "2" * 64},
            "tokenizer": {"kind": "bytes", "vocab_size": 259}}
  copy = dict(record, name="local_text/train-def/1.0.0", source_path="/host1/text")
  assert run_data.identity(record) == run_data.identity(copy)
  edited = dict(copy, files={"train.txt": "3" * 64, "val.txt": "2" * 64})
  line = distributed.first_difference([{"data": run_data.identity(r)}
                                       for r in (record, edited)])
  assert line.startswith(f'data differs between processes: file train.txt (sha256) is "{"1" * 64}" '
                         f'on process 0 and "{"3" * 64}" on process 1;')
  assert run_data.identity({"name": "wmt14_translate/de-en/1.0.0"}) == {
      "dataset": "wmt14_translate/de-en/1.0.0"}


def as_process_0_of_2(monkeypatch, peer):
  """This process as process 0 of 2 to distributed.py alone (the rest of the package
  still sees one process); process 1's records are `peer(a copy of ours)`
  (distributed._exchange simulated: None when they are equal)."""
  monkeypatch.setattr(distributed, "jax", types.SimpleNamespace(process_count=lambda: 2,
                                                               process_index=lambda: 0))

  def exchange(payload):
    theirs = json.loads(payload)
    peer(theirs)
    other = json.dumps(theirs, sort_keys=True).encode()
    return None if other == payload else [payload, other]

  monkeypatch.setattr(distributed, "_exchange", exchange)


def test_only_digests_travel_unless_the_records_differ(monkeypatch):
  sent = []

  def allgather(payload):  # Process 1 holds b"theirs".
    sent.append(payload)
    return [payload, hashlib.sha256(b"theirs").digest() if len(sent) == 1 else b"theirs"]

  monkeypatch.setattr(distributed, "_allgather_bytes", allgather)
  assert distributed._exchange(b"theirs") is None  # pylint: disable=protected-access
  assert sent == [hashlib.sha256(b"theirs").digest()]
  sent.clear()
  assert distributed._exchange(b"mine") == [b"mine", b"theirs"]  # pylint: disable=protected-access
  assert sent == [hashlib.sha256(b"mine").digest(), b"mine"]


def test_agree_raises_the_line_on_every_process(monkeypatch):
  mine = {"config": {"seed": 1}, "command": {"--process_id": 0}}
  as_process_0_of_2(monkeypatch, lambda theirs: None)
  distributed.agree(mine, ConfigError)  # --process_id is left out before the exchange.
  as_process_0_of_2(monkeypatch, lambda theirs: theirs["config"].update(seed=2))
  with pytest.raises(ConfigError, match="^config differs between processes: seed is 1 on "
                     "process 0 and 2 on process 1;") as raised:
    distributed.agree(mine, ConfigError)
  assert raised.value.every_process


def test_an_error_every_process_raised_ends_each_as_one_process_would(monkeypatch):
  """fail_together's hard exit (for an error in one process, whose peers would wait) is
  not taken for agree's error, which every process raised at the same point."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  exits = []
  monkeypatch.setattr(os, "_exit", exits.append)
  agreed = ConfigError("config differs between processes: ...")
  agreed.every_process = True
  with pytest.raises(ConfigError):
    with distributed.fail_together():
      raise agreed
  assert exits == []
  with distributed.fail_together():
    raise ConfigError("only this process")
  assert exits == [1]
