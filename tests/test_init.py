"""`model.init`: each family's distributions, GPT-2's per-stack residual scaling, and
BERT's embedding LayerNorm (`model.embed_norm`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from configs import base
from transformer.config.model import ModelConfig
from transformer.model.models import make_model

E, F = 64, 256


def init_params(**model) -> dict[str, np.ndarray]:
  """Flat {"a/b/kernel": array} of a small model's initial parameters."""
  config = base.get_config()
  # Scanned: one block per stack to compile (the statistics pool over the layers axis).
  config.model.update(vocab_size=512, d_model=E, num_heads=4, mlp_dim=F, max_len=16,
                      dtype="float32", scan_layers=True, **model)
  cfg = ModelConfig.from_config(config.model)
  ids = jnp.ones((1, 4), jnp.int32)
  inputs = (ids,) * 6 if cfg.arch == "encoder_decoder" else (ids,) * 3
  params = jax.jit(make_model(cfg).init)(jax.random.key(0), *inputs)["params"]
  flat = traverse_util.flatten_dict(nn.unbox(params), sep="/")
  return {k: np.asarray(v) for k, v in flat.items()}


def stds(params: dict[str, np.ndarray], prefix: str, suffix: str) -> list[float]:
  found = [float(v.std()) for k, v in params.items()
           if k.startswith(prefix) and k.endswith(suffix)]
  assert found, f"no parameter {prefix}...{suffix}"
  return found


def test_gpt2_residual_init_counts_each_stack_with_its_own_depth():
  """2 encoder layers x 2 adds; 8 decoder layers x 3 adds (self, cross, MLP)."""
  params = init_params(arch="encoder_decoder", num_layers=2, num_decoder_layers=8,
                       init="gpt2")
  expected = {"encoder": 0.02 / math.sqrt(2 * 2), "decoder": 0.02 / math.sqrt(3 * 8)}
  for stack, std in expected.items():
    for suffix in ("attention/out/kernel", "mlp/wo/kernel"):
      for got in stds(params, stack, suffix):
        assert got == pytest.approx(std, rel=0.15), (stack, suffix, got, std)
  assert expected["decoder"] == pytest.approx(0.0041, abs=1e-4)
  # Projections that do not write into the residual stream keep 0.02.
  for got in stds(params, "decoder", "cross_attention/query/kernel"):
    assert got == pytest.approx(0.02, rel=0.1)


def test_gpt2_decoder_only_residual_init():
  params = init_params(arch="decoder", num_layers=3, init="gpt2")
  for got in stds(params, "block", "mlp/wo/kernel") + stds(params, "block", "out/kernel"):
    assert got == pytest.approx(0.02 / math.sqrt(6), rel=0.15)
  assert float(params["embedder/token_embed/embedding"].std()) == pytest.approx(0.02, rel=0.05)
  assert float(params["embedder/position_embed"].std()) == pytest.approx(0.01, rel=0.1)


def test_bert_init_is_truncated_normal_everywhere():
  params = init_params(arch="encoder", head="mlm", num_layers=2, init="bert",
                       embed_norm=True)
  # A normal(0.02) truncated at two sigma has std 0.02 * 0.8796.
  weights = [k for k in params if k.endswith(("kernel", "embedding", "position_embed"))]
  assert len(weights) >= 9  # 6 per scanned block + mlm_transform + 2 embeddings.
  for key in weights:
    w = params[key]
    assert np.abs(w).max() <= 0.04 + 1e-7, key
    assert float(w.std()) == pytest.approx(0.02 * 0.8796, rel=0.15), key


def test_xavier_init_is_uniform_over_fan_in_and_out():
  params = init_params(arch="encoder_decoder", num_layers=2, position="sinusoidal",
                       scale_embeddings=True, init="xavier")
  # Query/key/value [E, H, D]: fan in E, fan out H * D = E.
  limit = math.sqrt(6.0 / (E + E))
  qkv = [k for k in params if k.endswith(("query/kernel", "key/kernel", "value/kernel"))]
  assert qkv
  for key in qkv:
    assert np.abs(params[key]).max() <= limit
    assert float(params[key].std()) == pytest.approx(limit / math.sqrt(3), rel=0.1), key
  wi = math.sqrt(6.0 / (E + F))  # MLP [E, F]; the residual scaling does not apply.
  for key in [k for k in params if k.endswith(("mlp/wi/kernel", "mlp/wo/kernel"))]:
    assert float(params[key].std()) == pytest.approx(wi / math.sqrt(3), rel=0.1), key
  embedding = params["source_embedder/token_embed/embedding"]
  assert float(embedding.std()) == pytest.approx(E ** -0.5, rel=0.05)


def test_embed_norm_normalises_the_embedding_sum():
  config = base.get_config()
  config.model.update(arch="encoder", head="mlm", vocab_size=64, d_model=32, num_heads=2,
                      mlp_dim=64, num_layers=1, max_len=8, dtype="float32",
                      embed_norm=True, norm="post", norm_epsilon=1e-12)
  cfg = ModelConfig.from_config(config.model)
  ids = jnp.arange(8, dtype=jnp.int32)[None]
  variables = make_model(cfg).init(jax.random.key(0), ids, jnp.ones_like(ids), ids)
  norm = nn.unbox(variables["params"]["embedder"]["embed_norm"])
  assert norm["scale"].shape == norm["bias"].shape == (32,)
  # The embedder's output (scale 1, bias 0 at init) has zero mean and unit variance per token.
  from transformer.model.models import Embedder  # pylint: disable=g-import-not-at-top
  x = Embedder(cfg).apply({"params": nn.unbox(variables["params"]["embedder"])}, ids, ids)
  np.testing.assert_allclose(np.asarray(x.mean(-1)), 0.0, atol=1e-5)
  np.testing.assert_allclose(np.asarray(x.var(-1)), 1.0, rtol=1e-3)
  without = dict(config.model, embed_norm=False)
  cfg_without = ModelConfig.from_config(type(config.model)(without))
  variables = make_model(cfg_without).init(jax.random.key(0), ids, jnp.ones_like(ids), ids)
  assert "embed_norm" not in variables["params"]["embedder"]
