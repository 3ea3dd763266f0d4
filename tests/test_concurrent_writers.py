"""Two commands writing one folder at once: one result, whole, and one clear line.

Each command that writes a shared folder holds a lock on it (workdir/lock.py) or writes
it atomically (workdir/files.py); each test starts real processes on one folder:

  - --mode=prepare of one corpus, twice at once (whole files, and a file in parts):
    each task (a file, a part, a join) runs under its own build lock; the second process
    waits (one line naming the first) or finds the tasks done; both end 0 and the corpus
    is whole, as one prepare writes it.
    "Already done" is never said over a shard that is cut short or missing.
  - --mode=import into one workdir, twice at once (and, marked slow, two averages into
    one --output and two exports into one --hf_dir: the same `files.complete_or_absent`):
    one writes it, the other is refused in one line (`OutputInUse`, naming the writer's
    PID and host, or "exists and is not an empty directory" when it came after); the
    folder loads. A folder another process holds is refused before its temporary
    sibling is touched; one written since the command's check is not overwritten.
  - Results without --overwrite (benchmark, translate, generate, classify --output; the
    JSON of evaluate and passkey beside its PNG) are linked into place whole: one
    file, and a refusal for the others.
  - Slow: a sweep on a folder another sweep holds (the workdir lock), and two processes
    building one local dataset and its vocabulary (the build lock; threads check it in
    the default run, tests/test_races_and_interrupts.py).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from test_corpus import on_own_corpus, prepare, write_corpus, write_large_files
from tiny import subprocess_env
from transformer.config.errors import ConfigError
from transformer.data.corpus import for_config
from transformer.data.corpus import store
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = os.path.join(ROOT, "tests", "fixtures", "hf", "gpt2")
# A process that holds `lock.writing(argv[1])`, says so, then waits to be killed.
WRITER = ("import sys, time\n"
          "from transformer.workdir import lock\n"
          "with lock.writing(sys.argv[1], '--output'):\n"
          "  print('held', flush=True)\n"
          "  time.sleep(600)\n")


@pytest.fixture
def config(tiny_config, tmp_path):
  """A corpus of 16 files (bytes tokenizer), enough for two prepares to overlap."""
  on_own_corpus(tiny_config, tmp_path)
  for k in range(4):
    write_corpus(os.path.join(tiny_config.data.path, str(k)), documents=200, seed=k)
  return tiny_config


def _start_prepare(config) -> subprocess.Popen:
  data = config.data
  return subprocess.Popen(
      [sys.executable, "launch.py", "--mode=prepare", "--config=tests/tiny.py:" + data.data_dir,
       "--config.data.name=corpus", f"--config.data.path={data.path}",
       "--config.data.tokenizer=bytes", "--config.model.vocab_size=0",
       f"--config.data.val_fraction={data.val_fraction}", "--config.data.prepare_workers=1",
       f"--config.data.prepare_piece_mb={data.prepare_piece_mb}"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_every_record(prepared: store.PreparedCorpus) -> int:
  """Reads every record of both splits back (a cut-short shard fails here); the tokens."""
  total = 0
  for split in store.SPLITS:
    records = prepared.split(split)
    total += sum(len(records[i]["tokens"]) for i in range(len(records)))
  return total


@pytest.mark.parametrize("in_parts", [False, True])
def test_two_prepares_of_one_corpus_at_once_give_one_whole_corpus(config, in_parts):
  """With `in_parts`, the parquet files (many row groups) are prepared in parts too (their
  own locks, then the join under the file's): still one corpus, no part left behind."""
  files_count = 16
  if in_parts:
    write_large_files(os.path.join(config.data.path, "big"))  # 3 files more.
    config.data.prepare_piece_mb, files_count = 0.001, 19
  first, second = _start_prepare(config), _start_prepare(config)
  outputs = [p.communicate(timeout=600) for p in (first, second)]
  for process, (_, stderr) in zip((first, second), outputs):
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert f"Prepared corpus: {files_count} files" in stderr
  if in_parts:  # The first to plan found the parquet files (many row groups) to split.
    assert any(re.search(r"\([1-9]\d* files in parts of 0.001 MB\)", e)
               for _, e in outputs), outputs[0][1][-2000:]
  # Whoever came second either waited for the other, naming it, or found tasks done.
  said = [stderr for _, stderr in outputs
          if "found done by another --mode=prepare" in stderr or "Waiting for PID" in stderr
          or f"({files_count} already done)" in stderr]
  assert said, [stderr[-1500:] for _, stderr in outputs]
  for stderr, other in zip([o[1] for o in outputs], (second, first)):
    if "Waiting for PID" in stderr:  # One line, however many files it waited for.
      assert stderr.count("Waiting for PID") == 1, stderr[-3000:]
      assert f"Waiting for PID {other.pid} on {socket.gethostname()}, which is preparing " \
             "this corpus too" in stderr
  prepared, _ = for_config.open_for_training(config)
  assert _read_every_record(prepared) == sum(
      prepared.manifest["splits"][s]["tokens"] for s in store.SPLITS)
  folder = prepared.folder
  assert not [n for n in os.listdir(os.path.join(folder, store.TASKS)) if n.startswith(".")]
  assert not os.path.exists(os.path.join(folder, "parts"))  # Every part joined and removed.
  # The same bytes as one preparation alone.
  alone = config.copy_and_resolve_references()
  alone.data.data_dir = config.data.data_dir + "_alone"
  job, _ = prepare(alone)
  with open(os.path.join(folder, store.MANIFEST), encoding="utf-8") as f, \
      open(os.path.join(job.output, store.MANIFEST), encoding="utf-8") as g:
    assert f.read().replace(config.data.data_dir, "") == g.read().replace(
        alone.data.data_dir, "")


@pytest.mark.parametrize("damage", ["empty", "cut", "deleted_index"])
def test_already_done_is_never_said_over_a_shard_cut_short(tiny_config, tmp_path, damage,
                                                           caplog):
  """A task json whose shard is 0 bytes, cut short or without its index: tokenized
  again, and the corpus reads whole (before: 'already done', then a failed run)."""
  on_own_corpus(tiny_config, tmp_path)
  write_corpus(tiny_config.data.path)
  job, manifest = prepare(tiny_config)
  os.remove(os.path.join(job.output, store.MANIFEST))  # As a preparation stopped midway.
  task = manifest["splits"]["validation"]["shards"][0]["task"]
  shard = os.path.join(job.output, "validation", task + ".array_record")
  if damage == "empty":
    open(shard, "wb").close()
  elif damage == "cut":
    os.truncate(shard, os.path.getsize(shard) // 3)
  else:
    os.remove(os.path.join(job.output, "validation", task + ".index.npy"))
  caplog.set_level("INFO")
  prepare(tiny_config)
  assert " already done), 1 to tokenize" in caplog.text
  assert f"is tokenized again: {os.path.join(job.output, 'validation', task)}" in caplog.text
  prepared, _ = for_config.open_for_training(tiny_config)
  _read_every_record(prepared)


def test_a_folder_another_process_writes_is_refused_naming_it(tmp_path):
  target = str(tmp_path / "out")
  partial = files.partial_sibling(target)
  holder = subprocess.Popen([sys.executable, "-c", WRITER, target], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    os.makedirs(os.path.join(partial, "being_written"))  # The holder's work in progress.
    with pytest.raises(lock.OutputInUse,
                       match=rf"--output={target} is being written by PID {holder.pid} on "
                             rf"{socket.gethostname()} .*wait for that command to finish"):
      with files.complete_or_absent(target, "--output"):
        pass
    assert os.listdir(partial) == ["being_written"]  # Not removed as "a leftover".
    assert not os.path.exists(target)
  finally:
    holder.kill()
    holder.wait()
  # Its writer gone (killed: its lock file stays, unlocked), the next command writes.
  with files.complete_or_absent(target, "--output") as folder:
    files.write_atomically(os.path.join(folder, "a.txt"), "a")
  assert sorted(os.listdir(tmp_path)) == ["out"]  # No lock file, no partial folder left.


def test_a_folder_written_since_the_command_started_is_not_overwritten(tmp_path):
  target = str(tmp_path / "out")
  os.makedirs(target)
  files.write_atomically(os.path.join(target, "theirs.txt"), "another command's result")
  with pytest.raises(ConfigError, match=r"--output=.*out exists and is not an empty "
                     r"directory \(written by another command since this one started\)"):
    with files.complete_or_absent(target, "--output"):
      pass
  assert os.listdir(target) == ["theirs.txt"]


def _start_import(workdir: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "launch.py", "--mode=import", f"--hf_dir={GPT2}",
                           f"--workdir={workdir}"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=subprocess_env())


def test_two_imports_into_one_workdir_at_once_give_one_workdir_and_one_line(tmp_path):
  """Before: `OSError: Directory not empty`, a tensorstore NOT_FOUND, once no workdir."""
  from transformer.inference import loaded  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "imported")
  processes = [_start_import(workdir), _start_import(workdir)]
  outputs = [p.communicate(timeout=600) for p in processes]
  _refused_or_written(processes, outputs, "--workdir", workdir)
  refused = outputs[[p.returncode for p in processes].index(2)][1]
  last = refused.strip().splitlines()[-1]
  winner = processes[[p.returncode for p in processes].index(0)]
  assert last in (
      f"OutputInUse: --workdir={workdir} is being written by PID {winner.pid} on "
      f"{socket.gethostname()} ({os.path.join(str(tmp_path), '.imported.lock')} is locked); "
      "wait for that command to finish (the folder is then complete, and this command "
      "refuses to overwrite it) or stop it, or choose another --workdir",
      f"ConfigError: --workdir={workdir!r} exists and is not an empty directory; choose a "
      "new one (nothing is overwritten)",
      f"ConfigError: --workdir={workdir} exists and is not an empty directory (written by "
      "another command since this one started); choose a new one (nothing is "
      "overwritten)"), last
  assert sorted(os.listdir(tmp_path)) == ["imported"]
  run = loaded.load_run(workdir)
  assert np.isfinite(np.asarray(next(iter(
      __import__("jax").tree.leaves(run.params))), np.float32)).all()
  assert os.path.exists(os.path.join(workdir, layout.CONFIG))


def test_results_written_at_once_without_overwrite_give_one_file_and_refusals(tmp_path):
  """--output of benchmark, translate, generate, classify (files.write_atomically with
  keep_existing): two commands past their 'exists' check at once each write their whole
  file; one is linked into place, the others are refused in one line (before: the last
  one silently replaced the first)."""
  path = str(tmp_path / "result.json")
  start = threading.Barrier(6)
  outcomes = []

  def write(k: int) -> None:
    start.wait()
    try:
      files.write_atomically(path, f"result {k}\n" * 1000, flag="--output", keep_existing=True)
      outcomes.append(("written", k))
    except ConfigError as e:
      outcomes.append(("refused", str(e)))

  threads = [threading.Thread(target=write, args=(k,)) for k in range(6)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  written = [k for what, k in outcomes if what == "written"]
  refused = [line for what, line in outcomes if what == "refused"]
  assert len(written) == 1 and len(refused) == 5, outcomes
  assert all(line == f"{path} was written by another command while this one ran (it exists "
             "now, whole, and is kept); read it, or pass --overwrite to replace it, or "
             "choose another --output" for line in refused)
  with open(path, encoding="utf-8") as f:
    assert f.read() == f"result {written[0]}\n" * 1000
  assert os.listdir(tmp_path) == ["result.json"]  # No temporary file left.
  files.write_atomically(path, "replaced\n", flag="--output")  # --overwrite: replaced.
  with open(path, encoding="utf-8") as f:
    assert f.read() == "replaced\n"


# Builds the local_text dataset of argv[2] and its character vocabulary in data_dir
# argv[1], as a training run's start does; prints what it got.
BUILDER = ("import logging, sys\n"
           "sys.path.insert(0, 'tests')\n"
           "from absl import logging as absl_logging\n"
           "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
           "absl_logging.set_verbosity('info')\n"
           "from tiny import make_tiny_config\n"
           "from transformer.data import sources\n"
           "from transformer.data.datasets import catalog\n"
           "config = make_tiny_config(sys.argv[1])\n"
           "config.data.update(name='local_text', path=sys.argv[2], tokenizer='char')\n"
           "builder = catalog.load_builder(config.data)\n"
           "tokenizer = sources.load_tokenizer(config, builder, ('text',))\n"
           "print('built', builder.data_dir, tokenizer.vocab_size, flush=True)\n")


@pytest.mark.slow  # 23 s; threads check the same lock in the default run (test_races_...).
def test_two_processes_build_one_dataset_and_vocabulary_once(tmp_path):
  """Two processes (not threads) starting on one new file and data_dir: one builds the
  TFDS dataset and the vocabulary, the other waits (one line naming it) or finds them;
  both get the same; nothing of the build's locks is left."""
  path = tmp_path / "c.txt"
  path.write_text("".join(f"{i} the quick brown fox jumps over the lazy dog\n"
                          for i in range(300)), encoding="utf-8")
  data_dir = str(tmp_path / "data")
  processes = [subprocess.Popen([sys.executable, "-c", BUILDER, data_dir, str(path)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=subprocess_env()) for _ in range(2)]
  outputs = [p.communicate(timeout=600) for p in processes]
  for process, (stdout, stderr) in zip(processes, outputs):
    assert process.returncode == 0, stderr[-3000:]
  built = [stdout.split("built ", 1)[1].strip() for stdout, _ in outputs]
  assert built[0] == built[1], built
  logs = "".join(stderr for _, stderr in outputs)
  assert logs.count("Preparing TFDS dataset") == 1, logs[-3000:]
  pids = [p.pid for p in processes]
  for line in (l for l in logs.splitlines() if l.startswith("Waiting for PID")):
    assert any(f"Waiting for PID {pid} on {socket.gethostname()}, which is building " in line
               for pid in pids), line
  leftovers = [os.path.join(d, n) for d, _, names in os.walk(data_dir) for n in names
               if n.endswith(".lock")]
  assert not leftovers, leftovers


@pytest.mark.slow  # 15 s; train's refusal by the same lock is a default test_bad_inputs case.
def test_a_sweep_on_a_folder_another_sweep_holds_is_refused_in_one_line(tmp_path):
  """The sweep folder's lock (launch.py holds it for --mode=sweep): a second sweep on it
  stops before it starts a run, naming the first; nothing of the folder is changed."""
  from test_workdir_lock import _start_holder  # pylint: disable=g-import-not-at-top
  sweep_dir = str(tmp_path / "sweep")
  holder = _start_holder(sweep_dir)
  try:
    result = subprocess.run(
        [sys.executable, "launch.py", "--mode=sweep", "--config=tests/tiny.py:" +
         str(tmp_path / "data"), f"--workdir={sweep_dir}", "--sweep=seed=0,1"], cwd=ROOT,
        capture_output=True, text=True, timeout=600, env=subprocess_env())
  finally:
    holder.kill()
    holder.wait()
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      f"WorkdirInUse: workdir {sweep_dir} in use by PID {holder.pid} on "
      f"{socket.gethostname()} ({os.path.join(sweep_dir, layout.LOCK)} is locked); wait for "
      "that command to finish or stop it, or use another --workdir")
  assert os.listdir(sweep_dir) == [layout.LOCK]


def _refused_or_written(processes, outputs, flag: str, target: str) -> None:
  """One of two commands on `target` wrote it (0); the other ended in one line (2)."""
  codes = [p.returncode for p in processes]
  assert sorted(codes) == [0, 2], [o[1][-2000:] for o in outputs]
  refused = outputs[codes.index(2)][1]
  assert "Traceback" not in refused, refused[-3000:]
  last = refused.strip().splitlines()[-1]
  assert last.startswith((f"OutputInUse: {flag}={target} is being written by PID "
                          f"{processes[codes.index(0)].pid} on ",
                          f"ConfigError: {flag}={target!r} exists and is not an empty",
                          f"ConfigError: {flag}={target} exists and is not an empty")), last


@pytest.mark.slow  # 4 processes that load a model: about a minute here.
def test_two_averages_and_two_exports_into_one_folder_at_once(tmp_path):
  """--mode=average --output and --mode=export --hf_dir, two at once each: one folder,
  whole (it loads), and one line."""
  from transformer.interop.hf import importer  # pylint: disable=g-import-not-at-top
  from transformer.inference import loaded  # pylint: disable=g-import-not-at-top
  source = str(tmp_path / "imported")
  importer.import_folder(GPT2, source)
  for mode, flag, name in (("average", "--output", "averaged"), ("export", "--hf_dir", "hf")):
    target = str(tmp_path / name)
    extra = ["--average_last=1"] if mode == "average" else []
    processes = [subprocess.Popen(
        [sys.executable, "launch.py", f"--mode={mode}", f"--workdir={source}",
         f"{flag}={target}", *extra], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=subprocess_env()) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in processes]
    _refused_or_written(processes, outputs, flag, target)
    if mode == "average":
      loaded.load_run(target)
    else:
      assert sorted(os.listdir(target))[:2] == ["config.json", "generation_config.json"]
  assert sorted(os.listdir(tmp_path)) == ["averaged", "hf", "imported"]


def test_a_result_with_its_plot_is_not_written_beside_another_commands_result(tmp_path):
  """evaluate --by_position / passkey (files.write_together): the JSON written by another
  command meanwhile is kept, and this command leaves neither its JSON nor its PNG."""
  result, plot = str(tmp_path / "r.json"), str(tmp_path / "r.png")
  files.write_atomically(result, "theirs\n")
  with pytest.raises(ConfigError, match=r"r\.json was written by another command"):
    files.write_together([(plot, b"png"), (result, "mine\n")], flag="--output",
                         keep_existing=(result,))
  assert sorted(os.listdir(tmp_path)) == ["r.json"]
  with open(result, encoding="utf-8") as f:
    assert f.read() == "theirs\n"
  files.write_together([(plot, b"png"), (str(tmp_path / "s.json"), "mine\n")],
                       flag="--output", keep_existing=(str(tmp_path / "s.json"),))
  assert sorted(os.listdir(tmp_path)) == ["r.json", "r.png", "s.json"]
