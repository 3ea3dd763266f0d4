"""The paper presets: parameter counts from abstract shapes, and their headline settings.

Counts come from jax.eval_shape (nothing is materialised) and are checked against an
independent hand count written from the architecture, and against the published
figures. (GPT-2 small's 124,439,808 is checked in test_model.py.)
"""

from __future__ import annotations

import math

import jax
import ml_collections
import pytest
from flax import linen as nn

from configs import bert_base
from configs import transformer_base
from configs import transformer_big
from transformer.model import objectives
from transformer.config.model import ModelConfig, objective_of
from transformer.config.validation import validate
from transformer.model.models import make_model


def parameter_count(config: ml_collections.ConfigDict) -> int:
  """Parameters of config.model counted from abstract shapes."""
  validate(config)
  model_config = ModelConfig.from_config(config.model)
  objective = objective_of(model_config.arch, model_config.head)
  batch = objectives.init_batch(objective, 1, 8)
  abstract = jax.eval_shape(make_model(model_config).init,
                            jax.random.key(0), *objectives.model_inputs(objective, batch))
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nn.unbox(abstract["params"])))


def hand_count(model: ml_collections.ConfigDict) -> int:
  """The parameter count written out from the architecture, term by term.

  Covers what the presets use: biased dense layers and LayerNorms, MHA with
  head_dim = d_model / heads, a tied output projection, no final norm after post-norm
  blocks, BERT's embedding LayerNorm (counted with each token embedding) and its MLM head.
  """
  V, E, F = model.vocab_size, model.d_model, model.mlp_dim
  assert model.use_bias and model.norm_type == "layernorm" and model.tie_embeddings
  assert model.num_kv_heads in (0, model.num_heads) and model.head_dim in (0, E // model.num_heads)
  layer_norm = 2 * E  # scale + bias
  # q, k, v: E x (H x D) kernels + (H x D) biases; out: (H x D) x E + E; H x D = E.
  attention = 3 * (E * E + E) + (E * E + E)
  mlp = (E * F + F) + (F * E + E)  # wi, wo
  encoder_layer = attention + mlp + 2 * layer_norm
  decoder_layer = 2 * attention + mlp + 3 * layer_norm  # self + cross attention
  token_embedding = V * E + (layer_norm if model.embed_norm else 0)
  positions = model.max_len * E if model.position == "learned" else 0
  final_norms = 0 if model.norm == "post" else layer_norm

  if model.arch == "encoder_decoder":
    embeddings = token_embedding * (1 if model.share_embeddings else 2)
    decoder_layers = model.num_decoder_layers or model.num_layers
    return (embeddings + 2 * positions + model.num_layers * encoder_layer
            + decoder_layers * decoder_layer + 2 * final_norms)
  assert model.arch == "encoder" and model.head == "mlm"
  mlm_head = (E * E + E) + layer_norm + V  # transform dense, its norm, output bias
  return token_embedding + positions + model.num_layers * encoder_layer + final_norms + mlm_head


# preset, exact count, published count, relative tolerance to the published count.
PRESETS = {
    "bert_base": (bert_base.get_config, 109_512_762, 110e6, 0.01),
    "transformer_base": (transformer_base.get_config, 63_082_496, 65e6, None),
    "transformer_big": (transformer_big.get_config, 214_245_376, 213e6, 0.01),
}


@pytest.mark.parametrize("name", PRESETS)
def test_parameter_count(name):
  get_config, exact, published, tolerance = PRESETS[name]
  config = get_config()
  count = parameter_count(config)
  relative = (count - published) / published
  message = f"{name}: {count:,} parameters, {relative:+.2%} from the published {published:,.0f}"
  assert count == exact, message
  assert count == hand_count(config.model), message
  if tolerance is not None:
    assert abs(relative) < tolerance, message


def test_transformer_base_arithmetic():
  """The paper's base model, counted by hand (vocab 37000 shared by source, target and
  output): 63,082,496, 2.95% below the published 65M; the paper does not give its
  vocabulary's exact size."""
  V, E, F, N = 37000, 512, 2048, 6
  attention = 4 * (E * E + E)  # 1,050,624
  mlp = 2 * E * F + F + E  # 2,099,712
  encoder = N * (attention + mlp + 2 * 2 * E)  # 18,914,304
  decoder = N * (2 * attention + mlp + 3 * 2 * E)  # 25,224,192
  total = V * E + encoder + decoder
  assert (attention, mlp, encoder, decoder) == (1_050_624, 2_099_712, 18_914_304, 25_224_192)
  assert total == 63_082_496 == parameter_count(transformer_base.get_config())
  assert -0.03 < (total - 65e6) / 65e6 < -0.029


def test_parameter_count_follows_vocabulary():
  """Only the one shared embedding depends on the vocabulary."""
  config = transformer_base.get_config()
  config.model.vocab_size = 37000 + 3700
  assert parameter_count(config) == 63_082_496 + 3700 * 512


def test_transformer_base_headline_settings():
  config = transformer_base.get_config()
  m, o = config.model, config.optimizer
  assert (m.arch, m.head) == ("encoder_decoder", "lm")
  assert (m.num_layers, m.num_decoder_layers, m.d_model, m.num_heads, m.mlp_dim) == (
      6, 6, 512, 8, 2048)
  assert (m.norm, m.norm_type, m.activation, m.position) == (
      "post", "layernorm", "relu", "sinusoidal")
  assert m.scale_embeddings and m.share_embeddings and m.tie_embeddings and m.use_bias
  assert m.init == "xavier"  # Xavier-uniform kernels, N(0, d^-0.5) embeddings.
  assert (m.embed_dropout, m.residual_dropout, m.attention_dropout) == (0.1, 0.1, 0.0)
  assert (o.schedule, o.warmup_steps, o.noam_scale) == ("noam", 4000, 1.0)
  assert (o.b1, o.b2, o.eps, o.weight_decay) == (0.9, 0.98, 1e-9, 0.0)
  assert o.label_smoothing == 0.1
  assert objective_of(m.arch, m.head) == "seq2seq"


def test_transformer_big_headline_settings():
  base, big = transformer_base.get_config(), transformer_big.get_config()
  m = big.model
  assert (m.d_model, m.num_heads, m.mlp_dim) == (1024, 16, 4096)
  assert (m.embed_dropout, m.residual_dropout) == (0.3, 0.3)
  assert m.d_model // m.num_heads == 64  # Same head size as base.
  # Everything else is the base model's.
  changed = {k for k in base.model if base.model[k] != big.model[k]}
  assert changed == {"d_model", "num_heads", "mlp_dim", "embed_dropout", "residual_dropout"}
  for group in ("optimizer", "data", "train"):
    assert big[group].to_dict() == base[group].to_dict(), group


def test_bert_base_headline_settings():
  config = bert_base.get_config()
  m = config.model
  assert (m.arch, m.head, m.norm, m.position, m.activation) == (
      "encoder", "mlm", "post", "learned", "gelu")
  assert (m.num_layers, m.d_model, m.num_heads, m.mlp_dim, m.max_len, m.vocab_size) == (
      12, 768, 12, 3072, 512, 30522)
  assert m.norm_epsilon == 1e-12 and m.tie_embeddings
  assert m.init == "bert" and m.embed_norm  # Truncated normal 0.02; LayerNorm on embeddings.
  # Attention-probability dropout is only implemented by the einsum attention.
  assert m.attention_dropout == 0.1 and m.attention_impl == "einsum"
  assert objective_of(m.arch, m.head) == "masked_lm"


@pytest.mark.parametrize("module", [bert_base, transformer_base, transformer_big],
                         ids=lambda m: m.__name__.split(".")[-1])
def test_local_variant_validates_and_is_small(module):
  config = module.get_config("local")
  validate(config)
  assert config.data.tokenizer == "bytes"
  assert parameter_count(config) < 10_000_000
  with pytest.raises(ValueError, match="local"):
    module.get_config("nonsense")
