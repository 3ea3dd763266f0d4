"""train.wandb_project: every metrics.jsonl row in a W&B run, read back from its offline files.

W&B's offline mode writes the run to `<WANDB_DIR>/wandb/offline-run-*/run-<id>.wandb`,
the record log `wandb sync` uploads; nothing touches the network. `offline_records`
reads that file (LevelDB's log format: 32 KiB blocks of checksummed records, each one
of wandb's own `Record` protobufs, the format `wandb sync` reads) so that the test
checks what would be uploaded, not what the code meant to log.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys

import pytest

from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.training import loop
from transformer.workdir import layout
from transformer.workdir import metrics_file

wandb = pytest.importorskip("wandb", reason="wandb is in requirements-test.txt")

_BLOCK = 32768  # LevelDB log blocks.
_FULL, _LAST = 1, 4  # Record types that end a record (FIRST 2 / MIDDLE 3 continue it).


def offline_records(path: str) -> list:
  """The protobuf records of an offline run's .wandb file, in order."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", path  # The file header: ident, magic, version (7 bytes).
  records, pending, position = [], b"", 7
  while position + 7 <= len(data):
    left = _BLOCK - position % _BLOCK
    if left < 7:  # A block's tail too short for a header is padding.
      position += left
      continue
    _, length, kind = struct.unpack("<IHB", data[position:position + 7])
    position += 7
    if kind == 0 and length == 0:  # Zero padding up to the block's end.
      position += left - 7
      continue
    pending += data[position:position + length]
    position += length
    if kind in (_FULL, _LAST):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      records.append(record)
      pending = b""
  return records


def offline_runs(wandb_dir: str) -> list[dict]:
  """Each offline run under `wandb_dir`, oldest first: its id, name, project, config and
  history rows (the scalars each wandb.log call sent, W&B's own `_` keys left out)."""
  runs = []
  for path in sorted(glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "*.wandb"))):
    run = {"rows": [], "config": {}}
    for record in offline_records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        run.update(id=record.run.run_id, name=record.run.display_name,
                   project=record.run.project)
        run["config"].update({item.key: json.loads(item.value_json)
                              for item in record.run.config.update})
      elif kind == "config":
        run["config"].update({item.key: json.loads(item.value_json)
                              for item in record.config.update})
      elif kind == "history":
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
               for item in record.history.item}
        run["rows"].append({k: v for k, v in row.items() if not k.startswith("_")})
    runs.append(run)
  return runs


@pytest.fixture
def offline(tmp_path, monkeypatch):
  """W&B offline, its folder in tmp_path: no network, no login."""
  directory = tmp_path / "wandb_dir"
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(directory))
  monkeypatch.setenv("WANDB_SILENT", "true")
  return str(directory)


def test_a_run_logs_every_metrics_row_and_a_resume_continues_the_same_run(
    tiny_config, tmp_path, offline):
  config = tiny_config
  config.train.update(num_steps=3, eval_every=3, wandb_project="desk-test")
  config.checkpoint.every = 3
  workdir = str(tmp_path / "tiny_wandb")
  loop.train_and_evaluate(config, workdir)
  config.train.num_steps = 6  # A longer run continues it (a resume).
  loop.train_and_evaluate(config, workdir)

  rows, _ = metrics_file.read_rows(os.path.join(workdir, layout.METRICS))
  runs = offline_runs(offline)
  assert len(runs) == 2, runs  # Two sessions, each an offline folder of the same run.
  with open(os.path.join(workdir, layout.WANDB_RUN), encoding="utf-8") as f:
    run_id = json.load(f)["id"]
  assert [r["id"] for r in runs] == [run_id, run_id]
  assert {r["name"] for r in runs} == {"tiny_wandb"} and {r["project"] for r in runs} == {
      "desk-test"}
  assert runs[0]["config"]["train"]["num_steps"] == 3
  assert runs[1]["config"]["model"]["d_model"] == config.model.d_model
  logged = runs[0]["rows"] + runs[1]["rows"]
  # Every metrics.jsonl row, evaluations (eval_loss at 0, 3 and 6) included, equal.
  assert logged == [{k: pytest.approx(v) for k, v in row.items()} for row in rows]
  assert [r["step"] for r in runs[1]["rows"]] == [4, 5, 6, 6]
  assert sum("eval_loss" in row for row in logged) == 3


def test_without_a_project_wandb_is_never_imported(tmp_path):
  """The default (train.wandb_project="") writes rows through the one writer without
  importing wandb: launch.py, the loop and the writer's whole path, in a fresh process."""
  code = ("import sys\n"
          "import launch\n"
          "from configs import base\n"
          "from transformer.training import loop\n"
          "from transformer.workdir import metrics_file\n"
          f"writer = metrics_file.MetricWriter({str(tmp_path)!r}, config=base.get_config())\n"
          "writer.resume(-1)\n"
          "writer.write(1, {'loss': 2.0})\n"
          "writer.close()\n"
          "print('wandb' in sys.modules)\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=root, env=dict(os.environ, JAX_PLATFORMS="cpu"), check=True,
                       timeout=300)
  assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
  assert metrics_file.read_rows(str(tmp_path / layout.METRICS))[0] == [{"step": 1, "loss": 2.0}]


def test_a_missing_wandb_package_is_one_line_naming_the_install(tiny_config, monkeypatch):
  import importlib.util  # pylint: disable=g-import-not-at-top
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  tiny_config.train.wandb_project = "p"
  with pytest.raises(ConfigError, match=r"config.train.wandb_project='p' is invalid: .*"
                     r"pip install wandb \(or pip install -e '.\[wandb\]'\)"):
    validate(tiny_config)
  tiny_config.train.wandb_project = ""
  tiny_config.train.wandb_mode = "cloud"
  with pytest.raises(ConfigError, match="config.train.wandb_mode='cloud' is invalid: valid "
                     "values are '', 'online', 'offline'"):
    validate(tiny_config)


def test_only_process_0_logs(tmp_path, offline):
  """A writer of another process (enabled=False) starts no W&B run, whatever the config."""
  from configs import base  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.train.wandb_project = "p"
  writer = metrics_file.MetricWriter(str(tmp_path), enabled=False, config=config)
  writer.resume(-1)
  writer.write(1, {"loss": 1.0})
  writer.close()
  assert not os.path.exists(tmp_path / layout.WANDB_RUN)
  assert not os.path.exists(offline)
