"""Mixture of experts (model.mlp="moe"): routing, both dispatches, the losses, scan, sharding.

Each test fails when its part breaks: a detached router has no gradient, one expert at
top-1 is the dense MLP, a hand-made batch overflows one expert by a known count, the two
dispatches agree when nothing is dropped, the auxiliary losses equal their closed forms,
every topology trains through the real train_step, scanned (in groups) equals unrolled,
bad values name their key, and expert-sharded training compiles on 8 simulated devices.
Cached decoding of MoE models is checked in test_decoding.py (its MoE cases).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from test_golden import _batch as golden_batch
from test_modern_axes import SEGMENTS, batch_of
from test_topologies import (close, compile_fast, experiment_config, logits_fn, model_config,
                             random_params, training_batch)
from transformer import sharding
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig, objective_of
from transformer.config.validation import validate
from transformer.model import moe, objectives
from transformer.model.layers import scanned_to_unrolled, unrolled_to_scanned
from transformer.model.mlp import MLP
from transformer.model.models import make_model
from transformer.training import flops, metrics, optim
from transformer.training import trainer as trainer_lib
from transformer.workdir import metrics_file

jax.config.update("jax_numpy_rank_promotion", "raise")

MOE = dict(mlp="moe", num_experts=4, experts_per_token=2)


def moe_apply(cfg, params, x_BLE):
  """MoeMLP(cfg) on x; returns (y, the layer's sown statistics)."""
  y, sown = moe.MoeMLP(cfg).apply({"params": params}, x_BLE, mutable=[moe.COLLECTION])
  return y, moe.moe_metrics(sown)


def moe_params(cfg, x_BLE, seed=0):
  shapes = jax.eval_shape(moe.MoeMLP(cfg).init, jax.random.key(0), x_BLE)["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: 0.3 * rng.normal(size=s.shape).astype(np.float32),
                      jax.tree.map(lambda b: b.value, shapes,
                                   is_leaf=lambda b: hasattr(b, "value")))


# ---------------------------------------------------------------- routing and dispatch


@pytest.mark.parametrize("dispatch", ["dropless", "capacity"])
def test_router_gets_gradient_from_the_main_loss(dispatch):
  """The chosen experts' weights carry the router's gradient (a detached router has none)."""
  cfg = model_config("decoder", moe_dispatch=dispatch, moe_capacity_factor=4.0,
                     moe_renormalize=False, **MOE)
  model, batch = make_model(cfg), batch_of("decoder")
  params = random_params(model, batch)
  forward = objectives.make_forward(model, "causal_lm")
  lm = dict(batch, targets=batch["inputs"], weights=(SEGMENTS > 0).astype(np.float32))

  def main_loss(params):  # The cross-entropy alone: no auxiliary loss.
    return metrics.loss_sums(*forward(params, lm)[:3])["objective_sum"]

  grads = compile_fast(jax.grad(main_loss), params)(params)
  for i in range(cfg.num_layers):
    assert np.abs(grads[f"block_{i}"]["mlp"]["router"]["kernel"]).max() > 1e-5


def test_one_expert_at_top_1_is_the_dense_mlp():
  """num_experts=1, top-1, renormalised: weight 1 on the one expert = the dense MLP."""
  for dispatch in ("dropless", "capacity"):
    cfg = model_config("decoder", mlp="moe", num_experts=1, experts_per_token=1,
                       activation="swiglu", moe_dispatch=dispatch, moe_capacity_factor=1.0)
    x_BLE = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 32)), jnp.float32)
    params = moe_params(cfg, x_BLE)
    dense = {name: {k: v[0] for k, v in params["experts"][name].items()}
             for name in ("wi", "wi_gate", "wo")}
    want = MLP(cfg).apply({"params": dense}, x_BLE)
    got, stats = moe_apply(cfg, params, x_BLE)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=dispatch)
    assert float(stats["dropped_fraction"]) == 0.0


def test_capacity_drops_the_overflow_and_counts_it():
  """5 tokens of a sequence pick expert 0 with 2 slots: 3 dropped (the later ones)."""
  cfg = model_config("decoder", mlp="moe", num_experts=4, experts_per_token=1,
                     moe_renormalize=False, moe_dispatch="capacity",
                     moe_capacity_factor=1.0, d_model=8, use_bias=False)
  assert moe.capacity(cfg, 8) == 2  # ceil(1.0 * 8 tokens * top-1 / 4 experts).
  choice = [0, 0, 0, 0, 0, 1, 2, 3]  # Token t's expert: embed feature t's router row.
  x_BLE = jnp.asarray(np.eye(8, dtype=np.float32)[choice][None] + 0.01)
  params = moe_params(cfg, x_BLE)
  params["router"]["kernel"] = 10.0 * np.eye(8, 4, dtype=np.float32)
  y, stats = moe_apply(cfg, params, x_BLE)
  np.testing.assert_allclose(stats["dropped_fraction"], 3 / 8, rtol=1e-6)
  np.testing.assert_allclose(stats["load"], [5 / 8, 1 / 8, 1 / 8, 1 / 8], rtol=1e-6)
  served = np.abs(np.asarray(y[0])).max(axis=-1) > 0
  np.testing.assert_array_equal(served, [True, True, False, False, False, True, True, True])
  # Dropless serves them all, with the same output for the tokens capacity kept.
  dropless = dataclasses.replace(cfg, moe_dispatch="dropless")
  y_all, stats_all = moe_apply(dropless, params, x_BLE)
  assert float(stats_all["dropped_fraction"]) == 0.0
  np.testing.assert_allclose(np.asarray(y)[0, served], np.asarray(y_all)[0, served],
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_dropless_equals_capacity_when_nothing_is_dropped(arch):
  """Capacity factor = num_experts gives every expert a slot for every token."""
  cfg = model_config(arch, moe_dispatch="dropless", activation="geglu", **MOE)
  batch = batch_of(arch)
  dropless = make_model(cfg)
  params = random_params(dropless, batch)
  capacity = make_model(dataclasses.replace(cfg, moe_dispatch="capacity",
                                            moe_capacity_factor=float(cfg.num_experts)))
  got = compile_fast(logits_fn(capacity, batch), params)(params)
  want = compile_fast(logits_fn(dropless, batch), params)(params)
  close(got, want)
  assert np.abs(np.asarray(want)).max() > 0.1  # Else the comparison could not tell.


# ---------------------------------------------------------------- auxiliary losses


@pytest.mark.parametrize("case", ["uniform", "balanced_one_hot", "collapsed_one_hot"])
def test_aux_and_z_loss_equal_their_closed_forms(case):
  """E * sum_e f_e p_e and mean logsumexp^2 on hand-made router logits (top-1)."""
  X, N, c = 4, 8, 30.0
  cfg = model_config("decoder", mlp="moe", num_experts=X, experts_per_token=1,
                     moe_renormalize=False, d_model=8, use_bias=False)
  if case == "uniform":  # Zero logits: p_e = 1/E; ties go to expert 0, so f_0 = 1.
    kernel, expected_aux, logit = np.zeros((8, X), np.float32), 1.0, 0.0
  elif case == "balanced_one_hot":  # Token t -> expert t % E, confidently: f_e = p_e = 1/E.
    kernel, expected_aux, logit = c * np.eye(8, X, dtype=np.float32), 1.0, c
    kernel[4:] = c * np.eye(4, dtype=np.float32)
  else:  # Every token -> expert 0: f_0 = p_0 = 1, the worst case, E.
    kernel, expected_aux, logit = np.zeros((8, X), np.float32), float(X), c
    kernel[:, 0] = c
  x_BLE = jnp.asarray(np.eye(N, 8, dtype=np.float32)[None])
  params = moe_params(cfg, x_BLE)
  params["router"]["kernel"] = kernel
  _, stats = moe_apply(cfg, params, x_BLE)
  np.testing.assert_allclose(stats["aux_loss"], expected_aux, rtol=1e-5)
  # Each token's logits: one `logit` and E - 1 zeros.
  z = math.log(math.exp(logit) + X - 1) ** 2
  np.testing.assert_allclose(stats["z_loss"], z, rtol=1e-5)


def test_aux_loss_is_topk_at_balance_and_enters_the_objective():
  """Top-2 on uniform scores gives k (transformers' convention); the coefficients add
  coef * value per token to the objective and the moe_* metrics report the values."""
  stats = {"aux_loss": jnp.asarray(2.0), "z_loss": jnp.asarray(3.0),
           "dropped_fraction": jnp.asarray(0.25), "load": jnp.asarray([0.5, 0.5])}
  sums = {"objective_sum": jnp.asarray(10.0), "loss_sum": jnp.asarray(10.0),
          "correct_sum": jnp.asarray(1.0), "weight_sum": jnp.asarray(4.0)}
  out = metrics.add_moe_sums(sums, stats, aux_loss=0.1, z_loss=0.01)
  np.testing.assert_allclose(out["objective_sum"], 10.0 + 4.0 * (0.1 * 2.0 + 0.01 * 3.0))
  report = metrics.summarize(jax.device_get(out))
  assert report["moe_aux_loss"] == 2.0 and report["moe_z_loss"] == 3.0
  assert report["moe_dropped_fraction"] == 0.25 and report["moe_load_1"] == 0.5
  assert metrics.add_moe_sums(sums, {}) is sums


# ---------------------------------------------------------------- training and scan


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
def test_every_topology_trains_with_moe(arch):
  """Eight steps of the real train_step (dropout and router jitter on): the loss falls,
  the objective is the loss plus the coefficients times the moe_* values, eval has them."""
  config = experiment_config(arch, moe_dispatch="capacity", moe_every=2, moe_offset=1,
                             scan_layers=arch == "decoder", mlp_dropout=0.1,
                             moe_router_jitter=0.01, **MOE)
  config.optimizer.update(schedule="constant", learning_rate=1e-2, warmup_steps=0)
  validate(config)
  cfg = dataclasses.replace(ModelConfig.from_config(config.model), deterministic=False)
  model, obj = make_model(cfg), objective_of(cfg.arch, cfg.head)
  batch = training_batch(obj)
  params = random_params(model, batch)
  schedule = optim.make_schedule(config.optimizer, cfg.d_model, 8)
  tx = optim.make_optimizer(config.optimizer, schedule)
  step = functools.partial(trainer_lib.train_step, forward=objectives.make_forward(model, obj),
                           tx=tx, schedule=schedule, label_smoothing=0.0,
                           moe_aux_loss=0.01, moe_z_loss=0.001)
  state = trainer_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                 opt_state=tx.init(params), rng=jax.random.PRNGKey(0))
  run = lambda state: jax.lax.scan(lambda s, _: step(s, batch), state, length=8)[1]
  sums = jax.device_get(compile_fast(run, state)(state))
  losses = sums["loss_sum"] / sums["weight_sum"]
  assert np.all(np.isfinite(losses)) and losses[-1] < 0.9 * losses[0], losses
  report = metrics.summarize({k: v[-1] for k, v in sums.items()})
  assert report["moe_aux_loss"] >= 1.99  # >= k = 2, equal only at perfect balance.
  assert 0 <= report["moe_dropped_fraction"] < 1
  np.testing.assert_allclose(sum(report[f"moe_load_{e}"] for e in range(4)), 1.0, rtol=1e-5)
  extra = (sums["objective_sum"] - sums["loss_sum"]) / sums["weight_sum"]
  np.testing.assert_allclose(extra, 0.01 * sums["moe_aux_loss_sum"] / sums["weight_sum"]
                             + 0.001 * sums["moe_z_loss_sum"] / sums["weight_sum"], rtol=1e-4)
  eval_forward = objectives.make_forward(make_model(dataclasses.replace(cfg, deterministic=True)),
                                         obj)
  evaluated = trainer_lib.eval_step(state.params, batch, forward=eval_forward)
  assert evaluated["moe_aux_loss_sum"] > 0 and "moe_load_0_sum" not in evaluated


@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_scanned_groups_equal_unrolled(arch):
  """moe_every=2 scans groups of 2 blocks; scanned_to_unrolled gives the unrolled model's
  outputs, and unrolled_to_scanned(group=2) inverts it (sliding window flags too)."""
  cfg = model_config(arch, scan_layers=True, moe_every=2, moe_offset=1, num_layers=4,
                     position="rope", sliding_window=3, window_pattern="lg", **MOE)
  batch = batch_of(arch)
  scanned = make_model(cfg)
  unrolled = make_model(dataclasses.replace(cfg, scan_layers=False))
  params = random_params(scanned, batch)
  converted = scanned_to_unrolled(params, 4)
  stack = converted["decoder"] if arch == "encoder_decoder" else converted
  assert "router" in stack["block_1"]["mlp"] and "router" not in stack["block_0"]["mlp"]
  assert stack["block_3"]["mlp"]["experts"]["wi"]["kernel"].shape == (4, 32, 64)
  close(compile_fast(logits_fn(unrolled, batch), converted)(converted),
        compile_fast(logits_fn(scanned, batch), params)(params))
  jax.tree.map(np.testing.assert_array_equal, unrolled_to_scanned(converted, group=2), params)


def test_flops_and_parameters_count_the_active_experts():
  cfg = model_config("decoder", **MOE)
  dense = dataclasses.replace(cfg, mlp="dense")
  mlp_forward = 2 * 16 * 2 * 32 * 64  # Tokens x (wi, wo) x E x F, per layer, forward.
  router = 2 * 16 * 32 * 4
  extra = flops.forward_flops_per_sequence(cfg, 16) - flops.forward_flops_per_sequence(dense, 16)
  assert extra == 2 * (mlp_forward + router)  # Top-2: two experts' worth, and the router.
  params = random_params(make_model(cfg), batch_of("decoder"))
  total = sum(x.size for x in jax.tree.leaves(params))
  expert_params = 2 * 4 * (32 * 64 + 64 + 64 * 32 + 32)  # Layers x experts x (wi, wo).
  assert moe.active_parameter_count(params, cfg) == total - expert_params // 2


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("overrides, expected", [
    (dict(experts_per_token=5), r"model\.experts_per_token=5 .*at most model\.num_experts=4"),
    (dict(experts_per_token=0), r"model\.experts_per_token=0 .*integer >= 1"),
    (dict(moe_every=2, moe_offset=2), r"model\.moe_offset=2 .*selects no layer"),
    (dict(moe_every=4, moe_offset=3), r"model\.moe_offset=3 .*selects no layer of the 2"),
    (dict(moe_every=3, scan_layers=True), r"model\.moe_every=3 .*scan_layers"),
    (dict(moe_capacity_factor=0.0), r"model\.moe_capacity_factor=0\.0 .*> 0"),
    (dict(moe_router="topk"), r"model\.moe_router='topk' .*'softmax', 'sigmoid'"),
    (dict(moe_dispatch="sparse"), r"model\.moe_dispatch='sparse' .*'dropless', 'capacity'"),
    (dict(mlp="sparse"), r"model\.mlp='sparse' .*'dense', 'moe'"),
    (dict(moe_shared_gate=True), r"model\.moe_shared_gate=True .*moe_shared_mlp_dim"),
    # Top-1 renormalised: the weight is always 1 and the router gets no gradient.
    (dict(experts_per_token=1), r"model\.moe_renormalize=True .*experts_per_token=1 .*"
     r"router learns nothing"),
])
def test_bad_moe_values_name_the_key(overrides, expected):
  config = experiment_config("decoder", **{**MOE, **overrides})
  with pytest.raises(ConfigError, match=expected):
    validate(config)


def test_experts_must_split_over_the_expert_axis():
  config = experiment_config("decoder", **{**MOE, "num_experts": 6})
  config.mesh.shape = (("data", 2), ("fsdp", 1), ("tensor", 1), ("expert", 4))
  with pytest.raises(ConfigError, match=r"model\.num_experts=6 .*4 devices.*'expert'"):
    validate(config)


# ---------------------------------------------------------------- expert parallelism


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_expert_sharded_training_compiles_on_8_devices(dispatch, tiny_config):
  """Experts split 4 ways over the "expert" mesh axis (batch over data x expert): the
  kernels' specs lead with it, the step compiles, runs and moves tokens between devices."""
  tiny_config.model.update(moe_dispatch=dispatch, moe_capacity_factor=2.0, **MOE)
  tiny_config.mesh.shape = (("data", 2), ("fsdp", 1), ("tensor", 1), ("expert", 4))
  validate(tiny_config)
  mesh = sharding.make_mesh(tiny_config.mesh)
  trainer = trainer_lib.Trainer.create(tiny_config, mesh)
  specs = jax.tree.map(lambda s: s.spec, trainer.state_shardings.params)
  experts = specs["block_0"]["mlp"]["experts"]
  assert experts["wi"]["kernel"] == P("expert", "fsdp", "tensor")
  assert experts["wo"]["kernel"] == P("expert", "tensor", "fsdp")
  batch = trainer.global_batch(golden_batch("causal_lm", 8, 32))
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    hlo = trainer.train_step.lower(state, batch).compile().as_text()
    state, sums = trainer.train_step(state, batch)
  assert np.isfinite(float(sums["loss_sum"]))
  found = {op for op in ("all-to-all", "all-gather", "reduce-scatter", "all-reduce",
                         "collective-permute") if op in hlo}
  # Capacity's buffers are constrained to the experts' devices: tokens travel (all-to-all).
  # Dropless' grouped matmul is left to XLA, which gathers the expert kernels instead.
  assert ("all-to-all" if dispatch == "capacity" else "all-gather") in found, found


def test_expert_load_is_a_tensorboard_histogram(tmp_path):
  """moe_load_<e> rows also become one histogram whose bucket e holds expert e's share."""
  from test_crash_safety import _events  # pylint: disable=g-import-not-at-top
  writer = metrics_file.MetricWriter(str(tmp_path))
  writer.write(5, {"loss": 1.0, "moe_load_0": 0.5, "moe_load_1": 0.125,
                   "moe_load_2": 0.25, "moe_load_3": 0.125})
  writer.write(6, {"loss": 0.9})  # No MoE statistics: no histogram.
  writer.close()
  histograms = {}
  for path in (tmp_path / "tensorboard").glob("events.out.tfevents.*"):
    for event in _events(str(path)):
      for value in event.summary.value:
        if value.tag == "moe_expert_load":
          histograms[event.step] = value.histo
  assert list(histograms) == [5]
  histo = histograms[5]
  assert list(histo.bucket) == [0.5, 0.125, 0.25, 0.125]
  assert list(histo.bucket_limit) == [0.5, 1.5, 2.5, 3.5]
  assert histo.num == 1.0 and histo.sum == 0.125 + 0.5 + 0.375
