"""Prepared corpora (docs/corpus.md): preparation speed, and reading ids against today's path.

One run, all on a synthetic corpus written first (English-like documents of words drawn
from a Zipf distribution over ~60k made-up words, as jsonl.gz files) and a byte-level
BPE trained on a small sample of it with `tokenizers` (ByteLevel pre-tokenizer, ~50k
ids, wrapped as an imported Hugging Face tokenizer: the path a GPT-2 tokenizer.json
takes). Each measurement runs in its own process, so that its peak RSS is its own:

  tokenizer   the tokenizer alone, one thread: MB/s and tokens/s encoding documents
              one at a time (the call preparation makes);
  prepare     preparation.prepare of the small corpus with 1 and then 2 workers
              (fresh outputs), and of the large corpus with 2: MB/s of text, tokens/s,
              peak RSS of the parent and of the largest worker;
  read        gpt_small's training rows (8 x 1024, packed with segment ids, data.num_threads
              threads) from the prepared ids of each corpus: time to the first batch
              (from opening the corpus), tokens/s over --seconds, peak RSS; and today's
              online path (lm.make_lm_dataset tokenizing each document as it is read,
              the same tokenizer) over the small corpus's documents held in memory;
  readers     the large corpus's rows read as before (grain's reader threads make one
              record, or one random window, a call) and in blocks (packing.read_in_blocks),
              with no reader threads and with --num_threads, packed (data.lm_windows) and
              random windows: --repeats interleaved rounds, medians and ratios.

  python benchmarks/prepared_corpus.py --out=/tmp/prepared_bench   # 4 min quiet, 6 loaded
  python benchmarks/prepared_corpus.py --out=/tmp/prepared_bench --reuse=1 --seconds=4 \
      --repeats=5                                # the readers again, on that run's corpora
  python benchmarks/prepared_corpus.py --out=/tmp/prepared_bench_full \\
      --small_mb=250 --large_mb=2000 --seconds=20                          # the issue's sizes

Sizes are of the documents' text (UTF-8), before gzip. Results print as JSON lines and a
summary; docs/performance.md has the figures of a run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SEQ_LEN, BATCH = 1024, 8  # gpt_small's rows.
DOCS_PER_FILE_MB = 1.5  # Each source file holds about this much text (one preparation task).


def _rss_mb(who: int = resource.RUSAGE_SELF) -> float:
  return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB.


def _words(rng: np.random.Generator, count: int = 60_000) -> np.ndarray:
  """Made-up words of 1-4 syllables."""
  syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai",
                                                              "ou", "er", "an", "in")]
  lengths = rng.integers(1, 5, size=count)
  words = {"".join(rng.choice(syllables, size=n)) for n in lengths}
  return np.array(sorted(words))


def write_corpus(folder: str, megabytes: float, seed: int) -> dict[str, float]:
  """jsonl.gz files of ~DOCS_PER_FILE_MB MB of text each, `megabytes` in all."""
  rng = np.random.default_rng(seed)
  words = _words(np.random.default_rng(0))  # The same words in every corpus.
  weights = 1.0 / np.arange(1, len(words) + 1) ** 1.1
  weights /= weights.sum()
  os.makedirs(folder, exist_ok=True)
  target, written, index, docs = megabytes * 1e6, 0, 0, 0
  while written < target:
    size = 0
    with gzip.open(os.path.join(folder, f"part-{index:04d}.jsonl.gz"), "wt",
                   encoding="utf-8", compresslevel=1) as f:
      while size < DOCS_PER_FILE_MB * 1e6 and written + size < target:
        ids = rng.choice(len(words), size=int(rng.integers(50, 1500)), p=weights)
        text = " ".join(words[ids]).capitalize() + "."
        f.write(json.dumps({"text": text}) + "\n")
        size += len(text)
        docs += 1
    written += size
    index += 1
  return {"text_mb": written / 1e6, "files": index, "documents": docs}


def train_tokenizer(corpus: str, path: str, vocab: int, sample_mb: float) -> int:
  """A ByteLevel BPE trained on the first `sample_mb` MB, saved as an imported bundle."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top

  def sample():
    taken = 0
    for name in sorted(os.listdir(corpus)):
      with gzip.open(os.path.join(corpus, name), "rt", encoding="utf-8") as f:
        for line in f:
          text = json.loads(line)["text"]
          taken += len(text)
          yield text
          if taken > sample_mb * 1e6:
            return

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(sample(), trainer)
  size = tok.get_vocab_size()
  # As hf_import lays out GPT-2's: pad, eos, bos, unk at 0..3 (eos = bos = <|endoftext|>,
  # pad and unk added rows), then every other id in order (data/tokenizers/hf_vocab.py).
  bundle = {"family": "gpt2", "hf_vocab_size": size,
            "internal_to_hf": [-1, 0, 0, -1] + list(range(1, size)), "added": [0, 2, 3],
            "mask": None, "tokenizer_json": json.loads(tok.to_str()), "sentencepiece": None}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(bundle, f)
  return size


def _documents(corpus: str, limit_mb: float = float("inf")) -> list[str]:
  out, taken = [], 0
  for name in sorted(os.listdir(corpus)):
    with gzip.open(os.path.join(corpus, name), "rt", encoding="utf-8") as f:
      for line in f:
        out.append(json.loads(line)["text"])
        taken += len(out[-1])
        if taken > limit_mb * 1e6:
          return out
  return out


def stage_tokenizer(args) -> dict:
  from transformer.data.tokenizers import hf_vocab  # pylint: disable=g-import-not-at-top
  tok = hf_vocab.HFTokenizer(args.tokenizer)
  docs = _documents(args.corpus, args.sample_mb)
  start = time.perf_counter()
  tokens = sum(len(tok.encode(d)) for d in docs)
  seconds = time.perf_counter() - start
  text = sum(len(d.encode()) for d in docs)
  return {"mb_per_s": text / 1e6 / seconds, "tokens_per_s": tokens / seconds,
          "text_mb": text / 1e6, "bytes_per_token": text / tokens}


def _job(args):
  from transformer.data.corpus import store  # pylint: disable=g-import-not-at-top
  from transformer.data.corpus import preparation  # pylint: disable=g-import-not-at-top
  from transformer.data.tokenizers import hf_vocab  # pylint: disable=g-import-not-at-top
  from transformer.data.tokenizers import run_vocabulary  # pylint: disable=g-import-not-at-top
  tok = hf_vocab.HFTokenizer(args.tokenizer)
  record = run_vocabulary.tokenizer_record(tok)
  names = tuple(sorted(os.listdir(args.corpus)))
  return preparation.Job(
      root=args.corpus, names=names, output=args.output, text_key="text",
      decode_errors="strict", bad_records="stop", val_fraction=0.005,
      tokenizer_kind="huggingface", tokenizer_path=args.tokenizer, tokenizer_record=record,
      dtype=store.id_dtype(tok.vocab_size).name)


def stage_prepare(args) -> dict:
  from transformer.data.corpus import preparation  # pylint: disable=g-import-not-at-top
  job = _job(args)
  text = sum(len(d.encode()) for d in _documents(args.corpus)) if args.count_text else 0
  start = time.perf_counter()
  manifest = preparation.prepare(job, workers=args.workers, shard=(0, 1))
  seconds = time.perf_counter() - start
  tokens = sum(s["tokens"] for s in manifest["splits"].values())
  return {"workers": args.workers, "seconds": seconds, "tokens": tokens,
          "tokens_per_s": tokens / seconds, "mb_per_s": text / 1e6 / seconds,
          "rss_parent_mb": _rss_mb(), "rss_largest_worker_mb": _rss_mb(resource.RUSAGE_CHILDREN)}


def _one_at_a_time() -> None:
  """Reading as before blocks (for comparison): grain's reader threads make one element
  (a record, a random window) a call. The elements, rows and iterator states are the
  same (tests/test_corpus.py holds them equal)."""
  import grain  # pylint: disable=g-import-not-at-top
  from transformer.data import packing  # pylint: disable=g-import-not-at-top

  def one_at_a_time(ds, *, block, num_threads, read=list):
    del block
    return ds.map(lambda element: read([element])[0]).to_iter_dataset(
        grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=64))

  packing.read_in_blocks = one_at_a_time


def stage_read(args) -> dict:
  from transformer.data.corpus import store  # pylint: disable=g-import-not-at-top
  from transformer.data.tokenizers import hf_vocab  # pylint: disable=g-import-not-at-top
  from transformer.data import lm  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  tok = hf_vocab.HFTokenizer(args.tokenizer)
  vocab = -(-tok.vocab_size // 128) * 128
  common = dict(text_key="text", vocab_size=vocab, seq_len=SEQ_LEN, batch_size=BATCH, seed=0,
                train=True, windows=args.windows, num_threads=args.num_threads)
  if args.mode == "prepared":
    if args.reader == "records":
      _one_at_a_time()
    split = store.PreparedCorpus.open(args.output).split("train")
    rows = lm.make_lm_dataset(split, tok, prepared=True, **common)
  else:  # Today's path: each document tokenized as grain reads it.
    docs = [{"text": d} for d in _documents(args.corpus)]
    rows = lm.make_lm_dataset(docs, tok, **common)
  it = iter(rows)
  next(it)
  first = time.perf_counter() - start
  count, t0 = 0, time.perf_counter()
  while time.perf_counter() - t0 < args.seconds:
    next(it)
    count += 1
  seconds = time.perf_counter() - t0
  return {"mode": args.mode, "reader": args.reader, "windows": args.windows,
          "first_batch_s": first,
          "tokens_per_s": count * BATCH * SEQ_LEN / seconds, "batches": count,
          "rss_mb": _rss_mb()}


def _stage(stage: str, **kwargs) -> dict:
  """Runs one stage in a fresh process (its own peak RSS); returns its JSON line."""
  argv = [sys.executable, os.path.abspath(__file__), f"--stage={stage}"]
  argv += [f"--{k}={v}" for k, v in kwargs.items()]
  env = dict(os.environ, TOKENIZERS_PARALLELISM="false", JAX_PLATFORMS="cpu")
  done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
  if done.returncode:
    raise RuntimeError(f"{stage} failed:\n{done.stderr[-3000:]}")
  result = json.loads(done.stdout.strip().splitlines()[-1])
  print(json.dumps({"stage": stage, **{k: v for k, v in kwargs.items() if k != "tokenizer"},
                    **result}), flush=True)
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="/tmp/prepared_corpus_bench")
  parser.add_argument("--small_mb", type=float, default=12)
  parser.add_argument("--large_mb", type=float, default=96)
  parser.add_argument("--vocab", type=int, default=50_000)
  parser.add_argument("--sample_mb", type=float, default=6)
  parser.add_argument("--seconds", type=float, default=6)
  parser.add_argument("--num_threads", type=int, default=2)  # base.py's data.num_threads.
  parser.add_argument("--repeats", type=int, default=3)  # Rounds of the reader comparison.
  parser.add_argument("--reuse", type=int, default=0)  # 1: only the reader comparison, on
  # the corpora and tokenizer an earlier run left in --out.
  # One stage, in its own process (internal).
  parser.add_argument("--stage", default="")
  parser.add_argument("--corpus", default="")
  parser.add_argument("--tokenizer", default="")
  parser.add_argument("--output", default="")
  parser.add_argument("--workers", type=int, default=1)
  parser.add_argument("--mode", default="prepared")
  parser.add_argument("--reader", default="blocks")  # Prepared: "blocks", or "records" (before).
  parser.add_argument("--windows", default="packed")  # data.lm_windows.
  parser.add_argument("--count_text", type=int, default=1)
  args = parser.parse_args()
  if args.stage:
    stage = {"tokenizer": stage_tokenizer, "prepare": stage_prepare, "read": stage_read}
    print(json.dumps(stage[args.stage](args)))
    return

  started = time.perf_counter()
  small, large = os.path.join(args.out, "small"), os.path.join(args.out, "large")
  tok_path = os.path.join(args.out, "hf_tokenizer.json")
  if not args.reuse:
    prepare_and_read(args, small, large, tok_path)
  compare_readers(args, large, tok_path)
  print(json.dumps({"total_seconds": time.perf_counter() - started}))


def prepare_and_read(args, small: str, large: str, tok_path: str) -> None:
  """The corpora, the tokenizer, preparation, and a first read of each corpus."""
  if os.path.exists(args.out):
    shutil.rmtree(args.out)
  print(json.dumps({"corpus": "small", **write_corpus(small, args.small_mb, 1)}), flush=True)
  print(json.dumps({"corpus": "large", **write_corpus(large, args.large_mb, 2)}), flush=True)
  t0 = time.perf_counter()
  size = train_tokenizer(small, tok_path, args.vocab, args.sample_mb)
  print(json.dumps({"tokenizer_ids": size, "trained_on_mb": args.sample_mb,
                    "train_seconds": time.perf_counter() - t0}), flush=True)
  common = dict(tokenizer=tok_path, sample_mb=args.sample_mb)
  _stage("tokenizer", corpus=small, **common)
  for workers in (1, 2):
    _stage("prepare", corpus=small, workers=workers, tokenizer=tok_path,
           output=os.path.join(args.out, f"ids_small_{workers}"))
  _stage("tokenizer", corpus=small, **common)  # Again after: the machine's load moved.
  _stage("prepare", corpus=large, workers=2, tokenizer=tok_path,
         output=os.path.join(args.out, "ids_large"))
  for name, corpus in (("small", small), ("large", large)):
    output = os.path.join(args.out, "ids_small_2" if name == "small" else "ids_large")
    _stage("read", corpus=corpus, tokenizer=tok_path, output=output, mode="prepared",
           seconds=args.seconds, num_threads=args.num_threads)
  _stage("read", corpus=small, tokenizer=tok_path, mode="online", seconds=args.seconds,
         num_threads=args.num_threads)


def compare_readers(args, large: str, tok_path: str) -> None:
  """The large corpus's rows read one element a grain call (before) and in blocks,
  with no reader threads and with --num_threads, packed and random windows: --repeats
  interleaved rounds, then the medians and their ratios."""
  runs: dict[tuple[str, str, int], list[float]] = {}
  for _ in range(args.repeats):
    for windows in ("packed", "random"):
      for reader in ("records", "blocks"):
        for threads in (0, args.num_threads):
          result = _stage("read", corpus=large, tokenizer=tok_path, mode="prepared",
                          output=os.path.join(args.out, "ids_large"), seconds=args.seconds,
                          num_threads=threads, reader=reader, windows=windows)
          runs.setdefault((windows, reader, threads), []).append(result["tokens_per_s"])
  median = {key: float(np.median(values)) for key, values in runs.items()}
  for windows in ("packed", "random"):
    rates = {f"{reader}_threads_{threads}": round(median[(windows, reader, threads)])
             for reader in ("records", "blocks") for threads in (0, args.num_threads)}
    line = {"summary": "median tokens/s", "windows": windows, "rounds": args.repeats, **rates}
    for reader in ("records", "blocks"):  # With threads / without: >= 1 is the aim.
      line[f"{reader}_threads_over_none"] = round(
          median[(windows, reader, args.num_threads)] / median[(windows, reader, 0)], 2)
    for threads in (0, args.num_threads):
      line[f"blocks_over_records_threads_{threads}"] = round(
          median[(windows, "blocks", threads)] / median[(windows, "records", threads)], 2)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
  main()
