"""The modes on text-to-text models (issue 53): a decoder prefix LM translates, reports
BLEU in training and in --mode=evaluate, as an encoder-decoder does; --mode=generate
fills the sentinels of a span-corruption model's prompt on either topology; an
encoder-decoder trained on a labelled TSV text-to-text evaluates by the accuracy of its
generated label word, in --mode=evaluate and in training (train.label_examples); a mode that cannot serve a run's objective says which it serves.

Each run is tests/test_datasets.py's tiny model on its small local files (4 steps):
the checks are that the modes read the model as its training rows held it, not that
it has learned anything.
"""

import io
import os

import numpy as np
import pytest

from configs import base
from test_commands import _train  # pylint: disable=protected-access
from test_datasets import rows, tiny, write_local_files
from transformer.cli import evaluate as evaluate_mode
from transformer.cli import generate as generate_mode
from transformer.cli import translate as translate_mode
from transformer.config.errors import ConfigError
from transformer.data.tokenizers import sentinels
from transformer.data.tokenizers.vocabularies import BOS_ID, EOS_ID
from transformer.inference import decoding
from transformer.inference import loaded
from transformer.inference import text


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("files")
  return root, write_local_files(root)


def _run(files, name, arch, objective, **data):
  root, paths = files
  config = tiny(base.get_config(), str(root / "tfds"), name=name, path=paths[name],
                tokenizer="bytes", **data)
  config.model.update(arch=arch, objective=objective)
  config.decode.update(beam_size=1, max_length_offset=6, batch_size=4)
  return config, str(root / f"{name}_{arch}_{objective}")


@pytest.fixture(scope="module")
def prefix_translation_run(files):
  """A decoder trained as a prefix LM on translation pairs, BLEU at each evaluation."""
  config, workdir = _run(files, "local_parallel", "decoder", "prefix_lm",
                         source_language="en", target_language="de")
  config.train.bleu_examples = 4
  _train(config, workdir)
  return workdir


@pytest.fixture(scope="module")
def span_runs(files):
  """Span corruption on the local text: an encoder-decoder and a decoder."""
  workdirs = {}
  for arch in ("encoder_decoder", "decoder"):
    config, workdirs[arch] = _run(files, "local_text", arch, "span_corruption")
    config.train.update(num_steps=2, eval_every=2, eval_at_start=False)
    _train(config, workdirs[arch])
  return workdirs


def test_a_decoder_prefix_lm_translates_its_prompt_as_trained(prefix_translation_run,
                                                               tmp_path):
  """In-training BLEU, --mode=translate and --mode=evaluate's BLEU all decode [bos]
  source [eos] as the prefix: translate's lines are decoding.generate's on that prompt."""
  workdir = prefix_translation_run
  assert [r["step"] for r in rows(workdir) if "eval_bleu" in r] == [2, 4]
  lines = ["a cat sees", "dog runs"]  # Within the 16-token source limit.
  out = io.StringIO()
  outputs = translate_mode.translate(workdir, stdin=io.StringIO("\n".join(lines) + "\n"),
                                     stdout=out)
  assert out.getvalue() == "".join(o + "\n" for o in outputs)
  run = loaded.load_run(workdir)
  assert decoding.prompt_is_prefix(run.model_config)
  for line, output in zip(lines, outputs):
    prompt = np.concatenate([[BOS_ID], run.tokenizer.encode(line), [EOS_ID]])
    # The batch's padded source width bounds the steps (rows decode as if alone).
    width = text.bucket_width(len(prompt) - 1, text.source_limit(run.config))
    steps = min(width + 6, run.model_config.max_len - width)
    with run.context():
      ids = np.asarray(decoding.generate(run.model_config, run.params,
                                         prompt[None].astype(np.int32), steps))[0]
    assert output == run.tokenizer.decode(text._until_eos(ids))  # pylint: disable=protected-access
  record = evaluate_mode.evaluate(workdir, max_examples=4, output=str(tmp_path / "e.json"),
                                  stdout=io.StringIO())
  assert record["objective"] == "prefix_lm" and 0 <= record["metrics"]["bleu"] <= 100


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder"])
def test_generate_fills_the_sentinels_of_a_span_corruption_prompt(span_runs, arch):
  """The prompt's <extra_id_0> is the sentinel id (encoder source, or the decoder's
  prefix [bos] ... [eos]); the answer is the decoded ids with sentinels written out."""
  workdir = span_runs[arch]
  prompt = "a <extra_id_0> dog <extra_id_1>"  # Within the 16-token source limit.
  out = io.StringIO()
  [answer] = generate_mode.generate(workdir, [prompt], stdout=out)
  assert out.getvalue() == answer + "\n"
  run = loaded.load_run(workdir)
  count = run.config.train.num_sentinels
  ids = sentinels.encode(run.tokenizer, prompt, count)
  assert sentinels.sentinel_id(run.tokenizer, 0, count) in ids.tolist()
  source = np.append(ids, EOS_ID).astype(np.int32)[None]
  with run.context():
    if arch == "encoder_decoder":
      generated = decoding.generate_seq2seq(run.model_config, run.params, source,
                                            np.ones_like(source), max_length_offset=6)
    else:
      prompt_ids = np.concatenate([[[BOS_ID]], source], axis=1).astype(np.int32)
      width = text.bucket_width(source.shape[1], text.source_limit(run.config))
      generated = decoding.generate(run.model_config, run.params, prompt_ids,
                                    min(width + 6, run.model_config.max_len - width))
  expected = text._until_eos(np.asarray(generated)[0])  # pylint: disable=protected-access
  assert answer == sentinels.decode(run.tokenizer, expected, count)


def test_sentinels_in_an_answer_are_written_as_extra_ids(span_runs):
  run = loaded.load_run(span_runs["encoder_decoder"])
  count = run.config.train.num_sentinels
  ids = [sentinels.sentinel_id(run.tokenizer, 0, count), *run.tokenizer.encode(" sees"),
         sentinels.sentinel_id(run.tokenizer, 1, count), *run.tokenizer.encode(" runs")]
  assert text.decode_ids(run.tokenizer, ids, count) == "<extra_id_0> sees<extra_id_1> runs"
  assert text.sentinel_count(run.config) == count > 0


def test_a_labelled_tsv_text_to_text_evaluates_by_its_label_word(files, tmp_path,
                                                                 monkeypatch):
  """label_accuracy: the share of texts whose generated word is their label's name; in
  training (train.label_examples) the same score of the same texts as --mode=evaluate."""
  config, workdir = _run(files, "local_tsv", "encoder_decoder", "prefix_lm",
                         text_key="sentence", label_key="label")
  config.train.update(num_steps=2, eval_every=2, eval_at_start=False, label_examples=4)
  seen = []

  def answer(model_config, params, tokenizer, texts, decode, policy, **kwargs):
    seen.append(list(texts))  # 'cat' in the text is label 1: answer right for 3 of 4.
    return [" 1 " if "cat" in t else "0" for t in texts[:3]] + ["maybe"] * (len(texts) - 3)

  monkeypatch.setattr(text, "translate_texts", answer)
  _train(config, workdir)
  [row] = [r for r in rows(workdir) if "eval_label_accuracy" in r]
  assert row["step"] == 2
  assert (row["eval_label_accuracy"], row["eval_label_unknown"]) == (0.75, 0.25)
  record = evaluate_mode.evaluate(workdir, max_examples=4, output=str(tmp_path / "e.json"),
                                  stdout=io.StringIO())
  assert len(seen) == 2 and seen[0] == seen[1] and len(seen[1]) == 4
  assert record["metrics"]["label_accuracy"] == 0.75
  assert record["metrics"]["label_unknown"] == 0.25
  assert record["labels"] == ["0", "1"]


def test_a_mode_that_cannot_serve_the_objective_says_which_it_serves(span_runs):
  with pytest.raises(ConfigError) as error:
    translate_mode.translate(span_runs["decoder"], stdin=io.StringIO("a\n"))
  message = str(error.value)
  assert message.startswith("--mode=translate translates sentences: it serves seq2seq "
                            "(encoder_decoder), prefix_lm (encoder_decoder, decoder); ")
  assert "holds a span_corruption model (model.arch='decoder'" in message
  assert "\n" not in message and os.path.isdir(span_runs["decoder"])
