"""model.quantization="fp8": the matmuls in fp8 (emulated on CPU), its scaling state kept
in params beside the weights, out of the optimizer, carried by checkpoints and resumes."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from configs import gpt_small
from transformer import sharding
from transformer.cli import hf_export
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.interop.hf import importer
from transformer.model import fp8
from transformer.training import loop
from transformer.training.trainer import Trainer
from test_golden import _batch


def _trainer(config):
  config.model.quantization = "fp8"
  config.optimizer.label_smoothing = 0.0
  return Trainer.create(config, sharding.make_mesh(config.mesh, jax.devices()[:1]))


def _fp8_leaves(params):
  return {path: np.asarray(leaf) for path, leaf in
          traverse_util.flatten_dict(jax.device_get(params)).items()
          if fp8.is_fp8_state(path)}


def test_fp8_trains_with_finite_falling_loss_and_its_state_out_of_the_optimizer(tiny_config):
  trainer = _trainer(tiny_config)
  batch = _batch("causal_lm", 8, 32)
  losses = []
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    fresh = _fp8_leaves(state.params)
    # Every projection of both blocks: q, k, v, out, wi, wo (the fused q/k/v is off).
    owners = {path[:-2] for path in fresh}
    assert len(owners) == 2 * 6, sorted(owners)
    # Adam's moments exist for the weights alone.
    opt_paths = [tuple(str(getattr(k, "key", k)) for k in path)
                 for path, _ in jax.tree_util.tree_leaves_with_path(state.opt_state)]
    assert any("kernel" in path for path in opt_paths)
    assert not any(fp8.FP8_SCOPE in path for path in opt_paths)
    for _ in range(6):
      state, metrics = trainer.train_step(state, trainer.global_batch(batch))
      metrics = jax.device_get(metrics)
      losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
    after = _fp8_leaves(state.params)
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.2, losses
  # The state is the VJP's "gradient": the histories hold the steps' amax and the
  # scales moved off their initial 1.0 (not an optimizer update of either).
  for path, value in after.items():
    if path[-1].endswith("history"):
      assert value[0] > 0 and value[5] == 0, (path, value[:8])
    else:
      assert value[0] != 1.0, path


def test_fp8_state_of_two_microbatches_is_that_of_the_whole_batch(tiny_config):
  """Each slice's new state from the same old one: their max is the batch's (a sum, what
  plain gradient accumulation would do, doubles the scales)."""
  batch = _batch("causal_lm", 8, 32)
  states = []
  for microbatches in (1, 2):
    tiny_config.train.microbatches = microbatches
    trainer = _trainer(tiny_config)
    with trainer.context():
      state = trainer.init(jax.random.PRNGKey(0))
      state, _ = trainer.train_step(state, trainer.global_batch(batch))
      states.append(_fp8_leaves(state.params))
  assert states[0].keys() == states[1].keys()
  for path in states[0]:
    np.testing.assert_allclose(states[1][path], states[0][path], rtol=1e-5, err_msg=str(path))


def test_fp8_resumes_exactly_with_its_state_in_the_checkpoint(tiny_config, tmp_path):
  tiny_config.model.quantization = "fp8"
  tiny_config.train.update(num_steps=4, eval_every=2, eval_batches=1)
  tiny_config.checkpoint.update(every=2)
  tiny_config.data.prefetch = 0
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  loop.train_and_evaluate(tiny_config, straight)
  tiny_config.train.num_steps = 2
  loop.train_and_evaluate(tiny_config, resumed)
  tiny_config.train.num_steps = 4
  loop.train_and_evaluate(tiny_config, resumed)

  def losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
      return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}

  assert losses(straight) == losses(resumed)
  restore = lambda w: ocp.StandardCheckpointer().restore(
      os.path.join(w, "checkpoints", "4", "state"))
  a, b = restore(straight), restore(resumed)
  state_a = _fp8_leaves(a["params"])
  assert state_a and state_a.keys() == _fp8_leaves(b["params"]).keys()
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_an_unknown_quantization_is_one_line_naming_the_key(tiny_config):
  tiny_config.model.quantization = "int8"
  with pytest.raises(ConfigError, match=r"model\.quantization.*'int8'.*'', 'fp8'"):
    validate(tiny_config)


def test_an_fp8_import_starts_its_state_fresh_and_exports_the_same_weights(tmp_path):
  """A Hugging Face model has no fp8 state: the import adds it at its initial values and
  the export leaves it out, the tensors those of the plain import."""
  safetensors = pytest.importorskip("safetensors.numpy")
  folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf", "gpt2")
  config = gpt_small.get_config("local")
  config.model.quantization = "fp8"
  exported = {}
  for name, with_config in (("plain", None), ("fp8", config)):
    workdir = str(tmp_path / name)
    checkpoint = importer.import_folder(folder, workdir, with_config)
    if name == "fp8":
      state = _fp8_leaves(ocp.StandardCheckpointer().restore(
          os.path.join(checkpoint, "state"))["params"])
      assert state and all(
          (v == 0).all() if p[-1].endswith("history") else (v == 1).all()
          for p, v in state.items())
    hf_export.export(workdir, str(tmp_path / f"{name}_hf"))
    exported[name] = safetensors.load_file(str(tmp_path / f"{name}_hf" / "model.safetensors"))
  assert exported["plain"].keys() == exported["fp8"].keys()
  for key, value in exported["plain"].items():
    np.testing.assert_array_equal(exported["fp8"][key], value, err_msg=key)
