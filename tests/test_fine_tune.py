"""Fine-tuning what you import: init_from brings the source run's model and tokenizer.

The imports are tests/fixtures/hf's tiny GPT-2 and BERT (training/fine_tune.py takes
their model.* and tokenizer keys over a preset's; the command line's keys stay).
"""

import io
import json
import os
import re

import numpy as np
import pytest

from configs import bert_base
from configs import gpt_small
from test_bad_inputs import TINY, _launch_in_process, _launch_subprocess
from tiny import make_tiny_config
from transformer.cli import evaluate
from transformer.cli import sweep
from transformer.config.errors import ConfigError
from transformer.config.model import RUN_FIELDS
from transformer.config.validation import validate
from transformer.inference import loaded
from transformer.interop.hf import importer
from transformer.training import fine_tune
from transformer.training import loop
from transformer.workdir import checkpointing

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory) -> str:
  """tests/fixtures/hf/gpt2 imported: d_model 32, 2 layers, mlp 128, max_len 32, einsum
  attention (its dropout), never_predict (0, 2, 3), vocabulary 304."""
  workdir = str(tmp_path_factory.mktemp("imports") / "gpt2_hf")
  importer.import_folder(os.path.join(FIXTURES, "gpt2"), workdir)
  return workdir


def test_the_preset_takes_the_imports_model_but_keeps_the_command_lines_keys(gpt2_run):
  config = gpt_small.get_config("local")  # d_model 256, max_len / seq_len 128.
  config.init_from = gpt2_run
  config.model.mlp_dropout = 0.05  # As --config.model.mlp_dropout=0.05 would.
  line = fine_tune.take_source_model(config, {"model.mlp_dropout"})
  model = config.model
  assert (model.d_model, model.num_layers, model.mlp_dim, model.max_len) == (32, 2, 128, 32)
  assert (model.vocab_size, tuple(model.never_predict)) == (304, (0, 2, 3))
  # The kernel and the regularisation are this run's (the preset's), not the import's
  # einsum attention and dropout 0.1: a GPU fine-tune keeps its fused attention.
  assert model.attention_impl == "auto"
  assert (model.attention_dropout, model.embed_dropout, model.residual_dropout) == (0, 0, 0)
  assert model.mlp_dropout == 0.05  # The command line's.
  assert config.data.seq_len == 32  # The preset's 128 lowered to model.max_len.
  assert "\n" not in line
  assert line.startswith(f"init_from: model and tokenizer from {gpt2_run} (")
  assert "model.d_model, " in line and "data.seq_len=32 (the preset's 128" in line
  assert ("this run's own kernel, layout, precision and regularisation: "
          "model.attention_dropout, model.attention_impl, model.embed_dropout, "
          "model.residual_dropout; set on the command line, kept: model.mlp_dropout)") in line


# A value for every config/model.py RUN_FIELDS key, each other than gpt_small:local's.
RUN_VALUES = {"attention_impl": "einsum", "attention_max_segments": 8, "scan_layers": True,
              "remat": "full", "dtype": "bfloat16", "param_dtype": "bfloat16", "quantization": "fp8",
              "embed_dropout": 0.1, "residual_dropout": 0.1, "attention_dropout": 0.1,
              "mlp_dropout": 0.1, "moe_aux_loss": 0.02, "moe_z_loss": 0.002,
              "moe_router_jitter": 0.01, "mlp_impl": "xla", "loss_head_impl": "xla"}


def test_which_model_keys_come_from_the_source(tmp_path):
  """RUN_FIELDS (how a run computes and regularises) and the task keys stay this run's;
  every other model.* key, what the model is, comes from the source."""
  assert set(RUN_VALUES) == set(RUN_FIELDS)
  source = tmp_path / "source"
  source.mkdir()
  written = gpt_small.get_config("local")
  written.model.update(d_model=64, num_layers=2, position="rope", norm_type="rmsnorm",
                       activation="swiglu", use_bias=False, vocab_size=512, lora_rank=4,
                       num_classes=5, **RUN_VALUES)
  (source / "config.json").write_text(written.to_json_best_effort(), encoding="utf-8")
  config = gpt_small.get_config("local")
  config.init_from = str(source)
  preset = config.model.to_dict()
  fine_tune.take_source_model(config, ())
  stored = loaded.load_config(str(source)).model
  for field, value in config.model.items():
    own = field in RUN_FIELDS or f"model.{field}" in fine_tune.TASK_KEYS or (
        field.startswith("lora_"))
    assert value == (preset[field] if own else stored[field]), field
  assert (config.model.d_model, config.model.position) == (64, "rope")


def test_docs_resume_lists_the_run_fields_with_their_reasons():
  with open(os.path.join(os.path.dirname(FIXTURES), "..", "..", "docs", "resume.md"),
            encoding="utf-8") as f:
    rows = re.findall(r"^\| `model\.(\w+)` \| (\w+) \| (.+) \|$", f.read(), re.MULTILINE)
  assert {field: (kind, why) for field, kind, why in rows} == RUN_FIELDS


def test_a_fine_tune_takes_fine_tuning_optimizer_values_and_says_them(gpt2_run):
  """gpt_small:local pretrains at peak 2e-3 after 50 warmup steps with weight decay 0.1;
  fine-tuning an import with it gets a fine-tuning rate unless asked otherwise."""
  def take(explicit=(), **keys):
    config = gpt_small.get_config("local")
    config.init_from = gpt2_run
    config.train.num_steps = 1000
    for key, value in keys.items():  # section__field, or a top-level field.
      *section, field = key.split("__")
      (config[section[0]] if section else config)[field] = value
    line = fine_tune.take_source_model(config, set(explicit))
    validate(config)
    opt = config.optimizer
    return (opt.schedule, opt.learning_rate, opt.warmup_steps, opt.weight_decay), line

  values, line = take()
  assert values == ("cosine", 5e-5, 30, 0.0)  # Decaying to 0 at step 1000.
  assert line.endswith("; optimizer: fine-tuning values (config.init_from_optimizer="
                       "'fine_tune'): schedule='cosine', learning_rate=5e-05, "
                       "warmup_steps=30, weight_decay=0.0")
  assert take(model__lora_rank=8)[0] == ("cosine", 2e-4, 30, 0.0)  # Adapters start at 0.
  values, line = take({"optimizer.learning_rate"}, optimizer__learning_rate=1e-4)
  assert values == ("cosine", 1e-4, 30, 0.0)
  assert line.endswith("(set on the command line: optimizer.learning_rate)")
  values, line = take(init_from_optimizer="preset")
  assert values == ("warmup_rsqrt", 2e-3, 50, 0.1)
  assert line.endswith("optimizer: the preset's (config.init_from_optimizer='preset'): "
                       "schedule='warmup_rsqrt', learning_rate=0.002, warmup_steps=50, "
                       "weight_decay=0.1")


def test_a_resumed_fine_tune_keeps_the_optimizer_it_started_with(gpt2_run, tmp_path):
  """A resume takes the optimizer from its own config.json: a longer run (a safe change)
  must not move the warmup, 3% of the steps, and so refuse the resume."""
  config = gpt_small.get_config("local")
  config.init_from = gpt2_run
  config.train.num_steps = 1000
  fine_tune.take_source_model(config, ())
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(config.to_json_best_effort(), encoding="utf-8")
  checkpointing.save_params(str(workdir / "checkpoints"), 10, {"kernel": np.zeros(2)})
  again = gpt_small.get_config("local")
  again.init_from = gpt2_run
  again.train.num_steps = 2000
  line = fine_tune.take_source_model(again, {"train.num_steps"}, str(workdir))
  assert again.optimizer.to_dict() == config.optimizer.to_dict()
  assert again.optimizer.warmup_steps == 30  # Not 60.
  assert ("optimizer: this run's own config.json, as it started (a resume): schedule="
          "'cosine', learning_rate=5e-05, warmup_steps=30, weight_decay=0.0") in line


def test_a_classifier_keeps_its_head_over_an_mlm_import(tmp_path):
  """The task keys (head, pooling, classes) are the fine-tuning's: BERT -> SST-2."""
  workdir = str(tmp_path / "bert_hf")
  importer.import_folder(os.path.join(FIXTURES, "bert"), workdir)
  config = bert_base.get_config("sst2_local")
  config.init_from = workdir
  fine_tune.take_source_model(config, ())
  assert (config.model.head, config.model.pooling) == ("classification", "mean")
  assert config.model.pooler and config.model.num_token_types == 2  # The import's.
  fine_tune.check_parameters_fit(config, "")  # The classifier is new; the rest fits.


def test_a_missing_source_is_one_line(tmp_path):
  config = gpt_small.get_config("local")
  config.init_from = str(tmp_path / "nothing")
  with pytest.raises(ConfigError, match=r"config\.init_from='.*nothing' is invalid: .* is "
                     r"not a directory"):
    fine_tune.take_source_model(config, ())


def test_fine_tuning_an_import_starts_at_the_imports_loss(gpt2_run, tfds_data_dir,
                                                          tmp_path):
  """Step 0's evaluation of the fine-tuning run is --mode=evaluate's of the import."""
  text = tmp_path / "text.txt"
  words = "the cat sat on a mat and the dog ran to the red house".split()
  text.write_text("\n".join(" ".join(words[i % 7:] + words[:i % 7]) for i in range(60)),
                  encoding="utf-8")
  config = make_tiny_config(tfds_data_dir)
  config.data.update(name="local_text", path=str(text))
  config.init_from = gpt2_run
  config.train.update(num_steps=1, eval_at_start=True, eval_batches=-1, eval_every=1)
  config.checkpoint.every = 1
  fine_tune.take_source_model(config, ())
  workdir = str(tmp_path / "fine_tune")
  loop.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    step_0 = next(r for r in map(json.loads, f) if r["step"] == 0 and "eval_loss" in r)
  record = evaluate.evaluate(gpt2_run, config=config, output=str(tmp_path / "eval.json"),
                             stdout=io.StringIO())
  assert step_0["eval_tokens"] == record["metrics"]["tokens"]
  assert step_0["eval_loss"] == pytest.approx(record["metrics"]["loss"], rel=1e-6)


def test_an_override_that_cannot_carry_the_parameters_is_refused_creating_nothing(
    gpt2_run, tfds_data_dir, tmp_path, monkeypatch):
  workdir = tmp_path / "refused"
  code, stderr = _launch_in_process(
      [TINY.format(data_dir=tfds_data_dir), f"--workdir={workdir}",
       f"--config.init_from={gpt2_run}", "--config.model.mlp_dim=64"], monkeypatch)
  assert code == 2
  error = stderr.strip().splitlines()[-1]
  assert error.startswith(f"ConfigError: config.init_from='{gpt2_run}' cannot carry its "
                          "parameters into this model: model.mlp_dim=64 (the source's 128) "
                          "changes the shape of 6 of them (first: block_0/mlp/wi/bias")
  assert not workdir.exists()
  assert stderr.count("in the checkpoint but") == 1  # One example, not every parameter.


def _sst2_like(folder):
  """train.tsv / dev.tsv as GLUE's SST-2 has them: a header, sentence<TAB>label."""
  rows = ["a fine film\t1", "dull and long\t0", "the cat is great\t1", "bad red dog\t0"]
  for split in ("train", "dev"):
    (folder / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows * 8) + "\n",
                                         encoding="utf-8")


def _multi30k_like(folder):
  """train / val .en and .de files, one sentence a line, as ../shared/data/multi30k."""
  pairs = [("a dog runs", "ein hund rennt"), ("the house is red", "das haus ist rot"),
           ("two men sit", "zwei manner sitzen")]
  for split in ("train", "val"):
    for side, language in enumerate(("en", "de")):
      (folder / f"{split}.{language}").write_text(
          "\n".join(p[side] for p in pairs * 8) + "\n", encoding="utf-8")


# docs/huggingface.md's fine-tuning recipes, with the tiny fixtures for the hub folders.
RECIPES = {
    "gpt2_on_local_text": ("gpt2", "configs/gpt_small.py:local", "text.txt",
                           ["--config.data.name=local_text"]),
    "bert_on_sst2": ("bert", "configs/bert_base.py:sst2_local", "sst2", []),
    "marian_on_multi30k": ("marian", "configs/transformer_base.py:multi30k", "multi30k", []),
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_docs_fine_tuning_recipes_run(recipe, tfds_data_dir, tmp_path):
  family, preset, data, extra = RECIPES[recipe]
  source = str(tmp_path / f"{family}_hf")
  importer.import_folder(os.path.join(FIXTURES, family), source)
  path = tmp_path / data
  if data == "text.txt":
    path.write_text("the cat sat on the mat\n" * 200, encoding="utf-8")
  else:
    path.mkdir()
    (_sst2_like if data == "sst2" else _multi30k_like)(path)
  code, output = _launch_subprocess(
      [f"--config={preset}", f"--config.init_from={source}", f"--config.data.path={path}",
       f"--config.data.data_dir={tfds_data_dir}", f"--workdir={tmp_path / 'run'}",
       "--config.train.num_steps=2", "--config.train.steps_per_call=1",
       "--config.train.eval_every=2", "--config.checkpoint.every=2", *extra])
  assert code == 0, output[-3000:]
  assert f"init_from: model and tokenizer from {source}" in output
  assert " 0 dropped" in output or family == "bert"  # BERT drops its MLM head.
  assert "Run summary: step 2/2 (finished)" in output


def test_a_sweeps_runs_take_the_source_model_and_keep_their_swept_keys(gpt2_run):
  config = gpt_small.get_config("local")
  config.init_from = gpt2_run
  runs = sweep.build_runs(config, "model.embed_dropout=0.0,0.2")
  assert [r.config.model.embed_dropout for r in runs] == [0.0, 0.2]
  assert all(r.config.model.d_model == 32 and r.config.data.seq_len == 32 for r in runs)


def test_a_fine_tune_of_an_import_says_only_what_applies(gpt2_run, tfds_data_dir, caplog):
  """A fresh import records its tokenizer's identity (no "used unchecked" line on any use),
  and "config.data.tokenizer=... is not used" comes only for a value the command line
  set, naming it (an import's config.json holds the base's 'sentencepiece' beside its
  Hugging Face vocabulary: no user chose it)."""
  from transformer.data import sources  # pylint: disable=g-import-not-at-top
  def messages(explicit, **data):
    config = make_tiny_config(tfds_data_dir)
    config.init_from = gpt2_run
    config.data.update(data)
    fine_tune.take_source_model(config, explicit)
    caplog.clear()
    with caplog.at_level("INFO"):
      sources.load_sources(config, gpt2_run)
    return [r.getMessage() for r in caplog.records]
  said = messages(set())
  assert not [m for m in said if "is not used" in m or "identity" in m], said
  said = messages({"data.tokenizer"}, tokenizer="bytes")
  assert [m for m in said if "is not used" in m] == [
      f"config.data.tokenizer='bytes' is not used: the run keeps the huggingface "
      f"vocabulary of {gpt2_run}"]
  assert not [m for m in said if "identity" in m], said


def test_a_reading_mode_names_the_imports_real_vocabulary(gpt2_run, caplog):
  """--mode=evaluate on an import with a preset's --config: the warning names the run's
  real vocabulary (Hugging Face), not config.json's 'sentencepiece' field, and says
  nothing of data.spm_* (which only a SentencePiece vocabulary has)."""
  config = gpt_small.get_config("local")
  config.data.seq_len = 32  # The import's context.
  with caplog.at_level("WARNING"):
    loaded.load_config(gpt2_run, config)
  said = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
  assert said == ["config.data.tokenizer='bytes' (the given --config's) is not used: the "
                  "run's own huggingface vocabulary (tokenizer.json) is"], said
