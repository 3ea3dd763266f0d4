"""Resuming on another mesh: saved with 8 devices as data 2 x fsdp 4, restored with 4 as
data 1 x fsdp 2 x tensor 2.

The device count is fixed when JAX starts, so each run is a process of its own
(tests/mesh_worker.py, with its own XLA_FLAGS).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVED_MESH = '(("data", 2), ("fsdp", 4), ("tensor", 1))'
RESTORED_MESH = '(("data", 1), ("fsdp", 2), ("tensor", 2))'


def _run_worker(workdir, data_dir, devices, mesh, num_steps, out):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env.pop("TRANSFORMER_TEST_KILL_AT", None)
  command = [sys.executable, os.path.join(ROOT, "tests", "mesh_worker.py"),
             f"--workdir={workdir}", f"--data_dir={data_dir}", f"--mesh={mesh}",
             f"--num_steps={num_steps}", f"--out={out}"]
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
  return result.returncode, result.stdout + result.stderr


def _name(path) -> str:
  """'params/block_0/mlp/wi/kernel' for a live TrainState's path and a restored dict's."""
  return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
                  for k in path)


def _loss_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [row for row in map(json.loads, f) if "loss" in row]


@pytest.mark.slow
def test_resume_on_a_different_mesh_and_device_count(tmp_path, tfds_data_dir):
  from transformer.data import sources  # pylint: disable=g-import-not-at-top
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  sources.load_sources(make_tiny_config(tfds_data_dir))  # Prepared once, here.
  workdir = str(tmp_path / "run")
  code, output = _run_worker(workdir, tfds_data_dir, 8, SAVED_MESH, 4, str(tmp_path / "first"))
  assert code == 0, output[-3000:]
  assert "Mesh {'data': 2, 'fsdp': 4, 'tensor': 1} over 8 devices" in output
  assert not os.path.exists(tmp_path / "first.json")  # Nothing to restore yet.

  out = str(tmp_path / "resumed")
  code, output = _run_worker(workdir, tfds_data_dir, 4, RESTORED_MESH, 6, out)
  assert code == 0, output[-3000:]
  assert "Mesh {'data': 1, 'fsdp': 2, 'tensor': 2} over 4 devices" in output
  assert "Resumed from checkpoint 4" in output
  assert "mesh.shape: " in output  # Listed among the changed settings, and applied.
  with open(out + ".json", encoding="utf-8") as f:
    restored = json.load(f)
  assert restored["step"] == 4
  assert all(mesh == {"data": 1, "fsdp": 2, "tensor": 2} for mesh in restored["meshes"])
  assert set(restored["devices"]) == {4}
  arrays = np.load(out + ".npz")
  restored_arrays = {name: arrays[f"a{i}"] for i, name in enumerate(restored["names"])}

  # The checkpoint as saved by the 8-device run, read back as plain arrays.
  saved = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", "4", "state"))
  saved_arrays = {_name(path): np.asarray(x)
                  for path, x in jax.tree_util.tree_leaves_with_path(saved)}
  restored_arrays = {_name_of_keystr(name): x for name, x in restored_arrays.items()}
  assert sorted(saved_arrays) == sorted(restored_arrays)
  for name, value in saved_arrays.items():
    np.testing.assert_array_equal(restored_arrays[name], value, err_msg=name)

  # Training went on from there: one row per step, checkpoint 6 written.
  assert [row["step"] for row in _loss_rows(workdir)] == list(range(1, 7))
  assert all(np.isfinite(row["loss"]) for row in _loss_rows(workdir))
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "6"))


def _name_of_keystr(keystr: str) -> str:
  """".params['block_0']['mlp']" (jax.tree_util.keystr) -> "params/block_0/mlp"."""
  parts = keystr.replace("]", "").replace("[", ".").split(".")
  return "/".join(part.strip("'") for part in parts if part)
