"""The console shows people's lines without absl's prefix; log.txt keeps everything in full."""

import logging
import os
import re
import subprocess
import sys

import pytest

from transformer.workdir import console
from transformer.workdir import layout
from tiny import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")


def _record(pathname: str, level: int, message: str, **extra) -> logging.LogRecord:
  record = logging.LogRecord("absl", level, pathname, 1, message, (), None)
  record.__dict__.update(extra)
  return record


def test_console_filter_keeps_project_lines_and_every_real_warning():
  project = os.path.join(ROOT, "transformer", "training", "loop.py")  # A subpackage.
  library = "/venv/lib/python3.11/site-packages/jax/_src/xla_bridge.py"
  tfds = "/venv/lib/python3.11/site-packages/tensorflow_datasets/core/file_utils.py"
  shown = lambda *args, **kw: console.show_on_console(_record(*args, **kw))
  assert shown(project, logging.INFO, "step 1/10")
  assert shown(os.path.join(ROOT, "launch.py"), logging.INFO, "Workdir: x")
  assert not shown(library, logging.INFO, "Unable to initialize backend 'tpu'")
  assert not shown(os.path.join(ROOT, ".venv", "lib", "orbax", "x.py"), logging.INFO, "Saving")
  assert shown(library, logging.WARNING, "something real")
  assert not shown(tfds, logging.WARNING, "Variant folder /x has no dataset_info.json")
  assert shown(tfds, logging.ERROR, "Variant folder /x has no dataset_info.json")
  assert shown(library, logging.ERROR, "a real error")
  assert not shown(project, logging.ERROR, "for the log file only", console=False)


def test_console_and_file_formats():
  info = _record("/x/train.py", logging.INFO, "step 1/10")
  warning = _record("/x/train.py", logging.WARNING, "careful")
  assert console.ConsoleFormatter().format(info) == "step 1/10"
  assert console.ConsoleFormatter().format(warning) == "WARNING: careful"
  full = console.FullFormatter().format(info)
  assert ABSL_PREFIX.match(full) and full.endswith("train.py:1] step 1/10")


def test_log_file_is_appended_across_restarts(tmp_path):
  logger = logging.getLogger("test_console")
  for run in ("first", "second"):
    handler = console.log_to_file(str(tmp_path))
    try:
      logger.warning("%s run", run)
    finally:
      logging.getLogger().removeHandler(handler)
      handler.close()
  lines = (tmp_path / layout.LOG).read_text().splitlines()
  assert [line.split("] ")[1] for line in lines] == ["first run", "second run"]
  assert all(ABSL_PREFIX.match(line) for line in lines)


def test_launch_console_has_no_prefix_or_library_noise(tmp_path):
  """A real run: a fresh dataset build, two steps; then what stderr and log.txt hold."""
  workdir = tmp_path / "run"
  env = subprocess_env()
  del env["JAX_PLATFORMS"]  # As a user starts it: JAX probes for accelerators itself.
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch.py"), "--config=configs/gpt_small.py:local",
       f"--workdir={workdir}", f"--config.data.data_dir={tmp_path / 'tfds'}",
       "--config.model.d_model=32", "--config.model.num_layers=1",
       "--config.model.num_heads=2", "--config.model.mlp_dim=64",
       "--config.train.num_steps=2", "--config.train.log_every=1",
       "--config.train.steps_per_call=1",
       "--config.train.eval_at_start=False", "--config.train.eval_batches=1",
       "--config.checkpoint.every=100"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  console_lines = result.stderr.splitlines()
  assert not [line for line in console_lines if ABSL_PREFIX.match(line)]
  step_2 = [line for line in console_lines if line.startswith("step 2/2 (100%) | loss")]
  assert len(step_2) == 1 and re.search(r"k tok/s \| MFU \d+\.\d% \| data wait \d+% \| ETA",
                                        step_2[0])
  assert "Preparing TFDS dataset python_stdlib" in result.stderr  # The build happened...
  # jax's CUDA plugin on this driverless host (requirements-test.txt): plugin_noise.py.
  for noise in ("Generating", "Shuffling", "\x1b[", "Variant folder",
                "Unable to initialize backend", "orbax", "Could not find cuda drivers",
                "Jax plugin configuration error"):
    assert noise not in result.stderr, noise  # ... without progress bars or chatter.
  assert result.stdout == ""  # TFDS's "Downloading and preparing" banner went to the log.
  # One device: the sharding table in log.txt only, one console line saying where.
  assert "block_*/mlp/wi/kernel" not in result.stderr
  assert f"nothing is split; the table is in {workdir / layout.LOG}" in result.stderr

  log = (workdir / layout.LOG).read_text()
  # The progress line is written by training/reporting.py.
  assert re.search(r"^I\d{4} [\d:.]+ +\d+ reporting\.py:\d+\] step 2/2 \(100%\)", log, re.M)
  assert "Downloading and preparing dataset" in log
  assert "block_*/mlp/wi/kernel" in log  # The sharding table.
  assert re.search(r"^I\d{4} .* checkpoint_manager\.py:\d+\] ", log, re.M)  # Library INFO.


# The library start-up lines docs/troubleshooting.md says a CPU-only host does not show.
_START_UP_NOISE = ("Could not find cuda drivers", "Jax plugin configuration error",
                   "unexpected worker hostname", "Unable to load CUDA", "E0000",
                   "overriding jax.Array", "an error in the calculation")


def _quiet_host_env() -> dict[str, str]:
  """The environment a user's shell has: no JAX_PLATFORMS (conftest sets one), nothing
  a parent process of ours set."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_PLATFORMS", "TRANSFORMER_JAX_PLATFORMS_SET")}
  return env


@pytest.mark.parametrize("command", [
    ["launch.py", "--mode=keys", "--config=configs/gpt_small.py:local"],
    ["-m", "transformer.evaluation.harness", "--help"],
    # A sweep's run: a launch.py process whose parent chose JAX_PLATFORMS=cpu (inherited).
    ["-c", "import subprocess, sys\n"
           "from transformer.workdir import console\n"
           "assert console.quiet_absent_accelerators()\n"
           "subprocess.run([sys.executable, '-c', 'from transformer.workdir import console\\n"
           "assert console.quiet_absent_accelerators()\\nimport jax\\n"
           "with console.backends_starting(): jax.devices()'], check=True)\n"],
], ids=["keys", "harness", "child_process"])
def test_no_start_up_noise_with_the_optional_wheels_installed(command):
  """libtpu and the CUDA plugin installed, no accelerator: the lines troubleshooting.md
  says do not appear, in a mode, lm-eval's entry point and a child process."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from transformer import accelerator  # pylint: disable=g-import-not-at-top
  if accelerator.attached_accelerators():
    pytest.skip("an accelerator is attached: its libraries' lines are real")
  if not (importlib.util.find_spec("libtpu") and importlib.util.find_spec("jax_plugins")):
    pytest.skip("libtpu and jax's CUDA plugin (requirements-test.txt) are not installed")
  if command[:2] == ["-m", "transformer.evaluation.harness"] and not importlib.util.find_spec(
      "lm_eval"):
    pytest.skip("lm-eval (requirements-test.txt) is not installed")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  result = subprocess.run([sys.executable, *command], cwd=root, env=_quiet_host_env(),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  noise = [line for line in result.stderr.splitlines()
           if any(mark in line for mark in _START_UP_NOISE)]
  assert not noise, noise
  with open(os.path.join(root, "docs", "troubleshooting.md"), encoding="utf-8") as f:
    said = " ".join(f.read().split())
  assert "Could not find cuda drivers on your machine" in said and "do not appear" in said


@pytest.mark.slow  # Ten launch.py processes, each starting JAX: a few minutes.
@pytest.mark.long
def test_every_mode_starts_quietly_with_the_optional_wheels_installed(finished_tiny_run,
                                                                      tfds_data_dir, tmp_path):
  """Each mode of launch.py as a user's shell runs it (no JAX_PLATFORMS), with libtpu and
  the CUDA plugin installed: none prints a start-up line troubleshooting.md says does
  not appear (a sweep's runs and compile's XLA compile for a TPU slice included)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from transformer import accelerator  # pylint: disable=g-import-not-at-top
  if accelerator.attached_accelerators():
    pytest.skip("an accelerator is attached: its libraries' lines are real")
  if not (importlib.util.find_spec("libtpu") and importlib.util.find_spec("jax_plugins")):
    pytest.skip("libtpu and jax's CUDA plugin (requirements-test.txt) are not installed")
  run = str(tmp_path / "run")
  shutil.copytree(finished_tiny_run, run)
  tiny = f"--config=tests/tiny.py:{tfds_data_dir}"
  one_step = ["--config.train.num_steps=1", "--config.train.eval_every=1",
              "--config.checkpoint.every=1", "--config.train.eval_at_start=False"]
  commands = {
      "train": [tiny, f"--workdir={tmp_path / 'new'}", *one_step],
      "evaluate": [f"--workdir={run}"],
      "generate": [f"--workdir={run}", "--prompt=def ", "--max_new_tokens=4"],
      "average": [f"--workdir={run}", "--average_last=2", f"--output={tmp_path / 'avg'}"],
      "plot": [f"--workdir={run}"],
      "keys": [tiny],
      "sweep": [tiny, f"--workdir={tmp_path / 'sweep'}", "--sweep=seed=0,1", *one_step],
      "compile": [tiny, "--topology=v5e:2x2", "--compile_steps=train", "--notry_levers"],
  }
  noisy = {}
  for mode, argv in commands.items():
    result = subprocess.run([sys.executable, "launch.py", f"--mode={mode}", *argv], cwd=ROOT,
                            env=_quiet_host_env(), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, (mode, result.stderr[-3000:])
    noise = [line for line in result.stderr.splitlines()
             if any(mark in line for mark in _START_UP_NOISE)]
    if noise:
      noisy[mode] = noise
  assert not noisy, noisy
