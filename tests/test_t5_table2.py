"""configs/t5_table2.py and its sweep files: T5 Table 2's six arms validate as one sweep,
each the topology and objective the docstring's table names, all reading the same
token positions a row; the fine-tuning sweep names exactly those runs, and each
fine-tune takes its arm's model and keeps the paper's accounting."""

import json
import os

import pytest

from configs import t5_table2
from transformer.cli import sweep_spec
from transformer.config import objective as objective_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The fine-tuning sweeps: the six arms, then the seeds of the pretraining list's repeats.
FINE_TUNE_LISTS = ("t5_table2_finetune.json", "t5_table2_finetune_seeds.json")
# (model.arch, objective, whether the decoder reads a bidirectional prefix)
ARMS = [("encoder_decoder", "span_corruption", False), ("encoder_decoder", "prefix_lm", False),
        ("decoder", "span_corruption", False), ("decoder", "causal_lm", False),
        ("decoder", "span_corruption", True), ("decoder", "prefix_lm", True)]


def _arms():
  config = t5_table2.get_config()
  config.data.path = "input.txt"  # Validation reads no file.
  return sweep_spec.build_runs(config, os.path.join(ROOT, "configs", "t5_table2.json"))


def _shape(arm) -> tuple:
  objective = objective_lib.resolve(arm.config.model)
  return arm.config.model.arch, objective.name, "prefix" in objective.model_inputs


def test_the_arms_are_one_sweep_of_equal_tokens():
  arms = _arms()
  # The six arms first, in the table's order; any seeds after them repeat an arm.
  assert [_shape(arm) for arm in arms[:6]] == ARMS
  for arm in arms:
    objective = objective_lib.resolve(arm.config.model)
    assert objective.sides * arm.config.data.seq_len == 128, arm.label
    assert arm.config.model.num_layers == 2 and arm.config.model.position == "relative"
    assert arm.config.data.tokenizer == "bytes" and arm.config.model.vocab_size == 384
    if arm.config.model.arch == "encoder_decoder":  # L + L layers: 2P.
      assert arm.config.model.num_decoder_layers in (0, 2)
  assert len({arm.name for arm in arms}) == len(arms)
  assert {_shape(arm) for arm in arms[6:]} <= set(ARMS)


@pytest.mark.parametrize("task", sorted(t5_table2.TASKS))
def test_each_arm_fine_tunes_on_each_task_from_its_own_run(task, tmp_path, monkeypatch):
  """The fine-tuning lists name the pretraining sweep's workdirs, each once (made here
  with their config.json), and each fine-tune takes its arm's topology with the paper's
  accounting: 256 positions a row, the LM arms causal throughout."""
  arms = _arms()
  for arm in arms:
    folder = tmp_path / "runs" / "t5_table2" / arm.name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(arm.config.to_json_best_effort())
  monkeypatch.chdir(tmp_path)
  config = t5_table2.get_config(task)
  config.data.path = "/some/files"
  runs = [run for name in FINE_TUNE_LISTS for run in sweep_spec.build_runs(
      config, os.path.join(ROOT, "configs", name))]
  sources = {os.path.join("runs", "t5_table2", arm.name): arm for arm in arms}
  assert sorted(run.config.init_from for run in runs) == sorted(sources)
  for run in runs:
    source = sources[run.config.init_from]
    objective = objective_lib.resolve(run.config.model)
    assert objective.name == "prefix_lm" and run.config.model.arch == source.config.model.arch
    assert objective.sides * run.config.data.seq_len == 256, run.label
    causal = source.config.model.arch == "decoder" and (
        source.config.model.prefix_attention == "causal"
        or objective_lib.resolve(source.config.model).name == "causal_lm")
    assert ("prefix" not in objective.model_inputs) == (
        run.config.model.arch == "encoder_decoder" or causal), run.label
    assert run.config.seed == source.config.seed, run.label
    if task == "sst2":
      assert run.config.train.label_examples > 0 and not run.config.train.bleu_examples
    else:
      assert run.config.train.bleu_examples > 0 and not run.config.train.label_examples


def test_an_unknown_argument_names_the_valid_ones():
  with pytest.raises(ValueError, match=r"unknown argument 'glue'; valid: '' .* 'multi30k', "
                     r"'sst2'"):
    t5_table2.get_config("glue")


def test_the_sweep_files_are_lists_of_runs():
  for name in ("t5_table2.json", "t5_table2_lm_seeds.json", "t5_table2_lm_seeds_finetune.json"
               ) + FINE_TUNE_LISTS:
    with open(os.path.join(ROOT, "configs", name), encoding="utf-8") as f:
      runs = json.load(f)
    assert isinstance(runs, list) and all(isinstance(run, dict) for run in runs)


def test_the_lm_seeds_repeat_the_two_best_lm_arms_and_their_fine_tunes_name_them(tmp_path,
                                                                                 monkeypatch):
  """configs/t5_table2_lm_seeds.json (its own sweep folder, runs/t5_table2_lm_seeds): seeds
  1 and 2 of the encoder-decoder and the prefix LM with the LM objective; the fine-tuning
  list names exactly those runs, each with its seed and its arm's topology."""
  config = t5_table2.get_config()
  config.data.path = "input.txt"
  seeds = sweep_spec.build_runs(config, os.path.join(ROOT, "configs", "t5_table2_lm_seeds.json"))
  assert sorted((_shape(arm), arm.config.seed) for arm in seeds) == sorted(
      (arm, seed) for arm in (ARMS[1], ARMS[5]) for seed in (1, 2))
  for arm in seeds:
    folder = tmp_path / "runs" / "t5_table2_lm_seeds" / arm.name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(arm.config.to_json_best_effort())
  monkeypatch.chdir(tmp_path)
  fine_tune = t5_table2.get_config("multi30k")
  fine_tune.data.path = "/some/files"
  runs = sweep_spec.build_runs(
      fine_tune, os.path.join(ROOT, "configs", "t5_table2_lm_seeds_finetune.json"))
  sources = {os.path.join("runs", "t5_table2_lm_seeds", arm.name): arm for arm in seeds}
  assert sorted(run.config.init_from for run in runs) == sorted(sources)
  for run in runs:
    source = sources[run.config.init_from]
    assert run.config.seed == source.config.seed
    assert run.config.model.arch == source.config.model.arch
    assert objective_lib.resolve(run.config.model).sides * run.config.data.seq_len == 256
