"""Tokenizing a corpus once into array_record shards: tasks, workers, resume, the manifest.

One task per source file (in sorted order), or per part of a file larger than
data.prepare_piece_mb (data/corpus/pieces.py: its parts' shards are then joined into the
file's): its documents are read streamed (data/corpus/readers.py), tokenized, sent to
`train` or `validation` by a stable hash of their first piece, and written one record per
piece into `<split>/<task>.array_record` with `<split>/<task>.index.npy` beside it. A
file's output depends only on the file and the tokenizer, so the corpus is byte-identical
whatever the part size, the worker count, or the nodes of a Ray cluster that ran it
(`--ray_address`: data/corpus/on_ray.py).

Crash safety: shards are written under temporary names and renamed; `tasks/<task>.json`
is written atomically (workdir/files.py) after them, and only a task with its json is
done; `manifest.json`, written last, is what a training run reads. A rerun after a kill
keeps the done tasks and redoes the others; a half-written file is never read. A task
is done only when its json is there, its source file is the one it records (by content:
store.file_change) and its shard files are whole (store.shard_problem).

Two preparations of one corpus at once (two commands, or two drivers of Ray clusters over
a shared folder): each task runs under its own build lock (workdir/lock.py: a whole
file's and its join's `tasks/.<task>.lock`, a part's `parts/tasks/.<task>-<part>.lock`),
so one process writes it while the other waits, saying for whom (once per other
process), and then takes it as done; both write the same manifest. A part is done when
its json records the file's sha256 (hashed once per run by the driver) and its shards are
whole, so a rerun keeps the parts of a file with unchanged content.
"""

from __future__ import annotations

import array
import concurrent.futures
import ctypes
import dataclasses
import hashlib
import io
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np
from absl import logging

from transformer.config.errors import ConfigError, DataError
from transformer.data.corpus import pieces
from transformer.data.corpus import readers
from transformer.data.corpus import store
from transformer.data.tokenizers import vocabularies
from transformer.workdir import files
from transformer.workdir import kill_points
from transformer.workdir import lock
from transformer.workdir import progress as progress_lib

_PROGRESS_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Job:
  """What a worker needs to run any task of one preparation (pickled to workers)."""

  root: str  # The folder the source names are relative to.
  names: tuple[str, ...]  # Source files, sorted: task i reads names[i].
  output: str  # <sources folder>/<tokenizer key>.
  text_key: str
  decode_errors: str
  bad_records: str
  val_fraction: float
  tokenizer_kind: str
  tokenizer_path: str  # The vocabulary file ("" for bytes).
  tokenizer_record: dict[str, Any]
  dtype: str
  piece_bytes: int = 0  # data.prepare_piece_mb in bytes: a larger file runs in parts (0: never).
  # The vocabulary file's bytes, for workers on other machines (a Ray cluster's nodes):
  # trained once here and shipped with the job. b"": workers read tokenizer_path.
  tokenizer_data: bytes = b""


def task_name(index: int) -> str:
  """The 5-digit name of task `index` (its source file's position in sorted order)."""
  return f"{index:05d}"


def is_validation(first_piece: str, val_fraction: float) -> bool:
  """The split rule: blake2b-8 of the first piece's UTF-8 text, as a fraction of 2^64."""
  digest = hashlib.blake2b(first_piece.encode("utf-8", "surrogatepass"), digest_size=8)
  return int.from_bytes(digest.digest(), "little") / 2.0 ** 64 < val_fraction


# Per worker process: the tokenizer (built once) and where progress is reported: the
# shared counters of a local pool, or a Ray task's reporter ("report").
_WORKER: dict[str, Any] = {}


def set_reporter(report: Callable[[int, int], None]) -> None:
  """Where this process's tasks report (bytes read, tokens) as they go (a Ray task's)."""
  _WORKER.clear()
  _WORKER["report"] = report


def _init_worker(counters: tuple[Any, Any], in_worker: bool = True, parent: int = 0) -> None:
  _WORKER.clear()
  _WORKER["counters"] = counters
  if in_worker:
    # Forked from launch.py, whose SIGTERM handler raises in the main thread: a worker
    # ends plainly when the pool terminates it, and leaves Ctrl-C to the parent.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_POLL_SECONDS = 1.0


def die_with_parent(parent: int) -> None:
  """Ends this worker process when `parent` (the pid that started it) is gone.

  A parent killed outright (SIGKILL, the OOM killer) runs no cleanup: its workers would
  wait on their task queue forever, holding the caller's stdout and stderr (a
  `prepare | tee` that never ends). On Linux the kernel sends this process SIGKILL when
  its parent dies (prctl PR_SET_PDEATHSIG); elsewhere a daemon thread polls the parent
  pid. A parent already gone when this runs (it died during the fork) ends it at once.
  """
  armed = False
  if sys.platform.startswith("linux"):
    try:
      libc = ctypes.CDLL(None, use_errno=True)
      armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
      armed = False
  if parent and os.getppid() != parent:
    os._exit(1)  # pylint: disable=protected-access
  if armed or not parent:
    return

  def watch() -> None:
    while os.getppid() == parent:
      time.sleep(_PARENT_POLL_SECONDS)
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def _vocabulary_here(job: Job) -> str:
  """The vocabulary file on this machine: tokenizer_path, or the shipped bytes written
  once (under their sha256) to this machine's temporary folder."""
  if not job.tokenizer_data:
    return job.tokenizer_path
  digest = hashlib.sha256(job.tokenizer_data).hexdigest()[:16]
  path = os.path.join(tempfile.gettempdir(), f"transformer-vocabulary-{digest}-"
                      + os.path.basename(job.tokenizer_path))
  if not os.path.exists(path):
    files.write_atomically(path, job.tokenizer_data)
  return path


def _tokenizer(job: Job) -> vocabularies.Tokenizer:
  if _WORKER.get("tokenizer_path") != (job.tokenizer_kind, job.tokenizer_path):
    from transformer.data.tokenizers import hf_vocab  # pylint: disable=g-import-not-at-top
    _WORKER["tokenizer"] = hf_vocab.from_kind(job.tokenizer_kind, _vocabulary_here(job))
    _WORKER["tokenizer_path"] = (job.tokenizer_kind, job.tokenizer_path)
  return _WORKER["tokenizer"]


def _add(read_bytes: int, tokens: int) -> None:
  if "report" in _WORKER:
    _WORKER["report"](read_bytes, tokens)
    return
  counters = _WORKER.get("counters")
  if counters:
    with counters[0].get_lock():
      counters[0].value += read_bytes
    with counters[1].get_lock():
      counters[1].value += tokens


class _SplitWriter:
  """One split's shard of a task: records under a temporary name, the index in memory."""

  def __init__(self, folder: str, split: str, task: str):
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
    self.final = os.path.join(folder, split, task + ".array_record")
    self.index_path = os.path.join(folder, split, task + ".index.npy")
    os.makedirs(os.path.dirname(self.final), exist_ok=True)
    # One fixed temporary name per shard: a killed attempt's file is overwritten, not kept.
    self.temporary = os.path.join(os.path.dirname(self.final), f".{task}.array_record.partial")
    self._writer = array_record_module.ArrayRecordWriter(self.temporary,
                                                         store.RECORD_OPTIONS)
    # Machine arrays, not lists of ints: 16 bytes a record, whatever the file holds.
    self.offsets, self.flags = array.array("Q", [0]), array.array("Q")
    self.documents = 0

  def write(self, ids: np.ndarray, flags: int) -> int:
    """Writes one piece; returns its tokens in the stream (ids + bos / eos)."""
    tokens = len(ids) + bool(flags & store.STARTS) + bool(flags & store.ENDS)
    self.write_bytes(ids.tobytes(), tokens, flags)
    return tokens

  def write_bytes(self, record: bytes, tokens: int, flags: int) -> None:
    """Writes one record as stored, with its stream tokens and flags (a part's, joined)."""
    self._writer.write(record)
    self.offsets.append(self.offsets[-1] + tokens)
    self.flags.append(flags)
    self.documents += bool(flags & store.STARTS)

  def finish(self) -> dict[str, int]:
    """Closes and renames the shard, writes its index; returns its counts."""
    self._writer.close()
    os.replace(self.temporary, self.final)
    self.flags.append(0)  # The index's last row: the shard's total.
    index = np.stack([np.frombuffer(self.offsets, np.uint64),
                      np.frombuffer(self.flags, np.uint64)], axis=1)
    buffer = io.BytesIO()
    np.save(buffer, index)
    files.write_atomically(self.index_path, buffer.getvalue())
    return {"documents": self.documents, "records": len(self.flags) - 1,
            "tokens": int(self.offsets[-1])}


def _encode(tokenizer: vocabularies.Tokenizer, text: str, dtype: np.dtype, limit: int) -> np.ndarray:
  ids = tokenizer.encode(text)
  if ids.size and int(ids.max()) >= limit:  # Never wraps silently into a narrower dtype.
    raise DataError(f"token id {int(ids.max())} does not fit {dtype} (vocabulary {limit})")
  return ids.astype(dtype)


def run_task(job: Job, piece: pieces.Piece) -> dict[str, Any]:
  """Tokenizes a source file (or a part of one) into its shards and writes its json.

  Holds the task's build lock (workdir/lock.py's `building`) throughout: a whole file's
  is `tasks/.<task>.lock` (the one `join_task` takes too), a part's
  `parts/tasks/.<task>-<part>.lock` (the parts of one file still run side by side).
  Another --mode=prepare of the same corpus doing this task now is waited for (one line
  naming it), and its result is then taken as done (`found_done` set in the result)
  instead of both writing the same shard files.

  Returns:
    A whole file: its task json (source, splits, counts). A part: its part json, whose
    shards `join_task` joins into the file's once every part is done.
  """
  task = task_name(piece.file)
  if piece.whole:
    lock_path, what = os.path.join(job.output, store.TASKS, f".{task}.lock"), ""
  else:
    stem = pieces.part_name(task, piece.part)
    lock_path = os.path.join(job.output, pieces.PARTS, store.TASKS, f".{stem}.lock")
    what = f" (part {piece.part + 1} of {piece.parts})"
  with lock.building(lock_path, f"source file {job.names[piece.file]}{what} of the corpus "
                     f"{job.output}", waiting=lambda holder: _say_waiting(holder, job, piece.file)):
    done = _found_done(job, piece)
    if done is not None:
      _add(piece.size, 0)
      return {**done, "found_done": True}
    folder = job.output if piece.whole else os.path.join(job.output, pieces.PARTS)
    stem = task if piece.whole else pieces.part_name(task, piece.part)
    for split in store.SPLITS:
      leftover = os.path.join(folder, split, f".{stem}.array_record.partial")
      if os.path.exists(leftover):
        os.remove(leftover)  # A killed attempt's shard: never part of the corpus.
    if piece.whole:
      pieces.remove_parts(job.output, task)  # An earlier run's parts (another part size).
    return _tokenize(job, piece)


def _found_done(job: Job, piece: pieces.Piece) -> dict[str, Any] | None:
  """Under the task's lock: its result if another preparation did it meanwhile."""
  index, task = piece.file, task_name(piece.file)
  if piece.whole:
    return done_task(job, index, say=False)  # prepare() said why it is not done.
  path = os.path.join(job.root, job.names[index])
  done = pieces.done_part(job.output, task, path, job.names[index], piece)
  if done is not None:
    return done
  # The file joined already by another preparation (its parts removed): this part is
  # not needed. Its recorded sha256 against the driver's, no hashing here; join_task
  # checks the task whole (by content) under the file's lock.
  json_path = os.path.join(job.output, store.TASKS, task + ".json")
  if os.path.exists(json_path):
    with open(json_path, encoding="utf-8") as f:
      result = json.load(f)
    if result["source"].get("sha256") == piece.sha256:
      return {"task": task, "joined": True}
  return None


_WAITED_FOR: set[str] = set()  # Holders this process said it waits for (once each).


def _say_waiting(holder: str, job: Job, index: int) -> None:
  """One line per other preparation of this corpus, not one per file it holds."""
  if holder in _WAITED_FOR:
    return
  _WAITED_FOR.add(holder)
  logging.info("Waiting for %s, which is preparing this corpus too (%s; it holds source "
               "file %s now): each file it tokenizes is waited for, then taken as done",
               holder, job.output, job.names[index])


def _source(job: Job, index: int) -> dict[str, Any]:
  name = job.names[index]
  path = os.path.join(job.root, name)
  stat = os.stat(path)
  return {"path": name, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
          "sha256": store.file_digest(path)}


def _tokenize(job: Job, piece: pieces.Piece) -> dict[str, Any]:
  """`run_task`'s work, under its lock: the shards, then the json."""
  index = piece.file
  name, task = job.names[index], task_name(index)
  path = os.path.join(job.root, name)
  record = pieces.part_record(path, name, piece)  # Before reading: a change shows at resume.
  tokenizer, dtype = _tokenizer(job), np.dtype(job.dtype)
  limit = min(tokenizer.vocab_size, np.iinfo(dtype).max + 1)
  kill = kill_points.KillPoints.from_env()
  stats = readers.ReadStats()
  reader = readers.reader(path, name, text_key=job.text_key,
                              decode_errors=job.decode_errors, bad_records=job.bad_records,
                              stats=stats, span=piece.span)
  folder = job.output if piece.whole else os.path.join(job.output, pieces.PARTS)
  stem = task if piece.whole else pieces.part_name(task, piece.part)
  writers = {split: _SplitWriter(folder, split, stem) for split in store.SPLITS}
  position = 0
  for document in reader.documents():
    text = next(document, "")
    if not text:
      stats.empty_documents += 1
      continue
    # A .txt part inside its document: the document's first piece decides its split,
    # and only the file's first and last pieces carry STARTS / ENDS.
    head = reader.head if reader.continues_before else text
    writer = writers["validation" if is_validation(head, job.val_fraction) else "train"]
    flags, tokens = (0 if reader.continues_before else store.STARTS), 0
    for following in document:  # One piece behind: the last one gets ENDS.
      tokens += writer.write(_encode(tokenizer, text, dtype, limit), flags)
      text, flags = following, 0
    last = 0 if reader.continues_after else store.ENDS
    tokens += writer.write(_encode(tokenizer, text, dtype, limit), flags | last)
    now = reader.position()
    _add(now - position, tokens)
    position = now
    kill("prepare_writing", index)  # Test-only: a kill with the shard half-written.
  _add(max(piece.size - position, 0), 0)
  splits = {split: w.finish() for split, w in writers.items()}
  if piece.whole:
    result = {"task": task, "source": _source(job, index), "tokenizer": job.tokenizer_record,
              "splits": splits, **dataclasses.asdict(stats)}
    json_path = os.path.join(job.output, store.TASKS, task + ".json")
  else:
    result = {"task": task, "piece": record, "splits": splits, **dataclasses.asdict(stats)}
    json_path = pieces.part_json(job.output, task, piece.part)
  kill("prepare_written", index)  # Test-only: shards renamed, the task not yet recorded.
  files.write_atomically(json_path, json.dumps(result, indent=1, sort_keys=True))
  return result


def join_task(job: Job, index: int) -> dict[str, Any]:
  """Joins file `index`'s parts (all done) into its shards and task json; returns it.

  Under the file's build lock (`run_task`'s for a whole file): a file another preparation
  joined or tokenized whole meanwhile is taken as done (`found_done`).

  Raises:
    DataError: a part is missing, or the file's content is not the one its parts read
      (it changed during the preparation): a rerun redoes what changed.
  """
  task = task_name(index)
  with lock.building(os.path.join(job.output, store.TASKS, f".{task}.lock"),
                     f"source file {job.names[index]} of the corpus {job.output}",
                     waiting=lambda holder: _say_waiting(holder, job, index)):
    done = done_task(job, index, say=False)
    if done is not None:
      return {**done, "found_done": True}
    return _join(job, index)


def _join(job: Job, index: int) -> dict[str, Any]:
  task, name = task_name(index), job.names[index]
  plan = plan_file(job, index, hashed=False)  # The part count; _source hashes once below.
  results = []
  for piece in plan:
    path = pieces.part_json(job.output, task, piece.part)
    if not os.path.exists(path):
      raise DataError(f"prepare: part {piece.part + 1} of {len(plan)} of {name} is missing "
                      f"({path}): another preparation removed it, or the file changed; "
                      "rerun --mode=prepare to redo it")
    with open(path, encoding="utf-8") as f:
      results.append(json.load(f))
  source = _source(job, index)
  read = {r["piece"]["sha256"] for r in results}
  if read != {source["sha256"]}:
    raise DataError(f"prepare: {name} changed while its parts were tokenized (sha256 "
                    f"{source['sha256'][:12]}, its parts read {sorted(h[:12] for h in read)}); "
                    "rerun --mode=prepare to redo it")
  splits = pieces.join(lambda split: _SplitWriter(job.output, split, task), job.output, task,
                       results)
  result = {"task": task, "source": source, "tokenizer": job.tokenizer_record,
            "splits": splits, **{key: sum(r[key] for r in results)
                                 for key in dataclasses.asdict(readers.ReadStats())}}
  files.write_atomically(os.path.join(job.output, store.TASKS, task + ".json"),
                         json.dumps(result, indent=1, sort_keys=True))
  pieces.remove_parts(job.output, task)
  return result


def plan_file(job: Job, index: int, hashed: bool = True) -> list[pieces.Piece]:
  """Source file `index` as the tasks that prepare it (one, or its parts).

  With `hashed`, a file in parts is hashed once here (sha256), and every part records it:
  a rerun keeps a part by the file's content, as it keeps a whole file's task.
  """
  path = os.path.join(job.root, job.names[index])
  plan = pieces.plan(path, job.names[index], job.piece_bytes)
  digest = store.file_digest(path) if hashed and len(plan) > 1 else ""
  return [dataclasses.replace(p, file=index, sha256=digest) for p in plan]


def done_task(job: Job, index: int, say: bool = True) -> dict[str, Any] | None:
  """Task `index`'s json if it is done and still matches its file (by content) and the
  tokenizer, and its shards are whole (store.shard_problem); with `say`, a task found
  not done any more is logged with the reason."""
  task = task_name(index)
  path = os.path.join(job.output, store.TASKS, task + ".json")
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    result = json.load(f)
  source = result["source"]
  # By content (sha256 of the whole file, whatever its mtime): never "done" over bytes
  # changed under a kept size and mtime.
  change = source["path"] != job.names[index] or store.file_change(source, job.root,
                                                                    by_content=True)
  if change:
    if say and isinstance(change, str):
      logging.info("prepare: %s is tokenized again: %s", job.names[index], change)
    return None  # The file changed (or another file has this index now): redo it.
  # The same bytes (copied, or touched): this host's mtime goes into the manifest, so
  # that training here finds it unchanged without hashing it again.
  source["mtime_ns"] = os.stat(os.path.join(job.root, job.names[index])).st_mtime_ns
  if store.tokenizer_change(result, job.tokenizer_record):
    raise ConfigError(f"{path} was prepared with another vocabulary ("
                      f"{store.tokenizer_change(result, job.tokenizer_record)}): every "
                      "file of a corpus needs the same one; keep the vocabulary file in "
                      f"{os.path.dirname(job.output)} and prepare again")
  problem = next((p for split in store.SPLITS for p in [store.shard_problem(
      job.output, split, task, result["splits"][split]["records"])] if p), None)
  if problem:
    if say:
      logging.info("prepare: %s is tokenized again: %s", job.names[index], problem)
    return None
  return result


class _Progress:
  """The progress line every _PROGRESS_SECONDS (a thread, through workdir/progress.py):
  MB read of the stored sources, tasks done, tokens, tokens/s and the ETA."""

  def __init__(self, counters: tuple[Any, Any], total_bytes: int, tasks: int):
    self._counters, self._tasks = counters, tasks
    self.done = 0
    self._line = progress_lib.Progress("prepare", total=total_bytes / 1e6, unit="MB",
                                       detail=self._detail)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def __enter__(self) -> "_Progress":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  def _detail(self) -> str:
    tokens = self._counters[1].value
    return (f"{self.done}/{self._tasks} tasks, {tokens / 1e6:,.2f} M tokens "
            f"({tokens / self._line.seconds() / 1e6:.2f} M tokens/s)")

  def line(self) -> str:
    self._line.done = min(self._counters[0].value / 1e6, self._line.total)
    return self._line.line()

  def _run(self) -> None:
    while not self._stop.wait(_PROGRESS_SECONDS):
      progress_lib.say(self.line())


# How a list of calls `fn(job, item)` runs: here, in a local pool, or on a Ray cluster.
# Each takes (fn, job, items, on_done(item, result), counters) and returns when all are done.
Runner = Callable[[Callable[..., Any], Job, list[Any], Callable[[Any, Any], None], Any], None]


def _run_here(fn, job: Job, items: list[Any], on_done, counters) -> None:
  _init_worker(counters, in_worker=False)
  for item in items:
    on_done(item, fn(job, item))


def _pool_runner(workers: int, context: Any) -> Runner:
  def run(fn, job: Job, items: list[Any], on_done, counters) -> None:
    if workers <= 1 or len(items) <= 1:
      _run_here(fn, job, items, on_done, counters)
    else:
      _run_pool(fn, job, items, workers, context, counters, on_done)
  return run


def _run_pool(fn, job: Job, items: list[Any], workers: int, context: Any, counters: Any,
              on_done: Callable[[Any, Any], None]) -> None:
  """Runs `fn(job, item)` for `items` in worker processes; a worker's error stops the rest."""
  # concurrent.futures, not multiprocessing.Pool: a worker that dies (OOM killer, SIGKILL)
  # breaks the pool with an error here instead of losing its task and waiting forever.
  with concurrent.futures.ProcessPoolExecutor(min(workers, len(items)), mp_context=context,
                                              initializer=_init_worker,
                                              initargs=(counters, True, os.getpid())) as pool:
    futures = {pool.submit(fn, job, item): item for item in items}
    try:
      for future in concurrent.futures.as_completed(futures):
        on_done(futures[future], future.result())
    except concurrent.futures.process.BrokenProcessPool:
      raise DataError("a --mode=prepare worker process died (killed, or out of memory: "
                      "lower data.prepare_workers); rerun to resume, the files finished "
                      "so far are kept") from None
    except BaseException:  # An error, Ctrl-C, SIGTERM: stop the other files now.
      # The executor's shutdown would wait for the running files to finish; their
      # partial shards are never used (a rerun redoes them), so end the workers now.
      # The pool's own thread then fails the files not yet done (BrokenProcessPool,
      # unread). Not future.cancel() first: that thread sets the error on every pending
      # future, and one already cancelled raised InvalidStateError in it, a thread
      # traceback printed before the error's one line (Python 3.11).
      for process in list((pool._processes or {}).values()):  # pylint: disable=protected-access
        process.terminate()
      raise


def prepare(job: Job, *, workers: int, ray_address: str = "") -> dict[str, Any]:
  """Runs the tasks not yet done (and joins split files' parts), then writes the manifest.

  Args:
    job: the preparation.
    workers: local worker processes (1: in this process); unused with `ray_address`.
    ray_address: a Ray cluster's address ("auto" or HOST:PORT) to run the tasks on its
      nodes (data/corpus/on_ray.py); "" runs them here. Ray is imported only then.

  Returns:
    The manifest.
  """
  os.makedirs(job.output, exist_ok=True)
  # A killed attempt's temporary shards are removed by run_task, under the task's lock:
  # another preparation of this corpus (another command, another host) may be writing them.
  results = {i: done_task(job, i) for i in range(len(job.names))}
  pending = [i for i, r in results.items() if r is None]
  plans = {i: plan_file(job, i) for i in pending}
  todo = [p for i in pending for p in plans[i]
          if p.whole or pieces.done_part(job.output, task_name(i), os.path.join(
              job.root, job.names[i]), job.names[i], p) is None]
  split = [i for i in pending if len(plans[i]) > 1]
  total = sum(p.size for p in todo)
  if ray_address:
    from transformer.data.corpus import on_ray  # pylint: disable=g-import-not-at-top
    run = on_ray.runner(ray_address, job, set_reporter)
    where = f"the Ray cluster at {ray_address}"
  else:
    # fork: this mode starts no JAX backend (STARTS_JAX=False), and spawn would import
    # launch.py (and JAX) again in every worker.
    run = _pool_runner(workers, multiprocessing.get_context("fork"))
    where = f"{workers} worker process(es)"
  progress_lib.say(
      f"prepare: {len(job.names)} source files in {job.root} ({len(job.names) - len(pending)} "
      f"already done), {len(pending)} to tokenize ({total / 1e6:.1f} MB) as {len(todo)} "
      f"tasks ({len(split)} files in parts of {job.piece_bytes / 1e6:g} MB) on {where} "
      f"into {job.output}")
  counters = (multiprocessing.Value("q", 0), multiprocessing.Value("q", 0))
  started = time.monotonic()
  found = [0]  # Tasks another preparation of this corpus did while this one waited.

  def count(result: dict[str, Any]) -> dict[str, Any]:
    found[0] += bool(result.pop("found_done", False))
    return result

  with _Progress(counters, total, len(todo)) as line:
    def finished(piece: pieces.Piece, result: dict[str, Any]) -> None:
      count(result)
      if piece.whole:
        results[piece.file] = result
      line.done += 1
    run(run_task, job, todo, finished, counters)
    if todo:
      progress_lib.say(line.line())
  if split:
    with progress_lib.stage(f"prepare: joining the parts of {len(split)} split file(s)"):
      run(join_task, job, split, lambda i, r: results.__setitem__(i, count(r)), counters)
  progress_lib.say(
      f"prepare: {len(todo)} tasks done in "
      f"{progress_lib.seconds_text(time.monotonic() - started)}"
      + (f"; {found[0]} found done by another --mode=prepare of this corpus, waited for "
         "(already done)" if found[0] else ""))
  manifest = _manifest(job, [results[i] for i in range(len(job.names))])
  empty = store.empty_split(manifest, job.output)
  if empty:  # Refused before the manifest: nothing a run could start on and then fail.
    raise ConfigError(empty)
  files.write_atomically(os.path.join(job.output, store.MANIFEST),
                         json.dumps(manifest, indent=1, sort_keys=True))
  return manifest


def _manifest(job: Job, results: list[dict[str, Any]]) -> dict[str, Any]:
  splits = {}
  for split in store.SPLITS:
    shards = [{"task": r["task"], **r["splits"][split]} for r in results]
    splits[split] = {key: sum(s[key] for s in shards) for key in ("documents", "records", "tokens")}
    splits[split]["shards"] = shards
  return {"format": store.FORMAT,
          "sources": {"path": job.root, "text_key": job.text_key,
                      "files": [r["source"] for r in results]},
          "tokenizer": job.tokenizer_record, "dtype": job.dtype,
          "split_rule": {"kind": "blake2b-8 of the first piece", "val_fraction": job.val_fraction},
          "splits": splits,
          **{key: sum(r[key] for r in results)
             for key in ("skipped_records", "replaced_characters", "empty_documents")}}


def summary(manifest: dict[str, Any]) -> str:
  """The end-of-preparation lines: documents and tokens per split, what was skipped."""
  lines = [f"Prepared corpus: {len(manifest['sources']['files'])} files, {manifest['dtype']} ids "
           f"({manifest['tokenizer']['kind']} tokenizer, {manifest['tokenizer']['vocab_size']} ids)"]
  for split, info in manifest["splits"].items():
    lines.append(f"  {split}: {info['documents']:,} documents, {info['tokens']:,} tokens "
                 f"in {info['records']:,} records")
  lines.append(f"  skipped records {manifest['skipped_records']:,}, empty documents "
               f"{manifest['empty_documents']:,}, replaced characters "
               f"{manifest['replaced_characters']:,}")
  return "\n".join(lines)
