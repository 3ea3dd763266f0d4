"""The long-context evaluations: perplexity by position (--mode=evaluate --by_position),
passkey retrieval (--mode=passkey), and the model fields a reading mode may change.

One tiny character-level LM with RoPE is trained for the module (4 steps at 32 tokens),
so that it can be read at 64 tokens and with linear RoPE scaling.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from test_datasets import tiny, write_local_files
from transformer.cli import evaluate as evaluate_mode
from transformer.cli import passkey as passkey_mode
from transformer.cli import usage
from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies
from transformer.inference import loaded
from transformer.inference import passkey
from transformer.model import lm_head
from transformer.training import loop
from transformer.training import metrics as metrics_lib
from transformer.workdir import progress
from tiny import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHABET = "acdehmnorst"  # Letters of the test corpus (its char vocabulary has no digits).


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("long_context")
  paths = write_local_files(root)
  config = tiny(base.get_config(), str(root / "tfds"), name="local_text",
                path=paths["local_text"], tokenizer="char")
  config.model.position = "rope"
  config.train.eval_batches = -1
  workdir = str(root / "lm")
  loop.train_and_evaluate(config, workdir)
  return workdir


def _at_length(workdir: str, seq_len: int):
  """A --config for `workdir` whose data.* is the run's but with another seq_len."""
  config = loaded.load_config(workdir)
  config.data.seq_len = seq_len
  return config


# ---------------------------------------------------------------- perplexity by position


def test_sums_by_position_add_up_to_the_loss_sums():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(3, 10, 7)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 7, (3, 10)))
  weights = jnp.asarray(rng.random((3, 10)) > 0.2, jnp.float32)
  positions = jnp.tile(jnp.arange(10), (3, 1))
  sums = metrics_lib.loss_sums(logits, targets, weights, never_predict=(5,),
                               positions_BL=positions, bucket=4, num_buckets=3)
  for key in ("loss_sum", "correct_sum", "weight_sum"):
    per_bucket = np.asarray(sums[metrics_lib.BY_POSITION_PREFIX + key])
    assert per_bucket.shape == (3,)
    assert per_bucket.sum() == pytest.approx(float(sums[key]), rel=1e-6)
  # Bucket 1 holds positions 4..7 exactly.
  nll = -jax.nn.log_softmax(jnp.where(jnp.arange(7) == 5, -1e9, logits))
  nll = np.take_along_axis(np.asarray(nll), np.asarray(targets)[..., None], -1)[..., 0]
  assert float(sums["by_position_loss_sum"][1]) == pytest.approx(
      float((nll * np.asarray(weights))[:, 4:8].sum()), rel=1e-5)
  rows = metrics_lib.by_position_rows(jax.device_get(sums), 4)
  assert [(r["start"], r["end"]) for r in rows] == [(0, 4), (4, 8), (8, 12)]
  assert "by_position_loss" not in metrics_lib.summarize(jax.device_get(sums))


def test_sums_by_position_are_the_same_in_chunks():
  """The eval step projects a few positions at a time (train.logits_chunk): same buckets."""
  rng = np.random.default_rng(1)
  head = lm_head.LogitsHead(weight=jnp.asarray(rng.normal(size=(11, 6)), jnp.float32),
                            bias_V=None, tied=True, dtype=jnp.float32, softcap=0.0)
  x = jnp.asarray(rng.normal(size=(2, 10, 6)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, (2, 10)))
  weights = jnp.ones((2, 10), jnp.float32)
  positions = jnp.asarray([list(range(10)), [0, 1, 2, 0, 1, 2, 3, 4, 5, 6]])
  whole = metrics_lib.loss_sums(head(x), targets, weights, positions_BL=positions, bucket=3,
                                num_buckets=4)
  chunked = metrics_lib.objective_sums((x, head), targets, weights, chunk=4,
                                       positions_BL=positions, bucket=3, num_buckets=4)
  for key, value in whole.items():
    np.testing.assert_allclose(chunked[key], value, rtol=1e-5)


def test_evaluate_by_position_averages_back_to_the_overall_loss(rope_run, tmp_path):
  out = io.StringIO()
  record = evaluate_mode.evaluate(rope_run, by_position=8, output=str(tmp_path / "e.json"),
                                  stdout=out)
  rows = record["by_position"]["rows"]
  assert [(r["start"], r["end"]) for r in rows] == [(0, 8), (8, 16), (16, 24), (24, 32)]
  tokens = sum(r["tokens"] for r in rows)
  assert tokens == record["metrics"]["tokens"]
  assert sum(r["loss"] * r["tokens"] for r in rows) / tokens == pytest.approx(
      record["metrics"]["loss"], rel=1e-6)
  assert sum(r["accuracy"] * r["tokens"] for r in rows) / tokens == pytest.approx(
      record["metrics"]["accuracy"], rel=1e-6)
  # The same loss as without the breakdown, which changes nothing else.
  plain = evaluate_mode.evaluate(rope_run, output=str(tmp_path / "plain.json"))
  assert plain["metrics"]["loss"] == pytest.approx(record["metrics"]["loss"], rel=1e-6)
  with open(tmp_path / "e.json", encoding="utf-8") as f:
    assert json.load(f) == record
  png = record["by_position"]["plot"]
  assert png == str(tmp_path / "e_by_position.png")
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert "24-31" in out.getvalue() and png in out.getvalue()


def test_evaluate_past_the_training_length_with_linear_rope_scaling(rope_run):
  """RoPE reads 64 tokens (twice the training length); the file names what changed."""
  overrides = {"model.rope_scaling": "linear", "model.rope_scaling_factor": 2.0,
               "model.position": "rope"}  # The training flag, repeated: no change.
  record = evaluate_mode.evaluate(rope_run, config=_at_length(rope_run, 64), by_position=16,
                                  model_overrides=overrides)
  assert record["seq_len"] == 64
  assert record["changed"] == {"len": 64, "rope_scaling": "linear",
                               "rope_scaling_factor": 2.0}
  assert os.path.basename(record["by_position"]["plot"]) == (
      "eval_validation_step4_len-64_rope_scaling-linear_rope_scaling_factor-2.0"
      "_by_position.png")
  assert record["by_position"]["rows"][-1]["start"] == 48  # Positions the run never saw.
  # Linear scaling reaches the model: another loss than the unscaled one (barely: after
  # 4 steps the tiny model hardly uses positions).
  unscaled = evaluate_mode.evaluate(rope_run, config=_at_length(rope_run, 64))
  assert unscaled["changed"] == {"len": 64}
  assert unscaled["metrics"]["loss"] != record["metrics"]["loss"]


def _learned_copy(rope_run, tmp_path) -> str:
  """A workdir whose config.json says learned positions (load_config reads nothing else)."""
  with open(os.path.join(rope_run, "config.json"), encoding="utf-8") as f:
    stored = json.load(f)
  stored["model"]["position"] = "learned"
  stored["data"]["path"] = loaded.load_config(rope_run).data.path
  (tmp_path / "learned").mkdir()
  (tmp_path / "learned" / "config.json").write_text(json.dumps(stored), encoding="utf-8")
  return str(tmp_path / "learned")


@pytest.mark.parametrize("how,message", [
    ("seq_len", r"config\.data\.seq_len=64 is invalid: must be <= model\.max_len=32 with "
                r"learned positions"),
    ("max_len", r"--config\.model\.max_len=64: the run's learned position table has "
                r"model\.max_len=32 rows and learned positions cannot extrapolate"),
])
def test_learned_positions_cannot_be_read_past_their_table(rope_run, tmp_path, how, message):
  workdir = _learned_copy(rope_run, tmp_path)
  with pytest.raises(ConfigError, match=message):
    if how == "seq_len":
      loaded.load_config(workdir, _at_length(rope_run, 64))
    else:
      loaded.load_config(workdir, model_overrides={"model.max_len": 64})


def test_a_model_field_that_moves_parameters_is_refused_not_ignored(rope_run):
  with pytest.raises(ConfigError, match=r"--config\.model\.d_model=64: the run's model has "
                     r"d_model=32 .* only the fields that move no parameter: model\.max_len"):
    loaded.load_config(rope_run, model_overrides={"model.d_model": 64})
  with pytest.raises(ConfigError, match=r"--config\.model\.no_such_key: not a model\.\* field"):
    loaded.load_config(rope_run, model_overrides={"model.no_such_key": 1})
  with pytest.raises(ConfigError, match=r"model\.rope_scaling='ntk_by_parts'"):  # validate's line.
    loaded.load_config(rope_run, model_overrides={"model.rope_scaling": "ntk_by_parts"})


def test_evaluate_by_position_needs_a_decoder_lm_and_a_width(rope_run):
  with pytest.raises(ConfigError, match=r"--by_position=-1: expected a bucket width >= 1"):
    evaluate_mode.evaluate(rope_run, by_position=-1)


# ---------------------------------------------------------------- passkey prompts


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
  text = " ".join([passkey.INTRO, *passkey.FILLER, passkey.NEEDLE, passkey.QUESTION,
                   passkey.DIGITS])
  return vocabularies.build_char_vocabulary([text], str(tmp_path_factory.mktemp("v") / "v"))


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_a_prompt_has_its_length_and_the_key_at_the_depth(char_tokenizer, depth):
  prompt = passkey.make_prompt(char_tokenizer, 600, depth, "71432")
  assert len(prompt.tokens) == 601 and prompt.tokens[0] == vocabularies.BOS_ID
  assert char_tokenizer.decode(prompt.tokens[-prompt.key_tokens:]) == "71432"
  text = char_tokenizer.decode(prompt.tokens[1:])
  assert text.endswith(passkey.QUESTION + " 71432")
  assert text.count("71432") == 3  # Twice in the needle, once as the answer.
  needle = text.index(" " + passkey.NEEDLE.format(key="71432"))
  filler_start = len(passkey.INTRO)
  filler_len = (len(text) - filler_start - len(" " + passkey.NEEDLE.format(key="71432"))
                - len(" " + passkey.QUESTION + " 71432"))
  placed = (needle - filler_start) / filler_len
  assert placed == pytest.approx(prompt.placed_depth)
  sentence = max(len(s) + 1 for s in passkey.FILLER)
  assert abs(placed - depth) <= sentence / filler_len  # At the nearest sentence boundary.
  assert prompt.needle_start == 1 + needle
  if depth in (0.0, 1.0):
    assert placed == depth  # Right after the instruction / right before the question.


def test_prompts_are_deterministic_in_the_seed(char_tokenizer):
  make = lambda seed: passkey.make_prompts(char_tokenizer, [300, 400], [0.0, 0.5], 3, seed)
  first, again, other = make(0), make(0), make(1)
  assert len(first) == 12
  assert [p.key for p in first] == [p.key for p in again]
  assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(first, again))
  assert [p.key for p in first] != [p.key for p in other]
  assert len({p.key for p in first}) > 6  # Each prompt draws its own key.
  assert [(p.length, p.depth, p.trial) for p in first[:4]] == [
      (300, 0.0, 0), (300, 0.0, 1), (300, 0.0, 2), (300, 0.5, 0)]


def test_passkey_bad_input_is_one_line(char_tokenizer):
  rope = types.SimpleNamespace(position="rope", max_len=32)
  learned = types.SimpleNamespace(position="learned", max_len=512)
  cases = [
      (([], [0.5], 1, 5, rope), r"--passkey_lengths is empty"),
      (([0], [0.5], 1, 5, rope), r"--passkey_lengths: 0 is not a length"),
      (([1024], [0.5], 1, 5, learned), r"1024 tokens exceed the model's learned position "
                                        r"table, model\.max_len=512"),
      (([256], [1.5], 1, 5, rope), r"--passkey_depths: 1\.5 is outside \[0, 1\]"),
      (([256], [-0.1], 1, 5, rope), r"--passkey_depths: -0\.1 is outside"),
      (([256], [], 1, 5, rope), r"--passkey_depths is empty"),
      (([256], [0.5], 0, 5, rope), r"--passkey_trials=0: expected an integer >= 1"),
  ]
  for args, message in cases:
    with pytest.raises(ConfigError, match=message):
      passkey.check_settings(*args)
  passkey.check_settings([4096], [0.0, 1.0], 1, 5, rope)  # RoPE: any length may be asked.
  with pytest.raises(ConfigError, match=r"--passkey_lengths: 100 tokens cannot hold the "
                     r"passkey prompt, which needs at least \d+"):
    passkey.make_prompt(char_tokenizer, 100, 0.5, "12345")
  with pytest.raises(ConfigError, match=r"--passkey_alphabet='12j€': the run's tokenizer has "
                     r"no token for \['j', '€'\]; give characters it knows"):
    passkey.check_alphabet(char_tokenizer, "12j€", "--passkey_alphabet")


# ---------------------------------------------------------------- passkey scoring


def test_passkey_mode_writes_the_table_json_and_heat_map(rope_run, tmp_path, monkeypatch,
                                                        caplog):
  out = io.StringIO()
  path = str(tmp_path / "pk.json")
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0)  # A line at every batch of prompts.
  with caplog.at_level("INFO"):
    record = passkey_mode.run_passkey(rope_run, lengths=[256, 300], depths=[0.0, 1.0],
                                      trials=2, alphabet=ALPHABET, output=path, stdout=out)
  assert re.search(r"passkey: \d/8 prompts \(.*\), ETA ", caplog.text), caplog.text
  assert "passkey: 8 prompts in " in caplog.text
  assert [(c["length"], c["depth"]) for c in record["cells"]] == [
      (256, 0.0), (256, 1.0), (300, 0.0), (300, 1.0)]
  assert all(c["trials"] == 2 and 0.0 <= c["accuracy"] <= 1.0 and c["key_logprob"] < 0
             for c in record["cells"])
  with open(path, encoding="utf-8") as f:
    assert json.load(f) == record
  with open(tmp_path / "pk.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert record["heatmap"] == str(tmp_path / "pk.png")
  table = out.getvalue()
  assert "length \\ depth" in table and "\n  300 " in table and "overall accuracy" in table


@pytest.mark.parametrize("mode", ["passkey", "evaluate"])
def test_a_full_disk_leaves_neither_the_json_nor_its_png_and_names_output(
    rope_run, tmp_path, monkeypatch, mode):
  """--output is a JSON and a PNG beside it: a full disk at either leaves neither (the
  JSON was left whole and the rerun refused as "exists"), and the line names --output
  (it named --config.data.data_dir)."""
  path = str(tmp_path / "pk.json")

  def run():
    if mode == "passkey":
      return passkey_mode.run_passkey(rope_run, lengths=[256], depths=[0.5], trials=1,
                                      alphabet=ALPHABET, output=path, stdout=io.StringIO())
    return evaluate_mode.evaluate(rope_run, by_position=8, output=path, stdout=io.StringIO())

  real, synced = os.fsync, []

  def full(fd):  # The PNG's bytes are on disk; the JSON's are refused.
    synced.append(fd)
    if len(synced) == 2:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    real(fd)

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(OSError) as raised:
    run()
  monkeypatch.undo()
  assert os.listdir(tmp_path) == []  # Neither file, no temporary file.
  assert usage.environment_error(raised.value, mode, rope_run) == (
      f"No space left on device: {path}; free space on that file system or write the "
      "result elsewhere with --output=PATH.")
  record = run()  # Not refused: nothing "exists".
  with open(path, encoding="utf-8") as f:
    assert json.load(f) == record
  assert sorted(os.listdir(tmp_path)) == sorted(
      ["pk.json", "pk.png" if mode == "passkey" else "pk_by_position.png"])


def test_passkey_scores_are_greedy_decoding_of_the_key(rope_run):
  """A model that always repeats its input token retrieves exactly the keys of one letter."""
  run = loaded.load_run(rope_run)
  prompts = [passkey.make_prompt(run.tokenizer, 256, 0.5, key) for key in ("aaaaa", "acdeh")]

  def echo(params, tokens_BT):  # log p = 0 on the current token, argmax = it.
    del params
    inputs, targets = tokens_BT[:, :-1], tokens_BT[:, 1:]
    return np.where(inputs == targets, 0.0, -5.0), inputs == targets

  results = passkey.score_prompts(echo, None, prompts, batch_size=4)
  # "aaaaa": the first 'a' follows the question's space, so only 4 of 5 are echoes.
  assert results == [(False, -5.0), (False, -25.0)]
  prompts = [passkey.make_prompt(run.tokenizer, 256, 0.5, key) for key in ("  ", "a ")]
  assert [r[0] for r in passkey.score_prompts(echo, None, prompts, batch_size=1)] == [
      True, False]


def test_passkey_through_launch_refuses_bad_input_in_one_line(rope_run):
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=passkey",
       f"--workdir={rope_run}", "--passkey_lengths=256", "--passkey_depths=0,2"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
      env=subprocess_env())
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "ConfigError: --passkey_depths: 2.0 is outside [0, 1] (0: the key right after the "
      "instruction, 1: right before the question)")
  assert "Traceback" not in result.stderr
