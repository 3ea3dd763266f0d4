"""--mode=prepare --ray_address on a real Ray cluster of this machine (tests/local_ray.py).

The cluster tests (a head and a worker node, one CPU each, bound to 127.0.0.1) are slow:
starting the nodes alone takes 15-40 s on a shared 2-core machine. They hold the Ray path to
the local one byte for byte, with a worker killed mid-task too. The fast tests need no
cluster: the one-line errors, the folder check's answers, and that a local preparation
never imports Ray.
"""

import os
import socket
import subprocess
import sys

import pytest

from local_ray import cluster  # pylint: disable=unused-import  (the fixture)
from test_corpus import ROOT, config, digests, launch_prepare, prepare, write_large_files  # pylint: disable=unused-import
from transformer.config.errors import ConfigError
from transformer.data.corpus import on_ray
from transformer.data.corpus import preparation


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_the_test_cluster_listens_on_loopback_only(cluster):
  listening = cluster.listening()
  assert listening and all(a.split(":")[-2] in ("127.0.0.1", "[::1]") or
                           a.startswith(("127.", "::ffff:127.")) for a in listening), listening


@pytest.mark.slow
def test_prepare_on_ray_is_the_local_preparation_byte_for_byte(config, cluster, tmp_path):
  """Four formats and three large files in parts (a .jsonl by byte ranges, parquet by row
  groups), over two nodes, against one process with no parts."""
  write_large_files(config.data.path)
  job, _ = prepare(config)
  local = digests(job.output)
  result = launch_prepare(config, f"--ray_address={cluster.address}",
                          "--config.data.prepare_piece_mb=0.01",
                          f"--config.data.data_dir={tmp_path / 'ray'}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Ray cluster at 127.0.0.1" in result.stderr and "2 node(s)" in result.stderr
  assert "files in parts" in result.stderr and "joining the parts" in result.stderr
  assert "tasks, " in result.stderr and "M tokens/s" in result.stderr
  assert "Prepared corpus: 7 files" in result.stderr
  assert digests(job.output.replace(str(tmp_path / "data"), str(tmp_path / "ray"))) == local


@pytest.mark.slow
def test_a_worker_killed_mid_task_is_retried_and_the_corpus_is_identical(config, cluster,
                                                                         tmp_path):
  job, _ = prepare(config)
  local = digests(job.output)
  once = tmp_path / "killed_once"
  result = launch_prepare(config, f"--ray_address={cluster.address}",
                          f"--config.data.data_dir={tmp_path / 'ray'}",
                          env={"TRANSFORMER_TEST_KILL_AT": "prepare_writing:1",
                               "TRANSFORMER_TEST_KILL_ONCE": str(once)})
  assert result.returncode == 0, result.stderr[-3000:]
  assert once.exists()  # The worker of file 1 SIGKILLed itself, half-way through its shard.
  assert digests(job.output.replace(str(tmp_path / "data"), str(tmp_path / "ray"))) == local


@pytest.mark.slow
def test_a_node_without_the_projects_packages_is_one_line(config, cluster, monkeypatch):
  import ray  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
  monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)  # pylint: disable=protected-access
  monkeypatch.setattr(on_ray, "REQUIRED_MODULES",
                      on_ray.REQUIRED_MODULES + ("no_such_package_here",))
  job, _ = prepare(config)
  try:
    with pytest.raises(ConfigError, match=r"^--ray_address: node 127.0.0.1 lacks the "
                       r"project's packages no_such_package_here: pip install -r "
                       r"requirements.txt on every node"):
      on_ray.runner(cluster.address, job, preparation.set_reporter)
  finally:
    ray.shutdown()
  assert not [n for n in os.listdir(job.output) if n.startswith(".ray-probe")]


def test_an_address_with_no_cluster_or_not_an_address_is_one_line(config):
  address = f"127.0.0.1:{_free_port()}"
  result = launch_prepare(config, f"--ray_address={address}")
  assert result.returncode == 2
  line = result.stderr.strip().splitlines()[-1].removeprefix("ConfigError: ")
  assert line.startswith(f"--ray_address={address}: no Ray cluster answers at {address} (")
  assert "ray start --head --port=6379" in line and "Traceback" not in result.stderr
  # auto: where RAY_ADDRESS (or the cluster this machine last started) points, checked.
  result = launch_prepare(config, "--ray_address=auto", env={"RAY_ADDRESS": address})
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].removeprefix("ConfigError: ").startswith(
      f"--ray_address=auto: no Ray cluster answers at {address} (")
  result = launch_prepare(config, "--ray_address=headnode")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].removeprefix("ConfigError: ") == (
      "--ray_address='headnode' is invalid: expected 'auto' or HOST:PORT of a running Ray "
      "cluster's head (e.g. 10.0.0.5:6379)")


def test_the_retired_shard_key_points_to_ray_address(config):
  result = launch_prepare(config, "--config.data.prepare_shard=0/2")
  assert result.returncode == 1
  assert "--config.data.prepare_shard is retired" in result.stderr
  assert "--ray_address" in result.stderr


def test_a_node_that_sees_another_folder_or_none_says_so(tmp_path):
  """The folder check's answers (what a node runs, called here): the same folder, another
  folder at the same path (the marker differs), no folder."""
  src, out = tmp_path / "src", tmp_path / "out"
  src.mkdir()
  out.mkdir()
  (src / "a.txt").write_text("text\n")
  (out / ".ray-probe").write_text("token")
  same = on_ray._probe(("numpy",), str(src), "a.txt", str(out), "token")  # pylint: disable=protected-access
  assert same["problem"] == "" and os.path.exists(same["marker"]) and not same["missing"]
  other = on_ray._probe(("numpy", "no_such_package_here"), str(src), "a.txt", str(out),  # pylint: disable=protected-access
                        "another token")
  assert other["missing"] == ["no_such_package_here"]
  assert other["problem"].startswith(f"sees another folder at {out}")
  gone = on_ray._probe((), str(src), "a.txt", str(tmp_path / "absent"), "token")  # pylint: disable=protected-access
  assert gone["problem"].startswith(f"cannot read or write the corpus folder {tmp_path / 'absent'}")
  nothing = on_ray._probe((), str(tmp_path / "elsewhere"), "a.txt", str(out), "token")  # pylint: disable=protected-access
  assert nothing["problem"].startswith("does not see the source file")


def test_a_local_preparation_never_imports_ray(config):
  """Without --ray_address the local pool runs the tasks and Ray stays unimported."""
  script = (
      "import sys; sys.path.insert(0, 'tests')\n"
      "from tiny import make_tiny_config\n"
      "from transformer.cli import prepare\n"
      f"config = make_tiny_config({config.data.data_dir!r})\n"
      f"config.data.update(name='corpus', path={config.data.path!r}, tokenizer='bytes',\n"
      f"                   data_dir={config.data.data_dir!r}, prepare_workers=2,\n"
      "                   val_fraction=0.2)\n"
      "config.model.vocab_size = 0\n"
      "from absl import flags; flags.FLAGS(['x'])\n"
      "assert prepare.main(config, None) == 0\n"
      "print('ray imported:', 'ray' in sys.modules)\n")
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "ray imported: False" in result.stdout
