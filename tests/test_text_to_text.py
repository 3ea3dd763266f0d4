"""Text-to-text objectives (span_corruption, prefix_lm, ul2): transforms, converters, rows.

The transforms against hand-computed examples (T5's span corruption of a short
sequence), the converters' rows (an encoder-decoder's two sides, a decoder's one row
with its prefix), the noise drawn per (seed, process, example), UL2's eval rows tagged
per token with their denoiser and the loss per denoiser recombining to the loss, and
every (arch, objective) pair training a few steps with the loss falling.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re

import numpy as np
import pytest

from configs import base
from transformer.config import denoisers as denoisers_lib
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.data import denoise
from transformer.data import pipeline
from transformer.data.tokenizers import sentinels
from transformer.data.tokenizers import vocabularies

BYTES = vocabularies.ByteTokenizer()
BASE = BYTES.vocab_size  # The first extra id: sentinel 99 of 100.
EOS, BOS = vocabularies.EOS_ID, vocabularies.BOS_ID
TEXT = "the quick brown fox jumps over the lazy dog "
TEXT_TO_TEXT = ("span_corruption", "prefix_lm", "ul2")
ARCHS = ("decoder", "encoder_decoder")


def test_t5_span_corruption_of_a_short_sequence_by_hand():
  """T5's noise_span_to_unique_sentinel on both sides of one mask: sentinel i (id
  base + 99 - i) replaces noise span i in the inputs and precedes it in the targets."""
  tokens = np.arange(10, 20, dtype=np.int32)  # 10 11 ... 19
  noise = np.array([0, 0, 1, 1, 0, 0, 0, 1, 0, 1], bool)
  ids = sentinels.sentinel_ids(BYTES, 100)
  s0, s1, s2 = BASE + 99, BASE + 98, BASE + 97
  assert list(ids[:3]) == [s0, s1, s2]
  np.testing.assert_array_equal(denoise.spans_to_sentinels(tokens, noise, ids),
                                [10, 11, s0, 14, 15, 16, s1, 18, s2])
  np.testing.assert_array_equal(denoise.spans_to_sentinels(tokens, ~noise, ids),
                                [s0, 12, 13, s1, 17, s2, 19])
  # T5's counts: round(10 x 0.15) = 2 noise tokens (half to even), round(2 / 3) -> 1 span.
  assert denoisers_lib.noise_counts(10, 0.15, 3.0) == (2, 1)
  assert denoisers_lib.noise_counts(100, 0.15, 3.0) == (15, 5)
  assert denoisers_lib.noise_counts(4, 0.01, 3.0) == (1, 1)  # At least one noise token.


@pytest.mark.parametrize("length,density,mean", [(10, 0.15, 3.0), (100, 0.15, 3.0),
                                                 (64, 0.5, 3.0), (200, 0.15, 32.0)])
def test_random_spans_noise_mask_has_t5s_counts_and_shape(length, density, mean):
  noise_count, spans = denoisers_lib.noise_counts(length, density, mean)
  for seed in range(5):
    mask = denoise.random_spans_noise_mask(length, density, mean,
                                           np.random.default_rng(seed))
    assert mask.shape == (length,) and int(mask.sum()) == noise_count
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    assert int(starts.sum()) == spans
    assert not mask[0] and mask[-1]  # A kept span first, a noise span last (T5's order).


def test_a_denoised_example_and_its_decoder_row_by_hand():
  rng = np.random.default_rng(0)
  tokens = np.arange(10, 20, dtype=np.int32)
  ids = sentinels.sentinel_ids(BYTES, 100)
  prefix = denoise.denoise(denoisers_lib.Denoiser("S", prefix=True, paradigm=1), tokens,
                           rng, ids, [BASE + 100, BASE + 101, BASE + 102])
  split = len(prefix["inputs"]) - 2  # [S] inputs eos
  assert prefix["inputs"][0] == BASE + 101 and 1 <= split <= 9
  np.testing.assert_array_equal(np.concatenate([prefix["inputs"][1:-1],
                                                prefix["targets"][:-1]]), tokens)
  assert prefix["inputs"][-1] == EOS and prefix["targets"][-1] == EOS
  row = denoise.decoder_example({"inputs": np.array([5, 6, EOS]),
                                 "targets": np.array([7, EOS])})
  np.testing.assert_array_equal(row["inputs"], [BOS, 5, 6, EOS, 7])
  np.testing.assert_array_equal(row["targets"], [5, 6, EOS, 7, EOS])
  np.testing.assert_array_equal(row["weights"], [0, 0, 0, 1, 1])
  np.testing.assert_array_equal(row["prefix"], [1, 1, 1, 1, 0])  # [bos] and the inputs.


def test_sentinel_text_round_trips_and_an_imported_t5_vocabulary_keeps_its_own_ids():
  ids = sentinels.encode(BYTES, "a<extra_id_0>b<extra_id_1>[X]", 100)
  assert list(ids) == [*BYTES.encode("a"), BASE + 99, *BYTES.encode("b"), BASE + 98,
                       BASE + 100 + 2]
  assert sentinels.decode(BYTES, ids, 100) == "a<extra_id_0>b<extra_id_1>[X]"

  class T5Like(vocabularies.ByteTokenizer):
    vocab_size = 400

    def piece_id(self, piece):
      return 399 - int(piece[len("<extra_id_"):-1]) if piece.startswith("<extra_id_") else None

  t5 = T5Like()
  assert sentinels.sentinel_id(t5, 0, 100) == 399 and sentinels.sentinel_id(t5, 99, 100) == 300
  assert sentinels.paradigm_id(t5, 0, 100) == 400  # Right after the vocabulary.
  assert sentinels.vocab_size_needed(t5, 100, 0) == 400
  assert sentinels.vocab_size_needed(BYTES, 100, 3) == BASE + 103

  class EightOwn(T5Like):  # A vocabulary holding only <extra_id_0> .. <extra_id_7>.

    def piece_id(self, piece):
      own = super().piece_id(piece)
      return own if own is not None and own > 391 else None

  few = EightOwn()
  ids = list(sentinels.sentinel_ids(few, 100)) + [sentinels.paradigm_id(few, i, 100)
                                                  for i in range(3)]
  assert ids[:8] == list(range(399, 391, -1)) and ids[8] == 400 + 91 and ids[99] == 400
  assert len(set(ids)) == 103  # The added sentinels and [R], [S], [X] never collide...
  assert sentinels.vocab_size_needed(few, 100, 3) == max(ids) + 1 == 495  # ... and fit.


def config_for(arch, objective, seq_len=64, **train):
  config = base.get_config()
  config.model.update(arch=arch, objective=objective, vocab_size=BASE + 128)
  config.data.update(seq_len=seq_len, tokenizer="bytes")
  config.train.update(**train)
  validate(config)
  return config


def batches(config, source, count=3, train=True, process_index=0, process_count=1):
  ds = pipeline.make_dataset(config, objective_lib.resolve(config.model), source, BYTES,
                             train=train, batch_size=2, process_index=process_index,
                             process_count=process_count)
  it = iter(ds)
  return [next(it) for _ in range(count)]


DOCUMENTS = [{"text": f"{i} " + TEXT * (1 + i % 4)} for i in range(24)]


def check_decoder_row(row: dict) -> None:
  """Per segment: [bos] first, the prefix exactly [bos] + inputs (up to the inputs' eos,
  fed where the first target is predicted), the loss exactly on the targets after it,
  no loss or prefix on padding."""
  segments = row["segment_ids"]
  assert not (row["weights"][segments == 0]).any() and not row["prefix"][segments == 0].any()
  for seg in set(segments[segments > 0].tolist()):
    where = np.flatnonzero(segments == seg)
    inputs, prefix, weights = row["inputs"][where], row["prefix"][where], row["weights"][where]
    assert inputs[0] == BOS and (np.diff(row["positions"][where]) == 1).all()
    inputs_end = int(np.flatnonzero(weights)[0])
    assert inputs[inputs_end] == EOS  # The inputs' eos.
    np.testing.assert_array_equal(prefix, np.arange(len(where)) <= inputs_end)
    np.testing.assert_array_equal(weights, np.arange(len(where)) >= inputs_end)
    np.testing.assert_array_equal(row["targets"][where][:-1], inputs[1:])


@pytest.mark.parametrize("objective", TEXT_TO_TEXT)
@pytest.mark.parametrize("arch", ARCHS)
def test_each_topology_gets_its_converted_rows(arch, objective):
  config = config_for(arch, objective)
  found_sentinel = False
  for batch in batches(config, DOCUMENTS):
    assert set(batch) == set(objective_lib.resolve(config.model).model_inputs) | {
        "targets", "weights"}
    assert int(batch["inputs"].max()) < config.model.vocab_size
    found_sentinel |= bool((batch["inputs"] >= BASE).any())
    for row in range(2):
      if arch == "decoder":
        check_decoder_row({k: v[row] for k, v in batch.items()})
      else:  # Example k: segment k + 1 on both sides; the loss on every target token.
        src, tgt = batch["inputs_segment_ids"][row], batch["targets_segment_ids"][row]
        assert set(src[src > 0].tolist()) == set(tgt[tgt > 0].tolist())
        np.testing.assert_array_equal(batch["weights"][row], tgt > 0)
  assert found_sentinel == (objective != "prefix_lm")


def test_the_prefix_is_dropped_with_causal_prefix_attention():
  config = base.get_config()
  config.model.update(objective="prefix_lm", prefix_attention="causal", vocab_size=BASE + 128)
  config.data.update(seq_len=64, tokenizer="bytes")
  validate(config)
  batch = batches(config, DOCUMENTS, count=1)[0]
  assert "prefix" not in batch and batch["weights"].sum() > 0


def test_the_noise_resumes_exactly_and_differs_between_processes():
  config = config_for("encoder_decoder", "ul2")
  ds = pipeline.make_dataset(config, objective_lib.resolve(config.model), DOCUMENTS, BYTES,
                             train=True, batch_size=2)
  first = iter(ds)
  for _ in range(3):
    next(first)
  state = json.loads(json.dumps(first.get_state()))  # As a checkpoint stores it.
  expected = [next(first) for _ in range(3)]
  resumed = iter(ds)
  resumed.set_state(state)
  for batch in expected:
    got = next(resumed)
    for key in batch:
      np.testing.assert_array_equal(got[key], batch[key])
  # Two processes whose shares hold the same text draw different noise.
  same = [{"text": TEXT * 3}] * 8
  shares = [batches(config_for("encoder_decoder", "span_corruption"), same, count=2,
                    process_index=p, process_count=2) for p in (0, 1)]
  assert any(not np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(*shares))


def test_translation_pairs_train_a_decoder_prefix_lm():
  config = config_for("decoder", "prefix_lm")
  config.data.update(source_language="en", target_language="de")
  pairs = [{"en": f"a cat {i}", "de": f"eine Katze {i}"} for i in range(8)]
  row = {k: v[0] for k, v in batches(config, pairs, count=1, train=False)[0].items()}
  check_decoder_row(row)
  first = row["segment_ids"] == 1
  text = lambda ids: BYTES.decode(ids)
  source = text(row["inputs"][first][1:][row["prefix"][first][1:] > 0])
  target = text(row["targets"][first][row["weights"][first] > 0])
  assert source.startswith("a cat ") and target.startswith("eine Katze ")
  assert source.split()[-1] == target.split()[-1]  # One pair: the same number.


class LabelledSource(list):
  """An in-memory labelled split with TFDS-like features (a ClassLabel's names)."""

  class _Label:
    names = ["negative", "positive"]

  features = {"label": _Label()}


def test_a_labelled_text_is_sentence_to_label_word_on_an_encoder_decoder():
  config = config_for("encoder_decoder", "prefix_lm")
  config.data.label_key = "label"
  source = LabelledSource([{"text": f"review {i}", "label": i % 2} for i in range(8)])
  batch = batches(config, source, count=1, train=False)[0]
  for row in range(2):
    for seg in set(batch["inputs_segment_ids"][row].tolist()) - {0}:
      text = BYTES.decode(batch["inputs"][row][batch["inputs_segment_ids"][row] == seg])
      word = BYTES.decode(batch["targets"][row][batch["targets_segment_ids"][row] == seg])
      number = int(text.split()[-1])
      assert text.startswith("review ") and word == ["negative", "positive"][number % 2]


# ------------------------------------------------------------ the loss per UL2 denoiser

@pytest.mark.parametrize("arch", ARCHS)
def test_ul2_eval_rows_tag_each_token_with_its_denoiser(arch):
  """Evaluation's rows carry each token's denoiser tag (R, S, X: 1, 2, 3), read back here
  from the paradigm token its example starts with; training's rows carry none."""
  config = config_for(arch, "ul2")
  assert denoisers_lib.TAG_FIELD not in batches(config, DOCUMENTS, count=1)[0]
  paradigms = [sentinels.paradigm_id(BYTES, i, 100) for i in range(3)]
  seen = set()
  for batch in batches(config, DOCUMENTS, count=10, train=False):
    tags = batch[denoisers_lib.TAG_FIELD]
    assert tags.dtype == np.int32 and tags.shape == batch["targets"].shape
    for row in range(2):
      # The tag's side is the targets' (an encoder-decoder's decoder side).
      segments = batch["segment_ids" if arch == "decoder" else "targets_segment_ids"][row]
      assert not tags[row][segments == 0].any()
      for seg in set(segments[segments > 0].tolist()):
        tag = set(tags[row][segments == seg].tolist())
        assert len(tag) == 1, tag  # One example, one denoiser.
        if arch == "decoder":  # [bos] [paradigm] inputs targets.
          paradigm = batch["inputs"][row][segments == seg][1]
        else:
          paradigm = batch["inputs"][row][batch["inputs_segment_ids"][row] == seg][0]
        assert tag == {paradigms.index(int(paradigm)) + 1}
        seen |= tag
  assert seen == {1, 2, 3}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_packed_row_tags_each_example_with_its_own_denoiser(arch):
  """Two short examples of different denoisers in one packed row: each token its own."""
  import grain  # pylint: disable=g-import-not-at-top
  examples = [{"inputs": np.arange(3, 3 + n, dtype=np.int32),
               "targets": np.arange(10, 10 + n, dtype=np.int32),
               denoisers_lib.TAG_FIELD: np.asarray(tag, np.int32)}
              for n, tag in ((3, 1), (4, 3))]
  rows = denoise.pack_examples(grain.MapDataset.source(examples).to_iter_dataset(), arch,
                               seq_len=32, batch_size=1, prefix=True, tagged=True)
  row = next(iter(rows))
  segments = row["segment_ids" if arch == "decoder" else "targets_segment_ids"]
  np.testing.assert_array_equal(row[denoisers_lib.TAG_FIELD],
                                np.select([segments == 1, segments == 2], [1, 3], 0))
  assert set(segments.tolist()) == {0, 1, 2}


def test_the_loss_per_denoiser_recombines_to_the_loss():
  """The sums by tag (whole logits and the chunked head alike) named R, S, X: each
  kind's token-weighted loss recombines to the loss, its tokens to the tokens, and each
  is the mean NLL of its own tokens; a kind without tokens is not reported."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from transformer.model import lm_head  # pylint: disable=g-import-not-at-top
  from transformer.training import metrics  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  head = lm_head.LogitsHead(weight=jnp.asarray(rng.normal(size=(11, 6)), jnp.float32),
                            bias_V=None, tied=True, dtype=jnp.float32, softcap=0.0)
  x = jnp.asarray(rng.normal(size=(3, 10, 6)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, (3, 10)))
  weights = np.asarray(rng.random((3, 10)) > 0.2, np.float32)
  tags = np.where(weights > 0, rng.choice([1, 3], (3, 10)), 0)  # No S: weight 0.
  whole = metrics.loss_sums(head(x), targets, jnp.asarray(weights), tags_BL=jnp.asarray(tags),
                            num_tags=4)
  chunked = metrics.objective_sums((x, head), targets, jnp.asarray(weights), chunk=4,
                                   tags_BL=jnp.asarray(tags), num_tags=4)
  for key, value in whole.items():
    np.testing.assert_allclose(chunked[key], value, rtol=1e-5)
  out = metrics.summarize(jax.device_get(metrics.name_tags(whole, ("R", "S", "X"))), "eval_")
  assert "eval_loss/S" not in out and "eval_tokens/S" not in out
  kinds = ("R", "X")
  assert sum(out[f"eval_tokens/{k}"] for k in kinds) == out["eval_tokens"]
  recombined = sum(out[f"eval_loss/{k}"] * out[f"eval_tokens/{k}"] for k in kinds)
  assert recombined / out["eval_tokens"] == pytest.approx(out["eval_loss"], rel=1e-6)
  nll = -np.take_along_axis(np.asarray(jax.nn.log_softmax(head(x))),
                            np.asarray(targets)[..., None], -1)[..., 0]
  for kind, tag in (("R", 1), ("X", 3)):
    assert out[f"eval_loss/{kind}"] == pytest.approx(nll[tags == tag].mean(), rel=1e-5)


def test_evaluate_prints_the_loss_of_each_denoiser():
  """--mode=evaluate's result lines: a ul2 model's loss per denoiser under the loss."""
  import types  # pylint: disable=g-import-not-at-top
  from transformer.cli import evaluate as evaluate_mode  # pylint: disable=g-import-not-at-top
  record = {"dataset": "d", "split": "validation", "examples": 3, "workdir": "/w",
            "metrics": {"loss": 2.0, "tokens": 90.0, "loss/X": 1.5, "tokens/X": 60.0,
                        "loss/R": 3.0, "tokens/R": 30.0}}
  out = io.StringIO()
  evaluate_mode._print_result(  # pylint: disable=protected-access
      record, types.SimpleNamespace(checkpoint_label=lambda: "step 4"), "/w/e.json", out)
  assert "  tokens     90\n  loss R     3 (30 tokens)\n  loss X     1.5 (60 tokens)\n" in (
      out.getvalue())


@pytest.mark.parametrize("overrides,key,says", [
    (dict(noise_density=1.0), "train.noise_density", "in (0, 1)"),
    (dict(mean_noise_span_length=0.5), "train.mean_noise_span_length", ">= 1"),
    (dict(ul2_weights=(0.0, 0.0, 0.0)), "train.ul2_weights", "not all 0"),
    (dict(num_sentinels=2), "train.num_sentinels", "raise it to at least"),
])
def test_bad_denoising_keys_are_one_line(overrides, key, says):
  with pytest.raises(ConfigError) as error:
    config_for("encoder_decoder", "ul2", seq_len=128, **overrides)
  message = str(error.value)
  assert message.startswith(f"config.{key}=") and says in message and "\n" not in message


# ------------------------------------------------------------ training on each topology

def tiny_text_to_text(tiny_config, arch, objective, steps):
  tiny_config.model.update(arch=arch, objective=objective, vocab_size=0)
  tiny_config.optimizer.update(warmup_steps=2, learning_rate=3e-3)
  tiny_config.train.update(num_steps=steps, eval_every=steps, eval_batches=2,
                           eval_at_start=True)
  tiny_config.checkpoint.update(every=steps)
  return tiny_config


def metric_rows(workdir, key):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [(row["step"], row[key]) for row in map(json.loads, f) if key in row]


@pytest.mark.parametrize("arch,objective", [
    # ul2 in the default run: its R and X are span corruption, its S a prefix LM.
    ("encoder_decoder", "ul2"),
    pytest.param("encoder_decoder", "prefix_lm", marks=pytest.mark.slow),
    pytest.param("decoder", "prefix_lm", marks=pytest.mark.slow),
    pytest.param("decoder", "ul2", marks=pytest.mark.slow),
])
def test_each_topology_learns_each_objective(tiny_config, tmp_path, arch, objective):
  """The eval loss falls; a ul2 run's evaluations also report each denoiser's loss and
  tokens, which recombine (token-weighted) to the eval loss and its tokens."""
  from transformer.training import loop  # pylint: disable=g-import-not-at-top
  config = tiny_text_to_text(tiny_config, arch, objective, steps=12)
  loop.train_and_evaluate(config, str(tmp_path / "run"))
  (_, first), (_, last) = metric_rows(str(tmp_path / "run"), "eval_loss")
  assert last < first - 0.5, (first, last)
  with open(os.path.join(tmp_path, "run", "metrics.jsonl"), encoding="utf-8") as f:
    evaluations = [row for row in map(json.loads, f) if "eval_loss" in row]
  for row in evaluations:
    kinds = [k for k in ("R", "S", "X") if f"eval_loss/{k}" in row]
    assert kinds == (["R", "S", "X"] if objective == "ul2" else []), row
    if kinds:
      tokens = [row[f"eval_tokens/{k}"] for k in kinds]
      assert sum(tokens) == row["eval_tokens"] and min(tokens) > 0
      assert sum(row[f"eval_loss/{k}"] * row[f"eval_tokens/{k}"] for k in kinds) == (
          pytest.approx(row["eval_loss"] * row["eval_tokens"], rel=1e-5))


@pytest.mark.slow
def test_an_encoder_decoder_learns_span_corruption_and_answers_the_sample_prompt(
    tiny_config, tmp_path, caplog):
  """train.sample_prompt on an encoder-decoder text-to-text run: the prompt on the
  encoder side, the answer decoded greedily and logged at each evaluation."""
  from transformer.training import loop  # pylint: disable=g-import-not-at-top
  config = tiny_text_to_text(tiny_config, "encoder_decoder", "span_corruption", steps=12)
  config.train.sample_prompt = "the quick <extra_id_0> fox"
  config.decode.max_length_offset = 8
  with caplog.at_level("INFO"):
    loop.train_and_evaluate(config, str(tmp_path / "run"))
  (_, first), (_, last) = metric_rows(str(tmp_path / "run"), "eval_loss")
  assert last < first - 0.5, (first, last)
  samples = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sample at")]
  assert len(samples) == 1 and "'the quick <extra_id_0> fox' -> " in samples[0], samples


def test_a_decoder_learns_span_corruption_and_resumes_exactly(tiny_config, tmp_path):
  """6 steps straight == 3 steps, then the same command to 6: the same losses bit for
  bit (the noise is the data iterator's, restored from the checkpoint)."""
  from transformer.training import loop  # pylint: disable=g-import-not-at-top
  config = tiny_text_to_text(tiny_config, "decoder", "span_corruption", steps=6)
  config.train.update(eval_every=3)
  config.checkpoint.update(every=3)
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  loop.train_and_evaluate(config, straight)
  config.train.num_steps = 3
  loop.train_and_evaluate(config, resumed)
  config.train.num_steps = 6
  loop.train_and_evaluate(config, resumed)
  assert metric_rows(straight, "loss") == metric_rows(resumed, "loss")
  evals = metric_rows(straight, "eval_loss")
  assert evals[-1][1] < evals[0][1] - 0.5, evals


def test_the_objectives_example_prints_what_the_page_shows():
  """docs/objectives.md's snippet, run as written: its output is the text block after it."""
  import doc_commands  # pylint: disable=g-import-not-at-top
  snippet = [s for s in doc_commands.extract("docs/objectives.md")[1]][0]
  with open(os.path.join(doc_commands.ROOT, "docs", "objectives.md"), encoding="utf-8") as f:
    page = f.read()
  shown = re.search(r"```text\n(.*?)```", page[page.index(snippet.code):], re.S).group(1)
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(compile(snippet.code, snippet.where, "exec"), {"__name__": "docs_snippet"})  # pylint: disable=exec-used
  assert printed.getvalue() == shown
