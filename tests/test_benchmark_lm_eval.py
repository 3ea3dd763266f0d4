"""Benchmark requests exactly as lm-evaluation-harness 0.4.13 makes them, and the
encoder-decoder's scoring.

Default tests (no torch, no lm-eval): the stored fixture
tests/fixtures/benchmarks/lm_eval_parity.json (lm-eval's own encoding code on the tiny
GPT-2 and T5 tokenizers; make_lm_eval_parity.py says what it holds) against
requests.Encoding, refusal and the packed input window; documents lm-eval refuses
left out and counted; the harness model splitting with the same encoder; an
encoder-decoder's benchmark log-likelihoods against a direct forward, packed or not.
Where lm-eval is installed, the fixture is also recomputed and compared.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.data.tokenizers import hf_vocab
from transformer.data.tokenizers import vocabularies
from transformer.evaluation import benchmark
from transformer.evaluation import requests as requests_lib
from transformer.evaluation import scoring
from transformer.evaluation import tasks as tasks_lib
from transformer.interop.hf import importer
from transformer.model.models import make_model

from test_benchmark import _scorer, tiny_model  # pylint: disable=unused-import  # A fixture.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "benchmarks", "lm_eval_parity.json")
HF_FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")


def _parity():
  with open(FIXTURE, encoding="utf-8") as f:
    return json.load(f)


def _tokenizer(tmp_path, record) -> hf_vocab.HFTokenizer:
  """The imported fixture's tokenizer, with the record's post-processor if it has one."""
  folder = os.path.join(HF_FIXTURES, record["folder"])
  bundle = importer.tokenizer_bundle(importer.convert_folder(folder), folder)
  if record["post_processor"] is not None:
    bundle["tokenizer_json"]["post_processor"] = record["post_processor"]
  path = tmp_path / f"{record['folder']}_{record['backend']}.json"
  path.write_text(json.dumps(bundle))
  return hf_vocab.HFTokenizer(str(path))


@pytest.mark.parametrize("name", ["gpt2", "gpt2_bos", "t5"])
def test_requests_are_lm_evals_own(tmp_path, name):
  """Each request shape (a plain pair, trailing space/newline/tab, leading spaces, an
  empty context, the prefix token's text, whitespace only, a continuation longer than
  the window, a left-truncated context) and each rolling text: the ids, the refusal
  and the input window are the ones lm-eval's HF backend makes (source ids)."""
  record = _parity()["tokenizers"][name]
  tokenizer = _tokenizer(tmp_path, record)
  encoding = requests_lib.Encoding(tokenizer, seq2seq=record["backend"] == "seq2seq")
  to_hf = lambda ids: [int(tokenizer.internal_to_hf[i]) for i in ids]
  length = record["max_length"]
  assert to_hf([encoding.prefix_id]) == [record["prefix_token_id"]]
  assert encoding.describe()["bos"] == (name == "gpt2_bos")
  for row in record["requests"]:
    context, continuation = encoding.pair(row["context"], row["continuation"])
    where = (row["context"], row["continuation"])
    assert to_hf(context) == row["context_ids"], where
    assert to_hf(continuation) == row["continuation_ids"], where
    assert requests_lib.refusal((context, continuation), length) == row["refused"], where
    if row["refused"] is None:
      pack = requests_lib.pack_pairs if encoding.seq2seq else requests_lib.pack
      packed = pack([(context, continuation)], length)
      fed = packed.arrays["inputs"][0]
      ids = fed[packed.arrays["inputs_segment_ids" if encoding.seq2seq
                               else "segment_ids"][0] > 0]
      assert to_hf(ids) == row["input"], where
      assert to_hf(packed.continuations[0]) == row["continuation_ids"]
  for row in record["rolling"]:
    windows = [[to_hf(a), to_hf(b)] for a, b in encoding.rolling(row["text"], length)]
    assert windows == row["windows"], row["text"]


def test_the_fixture_is_what_lm_eval_computes():
  """Recomputed with lm-eval's own code where it is installed: the stored file is current."""
  pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install "
                      "lm-eval==0.4.13): the stored fixture is checked without it")
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "make_lm_eval_parity", os.path.join(os.path.dirname(FIXTURE), "make_lm_eval_parity.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.make() == _parity()


def test_a_document_lm_eval_refuses_is_left_out_and_counted():
  """A choice longer than the window is never scored in part: its document is left out,
  counted by reason, and the metrics are over the others."""
  task = tasks_lib.Task("t", "multiple_choice", "test", (
      tasks_lib.Document("multiple_choice", ("ctx:",) * 2, (" ab", " " + "x" * 40),
                         ("ab", "x" * 40), 0, where="t:1"),
      tasks_lib.Document("multiple_choice", ("ctx:",) * 2, (" a", " b"), ("a", "b"), 1,
                         where="t:2")))
  encoded = benchmark.task_requests(task, requests_lib.Encoding(vocabularies.ByteTokenizer()),
                                    16)
  assert encoded.excluded_documents == 1
  assert encoded.excluded == {"empty_context": 0, "continuation_longer_than_window": 1}
  assert len(encoded.task.documents) == 1 and len(encoded.requests) == 2
  assert "1 documents left out" in benchmark.excluded_note(encoded)
  with pytest.raises(ValueError, match="the continuation has more tokens than the window"):
    requests_lib.pack([((2, 5), tuple(range(4, 30)))], 16)


def test_the_harness_model_splits_with_the_same_encoder(monkeypatch):
  """lm-eval's loglikelihood on the harness model hands the scorer Encoding.pair's ids
  (no bos added by hand), and a request it cannot score whole stops in one line."""
  pytest.importorskip("lm_eval", reason="lm-eval is not installed")
  from transformer.evaluation import harness  # pylint: disable=g-import-not-at-top
  model = harness.TransformerLM.__new__(harness.TransformerLM)
  model.encoding = requests_lib.Encoding(vocabularies.ByteTokenizer())
  model.scorer = dataclasses.make_dataclass("S", ["length", "seq2seq"])(12, False)
  handed = []

  def score(pairs):
    handed.extend(pairs)
    return scoring.Scores(np.zeros(len(pairs)), np.zeros(len(pairs), bool),
                          np.zeros(len(pairs), bool), len(pairs), 1)

  monkeypatch.setattr(model, "_score", score, raising=False)
  model.cache_hook = type("Hook", (), {"add_partial": lambda *a: None})()
  shapes = [("Line one\n", "Line two"), ("", "x"), ("Answer: ", "no")]
  model.loglikelihood([type("I", (), {"args": s})() for s in shapes])
  assert handed == [model.encoding.pair(*s) for s in shapes]
  assert handed[0][1][0] == ord("\n") + vocabularies.NUM_SPECIAL  # rstrip() moved it.
  with pytest.raises(ConfigError, match=r"^1 of 1 lm-eval requests cannot be scored whole "
                                        r"with a window of 12 tokens, the first because the "
                                        r"continuation has more tokens than the window"):
    model.loglikelihood([type("I", (), {"args": ("a", "b" * 13)})()])


# ---------------------------------------------------------------- an encoder-decoder


@pytest.fixture(scope="module")
def seq2seq_model(tfds_data_dir):
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  config = make_tiny_config(tfds_data_dir)
  config.model.update(arch="encoder_decoder", vocab_size=300)
  model_config = dataclasses.replace(ModelConfig.from_config(config.model), deterministic=True)
  model = make_model(model_config)
  ids = np.zeros((1, config.data.seq_len), np.int32)
  ones, positions = np.ones_like(ids), np.arange(ids.shape[1])[None]
  params = model.init(jax.random.PRNGKey(0), ids, ones, positions, ids, ones,
                      positions)["params"]
  return config, model, params


def _one_pair_a_row(model, params, requests, length):
  """Per request, (log p(continuation | context), greedy) from rows holding that pair
  alone (unpacked, right-padded): the context on the encoder side, [bos] + the
  continuation but its last on the decoder side; one forward for all the rows."""
  n = len(requests)
  source, decoder = np.zeros((n, length), np.int32), np.zeros((n, length), np.int32)
  for i, (context, continuation) in enumerate(requests):
    source[i, :len(context)] = context
    decoder[i, :len(continuation)] = (vocabularies.BOS_ID, *continuation[:-1])
  positions = np.broadcast_to(np.arange(length), (n, length))
  logits = model.apply({"params": params}, source, (source > 0).astype(np.int32), positions,
                       decoder, (decoder > 0).astype(np.int32), positions)
  log_p = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))
  out = []
  for i, (_, continuation) in enumerate(requests):
    targets = np.asarray(continuation)
    at = np.arange(len(targets))
    out.append((float(log_p[i, at, targets].sum()),
                bool((log_p[i, at].argmax(-1) == targets).all())))
  return out


def test_an_encoder_decoder_scores_as_a_direct_forward(seq2seq_model):
  """The context on the encoder side, the continuation as the decoder's target (lm-eval's
  seq2seq backend): each request's log-likelihood and greediness equal one unpacked
  forward, packed several pairs a row or one a row; a context longer than the row
  keeps its last tokens, counted."""
  config, model, params = seq2seq_model
  length = config.data.seq_len
  rng = np.random.default_rng(1)
  requests = [(tuple(map(int, rng.integers(4, 290, rng.integers(1, 20)))),
               tuple(map(int, rng.integers(4, 290, rng.integers(1, 6))))) for _ in range(10)]
  requests.append((tuple(range(4, 4 + length + 5)), (7, 8)))  # Left-truncated.
  packed = _scorer(config, batch_size=2)
  assert packed.seq2seq
  reference = _one_pair_a_row(model, params, [(c[-length:], x) for c, x in requests], length)
  # One compiled step for both layouts: only the rows differ.
  for scorer in (packed, dataclasses.replace(packed, packed_rows_limit=1)):
    scores = scorer.score(params, requests)
    np.testing.assert_allclose(scores.loglik, [r[0] for r in reference], atol=2e-4,
                               rtol=1e-5)
    assert list(scores.greedy) == [r[1] for r in reference]
    assert list(scores.truncated) == [False] * 10 + [True]
    assert (scores.rows == len(requests)) == (scorer is not packed)


@pytest.mark.parametrize("objective", ["span_corruption", "ul2"])
def test_an_encoder_decoder_of_any_objective_is_scored_on_its_encoder(seq2seq_model,
                                                                      objective):
  """Whatever an encoder-decoder trained on, it is benchmarked as one (its model inputs
  have an encoder side), not refused as a model that is not a decoder LM."""
  config = seq2seq_model[0].copy_and_resolve_references()
  config.model.objective = objective
  scorer = _scorer(config)  # Compiles nothing until it scores.
  assert scorer.seq2seq and not scorer.prefix


# ---------------------------------------------------------------- a prefix LM


def test_a_prefix_lm_reads_the_context_as_its_bidirectional_prefix(tiny_model):
  """A decoder trained with model.objective=prefix_lm, prefix_attention="bidirectional"
  (its objective feeds `prefix`): each request's log-likelihood
  equals one forward of that request alone with prefix_BL 1 on its context, packed
  (several a row, lettered choices of one context sharing a segment) or not; and it
  differs from the causal reading, so the prefix is really bidirectional."""
  config, model, params = tiny_model
  length = config.data.seq_len
  rng = np.random.default_rng(2)
  requests = [((vocabularies.BOS_ID, *map(int, rng.integers(4, 260, rng.integers(2, 30)))),
               tuple(map(int, rng.integers(4, 260, rng.integers(1, 5))))) for _ in range(8)]
  requests += [((vocabularies.BOS_ID, 40, 41, 42), (100 + k,)) for k in range(3)]
  requests.append(((vocabularies.BOS_ID, 40, 41), (42, 100)))  # Same input, other context.
  causal = _scorer(config)
  config = config.copy_and_resolve_references()
  config.model.update(objective="prefix_lm", prefix_attention="bidirectional")
  scorer = _scorer(config)  # The same parameters, read as a prefix LM.
  assert scorer.prefix and not causal.prefix and not scorer.seq2seq
  scores = scorer.score(params, requests)
  rows = np.zeros((len(requests), length), np.int32)
  prefix = np.zeros_like(rows)
  for i, (context, continuation) in enumerate(requests):
    full = (*context, *continuation)
    rows[i, :len(full) - 1] = full[:-1]
    prefix[i, :len(context)] = 1
  logits = model.apply({"params": params}, rows, (rows > 0).astype(np.int32),
                       np.broadcast_to(np.arange(length), rows.shape), prefix)
  log_p = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))
  reference = [sum(log_p[i, len(c) - 1 + k, t] for k, t in enumerate(x))
               for i, (c, x) in enumerate(requests)]
  np.testing.assert_allclose(scores.loglik, reference, atol=2e-4, rtol=1e-5)
  assert scores.segments == len(requests) - 2  # The three choices of one context: one.
  alone = dataclasses.replace(scorer, packed_rows_limit=1).score(params, requests)
  np.testing.assert_allclose(alone.loglik, reference, atol=2e-4, rtol=1e-5)
  assert np.abs(causal.score(params, requests).loglik - scores.loglik).max() > 1e-3


def test_the_harness_command_line_ends_a_refusal_in_one_line(monkeypatch, capsys):
  """A request the harness model cannot score whole (its ConfigError) ends lm-eval's
  command line with exit 2 and one line, no traceback."""
  pytest.importorskip("lm_eval", reason="lm-eval is not installed")
  import lm_eval.__main__  # pylint: disable=g-import-not-at-top
  from transformer.evaluation import harness  # pylint: disable=g-import-not-at-top

  def refuse():
    raise ConfigError("1 of 1 lm-eval requests cannot be scored whole")

  monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", refuse)
  monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() sets lm-eval's arguments.
  with pytest.raises(SystemExit) as exit_info:
    harness.main(["--model", "transformer"])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err == ("\nConfigError: 1 of 1 lm-eval requests cannot be "
                                     "scored whole\n")


def test_train_benchmarks_take_an_encoder_decoder(seq2seq_model):
  """train.benchmarks on an encoder-decoder passes validation, and its tasks are encoded
  as the seq2seq backend encodes them (the context ends with [eos], as its pairs do)."""
  from transformer.config.validation import validate  # pylint: disable=g-import-not-at-top
  from transformer.training import benchmark_hook  # pylint: disable=g-import-not-at-top
  config = seq2seq_model[0].copy_and_resolve_references()
  config.train.benchmarks = os.path.join(os.path.dirname(FIXTURE), "choices.jsonl")
  validate(config)
  hook = benchmark_hook.make_hook(config, vocabularies.ByteTokenizer())
  context, continuation = hook.encoded[0].requests[0]
  assert context[-1] == vocabularies.EOS_ID and vocabularies.EOS_ID not in continuation
  assert hook.encoded[0].encoding["backend"] == "seq2seq"
