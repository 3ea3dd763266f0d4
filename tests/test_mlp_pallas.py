"""model.mlp_impl="pallas": the dense MLP's activation inside Pallas matmul kernels
(model/mlp_pallas.py), held to XLA's MLP through Pallas's interpreter on the CPU; when
"auto" takes it; what it refuses, by name. The loss head's kernels (head_pallas.py) are
held to XLA's head in tests/test_head_loss.py and trained beside the MLP's here. tests/test_gpu_fusions.py compiles it for an
H100 and counts its kernels."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from transformer import accelerator
from transformer import sharding
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.config.validation import validate
from transformer.model import mlp as mlp_lib
from transformer.model import mlp_pallas
from transformer.training import head_pallas
from transformer.training.trainer import Trainer
from test_golden import _batch


def _reference(act_name, x, wi, bi, wo, dtype, gate=None):
  """act(x @ wi + bi) @ wo (gated: times x @ wg + bg) by plain autodiff: the float32
  product, one rounding each."""
  def hidden(w, b):
    h = jnp.einsum("NE,EF->NF", x, w.astype(dtype), preferred_element_type=jnp.float32)
    return (h if b is None else h + b[None, :]).astype(dtype)
  a = mlp_lib.ACTIVATION_FNS[act_name](hidden(wi, bi).astype(jnp.float32))
  if gate is not None:
    a = a * hidden(*gate).astype(jnp.float32)
  a = a.astype(dtype)
  return jnp.einsum("NF,FE->NE", a, wo.astype(dtype), preferred_element_type=jnp.float32
                    ).astype(dtype)


def _value_and_grads(fn, *args, dy):
  y, vjp = jax.vjp(fn, *args)
  return [np.asarray(t, np.float32) for t in (y,) + vjp(dy.astype(y.dtype)) if t is not None]


@pytest.mark.parametrize("act_name,dtype,tokens,bias,tolerance", [
    ("relu", jnp.float32, 96, True, 2e-6),
    ("gelu", jnp.float32, 96, True, 2e-6),
    ("gelu_tanh", jnp.float32, 40, False, 2e-6),  # 40 tokens: padded to 48.
    ("silu", jnp.float32, 96, True, 2e-6),
    ("gelu_tanh", jnp.bfloat16, 96, True, 2e-2),
    ("swiglu", jnp.float32, 96, False, 2e-6),  # Gated: llama's.
    ("geglu", jnp.float32, 96, True, 2e-6),
    ("geglu_tanh", jnp.bfloat16, 96, True, 2e-2),
])
def test_kernels_give_xlas_mlp_and_its_gradients(act_name, dtype, tokens, bias, tolerance):
  keys = jax.random.split(jax.random.key(0), 7)
  E, F = 32, 128
  x = jax.random.normal(keys[0], (tokens, E)).astype(dtype)
  wi = jax.random.normal(keys[1], (E, F)) * 0.3
  bi = jax.random.normal(keys[2], (F,)) * 0.3 if bias else None
  wo = jax.random.normal(keys[3], (F, E)) * 0.1
  dy = jax.random.normal(keys[4], (tokens, E))
  gated = act_name in mlp_pallas.GATED
  wg = jax.random.normal(keys[5], (E, F)) * 0.3 if gated else None
  bg = jax.random.normal(keys[6], (F,)) * 0.3 if gated and bias else None
  kernels = lambda x, wi, bi, wo, wg, bg: mlp_pallas.mlp(
      act_name, x, wi, bi, wo, dtype=dtype, interpret=True, gate=(wg, bg) if gated else None)
  plain = lambda x, wi, bi, wo, wg, bg: _reference(act_name, x, wi, bi, wo, dtype,
                                                    (wg, bg) if gated else None)
  got = _value_and_grads(kernels, x, wi, bi, wo, wg, bg, dy=dy)
  want = _value_and_grads(plain, x, wi, bi, wo, wg, bg, dy=dy)
  names = [n for n, there in (("y", 1), ("dx", 1), ("dwi", 1), ("dbi", bias), ("dwo", 1),
                              ("dwg", gated), ("dbg", gated and bias)) if there]
  assert len(got) == len(want) == len(names)
  for name, g, w in zip(names, got, want):
    assert g.shape == w.shape and g.dtype == w.dtype, name
    scale = float(np.max(np.abs(w)))
    assert scale > 0 and float(np.max(np.abs(g - w))) <= tolerance * scale, name


def test_the_rational_erf_is_xlas():
  x = jnp.linspace(-8.0, 8.0, 20001, dtype=jnp.float32)
  assert float(jnp.max(jnp.abs(mlp_pallas._erf(x) - jax.lax.erf(x)))) < 1e-6  # pylint: disable=protected-access


def _train(config, impl: str, devices: int, steps: int = 3):
  config.model.mlp_impl = config.model.loss_head_impl = impl
  config.optimizer.label_smoothing = 0.0
  trainer = Trainer.create(config, sharding.make_mesh(config.mesh, jax.devices()[:devices]))
  batch = _batch("causal_lm", 8, 32)
  losses = []
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    first = traverse_util.flatten_dict(jax.device_get(state.params))
    for _ in range(steps):
      state, metrics = trainer.train_step(state, trainer.global_batch(batch))
      metrics = jax.device_get(metrics)
      losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
  return first, losses, traverse_util.flatten_dict(jax.device_get(state.params))


def test_a_model_trains_with_the_pallas_kernels_as_with_xlas_over_four_data_shards(
    tfds_data_dir, monkeypatch):
  """The Pallas MLP and loss head (model.mlp_impl, model.loss_head_impl): the same
  parameter tree and initial values; three steps over 4 data-parallel devices (the
  kernels in a shard_map, the weights' gradients summed over the shards) land within
  float32 rounding of XLA's (Adam's first steps move every weight by about the learning
  rate whatever its gradient's size, so a last-bit difference in a tiny gradient shows
  at 1e-5)."""
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  calls = []
  kernel, head = mlp_pallas.act_matmul, head_pallas.gradients
  monkeypatch.setattr(mlp_pallas, "act_matmul",
                      lambda *a: (calls.append(a[1].shape), kernel(*a))[1])
  monkeypatch.setattr(head_pallas, "gradients",
                      lambda *a, **k: (calls.append("head"), head(*a, **k))[1])
  xla = _train(make_tiny_config(tfds_data_dir), "xla", devices=4)
  assert not calls
  pallas = _train(make_tiny_config(tfds_data_dir), "pallas", devices=4)
  assert (64, 64) in calls and "head" in calls, calls  # 256 tokens over 4 shards.
  assert sorted(xla[0]) == sorted(pallas[0])
  for path, value in xla[0].items():
    np.testing.assert_array_equal(value, pallas[0][path], err_msg=str(path))
  np.testing.assert_allclose(pallas[1], xla[1], rtol=1e-6)
  for path, value in xla[2].items():
    np.testing.assert_allclose(pallas[2][path], value, atol=1e-4, err_msg=str(path))


def test_a_gated_model_has_xlas_parameters_and_outputs_under_the_pallas_mlp(tfds_data_dir):
  """swiglu (llama's MLP): wi, wi_gate and wo under their names, the same initial values,
  and the first step's loss and parameters within float32 rounding of XLA's."""
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  runs = {}
  for impl in ("xla", "pallas"):
    config = make_tiny_config(tfds_data_dir)
    config.model.update(activation="swiglu", use_bias=False)
    runs[impl] = _train(config, impl, devices=1, steps=1)
  (first, losses, after), (p_first, p_losses, p_after) = runs["xla"], runs["pallas"]
  assert any("wi_gate" in "/".join(path) for path in first)
  assert sorted(first) == sorted(p_first)
  for path, value in first.items():
    np.testing.assert_array_equal(value, p_first[path], err_msg=str(path))
  np.testing.assert_allclose(p_losses, losses, rtol=1e-6)
  for path, value in after.items():
    np.testing.assert_allclose(p_after[path], value, atol=1e-4, err_msg=str(path))


def _model(**fields) -> ModelConfig:
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  config = make_tiny_config("")
  config.model.update(fields)
  return ModelConfig.from_config(config.model)


def test_auto_takes_the_pallas_mlp_on_gpus_where_it_applies(monkeypatch):
  assert not mlp_lib.pallas_chosen(_model())  # The CPU: XLA's.
  assert mlp_lib.pallas_chosen(_model(mlp_impl="pallas"))  # Asked for: interpreted.
  monkeypatch.setattr(accelerator, "platform_of_mesh", lambda: "gpu")
  assert mlp_lib.pallas_chosen(_model())
  assert not mlp_lib.pallas_chosen(_model(mlp_impl="xla"))
  assert mlp_lib.pallas_chosen(_model(activation="swiglu"))  # Gated too.
  assert not mlp_lib.pallas_chosen(_model(lora_rank=4, lora_targets=("wi",)))
  assert not mlp_lib.pallas_chosen(_model(mlp_dropout=0.1))  # Training: dropout between.
  assert mlp_lib.pallas_chosen(
      dataclasses.replace(_model(mlp_dropout=0.1), deterministic=True))
  assert not mlp_lib.pallas_chosen(dataclasses.replace(_model(), decode=True))


@pytest.mark.parametrize("fields,says", [
    ({"mlp_dropout": 0.1}, "model.mlp_dropout=0.1"),
    ({"quantization": "fp8"}, "model.quantization='fp8'"),
    ({"lora_rank": 4, "lora_targets": ("query", "wo")}, "model.lora_targets"),
    ({"d_model": 40, "num_heads": 2}, "model.d_model=40"),
])
def test_pallas_mlp_refuses_what_its_kernels_cannot_compute_by_name(fields, says):
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  config = make_tiny_config("")
  config.model.update(dict(fields, mlp_impl="pallas"))
  with pytest.raises(ConfigError, match="model.mlp_impl") as raised:
    validate(config)
  assert says in str(raised.value) and "'xla'" in str(raised.value)
  config.model.mlp_impl = "auto"
  validate(config)  # auto keeps XLA's MLP there instead.


@pytest.mark.parametrize("key,logical", [("mlp_impl", "mlp"), ("loss_head_impl", "vocab")])
def test_pallas_kernels_refuse_a_mesh_that_shards_their_weights(key, logical):
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  config = make_tiny_config("")
  config.model[key] = "pallas"
  config.mesh.shape = (("data", -1), ("fsdp", 1), ("tensor", 2))
  rules = dict(config.mesh.rules)
  assert rules[logical] == "tensor", rules  # The default rules: tensor parallelism.
  with pytest.raises(ConfigError, match=rf"model.{key}.*shard '{logical}' over \['tensor'\]"):
    validate(config)
  config.model[key] = "auto"
  validate(config)  # auto keeps XLA's there.


def test_the_configs_alignment_is_the_kernels():
  from transformer.config import model as model_config  # pylint: disable=g-import-not-at-top
  assert model_config.PALLAS_MLP_ALIGN == mlp_pallas.ALIGN == head_pallas.ALIGN


def test_a_layer_whose_own_width_the_kernels_cannot_tile_keeps_xlas_mlp(monkeypatch):
  """MoE's shared expert has its own width, which validation does not see: "auto" keeps
  XLA's MLP for it; "pallas" says why."""
  monkeypatch.setattr(accelerator, "platform_of_mesh", lambda: "gpu")
  assert mlp_lib.pallas_chosen(_model(), width=64)
  assert not mlp_lib.pallas_chosen(_model(), width=72)
  with pytest.raises(ValueError, match="this MLP's width 72 is not a multiple of 16"):
    mlp_lib.pallas_chosen(_model(mlp_impl="pallas"), width=72)


def test_every_activation_has_its_kernel_function_or_is_refused_by_name(monkeypatch):
  """Each model.activation is one of mlp_pallas's (an activation added to mlp.py alone
  would be refused by name on a GPU, not fail with a KeyError at trace time)."""
  from transformer.config import model as model_config  # pylint: disable=g-import-not-at-top
  for name in model_config.ACTIVATIONS:
    assert name in mlp_pallas.ACTIVATIONS or name in mlp_pallas.GATED, name
  monkeypatch.setattr(mlp_pallas, "GATED", {})
  with pytest.raises(ValueError, match="no kernel computes model.activation='swiglu'"):
    mlp_lib.pallas_chosen(_model(activation="swiglu", mlp_impl="pallas"))
