"""--mode=compile's input side (planning/input_rate.py): this host's pipeline measured
and set beside the step's token demand per host. The report around it is in
test_compile_mode.py (test_too_large_is_reported_not_fitting)."""

import os

import pytest

from transformer.data import pipeline
from transformer.data import sources
from transformer.data.datasets import catalog
from transformer.planning import input_rate


def test_the_training_pipeline_is_measured_in_tokens_as_the_step_counts_them(tiny_config):
  sources.load_sources(tiny_config)  # Built, as a training run of the config would.
  rate = input_rate.measure(tiny_config, hosts=2, seconds=0.2)
  assert rate.error is None and rate.hosts == 2 and rate.local_batch_size == 4
  assert rate.batches >= 1 and rate.seconds > 0 and rate.first_batch_seconds > 0
  # Rows x seq_len, as the step counts its tokens (one side: a decoder LM).
  assert rate.tokens_per_second == pytest.approx(rate.batches * 4 * 32 / rate.seconds)


def test_a_pipeline_slower_than_the_demand_is_called_input_bound():
  rate = input_rate.InputRate(hosts=2, local_batch_size=4, tokens_per_second=1000.0,
                              batches=10, seconds=3.0, first_batch_seconds=0.5)
  bound = input_rate.lines(rate, demand_tokens_per_second=6000.0)  # 3000 per host.
  assert "INPUT-BOUND" in bound[1] and "~3,000 tokens/s per host, 3.0x" in bound[1]
  keeps_up = input_rate.lines(rate, demand_tokens_per_second=1000.0)
  assert "INPUT-BOUND" not in "\n".join(keeps_up) and "50% of what" in keeps_up[1]
  assert input_rate.to_json(rate, 6000.0)["input_bound"] is True
  assert input_rate.to_json(rate, 1000.0)["demand_ratio"] == pytest.approx(0.5)
  assert input_rate.lines(rate, None)[1] == "  (no train-step estimate to set it beside)"


def test_data_that_is_not_there_is_said_in_one_line_not_measured(tiny_config):
  tiny_config.data.update(name="lm1b", download=False)
  rate = input_rate.measure(tiny_config, hosts=1, seconds=0.2)
  assert rate.tokens_per_second is None
  (line,) = input_rate.lines(rate, 1000.0)
  assert line.startswith("Input: not measured: ConfigError: config.data.name='lm1b' is not "
                         "prepared")


def test_what_the_run_has_not_built_is_never_built_to_time_it(tiny_config, tmp_path):
  """llama:1b trained a 128,256-piece SentencePiece here and ended in a traceback; :7b
  spent 2m40s on a 32k one. Not prepared or not trained: one line, nothing built."""
  tiny_config.data.data_dir = str(tmp_path / "fresh")
  rate = input_rate.measure(tiny_config, hosts=1, seconds=0.2)
  (line,) = input_rate.lines(rate, 1000.0)
  assert line.startswith("Input: not measured: the dataset 'python_stdlib' is not prepared "
                         "yet"), line
  assert "a training run (or --mode=prepare for a corpus) builds it" in line
  assert input_rate.to_json(rate, 1000.0)["skipped"] == rate.skipped
  assert not catalog.find_builder(tiny_config.data).is_prepared()

  sources.load_sources(tiny_config)  # The dataset (bytes: no vocabulary) as a run builds it.
  tiny_config.data.update(tokenizer="sentencepiece", spm_vocab_size=128256)
  tiny_config.model.vocab_size = 0
  rate = input_rate.measure(tiny_config, hosts=1, seconds=0.2)
  assert rate.skipped.startswith("its sentencepiece vocabulary of 128,256 pieces is not built "
                                 "yet ("), rate.skipped
  assert not [name for name in os.listdir(catalog.find_builder(tiny_config.data).data_dir)
              if name.endswith(".model")]


def test_a_pipeline_that_fails_is_one_line_of_the_report(tiny_config, monkeypatch):
  sources.load_sources(tiny_config)

  def fails(*args, **kwargs):
    raise RuntimeError("INTERNAL: src/trainer_interface.cc(744) Vocabulary size too high\n"
                       + "  a native stack\n" * 30)

  monkeypatch.setattr(pipeline, "make_dataset", fails)
  rate = input_rate.measure(tiny_config, hosts=1, seconds=0.2)
  assert input_rate.lines(rate, 1000.0) == [
      "Input: not measured: the pipeline failed: RuntimeError: INTERNAL: "
      "src/trainer_interface.cc(744) Vocabulary size too high"]
