"""Bad inputs through launch.py: each gets an exit status, a message that names what is wrong
and what is valid, no traceback, and leaves every file in the workdir as it was.

One table row per input. Most rows run in this process through the entry point of
`python launch.py` (`launch.run(argv)`: absl flag parsing, then `launch.main`); the
rows marked `subprocess` run `python launch.py` itself. Before a row runs, its
workdir is snapshotted (every file's sha256, mtime and size); afterwards every file
must still be there, unchanged (log.txt: only appended to; the lock file: holds the PID of
the last command that held the workdir). docs/troubleshooting.md
lists the same cases.
"""

from __future__ import annotations

import builtins
import dataclasses
import errno
import hashlib
import io
import json
import gzip
import logging as std_logging
import os
import shutil
import signal
import subprocess
import sys
from typing import Callable

import grain
import jax
import pytest
from absl import flags
from absl import logging as absl_logging

import launch
from configs import base
from tiny import make_tiny_config, subprocess_env
from transformer import sharding
from transformer.training import trainer as trainer_lib
from transformer.workdir import checkpointing
from transformer.workdir import layout
from transformer.workdir import lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "--config=tests/tiny.py:{data_dir}"  # tests/tiny.py's get_config(data_dir).
WORKDIR = "--workdir={workdir}"
# A row that hangs (the seq2seq source without pairs once did) fails after this long.
# Generous: on a shared 2-core machine starting JAX alone can take a minute.
SUBPROCESS_TIMEOUT_S = 900


# ---------------------------------------------------------------- the harness


@dataclasses.dataclass(frozen=True)
class Paths:
  """Where a row's files go; argv strings are formatted with these fields."""

  data_dir: str  # The session's TFDS data dir (the offline corpus, built once).
  workdir: str  # The row's workdir (a copy of a trained run when the row asks for one).
  files: str  # A folder for the row's input files.
  trained: str  # The pristine trained run (never handed to a row to write into).
  other: str  # A run of a model with a wider MLP, when the row asks for one.


@dataclasses.dataclass(frozen=True)
class Case:
  """One bad input and what launch.py must do with it."""

  name: str
  argv: tuple[str, ...]  # Formatted with Paths' fields.
  code: int  # The exit status.
  messages: tuple[str, ...]  # Substrings of stderr (+ stdout), formatted with Paths too.
  setup: Callable[[Paths], None] | None = None  # Writes the row's inputs.
  trained_workdir: bool = False  # Start from a copy of a trained run.
  other_run: bool = False  # Needs Paths.other.
  subprocess: bool = False  # `python launch.py` instead of the in-process entry point.
  patch: Callable[[pytest.MonkeyPatch, Paths], None] | None = None  # In-process faults.
  creates_nothing: bool = False  # The workdir must not exist afterwards (not even log.txt).
  # Paths (formatted with Paths' fields) that must not exist afterwards: an output
  # folder written complete or not at all, and its temporary sibling.
  absent: tuple[str, ...] = ()
  # Files a row that resumes and trains steps before failing may change: config.json
  # (its applied train.num_steps), the steps' metrics rows (dropped again on resume) and
  # run.json's session record.
  may_change: tuple[str, ...] = ()


# The workdir's logs: launch.py appends to them on every start, failed or not.
APPEND_ONLY = ("log.txt",)
# The workdir's lock (workdir/lock.py): each command that holds it writes its PID there.
HOLDER_RECORD = ("lock",)


def _snapshot(workdir: str) -> dict[str, tuple[str, int, int]]:
  """{relative path: (sha256, mtime_ns, size)} of every file under `workdir`."""
  files = {}
  for folder, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(folder, name)
      with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
      stat = os.stat(path)
      files[os.path.relpath(path, workdir)] = (digest, stat.st_mtime_ns, stat.st_size)
  return files


def _starts_with(path: str, size: int, digest: str) -> bool:
  """Whether the file's first `size` bytes hash to `digest` (an appended file kept its start)."""
  with open(path, "rb") as f:
    return hashlib.sha256(f.read(size)).hexdigest() == digest


def _reset_flags() -> None:
  """Every flag back to its default, and the per-run --config.* override flags gone."""
  flags.FLAGS.unparse_flags()
  for name in list(flags.FLAGS):
    if name.startswith("config."):  # config_flags defines one flag per override it parses.
      delattr(flags.FLAGS, name)


def _launch_in_process(argv: list[str], monkeypatch) -> tuple[int, str]:
  """Runs launch.py's entry point as `python launch.py *argv` would; (exit status, stderr)."""
  # launch sets the console's format and filter on absl's handler, and parsing (then
  # resetting) --verbosity sets absl's logger level: later tests' caplog needs them back.
  absl_handler, absl_logger = absl_logging.get_absl_handler(), absl_logging.get_absl_logger()
  absl_state = (absl_logger.level, absl_handler.formatter, list(absl_handler.filters))
  monkeypatch.chdir(ROOT)
  # config_flags finds --config.* overrides in sys.argv; absl parses the argv given.
  monkeypatch.setattr(sys, "argv", ["launch.py"] + argv)
  _reset_flags()
  stderr, stdout = io.StringIO(), io.StringIO()
  monkeypatch.setattr(sys, "stderr", stderr)
  monkeypatch.setattr(sys, "stdout", stdout)
  root_handlers = list(std_logging.getLogger().handlers)  # launch adds <workdir>/log.txt.
  try:
    launch.run(["launch.py"] + argv)
    code = 0
  except SystemExit as e:
    code = 0 if e.code is None else e.code
  finally:
    _reset_flags()
    monkeypatch.undo()
    absl_logger.setLevel(absl_state[0])
    absl_handler.setFormatter(absl_state[1])
    absl_handler.filters[:] = absl_state[2]
    for handler in list(std_logging.getLogger().handlers):  # A copy: removing below.
      if handler not in root_handlers:
        std_logging.getLogger().removeHandler(handler)
        try:
          handler.close()
        except OSError:  # Its file is on the row's simulated full disk.
          pass
  # An exception other than SystemExit propagates: in `python launch.py` it is a traceback.
  return code, stderr.getvalue() + stdout.getvalue()


def _launch_subprocess(argv: list[str]) -> tuple[int, str]:
  env = subprocess_env()
  result = subprocess.run([sys.executable, "launch.py"] + argv, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                          check=False)
  return result.returncode, result.stderr + result.stdout


@pytest.fixture
def trained_run(finished_tiny_run):
  """The tiny config trained to its end (6 steps; checkpoints 3 and 6), kept pristine."""
  return finished_tiny_run


@pytest.fixture(scope="module")
def other_run(tmp_path_factory, tfds_data_dir):
  """Checkpoint 1 of a model with a twice as wide MLP: its initial state, no training."""
  config = make_tiny_config(tfds_data_dir)
  config.model.mlp_dim = 128
  trainer = trainer_lib.Trainer.create(config, sharding.make_mesh(config.mesh))
  workdir = str(tmp_path_factory.mktemp("other") / "run")
  checkpointer = checkpointing.Checkpointer(workdir, config.checkpoint)
  try:
    with trainer.context():
      state = trainer.init(jax.random.PRNGKey(0))
    checkpointer.save(1, state, iter(grain.MapDataset.range(1).to_iter_dataset()))
  finally:
    checkpointer.close()
  return workdir


def _run_case(case: Case, tmp_path, data_dir: str, trained: str, other: str):
  paths = Paths(data_dir=data_dir, workdir=str(tmp_path / "run"), files=str(tmp_path / "files"),
                trained=trained, other=other)
  os.makedirs(paths.files)
  if case.trained_workdir:
    shutil.copytree(trained, paths.workdir)
  if case.setup:
    case.setup(paths)
  before = _snapshot(paths.workdir) if os.path.isdir(paths.workdir) else {}
  argv = [arg.format(**dataclasses.asdict(paths)) for arg in case.argv]
  if case.subprocess:
    code, output = _launch_subprocess(argv)
  else:
    with pytest.MonkeyPatch.context() as monkeypatch:
      if case.patch:
        case.patch(monkeypatch, paths)
      code, output = _launch_in_process(argv, monkeypatch)
  return paths, before, code, output


def _check(case: Case, paths: Paths, before, code: int, output: str) -> None:
  assert "Traceback" not in output, output[-5000:]
  assert code == case.code, output[-5000:]
  for message in case.messages:
    assert message.format(**dataclasses.asdict(paths)) in output, output[-5000:]
  if case.creates_nothing:
    assert not os.path.exists(paths.workdir), os.listdir(paths.workdir)
  for path in case.absent:
    path = path.format(**dataclasses.asdict(paths))
    assert not os.path.lexists(path), f"{path} was left behind"
  after = _snapshot(paths.workdir) if os.path.isdir(paths.workdir) else {}
  for name, (digest, mtime, size) in before.items():
    assert name in after, f"{name} was removed from the workdir"
    if name in HOLDER_RECORD + case.may_change:
      continue
    if name in APPEND_ONLY:
      assert _starts_with(os.path.join(paths.workdir, name), size, digest), f"{name} lost lines"
    else:
      assert after[name] == (digest, mtime, size), f"{name} was rewritten"


# ---------------------------------------------------------------- inputs the rows write


_HELD_LOCKS = []  # Locks rows hold "in another command": kept until the tests end.


def _hold_the_lock(paths: Paths) -> None:
  """The workdir locked by this process: a flock on another open file conflicts alike."""
  held = lock.hold(paths.workdir)
  held.__enter__()  # pylint: disable=unnecessary-dunder-call
  _HELD_LOCKS.append(held)


def _write(path: str, content: str | bytes) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(content.encode("utf-8") if isinstance(content, str) else content)


def _lines(count: int, words: str = "the quick brown fox jumps over the lazy dog") -> str:
  return "".join(f"{i} {words}\n" for i in range(count))


def _parallel(paths: Paths, train_de: str | None = None) -> None:
  _write(os.path.join(paths.files, "par", "train.en"), _lines(40))
  _write(os.path.join(paths.files, "par", "train.de"), train_de or _lines(40).upper())
  _write(os.path.join(paths.files, "par", "val.en"), _lines(8))
  _write(os.path.join(paths.files, "par", "val.de"), _lines(8).upper())


def _tsv(paths: Paths, train: str) -> None:
  _write(os.path.join(paths.files, "tsv", "train.tsv"), train)
  _write(os.path.join(paths.files, "tsv", "dev.tsv"), "sentence\tlabel\nfine\t1\nbad\t0\n")


def _damage_newest_checkpoint(paths: Paths) -> None:
  """Truncates the largest file of checkpoint 6 (its size was recorded when saved)."""
  step_dir = os.path.join(paths.workdir, "checkpoints", "6")
  files = [os.path.join(d, f) for d, _, names in os.walk(step_dir) for f in names]
  largest = max(files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    f.truncate(os.path.getsize(largest) // 2)


def _other_model_checkpoints(paths: Paths) -> None:
  """Replaces the workdir's checkpoints with those of a run whose MLP is twice as wide."""
  shutil.rmtree(os.path.join(paths.workdir, "checkpoints"))
  shutil.copytree(os.path.join(paths.other, "checkpoints"),
                  os.path.join(paths.workdir, "checkpoints"))


def _two_process_data_positions(paths: Paths) -> None:
  """Makes checkpoint 6 look written by two processes (one data position each)."""
  step_dir = os.path.join(paths.workdir, "checkpoints", "6")
  data = os.path.join(step_dir, "data")
  os.rename(os.path.join(data, "process_0-of-1.json"), os.path.join(data, "process_0-of-2.json"))
  shutil.copy(os.path.join(data, "process_0-of-2.json"), os.path.join(data, "process_1-of-2.json"))
  sizes_path = os.path.join(step_dir, layout.FILE_SIZES)  # As a 2-process save records.
  with open(sizes_path, encoding="utf-8") as f:
    sizes = json.load(f)
  size = sizes.pop(os.path.join("data", "process_0-of-1.json"))
  for name in ("process_0-of-2.json", "process_1-of-2.json"):
    sizes[os.path.join("data", name)] = size
  _write(sizes_path, json.dumps(sizes))


def _orbax_disk_full(monkeypatch, paths: Paths) -> None:
  """A patch: Orbax's save fails as on a full disk (tensorstore's RESOURCE_EXHAUSTED),
  after its background thread logged the failure with a long traceback."""
  del paths
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  text = ("RESOURCE_EXHAUSTED: Error writing local file \"/x/ocdbt.process_0/d/1\": "
          "[OS error 28: No space left on device]")

  def save(*args, **kwargs):
    try:
      raise ValueError(text)
    except ValueError:
      # As Orbax's async thread does (its module path is not this project's).
      std_logging.getLogger("orbax.checkpoint").exception("Failed to save")
    raise ValueError(text)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)


def _sigterm_while_orbax_saves(monkeypatch, paths: Paths) -> None:
  """A patch: SIGTERM arrives as Orbax starts writing (its threads then write on)."""
  del paths
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  real = ocp.CheckpointManager.save

  def save(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(self, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)


def _sigterm_after_the_final_rename(monkeypatch, paths: Paths) -> None:
  """A patch: SIGTERM arrives just after the output folder was renamed into place."""
  from transformer.workdir import files  # pylint: disable=g-import-not-at-top
  real = files._fsync_directory  # pylint: disable=protected-access

  def fsync_directory(directory):
    real(directory)
    if os.path.abspath(directory) == os.path.abspath(paths.files):  # The folder's parent.
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(files, "_fsync_directory", fsync_directory)


def _tfds_disk_full(monkeypatch, paths: Paths) -> None:
  """A patch: preparing a dataset fails as TFDS does on a full data_dir."""
  del paths
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  def download_and_prepare(self, *args, **kwargs):
    try:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.data_dir))
    except OSError as e:
      raise RuntimeError("Failed to finalize writing of split 'train'") from e

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", download_and_prepare)


def _no_new_files_in_workdir(monkeypatch, paths: Paths) -> None:
  """A patch: no new file can be created in the workdir (a read-only run).

  The one atomic write creates its temporary file with open(..., "xb") beside the
  target; creating it is refused as a read-only directory refuses it, while files that
  exist stay readable.
  """
  real_open = builtins.open
  root = os.path.abspath(paths.workdir)

  def fake_open(file, mode="r", *args, **kwargs):
    path = os.path.abspath(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else ""
    if path.startswith(root + os.sep) and "x" in mode:
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    return real_open(file, mode, *args, **kwargs)

  monkeypatch.setattr(builtins, "open", fake_open)


def _failing_writes(error: int, under: str = "workdir"):
  """A patch: every file opened for writing under the workdir fails with OSError(error).

  `under` names the Paths field whose folder fails instead ("files": an --output there).

  EACCES fails the open, as a workdir without write permission does (simulated: chmod
  does not stop root, and tests may run as root); ENOSPC lets the open create or
  truncate the file and fails the write, as a full disk does.
  """

  def patch(monkeypatch, paths: Paths):
    real_open = builtins.open
    root = os.path.abspath(getattr(paths, under))

    class FailingFile(io.RawIOBase):
      def __init__(self, name):
        super().__init__()
        self.name = name

      def writable(self):
        return True

      def write(self, _):
        raise OSError(error, os.strerror(error), self.name)

    def fake_open(file, mode="r", *args, **kwargs):
      path = os.path.abspath(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else ""
      if path.startswith(root + os.sep) and any(c in mode for c in "wax+"):
        if error == errno.EACCES:
          raise PermissionError(error, os.strerror(error), path)
        real_open(file, mode, *args, **kwargs).close()
        buffered = io.BufferedWriter(FailingFile(path))
        return buffered if "b" in mode else io.TextIOWrapper(buffered)
      return real_open(file, mode, *args, **kwargs)

    # Also the one atomic write's temporary file (workdir/files.py opens it with "xb").
    monkeypatch.setattr(builtins, "open", fake_open)

  return patch


def _hf_index_without_its_shard(paths: Paths) -> None:
  """A Hugging Face folder whose safetensors index names a shard that is not there."""
  folder = os.path.join(paths.files, "hf")
  _write(os.path.join(folder, "config.json"), json.dumps({"model_type": "gpt2"}))
  _write(os.path.join(folder, "model.safetensors.index.json"), json.dumps(
      {"metadata": {}, "weight_map": {"wte.weight": "model-00001-of-00002.safetensors",
                                      "h.0.attn.c_attn.weight": "model-00002-of-00002.safetensors"}}))
  _write(os.path.join(folder, "model-00002-of-00002.safetensors"), b"")


def _damaged_dataset_cache(paths: Paths) -> None:
  """A local_text dataset prepared in {files}/data, then its train file truncated."""
  from transformer.data.datasets import catalog  # pylint: disable=g-import-not-at-top
  _write(os.path.join(paths.files, "c.txt"), _lines(60))
  config = make_tiny_config(os.path.join(paths.files, "data"))
  config.data.update(name="local_text", path=os.path.join(paths.files, "c.txt"))
  builder = catalog.load_builder(config.data)
  train = [n for n in os.listdir(builder.data_dir) if "train.array_record" in n][0]
  with open(os.path.join(builder.data_dir, train), "r+b") as f:
    f.truncate(300)  # As a copy cut short by a full disk.


# ---------------------------------------------------------------- the table

CASES = [
    # -- command-line flags and modes (absl: exit 1, usage on stderr)
    Case("unknown_flag", ("--bogus=1", TINY, WORKDIR), 1,
         ("Unknown command line flag 'bogus'",), subprocess=True),
    Case("unknown_mode", ("--mode=fly", WORKDIR), 1,
         ("flag --mode=fly: value should be one of <train|evaluate|",)),
    Case("train_without_config", (WORKDIR,), 1, ("--config is required for --mode=train",)),
    Case("evaluate_without_workdir", ("--mode=evaluate",), 1,
         ("--mode=evaluate needs --workdir=DIR",)),
    Case("positional_argument", (TINY, WORKDIR, "extra"), 1,
         ("Unexpected arguments: ['extra']",)),
    # A flag the mode would ignore (usage.check_mode_flags): refused, naming its modes.
    Case("flag_the_mode_does_not_read", ("--mode=plot", WORKDIR, "--output={files}/o.txt"),
         1, ("--output is not used by --mode=plot: only --mode=average/benchmark/classify/compile/"
             "evaluate/generate/passkey/translate reads it",)),
    Case("decode_flag_with_train", (TINY, WORKDIR, "--beam_size=3"), 1,
         ("--beam_size is not used by --mode=train: only --mode=evaluate/generate/translate "
          "reads it",), creates_nothing=True),
    Case("missing_config_file", ("--config=configs/nope.py", WORKDIR), 1,
         ("configs/nope.py",)),
    Case("config_file_with_syntax_error", ("--config={files}/broken.py", WORKDIR), 1,
         ("broken.py:2: '(' was never closed",),
         setup=lambda p: _write(os.path.join(p.files, "broken.py"),
                                "def get_config():\n  return (\n")),
    Case("unknown_config_variant", ("--config=configs/gpt_small.py:huge", WORKDIR), 1,
         ("configs/gpt_small.py: unknown argument 'huge'; valid: '', 'local'",)),
    Case("unknown_config_key", (TINY, WORKDIR, "--config.model.nope=1"), 1,
         ("--config.model.nope", "configs/base.py"), subprocess=True),
    Case("objective_under_train", (TINY, WORKDIR, "--config.train.objective=span_corruption"),
         1, ("--config.train.objective: the key is --config.model.objective",),
         creates_nothing=True),
    Case("config_value_of_wrong_type", (TINY, WORKDIR, "--config.model.d_model=wide"), 1,
         ("--config.model.d_model", "wide")),
    Case("num_processes_without_coordinator", (TINY, WORKDIR, "--num_processes=2"), 1,
         ("--num_processes/--process_id need --coordinator_address=HOST:PORT",)),
    # -- config values (ConfigError: exit 2, the key, the value and what is valid)
    Case("negative_width", (TINY, WORKDIR, "--config.model.d_model=-1"), 2,
         ("config.model.d_model=-1 is invalid: expected an integer >= 1",), subprocess=True,
         trained_workdir=True),
    Case("unknown_arch", (TINY, WORKDIR, "--config.model.arch=rnn"), 2,
         ("config.model.arch='rnn' is invalid: valid values are 'decoder', 'encoder', "
          "'encoder_decoder'",), trained_workdir=True),
    Case("heads_do_not_divide_width", (TINY, WORKDIR, "--config.model.num_heads=3"), 2,
         ("config.model.num_heads=3 is invalid: must divide model.d_model=32",), creates_nothing=True),
    Case("seq_len_beyond_positions", (TINY, WORKDIR, "--config.data.seq_len=64"), 2,
         ("config.data.seq_len=64 is invalid: must be <= model.max_len=32",), creates_nothing=True),
    Case("batch_does_not_split_over_devices", (TINY, WORKDIR, "--config.data.batch_size=12"), 2,
         ("config.data.batch_size=12 is invalid: it must be divisible by the 8 data-parallel",),
         trained_workdir=True),
    Case("mesh_does_not_fit_devices",
         (TINY, WORKDIR, "--config.mesh.shape=((\"data\",3),(\"fsdp\",1),(\"tensor\",1))"), 2,
         ("config.mesh.shape=", "3 slots for 8 devices"), creates_nothing=True),
    Case("mesh_shape_not_pairs", (TINY, WORKDIR, "--config.mesh.shape=((\"data\",2))"), 2,
         ("config.mesh.shape=('data', 2) is invalid: expected a tuple of (name, size) pairs",),
         creates_nothing=True),
    Case("context_does_not_divide_seq_len",  # Two zig-zag chunks a shard: 32 % (2 x 8).
         (TINY, WORKDIR, "--config.data.seq_len=24", "--config.mesh.shape=((\"data\",1),"
          "(\"fsdp\",1),(\"tensor\",1),(\"context\",8))"), 2,
         ("config.data.seq_len=24 is invalid: must be a multiple of 2 x 8 = 16", "context"),
         creates_nothing=True),
    Case("context_with_a_kernel_that_cannot_use_it",
         (TINY, WORKDIR, "--config.model.attention_impl=cudnn", "--config.model.dtype=bfloat16",
          "--config.mesh.shape=((\"data\",2),(\"fsdp\",1),(\"tensor\",1),(\"context\",4))"),
         2, ("config.model.attention_impl='cudnn' is invalid: cannot attend across 4 context "
             "shards", "'auto', 'xla', 'einsum'"), creates_nothing=True),
    Case("context_axis_without_a_length_rule",
         (TINY, WORKDIR, "--config.mesh.shape=((\"data\",2),(\"fsdp\",1),(\"tensor\",1),"
          "(\"context\",4))", "--config.mesh.rules=((\"batch\",(\"data\",\"fsdp\")),)"), 2,
         ("config.mesh.rules=('length', None) is invalid: mesh.shape has (\"context\", 4) "
          "but no rule shards 'length' over it",), creates_nothing=True),
    Case("cosine_decay_shorter_than_warmup",
         (TINY, WORKDIR, "--config.optimizer.schedule=cosine", "--config.optimizer.decay_steps=2"),
         2, ("config.optimizer.decay_steps=2 is invalid", "expected > optimizer.warmup_steps=2"), creates_nothing=True),
    Case("cosine_run_shorter_than_warmup",
         (TINY, WORKDIR, "--config.optimizer.schedule=cosine",
          "--config.optimizer.warmup_steps=100", "--config.train.num_steps=40"),
         2, ("config.train.num_steps=40 is invalid: with optimizer.schedule='cosine' and "
             "optimizer.decay_steps=0", "expected > optimizer.warmup_steps=100",
             "--config.optimizer.warmup_steps=4"), creates_nothing=True),
    Case("steps_per_call_not_dividing_a_cadence",
         (TINY, WORKDIR, "--config.train.log_every=2", "--config.train.steps_per_call=2"), 2,
         ("config.train.steps_per_call=2 is invalid: train.eval_every=3 is not a multiple of "
          "it", "use a divisor of 3 (1, 3) or make train.eval_every a multiple of 2"),
         creates_nothing=True),
    Case("unknown_dataset", (TINY, WORKDIR, "--config.data.name=no_such_dataset"), 2,
         ("config.data.name='no_such_dataset' is not a TFDS dataset", "python_stdlib")),
    Case("unknown_split", (TINY, WORKDIR, "--config.data.eval_split=dev"), 2,
         ("config.data.eval_split='dev' is not a split of python_stdlib; valid:",)),
    Case("unknown_text_feature", (TINY, WORKDIR, "--config.data.text_key=body"), 2,
         ("config.data.text_key='body' is not a feature of python_stdlib",)),
    Case("bad_on_config_change", (TINY, WORKDIR, "--config.checkpoint.on_config_change=maybe"),
         2, ("config.checkpoint.on_config_change='maybe' is invalid: valid values are 'stop', "
             "'allow'",), trained_workdir=True),
    Case("model_vocabulary_smaller_than_tokenizer", (TINY, WORKDIR, "--config.model.vocab_size=100"),
         2, ("config.model.vocab_size=100 is smaller than the bytes tokenizer's vocabulary",)),
    # -- objectives (docs/objectives.md)
    Case("objective_the_topology_cannot_train",
         (TINY, WORKDIR, "--config.model.arch=encoder", "--config.model.head=mlm",
          "--config.model.objective=span_corruption"), 2,
         ("config.model.objective='span_corruption' is invalid: model.arch='encoder' cannot "
          "train it (it trains ['masked_lm', 'classification']); span_corruption trains on "
          "model.arch ['decoder', 'encoder_decoder']",), creates_nothing=True),
    Case("no_room_for_sentinels",
         (TINY, WORKDIR, "--config.model.objective=span_corruption",
          "--config.model.vocab_size=300"), 2,
         ("config.model.vocab_size=300 has no room for model.objective='span_corruption''s "
          "100 sentinels (train.num_sentinels) after the bytes tokenizer's 261 ids: it "
          "needs >= 361",)),
    Case("noise_density_out_of_range",
         (TINY, WORKDIR, "--config.model.objective=span_corruption",
          "--config.train.noise_density=1.5"), 2,
         ("config.train.noise_density=1.5 is invalid: expected a fraction of the tokens in "
          "(0, 1)",), creates_nothing=True),
    Case("mean_noise_span_length_out_of_range",
         (TINY, WORKDIR, "--config.model.objective=ul2",
          "--config.train.mean_noise_span_length=0.5"), 2,
         ("config.train.mean_noise_span_length=0.5 is invalid: expected a number of tokens "
          ">= 1",), creates_nothing=True),
    Case("prefix_lm_on_a_kernel_without_its_mask",
         (TINY, WORKDIR, "--config.model.objective=prefix_lm",
          "--config.model.attention_impl=splash"), 2,
         ("config.model.attention_impl='splash' is invalid: splash attention cannot express "
          "a prefix LM's mask", "use 'xla', 'einsum' or 'auto'"), creates_nothing=True),
    Case("init_from_missing", (TINY, WORKDIR, "--config.init_from={files}/nowhere"), 2,
         ("config.init_from='{files}/nowhere' is invalid", "is not a directory"),
         creates_nothing=True),
    # -- data files
    Case("missing_data_file",
         (TINY, WORKDIR, "--config.data.name=local_text", "--config.data.path={files}/none.txt"),
         2, ("config.data.path='{files}/none.txt' is invalid", "no such file or folder"),
         subprocess=True),
    Case("empty_data_file",
         (TINY, WORKDIR, "--config.data.name=local_text", "--config.data.path={files}/empty.txt"),
         2, ("DataError: {files}/empty.txt: the file is empty; local_text needs text",),
         setup=lambda p: _write(os.path.join(p.files, "empty.txt"), "")),
    Case("undecodable_text",
         (TINY, WORKDIR, "--config.data.name=local_text", "--config.data.path={files}/bad.txt"),
         2, ("{files}/bad.txt:3: undecodable UTF-8", "likely an 8-bit encoding such as Latin-1",
             "iconv -f WINDOWS-1252 -t UTF-8", "config.data.decode_errors='replace'"),
         setup=lambda p: _write(os.path.join(p.files, "bad.txt"),
                                _lines(2).encode() + b"caf\xe9\n" + _lines(50).encode())),
    Case("utf16_text_without_bom",
         (TINY, WORKDIR, "--config.data.name=local_text", "--config.data.path={files}/u16.txt"),
         2, ("DataError: {files}/u16.txt is UTF-16LE text without a byte-order mark",
             "convert it: `iconv -f UTF-16LE -t UTF-8 {files}/u16.txt > u16.utf8.txt`"),
         setup=lambda p: _write(os.path.join(p.files, "u16.txt"),
                                _lines(50).encode("utf-16-le"))),
    Case("gzip_named_txt",
         (TINY, WORKDIR, "--config.data.name=local_text", "--config.data.path={files}/z.txt"),
         2, ("DataError: {files}/z.txt holds gzip-compressed data, not UTF-8 text: "
             "decompress it",),
         setup=lambda p: _write(os.path.join(p.files, "z.txt"),
                                gzip.compress(_lines(50).encode()))),
    Case("ragged_tsv_row",
         (TINY, WORKDIR, "--config.data.name=local_tsv", "--config.data.path={files}/tsv",
          "--config.model.head=classification", "--config.model.pooling=last",
          "--config.data.text_key=sentence", "--config.data.label_key=label"),
         2, ("{files}/tsv/train.tsv:3: the row has 3 cells, expected 2",),
         setup=lambda p: _tsv(p, "sentence\tlabel\ngood\t1\nbad\tworse\t0\n"), subprocess=True),
    Case("tsv_labels_not_0_to_k",
         (TINY, WORKDIR, "--config.data.name=local_tsv", "--config.data.path={files}/tsv",
          "--config.model.head=classification", "--config.model.pooling=last",
          "--config.data.text_key=sentence", "--config.data.label_key=label"),
         2, ("{files}/tsv/train.tsv:3: label '2' is out of range",),
         setup=lambda p: _tsv(p, "sentence\tlabel\ngood\t0\nbad\t2\n")),
    Case("parallel_files_not_aligned",
         (TINY, WORKDIR, "--config.data.name=local_parallel", "--config.data.path={files}/par",
          "--config.model.arch=encoder_decoder", "--config.data.source_language=en",
          "--config.data.target_language=de"),
         2, ("train.de has 39 lines but", "train.en has 40", "must be line-aligned"),
         setup=lambda p: _parallel(p, train_de=_lines(39).upper())),
    Case("parallel_language_missing",
         (TINY, WORKDIR, "--config.data.name=local_parallel", "--config.data.path={files}/par",
          "--config.model.arch=encoder_decoder", "--config.data.source_language=en",
          "--config.data.target_language=fr"),
         2, ("config.data.target_language='fr' is not a feature",), setup=_parallel),
    Case("seq2seq_source_without_pairs",
         (TINY, WORKDIR, "--config.model.arch=encoder_decoder",
          "--config.data.continuation_chars=100000000", "--config.train.eval_at_start=false"),
         2, ("no (source, target) pair", "config.data.continuation_chars"), subprocess=True),
    Case("seq2seq_pairs_all_too_long",
         (TINY, WORKDIR, "--config.data.name=local_parallel", "--config.data.path={files}/par",
          "--config.model.arch=encoder_decoder", "--config.data.source_language=en",
          "--config.data.target_language=de", "--config.data.overlong=drop",
          "--config.data.seq_len=8"),
         2, ("no (source, target) pair", "config.data.overlong='drop'"), setup=_parallel),
    # -- the workdir
    Case("workdir_is_a_file", (TINY, "--workdir={files}/taken/run"), 2,
         ("{files}/taken",), setup=lambda p: _write(os.path.join(p.files, "taken"), "x"),
         subprocess=True),
    Case("workdir_is_an_existing_file", (TINY, "--workdir={files}/taken"), 2,
         ("{files}/taken is a file, not a folder: use another --workdir",),
         setup=lambda p: _write(os.path.join(p.files, "taken"), "x")),
    Case("sweep_dir_is_an_existing_file",
         (TINY, "--mode=sweep", "--workdir={files}/taken", "--sweep=model.norm=pre,post"), 2,
         ("{files}/taken is a file, not a folder: use another --workdir",),
         setup=lambda p: _write(os.path.join(p.files, "taken"), "x")),
    Case("workdir_in_use", (TINY, WORKDIR), 2,
         ("workdir {workdir} in use by PID", "wait for that command to finish"),
         trained_workdir=True, setup=_hold_the_lock),
    Case("workdir_not_writable", (TINY, WORKDIR, "--config.train.num_steps=8"), 2, ("Permission denied", "{workdir}"),
         trained_workdir=True, patch=_failing_writes(errno.EACCES)),
    Case("disk_full", (TINY, WORKDIR, "--config.train.num_steps=8"), 2,
         ("No space left on device", "{workdir}"), trained_workdir=True,
         patch=_failing_writes(errno.ENOSPC)),
    Case("disk_full_during_a_checkpoint", (TINY, WORKDIR, "--config.train.num_steps=8"), 2,
         ("OSError: No space left on device: {workdir}/checkpoints; free space",),
         trained_workdir=True, patch=_orbax_disk_full,
         may_change=("metrics.jsonl", "run.json", "config.json")),
    Case("data_dir_full_while_preparing",
         (TINY, WORKDIR, "--config.data.name=local_text", "--config.data.path={files}/c.txt",
          "--config.data.data_dir={files}/data"), 2,
         ("OSError: No space left on device: {files}/data/local_text/", "free space on that "
          "file system or move what is written there elsewhere (the dataset cache: "
          "--config.data.data_dir)"),
         setup=lambda p: _write(os.path.join(p.files, "c.txt"), _lines(50)),
         patch=_tfds_disk_full),
    Case("average_to_a_full_disk", ("--mode=average", WORKDIR, "--average_last=2",
                                    "--output={files}/avg"), 2,
         ("No space left on device: {files}/avg; free space on that file system or choose "
          "another --output",), trained_workdir=True,
         patch=_failing_writes(errno.ENOSPC, under="files"),
         absent=("{files}/avg", "{files}/.avg.partial")),
    Case("export_to_a_full_disk", ("--mode=export", WORKDIR, "--hf_dir={files}/hf"), 2,
         ("No space left on device: {files}/hf; free space on that file system or choose "
          "another --hf_dir",), trained_workdir=True,
         patch=_failing_writes(errno.ENOSPC, under="files"),
         absent=("{files}/hf", "{files}/.hf.partial")),
    # A signal while Orbax writes waits for its threads, then removes the folder; one
    # at the final rename says the output is whole (a rerun would be refused).
    Case("sigterm_while_average_writes", ("--mode=average", WORKDIR, "--average_last=2",
                                          "--output={files}/avg"), 143,
         ("Stopped by SIGTERM: --mode=average did not finish and left no partial output",),
         trained_workdir=True, patch=_sigterm_while_orbax_saves,
         absent=("{files}/avg", "{files}/.avg.partial")),
    Case("sigterm_at_the_export_rename", ("--mode=export", WORKDIR, "--hf_dir={files}/hf"),
         143, ("Stopped by SIGTERM after --mode=export had written its output completely: "
               "{files}/hf (--hf_dir); it is whole and usable as is (exit status 143)",),
         trained_workdir=True, patch=_sigterm_after_the_final_rename,
         absent=("{files}/.hf.partial",)),
    Case("import_index_names_a_missing_shard", ("--mode=import", WORKDIR, "--hf_dir={files}/hf"),
         2, ("{files}/hf/model.safetensors.index.json names 1 shard file(s) that {files}/hf "
             "does not have: model-00001-of-00002.safetensors; download the missing shards",),
         setup=_hf_index_without_its_shard, creates_nothing=True),
    Case("damaged_dataset_cache",
         (TINY, WORKDIR, "--config.data.name=local_text", "--config.data.path={files}/c.txt",
          "--config.data.data_dir={files}/data"), 2,
         ("DataError: the prepared dataset in {files}/data/local_text/", "is damaged (",
          "delete that folder and run again"),
         setup=_damaged_dataset_cache, creates_nothing=True),
    Case("weights_do_not_divide_the_mesh",  # GQA: 2 kv heads over a tensor axis of 4.
         (TINY, WORKDIR, "--config.model.num_heads=4", "--config.model.num_kv_heads=2",
          "--config.mesh.shape=((\"data\",2),(\"fsdp\",1),(\"tensor\",4))"), 2,
         ("ConfigError: model.num_kv_heads=2 does not divide over mesh axes ('tensor',) of "
          "size 4",), creates_nothing=True),
    Case("sweep_that_fails_validation",
         (TINY, "--mode=sweep", WORKDIR, "--sweep=model.num_heads=2,3"), 2,
         ("--sweep run 2/2 (model.num_heads=3): config.model.num_heads=3 is invalid",),
         creates_nothing=True),
    Case("resume_with_another_model", (TINY, WORKDIR, "--config.model.mlp_dim=128"), 2,
         ("model.mlp_dim: 64 -> 128", "--config.checkpoint.on_config_change=allow"),
         trained_workdir=True),
    Case("resume_allowed_but_arrays_do_not_match",  # More steps: a resume, not "complete".
         (TINY, WORKDIR, "--config.model.mlp_dim=128", "--config.train.num_steps=8",
          "--config.checkpoint.on_config_change=allow"), 2,
         ("checkpoint 6 in", "do not match"), trained_workdir=True),
    Case("checkpoint_of_another_model", (TINY, WORKDIR), 2,
         ("checkpoint 1 in", "do not match"), trained_workdir=True,
         other_run=True, setup=_other_model_checkpoints),
    Case("checkpoint_of_another_process_count", (TINY, WORKDIR, "--config.train.num_steps=8"), 2,
         ("checkpoint 6 in", "was written by 2 processes and this run has 1",
          "Resume with the same number of processes"), trained_workdir=True,
         setup=_two_process_data_positions),
    Case("evaluate_checkpoint_of_another_model", ("--mode=evaluate", WORKDIR), 2,
         ("does not match the model of",), trained_workdir=True,
         other_run=True, setup=_other_model_checkpoints),
    Case("evaluate_corrupt_checkpoint", ("--mode=evaluate", WORKDIR), 2,
         ("checkpoint 6 in", "is damaged", "when saved", "--checkpoint_step=N (the others: 3)"),
         trained_workdir=True,
         setup=_damage_newest_checkpoint),
    Case("evaluate_empty_workdir", ("--mode=evaluate", WORKDIR), 2,
         ("{workdir} has no config.json",), setup=lambda p: os.makedirs(p.workdir)),
    Case("evaluate_unknown_checkpoint", ("--mode=evaluate", WORKDIR, "--checkpoint_step=5"), 2,
         ("--checkpoint_step=5:", "its steps are 3, 6"), trained_workdir=True),
    Case("evaluate_garbled_config_json", ("--mode=evaluate", WORKDIR), 2,
         ("{workdir}/config.json",), trained_workdir=True,
         setup=lambda p: _write(os.path.join(p.workdir, "config.json"), "{\"model\": ")),
    Case("translate_input_not_utf8", ("--mode=translate", WORKDIR, "--input={files}/in.txt"),
         2, ("{files}/in.txt:2: undecodable UTF-8 at byte 4 of the line (0xe9",
             "iconv -f latin1 -t utf-8"), trained_workdir=True,
         setup=lambda p: _write(os.path.join(p.files, "in.txt"), b"hello\ncaf\xe9\n")),
    Case("generate_prompt_not_utf8", ("--mode=generate", WORKDIR, "--prompt=caf\udce9"),
         2, ("--prompt: undecodable UTF-8 at character 4 (byte 0xe9)",), trained_workdir=True),
    Case("evaluate_unknown_split_flag", ("--mode=evaluate", WORKDIR, "--split=dev"), 2,
         ("--split='dev' is not a split of python_stdlib; valid:",), trained_workdir=True),
    Case("evaluate_read_only_workdir", ("--mode=evaluate", WORKDIR, "--split=train",
                                        "--max_examples=1"), 2,
         ("Permission denied", "write the result elsewhere with --output=PATH"),
         trained_workdir=True, patch=_no_new_files_in_workdir),
    Case("evaluate_result_exists", ("--mode=evaluate", WORKDIR, "--split=train",
                                    "--max_examples=1"), 2,
         ("{workdir}/eval_train_step6_first1.json exists: an earlier run of this command "
          "wrote this result; read it, pass --overwrite",), trained_workdir=True,
         setup=lambda p: _write(os.path.join(p.workdir, "eval_train_step6_first1.json"), "{}")),
    Case("classify_with_a_language_model", ("--mode=classify", WORKDIR, "--input={files}/in.txt"),
         2, ("--mode=classify needs a model with head='classification'",), trained_workdir=True,
         setup=lambda p: _write(os.path.join(p.files, "in.txt"), "hello\n")),
    Case("translate_with_a_language_model", ("--mode=translate", WORKDIR, "--input={files}/in.txt"),
         2, ("--mode=translate translates sentences: it serves seq2seq (encoder_decoder), "
          "prefix_lm (encoder_decoder, decoder); ", "holds a causal_lm model"), trained_workdir=True,
         setup=lambda p: _write(os.path.join(p.files, "in.txt"), "hello\n")),
    Case("tokenizer_record_does_not_match", ("--mode=evaluate", WORKDIR), 2,
         ("records vocab_size=999",), trained_workdir=True,
         setup=lambda p: _write(os.path.join(p.workdir, "tokenizer.json"),
                                json.dumps({"kind": "bytes", "vocab_size": 999}))),
    Case("sampling_options_without_temperature",
         ("--mode=generate", WORKDIR, "--prompt=def", "--top_k=5"), 2,
         ("config.decode.top_k=5 is invalid", "set decode.temperature > 0"),
         trained_workdir=True),
    Case("average_more_than_kept", ("--mode=average", WORKDIR, "--average_last=5",
                                    "--output={files}/avg"), 2,
         ("--average_last=5 needs 5 checkpoints",), trained_workdir=True),
]


def test_the_table_is_large_and_names_are_unique():
  assert len(CASES) >= 30
  assert len({c.name for c in CASES}) == len(CASES)
  assert 6 <= sum(c.subprocess for c in CASES) <= 8


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, tmp_path, tfds_data_dir, request):
  trained = request.getfixturevalue("trained_run") if case.trained_workdir else ""
  other = request.getfixturevalue("other_run") if case.other_run else ""
  paths, before, code, output = _run_case(case, tmp_path, tfds_data_dir, trained, other)
  _check(case, paths, before, code, output)


def test_help_exits_0_and_keys_lists_every_key_with_its_comment(monkeypatch):
  """`--help` is no mistake (absl exits 1); --mode=keys prints base.py's keys and comments."""
  code, output = _launch_in_process(["--help"], monkeypatch)
  assert code == 0 and "--helpfull" in output, output[-3000:]
  code, output = _launch_in_process(["--helpfull"], monkeypatch)
  assert code == 0 and "--mode" in output and "--workdir" in output, output[-3000:]
  code, output = _launch_in_process(["--mode=keys"], monkeypatch)
  assert code == 0, output[-3000:]
  assert "model.d_model = 256  # Width of the residual stream." in output
  assert "optimizer.skip_nonfinite = 0  # Skip updates with non-finite" in output
  config = base.get_config()
  listed = [line.split(" = ")[0] for line in output.splitlines() if " = " in line]
  flat = [k for k, _ in _flat_keys(config)]
  assert sorted(listed) == sorted(flat)  # Every key once, each with a comment (else an error).
  assert all("  # " in line and not line.endswith("# ")
             for line in output.splitlines() if " = " in line)
  code, output = _launch_in_process(
      ["--mode=keys", "--config=configs/shakespeare_char.py:cpu"], monkeypatch)
  assert code == 0 and "data.tokenizer = 'char'  # " in output, output[-3000:]


def _flat_keys(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _flat_keys(value, f"{prefix}{key}.")
    else:
      yield prefix + key, value


def test_stdin_that_is_not_utf8_names_the_line_and_byte():
  """Piped input is read as bytes, so the bad byte is named (not a UnicodeDecodeError)."""
  from transformer.cli import common  # pylint: disable=g-import-not-at-top
  from transformer.config.errors import ConfigError  # pylint: disable=g-import-not-at-top
  stdin = io.TextIOWrapper(io.BytesIO(b"ok\nline two \xff\n"), encoding="utf-8")
  with pytest.raises(ConfigError, match=r"^stdin:2: undecodable UTF-8 at byte 10 of the "
                     r"line \(0xff, byte offset 12\)"):
    common.read_lines("", stdin)
  assert common.read_lines("", io.TextIOWrapper(io.BytesIO(b"a\r\nb\n"))) == ["a", "b"]
