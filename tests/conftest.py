"""Shared test setup: 8 simulated CPU devices, strict rank promotion, tiny configs."""

import atexit
import os
import shutil
import signal
import sys
import tempfile

# Must happen before JAX initialises its backends: sharding code runs on 8 CPU "devices".
# The tests are CPU-only by design; libtpu (requirements-test.txt, for --mode=compile's
# abstract TPU devices) would otherwise make every process probe for a TPU first.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests' programs are tiny: compiling them is most of a test's time, running them
# little. LLVM's optimisation level 0 for XLA's CPU code (XLA's own HLO passes, the
# fusions and layouts, are unchanged) cut the training, golden and sharding tests from
# 105 to 65 s and the suite from 598 to 512 s on a 2-core AMD EPYC; every test passes
# with it, the golden steps' recorded losses (rtol 2e-4) included. launch.py's own
# runs keep XLA's default.
# XLA's elemental emitters for CPU fusions instead of its newer fusion emitters: the
# tiny training's process took 0.80x the CPU seconds of -O0 alone (13.7 vs 17.2, medians
# of three interleaved runs, AMD EPYC 2 cores, quiet; XLA's defaults: 26.5), backend
# compile 4.9 vs 7.0 s: `python benchmarks/cpu_compile_flags.py --repeats=3`
# (docs/performance.md, "Test-suite run times"). Every test, the golden steps included,
# passes with it. libtpu does not register the flag: planning/topology.py takes the
# --xla_cpu_* flags out before it loads.
# One LLVM module a program instead of XLA's split into parts compiled on threads: the
# split and the module clones it makes were a third of the LLVM share of a profile
# (perf, the tiny train step), and with two workers on two cores no core is idle for
# the parts. A small gain at best: the tiny training 0.93x the CPU seconds in one
# comparison, 0.96x in benchmarks/cpu_compile_flags.py's (docs/performance.md).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8"
                           " --xla_backend_optimization_level=0"
                           " --xla_cpu_use_fusion_emitters=false"
                           " --xla_cpu_parallel_codegen_split_count=1").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Many tests compile the same tiny model (in this process, in pytest-xdist's other
# worker, in launch.py subprocesses): JAX's persistent compilation cache, one per test
# session (the environment carries it to workers and subprocesses), compiles each once.
# A folder given in JAX_COMPILATION_CACHE_DIR is used and kept: .ci/run gives its two
# passes (default, then slow) one, so the slow pass's launch.py subprocesses load the
# programs the default pass compiled (a key is the program, its compile options and
# jax/XLA's versions, so a stale entry cannot be loaded for another program).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="transformer_tests_jax_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
# A shell starts a command run in the background (`pytest ... &`, a CI step in a
# non-interactive shell, nohup) with SIGINT ignored, and the tests' `launch.py`
# subprocesses would inherit that: a test that Ctrl-C's one (it must exit 130) saw it
# ignored and the command run to its end (exit 0). Python's own handler here: a
# subprocess then starts with SIGINT at its default, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update("jax_numpy_rank_promotion", "raise")


def _session_folder(tmp_path_factory, name: str) -> str:
  """`name` in a folder this test session's pytest-xdist workers share (the session's
  base temporary folder; with -n 0, the one process's)."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):  # Workers' base folders: <session>/popen-gwN.
    base = base.parent
  return str(base / name)


def pytest_collection_finish(session) -> None:
  """The collector set as launch.py sets it (transformer/gc_tuning.py), once every test
  module is imported: the tests trace thousands of programs, and at CPython's default
  thresholds the collections that walk jax's, flax's and the test modules' objects were
  about an eighth of a tracing process's samples (perf; what that saves: gc_tuning.py)."""
  del session
  from transformer import gc_tuning  # pylint: disable=g-import-not-at-top
  gc_tuning.tune()


def pytest_collection_modifyitems(config, items) -> None:
  """Tests marked `long` first, the rest in their order (pytest.ini: with worksteal, the
  worker that starts on a long test gives its other tests away as the other runs out)."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def tfds_data_dir(tmp_path_factory) -> str:
  """A TFDS data dir private to this test session, shared by its workers (the stdlib
  dataset builds once, ~2 s; two builders take the product's build lock in turn:
  data/datasets/catalog.py)."""
  folder = _session_folder(tmp_path_factory, "tensorflow_datasets")
  os.makedirs(folder, exist_ok=True)
  return folder


@pytest.fixture(scope="session")
def finished_tiny_run(tfds_data_dir, tmp_path_factory) -> str:
  """The tiny config trained to its end once per session (6 steps, checkpoints 3 and 6):
  a pristine run that tests copy before they change it (test_bad_inputs, test_crash_safety,
  test_api, test_console). The first worker to ask trains it under a build lock; the other
  waits for it and reuses it."""
  from transformer.training import loop  # pylint: disable=g-import-not-at-top
  from transformer.workdir import checkpointing  # pylint: disable=g-import-not-at-top
  from transformer.workdir import lock  # pylint: disable=g-import-not-at-top
  config = make_tiny_config(tfds_data_dir)
  workdir = _session_folder(tmp_path_factory, "finished_tiny_run")
  with lock.building(workdir + ".lock", "the tests' finished tiny run"):
    if checkpointing.newest_complete_step(workdir) != config.train.num_steps:
      loop.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture
def tiny_config(tfds_data_dir):
  """A fresh tiny config per test (tests mutate it)."""
  return make_tiny_config(tfds_data_dir)


@pytest.fixture(autouse=True)
def _logging_state_restored():
  """Each test leaves the loggers as it found them. launch.run() in-process (absl's flag
  parsing, console.setup_console) sets absl's logger level and handlers; a later test
  in the same worker that reads INFO records through caplog would otherwise depend on
  which tests ran before it (seen: "said once" lines missing only in the full suite)."""
  import logging  # pylint: disable=g-import-not-at-top
  loggers = [logging.getLogger(), logging.getLogger("absl")]
  saved = [(lg, lg.level, lg.propagate, list(lg.handlers), list(lg.filters)) for lg in loggers]
  yield
  for lg, level, propagate, handlers, filters in saved:
    lg.setLevel(level)
    lg.propagate = propagate
    lg.handlers[:] = handlers
    lg.filters[:] = filters
  # Records logged before any log file (console._early_records, replayed into the first
  # log.txt a command opens) belong to this test's command, not to the next test's file
  # (seen: test_console's log.txt opened with another test's unseen-characters line).
  console = sys.modules.get("transformer.workdir.console")
  if console is not None:
    console._early_records.records.clear()  # pylint: disable=protected-access
