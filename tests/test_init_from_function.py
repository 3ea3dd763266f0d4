"""init_from keeps the source's function: step 0 computes the source's logits.

Every LoRA difference between source and new run (alpha, rank, targets, adapters on or
off) and either layer layout (scanned, per-layer) converts; what cannot carry the
parameters is refused in one line naming the keys, unless config.init_from_partial.
The sources are written directly (random parameters, adapters' A and B both random,
so a wrong factor shows), without training: each case takes about a second.
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import linen as nn

from tiny import make_tiny_config
from transformer import sharding
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.inference import loaded
from transformer.model.models import make_model
from transformer.training import fine_tune
from transformer.training import trainer as trainer_lib
from transformer.workdir import checkpointing
from transformer.workdir import init_from
from transformer.workdir import layout

IDS = np.asarray([[5, 9, 2, 7, 11, 3, 8, 1]], np.int32)
INPUTS = (IDS, np.ones_like(IDS), np.arange(IDS.shape[1], dtype=np.int32)[None])


def _config(**model):
  """The tiny decoder (2 layers, d_model 32), no dropout, the model.* fields given."""
  config = make_tiny_config("")
  config.model.update(**model)
  return config


def _source(tmp_path, config, seed=0) -> tuple[str, dict]:
  """A source run's workdir (config.json, checkpoint 0) holding random parameters."""
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32),
                        nn.unbox(trainer_lib.abstract_params(config)))
  workdir = tmp_path / "source"
  workdir.mkdir()
  (workdir / layout.CONFIG).write_text(config.to_json_best_effort(indent=2), encoding="utf-8")
  checkpointing.save_params(str(workdir / layout.CHECKPOINTS), 0, params)
  return str(workdir), params


def _logits(config, params) -> np.ndarray:
  model = make_model(dataclasses.replace(ModelConfig.from_config(config.model),
                                         deterministic=True))
  return np.asarray(jax.jit(model.apply)({"params": params}, *INPUTS))


def _start(config) -> tuple[dict, init_from.ParamMatch]:
  """What the training loop starts from: a fresh init with init_from's values over it."""
  fine_tune.check_parameters_fit(config, "")  # launch.py's check, before any workdir.
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  abstract = loaded.abstract_params(config, mesh)
  # Inside the mesh and rules, as the loop loads (Trainer.context).
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.rules_of(config.mesh, mesh)):
    loaded_params, match = fine_tune.load_source_params(config, abstract)
  # Zeros for what init_from leaves new (adapters' B starts at zero: A is then moot).
  fresh = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype),
                       nn.unbox(trainer_lib.abstract_params(config)))
  return init_from.merge_params(fresh, loaded_params), match


LORA = {"lora_rank": 4, "lora_alpha": 4.0}
# (source model.*, new run model.*): each a LoRA difference init_from must carry over.
CASES = {
    "alpha": (LORA, {"lora_rank": 4}),  # The new run's default alpha 16: B times 1/4.
    "rank": (LORA, {"lora_rank": 8}),  # Folded into the kernels; new adapters at B = 0.
    "targets": (LORA, {"lora_rank": 4, "lora_targets": ("query", "value")}),
    "lora_off": (LORA, {}),  # Folded into the kernels.
    "lora_on": ({}, {"lora_rank": 4}),  # New adapters at B = 0.
    "scanned_to_unrolled": ({"scan_layers": True}, {}),
    "unrolled_to_scanned": ({}, {"scan_layers": True}),
    "lora_unrolled_to_scanned": ({}, {"scan_layers": True, "lora_rank": 4}),
    "lora_scanned_to_unrolled_alpha": ({"scan_layers": True, **LORA}, {"lora_rank": 4}),
    "lora_scanned_rank_to_scanned": ({"scan_layers": True, **LORA},
                                     {"scan_layers": True, "lora_rank": 2}),
}
SLOW = ("lora_scanned_rank_to_scanned",)  # Two scanned LoRA models: ~5 s on two cores.


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW
                                  else c for c in sorted(CASES)])
def test_step_0_computes_the_sources_logits(tmp_path, case):
  source_model, run_model = CASES[case]
  source_config = _config(**source_model)
  workdir, source_params = _source(tmp_path, source_config)
  config = _config(**run_model)
  config.init_from = workdir
  params, match = _start(config)
  expected = _logits(source_config, source_params)
  np.testing.assert_allclose(_logits(config, params), expected, rtol=2e-5, atol=2e-5)
  assert np.abs(expected).max() > 0.1  # Logits worth comparing.
  assert not match.dropped  # Every stored value went somewhere (adapters: folded in).


def test_the_log_says_how_adapters_and_layouts_were_carried(tmp_path):
  workdir, _ = _source(tmp_path, _config(scan_layers=True, **LORA))
  config = _config(lora_rank=4, lora_targets=("query", "value"))
  config.init_from = workdir
  summary = _start(config)[1].summary()
  assert "layout: the source's scanned layers split into this model's per-layer" in summary
  assert ("LoRA: 8 of the source's adapters folded into their kernels with its alpha / r = "
          "1") in summary  # key, out, wi, wo of both layers.
  assert ("LoRA: 4 adapters continue from the source's with B times 0.25 (the source's "
          "alpha / r = 1, this run's 4)") in summary


@pytest.mark.parametrize("layers,what", [(3, r"leaves 16 of this model's parameters new .*"
                                              r"first: block_2/mlp/wi/bias"),
                                         (1, r"leaves 16 of the source's dropped .*first: "
                                              r"block_1/mlp/wi/bias")])
def test_another_depth_is_refused_naming_the_key_unless_partial(tmp_path, layers, what):
  workdir, source_params = _source(tmp_path, _config())
  config = _config(num_layers=layers)
  config.init_from = workdir
  with pytest.raises(ConfigError, match=(
      rf"config.init_from='{workdir}' cannot carry its parameters into this model: "
      rf"model.num_layers={layers} \(the source's 2\) {what}\), beyond a new head and LoRA "
      r"adapters; .*--config.init_from_partial=True")):
    _start(config)
  config.init_from_partial = True
  params, match = _start(config)
  assert "config.init_from_partial=True: " in match.summary()
  kept = [f"block_{i}" for i in range(min(layers, 2))] + ["embedder", "final_norm"]
  for module in kept:
    jax.tree.map(np.testing.assert_array_equal, params[module], source_params[module])


def test_a_scanned_stack_partly_in_the_source_is_refused(tmp_path):
  workdir, _ = _source(tmp_path, _config())
  config = _config(num_layers=3, scan_layers=True)
  config.update(init_from=workdir, init_from_partial=True)
  with pytest.raises(ConfigError, match=r"this model stacks 3 layers in blocks/.* and only 2 "
                     r"of them come from the source; .*--config.model.scan_layers=False"):
    _start(config)


def test_a_reshaped_parameter_is_initialised_with_partial(tmp_path):
  workdir, _ = _source(tmp_path, _config())
  config = _config(mlp_dim=128)
  config.update(init_from=workdir, init_from_partial=True)
  _, match = _start(config)
  assert "block_0/mlp/wi/kernel" in match.new and "6 reshaped" in match.summary()


def test_a_new_head_needs_no_flag(tmp_path):
  """The task keys' parameters may be new (the classifier) without init_from_partial."""
  workdir, _ = _source(tmp_path, _config())
  config = _config(head="classification", pooling="last", num_classes=3)
  config.init_from = workdir
  _, match = _start(config)
  assert {p.split("/")[0] for p in match.new} == {"classification_head"}
  assert not match.dropped


# (source model.*, the run's model.*, the refusal): keys whose parameters do not carry.
REFUSALS = {
    "mlp_dim": ({}, {"mlp_dim": 128}, r"model.mlp_dim=128 \(the source's 64\) changes the "
                r"shape of 6 of them \(first: block_0/mlp/wi/bias is \(64,\)"),
    # A learned position table of another length (not named before: max_len was taken
    # for a key that moves no parameter, as it is for RoPE).
    "max_len": ({}, {"max_len": 64}, r"model.max_len=64 \(the source's 32\) changes the "
                r"shape of 1 of them \(first: embedder/position_embed is \(32, 32\)"),
    # An MLM encoder's weights into a decoder LM: the MLM head is dropped by a key that
    # is not the task's (the source's head, "mlm", is no head of a decoder).
    "objective": ({"arch": "encoder", "head": "mlm"}, {},
                  r"model.arch='decoder' \(the source's 'encoder'\) leaves 5 of the "
                  r"source's dropped .*first: mlm_bias"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_key_that_cannot_carry_the_parameters_is_refused_naming_it(tmp_path, case):
  source_model, run_model, refusal = REFUSALS[case]
  workdir, _ = _source(tmp_path, _config(**source_model))
  config = _config(**run_model)
  config.init_from = workdir
  with pytest.raises(ConfigError, match=rf"config.init_from='{workdir}' cannot carry its "
                     rf"parameters into this model: {refusal}"):
    _start(config)
