"""Commands started at once, and commands stopped midway: nothing raced, nothing partial.

  - Three commands building the same new dataset and vocabulary at once take turns on
    a build lock: one builds, the others wait (saying so) and reuse it.
  - Ctrl-C / SIGTERM outside the training loop: one line, exit 130 / 143, no traceback,
    no partial output (the dataset build, --mode=translate, SentencePiece training).
  - The one divisibility check runs in every mode that places weights on a mesh.
  - A folder written through `files.complete_or_absent` is whole or absent, also when
    a signal or a full disk meets Orbax's threads; a signal after the output is whole
    (or after the command finished) is said as such.
"""

from __future__ import annotations

import asyncio
import errno
import logging as std_logging
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from orbax.checkpoint._src import asyncio_utils

from test_bad_inputs import _launch_in_process  # pylint: disable=protected-access
from tiny import make_tiny_config, subprocess_env
from transformer import sharding
from transformer.cli import usage
from transformer.config.errors import ConfigError
from transformer.data import sources
from transformer.data.datasets import catalog
from transformer.data.datasets import local_text
from transformer.data.tokenizers import vocabularies
from transformer.inference import loaded
from transformer.training import trainer as trainer_lib
from transformer.workdir import checkpointing
from transformer.workdir import files
from transformer.workdir import lock
from transformer.workdir import orbax_patch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(count: int) -> str:
  return "".join(f"{i} the quick brown fox jumps over the lazy dog\n" for i in range(count))


# ---------------------------------------------------------------- races


def test_commands_started_at_once_build_the_dataset_and_vocabulary_once(tmp_path, caplog):
  """Three builders at once (threads: flock locks open files, so threads contend like
  processes) on one new file: one prepares, two wait and reuse, nobody fails."""
  (tmp_path / "c.txt").write_text(_lines(200), encoding="utf-8")
  config = make_tiny_config(str(tmp_path / "data"))
  config.data.update(name="local_text", path=str(tmp_path / "c.txt"), tokenizer="char")
  results, errors = [], []
  start = threading.Barrier(3)

  def build():
    try:
      start.wait()
      builder = catalog.load_builder(config.data)
      tokenizer = sources.load_tokenizer(config, builder, ("text",))
      results.append((str(builder.data_dir), tokenizer.vocab_size))
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)

  caplog.set_level(std_logging.INFO)
  threads = [threading.Thread(target=build) for _ in range(3)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors, errors
  assert len(results) == 3 and len(set(results)) == 1, results
  messages = [r.getMessage() for r in caplog.records]
  assert sum(m.startswith("Preparing TFDS dataset") for m in messages) == 1, messages
  # One vocabulary built; the two others read the file it wrote.
  assert sum(m.startswith("Tokenizer: ") for m in messages) == 2, messages


def test_a_build_lock_held_elsewhere_is_waited_for_with_one_line(tmp_path, caplog):
  """The waiting command says whom it waits for, and goes on once the lock is free."""
  path = str(tmp_path / ".thing.lock")
  entered, waiting = threading.Event(), threading.Event()

  class Seen(std_logging.Handler):
    def emit(self, record):
      if record.getMessage().startswith(f"Waiting for PID {os.getpid()} on "):
        waiting.set()

  seen = Seen()
  std_logging.getLogger().addHandler(seen)
  caplog.set_level(std_logging.INFO)
  try:
    with lock.building(path, "the thing"):
      def second():
        with lock.building(path, "the thing"):
          entered.set()
      thread = threading.Thread(target=second)
      thread.start()
      assert waiting.wait(timeout=120), "no 'Waiting for PID' line"
      assert not entered.is_set()  # Held here: it waits.
    thread.join()
  finally:
    std_logging.getLogger().removeHandler(seen)
  assert entered.is_set()
  line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Waiting")][0]
  assert f"which is building the thing ({path} is locked)" in line


# ---------------------------------------------------------------- interrupts


def test_ctrl_c_during_the_dataset_build_is_one_line_130_and_leaves_nothing(
    tmp_path, monkeypatch):
  """Ctrl-C while TFDS writes the examples: no workdir, no prepared or incomplete
  dataset folder; the rerun builds it."""
  (tmp_path / "c.txt").write_text(_lines(200), encoding="utf-8")
  real = local_text.LocalText._generate_examples  # pylint: disable=protected-access

  def interrupted(self, *args, **kwargs):
    for example in real(self, *args, **kwargs):
      yield example
      raise KeyboardInterrupt  # After the first example: some are written.

  data_dir = tmp_path / "data"
  argv = ["--config=tests/tiny.py:" + str(data_dir), f"--workdir={tmp_path / 'run'}",
          "--config.data.name=local_text", f"--config.data.path={tmp_path / 'c.txt'}"]
  with monkeypatch.context() as patch:
    patch.setattr(local_text.LocalText, "_generate_examples", interrupted)
    try:
      code, output = _launch_in_process(argv, patch)
    except KeyboardInterrupt:  # Not a pytest abort: the regression is this test's failure.
      pytest.fail("Ctrl-C escaped launch.run as a KeyboardInterrupt traceback")
  assert code == 130, output[-3000:]
  assert "Traceback" not in output and output.count("Stopped by") == 1, output[-3000:]
  assert "Stopped by SIGINT: --mode=train did not finish and left no partial output" in output
  assert not (tmp_path / "run").exists()
  config = make_tiny_config(str(data_dir))
  config.data.update(name="local_text", path=str(tmp_path / "c.txt"))
  builder = local_text.make_builder(config.data)
  assert not builder.is_prepared()
  leftovers = [d for d, _, _ in os.walk(data_dir) if "incomplete" in os.path.basename(d)]
  assert not leftovers, leftovers


def test_sigterm_during_translate_is_one_line_143_and_writes_no_output(tmp_path, monkeypatch):
  """SIGTERM unwinds like Ctrl-C (launch.py's handler): --output is never half there."""
  from transformer.cli import common  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  workdir.mkdir()
  (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")

  def terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # The handler raises before this ends.
    raise AssertionError("SIGTERM did not stop the command")

  def not_handled(signum, frame):
    raise AssertionError("launch.run installed no SIGTERM handler")

  # Without launch.py's handler SIGTERM would end pytest itself; this one fails the test.
  previous = signal.signal(signal.SIGTERM, not_handled)
  with monkeypatch.context() as patch:
    patch.setattr(common, "read_lines", terminated)
    code, output = _launch_in_process(
        ["--mode=translate", f"--workdir={workdir}", f"--input={tmp_path / 'in.txt'}",
         f"--output={tmp_path / 'out.txt'}"], patch)
  try:
    assert signal.getsignal(signal.SIGTERM) == not_handled  # launch.run puts it back.
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert code == 143, output[-3000:]
  assert "Traceback" not in output, output[-3000:]
  assert "Stopped by SIGTERM: --mode=translate did not finish" in output
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "run"]


def test_ctrl_c_in_a_real_process_is_one_line_and_130(tmp_path):
  """A real SIGINT to `python launch.py --mode=translate` waiting on stdin."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  env = subprocess_env()
  # SIGINT as a terminal's foreground process has it: a pytest-xdist worker ignores
  # SIGINT, its children inherit that through exec, and Python then installs no
  # KeyboardInterrupt handler (rightly: `python launch.py ... &` in a script ignores it).
  process = subprocess.Popen(
      [sys.executable, "launch.py", "--mode=translate", f"--workdir={workdir}"], cwd=ROOT,
      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    # The workdir's log.txt gets its first lines once launch.py's main runs; then the
    # mode reads stdin, which stays open.
    log = workdir / "log.txt"
    deadline = time.monotonic() + 600
    while not (log.exists() and "JAX process 0 of 1" in log.read_text(encoding="utf-8")):
      assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
      time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    # stdin stays open until the process has exited: communicate() would close it at
    # once, and a process the loaded machine had not yet scheduled to take the signal
    # read an empty input, went on to load the (empty) workdir and exited 2.
    process.wait(timeout=120)
    stderr = process.stderr.read()
  finally:
    if process.poll() is None:
      process.kill()
  text = stderr.decode("utf-8", "replace")
  assert process.returncode == 130, text[-3000:]
  assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
  assert "Stopped by SIGINT: --mode=translate did not finish" in text


def test_ctrl_c_during_sentencepiece_training_stays_ctrl_c_and_writes_no_model(tmp_path):
  """SentencePiece would turn it into RuntimeError('INTERNAL: KeyboardInterrupt') (exit 1)."""

  def lines():
    for i in range(2000):
      if i == 1000:
        raise KeyboardInterrupt
      yield f"{i} the quick brown fox jumps over the lazy dog"

  path = str(tmp_path / "spm.model")
  with pytest.raises(KeyboardInterrupt):
    vocabularies.train_sentencepiece(lines(), 300, path, max_sentences=10_000)
  assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- the one divisibility check


def test_every_mode_checks_that_the_weights_divide_the_mesh(tiny_config):
  """GQA with 2 kv heads on a tensor axis of 4: one ConfigError naming the field, in
  training (Trainer.create) and in every mode that loads a run (loaded.abstract_params),
  instead of jax's IndivisibleError."""
  tiny_config.model.update(num_heads=4, num_kv_heads=2, vocab_size=384)
  tiny_config.mesh.shape = (("data", 2), ("fsdp", 1), ("tensor", 4))
  mesh = sharding.make_mesh(tiny_config.mesh, jax.devices()[:8])
  expected = r"model.num_kv_heads=2 does not divide over mesh axes \('tensor',\) of size 4"
  with pytest.raises(ConfigError, match=expected):
    trainer_lib.Trainer.create(tiny_config, mesh)
  with pytest.raises(ConfigError, match=expected):
    loaded.abstract_params(tiny_config, mesh)
  with pytest.raises(ConfigError, match=expected):
    trainer_lib.check_divisible(tiny_config, mesh)  # Before launch.py touches the workdir.


# ---------------------------------------------------------------- complete or absent


def test_a_folder_is_complete_or_absent(tmp_path):
  target = str(tmp_path / "out")
  partial = files.partial_sibling(target)
  with pytest.raises(OSError) as raised:
    with files.complete_or_absent(target, "--output") as folder:
      assert folder == partial and os.path.isdir(folder)
      files.write_atomically(os.path.join(folder, "a.txt"), "a")
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # A write() names no file.
  assert (raised.value.filename, raised.value.flag) == (target, "--output")
  assert os.listdir(tmp_path) == []
  with pytest.raises(KeyboardInterrupt):
    with files.complete_or_absent(target, "--output") as folder:
      raise KeyboardInterrupt
  assert os.listdir(tmp_path) == []
  os.makedirs(os.path.join(partial, "stale"))  # A killed attempt's leftover.
  os.makedirs(target)  # An empty folder the user made is fine.
  with files.complete_or_absent(target, "--output") as folder:
    assert os.listdir(folder) == []
    files.write_atomically(os.path.join(folder, "a.txt"), "a")
  assert os.listdir(tmp_path) == ["out"] and os.listdir(target) == ["a.txt"]


def _stop(signum, frame):
  raise KeyboardInterrupt


def test_a_signal_while_orbax_writes_waits_for_the_save_then_removes_the_folder(
    tmp_path, monkeypatch):
  """Orbax writes from threads of its own: interrupted at once, they wrote on into a
  removed folder ("Event loop is closed", a `.partial` left). The signal waits for the
  save and the manager's close, then the folder is removed and the interrupt raised."""
  real, saved = ocp.CheckpointManager.save, []

  def save(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)  # The handler would raise at the next bytecode.
    result = real(self, *args, **kwargs)
    saved.append(True)
    return result

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  previous = signal.signal(signal.SIGTERM, _stop)
  try:
    with pytest.raises(KeyboardInterrupt):
      with files.complete_or_absent(str(tmp_path / "out"), "--output") as partial:
        checkpointing.save_params(os.path.join(partial, "checkpoints"), 0,
                                  {"w": jnp.ones((4, 4))})
    assert signal.getsignal(signal.SIGTERM) is _stop  # Given back after the save.
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert saved == [True]
  assert os.listdir(tmp_path) == []


def test_a_failed_orbax_write_ends_its_other_writes_before_the_error():
  """A full disk fails one of Orbax's gathered writes; the others must end in the loop
  before it closes (else their completions print "Event loop is closed" and write on)."""
  finished = []

  async def writes():
    async def fails():
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async def goes_on():
      for _ in range(10):  # Outlives the failure by several loop turns (Orbax's own
        await asyncio.sleep(0)  # loop stops after the first); no time passes.
      finished.append(True)

    await asyncio.gather(fails(), goes_on())

  with pytest.raises(OSError):
    asyncio_utils.run_sync(writes())
  assert finished == [True]


def test_a_second_signal_while_orbax_writes_stops_at_once_saying_what_is_left(
    tmp_path, monkeypatch, caplog):
  """A save that does not end (a dead peer): three SIGINTs and a SIGTERM were one
  warning, and only SIGKILL ended it. The second signal stops inside the save, says the
  folder is incomplete, and notes the write as abandoned (launch.py then ends without
  joining Orbax's threads); the partial folder is removed, never renamed into place."""
  waited = []

  def hangs(self, *args, **kwargs):
    del self, args, kwargs
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100):  # A write that does not end: 5 s, unless stopped.
      time.sleep(0.05)
      waited.append(1)

  monkeypatch.setattr(ocp.CheckpointManager, "save", hangs)
  files.forget_finished()
  previous = signal.signal(signal.SIGTERM, _stop)
  try:
    with caplog.at_level("WARNING"), pytest.raises(KeyboardInterrupt):
      with files.complete_or_absent(str(tmp_path / "out"), "--output") as partial:
        checkpointing.save_params(os.path.join(partial, "checkpoints"), 0,
                                  {"w": jnp.ones((4, 4))})
    assert signal.getsignal(signal.SIGTERM) is _stop
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert len(waited) < 100  # Stopped inside the write, not after it.
  assert "a second signal stops at once" in caplog.text
  assert "SIGTERM again: stopping now; the checkpoint being written in " in caplog.text
  assert "is incomplete and is not used; the next run of the command removes it" in caplog.text
  assert len(files.abandoned_writes()) == 1
  assert not os.path.exists(tmp_path / "out")
  files.forget_finished()
  assert files.abandoned_writes() == []


def test_a_failed_saves_other_writes_are_waited_for_at_most_drain_seconds(monkeypatch):
  """The drain after a failed write has a bound (orbax_patch.DRAIN_SECONDS): a write
  that hangs is cancelled with a warning, not waited for forever."""
  monkeypatch.setattr(orbax_patch, "DRAIN_SECONDS", 0.1)
  ended = []

  async def writes():
    async def fails():
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async def hangs():
      await asyncio.sleep(30)
      ended.append(True)

    await asyncio.gather(fails(), hangs())

  with pytest.raises(OSError):
    asyncio_utils.run_sync(writes())
  assert not ended


def test_a_result_file_names_its_flag_and_is_noted_once_whole(tmp_path, monkeypatch):
  """A full disk under --mode=compile --output=F names --output (not --workdir or the
  data_dir); a result written whole is what a later signal's line names."""
  files.forget_finished()
  path = str(tmp_path / "report.json")
  files.write_atomically(path, "{}", flag="--output")
  assert files.finished_outputs() == [(path, "--output")]
  monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(
      OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
  with pytest.raises(OSError) as raised:
    files.write_atomically(str(tmp_path / "other.json"), "{}", flag="--output")
  message = usage.environment_error(raised.value, "compile", "")
  assert message == (f"No space left on device: {tmp_path / 'other.json'}; free space on "
                     "that file system or write the result elsewhere with --output=PATH.")
  assert files.finished_outputs() == [(path, "--output")]
  files.forget_finished()


def test_a_signal_after_the_command_finished_is_said_as_such(monkeypatch):
  """SIGTERM once the mode has returned (its exit hooks running): one line saying it
  finished, 143, no KeyboardInterrupt traceback from an exit hook."""
  import launch  # pylint: disable=g-import-not-at-top
  real = launch._finished  # pylint: disable=protected-access

  def finished():
    real()
    os.kill(os.getpid(), signal.SIGTERM)  # Noted by the handler real() installed.

  def not_handled(signum, frame):
    raise AssertionError("launch.run did not put the handler back")

  previous = signal.signal(signal.SIGTERM, not_handled)
  try:
    with monkeypatch.context() as patch:
      patch.setattr(launch, "_finished", finished)
      code, output = _launch_in_process(["--mode=keys"], patch)
    assert signal.getsignal(signal.SIGTERM) == not_handled
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert code == 143, output[-3000:]
  assert "Traceback" not in output, output[-3000:]
  assert ("\nSIGTERM came after --mode=keys had finished; nothing was cut short (exit "
          "status 143)\n") in output, output[-3000:]  # stderr's last line (stdout follows).


def test_characters_a_fixed_vocabulary_lacks_are_counted_and_said_once(tmp_path, monkeypatch,
                                                                        caplog):
  """Issue 42: init_from onto edited data (or new text to translate) mapped unseen
  characters to unk silently; every mode now ends with one line counting them."""
  import launch  # pylint: disable=g-import-not-at-top
  from transformer.data.tokenizers import vocabularies  # pylint: disable=g-import-not-at-top
  (tmp_path / "chars.json").write_text('{"chars": "abc"}', encoding="utf-8")
  vocabulary = vocabularies.CharTokenizer(str(tmp_path / "chars.json"))
  vocabularies.UNSEEN.clear()

  def encodes(config, workdir):  # A mode that tokenizes three texts.
    for text in ("abc", "abxé", "xx"):
      vocabulary.encode(text)
    return 0

  with monkeypatch.context() as patch:
    patch.setattr(launch.MODES["keys"], "main", encodes)
    code, output = _launch_in_process(["--mode=keys"], patch)
  assert code == 0, output[-3000:]
  said = [r.getMessage() for r in caplog.records if "character vocabulary" in r.getMessage()]
  assert len(said) == 1 and said[0].startswith(
      "4 characters of the text this command encoded (2 distinct: 'x' x3, 'é' x1) are not "
      "in the run's character vocabulary and became the unknown id"), said
  assert not vocabularies.UNSEEN  # Said once, then forgotten.
  assert list(vocabulary.encode("ab")) == [5, 6] and vocabularies.unseen_line() is None
