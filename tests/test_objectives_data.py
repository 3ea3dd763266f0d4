"""Masked-LM and sequence-to-sequence pipelines, the mask token, continuation pairs.

In-memory list sources only; the autouse `no_network` fixture from test_data makes
any socket use fail loudly.
"""

from __future__ import annotations

import collections
import inspect
import io
import json
import string
import textwrap

import numpy as np
import pytest
import sentencepiece as spm

from configs import base
from test_data import _code_lines, assert_batches_equal, no_network, spm_tokenizer, take  # pylint: disable=unused-import
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.data import classification
from transformer.data import lm as lm_data
from transformer.data import pipeline
from transformer.data import seq2seq
from transformer.data.tokenizers import vocabularies

BYTES = vocabularies.ByteTokenizer()
SEQ_LEN, BATCH = 32, 4
SPECIALS = (vocabularies.PAD_ID, vocabularies.EOS_ID, vocabularies.BOS_ID, vocabularies.UNK_ID)
TEXTS = ["", "hello world", "naïve café ☕ 日本語 🙂", "def f(x):\n\treturn x\n"] + [
    f"doc {i}: " + "xy" * (i * 3 % 11) for i in range(20)]
MLM_KEYS = ("inputs", "targets", "segment_ids", "positions", "weights")
SEQ2SEQ_KEYS = ("inputs", "inputs_segment_ids", "inputs_positions", "targets",
                "decoder_inputs", "targets_segment_ids", "targets_positions", "weights")


def source(texts):
  return [{"text": t} for t in texts]


def mlm_dataset(texts=TEXTS, tokenizer=BYTES, **overrides):
  kwargs = dict(text_key="text", vocab_size=tokenizer.vocab_size, seq_len=SEQ_LEN,
                batch_size=BATCH, seed=0, train=False)
  kwargs.update(overrides)
  return lm_data.make_mlm_dataset(source(texts), tokenizer, **kwargs)


def check_dtypes_and_shapes(batch, keys, lengths):
  assert set(batch) == set(keys)
  rows = batch["inputs"].shape[0]
  for k in keys:
    assert batch[k].shape == (rows, lengths[k]), k
    assert batch[k].dtype == (np.float32 if k == "weights" else np.int32), k


# ---------------------------------------------------------------- the mask token


def test_byte_tokenizer_mask_id():
  assert BYTES.vocab_size == 261 and BYTES.mask_id == 260
  assert BYTES.mask_id not in BYTES.encode(bytes(range(256)).decode("latin-1"))
  assert BYTES.decode([*BYTES.encode("ok"), BYTES.mask_id, vocabularies.EOS_ID]) == "ok"


def test_sentencepiece_mask_id(spm_tokenizer):
  assert spm_tokenizer.mask_id == 4 and spm_tokenizer.vocab_size == 400
  sp = spm_tokenizer._sp
  assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == SPECIALS == (0, 1, 2, 3)
  assert (sp.piece_to_id("\n"), sp.piece_to_id("\t")) == (5, 6)
  # The mask is a control symbol: the literal text "<mask>" is ordinary pieces.
  text = "tokens = ['<mask>', '<s>']\n"
  ids = spm_tokenizer.encode(text)
  assert spm_tokenizer.mask_id not in ids and vocabularies.BOS_ID not in ids
  assert spm_tokenizer.decode(ids) == text


def test_sentencepiece_tokenizer_requires_the_mask(tmp_path):
  model = io.BytesIO()  # The project's special ids, but trained without "<mask>".
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(_code_lines(500)), model_writer=model, vocab_size=120,
      pad_id=0, eos_id=1, bos_id=2, unk_id=3, minloglevel=2)
  path = tmp_path / "no_mask.model"
  path.write_bytes(model.getvalue())
  with pytest.raises(ValueError, match="<mask>"):
    vocabularies.SentencePieceTokenizer(str(path))


# ---------------------------------------------------------------- masked LM


def test_mlm_batches_are_well_formed():
  batches = list(mlm_dataset())
  assert len(batches) > 2
  for batch in batches:
    check_dtypes_and_shapes(batch, MLM_KEYS, dict.fromkeys(MLM_KEYS, SEQ_LEN))
    inputs, targets, w = batch["inputs"], batch["targets"], batch["weights"]
    assert inputs.min() >= 0 and inputs.max() < BYTES.vocab_size
    np.testing.assert_array_equal(w, w.astype(bool))
    # Only chosen positions may differ, and specials and padding are never chosen.
    np.testing.assert_array_equal(inputs[w == 0], targets[w == 0])
    assert np.all(targets[w == 1] >= vocabularies.NUM_SPECIAL)
    assert np.all(batch["segment_ids"][w == 1] > 0)
    assert BYTES.mask_id not in targets
  # The targets are the causal-LM stream, repacked into rows of seq_len (no +1 shift).
  lm = list(lm_data.make_lm_dataset(source(TEXTS), BYTES, text_key="text",
                                     vocab_size=BYTES.vocab_size, seq_len=SEQ_LEN,
                                     batch_size=BATCH, seed=0, train=False))
  lm_stream = np.concatenate([np.concatenate([b["inputs"], b["targets"][:, -1:]], 1).ravel()
                              for b in lm])
  mlm_stream = np.concatenate([b["targets"].ravel() for b in batches])
  np.testing.assert_array_equal(np.trim_zeros(mlm_stream, "b"), np.trim_zeros(lm_stream, "b"))
  segments = np.concatenate([b["segment_ids"] for b in batches])
  positions = np.concatenate([b["positions"] for b in batches])
  targets = np.concatenate([b["targets"] for b in batches])
  np.testing.assert_array_equal(segments == 0, targets == vocabularies.PAD_ID)
  assert np.all(positions[targets == vocabularies.BOS_ID] == 0)


@pytest.mark.parametrize("mask_rate", [0.15, 0.3])
def test_mlm_mask_statistics(mask_rate):
  rng = np.random.default_rng(0)
  texts = ["".join(rng.choice(list(string.printable[:94]), size=n))
           for n in rng.integers(20, 200, size=200)]
  batches = take(iter(mlm_dataset(texts, seq_len=64, batch_size=8, train=True,
                                  mask_rate=mask_rate)), 50)
  inputs, targets, weights, segments = (np.concatenate([b[k] for b in batches])
                                        for k in ("inputs", "targets", "weights", "segment_ids"))
  eligible = (segments > 0) & (targets >= vocabularies.NUM_SPECIAL)
  chosen = weights == 1
  assert eligible.sum() > 20_000
  assert mask_rate - 0.03 < chosen.sum() / eligible.sum() < mask_rate + 0.03
  masked = chosen & (inputs == BYTES.mask_id)
  replaced = chosen & (inputs != BYTES.mask_id) & (inputs != targets)
  assert 0.75 < masked.sum() / chosen.sum() < 0.85
  # 10% random ids (1 in 256 of them happens to be the original) and 10% unchanged.
  assert 0.07 < replaced.sum() / chosen.sum() < 0.13
  random_ids = inputs[replaced]
  assert random_ids.min() >= vocabularies.NUM_SPECIAL and random_ids.max() < BYTES.mask_id
  assert len(np.unique(random_ids)) > 100  # Drawn from the whole vocabulary.
  assert BYTES.mask_id not in inputs[~chosen]


def test_mlm_masks_are_seeded():
  first = take(iter(mlm_dataset(train=True, seed=3)), 6)
  assert_batches_equal(first, take(iter(mlm_dataset(train=True, seed=3)), 6))
  other = take(iter(mlm_dataset(train=True, seed=4)), 6)
  assert any(not np.array_equal(a["weights"], b["weights"]) for a, b in zip(first, other))
  # Evaluation draws the same masks every time.
  assert_batches_equal(list(mlm_dataset()), list(mlm_dataset()))


def test_mlm_processes_draw_different_masks():
  texts = ["the same document, word for word"] * 8
  masks = [np.concatenate([b["weights"] for b in mlm_dataset(
      texts, process_index=i, process_count=2, mask_rate=0.5)]) for i in range(2)]
  assert masks[0].shape == masks[1].shape
  assert not np.array_equal(masks[0], masks[1])


@pytest.mark.parametrize("k", [1, 4])
def test_mlm_iterator_state_resumes_exactly(k):
  iterator = iter(mlm_dataset(train=True, seed=5))
  take(iterator, k)
  state = json.loads(json.dumps(iterator.get_state()))  # As stored in a checkpoint.
  expected = take(iterator, 5)
  resumed = iter(mlm_dataset(train=True, seed=5))
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 5), expected)


def test_mlm_with_sentencepiece(spm_tokenizer):
  texts = [inspect.getsource(f) for f in (textwrap.dedent, textwrap.indent, json.dumps)]
  batches = list(mlm_dataset(texts, spm_tokenizer, seq_len=64, mask_rate=0.3))
  inputs = np.concatenate([b["inputs"] for b in batches])
  targets = np.concatenate([b["targets"] for b in batches])
  assert inputs.max() < spm_tokenizer.vocab_size
  assert spm_tokenizer.mask_id in inputs and spm_tokenizer.mask_id not in targets


def test_mlm_mask_outside_model_vocabulary_raises():
  with pytest.raises(ValueError, match=r"mask id 260 is outside \[4, 260\)"):
    mlm_dataset(vocab_size=260)


# ---------------------------------------------------------------- sequence to sequence


def numbered_pairs(example):
  """One example "name:n" -> n pairs (zero for n = 0)."""
  name, n = example["text"].split(":")
  return [(f"{name} source {i} " + "s" * (12 * i), f"{name} → target {i} " + "t" * (20 * i))
          for i in range(int(n))]


PAIR_TEXTS = [f"{chr(ord('A') + i)}:{i % 4}" for i in range(24)]
SOURCE_LEN, TARGET_LEN = 40, 48


def seq2seq_dataset(texts=PAIR_TEXTS, tokenizer=BYTES, inputs_fn=numbered_pairs, **overrides):
  kwargs = dict(inputs_fn=inputs_fn, vocab_size=tokenizer.vocab_size, source_len=SOURCE_LEN,
                target_len=TARGET_LEN, batch_size=BATCH, seed=0, train=False)
  kwargs.update(overrides)
  return seq2seq.make_seq2seq_dataset(source(texts), tokenizer, **kwargs)


def unpack_pairs(batches, tokenizer=BYTES):
  """Every packed (source ids, target ids) pair, by matching segment ids in each row."""
  pairs = []
  for batch in batches:
    for r in range(batch["inputs"].shape[0]):
      for s in np.unique(batch["targets_segment_ids"][r]):
        if s > 0:
          pairs.append((tuple(batch["inputs"][r][batch["inputs_segment_ids"][r] == s]),
                        tuple(batch["targets"][r][batch["targets_segment_ids"][r] == s])))
  return pairs


def expected_pairs(texts, inputs_fn, tokenizer=BYTES):
  def encode(text, length):
    return tuple(np.append(tokenizer.encode(text), vocabularies.EOS_ID)[:length].tolist())
  return [(encode(s, SOURCE_LEN), encode(t, TARGET_LEN))
          for text in texts for s, t in inputs_fn({"text": text})]


def test_seq2seq_batches_are_well_formed():
  batches = list(seq2seq_dataset())
  lengths = {k: SOURCE_LEN if k.startswith("inputs") else TARGET_LEN for k in SEQ2SEQ_KEYS}
  saw_several_pairs = False
  for batch in batches:
    check_dtypes_and_shapes(batch, SEQ2SEQ_KEYS, lengths)
    targets, decoder_inputs = batch["targets"], batch["decoder_inputs"]
    for side in ("inputs", "targets"):
      seg, pos = batch[f"{side}_segment_ids"], batch[f"{side}_positions"]
      np.testing.assert_array_equal(seg == 0, batch[side] == vocabularies.PAD_ID)
      assert np.all(pos[seg == 0] == 0)
    seg, pos = batch["targets_segment_ids"], batch["targets_positions"]
    np.testing.assert_array_equal(batch["weights"], (seg > 0).astype(np.float32))
    for r in range(targets.shape[0]):
      # Pair k of a row is segment k + 1 on both sides: cross-attention masks per pair.
      source_segments = set(np.unique(batch["inputs_segment_ids"][r])) - {0}
      target_segments = set(np.unique(seg[r])) - {0}
      assert source_segments == target_segments == set(range(1, len(target_segments) + 1))
      saw_several_pairs |= len(target_segments) > 1
      for t in range(TARGET_LEN):
        if seg[r, t] == 0:
          assert decoder_inputs[r, t] == vocabularies.PAD_ID
        elif t == 0 or seg[r, t] != seg[r, t - 1]:
          assert pos[r, t] == 0 and decoder_inputs[r, t] == vocabularies.BOS_ID, (r, t)
        else:  # Teacher forcing within a pair: the previous target.
          assert pos[r, t] == pos[r, t - 1] + 1 and decoder_inputs[r, t] == targets[r, t - 1]
  assert saw_several_pairs  # Packing put several pairs in a row, so the checks bit.


def test_seq2seq_pairs_come_back_whole_and_aligned():
  pairs = unpack_pairs(seq2seq_dataset())
  expected = expected_pairs(PAIR_TEXTS, numbered_pairs)
  assert collections.Counter(pairs) == collections.Counter(expected)
  assert any(len(s) == SOURCE_LEN or len(t) == TARGET_LEN for s, t in expected)  # Truncated.
  for source_ids, target_ids in pairs:
    source_text, target_text = BYTES.decode(source_ids), BYTES.decode(target_ids)
    name = source_text.split(" ")[0]
    assert target_text.startswith(f"{name} → target {source_text.split(' ')[2]} ")


def test_seq2seq_training_is_seeded_and_resumes_exactly():
  first = take(iter(seq2seq_dataset(train=True, seed=3)), 6)
  assert_batches_equal(first, take(iter(seq2seq_dataset(train=True, seed=3)), 6))
  assert all(b["inputs"].shape[0] == BATCH for b in first)
  iterator = iter(seq2seq_dataset(train=True, seed=3))
  take(iterator, 3)
  state = json.loads(json.dumps(iterator.get_state()))
  expected = take(iterator, 5)
  resumed = iter(seq2seq_dataset(train=True, seed=3))
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 5), expected)


def test_seq2seq_processes_read_disjoint_examples_covering_all():
  seen = []
  for index in range(2):
    pairs = unpack_pairs(seq2seq_dataset(process_index=index, process_count=2))
    seen.append({BYTES.decode(s).split(" ")[0] for s, _ in pairs})
  assert not seen[0] & seen[1]
  names_with_pairs = {t.split(":")[0] for t in PAIR_TEXTS if not t.endswith(":0")}
  assert seen[0] | seen[1] == names_with_pairs


def test_seq2seq_out_of_vocabulary_id_raises():
  with pytest.raises(ValueError, match=r"token id \d+ .*\[0, 100\)"):
    next(iter(seq2seq_dataset(vocab_size=100)))


def test_seq2seq_continuation_pairs_with_sentencepiece(spm_tokenizer):
  texts = [inspect.getsource(m) for m in (textwrap, string)]
  inputs_fn = seq2seq.continuation_pairs("text", source_chars=60, target_chars=50)
  batches = list(seq2seq_dataset(texts, spm_tokenizer, inputs_fn=inputs_fn, batch_size=8))
  pairs = unpack_pairs(batches, spm_tokenizer)
  assert collections.Counter(pairs) == collections.Counter(
      expected_pairs(texts, inputs_fn, spm_tokenizer))
  text_pairs = {pair for text in texts for pair in inputs_fn({"text": text})}
  whole = 0
  for source_ids, target_ids in pairs:
    if source_ids[-1] == target_ids[-1] == vocabularies.EOS_ID:  # Not truncated.
      whole += 1
      assert (spm_tokenizer.decode(source_ids), spm_tokenizer.decode(target_ids)) in text_pairs
  assert whole > len(pairs) // 2


# ---------------------------------------------------------------- continuation pairs


def test_continuation_pairs_are_consecutive_blocks_of_whole_lines():
  lines = [f"line {i}: " + "x" * (i * 7 % 23) + "\n" for i in range(60)]
  text = "".join(lines)
  inputs_fn = seq2seq.continuation_pairs("text", source_chars=70, target_chars=40)
  pairs = inputs_fn({"text": text})
  assert len(pairs) > 5
  assert pairs == inputs_fn({"text": text.encode("utf-8")})  # TFDS bytes; deterministic.
  blocks = [block for pair in pairs for block in pair]
  covered = "".join(blocks)
  # Together the blocks are the document from its start, in order; only a tail of at
  # most one source block (with no target to follow) is left over.
  assert text.startswith(covered) and len(text) - len(covered) <= 70
  for source_text, target_text in pairs:
    assert source_text.endswith("\n") and target_text.endswith("\n")  # Whole lines.
    assert len(source_text) <= 70 and len(target_text) <= 40
  # A line longer than the budget is a block on its own rather than lost.
  long_line = "y" * 100 + "\n"
  assert inputs_fn({"text": "a\n" + long_line + "b\n"}) == [("a\n", long_line)]


def test_continuation_pairs_skip_whitespace_only_blocks():
  inputs_fn = seq2seq.continuation_pairs("text", source_chars=10, target_chars=10)
  assert inputs_fn({"text": ""}) == []
  assert inputs_fn({"text": "only a source\n"}) == []
  text = "a = 1\n" + "\n" * 10 + "b = 2\n" + "c = 3\n" + "d = 4\n"
  # Blocks: "a = 1\n\n\n\n\n", "\n" * 6 (blank: skipped with its source), "b = 2\n", "c = 3\n",
  # then "d = 4\n" with no target.
  assert inputs_fn({"text": text}) == [("b = 2\n", "c = 3\n")]


# ---------------------------------------------------------------- classification


def test_classification_rows_hold_one_example_and_its_label():
  examples = [{"text": t, "label": i % 3} for i, t in enumerate(TEXTS)]
  ds = classification.make_classification_dataset(
      examples, BYTES, text_key="text", label_key="label", num_classes=3,
      vocab_size=BYTES.vocab_size, seq_len=SEQ_LEN, batch_size=BATCH, seed=0, train=False)
  batches = list(ds)
  labels = np.concatenate([b["label"] for b in batches])
  assert sorted(labels.tolist()) == sorted(i % 3 for i in range(len(TEXTS)))
  for batch in batches:
    assert batch["label"].shape == batch["weights"].shape == (batch["inputs"].shape[0],)
    for row, seg, pos in zip(batch["inputs"], batch["segment_ids"], batch["positions"]):
      n = int(seg.sum())
      assert set(seg.tolist()) <= {0, 1} and (seg[:n] == 1).all()  # One segment, then padding.
      assert row[0] == vocabularies.BOS_ID and (row[n:] == 0).all()
      assert (pos[:n] == np.arange(n)).all()
  # Each row decodes back to (a prefix of) one of the texts.
  # Each row decodes back to its own text (a prefix where truncated): the texts and the
  # rows pair up one to one, so an empty or foreign row fails.
  decoded = sorted(BYTES.decode(r[1:]) for b in batches for r in b["inputs"])
  assert len(decoded) == len(TEXTS)
  unmatched = list(TEXTS)
  for d in sorted(decoded, key=len, reverse=True):  # Longest first: "" matches anything.
    candidates = [t for t in unmatched if t == d] or [
        t for t in unmatched if t.startswith(d) and len(t.encode()) >= SEQ_LEN - 2]
    assert candidates, (d, unmatched)
    unmatched.remove(candidates[0])


def test_classification_label_out_of_range_is_named():
  ds = classification.make_classification_dataset(
      [{"text": "a", "label": 5}], BYTES, text_key="text", label_key="label", num_classes=2,
      vocab_size=BYTES.vocab_size, seq_len=8, batch_size=1, seed=0, train=False)
  with pytest.raises(ValueError, match=r"label 5 is outside \[0, model.num_classes=2\)"):
    next(iter(ds))


@pytest.mark.parametrize("arch,head,keys", [
    ("decoder", "lm", {"inputs", "targets", "segment_ids", "positions", "weights"}),
    ("encoder", "mlm", set(MLM_KEYS)),
    ("encoder_decoder", "lm", set(SEQ2SEQ_KEYS)),
    ("encoder", "classification", {"inputs", "segment_ids", "positions", "label", "weights"}),
])
def test_make_dataset_picks_the_objective_pipeline(arch, head, keys):
  from configs import base  # pylint: disable=g-import-not-at-top
  from transformer.config.model import objective_of  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.model.update(arch=arch, head=head, pooling="cls")
  config.data.update(seq_len=SEQ_LEN, label_key="label", continuation_chars=20)
  examples = [{"text": "line one\nline two\nline three\nline four\n", "label": 1}] * 8
  ds = pipeline.make_dataset(config, objective_of(arch, head), examples, BYTES, train=False,
                             batch_size=2)
  batch = next(iter(ds))
  assert set(batch) == keys


# ---------------------------------------------------------------- random LM windows


def random_windows_dataset(texts=TEXTS, seed=0, **overrides):
  kwargs = dict(text_key="text", vocab_size=BYTES.vocab_size, seq_len=SEQ_LEN,
                batch_size=BATCH, seed=seed, train=True, windows="random")
  kwargs.update(overrides)
  return lm_data.make_lm_dataset(source(texts), BYTES, **kwargs)


def test_random_windows_are_slices_of_the_document_stream():
  stream = np.concatenate([[vocabularies.BOS_ID, *BYTES.encode(t), vocabularies.EOS_ID]
                           for t in TEXTS])
  starts = set()
  for batch in take(iter(random_windows_dataset()), 25):
    check_dtypes_and_shapes(batch, ("inputs", "targets", "segment_ids", "positions",
                                    "weights"), collections.defaultdict(lambda: SEQ_LEN))
    for inputs, targets, segments, positions in zip(
        batch["inputs"], batch["targets"], batch["segment_ids"], batch["positions"]):
      row = np.concatenate([inputs, targets[-1:]])
      np.testing.assert_array_equal(targets[:-1], inputs[1:])
      matches = [s for s in range(len(stream) - SEQ_LEN) if
                 np.array_equal(stream[s:s + SEQ_LEN + 1], row)]
      assert matches, row
      starts.add(matches[0])
      # Documents keep their boundaries: positions restart where the segment changes.
      assert segments[0] == 1 and positions[0] == 0
      new = np.concatenate([[False], segments[1:] != segments[:-1]])
      assert (positions[new] == 0).all() and (np.diff(segments) >= 0).all()
      assert (positions[~new][1:] == positions[:-1][~new[1:]] + 1).all()
  assert len(starts) > 50  # Offsets are drawn, not a fixed grid.


def test_random_windows_weights_skip_document_boundaries():
  batch = take(iter(random_windows_dataset()), 1)[0]
  # A target counts only when it continues the input's document (never across an
  # [eos] -> [bos] boundary inside a window).
  for inputs, targets, weights in zip(batch["inputs"], batch["targets"], batch["weights"]):
    crossing = (inputs == vocabularies.EOS_ID) & (targets == vocabularies.BOS_ID)
    assert not weights[crossing].any()


def test_random_windows_are_seeded_and_resume_exactly():
  first = take(iter(random_windows_dataset(seed=3)), 4)
  assert_batches_equal(take(iter(random_windows_dataset(seed=3)), 4), first)
  assert not np.array_equal(take(iter(random_windows_dataset(seed=4)), 1)[0]["inputs"],
                            first[0]["inputs"])
  iterator = iter(random_windows_dataset(seed=3))
  take(iterator, 2)
  state = json.loads(json.dumps(iterator.get_state()))
  expected = take(iterator, 3)
  resumed = iter(random_windows_dataset(seed=3))
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 3), expected)


def pieces(text, size):
  """`text` cut into `size`-character examples flagged as one document (local_text's)."""
  cuts = [text[i:i + size] for i in range(0, len(text), size)]
  return [{"text": c, "starts_document": i == 0, "ends_document": i == len(cuts) - 1}
          for i, c in enumerate(cuts)]


def test_a_document_in_pieces_gets_one_bos_and_one_eos():
  text = "".join(f"line {i} of the only document\n" for i in range(40))
  examples = pieces(text, 100) + [{"text": "a whole one"}]
  tokenize = lm_data.Tokenize(BYTES, "text", BYTES.vocab_size)
  stream = np.concatenate([tokenize.map(e)["tokens"] for e in examples])
  np.testing.assert_array_equal(stream, np.concatenate([
      [vocabularies.BOS_ID], BYTES.encode(text), [vocabularies.EOS_ID],
      [vocabularies.BOS_ID], BYTES.encode("a whole one"), [vocabularies.EOS_ID]]))
  # Packed rows (evaluation) hold no [bos] / [eos] at the cuts either.
  batches = list(lm_data.make_lm_dataset(examples, BYTES, text_key="text",
                                          vocab_size=BYTES.vocab_size, seq_len=SEQ_LEN,
                                          batch_size=BATCH, seed=0, train=False))
  inputs = np.concatenate([b["inputs"] for b in batches])
  assert (inputs == vocabularies.BOS_ID).sum() == 2
  assert (np.concatenate([b["targets"] for b in batches]) == vocabularies.EOS_ID).sum() == 2


def test_random_windows_run_across_the_pieces_of_one_document():
  text = "".join(f"line {i} of the only document\n" for i in range(40))
  batches = take(iter(lm_data.make_lm_dataset(
      pieces(text, 50), BYTES, text_key="text", vocab_size=BYTES.vocab_size,
      seq_len=SEQ_LEN, batch_size=BATCH, seed=0, train=True, windows="random")), 25)
  full = np.concatenate([[vocabularies.BOS_ID], BYTES.encode(text), [vocabularies.EOS_ID]])
  for batch in batches:
    for inputs, targets, segments, positions, weights in zip(
        batch["inputs"], batch["targets"], batch["segment_ids"], batch["positions"],
        batch["weights"]):
      row = np.concatenate([inputs, targets[-1:]])
      assert any(np.array_equal(full[s:s + SEQ_LEN + 1], row)
                 for s in range(len(full) - SEQ_LEN))
      # One document: one segment, positions from the window start, every target counts.
      assert (segments == 1).all() and (weights == 1).all()
      np.testing.assert_array_equal(positions, np.arange(SEQ_LEN))


def test_random_windows_keep_pieces_apart_when_processes_share_a_document():
  # With 2 processes each reads every other piece: its pieces are not neighbours in
  # the text, so a window must not run across them as if they were.
  text = "".join(f"line {i} of the only document\n" for i in range(40))
  examples = pieces(text, 50)
  mine = examples[1::2]  # Process 1 of 2.
  stream = [BYTES.encode(e["text"]) for e in mine]
  batches = take(iter(lm_data.make_lm_dataset(
      examples, BYTES, text_key="text", vocab_size=BYTES.vocab_size, seq_len=SEQ_LEN,
      batch_size=BATCH, seed=0, train=True, windows="random", process_index=1,
      process_count=2)), 25)
  joined = np.concatenate(stream)
  piece_of = np.concatenate([np.full(len(p), i) for i, p in enumerate(stream)])
  crossings = 0
  for batch in batches:
    for inputs, targets, segments, weights in zip(
        batch["inputs"], batch["targets"], batch["segment_ids"], batch["weights"]):
      row = np.concatenate([inputs, targets[-1:]])
      start = next(s for s in range(len(joined) - SEQ_LEN)
                   if np.array_equal(joined[s:s + SEQ_LEN + 1], row))
      pieces_in_row = piece_of[start:start + SEQ_LEN + 1]
      # A new segment exactly where the next piece begins; no target across it.
      np.testing.assert_array_equal(np.diff(segments) != 0,
                                    np.diff(pieces_in_row[:-1]) != 0)
      np.testing.assert_array_equal(weights == 0, np.diff(pieces_in_row) != 0)
      crossings += int((np.diff(pieces_in_row) != 0).any())
  assert crossings > 0  # Some windows did span a cut.


def test_random_windows_need_a_row_of_tokens():
  with pytest.raises(ValueError, match="fewer than one row of 33; lower data.seq_len"):
    next(iter(random_windows_dataset(texts=["short"])))


@pytest.mark.parametrize("overrides, message", [
    (dict(shuffle_rows=16), r"config.data.shuffle_rows=16 is invalid: random LM windows"),
    (dict(lm_windows="uniform"), r"config.data.lm_windows='uniform' is invalid: valid "
     r"values are 'packed', 'random'"),
])
def test_random_windows_config_errors(overrides, message):
  config = base.get_config()
  config.data.update(dict(dict(lm_windows="random"), **overrides))
  with pytest.raises(ConfigError, match=message):
    validate(config)


def test_random_windows_only_for_causal_lm():
  config = base.get_config()
  config.model.update(arch="encoder", head="mlm")
  config.data.lm_windows = "random"
  with pytest.raises(ConfigError, match=r"data.lm_windows='random' is invalid: random "
                     r"windows are a causal-LM sampling"):
    validate(config)
