"""config.init_from: start a run from another run's parameters, matched by path."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn

from configs import bert_base
from tiny import make_tiny_config
from transformer.workdir import init_from
from transformer.model import objectives
from transformer import sharding
from transformer.training import loop
from transformer.training import trainer as trainer_lib
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig, objective_of
from transformer.config.validation import validate
from transformer.model.models import make_model


def _tree(leaves: dict) -> dict:
  """Nested dicts from {"module/.../name": leaf}."""
  tree = {}
  for path, leaf in leaves.items():
    *modules, name = path.split("/")
    node = tree
    for module in modules:
      node = node.setdefault(module, {})
    node[name] = leaf
  return tree


def _flat(tree) -> dict:
  return {jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _shapes(shapes: dict, dtype=jnp.float32) -> dict:
  return _tree({k: jax.ShapeDtypeStruct(v, dtype) for k, v in shapes.items()})


# ---------------------------------------------------------------- matching and merging


def test_match_lists_loaded_new_and_dropped_by_top_level_module():
  """An MLM-pretrained encoder fine-tuned with a classification head."""
  encoder = {"block_0/attention/query/kernel": (8, 2, 4), "block_0/mlp/wi/kernel": (8, 16),
             "final_norm/scale": (8,)}
  target = _shapes({**encoder, "classifier/kernel": (8, 3), "classifier/bias": (3,)})
  source = _shapes({**encoder, "mlm_head/kernel": (8, 100), "mlm_head/bias": (100,)})
  match = init_from.match_params(target, source)
  assert match.loaded == ("block_0/attention/query/kernel", "block_0/mlp/wi/kernel",
                          "final_norm/scale")
  assert match.new == ("classifier/bias", "classifier/kernel")
  assert match.dropped == ("mlm_head/bias", "mlm_head/kernel")
  assert match.loaded_values == 64 + 128 + 8
  summary = match.summary()
  assert "3 parameters loaded (200 values), 2 new (initialised), 2 dropped" in summary
  assert "loaded:  block_0 (2); final_norm (1)" in summary
  assert "new:     classifier (2): bias, kernel" in summary
  assert "dropped: mlm_head (2): bias, kernel" in summary


def test_an_mlm_encoder_fine_tunes_into_a_classifier():
  """The real parameter names: the encoder carries over, the MLM head is dropped."""
  def param_shapes(head, **model):
    config = bert_base.get_config("local")
    config.model.update(head=head, **model)
    model_config = ModelConfig.from_config(config.model)
    objective = objective_of(model_config.arch, model_config.head)
    batch = objectives.init_batch(objective, 1, config.data.seq_len)
    return nn.unbox(jax.eval_shape(make_model(model_config).init, jax.random.PRNGKey(0),
                                   *objectives.model_inputs(objective, batch))["params"])

  classifier = param_shapes("classification", pooling="cls", num_classes=3)
  match = init_from.match_params(classifier, param_shapes("mlm"))
  assert {p.split("/")[0] for p in match.new} == {"classification_head"}
  assert match.dropped and all(p.startswith("mlm_") for p in match.dropped)
  assert len(match.loaded) == len(jax.tree.leaves(classifier)) - len(match.new)


def test_shape_mismatch_names_the_path_and_both_shapes():
  target = _shapes({"block_0/mlp/wi/kernel": (32, 128), "embedder/embedding": (384, 32)})
  source = _shapes({"block_0/mlp/wi/kernel": (32, 64), "embedder/embedding": (384, 32)})
  with pytest.raises(ConfigError, match=r"config\.init_from='/runs/a' is invalid: .*"
                     r"block_0/mlp/wi/kernel is \(32, 64\) float32 in the checkpoint but "
                     r"\(32, 128\) float32 in this model"):
    init_from.match_params(target, source, "/runs/a")


def test_float_widths_convert_but_int_and_float_do_not_mix():
  source = _shapes({"dense/kernel": (4, 4)}, jnp.float32)
  match = init_from.match_params(_shapes({"dense/kernel": (4, 4)}, jnp.bfloat16), source)
  assert match.loaded == ("dense/kernel",)
  with pytest.raises(ConfigError, match=r"dense/kernel is \(4, 4\) float32 .* \(4, 4\) int32"):
    init_from.match_params(_shapes({"dense/kernel": (4, 4)}, jnp.int32), source)


def test_nothing_in_common_is_an_error():
  with pytest.raises(ConfigError, match=r"shares no parameter path .*encoder \(1\)"):
    init_from.match_params(_shapes({"decoder/kernel": (2,)}),
                               _shapes({"encoder/kernel": (2,)}))


def test_merge_takes_loaded_values_and_keeps_the_rest():
  params = _tree({"block_0/kernel": np.zeros((2, 2)), "lm_head/kernel": np.ones((2, 3))})
  merged = init_from.merge_params(params, _tree({"block_0/kernel": np.full((2, 2), 7.0)}))
  assert jax.tree.structure(merged) == jax.tree.structure(params)
  np.testing.assert_array_equal(merged["block_0"]["kernel"], np.full((2, 2), 7.0))
  assert merged["lm_head"]["kernel"] is params["lm_head"]["kernel"]
  with pytest.raises(ValueError, match="not in the model: .*'mlm_head/kernel'"):
    init_from.merge_params(params, _tree({"mlm_head/kernel": np.zeros(2)}))


def test_init_from_must_be_a_string(tiny_config):
  tiny_config.init_from = None
  with pytest.raises(ConfigError, match=r"config\.init_from=None is invalid: expected ''"):
    validate(tiny_config)


@pytest.mark.parametrize("key,value,valid", [
    ("init_from_partial", None, "expected True or False"),
    ("init_from_optimizer", "adam", "valid values are 'fine_tune', 'preset'")])
def test_init_from_options_are_checked(tiny_config, key, value, valid):
  tiny_config[key] = value
  with pytest.raises(ConfigError, match=rf"config\.{key}={value!r} is invalid: {valid}"):
    validate(tiny_config)


# ---------------------------------------------------------------- end to end


def _quick(config, num_steps):
  """One layer, no step-0 eval, one eval batch at the end, a checkpoint after every step."""
  config.model.num_layers = 1
  config.train.update(num_steps=num_steps, eval_at_start=False, eval_every=1000,
                      eval_batches=1)
  config.checkpoint.update(every=1)
  return config


def _restore_raw(workdir, step):
  return ocp.StandardCheckpointer().restore(
      os.path.join(os.path.abspath(workdir), "checkpoints", str(step), "state"))


def _train_steps(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [r["step"] for r in map(json.loads, f) if "loss" in r]


@pytest.fixture(scope="module")
def source_run(tfds_data_dir, tmp_path_factory) -> str:
  """Run A: a tiny decoder LM (tied embeddings), 2 steps, checkpoints at 1 and 2."""
  workdir = str(tmp_path_factory.mktemp("source"))
  loop.train_and_evaluate(_quick(make_tiny_config(tfds_data_dir), 2), workdir)
  return workdir


def _fine_tune_config(tfds_data_dir, init_from, num_steps):
  config = _quick(make_tiny_config(tfds_data_dir), num_steps)
  config.model.tie_embeddings = False  # So lm_head/kernel comes from the embedding.
  config.init_from = init_from
  return config


def test_fine_tune_starts_from_the_source_params_at_step_0(source_run, tfds_data_dir,
                                                           tmp_path, monkeypatch, caplog):
  step_0_params = []
  evaluate = trainer_lib.evaluate_split

  def spy(trainer, params, *args):  # The step-0 eval sees the params training starts from.
    step_0_params.append(_flat(jax.device_get(params)))
    return evaluate(trainer, params, *args)

  monkeypatch.setattr(loop, "evaluate_split", spy)  # The name the loop calls.
  config = _fine_tune_config(tfds_data_dir, source_run, num_steps=1)
  config.train.eval_at_start = True
  workdir = str(tmp_path / "fine_tune")
  # At absl's logger too: a level another test in this worker left on it must not hide
  # the INFO lines checked below.
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    loop.train_and_evaluate(config, workdir)

  source = _flat(_restore_raw(source_run, 2)["params"])  # The newest: step 2.
  start = step_0_params[0]
  assert set(start) - set(source) == {"lm_head/kernel"}
  for path, value in source.items():
    np.testing.assert_array_equal(start[path], value, err_msg=path)
  # Untying a tied source: the new lm_head starts as its embedding, the same logits.
  np.testing.assert_array_equal(start["lm_head/kernel"],
                                source["embedder/token_embed/embedding"].T)
  assert f"{len(source) + 1} parameters loaded" in caplog.text
  assert "new:     (none)" in caplog.text
  assert ("untied: lm_head/kernel starts as the source's tied "
          "embedder/token_embed/embedding, transposed") in caplog.text
  # The step and the optimizer state started fresh: one update in, every count is 1.
  assert _train_steps(workdir) == [1]
  state = _restore_raw(workdir, 1)
  assert int(state["step"]) == 1
  counts = [v for k, v in _flat(state["opt_state"]).items() if k.endswith("count")]
  assert counts and all(int(c) == 1 for c in counts)

  # Rerunning the (finished) command loads nothing from init_from: the run is complete.
  caplog.clear()
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    loop.train_and_evaluate(_fine_tune_config(tfds_data_dir, source_run, num_steps=1),
                             workdir)
  assert f"{workdir} is already complete: its checkpoint 1" in caplog.text
  assert "parameters loaded" not in caplog.text
  assert _train_steps(workdir) == [1]


def test_init_from_a_checkpoint_directory_reads_that_step(source_run, tfds_data_dir):
  config = _fine_tune_config(tfds_data_dir, "", num_steps=2)
  config.mesh.shape = (("data", 2), ("fsdp", 4), ("tensor", 1))  # Not the source's mesh.
  trainer = trainer_lib.Trainer.create(config, sharding.make_mesh(config.mesh))
  abstract = trainer.abstract_state.params
  step_1 = os.path.join(source_run, "checkpoints", "1")
  with trainer.context():
    loaded, match = init_from.load_params(step_1, abstract)
  assert match.new == ("lm_head/kernel",) and not match.dropped
  expected = _flat(_restore_raw(source_run, 1)["params"])
  assert set(_flat(loaded)) == set(expected)
  for path, value in _flat(loaded).items():
    np.testing.assert_array_equal(value, expected[path], err_msg=path)
  assert not np.array_equal(expected["block_0/mlp/wi/kernel"],
                            _flat(_restore_raw(source_run, 2)["params"])["block_0/mlp/wi/kernel"])
  # Read straight into this run's shardings.
  for (_, array), (_, target) in zip(jax.tree_util.tree_leaves_with_path(loaded["block_0"]),
                                     jax.tree_util.tree_leaves_with_path(abstract["block_0"])):
    assert array.sharding == target.sharding


def test_shape_mismatch_stops_before_training(source_run, tfds_data_dir, tmp_path):
  config = _fine_tune_config(tfds_data_dir, source_run, num_steps=1)
  config.model.mlp_dim = 128
  workdir = str(tmp_path / "mismatch")
  with pytest.raises(ConfigError, match=r"model.mlp_dim=128 \(the source's 64\).* change the "
                     r"shape of 3 of them \(first: block_0/mlp/wi/bias is \(64,\) float32 in "
                     r"the checkpoint but \(128,\) float32"):
    loop.train_and_evaluate(config, workdir)
  assert not os.path.exists(os.path.join(workdir, "checkpoints", "1"))


def test_bad_paths_say_what_is_expected(source_run, tmp_path):
  abstract = _shapes({"block_0/mlp/wi/kernel": (32, 64)})
  empty_checkpoints = tmp_path / "no_steps"
  (empty_checkpoints / "checkpoints").mkdir(parents=True)
  no_state = tmp_path / "run" / "checkpoints" / "7"
  no_state.mkdir(parents=True)
  for path, problem in [(tmp_path / "missing", "is not a directory"),
                        (empty_checkpoints, r"checkpoints holds no complete checkpoint"),
                        (tmp_path / "run", r"its newest checkpoint .*/7 has no 'state' item"),
                        (no_state, r"/7 has neither a checkpoints/ folder nor a 'state' item"),
                        (os.path.join(source_run, "checkpoints"), r"neither")]:
    with pytest.raises(ConfigError, match=rf"config\.init_from='{path}' is invalid: .*"
                       rf"{problem}.*expected a run's workdir"):
      init_from.load_params(str(path), abstract)
