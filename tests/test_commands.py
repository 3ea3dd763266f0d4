"""launch.py's evaluate / translate / generate / average modes, and BLEU during training.

Two tiny runs are trained once for the module (4 steps, checkpoints at 2 and 4): a
byte-level English->"GERMAN" translation model (the target is the upper-cased source)
with in-training BLEU, and a character-level LM with an in-training sample. The tests
then only read their workdirs, which also checks that no command writes into them
beyond its result file.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from unittest import mock

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import sacrebleu

from configs import base
from test_datasets import tiny, write_local_files
from test_docs import snippet_of
from test_decoding import _FAST_ENTRY_POINTS  # pylint: disable=protected-access
from test_decoding import fast_decoding_compiles  # pylint: disable=unused-import (autouse)
from transformer.cli import average as average_mode
from transformer.cli import evaluate as evaluate_mode
from transformer.cli import generate as generate_mode
from transformer.cli import translate as translate_mode
from transformer.cli import usage
from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies
from transformer.inference import decoding
from transformer.inference import loaded
from transformer.inference import text
from transformer.training import loop
from transformer.training import resume
from transformer.workdir import averaging
from transformer.workdir import init_from
from transformer.workdir import metrics_file
from transformer.workdir import progress
from tiny import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(config, workdir):
  """train_and_evaluate, recording what the run wrote as TensorBoard text."""
  texts = []
  original = metrics_file.MetricWriter.write_text

  def record(writer, step, tag, text):
    texts.append((step, tag, text))
    original(writer, step, tag, text)

  with mock.patch.object(metrics_file.MetricWriter, "write_text", autospec=True,
                         side_effect=record), \
       mock.patch.multiple(decoding, **_FAST_ENTRY_POINTS):  # As the tests' autouse fixture.
    result = loop.train_and_evaluate(config, workdir)
  return result, texts


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("files")
  return root, write_local_files(root)


@pytest.fixture(scope="module")
def translation_run(files):
  root, paths = files
  config = tiny(base.get_config(), str(root / "tfds"), name="local_parallel",
                path=paths["local_parallel"], source_language="en", target_language="de",
                tokenizer="bytes")
  config.model.arch = "encoder_decoder"
  config.train.bleu_examples = 4
  config.decode.update(beam_size=2, max_length_offset=8, batch_size=4)
  workdir = str(root / "translation")
  result, texts = _train(config, workdir)
  return workdir, result, texts


@pytest.fixture(scope="module")
def lm_run(files):
  root, paths = files
  config = tiny(base.get_config(), str(root / "tfds"), name="local_text",
                path=paths["local_text"], tokenizer="char")
  config.train.update(eval_batches=-1, sample_prompt="the cat")
  config.decode.max_new_tokens = 8
  workdir = str(root / "lm")
  result, texts = _train(config, workdir)
  return workdir, result, texts


def _snapshot(workdir):
  """Every file of a workdir with its size and modification time."""
  return {os.path.relpath(os.path.join(d, f), workdir): (os.path.getsize(os.path.join(d, f)),
                                                         os.path.getmtime(os.path.join(d, f)))
          for d, _, names in os.walk(workdir) for f in names}


# ---------------------------------------------------------------- during training


def test_bleu_and_translations_are_reported_at_each_evaluation(translation_run):
  workdir, result, texts = translation_run
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  bleu_steps = [r["step"] for r in rows if "eval_bleu" in r]
  assert bleu_steps == [2, 4]  # Not at step 0: only the periodic evaluations decode.
  assert all(0.0 <= r["eval_bleu"] <= 100.0 for r in rows if "eval_bleu" in r)
  assert "eval_bleu" in result
  translations = [(step, text) for step, tag, text in texts if tag == "translations"]
  assert [step for step, _ in translations] == [2, 4]
  assert translations[0][1].count("**source:**") == 2  # Two examples per text.


def test_sample_prompt_is_continued_at_each_evaluation(lm_run):
  _, result, texts = lm_run
  assert [(step, tag) for step, tag, _ in texts] == [(2, "sample"), (4, "sample")]
  assert texts[0][2].startswith("**prompt:** the cat")
  assert "eval_bleu" not in result


# ---------------------------------------------------------------- a run from its workdir


def test_the_run_config_reads_back_and_a_config_brings_only_data_and_decode(lm_run):
  workdir = lm_run[0]
  config = loaded.load_config(workdir)
  assert config.mesh.shape == base.get_config().mesh.shape  # Tuples again, not JSON lists.
  assert config.mesh.rules == base.get_config().mesh.rules
  assert (config.model.vocab_size, config.model.d_model, config.data.tokenizer) == (128, 32,
                                                                                    "char")
  other = base.get_config()
  other.data.update(batch_size=16, eval_split="train", tokenizer="bytes", seq_len=32)
  other.decode.beam_size = 3
  other.model.d_model = 512
  config = loaded.load_config(workdir, other)
  assert (config.data.batch_size, config.data.eval_split, config.decode.beam_size) == (
      16, "train", 3)
  assert (config.data.tokenizer, config.model.d_model) == ("char", 32)  # The run's.


# ---------------------------------------------------------------- evaluate


def test_evaluate_an_lm_gives_the_training_eval_loss(lm_run, monkeypatch, caplog):
  workdir, result, _ = lm_run
  before = _snapshot(workdir)
  out = io.StringIO()
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0)  # A line at every batch of the tiny run.
  with caplog.at_level("INFO"):
    record = evaluate_mode.evaluate(workdir, stdout=out)
  said = caplog.text  # While it works: the checkpoint read, batches scored, a summary.
  assert "Reading the parameters of step 4 ..." in said
  assert f"evaluate validation: scoring {record['examples']} examples in batches of " in said
  assert "evaluate validation: 1 batches (" in said
  assert re.search(r"evaluate validation: \d+ batches in \d+\.\ds \(.* batches/s\); "
                   rf"{record['examples']} examples scored", said), said
  path = os.path.join(workdir, "eval_validation_step4.json")
  with open(path, encoding="utf-8") as f:
    assert json.load(f) == record
  # The same split, the whole of it (train.eval_batches=-1), the same step-4 params.
  assert record["metrics"]["loss"] == pytest.approx(result["eval_loss"], rel=1e-6)
  assert record["metrics"]["tokens"] == result["eval_tokens"]
  assert record["checkpoint_steps"] == [4] and record["split"] == "validation"
  assert "loss" in out.getvalue() and path in out.getvalue()
  after = _snapshot(workdir)
  assert {k: v for k, v in after.items() if k != os.path.basename(path)} == before
  # The default path: no word of an --output the user never gave.
  with pytest.raises(ConfigError, match=r"eval_validation_step4\.json exists: an earlier run "
                     r"of this command wrote this result; read it, pass --overwrite"):
    evaluate_mode.evaluate(workdir)
  assert evaluate_mode.result_path("w", "test", [2, 4], 10) == "w/eval_test_step4_avg2_first10.json"


def test_evaluate_bleu_is_sacrebleus_on_the_same_strings(translation_run, files, tmp_path,
                                                          monkeypatch):
  """The command's BLEU is corpus_bleu(outputs, raw references) over the whole split."""
  workdir, _, _ = translation_run
  _, paths = files

  def fake_translate(model_config, params, tokenizer, texts, decode, policy, **kwargs):
    del model_config, params, tokenizer, decode, policy, kwargs
    # Right (upper-cased) for some sentences only, so that BLEU is neither 0 nor 100.
    return [t.upper() if len(t) % 3 else t.upper()[::-1] for t in texts]

  monkeypatch.setattr(text, "translate_texts", fake_translate)
  record = evaluate_mode.evaluate(workdir, output=str(tmp_path / "eval.json"), stdout=io.StringIO())

  with open(os.path.join(paths["local_parallel"], "val.en"), encoding="utf-8") as f:
    english = f.read().splitlines()
  with open(os.path.join(paths["local_parallel"], "val.de"), encoding="utf-8") as f:
    german = f.read().splitlines()
  hypotheses = fake_translate(None, None, None, english, None, None)
  expected = sacrebleu.corpus_bleu(hypotheses, [german])
  assert 0 < expected.score < 100
  assert record["metrics"]["bleu"] == expected.score  # Exactly: the same n-gram counts.
  assert record["metrics"]["chrf"] == sacrebleu.corpus_chrf(hypotheses, [german]).score
  assert record["examples"] == len(english)
  assert record["sacrebleu"]["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
  assert record["decoding"]["search"] == "beam" and record["decoding"]["beam_size"] == 2


# ---------------------------------------------------------------- translate


def test_translate_keeps_line_order_and_empty_lines(translation_run, tmp_path, monkeypatch):
  """A stand-in decoder that reverses each source: what comes back must be its line's."""
  workdir, _, _ = translation_run
  shapes = []

  def reverse_sources(config, params, inputs_BS, segment_ids_BS, **kwargs):
    del config, params, kwargs
    shapes.append(inputs_BS.shape)
    out = np.zeros((inputs_BS.shape[0], inputs_BS.shape[1] + 1), np.int32)
    for row, (ids, real) in enumerate(zip(np.asarray(inputs_BS), np.asarray(segment_ids_BS))):
      ids = ids[real == 1][:-1]  # Without the eos.
      out[row, :len(ids) + 1] = np.append(ids[::-1], vocabularies.EOS_ID)
    return out

  monkeypatch.setattr(decoding, "generate_seq2seq", reverse_sources)
  lines = ["a", "", "the cat sees a dog", "x" * 40, "  ", "dog and cat", "b c", "", "runs"]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  out = str(tmp_path / "out.txt")
  overrides = {"batch_size": 2}
  translate_mode.translate(workdir, input_path=str(tmp_path / "in.txt"), output_path=out,
                     decode_overrides=overrides)
  with open(out, encoding="utf-8") as f:
    got = f.read().split("\n")
  assert got[-1] == "" and len(got) == len(lines) + 1
  # The 40-byte line is cut to seq_len 32 with its eos: 31 bytes.
  assert got[:-1] == [l[:31][::-1] if l.strip() else "" for l in lines]
  # Sorted by length into batches of 2, padded to width buckets 8 / 32: few programs.
  assert set(shapes) <= {(2, 8), (2, 16), (2, 32)} and len(shapes) == 3

  with pytest.raises(ConfigError, match=r"out\.txt' exists; pass --overwrite"):
    translate_mode.translate(workdir, input_path=str(tmp_path / "in.txt"), output_path=out)
  translate_mode.translate(workdir, input_path=str(tmp_path / "in.txt"), output_path=out,
                     overwrite=True)
  with pytest.raises(ConfigError, match="is the input file"):
    translate_mode.translate(workdir, input_path=str(tmp_path / "in.txt"),
                       output_path=str(tmp_path / "in.txt"), overwrite=True)
  assert (tmp_path / "in.txt").read_text(encoding="utf-8").split("\n")[:-1] == lines


def test_translate_through_launch(translation_run, tmp_path):
  """The flags reach the command: a 3-line file with an empty line, the real model."""
  workdir, _, _ = translation_run
  (tmp_path / "in.txt").write_text("the cat\n\ndog runs home\n", encoding="utf-8")
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch.py"), "--mode=translate",
       f"--workdir={workdir}", f"--input={tmp_path}/in.txt", f"--output={tmp_path}/out.txt",
       "--beam_size=1", "--max_length_offset=4"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
      env=subprocess_env())
  assert result.returncode == 0, result.stderr[-3000:]
  lines = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
  assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
  assert "translate: 3 sentences in " in result.stderr  # The summary (workdir/progress.py).
  assert result.stdout == ""  # Translations went to the file.
  # A loaded run builds nothing of training (inference/loaded.py): no optimizer, and no
  # sharding table, which only Trainer.create logs.
  assert "Parameter sharding on mesh" not in result.stderr


def _stopped_while_decoding(argv, signum, delay):
  """Runs launch.py (`argv`), sends `signum` `delay` s after the checkpoint is loaded
  (decoding then: compiles and steps in JAX's threads); returns (exit status, stderr)."""
  process = subprocess.Popen(
      [sys.executable, os.path.join(ROOT, "launch.py"), *argv], cwd=ROOT,
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      env=subprocess_env(),
      # As a terminal's foreground process: pytest-xdist's workers ignore SIGINT.
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  lines = []
  try:
    for line in iter(process.stderr.readline, b""):
      lines.append(line.decode("utf-8", "replace"))
      if lines[-1].startswith("Loaded checkpoint"):
        time.sleep(delay)
        process.send_signal(signum)
        break
    lines += [line.decode("utf-8", "replace") for line in process.stderr]
    process.wait(timeout=300)
  finally:
    if process.poll() is None:
      process.kill()
  return process.returncode, "".join(lines)


@pytest.mark.slow
@pytest.mark.long  # Six decoding subprocesses each, 2-3 min.
@pytest.mark.parametrize("mode", ["translate", "generate"])
def test_a_signal_while_decoding_ends_in_one_line_every_time(mode, translation_run, lm_run,
                                                             tmp_path):
  """SIGINT / SIGTERM while translate or generate decodes: the line and 130 / 143, never
  `Fatal Python error: Segmentation fault` (exit 139, 1 in 2 tries before: the exit tore
  JAX's backend down under a compile the signal had interrupted)."""
  workdir = (translation_run if mode == "translate" else lm_run)[0]
  (tmp_path / "in.txt").write_text("".join(f"the cat {i} runs home\n" for i in range(20000)),
                                   encoding="utf-8")
  out = tmp_path / "out.txt"
  for attempt in range(6):
    signum = (signal.SIGINT, signal.SIGTERM)[attempt % 2]
    code, stderr = _stopped_while_decoding(
        [f"--mode={mode}", f"--workdir={workdir}", f"--input={tmp_path}/in.txt",
         f"--output={out}", "--beam_size=1"], signum, 0.25 * attempt)
    if code == 0:  # Finished before the signal (a fast machine): the next waits less.
      out.unlink()
      continue
    name = signal.Signals(signum).name
    assert code == 128 + signum, f"attempt {attempt} ({name}): exit {code}\n{stderr[-3000:]}"
    assert "Fatal Python error" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.rstrip().endswith(f"Stopped by {name}: --mode={mode} did not finish and "
                                    "left no partial output; rerun the same command")
    assert not out.exists()


# ---------------------------------------------------------------- generate


def test_generate_at_temperature_zero_is_decoding_generate(lm_run):
  workdir, _, _ = lm_run
  out = io.StringIO()
  overrides = {"temperature": 0.0, "beam_size": 1, "max_new_tokens": 8}
  continuation, = generate_mode.generate(workdir, ["the cat"], decode_overrides=overrides,
                                    stdout=out)
  assert out.getvalue() == continuation + "\n"

  run = loaded.load_run(workdir)
  prompt = np.concatenate([[vocabularies.BOS_ID], run.tokenizer.encode("the cat")])[None]
  with run.context():
    tokens = decoding.generate(run.model_config, run.params, prompt, 8)
  row = np.asarray(tokens)[0]
  expected = row[:list(row).index(vocabularies.EOS_ID)] if vocabularies.EOS_ID in row else row
  assert continuation == run.tokenizer.decode(expected)


def test_generate_is_greedy_unless_a_beam_is_asked_for(lm_run, monkeypatch):
  """The run's decode.beam_size (base.py's 4) is translation's; generate takes the
  likeliest token unless --beam_size is given."""
  workdir, _, _ = lm_run
  assert loaded.load_config(workdir).decode.beam_size == 4
  searches = []
  original = text.continue_texts
  monkeypatch.setattr(text, "continue_texts", lambda *args, **kw: searches.append(
      text.describe_search(args[4])) or original(*args, **kw))
  generate_mode.generate(workdir, ["the cat"], decode_overrides={"max_new_tokens": 4},
                         stdout=io.StringIO())
  generate_mode.generate(workdir, ["the cat"], stdout=io.StringIO(),
                         decode_overrides={"max_new_tokens": 4, "beam_size": 2})
  assert searches == [{"search": "greedy"}, {"search": "beam", "beam_size": 2, "alpha": 0.6}]


def test_generate_reads_input_from_a_pipe_and_writes_output(lm_run, tmp_path, monkeypatch,
                                                            caplog):
  """generate reads --input (a `<(...)` pipe here) and writes --output as translate does;
  the byte-order mark of the input (and of a --prompt) is not text given to the model."""
  workdir, _, _ = lm_run
  overrides = {"temperature": 0.0, "beam_size": 1, "max_new_tokens": 8}
  seen = []
  original = text.continue_texts
  monkeypatch.setattr(text, "continue_texts", lambda *args, **kw: seen.append(args[3]) or
                      original(*args, **kw))
  expected = generate_mode.generate(workdir, ["the cat", "a dog"],
                                    decode_overrides=overrides, stdout=io.StringIO())
  read, write = os.pipe()
  os.write(write, "\ufeffthe cat\na dog\n".encode("utf-8"))
  os.close(write)
  out, stdout = tmp_path / "out.txt", io.StringIO()
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0)
  try:
    with caplog.at_level("INFO"):
      got = generate_mode.generate(workdir, input_path=f"/dev/fd/{read}", output_path=str(out),
                                   decode_overrides=overrides, stdout=stdout)
  finally:
    os.close(read)
  assert "generate: 2/2 prompts (" in caplog.text and "generate: 2 prompts in " in caplog.text
  assert seen[1] == ["the cat", "a dog"] and got == expected
  assert out.read_text(encoding="utf-8") == "".join(c + "\n" for c in expected)
  assert stdout.getvalue() == ""  # The continuations went to the file.
  with pytest.raises(ConfigError, match=r"out\.txt' exists; pass --overwrite"):
    generate_mode.generate(workdir, input_path="/dev/null", output_path=str(out))
  generate_mode.generate(workdir, ["\ufeffthe cat"], decode_overrides=overrides,
                         stdout=io.StringIO())
  assert seen[2] == ["the cat"]


# ---------------------------------------------------------------- average


def test_average_is_the_mean_of_the_checkpoints(translation_run, tmp_path, monkeypatch, caplog):
  workdir, _, _ = translation_run
  before = _snapshot(workdir)
  out = tmp_path / "averaged"
  monkeypatch.setattr(progress, "EVERY_SECONDS", 0)
  with caplog.at_level("INFO"):
    path = average_mode.average(workdir, str(out), average_last=2)
  said = caplog.text  # Each checkpoint read, a summary, the write timed.
  for line in ("averaging: 1/2 checkpoints (", "averaging: 2 checkpoints in ",
               f"average: writing the parameters to {out} ...",
               f"average: writing the parameters to {out}: "):
    assert line in said, said
  assert path == str(out / "checkpoints" / "4")
  restore = lambda directory: ocp.StandardCheckpointer().restore(
      os.path.join(directory, "state"))["params"]
  two, four = (restore(os.path.join(workdir, "checkpoints", s)) for s in ("2", "4"))
  mean = jax.tree.map(lambda a, b: (np.asarray(a) + np.asarray(b)) / 2, two, four)
  jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7),
               restore(path), mean)
  assert _snapshot(workdir) == before  # The source run is only read.
  with open(out / "averaged.json", encoding="utf-8") as f:
    assert json.load(f)["steps"] == [2, 4]
  # Its data identity too: evaluating the averaged run checks the data as the source's.
  assert (out / "dataset.json").read_text() == open(  # pylint: disable=consider-using-with
      os.path.join(workdir, "dataset.json"), encoding="utf-8").read()

  # The averaged workdir is a run for the other modes and for config.init_from.
  run = loaded.load_run(str(out))
  assert run.steps == [4]
  _, match = init_from.load_params(str(out), run.abstract_params)
  assert not match.new and not match.dropped
  with pytest.raises(ConfigError, match="exists and is not an empty directory"):
    average_mode.average(workdir, str(out), average_last=2)
  with pytest.raises(ConfigError, match="inside the source workdir"):
    average_mode.average(workdir, os.path.join(workdir, "avg"), average_last=2)


def test_average_to_a_full_disk_leaves_nothing_and_the_retry_is_not_refused(
    translation_run, tmp_path, monkeypatch):
  """Orbax meets a full disk mid-save: one OSError naming --output and the folder the
  user chose (not the source run's files), no folder left; the same command then works."""
  workdir, _, _ = translation_run
  out = str(tmp_path / "averaged")
  real_save = ocp.CheckpointManager.save

  def full_disk(*args, **kwargs):
    raise ValueError("RESOURCE_EXHAUSTED: Error writing local file: "
                     "[OS error 28: No space left on device]")

  monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
  with pytest.raises(OSError) as raised:
    average_mode.average(workdir, out, average_last=2)
  assert raised.value.errno == errno.ENOSPC and raised.value.filename == out
  assert usage.environment_error(raised.value, "average", workdir) == (
      f"No space left on device: {out}; free space on that file system or choose another "
      "--output.")
  assert sorted(os.listdir(tmp_path)) == []  # Neither the folder nor its partial sibling.
  monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
  path = average_mode.average(workdir, out, average_last=2)  # The retry: not "not empty".
  assert os.path.isdir(path) and loaded.load_run(out).steps == [4]
  assert sorted(os.listdir(tmp_path)) == ["averaged"]


# ---------------------------------------------------------------- mistakes


def _copy_without(workdir, tmp_path, *, drop=(), model=None):
  """A copy of a run, without some of its files or with other model.* fields."""
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  for name in drop:
    path = copy / name
    if path.is_dir():
      shutil.rmtree(path)
    else:
      path.unlink()
  if model:
    config = json.loads((copy / "config.json").read_text())
    config["model"].update(model)
    (copy / "config.json").write_text(json.dumps(config))
  return str(copy)


MISTAKES = {  # name -> (which run, how to break it, the call, the message)
    "prompt_too_long": ("lm", {}, lambda w: generate_mode.generate(
        w, ["x" * 40], decode_overrides={"overlong": "error", "max_new_tokens": 4}),
                        r"--prompt has 41 tokens, more than the 29 a prompt may have"),
    "empty_prompt": ("lm", {}, lambda w: generate_mode.generate(w, [""]), r"--prompt is empty"),
    "no_checkpoints": ("lm", {"drop": ["checkpoints"]}, loaded.load_run,
                       r"checkpoints holds no complete checkpoint: train first"),
    "no_config": ("lm", {"drop": ["config.json"]}, loaded.load_run,
                  r"has no config\.json: expected the workdir of a training run"),
    "no_tokenizer": ("lm", {"drop": ["tokenizer.json"]}, loaded.load_run,
                     r"has no tokenizer\.json"),
    "shape_mismatch": ("lm", {"model": {"mlp_dim": 128}}, loaded.load_run,
                       r"does not match the model of .*config\.json: .*block_0/mlp/wi/kernel is "
                       r"\(32, 64\) in the checkpoint but \(32, 128\) in the model"),
    "unknown_step": ("lm", {}, lambda w: loaded.load_run(w, checkpoint_step=3),
                     r"--checkpoint_step=3: .* has no such checkpoint; its steps are 2, 4"),
    "too_few_to_average": ("lm", {}, lambda w: loaded.load_run(w, average_last=3),
                           r"--average_last=3 needs 3 checkpoints but .* holds 2 \(steps 2, 4\)"
                           r": a run keeps only its newest checkpoint\.keep=2"),
    "generate_on_translation": ("translation", {}, lambda w: generate_mode.generate(w, ["a"]),
                                r"--mode=generate continues prompts \(or fills a text-to-text "
                                r"model's sentinels\): it serves causal_lm \(decoder\), .*"
                                r"span_corruption \(encoder_decoder, decoder\).*holds a seq2seq "
                                r"model \(model.arch='encoder_decoder'"),
    "translate_on_lm": ("lm", {}, lambda w: translate_mode.translate(w, stdin=io.StringIO("a\n")),
                        r"--mode=translate translates sentences: it serves seq2seq "
                        r"\(encoder_decoder\), prefix_lm \(encoder_decoder, decoder\); .* holds a "
                        r"causal_lm model"),
    "beam_and_sampling": ("lm", {}, lambda w: loaded.load_run(
        w, decode_overrides={"beam_size": 4, "temperature": 0.7}),
                          r"beam search does not sample"),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_mistakes_get_clear_messages(name, lm_run, translation_run, tmp_path):
  which, breakage, call, message = MISTAKES[name]
  workdir = {"lm": lm_run, "translation": translation_run}[which][0]
  before = _snapshot(workdir)
  if breakage:
    workdir = _copy_without(workdir, tmp_path, **breakage)
  with pytest.raises(ConfigError, match=message):
    call(workdir)
  assert _snapshot({"lm": lm_run, "translation": translation_run}[which][0]) == before


# ---------------------------------------------------------------- what a mode reads (issue 34)


def test_evaluate_reads_the_runs_own_data_by_content(lm_run, files, tmp_path, monkeypatch):
  """A relative data.path resolves where the run read it; identity is by content."""
  workdir, result, _ = lm_run
  _, paths = files
  original = open(paths["local_text"], "rb").read()  # pylint: disable=consider-using-with
  run = tmp_path / "run"
  shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("eval_*.json"))
  (tmp_path / "a").mkdir()
  (tmp_path / "a" / "text.txt").write_bytes(original)
  # As if trained from tmp_path with data.path='a/text.txt' (the README's relative style).
  config = json.loads((run / "config.json").read_text())
  config["data"]["path"] = "a/text.txt"
  (run / "config.json").write_text(json.dumps(config))
  record = json.loads((run / "dataset.json").read_text())
  record["source_path"] = str(tmp_path / "a" / "text.txt")
  (run / "dataset.json").write_text(json.dumps(record))
  # Run from elsewhere, where a/text.txt is another file: the run's file is read.
  (tmp_path / "elsewhere" / "a").mkdir(parents=True)
  (tmp_path / "elsewhere" / "a" / "text.txt").write_bytes(original[:len(original) // 2])
  monkeypatch.chdir(tmp_path / "elsewhere")
  scored = evaluate_mode.evaluate(str(run), output=str(tmp_path / "1.json"))
  assert scored["metrics"]["loss"] == pytest.approx(result["eval_loss"], rel=1e-6)

  # A byte-identical copy under another name, named absolutely: the same data.
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "copy.txt").write_bytes(original)
  config["data"]["path"] = str(tmp_path / "b" / "copy.txt")
  (run / "config.json").write_text(json.dumps(config))
  scored = evaluate_mode.evaluate(str(run), output=str(tmp_path / "2.json"))
  assert scored["metrics"]["loss"] == pytest.approx(result["eval_loss"], rel=1e-6)

  # An edited file is not the run's data: one line naming it, nothing written.
  (tmp_path / "b" / "copy.txt").write_bytes(original + b"the dog\n")
  with pytest.raises(ConfigError, match=r"--mode=evaluate: the data is not what .*run trained "
                     r"on \(dataset\.json\): dataset: .*copy\.txt"):
    evaluate_mode.evaluate(str(run), output=str(tmp_path / "3.json"))
  assert not (tmp_path / "3.json").exists()


def test_processes_that_chose_another_checkpoint_or_read_other_data_stop(lm_run, tmp_path,
                                                                         monkeypatch):
  """Issue 48: a mode reading a run on two processes, as process 0 whose peer listed the
  checkpoints before the newest was saved, or scores other bytes: one line, before the
  parameters or the data are read (distributed.agree, the exchange simulated)."""
  from test_agreement import as_process_0_of_2  # pylint: disable=g-import-not-at-top
  workdir, _, _ = lm_run
  newest = loaded.checkpoint_steps(workdir)[-1]
  as_process_0_of_2(monkeypatch, lambda theirs: theirs.get("checkpoint", {}).update(steps=[1]))
  with pytest.raises(ConfigError, match=rf"^checkpoint differs between processes: steps is "
                     rf"\[{newest}\] on process 0 and \[1\] on process 1; every process"):
    loaded.load_run(workdir)

  def other_bytes(theirs):
    if "checkpoint" not in theirs:  # evaluate's data, after the run loaded alike.
      theirs["data"].update({k: "0" * 64 for k in theirs["data"] if k.startswith("file ")})

  as_process_0_of_2(monkeypatch, other_bytes)
  with pytest.raises(ConfigError, match=r"^data differs between processes: file .* \(sha256\) "
                     r'is "[0-9a-f]{64}" on process 0 and "0{64}" on process 1;'):
    evaluate_mode.evaluate(workdir, output=str(tmp_path / "never.json"))
  assert not (tmp_path / "never.json").exists()


def test_a_resume_accepts_the_same_content_under_another_path(lm_run, tmp_path, monkeypatch):
  """The resume check: data.path relative -> absolute, same bytes: noted, not refused."""
  workdir, _, _ = lm_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("eval_*.json"))
  saved = json.loads((run / "config.json").read_text())
  absolute = saved["data"]["path"]
  monkeypatch.chdir(os.path.dirname(absolute))
  saved["data"]["path"] = os.path.basename(absolute)  # Named relatively at first.
  (run / "config.json").write_text(json.dumps(saved))
  config = loaded.load_config(str(run))
  config.data.path = absolute
  dataset = json.loads((run / "dataset.json").read_text())
  resume.check_config_change(config, str(run), dataset)
  edited = dict(dataset, name=dataset["name"] + "x",
                files={k: "0" * 64 for k in dataset["files"]})
  with pytest.raises(ConfigError, match=r"that a resumed run cannot change:\n  data\.path: "
                     r"'text\.txt' -> .*\n  dataset: "):
    resume.check_config_change(config, str(run), edited)


def test_a_checkpoint_deleted_while_read_gives_way_to_the_newest(lm_run, tmp_path,
                                                                monkeypatch):
  """Issue 34: evaluate beside training with checkpoint.keep=1 lost its checkpoint mid-read."""
  workdir, _, _ = lm_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("eval_*.json"))
  checkpoints = run / "checkpoints"
  real = averaging.average_params
  saves = []

  def training_saves_meanwhile(state_dirs, *args, **kwargs):
    if not saves:  # Step 6 saved, then step 4 deleted, as keep=1 does, during the read.
      saves.append(6)
      shutil.copytree(checkpoints / "4", checkpoints / "6")
      shutil.rmtree(checkpoints / "4")
    return real(state_dirs, *args, **kwargs)  # Reads the deleted step 4: tensorstore's NOT_FOUND.

  monkeypatch.setattr(averaging, "average_params", training_saves_meanwhile)
  assert loaded.load_run(str(run)).steps == [6]
  # A step the user named cannot be swapped for another: one line.
  saves.clear()
  shutil.copytree(checkpoints / "6", checkpoints / "4")
  shutil.rmtree(checkpoints / "6")
  with pytest.raises(ConfigError, match=r"checkpoint 4 of .* was deleted while it was read"):
    loaded.load_run(str(run), checkpoint_step=4)


def test_the_decoding_snippet_in_docs_modes_runs_as_written(lm_run, capsys):
  """docs/modes.md's Python example runs on a trained run (the quick start's path swapped
  for this test's run): a doc that drifts from the API fails here."""
  workdir, _, _ = lm_run
  snippet = snippet_of("docs/modes.md", 0)
  assert 'loaded.load_run("runs/gpt_small_local")' in snippet.code
  exec(compile(snippet.code.replace("runs/gpt_small_local", workdir), snippet.where, "exec"),  # pylint: disable=exec-used
       {"__name__": "docs_snippet"})
  assert capsys.readouterr().out.strip()  # The decoded continuation was printed.


def test_the_python_api_snippet_in_docs_python_runs_as_written(lm_run, capsys):
  """docs/python.md's first example on a trained run (its "runs/gpt_small_local", the
  quick start's)."""
  workdir, _, _ = lm_run
  snippet = snippet_of("docs/python.md", 0)
  assert 'api.load("runs/gpt_small_local")' in snippet.code
  namespace = {"__name__": "docs_snippet"}
  exec(compile(snippet.code.replace("runs/gpt_small_local", workdir), snippet.where, "exec"),  # pylint: disable=exec-used
       namespace)
  assert namespace["record"]["metrics"]["loss"] > 0
  assert capsys.readouterr().out.strip()  # evaluate printed its table.
