"""The LM loss projected a chunk of positions at a time (train.logits_chunk).

metrics.head_loss_sums must give loss_sums of the whole logits, with the same
gradients, for every head the models have (tied or not, logits bias, MLM bias, softcap),
every objective's weights, label smoothing, z-loss and never_predict, lengths the chunk
does not divide; and the compiled step must not hold float32 [B, L, V] logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.config.validation import validate
from transformer.model import lm_head, models, objectives
from transformer.training import metrics

VOCAB, ROWS, LENGTH = 97, 3, 24

HEADS = [  # arch, tie_embeddings, logits_bias, final_logit_softcap
    ("decoder", True, False, 0.0),
    ("decoder", False, True, 30.0),
    ("encoder", True, False, 0.0),  # MLM: the mlm_bias
    ("encoder_decoder", False, True, 0.0),
    ("encoder_decoder", True, False, 5.0),
]


def _model_and_batch(arch, tie, bias, cap):
  c = base.get_config().model
  c.update(arch=arch, vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, mlp_dim=64,
           max_len=64, tie_embeddings=tie, logits_bias=bias, final_logit_softcap=cap)
  if arch == "encoder":
    c.head = "mlm"
  cfg = ModelConfig.from_config(c)
  model, objective = models.make_model(cfg), objective_lib.resolve(cfg)
  rng = np.random.default_rng(0)
  batch = objectives.init_batch(objective, ROWS, LENGTH)
  for key in batch:
    if "position" in key:
      batch[key] = np.broadcast_to(np.arange(LENGTH), (ROWS, LENGTH)).astype(np.int32)
    elif "segment" not in key:
      batch[key] = rng.integers(1, VOCAB, (ROWS, LENGTH)).astype(np.int32)
  batch[objective.target] = rng.integers(0, VOCAB, (ROWS, LENGTH)).astype(np.int32)
  weights = rng.random((ROWS, LENGTH)).astype(np.float32)
  weights[:, -3:] = 0.0  # Padding.
  batch["weights"] = weights
  params = model.init(jax.random.PRNGKey(0), *objectives.model_inputs(objective, batch))
  return model, objective, batch, params["params"]


def _sums_and_grads(model, objective, batch, params, *, hidden, chunk, **loss):
  forward = objectives.make_forward(model, objective, hidden=hidden)

  def objective_sum(p):
    outputs, targets, weights, _ = forward(p, batch)
    if hidden:
      assert isinstance(outputs, tuple)  # (hidden states, LogitsHead), not logits.
    sums = metrics.objective_sums(outputs, targets, weights, chunk=chunk, **loss)
    return sums["objective_sum"], sums

  (_, sums), grads = jax.value_and_grad(objective_sum, has_aux=True)(params)
  return sums, grads


# The encoder-decoder heads (~9 s each on two cores) run in the slow pass.
@pytest.mark.parametrize("arch,tie,bias,cap", [
    pytest.param(*head, marks=pytest.mark.slow) if head[0] == "encoder_decoder" else head
    for head in HEADS], ids=[f"{a}-tie{t}-bias{b}-cap{c}" for a, t, b, c in HEADS])
def test_chunked_sums_and_gradients_equal_the_whole_logits(arch, tie, bias, cap):
  model, objective, batch, params = _model_and_batch(arch, tie, bias, cap)
  loss = dict(label_smoothing=0.1, z_loss=1e-3, never_predict=(3,))
  whole, whole_grads = _sums_and_grads(model, objective, batch, params, hidden=False,
                                       chunk=0, **loss)
  assert set(whole) == {"objective_sum", "loss_sum", "correct_sum", "weight_sum",
                        "z_loss_sum"}
  for chunk in (5,):  # 5 does not divide 24: padded with weight-0 positions.
    sums, grads = _sums_and_grads(model, objective, batch, params, hidden=True,
                                  chunk=chunk, **loss)
    for key, value in whole.items():
      np.testing.assert_allclose(sums[key], value, rtol=2e-6, err_msg=f"{key}, chunk {chunk}")
    for path_and_a, b in zip(jax.tree_util.tree_leaves_with_path(whole_grads),
                             jax.tree.leaves(grads)):
      path, a = path_and_a
      np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-4,
                                 err_msg=f"{jax.tree_util.keystr(path)}, chunk {chunk}")


def test_head_is_the_models_own_projection():
  """The logits a model returns are its LogitsHead applied to its hidden states."""
  model, objective, batch, params = _model_and_batch("decoder", False, True, 30.0)
  inputs = objectives.model_inputs(objective, batch)
  logits = model.apply({"params": params}, *inputs)
  x_BLE, head = model.apply({"params": params}, *inputs, hidden=True)
  assert head.weight is not None and head.weight.shape == (32, VOCAB)  # lm_head/kernel.
  np.testing.assert_array_equal(head(x_BLE), logits)
  assert logits.dtype == jnp.float32 and logits.shape == (ROWS, LENGTH, VOCAB)


@pytest.mark.parametrize("chunk,length,vocab,rows,d_model,per_logit,expected", [
    (0, 256, 65, 64, 384, 8, 256),           # A character model: one chunk, no loop.
    (0, 1024, 32768, 32, 768, 4, 256),       # gpt_small in bf16: 8,192 tokens in 1 GiB.
    (0, 1024, 32768, 32, 768, 8, 128),       # The same in float32: half the tokens.
    (0, 2048, 128256, 16, 2048, 4, 512),     # llama 1B: raised to 4 x d_model tokens.
    (0, 32768, 128256, 1, 2048, 4, 8192),    # One long row a chip: few, large chunks.
    (0, 16, 128256, 1, 2048, 4, 16),         # Never longer than the sequence.
    (100, 64, 50257, 8, 768, 4, 64),         # An explicit chunk at most the length.
    (7, 64, 50257, 8, 768, 4, 7),
])
def test_chunk_length(chunk, length, vocab, rows, d_model, per_logit, expected):
  assert lm_head.logits_chunk_length(chunk, length, vocab, rows, d_model,
                                     per_logit) == expected


def test_rows_per_device_reads_the_batch_rule():
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  assert lm_head.rows_per_device(32) == 32  # No mesh: the whole batch.
  mesh = jax.sharding.AbstractMesh((2, 4, 1), ("data", "fsdp", "tensor"))
  with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(
      (("batch", ("data", "fsdp")),)):
    assert lm_head.rows_per_device(32) == 4


def test_compiled_step_never_holds_the_whole_logits():
  """With chunks of 8 of a 64-position, 512-vocabulary row, no f32[.., 64, 512] buffer."""
  c = base.get_config().model
  c.update(arch="decoder", vocab_size=512, d_model=32, num_heads=4, num_layers=1, mlp_dim=64,
           max_len=64)
  cfg = ModelConfig.from_config(c)
  model, objective = models.make_model(cfg), objective_lib.resolve(cfg)
  batch = objectives.init_batch(objective, 2, 64)
  batch[objective.target] = np.zeros((2, 64), np.int32)
  batch["weights"] = np.ones((2, 64), np.float32)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          *objectives.model_inputs(objective, batch))["params"]

  def step(p, chunk, hidden):
    def objective_sum(p):
      outputs, targets, weights, _ = objectives.make_forward(model, objective, hidden)(p, batch)
      return metrics.objective_sums(outputs, targets, weights, chunk=chunk)["objective_sum"]
    return jax.grad(objective_sum)(p)

  whole = jax.jit(lambda p: step(p, 0, False)).lower(params).compile().as_text()
  chunked = jax.jit(lambda p: step(p, 8, True)).lower(params).compile().as_text()
  assert "f32[2,64,512]" in whole
  assert "f32[2,64,512]" not in chunked
  assert "f32[2,8,512]" in chunked


def test_logits_chunk_must_be_a_count():
  config = base.get_config()
  config.train.logits_chunk = -4
  with pytest.raises(ConfigError, match=r"config\.train\.logits_chunk=-4"):
    validate(config)
