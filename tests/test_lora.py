"""LoRA (model.lora_rank > 0): the base's logits at step 0, only adapters train, export merges."""

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from test_init_from import _quick  # One layer, a checkpoint a step, no step-0 eval.
from test_sharding import _batch, _config  # The tiny mesh-divisible shapes, packed batches.
from tiny import make_tiny_config
from transformer import sharding
from transformer.cli import average
from transformer.cli import hf_export
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.config.validation import validate
from transformer.inference import loaded
from transformer.interop.hf import importer
from transformer.model import lora
from transformer.model.models import make_model
from transformer.training import fine_tune
from transformer.training import loop
from transformer.training import metrics
from transformer.training import optim
from transformer.training import trainer as trainer_lib
from transformer.workdir import checkpointing, layout, run_record

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "hf")


def _flat(tree) -> dict:
  return {jax.tree_util.keystr(p, simple=True, separator="/"): np.asarray(x)
          for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _is_adapter(path: str) -> bool:
  return path.rsplit("/", 1)[-1] in lora.ADAPTER_NAMES


def _deterministic(model) -> ModelConfig:
  return dataclasses.replace(ModelConfig.from_config(model), deterministic=True)


def _with_lora(config, rank=4):
  config.model.update(lora_rank=rank, lora_alpha=8.0)
  return config


def _train(config, devices, steps, params=None):
  """(parameters before the first step, after `steps`, the per-step losses, the trainer);
  `params` replaces the initialised parameters."""
  trainer = trainer_lib.Trainer.create(config, sharding.make_mesh(config.mesh, devices))
  losses = []
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    if params is not None:
      state = state.replace(params=jax.device_put(params, trainer.state_shardings.params))
    start = jax.device_get(state.params)  # Before the step donates the state.
    for _ in range(steps):  # One batch, so that the loss must fall.
      state, metrics = trainer.train_step(state, trainer.global_batch(_batch(config)))
      losses.append(float(jax.device_get(metrics["loss_sum"])))
  return start, jax.device_get(state.params), losses, trainer


@pytest.fixture(scope="module")
def lora_run(tfds_data_dir):
  """Three LoRA steps on one device (biases on: they stay frozen too)."""
  return _train(_with_lora(_config(make_tiny_config(tfds_data_dir))), jax.devices()[:1], 3)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned_remat"])
def test_step_0_has_exactly_the_base_models_logits(tiny_config, scan):
  """B = 0: a fresh LoRA model computes its base model's logits, bit for bit.

  Unrolled, the base initialises alike with or without adapters. In a scanned stack
  flax's two tracing passes of nn.scan share each module's key counter, so a module's
  extra parameters shift its kernel's init key: the comparison there is on the same
  base parameters, as init_from or an import gives both models.
  """
  tiny_config.model.update(scan_layers=scan, remat="full" if scan else "none")
  base_config = ModelConfig.from_config(tiny_config.model)
  lora_config = ModelConfig.from_config(_with_lora(tiny_config).model)
  ids = np.asarray([[5, 9, 2, 7, 11, 3, 8, 1]] * 2, np.int32)
  inputs = (ids, np.asarray([[1] * 5 + [2] * 3, [1] * 6 + [0] * 2], np.int32),
            np.asarray([list(range(5)) + list(range(3)), list(range(8))], np.int32))
  key = jax.random.PRNGKey(0)
  params = nn.unbox(make_model(lora_config).init(key, *inputs)["params"])
  base = lora.merge(params, lora_config)  # B = 0: the adapters removed, kernels as they were.
  for path, value in _flat(base).items():
    np.testing.assert_array_equal(value, _flat(params)[path], err_msg=path)
  if not scan:
    base_init = nn.unbox(make_model(base_config).init(key, *inputs)["params"])
    assert _flat(base_init).keys() == _flat(base).keys()
    for path, value in _flat(base_init).items():
      np.testing.assert_array_equal(value, _flat(base)[path], err_msg=path)
  adapted = jax.jit(make_model(lora_config).apply)({"params": params}, *inputs)
  np.testing.assert_array_equal(
      adapted, jax.jit(make_model(base_config).apply)({"params": base}, *inputs))
  assert all(not v.any() for p, v in _flat(params).items() if p.endswith("lora_b"))


def test_only_the_adapters_train_and_hold_optimizer_state(tfds_data_dir, lora_run):
  start, end, losses, trainer = lora_run
  start, end = _flat(start), _flat(end)
  adapters = [p for p in start if _is_adapter(p)]
  # Every targeted projection of both layers: q, k, v, out, wi, wo, each with A and B.
  assert len(adapters) == 2 * 6 * 2
  for path in start:
    if _is_adapter(path):
      assert not np.array_equal(end[path], start[path]), path
    else:
      np.testing.assert_array_equal(end[path], start[path], err_msg=path)
  assert losses[-1] < losses[0]

  # Adam's two moments for the adapters alone: leaves and bytes, against full training.
  def moment_bytes(state):
    leaves = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    return len(leaves), sum(x.size * x.dtype.itemsize for x in leaves)

  adapter_bytes = sum(start[p].nbytes for p in adapters)
  assert moment_bytes(trainer.abstract_state) == (2 * len(adapters), 2 * adapter_bytes)
  full = trainer_lib.Trainer.create(_config(make_tiny_config(tfds_data_dir)),
                                    sharding.make_mesh(trainer.config.mesh, jax.devices()[:1]))
  full_count, full_bytes = moment_bytes(full.abstract_state)
  assert full_count == 2 * (len(start) - len(adapters))
  assert 2 * adapter_bytes < full_bytes / 4


def test_adapters_shard_like_their_kernels_and_train_alike_on_fsdp_and_tensor(
    tfds_data_dir, lora_run):
  """A 1 x 2 x 2 mesh (fsdp 2, tensor 2) trains the LoRA model as one device does."""
  config = _with_lora(_config(make_tiny_config(tfds_data_dir), (1, 2, 2)))
  _, end, losses, trainer = _train(config, jax.devices()[:4], 3)
  _, one_end, one_losses, _ = lora_run
  np.testing.assert_allclose(losses, one_losses, rtol=2e-5)
  for path, value in _flat(one_end).items():
    np.testing.assert_allclose(_flat(end)[path], value, rtol=1e-3, atol=1e-6, err_msg=path)
  specs = trainer.state_shardings.params["block_0"]
  assert specs["self_attention"]["query"]["lora_a"].spec == P("fsdp", None)
  assert specs["self_attention"]["query"]["lora_b"].spec == P(None, "tensor", None)
  assert specs["self_attention"]["out"]["lora_a"].spec == P("tensor", None, None)
  assert specs["mlp"]["wo"]["lora_b"].spec == P(None, "fsdp")


def test_targets_pick_the_projections_and_a_classifier_head_trains_in_full(tiny_config):
  """Adapters exactly where lora_targets names (wi_gate goes with wi); split_trainable
  keeps a classification head in the trainable half and join_trainable undoes it."""
  tiny_config.model.update(activation="swiglu", head="classification", pooling="last")
  _with_lora(tiny_config).model.lora_targets = ("value", "wi")
  model_config = ModelConfig.from_config(tiny_config.model)
  ids = np.ones((1, 8), np.int32)
  shapes = jax.eval_shape(make_model(model_config).init, jax.random.PRNGKey(0), ids,
                          ids, np.arange(8, dtype=np.int32)[None])["params"]
  params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.unbox(shapes))
  adapted = sorted({p.split("/")[-2] for p in _flat(params) if _is_adapter(p)})
  assert adapted == ["value", "wi", "wi_gate"]
  trainable, frozen = optim.split_trainable(params, lora=True)
  assert sorted(_flat(trainable)) == sorted(
      p for p in _flat(params) if _is_adapter(p) or p.startswith("classification_head/"))
  assert not any(_is_adapter(p) for p in _flat(frozen))
  assert _flat(optim.join_trainable(trainable, frozen)).keys() == _flat(params).keys()
  whole, nothing = optim.split_trainable(params, lora=False)
  assert whole is params and nothing == {}


@pytest.mark.parametrize("targets, message", [
    (("query", "q"), r"config\.model\.lora_targets=\('query', 'q'\) is invalid: expected a "
                     r"non-empty tuple of distinct names from \('query', 'key', 'value', "
                     r"'out', 'wi', 'wo'\)\.$"),
    ((), r"config\.model\.lora_targets=\(\) is invalid"),
    (("wo", "wo"), r"config\.model\.lora_targets=\('wo', 'wo'\) is invalid"),
])
def test_bad_lora_targets_are_refused_in_one_line(tiny_config, targets, message):
  _with_lora(tiny_config).model.lora_targets = targets
  with pytest.raises(ConfigError, match=message) as error:
    validate(tiny_config)
  assert "\n" not in str(error.value)


def test_bad_lora_values_are_refused(tiny_config):
  for key, value, valid in (("lora_rank", -1, "an integer >= 0"),
                            ("lora_alpha", 0.0, "a positive float"),
                            ("lora_dropout", 1.0, r"a probability in \[0, 1\)")):
    config = make_tiny_config(tiny_config.data.data_dir)
    config.model[key] = value
    with pytest.raises(ConfigError, match=rf"config\.model\.{key}=.* expected {valid}"):
      validate(config)
  config = _with_lora(make_tiny_config(tiny_config.data.data_dir))
  config.model.mlp = "moe"
  with pytest.raises(ConfigError, match=r"lora_targets=.*model\.mlp='moe'"):
    validate(config)


@pytest.mark.parametrize("family", ["gpt2", "llama2"])
def test_export_merges_the_adapters_into_the_forward_it_computed(tmp_path, family):
  """A LoRA run (trained adapters: B random) exports as a plain folder whose model,
  imported back, computes the run's unmerged logits."""
  base_dir, run_dir = str(tmp_path / "base"), str(tmp_path / "run")
  importer.import_folder(os.path.join(FIXTURES, family), base_dir)
  base_run = loaded.load_run(base_dir)
  config = _with_lora(base_run.config)
  model = make_model(_deterministic(config.model))
  ids = np.asarray([[5, 9, 2, 7, 11, 3]], np.int32)
  inputs = (ids, np.ones_like(ids), np.arange(6, dtype=np.int32)[None])
  fresh = {jax.tree_util.keystr(p, simple=True, separator="/"): x.shape for p, x in
           jax.tree_util.tree_leaves_with_path(loaded.abstract_params(config, base_run.mesh))}
  rng = np.random.default_rng(0)
  params = jax.tree.map(np.asarray, base_run.params)
  adapted = jax.tree.map(np.asarray, base_run.params)
  for path in fresh:  # The imported base, adapters with A and B both random.
    if _is_adapter(path):
      *modules, name = path.split("/")
      node = adapted
      for module in modules:
        node = node[module]
      node[name] = rng.normal(0, 0.05, fresh[path]).astype(np.float32)
  shutil.copytree(base_dir, run_dir, ignore=shutil.ignore_patterns(layout.CHECKPOINTS))
  with open(os.path.join(run_dir, layout.CONFIG), "w", encoding="utf-8") as f:
    f.write(config.to_json_best_effort(indent=2))
  checkpointing.save_params(os.path.join(run_dir, layout.CHECKPOINTS), 0, adapted)
  unmerged = np.asarray(jax.jit(model.apply)({"params": adapted}, *inputs))

  exported = str(tmp_path / "exported")
  hf_export.export(run_dir, exported)  # Merged automatically: no adapter in the folder.
  again = importer.convert_folder(exported)
  assert not any(_is_adapter(p) for p in _flat(again.params))
  merged_config = _deterministic(importer.imported_config(again).model)
  assert merged_config.lora_rank == 0
  apply = jax.jit(make_model(merged_config).apply)
  merged = np.asarray(apply({"params": again.params}, *inputs))
  base = np.asarray(apply({"params": params}, *inputs))
  np.testing.assert_allclose(merged, unmerged, atol=2e-5, rtol=1e-5)
  assert np.abs(base - unmerged).max() > 1e-2  # The adapters changed the function.


def test_a_lora_run_counts_trainable_and_all_parameters(tiny_config, tmp_path, caplog):
  """peft's line (trainable || all || %), not the frozen base as "Model parameters"; both
  counts in run.json."""
  params = nn.unbox(trainer_lib.abstract_params(_with_lora(tiny_config)))
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  adapters = sum(int(np.prod(x.shape)) for p, x in _flat_shapes(params).items()
                 if _is_adapter(p))
  with caplog.at_level("INFO"), caplog.at_level("INFO", logger="absl"):
    counts = metrics.log_parameter_count(params, None, optim.split_trainable(params, True)[0])
  assert counts == (total, adapters) and 0 < adapters < total
  assert (f"Model parameters: trainable params: {adapters:,} || all params: {total:,} || "
          f"trainable%: {100 * adapters / total:.4f} (LoRA: the rest is the frozen base)"
          ) in caplog.text
  record = run_record.RunRecord(str(tmp_path))
  record.update(0, parameters=total, trainable_parameters=adapters)
  assert {k: run_record.read_record(str(tmp_path))[k] for k in (
      "parameters", "trainable_parameters")} == {"parameters": total,
                                                 "trainable_parameters": adapters}


def _flat_shapes(tree) -> dict:
  return {jax.tree_util.keystr(p, simple=True, separator="/"): x
          for p, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.slow  # Three runs through the loop: about a minute on two shared cores.
def test_a_lora_run_fine_tunes_from_init_from_and_resumes(tfds_data_dir, tmp_path):
  """init_from brings the base (frozen from then on), the adapters start fresh; the
  checkpoint holds them with their optimizer state and a resumed run continues."""
  source = str(tmp_path / "source")
  loop.train_and_evaluate(_quick(make_tiny_config(tfds_data_dir), 1), source)
  workdir = str(tmp_path / "lora")
  config = _with_lora(_quick(make_tiny_config(tfds_data_dir), 1))
  config.init_from = source
  loop.train_and_evaluate(config, workdir)
  config.train.num_steps = 2  # Resume to one more step.
  loop.train_and_evaluate(config, workdir)

  read = lambda run, step: ocp.StandardCheckpointer().restore(
      os.path.join(run, layout.CHECKPOINTS, str(step), layout.STATE))
  base, first, second = read(source, 1), read(workdir, 1), read(workdir, 2)
  base_params = _flat(base["params"])
  for state in (first, second):
    params = _flat(state["params"])
    assert {p for p in params if not _is_adapter(p)} == set(base_params)
    for path, value in base_params.items():
      np.testing.assert_array_equal(params[path], value, err_msg=path)
  moments = _flat(second["opt_state"])
  assert moments and all(_is_adapter(p) for p in moments if not p.endswith("count"))
  assert int(second["step"]) == 2
  with open(os.path.join(workdir, layout.METRICS), encoding="utf-8") as f:
    assert [r["step"] for r in map(json.loads, f) if "loss" in r] == [1, 2]
  record = run_record.read_record(workdir)
  assert 0 < record["trainable_parameters"] < record["parameters"]


@pytest.fixture(scope="module")
def lora_source(tfds_data_dir, tmp_path_factory):
  """(workdir, config) of a two-step LoRA run, a checkpoint after each step, alpha / r =
  1.5 (a wrong factor would show); its adapters are no longer zero."""
  workdir = str(tmp_path_factory.mktemp("lora_source") / "run")
  config = _with_lora(_quick(make_tiny_config(tfds_data_dir), 2))
  config.model.lora_alpha = 6.0
  loop.train_and_evaluate(config, workdir)
  return workdir, config


def _stored(workdir, step):
  return ocp.StandardCheckpointer().restore(
      os.path.join(workdir, layout.CHECKPOINTS, str(step), layout.STATE))["params"]


@pytest.mark.slow  # A LoRA training run through the loop first: ~20 s on two cores.
def test_init_from_a_lora_run_into_a_model_without_adapters_merges_them(tfds_data_dir,
                                                                        lora_source):
  """The source's adapters are folded into their kernels (its alpha / r), not dropped:
  the new model starts from the function the LoRA run learnt, on an fsdp mesh."""
  source, lora_config = lora_source
  stored = _stored(source, 2)
  assert any(v.any() for p, v in _flat(stored).items() if p.endswith("lora_b"))

  config = _quick(make_tiny_config(tfds_data_dir), 1)
  config.init_from = source
  config.mesh.shape = (("data", 1), ("fsdp", 2), ("tensor", 1), ("expert", 1), ("context", 1))
  trainer = trainer_lib.Trainer.create(config, sharding.make_mesh(config.mesh,
                                                                  jax.devices()[:2]))
  loaded_params, match = fine_tune.load_source_params(config, trainer.abstract_state.params)
  expected = _flat(lora.merge(stored, lora_config.model))
  got = _flat(loaded_params)
  assert set(got) == set(expected) and not any(_is_adapter(p) for p in match.loaded)
  for path, value in expected.items():
    np.testing.assert_allclose(got[path], value, rtol=1e-6, atol=1e-6, err_msg=path)
  merged = [p for p in expected if p.endswith("kernel")
            and p.rsplit("/", 1)[0] + "/lora_a" in _flat(stored)]
  assert merged and any(np.abs(expected[p] - _flat(stored)[p]).max() > 0 for p in merged)
  abstract = {jax.tree_util.keystr(p, simple=True, separator="/"): x.sharding
              for p, x in jax.tree_util.tree_leaves_with_path(trainer.abstract_state.params)}
  for path, leaf in jax.tree_util.tree_leaves_with_path(loaded_params):
    assert leaf.sharding == abstract[jax.tree_util.keystr(path, simple=True, separator="/")]


@pytest.mark.slow  # Shares the LoRA run above.
def test_averaging_a_lora_run_averages_its_merged_kernels(lora_source, tmp_path):
  """--mode=average over LoRA checkpoints: the mean of kernel + alpha / r A . B, not of A
  and B apart (whose product is another function); the new run has no adapters."""
  source, lora_config = lora_source
  output = str(tmp_path / "averaged")
  average.average(source, output, average_last=2)
  merged = [_flat(lora.merge(_stored(source, step), lora_config.model)) for step in (1, 2)]
  got = _flat(_stored(output, 2))
  assert set(got) == set(merged[0]) and not any(_is_adapter(p) for p in got)
  for path in got:
    np.testing.assert_allclose(got[path], (merged[0][path] + merged[1][path]) / 2,
                               rtol=1e-6, atol=1e-6, err_msg=path)
  apart = {p: v for p, v in _flat(lora.merge(
      jax.tree.map(lambda a, b: (a + b) / 2, _stored(source, 1), _stored(source, 2)),
      lora_config.model)).items()}
  assert any(np.abs(apart[p] - got[p]).max() > 1e-7 for p in got)  # The two differ here.
  with open(os.path.join(output, layout.CONFIG), encoding="utf-8") as f:
    assert json.load(f)["model"]["lora_rank"] == 0
  run = loaded.load_run(output)
  assert set(_flat(run.params)) == set(got)
