"""pyproject.toml: the package installs, imports from any folder, and runs as `transformer`.

The requirement lists are one list kept in two files (requirements.txt for the quick
start, pyproject.toml for pip install .): held equal here. The install test builds a
wheel from the tracked files (in a copy: an in-tree build would leave build/ behind)
into a fresh --target folder and uses it from another folder, as a notebook would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject() -> dict:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


def _requirement_lines(name: str) -> list[str]:
  """A requirements file's requirements (comments, blank lines and `-r` lines left out)."""
  with open(os.path.join(ROOT, name), encoding="utf-8") as f:
    lines = [line.split("#", 1)[0].strip() for line in f]
  return [line for line in lines if line and not line.startswith("-")]


def test_dependencies_are_requirements_txt():
  assert _pyproject()["project"]["dependencies"] == _requirement_lines("requirements.txt")


def test_the_test_extra_is_requirements_test_txt_and_the_extras_pin_alike():
  extras = _pyproject()["project"]["optional-dependencies"]
  test_lines = _requirement_lines("requirements-test.txt")
  assert extras["test"] == test_lines
  assert set(extras) == {"benchmarks", "compile", "wandb", "test"}
  pins = {re.split(r"[=<>]", line)[0]: line for line in test_lines}
  for extra in ("benchmarks", "compile", "wandb"):
    for line in extras[extra]:
      name = re.split(r"[=<>]", line)[0]
      if name in pins:  # The same pin as the tests run with.
        assert line == pins[name], (extra, line)
  # cuDNN, so that a GPU target of --mode=compile gets the attention kernel a GPU run
  # gets: the range jax-cuda12-plugin's own [with-cuda] extra declares.
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    declared = [r for r in metadata.requires("jax-cuda12-plugin") or []
                if r.startswith("nvidia-cudnn-cu12")]
  except metadata.PackageNotFoundError:
    pytest.skip("jax-cuda12-plugin is not installed (requirements-test.txt)")
  from packaging.requirements import Requirement  # pylint: disable=g-import-not-at-top
  cudnn = [Requirement(line) for line in extras["compile"]
           if line.startswith("nvidia-cudnn-cu12")]
  assert len(declared) == 1 and len(cudnn) == 1
  assert cudnn[0].specifier == Requirement(declared[0]).specifier, (cudnn, declared)


def test_the_console_script_is_launch_py():
  import launch  # pylint: disable=g-import-not-at-top
  module, function = _pyproject()["project"]["scripts"]["transformer"].split(":")
  assert module == "launch" and getattr(launch, function) is launch.console_main


@pytest.mark.slow  # A wheel built and installed: about a minute.
@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git"))
                    and not os.path.isfile(os.path.join(ROOT, ".git")),
                    reason="needs the repository's git metadata for its tracked files")
def test_pip_install_gives_an_importable_package_and_the_transformer_command(tmp_path):
  """pip install . into a fresh folder; from another folder: the API imports and builds
  a model, and `transformer --mode=keys --config=configs/gpt_small.py:local` (a preset
  named as the docs name it) runs from the installed files alone."""
  source = tmp_path / "source"
  tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
  for name in tracked:
    if name.startswith(("transformer/", "configs/")) or name in (
        "launch.py", "pyproject.toml", "README.md"):
      if os.path.isfile(os.path.join(ROOT, name)):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(ROOT, name), source / name)
  target = tmp_path / "site"
  install = subprocess.run(
      [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
       str(target), str(source)], capture_output=True, text=True, timeout=600)
  if install.returncode and "Could not find a version that satisfies" in install.stderr:
    pytest.skip("pip could not fetch the build backend (setuptools): no package index")
  assert install.returncode == 0, install.stderr[-3000:]
  assert (target / "transformer" / "planning" / "gpu_targets" / "h100.txtpb").is_file()
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = dict(os.environ, PYTHONPATH=str(target), JAX_PLATFORMS="cpu")
  code = ("import transformer, configs\n"
          "from transformer import api\n"
          "from configs import gpt_small\n"
          "config = gpt_small.get_config('local')\n"
          "config.model.update(d_model=32, num_layers=1, num_heads=2, mlp_dim=64)\n"
          "module, params = api.build_model(config)\n"
          "print(transformer.__file__, configs.__file__, bool(params))\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  package, presets, built = out.stdout.split()
  assert package.startswith(str(target)) and presets.startswith(str(target)), out.stdout
  assert built == "True"
  keys = subprocess.run([str(target / "bin" / "transformer"), "--mode=keys",
                         "--config=configs/gpt_small.py:local"], cwd=elsewhere, env=env,
                        capture_output=True, text=True, timeout=600)
  assert keys.returncode == 0, keys.stderr[-3000:]
  assert "model.d_model = 256  # Width of the residual stream." in keys.stdout, keys.stdout[:2000]


def test_a_preset_is_named_as_the_docs_name_it_from_any_folder(tmp_path, monkeypatch):
  """Outside the repository `--config=configs/gpt_small.py:local` (or `gpt_small.py:local`)
  is the shipped preset; a file at that path in the current folder wins; other
  arguments and unknown names are left for absl to judge."""
  from transformer.cli import usage  # pylint: disable=g-import-not-at-top
  shipped = os.path.join(ROOT, "configs", "gpt_small.py")
  monkeypatch.chdir(tmp_path)
  assert usage.preset_path("--config=configs/gpt_small.py:local") == f"--config={shipped}:local"
  assert usage.preset_path("--config=gpt_small.py") == f"--config={shipped}"
  for kept in ("--config=configs/no_such.py:local", "--workdir=configs/gpt_small.py",
               "--config=other/gpt_small.py"):
    assert usage.preset_path(kept) == kept
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "gpt_small.py").write_text("def get_config(arg=None): ...\n")
  assert usage.preset_path("--config=configs/gpt_small.py:local") == (
      "--config=configs/gpt_small.py:local")  # The user's own file wins.
