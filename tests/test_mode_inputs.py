"""What a command is given reaches it: text inputs, flags, preset knobs, a quiet console.

  - a UTF-8 byte-order mark is dropped (and said once) from every text input, training
    files included, and --input may be anything readable (a pipe, /dev/null);
  - every flag of transformer/cli/ is read by the modes that list it (a mode's own
    module, or its SHARED_FLAGS) and refused by the others (rows in test_bad_inputs);
  - a preset's train.steps_per_call gives way to the cadences a command sets, while an
    explicit one that conflicts is refused;
  - on a host without a TPU or GPU, starting JAX prints none of libtpu's or the CUDA
    plugin's complaints, and a host with an accelerator's device node is left alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
import subprocess
import sys

import pytest

import launch
from configs import gpt_small
from configs import transformer_base
from transformer import accelerator
from transformer.cli import common
from transformer.cli import sweep
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.data.datasets import local_files
from transformer.workdir import console

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOM = "\ufeff"


# ---------------------------------------------------------------- text input


def test_input_drops_a_byte_order_mark_once_and_reads_pipes_and_dev_null(tmp_path, caplog):
  path = tmp_path / "in.txt"
  path.write_bytes((BOM + "\nsecond\n").encode("utf-8"))  # A BOM-only first line.
  with caplog.at_level(logging.INFO):
    assert common.read_lines(str(path), sys.stdin) == ["", "second"]
  assert [r.getMessage() for r in caplog.records if "byte-order mark" in r.getMessage()] == [
      f"{path} starts with a UTF-8 byte-order mark (U+FEFF): dropped, not read as text"]
  stdin = io.TextIOWrapper(io.BytesIO((BOM + "a\n").encode("utf-8")), encoding="utf-8")
  assert common.read_lines("", stdin) == ["a"]
  # `--input=<(...)` is a /dev/fd pipe; /dev/null reads empty. Neither is a regular file.
  read, write = os.pipe()
  os.write(write, (BOM + "x\ny\n").encode("utf-8"))
  os.close(write)
  try:
    assert common.read_lines(f"/dev/fd/{read}", sys.stdin) == ["x", "y"]
  finally:
    os.close(read)
  assert common.read_lines("/dev/null", sys.stdin) == []
  with pytest.raises(ConfigError, match=r"^--input='.*nope' does not exist; give a file"):
    common.read_lines(str(tmp_path / "nope"), sys.stdin)
  with pytest.raises(ConfigError, match=r"is a folder; give a file"):
    common.read_lines(str(tmp_path), sys.stdin)


def test_training_files_drop_a_byte_order_mark(tmp_path, caplog):
  raw = (BOM + "first line\n").encode("utf-8")
  (tmp_path / "a.txt").write_bytes(raw)
  source, = local_files.hash_files(str(tmp_path), ["a.txt"])
  assert source == local_files.SourceFile(str(tmp_path), "a.txt",
                                          hashlib.sha256(raw).hexdigest(), len(raw), True)
  # Its build is named apart from one that kept the mark (made before it was dropped).
  name = lambda *files: local_files.make_config(str(tmp_path), "1.0.0", files, {}, {}).name
  assert name(source) != name(dataclasses.replace(source, has_bom=False))
  with caplog.at_level(logging.INFO):
    for decode_errors in ("strict", "replace", "strict"):  # Said once per file.
      assert local_files.read_text(source, decode_errors) == "first line\n"
  assert sum("byte-order mark" in r.getMessage() for r in caplog.records) == 1
  # A BOM after the start is text (U+FEFF as a zero-width no-break space), kept.
  assert local_files.strip_bom("a" + BOM, "x") == "a" + BOM


# ---------------------------------------------------------------- flags a mode reads


def test_every_cli_flag_is_read_by_the_modes_that_list_it():
  readers = launch.usage.flag_readers(launch.MODES)
  assert readers["input"] == ["translate", "generate", "classify"]
  assert sorted(readers["output"]) == ["average", "benchmark", "classify", "compile",
                                       "evaluate", "generate", "passkey", "translate"]
  assert readers["prompt"] == ["generate"] and readers["split"] == ["evaluate"]
  assert readers["beam_size"] == ["evaluate", "translate", "generate"]
  # Each name a mode lists is a flag cli/common.py defines (a typo would read nothing),
  # and every flag of cli/common.py is read by some mode.
  common_flags = {f.name for f in launch.flags.FLAGS.get_flags_for_module(common.__name__)}
  for name, module in launch.MODES.items():
    assert set(module.SHARED_FLAGS) <= common_flags, name
  assert all(readers[name] for name in common_flags)


# ---------------------------------------------------------------- preset speed knobs


@pytest.mark.parametrize("preset,key,value,expected", [
    (gpt_small.get_config("local"), "train.log_every", 5, 5),
    (gpt_small.get_config("local"), "train.eval_every", 75, 5),
    (transformer_base.get_config("multi30k"), "train.eval_every", 75, 5),
    (transformer_base.get_config("multi30k"), "checkpoint.every", 64, 2),
    (gpt_small.get_config("local"), "train.log_every", 40, 10),  # Divides already: kept.
])
def test_a_presets_steps_per_call_gives_way_to_a_cadence(preset, key, value, expected, caplog):
  group, name = key.split(".")
  preset[group][name] = value
  with caplog.at_level(logging.WARNING):
    common.fit_steps_per_call(preset, explicit={key: value})
  assert preset.train.steps_per_call == expected
  if preset.data.name == "local_parallel":  # :multi30k names its files on the command line.
    preset.data.path = "multi30k"
  validate(preset)
  said = [r.getMessage() for r in caplog.records if "steps_per_call" in r.getMessage()]
  assert said == ([] if expected == 10 else [
      f"train.steps_per_call=10 (the preset's) does not divide {key}={value}: using "
      f"{expected}, the largest value <= 10 that divides them all (set "
      "--config.train.steps_per_call to choose)"])


def test_an_explicit_steps_per_call_that_conflicts_is_refused():
  config = gpt_small.get_config("local")
  config.train.log_every = 5
  common.fit_steps_per_call(config, explicit={"train.log_every": 5,
                                              "train.steps_per_call": 10})
  assert config.train.steps_per_call == 10
  with pytest.raises(ConfigError, match=r"steps_per_call=10 is invalid: train.log_every=5"):
    validate(config)


def test_each_sweep_run_fits_steps_per_call_as_its_own_process_will():
  """The sweep's record and each run's process derive the same value from the same flags."""
  arms = sweep.build_runs(gpt_small.get_config("local"), "train.log_every=5,4,20",
                          fixed={"train.eval_every": 100})
  assert [arm.config.train.steps_per_call for arm in arms] == [5, 4, 10]
  with pytest.raises(ConfigError, match=r"run 1/2 \(train.log_every=5\).*steps_per_call=10"):
    sweep.build_runs(gpt_small.get_config("local"), "train.log_every=5,10",
                     fixed={"train.steps_per_call": 10})


# ---------------------------------------------------------------- console


def test_accelerator_device_nodes_are_detected(tmp_path):
  dev = tmp_path / "dev"
  (dev / "vfio").mkdir(parents=True)
  (dev / "vfio" / "vfio").touch()  # The VFIO container exists on hosts without a TPU.
  assert accelerator.attached_accelerators(str(tmp_path)) == []
  for node in ("accel0", "vfio/0", "nvidia0", "nvidiactl"):  # TPU v4, TPU v5+, NVIDIA.
    (dev / node).touch()
    assert accelerator.attached_accelerators(str(tmp_path)) == [str(dev / node)]
    (dev / node).unlink()
  # JAX_PLATFORMS the user set is theirs: left alone (this process's conftest sets it).
  assert "JAX_PLATFORMS" in os.environ and not console.quiet_absent_accelerators(str(tmp_path))


_START = """
import os, sys
from transformer.workdir import console
cpu_only = console.quiet_absent_accelerators(sys.argv[1])
import jax
with console.backends_starting():
  platform = jax.devices()[0].platform
print(cpu_only, os.environ.get("JAX_PLATFORMS"), platform)
"""


def test_jax_starts_quietly_without_accelerators_and_untouched_with_one(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  quiet = subprocess.run([sys.executable, "-c", _START, str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
  assert quiet.stdout.split() == ["True", "cpu", "cpu"]
  for noise in ("cuda", "CUDA", "E0000", "worker hostname", "TPU", "Traceback"):
    assert noise not in quiet.stderr, quiet.stderr[-3000:]
  # A host with a TPU's device node: JAX_PLATFORMS stays unset, JAX picks its backends.
  (tmp_path / "dev").mkdir()
  (tmp_path / "dev" / "accel0").touch()
  untouched = subprocess.run(
      [sys.executable, "-c", _START.replace("jax.devices()[0].platform", "'not started'"),
       str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
      check=True)
  assert untouched.stdout.split()[:2] == ["False", "None"]
