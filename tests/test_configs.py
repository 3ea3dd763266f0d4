"""Every config file builds and validates; bad values fail before compiling, naming the key."""

import glob
import importlib.util
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from transformer import sharding
from transformer.model import objectives
from transformer.config.errors import ConfigError
from transformer.config import objective as objective_lib
from transformer.config.model import ModelConfig, objective_of
from transformer.config.validation import validate
from transformer.model import moe
from transformer.model.models import make_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
                      if not p.endswith("__init__.py"))
# Arguments each preset documents (configs/<name>.py:<arg>).
PRESET_ARGS = {
    "gpt_small": ["", "local", "fineweb"],
    "bert_base": ["", "local", "sst2", "sst2_local", "sst2_local_mlm"],
    "transformer_base": ["", "local", "multi30k"],
    "transformer_big": ["", "local"],
    "shakespeare_char": ["", "cpu", "cpu15", "cpu_2024", "cpu_moe"],
    "llama": ["1b", "1b_fineweb", "7b", "local"],
    "maxtext": ["v5e_16b", "v5p_32b"],
    "t5": ["small", "base", "local"],
    "t5_table2": ["", "multi30k", "sst2"],
}
# Presets whose dataset is read from data.path: validation needs a path to be set.
NEEDS_PATH = ("local_text", "local_parallel", "local_tsv")


def _load(path):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_every_config_builds_and_validates(path):
  name = os.path.basename(path)[:-3]
  module = _load(path)
  for arg in PRESET_ARGS.get(name, [None]):
    config = module.get_config() if arg is None else module.get_config(arg)
    if config.data.name in NEEDS_PATH:
      config.data.path = "/some/files"
    validate(config)
    if config.model.vocab_size == 0:  # Taken from the tokenizer at run time.
      config.model.vocab_size = 128
    model_config = ModelConfig.from_config(config.model)
    objective = objective_lib.resolve(model_config)
    batch = objectives.init_batch(objective, 1, config.data.seq_len)
    shapes = jax.eval_shape(make_model(model_config).init, jax.random.PRNGKey(0),
                            *objectives.model_inputs(objective, batch))
    assert jax.tree.leaves(shapes)


def test_every_preset_is_listed():
  names = {os.path.basename(p)[:-3] for p in CONFIG_FILES} - {"base"}
  assert names == set(PRESET_ARGS)


def _documentation() -> dict[str, str]:
  """README.md and every page under docs/, by path relative to the repository."""
  paths = ["README.md"] + sorted(
      os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
  texts = {}
  for path in paths:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      texts[path] = f.read()
  return texts


def test_documentation_cites_only_existing_configs():
  import re  # pylint: disable=g-import-not-at-top
  cited = set()
  for path, text in _documentation().items():
    cited |= {(path, name) for name in re.findall(r"configs/(\w+)\.py", text)}
  assert {name for _, name in cited}, "the documentation cites no config"
  for path, name in cited:
    assert os.path.exists(os.path.join(ROOT, "configs", f"{name}.py")), (path, name)


def test_documentation_links_resolve():
  """Every relative link of README.md and docs/*.md names a file that exists (and an anchor
  that is one of the target's headings), so the README's map never points nowhere."""
  import re  # pylint: disable=g-import-not-at-top
  texts = _documentation()

  def anchors(text: str) -> set[str]:
    # GitHub's rule: lower case, punctuation other than '-' and '_' dropped, spaces -> '-'.
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}

  links = 0
  for path, text in texts.items():
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"^[a-z]+://", target):
        continue
      file_part, _, anchor = target.partition("#")
      resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
      assert os.path.exists(os.path.join(ROOT, resolved)), (path, target)
      if anchor and resolved.endswith(".md"):
        target_text = texts.get(resolved) or open(os.path.join(ROOT, resolved), encoding="utf-8").read()
        assert anchor in anchors(target_text), (path, target)
      links += 1
  assert links > 20, links  # The README's map alone links every page.


def _base():
  from configs import base  # pylint: disable=g-import-not-at-top
  return base.get_config()


@pytest.mark.parametrize("key,value,message", [
    ("model.num_heads", 3, r"config\.model\.num_heads=3 is invalid: must divide model\.d_model=256"),
    ("optimizer.warmup_steps", -1, r"config\.optimizer\.warmup_steps=-1 is invalid: expected an integer >= 0"),
    ("model.arch", "gpt", r"config\.model\.arch='gpt' is invalid: valid values are 'decoder', 'encoder', 'encoder_decoder'"),
    ("model.head", "mlm", r"config\.model\.head='mlm' is invalid: model\.arch='decoder' supports heads \['classification', 'lm'\]"),
    ("model.position", "rotary", r"valid values are 'learned', 'sinusoidal', 'rope', 'relative', 'alibi', 'none'"),
    ("model.num_kv_heads", 3, r"config\.model\.num_kv_heads=3 .* must divide model\.num_heads=4"),
    ("model.embed_dropout", 1.5, r"expected a probability in \[0, 1\)"),
    ("data.tokenizer", "gpt2", r"config\.data\.tokenizer='gpt2'"),
    ("data.seq_len", 4096, r"config\.data\.seq_len=4096 .* model\.max_len=256"),
    ("optimizer.schedule", "linear", r"config\.optimizer\.schedule='linear'.*'warmup_rsqrt', 'noam'"),
    ("data.packing", "bins", r"config\.data\.packing='bins' is invalid: valid values are 'pack', 'pad'"),
    ("data.overlong", "cut", r"config\.data\.overlong='cut' is invalid: valid values are 'truncate', 'drop'"),
    ("data.val_fraction", 1.5, r"config\.data\.val_fraction=1\.5 is invalid: expected a fraction in \(0, 1\)"),
    ("data.name", "local_text", r"config\.data\.path='' is invalid: data\.name='local_text' builds"),
    ("data.path", "/x", r"config\.data\.path='/x' is invalid: only the local datasets"),
    ("data.source_language", "en", r"config\.data\.target_language='' is invalid: translation needs both"),
    ("data.spm_model_type", "wordpiece", r"config\.data\.spm_model_type='wordpiece'"),
    ("model.vocab_size", -1, r"config\.model\.vocab_size=-1 is invalid: expected an integer >= 0"),
    ("train.steps_per_call", 0, r"config\.train\.steps_per_call=0 is invalid: expected an integer >= 1"),
    ("data.prefetch", -1, r"config\.data\.prefetch=-1 is invalid: expected an integer >= 0"),
    # base: log_every=10, eval_every=200, checkpoint.every=1000.
    ("train.steps_per_call", 4, r"config\.train\.steps_per_call=4 is invalid: train\.log_every=10 is "
     r"not a multiple of it.*a divisor of 10 \(1, 2, 5, 10\)"),
    ("train.steps_per_call", 20, r"steps_per_call=20 is invalid: train\.log_every=10 is not"),
    ("decode.top_p", 0.0, r"config\.decode\.top_p=0\.0 is invalid: expected a probability in \(0, 1\]"),
    ("decode.top_k", 5, r"config\.decode\.top_k=5 is invalid: top_k and top_p only apply when sampling"),
    ("decode.overlong", "cut", r"config\.decode\.overlong='cut' is invalid: valid values are 'truncate', 'error'"),
    ("train.bleu_examples", 10, r"config\.train\.bleu_examples=10 is invalid: BLEU is computed for translation runs"),
    ("train.label_examples", 10, r"config\.train\.label_examples=10 is invalid: label accuracy is computed for a labelled text trained text-to-text"),
    ("train.label_examples", -1, r"config\.train\.label_examples=-1 is invalid: expected an integer >= 0"),
    ("mesh.shape", (("data", -1), ("fsdp", -1), ("tensor", 1)), r"at most one -1"),
])
def test_invalid_values_name_key_value_and_choices(key, value, message):
  config = _base()
  section, field = key.split(".")
  config[section][field] = value
  with pytest.raises(ConfigError, match=message):
    validate(config)


def test_attention_dropout_needs_a_kernel_that_draws_it():
  """xla's kernel has no dropout: refused there; 'auto' (the default) uses the einsum one."""
  config = _base()
  config.model.update(attention_dropout=0.1, attention_impl="xla")
  with pytest.raises(ConfigError, match=r"attention_impl='xla'.*has no dropout"):
    validate(config)
  config.model.attention_impl = "auto"
  validate(config)


def test_samples_need_a_decoder():
  config = _base()
  config.train.sample_prompt = "def "
  validate(config)  # The base config is a decoder LM.
  config.model.update(arch="encoder", head="mlm")
  with pytest.raises(ConfigError, match=r"config\.train\.sample_prompt='def ' is invalid: "
                     r"samples come from a decoder"):
    validate(config)


def test_an_encoder_decoder_samples_its_text_to_text_answers_not_its_translations():
  """train.sample_prompt serves what --mode=generate serves: a text-to-text objective on
  an encoder-decoder answers the prompt; seq2seq (translation pairs) is refused in one
  line that names the objectives which sample."""
  config = _base()
  config.train.sample_prompt = "def "
  config.model.update(arch="encoder_decoder", objective="ul2", vocab_size=0)
  config.data.tokenizer = "bytes"
  validate(config)
  config.model.objective = "seq2seq"
  with pytest.raises(ConfigError, match=r"config\.train\.sample_prompt='def ' is invalid: "
                     r"samples come from a decoder LM .* span_corruption \(encoder_decoder, "
                     r"decoder\).*; not the seq2seq objective") as error:
    validate(config)
  assert "\n" not in str(error.value)


def test_samples_need_a_decoder_lm_not_a_decoder_classifier():
  """A decoder with a classification head has nothing to continue a prompt with: refused
  here (the objective's `generates`), not accepted and then ignored with a warning."""
  config = _base()
  config.train.sample_prompt = "def "
  config.model.update(head="classification", pooling="last")
  config.data.label_key = "label"
  with pytest.raises(ConfigError, match=r"config\.train\.sample_prompt='def ' is invalid: "
                     r"samples come from a decoder LM .* not the classification objective"):
    validate(config)


def test_label_accuracy_needs_a_labelled_text_read_as_pairs():
  """train.label_examples: a prefix LM (either topology) on a labelled text is served; a
  classifier on the same text, or a prefix LM without data.label_key, is refused."""
  config = _base()
  config.train.label_examples = 8
  config.model.objective = "prefix_lm"
  config.data.update(name="local_tsv", path="/x", text_key="sentence", label_key="label")
  validate(config)
  config.model.arch = "encoder_decoder"
  validate(config)
  config.data.label_key = ""
  with pytest.raises(ConfigError, match=r"config\.train\.label_examples=8 is invalid: .* "
                     r"this run: data\.label_key='', the prefix_lm objective"):
    validate(config)
  config.model.update(arch="decoder", objective="auto", head="classification",
                      pooling="last")
  config.data.label_key = "label"
  with pytest.raises(ConfigError, match=r"label_examples=8 is invalid: .* the classification "
                     r"objective of model\.arch='decoder'"):
    validate(config)


def test_sinusoidal_table_must_cover_the_sequence():
  config = _base()
  config.model.position = "sinusoidal"
  config.data.seq_len = config.model.max_len + 1
  with pytest.raises(ConfigError, match=r"config\.data\.seq_len=257 .* with sinusoidal"):
    validate(config)
  config.model.position = "rope"  # No table: any length trains.
  validate(config)


def test_unknown_keys_are_rejected():
  config = _base()
  with pytest.raises(AttributeError):
    config.model.dmodel = 512  # Locked: a typo cannot create a new key.


def test_mesh_shape_must_fit_the_devices():
  config = _base()
  config.mesh.shape = (("data", 3), ("fsdp", 1), ("tensor", -1))
  with pytest.raises(ConfigError, match=r"multiply to 3, which does not divide 8 devices"):
    sharding.make_mesh(config.mesh)


def test_launch_rejects_a_mistyped_override(tmp_path):
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch.py"), "--config=configs/gpt_small.py:local",
       "--config.model.dmodel=512", f"--workdir={tmp_path}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode != 0
  assert "dmodel" in result.stderr
  assert not os.listdir(tmp_path)  # Nothing was started.


def test_unknown_dataset_fails_before_compiling(tiny_config, tmp_path):
  from transformer.training import loop  # pylint: disable=g-import-not-at-top
  tiny_config.data.name = "no_such_dataset_xyz"
  with pytest.raises(ConfigError, match=r"config\.data\.name='no_such_dataset_xyz' is not a TFDS dataset"):
    loop.train_and_evaluate(tiny_config, str(tmp_path / "w"))


def _parameter_shapes(config):
  config.model.vocab_size = 128  # The character tokenizer's 70 ids, rounded up.
  model_config = ModelConfig.from_config(config.model)
  objective = objective_of(model_config.arch, model_config.head)
  batch = objectives.init_batch(objective, 1, config.data.seq_len)
  shapes = jax.eval_shape(make_model(model_config).init, jax.random.PRNGKey(0),
                          *objectives.model_inputs(objective, batch))
  return model_config, shapes["params"]


def _parameter_count(config) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(_parameter_shapes(config)[1]))


def test_the_2024_shakespeare_recipe_has_the_2019_recipes_parameters():
  """The README's 2019-vs-2024 comparison is at equal parameter count (within 0.1%)."""
  module = _load(os.path.join(ROOT, "configs", "shakespeare_char.py"))
  old, new = (_parameter_count(module.get_config(arg)) for arg in ("cpu", "cpu_2024"))
  assert (old, new) == (812_160, 811_392)


def test_the_moe_shakespeare_recipe_has_the_2019_recipes_active_parameters():
  """:cpu_moe (8 half-width experts, top-2) is :cpu's size per token plus the routers."""
  module = _load(os.path.join(ROOT, "configs", "shakespeare_char.py"))
  model_config, shapes = _parameter_shapes(module.get_config("cpu_moe"))
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  routers = 4 * 128 * 8  # Layers x d_model x experts.
  assert moe.active_parameter_count(shapes, model_config) == 812_160 + routers
  assert total == 812_160 + routers + 4 * 3 * (2 * 128 * 512)  # 4 x the dense MLPs.
