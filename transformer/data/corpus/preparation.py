"""Tokenizing a corpus once into array_record shards: tasks, workers, resume, the manifest.

One task per source file (in sorted order): its documents are read streamed
(data/corpus/readers.py), tokenized, sent to `train` or `validation` by a stable hash of
their first piece, and written one record per piece into `<split>/<task>.array_record`
with `<split>/<task>.index.npy` beside it. A task's output depends only on its file and
the tokenizer, so the corpus is byte-identical whatever the worker count or the shard
split (`data.prepare_shard="i/N"`: the tasks with index % N == i).

Crash safety: shards are written under temporary names and renamed; `tasks/<task>.json`
is written atomically (workdir/files.py) after them, and only a task with its json is
done; `manifest.json`, written last, is what a training run reads. A rerun after a kill
keeps the done tasks and redoes the others; a half-written file is never read. A task
is done only when its json is there, its source file is the one it records (by content:
store.file_change) and its shard files are whole (store.shard_problem).

Two preparations of one corpus at once (two commands, two hosts' data.prepare_shard over
a shared folder): each source file is tokenized under its own build lock
(`tasks/.<task>.lock`, workdir/lock.py), so one process writes it while the other waits,
saying for whom (once per other process), and then takes it as done; both write the
same manifest.
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
import threading
import time
from typing import Any

import numpy as np
from absl import logging

from transformer.config.errors import ConfigError, DataError
from transformer.data.corpus import readers
from transformer.data.corpus import store
from transformer.data.tokenizers import vocabularies
from transformer.workdir import files
from transformer.workdir import kill_points
from transformer.workdir import lock

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


def task_name(index: int) -> str:
  """The 5-digit name of task `index` (its source file's position in sorted order)."""
  return f"{index:05d}"


def is_validation(first_piece: str, val_fraction: float) -> bool:
  """The split rule: blake2b-8 of the first piece's UTF-8 text, as a fraction of 2^64."""
  digest = hashlib.blake2b(first_piece.encode("utf-8", "surrogatepass"), digest_size=8)
  return int.from_bytes(digest.digest(), "little") / 2.0 ** 64 < val_fraction


# Per worker process: the tokenizer (built once) and the shared progress counters.
_WORKER: dict[str, Any] = {}


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


def _tokenizer(job: Job) -> vocabularies.Tokenizer:
  if _WORKER.get("tokenizer_path") != (job.tokenizer_kind, job.tokenizer_path):
    from transformer.data.tokenizers import hf_vocab  # pylint: disable=g-import-not-at-top
    _WORKER["tokenizer"] = hf_vocab.from_kind(job.tokenizer_kind, job.tokenizer_path)
    _WORKER["tokenizer_path"] = (job.tokenizer_kind, job.tokenizer_path)
  return _WORKER["tokenizer"]


def _add(read_bytes: int, tokens: int) -> None:
  counters = _WORKER.get("counters")
  if counters:
    with counters[0].get_lock():
      counters[0].value += read_bytes
    with counters[1].get_lock():
      counters[1].value += tokens


class _SplitWriter:
  """One split's shard of a task: records under a temporary name, the index in memory."""

  def __init__(self, job: Job, split: str, task: str):
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
    self.final = os.path.join(job.output, split, task + ".array_record")
    self.index_path = os.path.join(job.output, split, task + ".index.npy")
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
    self._writer.write(ids.tobytes())
    tokens = len(ids) + bool(flags & store.STARTS) + bool(flags & store.ENDS)
    self.offsets.append(self.offsets[-1] + tokens)
    self.flags.append(flags)
    self.documents += bool(flags & store.STARTS)
    return tokens

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


def run_task(job: Job, index: int) -> dict[str, Any]:
  """Tokenizes source file `index` into its shards and writes its task json; returns it.

  Holds the task's build lock (workdir/lock.py's `building`) throughout: another
  --mode=prepare of the same corpus doing this file now is waited for (one line naming
  it), and its result is then taken as done (`found_done` set in the result) instead of
  both writing the same shard files.
  """
  task = task_name(index)
  with lock.building(os.path.join(job.output, store.TASKS, f".{task}.lock"),
                     f"source file {job.names[index]} of the corpus {job.output}",
                     waiting=lambda holder: _say_waiting(holder, job, index)):
    done = done_task(job, index, say=False)  # prepare() said why it is not done.
    if done is not None:
      return {**done, "found_done": True}
    for split in store.SPLITS:
      leftover = os.path.join(job.output, split, f".{task}.array_record.partial")
      if os.path.exists(leftover):
        os.remove(leftover)  # A killed attempt's shard: never part of the corpus.
    return _tokenize(job, index)


_WAITED_FOR: set[str] = set()  # Holders this process said it waits for (once each).


def _say_waiting(holder: str, job: Job, index: int) -> None:
  """One line per other preparation of this corpus, not one per file it holds."""
  if holder in _WAITED_FOR:
    return
  _WAITED_FOR.add(holder)
  logging.info("Waiting for %s, which is preparing this corpus too (%s; it holds source "
               "file %s now): each file it tokenizes is waited for, then taken as done",
               holder, job.output, job.names[index])


def _tokenize(job: Job, index: int) -> dict[str, Any]:
  """`run_task`'s work, under its lock: the shards, then the task json."""
  name, task = job.names[index], task_name(index)
  path = os.path.join(job.root, name)
  stat = os.stat(path)
  source = {"path": name, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "sha256": store.file_digest(path)}
  tokenizer, dtype = _tokenizer(job), np.dtype(job.dtype)
  limit = min(tokenizer.vocab_size, np.iinfo(dtype).max + 1)
  kill = kill_points.KillPoints.from_env()
  stats = readers.ReadStats()
  reader = readers.reader(path, name, text_key=job.text_key,
                              decode_errors=job.decode_errors, bad_records=job.bad_records,
                              stats=stats)
  writers = {split: _SplitWriter(job, split, task) for split in store.SPLITS}
  position = 0
  for document in reader.documents():
    piece = next(document, "")
    if not piece:
      stats.empty_documents += 1
      continue
    writer = writers["validation" if is_validation(piece, job.val_fraction) else "train"]
    flags, tokens = store.STARTS, 0
    for following in document:  # One piece behind: the last one gets ENDS.
      tokens += writer.write(_encode(tokenizer, piece, dtype, limit), flags)
      piece, flags = following, 0
    tokens += writer.write(_encode(tokenizer, piece, dtype, limit), flags | store.ENDS)
    now = reader.position()
    _add(now - position, tokens)
    position = now
    kill("prepare_writing", index)  # Test-only: a kill with the shard half-written.
  _add(stat.st_size - position, 0)
  result = {"task": task, "source": source, "tokenizer": job.tokenizer_record,
            "splits": {split: w.finish() for split, w in writers.items()},
            **dataclasses.asdict(stats)}
  kill("prepare_written", index)  # Test-only: shards renamed, the task not yet recorded.
  files.write_atomically(os.path.join(job.output, store.TASKS, task + ".json"),
                         json.dumps(result, indent=1, sort_keys=True))
  return result


def done_task(job: Job, index: int, say: bool = True) -> dict[str, Any] | None:
  """Task `index`'s json if it is done and still matches its file and the tokenizer;
  with `say`, a task found not done any more is logged with the reason."""
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
  # The same bytes (another host's copy, or touched): this host's mtime goes into the
  # manifest, so that training here finds it unchanged without hashing it again.
  source["mtime_ns"] = os.stat(os.path.join(job.root, job.names[index])).st_mtime_ns
  if store.tokenizer_change(result, job.tokenizer_record):
    raise ConfigError(f"{path} was prepared with another vocabulary ("
                      f"{store.tokenizer_change(result, job.tokenizer_record)}): every "
                      "shard of a corpus needs the same one; copy the first host's vocabulary "
                      f"file into {os.path.dirname(job.output)} before data.prepare_shard runs")
  problem = next((p for split in store.SPLITS for p in [store.shard_problem(
      job.output, split, task, result["splits"][split]["records"])] if p), None)
  if problem:
    if say:
      logging.info("prepare: %s is tokenized again: %s", job.names[index], problem)
    return None
  return result


def parse_shard(value: str) -> tuple[int, int]:
  """data.prepare_shard "i/N" (validated by config/data.py) -> (i, N); "" -> (0, 1)."""
  head, _, tail = str(value).partition("/")
  return (int(head), int(tail)) if value else (0, 1)


class _Progress:
  """The progress line every _PROGRESS_SECONDS (a thread), and the final summary."""

  def __init__(self, counters: tuple[Any, Any], total_bytes: int, tasks: int):
    self._counters, self._total, self._tasks = counters, total_bytes, tasks
    self.done = 0
    self._started = time.monotonic()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def __enter__(self) -> "_Progress":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  def line(self) -> str:
    seconds = max(time.monotonic() - self._started, 1e-9)
    read, tokens = self._counters[0].value, self._counters[1].value
    rate = read / seconds
    eta = (self._total - read) / rate if rate > 0 else float("inf")
    return (f"prepare: {self.done}/{self._tasks} files, {read / 1e6:,.1f} of "
            f"{self._total / 1e6:,.1f} MB ({rate / 1e6:.2f} MB/s), {tokens / 1e6:,.2f} M tokens "
            f"({tokens / seconds / 1e6:.2f} M tokens/s), ETA "
            + (f"{eta:.0f} s" if eta != float("inf") else "unknown"))

  def _run(self) -> None:
    while not self._stop.wait(_PROGRESS_SECONDS):
      logging.info("%s", self.line())


def _run_pool(job: Job, pending: list[int], workers: int, context: Any, counters: Any,
              results: dict[int, Any], progress: _Progress) -> None:
  """Runs `pending` tasks in worker processes; a worker's error stops the rest."""
  # concurrent.futures, not multiprocessing.Pool: a worker that dies (OOM killer, SIGKILL)
  # breaks the pool with an error here instead of losing its task and waiting forever.
  with concurrent.futures.ProcessPoolExecutor(min(workers, len(pending)), mp_context=context,
                                              initializer=_init_worker,
                                              initargs=(counters, True, os.getpid())) as pool:
    futures = [pool.submit(run_task, job, i) for i in pending]
    try:
      for future in concurrent.futures.as_completed(futures):
        result = future.result()
        results[int(result["task"])] = result
        progress.done += 1
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


def prepare(job: Job, *, workers: int, shard: tuple[int, int]) -> dict[str, Any] | None:
  """Runs the tasks of this shard not yet done, then writes the manifest if all are.

  Args:
    job: the preparation.
    workers: worker processes (1: in this process).
    shard: (i, N): the tasks with index % N == i.

  Returns:
    The manifest, or None when other shards' tasks are still missing.
  """
  os.makedirs(job.output, exist_ok=True)
  mine = [i for i in range(len(job.names)) if i % shard[1] == shard[0]]
  # A killed attempt's partial shards are removed by run_task, under the file's lock:
  # another prepare of this corpus (another shard, another host) may be writing them.
  results = {i: done_task(job, i) for i in mine}
  pending = [i for i in mine if results[i] is None]
  sizes = {i: os.path.getsize(os.path.join(job.root, job.names[i])) for i in pending}
  logging.info("prepare: %d source files in %s (%d of this shard already done), %d to "
               "tokenize (%.1f MB) with %d worker process(es) into %s", len(job.names),
               job.root, len(mine) - len(pending), len(pending), sum(sizes.values()) / 1e6,
               workers, job.output)
  # fork: this mode starts no JAX backend (STARTS_JAX=False), and spawn would import
  # launch.py (and JAX) again in every worker.
  context = multiprocessing.get_context("fork")
  counters = (context.Value("q", 0), context.Value("q", 0))
  started = time.monotonic()
  with _Progress(counters, sum(sizes.values()), len(pending)) as progress:
    if workers <= 1 or len(pending) <= 1:
      _init_worker(counters, in_worker=False)
      for i in pending:
        results[i] = run_task(job, i)
        progress.done += 1
    else:
      _run_pool(job, pending, workers, context, counters, results, progress)
    if pending:
      logging.info("%s", progress.line())
  found = sum(bool(results[i].pop("found_done", False)) for i in pending)
  logging.info("prepare: %d files tokenized in %.1f s%s", len(pending) - found,
               time.monotonic() - started,
               f"; {found} found done by another --mode=prepare of this corpus, waited "
               "for (already done)" if found else "")
  # Other shards' tasks without their json first (a stat each): only when every one is
  # there are they checked whole, by content (a shard's host does not hash the others'
  # files at the end of each shard).
  missing = [job.names[i] for i in range(len(job.names)) if results.get(i) is None
             and not os.path.exists(os.path.join(job.output, store.TASKS,
                                                 task_name(i) + ".json"))]
  every = {} if missing else {i: results.get(i) or done_task(job, i)
                              for i in range(len(job.names))}
  missing = missing or [job.names[i] for i, r in every.items() if r is None]
  if missing:
    logging.info("prepare: shard %d/%d done; %d source files of other shards are not "
                 "prepared yet (e.g. %s): run them, then --mode=prepare once more (without "
                 "data.prepare_shard) to write the manifest", shard[0], shard[1],
                 len(missing), missing[0])
    return None
  manifest = _manifest(job, [every[i] for i in range(len(job.names))])
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
