"""Sharding on 8 simulated CPU devices: every mesh trains like one device; specs are right."""

import importlib.util

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from transformer import sharding
from transformer.config.errors import ConfigError
from transformer.model.models import make_model
from transformer.training import trainer as trainer_lib

MESHES = [(1, 1, 1), (8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 2, 2)]


def _config(tiny_config, mesh=(1, 1, 1), use_bias=True):
  config = tiny_config
  # The attention key bias has an exactly-zero true gradient (softmax ignores a
  # per-query constant); Adam turns its float noise into +-lr steps that differ between
  # reduction orders. Training-equality tests therefore run without biases.
  config.model.use_bias = use_bias
  # Sizes that every mesh axis of 8 divides: heads, kv heads, mlp, vocab and embed.
  config.model.update(d_model=64, num_heads=8, mlp_dim=128, vocab_size=384)
  config.data.batch_size = 8
  config.mesh.shape = (("data", mesh[0]), ("fsdp", mesh[1]), ("tensor", mesh[2]))
  return config


def _batch(config, seed=0):
  """A packed batch (two documents a row, uneven padding) for the config's objective."""
  rng = np.random.default_rng(seed)
  b, l = config.data.batch_size, config.data.seq_len
  segment_ids = np.repeat(np.arange(1, 3), l // 2)[None].repeat(b, 0).astype(np.int32)
  for row in range(b):  # Uneven padding: micro-batches hold different token counts.
    segment_ids[row, l - 1 - 3 * (row % 4):] = 0
  positions = np.concatenate([np.arange(l // 2)] * 2)[None].repeat(b, 0).astype(np.int32)
  weights = (segment_ids > 0).astype(np.float32)
  tokens = lambda: rng.integers(4, 260, (b, l), dtype=np.int32)
  if config.model.arch == "encoder_decoder":
    return {"inputs": tokens(), "inputs_segment_ids": segment_ids,
            "inputs_positions": positions, "decoder_inputs": tokens(), "targets": tokens(),
            "targets_segment_ids": segment_ids, "targets_positions": positions,
            "weights": weights}
  return {"inputs": tokens(), "targets": tokens(), "segment_ids": segment_ids,
          "positions": positions, "weights": weights}


def _with_arch(config, arch):
  config.model.update(arch=arch, head="mlm" if arch == "encoder" else "lm")
  return config


def _train(config, devices, steps=3, batch=None):
  mesh = sharding.make_mesh(config.mesh, devices)
  trainer = trainer_lib.Trainer.create(config, mesh)
  losses = []
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    for step in range(steps):
      local = batch if batch is not None else _batch(config, step)
      state, metrics = trainer.train_step(state, trainer.global_batch(local))
      metrics = jax.device_get(metrics)
      losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
  return losses, jax.device_get(state.params), trainer


def _assert_trees_close(got_tree, want_tree):
  """Leaf-wise relative error of the whole tensor: Adam turns float noise in near-zero
  gradients into single elements that differ by a fraction of one update, so an
  elementwise tolerance would be flaky while a real sharding bug changes whole tensors."""
  got_leaves, want_leaves = jax.tree.leaves(got_tree), jax.tree.leaves(want_tree)
  assert len(got_leaves) == len(want_leaves)
  for got, want in zip(got_leaves, want_leaves):
    error = np.linalg.norm(np.asarray(got) - want) / np.linalg.norm(want)
    assert error < 1e-3, error  # A real sharding bug gives errors of order 1.


@pytest.fixture(scope="module")
def single_device_run(tfds_data_dir):
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  config = _config(make_tiny_config(tfds_data_dir), use_bias=False)
  return _train(config, jax.devices()[:1])


@pytest.mark.slow  # Two more topologies on 3 meshes (~29 s); the decoder case stays default.
@pytest.mark.parametrize("arch", ["encoder", "encoder_decoder"])
def test_other_topologies_shard_like_one_device(tiny_config, tfds_data_dir, arch):
  """2x2x2 uses all three axes at once; the decoder runs every mesh shape above."""
  mesh = (2, 2, 2)
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  one = _with_arch(_config(make_tiny_config(tfds_data_dir), use_bias=False), arch)
  expected_losses, expected_params, _ = _train(one, jax.devices()[:1])
  config = _with_arch(_config(tiny_config, mesh, use_bias=False), arch)
  losses, params, _ = _train(config, jax.devices()[: int(np.prod(mesh))])
  np.testing.assert_allclose(losses, expected_losses, rtol=2e-5)
  _assert_trees_close(params, expected_params)


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "x".join(map(str, m)))
def test_every_mesh_trains_like_one_device(tiny_config, single_device_run, mesh):
  config = _config(tiny_config, mesh, use_bias=False)
  losses, params, trainer = _train(config, jax.devices()[: int(np.prod(mesh))])
  expected_losses, expected_params, _ = single_device_run
  np.testing.assert_allclose(losses, expected_losses, rtol=2e-5)
  assert losses[-1] < losses[0]
  _assert_trees_close(params, expected_params)
  # The parameters really are laid out on the mesh, not gathered on one device.
  kernel = trainer.state_shardings.params["block_0"]["mlp"]["wi"]["kernel"]
  assert kernel.mesh.shape == dict(zip(("data", "fsdp", "tensor"), mesh))


def test_parameter_specs_follow_the_rules(tiny_config):
  config = _config(tiny_config, (2, 2, 2))
  mesh = sharding.make_mesh(config.mesh)
  trainer = trainer_lib.Trainer.create(config, mesh)
  specs = jax.tree.map(lambda s: s.spec, trainer.state_shardings.params)
  block = specs["block_0"]
  expected = {
      ("embedder", "token_embed", "embedding"): P("tensor", "fsdp"),
      ("embedder", "position_embed"): P(None, "fsdp"),
      ("self_attention", "query", "kernel"): P("fsdp", "tensor", None),
      ("self_attention", "query", "bias"): P("tensor", None),
      ("self_attention", "key", "kernel"): P("fsdp", "tensor", None),
      ("self_attention", "value", "kernel"): P("fsdp", "tensor", None),
      ("self_attention", "out", "kernel"): P("tensor", None, "fsdp"),
      ("self_attention", "out", "bias"): P("fsdp"),
      ("mlp", "wi", "kernel"): P("fsdp", "tensor"),
      ("mlp", "wi", "bias"): P("tensor"),
      ("mlp", "wo", "kernel"): P("tensor", "fsdp"),
      ("self_attention_norm", "scale"): P("fsdp"),
  }
  for path, spec in expected.items():
    node = specs if path[0] == "embedder" else block
    for key in path:
      node = node[key]
    assert node == spec, (path, node, spec)
  assert specs["final_norm"]["scale"] == P("fsdp")


def test_every_spec_matches_its_tensor_rank(tiny_config):
  config = _config(tiny_config, (2, 2, 2))
  trainer = trainer_lib.Trainer.create(config, sharding.make_mesh(config.mesh))
  shapes = jax.tree.leaves(trainer.abstract_state)
  shardings = jax.tree.leaves(trainer.state_shardings,
                              is_leaf=lambda x: isinstance(x, jax.sharding.NamedSharding))
  assert len(shapes) == len(shardings)
  for shape, shard in zip(shapes, shardings):
    assert len(shard.spec) <= len(shape.shape)
    assert shard.is_equivalent_to(shape.sharding, len(shape.shape))
  # Optimizer moments are sharded like their parameters (FSDP shards them too).
  mu = trainer.state_shardings.opt_state[1][0].mu
  assert mu["block_0"]["mlp"]["wi"]["kernel"].spec == P("fsdp", "tensor")


def test_sharding_report_counts_bytes_and_warns_when_fsdp_leaves_weights_whole(
    tiny_config, caplog):
  config = _config(tiny_config, (1, 8, 1))
  mesh = sharding.make_mesh(config.mesh)
  trainer = trainer_lib.Trainer.create(config, mesh)
  boxed = jax.eval_shape(trainer_lib.make_init_fn(
      make_model(trainer.model_config), _optimizer(config), config.data.seq_len),
      jax.random.PRNGKey(0))
  lines, stats = sharding.sharding_report(
      boxed.params, trainer.state_shardings.params, trainer.abstract_state.opt_state,
      trainer.state_shardings.opt_state)
  assert any(line.startswith("block_*/mlp/wi/kernel x2") for line in lines)
  assert stats["param_bytes_per_device"] < stats["param_bytes"] / 4
  assert stats["replicated_fraction"] < 0.02

  config.mesh.rules = tuple((name, None if name == "embed" else axes)
                            for name, axes in config.mesh.rules)
  with caplog.at_level("WARNING"):
    trainer_lib.Trainer.create(config, sharding.make_mesh(config.mesh))
  assert "fsdp=8 but" in caplog.text and "replicated" in caplog.text


def _optimizer(config):
  from transformer.training import optim  # pylint: disable=g-import-not-at-top
  return optim.make_optimizer(
      config.optimizer, optim.make_schedule(config.optimizer, 64, config.train.num_steps))


def test_accumulation_equals_one_large_batch_step(tiny_config):
  config = _config(tiny_config, (2, 1, 1), use_bias=False)
  batch = _batch(config)
  big_losses, big_params, _ = _train(config, jax.devices()[:2], steps=2, batch=batch)
  config.train.microbatches = 4  # 4 slices of 2 rows, each split over the 2 data devices.
  acc_losses, acc_params, _ = _train(config, jax.devices()[:2], steps=2, batch=batch)
  np.testing.assert_allclose(acc_losses, big_losses, rtol=2e-5)
  _assert_trees_close(acc_params, big_params)


def test_rules_drop_axes_the_mesh_lacks_even_when_the_config_names_them():
  """A mesh built by hand (or a saved config with a newer base) without the optional
  'expert' axis: rules_of(config, mesh) leaves 'expert' out of the batch rule."""
  from configs import base as base_config  # pylint: disable=g-import-not-at-top
  config = base_config.get_config()
  assert "expert" in [name for name, _ in config.mesh.shape]
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1),
                           ("data", "fsdp", "tensor"))
  first_batch_rule = lambda rules: next(axes for name, axes in rules if name == "batch")
  rules = sharding.rules_of(config.mesh, mesh)
  assert first_batch_rule(rules) == ("data", "fsdp")
  assert sharding.batch_sharding(mesh, rules).spec[0] == ("data", "fsdp")
  # From the config's shape alone the rule keeps it.
  assert first_batch_rule(sharding.rules_of(config.mesh)) == ("data", "fsdp", "expert")


# v5p:2x2x2 is two hosts of four chips (devices 0-3 on process 0, 4-7 on process 1):
# its abstract devices from libtpu carry those process indices, with no second process.
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed: the two-host topology's devices come "
                    "from it")
@pytest.mark.parametrize("shape, order, shares", [
    # The data axis across the hosts: each process reads its own half.
    ((("data", 2), ("fsdp", 1), ("tensor", 4)), range(8), [(0, 2), (1, 2)]),
    ((("data", 8), ("fsdp", 1), ("tensor", 1)), range(8), [(0, 2), (1, 2)]),
    # A tensor or context axis across the hosts: both hold every row and read the same.
    ((("tensor", 2), ("data", 4), ("fsdp", 1)), range(8), [(0, 1), (0, 1)]),
    ((("context", 8), ("data", 1), ("fsdp", 1), ("tensor", 1)), range(8), [(0, 1), (0, 1)]),
    ((("data", 2), ("fsdp", 2), ("tensor", 2)), (0, 1, 4, 5, 2, 3, 6, 7),
     [(0, 2), (1, 2)]),  # Rows apart: process 0 holds batch shards 0 and 2.
])
def test_each_process_reads_the_data_shards_its_devices_hold(shape, order, shares):
  devices = _two_host_devices()
  mesh = sharding.make_mesh(_mesh_config(shape), [devices[i] for i in order])
  rules = sharding.rules_of(_mesh_config(shape), mesh)
  shards = [sharding.input_shard(mesh, rules, p) for p in (0, 1)]
  assert [(shard.index, shard.count) for shard in shards] == shares


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed: the two-host topology's devices come "
                    "from it")
def test_a_mesh_whose_processes_share_part_of_a_data_shard_is_refused_in_one_line():
  """Process 0 holds data shards 0, 1, 2 and process 1 shards 1, 2, 3: neither reads alone."""
  devices = _two_host_devices()
  shape = (("data", 4), ("fsdp", 1), ("tensor", 2))
  mesh = sharding.make_mesh(_mesh_config(shape), [devices[i] for i in (0, 1, 2, 4, 3, 5, 6, 7)])
  with pytest.raises(ConfigError, match=r"cannot be fed: process 0's devices hold data "
                     r"shards \[0, 1, 2\] and process 1's \[1, 2, 3\]"):
    sharding.input_shard(mesh, sharding.rules_of(_mesh_config(shape), mesh))


def _two_host_devices():
  from transformer.planning import topology  # pylint: disable=g-import-not-at-top
  devices = topology.topology_devices(topology.parse_topology("v5p:2x2x2"))
  assert [d.process_index for d in devices] == [0] * 4 + [1] * 4
  return devices


def _mesh_config(shape):
  from configs import base  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.mesh.shape = shape
  return config.mesh
