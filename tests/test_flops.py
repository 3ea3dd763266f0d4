"""The model-FLOPs count against a hand computation, and the peak-FLOP/s lookup."""

import json

import jax
import numpy as np
import pytest
from flax import linen as nn

from configs import base
from transformer.training import flops
from transformer.config.model import ModelConfig
from transformer.model.models import make_model
from transformer.workdir import layout

# E 8, H 2, D 4, F 16, V 10: the shapes every hand count below uses.
SMALL = dict(vocab_size=10, d_model=8, num_heads=2, mlp_dim=16, max_len=16,
             activation="gelu_tanh", tie_embeddings=True)


def _config(**overrides) -> ModelConfig:
  config = base.get_config()
  config.model.update(**{**SMALL, **overrides})
  return ModelConfig.from_config(config.model)


def test_decoder_flops_by_hand():
  cfg = _config(arch="decoder", head="lm", num_layers=2)
  # Per layer: q, k, v, out 4 * 8 * 8 = 256 weights, MLP 2 * 8 * 16 = 256; tied head 10 * 8.
  weights = 2 * (256 + 256) + 80
  attention = 12 * 2 * 2 * 4 * 5  # 12 * layers * heads * head_dim * context, per token.
  per_token = 6 * weights + attention  # 6624 + 960
  assert flops.train_flops_per_step(cfg, batch_size=3, seq_len=5) == 3 * 5 * per_token == 113760


def test_encoder_mlm_flops_by_hand():
  cfg = _config(arch="encoder", head="mlm", num_layers=2)
  weights = 2 * (256 + 256) + 8 * 8 + 80  # The MLM transform, then the projection.
  assert flops.train_flops_per_step(cfg, 1, 5) == 5 * (6 * weights + 12 * 2 * 2 * 4 * 5)


def test_encoder_decoder_flops_by_hand():
  """2 + 1 layers, one kv head (GQA), source 7 and target 5 tokens."""
  cfg = _config(arch="encoder_decoder", head="lm", num_layers=2, num_decoder_layers=1,
                num_kv_heads=1)
  # Encoder, per source token: q, out 2 * 64, k, v 2 * 32, MLP 256; attention over 7.
  encoder = 7 * (6 * 2 * (128 + 64 + 256) + 12 * 2 * 2 * 4 * 7)
  # Decoder, per target token: self q, out, k, v 192, cross q, out 128, MLP 256, head 80;
  # attention over 5 (self) and 7 (cross). Cross k, v (64 weights) act on the 7 sources.
  decoder = 5 * (6 * (192 + 128 + 256 + 80) + 12 * 1 * 2 * 4 * (5 + 7)) + 7 * 6 * 64
  assert encoder + decoder == 75168
  assert flops.train_flops_per_step(cfg, 1, seq_len=5, source_len=7) == 75168


def test_lora_counts_the_frozen_weights_4_not_6():
  """LoRA: no gradient for the frozen weights (forward 2 + input gradient 2 per weight);
  attention's scores and values keep 3 x their forward."""
  cfg = _config(arch="decoder", head="lm", num_layers=2, lora_rank=2)
  weights = 2 * (256 + 256) + 80
  attention = 12 * 2 * 2 * 4 * 5
  assert flops.train_flops_per_step(cfg, 3, 5) == 3 * 5 * (4 * weights + attention)


def test_lora_counts_a_classification_head_in_full():
  """The classification head trains (6 per weight, once per row), the encoder is frozen."""
  cfg = _config(arch="encoder", head="classification", num_classes=3, num_layers=2,
                lora_rank=2)
  body = 5 * (4 * 2 * (256 + 256) + 12 * 2 * 2 * 4 * 5)
  assert flops.train_flops_per_step(cfg, 1, 5) == body + 6 * 8 * 3


@pytest.mark.parametrize("arch,head,activation", [("decoder", "lm", "gelu_tanh"),
                                                  ("decoder", "lm", "swiglu"),
                                                  ("encoder", "mlm", "gelu")])
def test_counted_weights_are_the_models_kernels(arch, head, activation):
  """With the attention term and the head's bias aside, the count is 6 x the real kernels."""
  cfg = _config(arch=arch, head=head, activation=activation, num_layers=2, use_bias=True)
  tokens = np.ones((1, 4), np.int32)
  params = nn.unbox(make_model(cfg).init(jax.random.PRNGKey(0), tokens, tokens, tokens))
  kernels = sum(x.size for path, x in jax.tree_util.tree_leaves_with_path(params)
                if path[-1].key in ("kernel", "embedding"))  # The tied head is a matmul.
  attention = 2 * 2 * 2 * 2 * 4 * 4 * 4  # Forward: 2 * 2 * layers * H * D * L * L.
  assert flops.forward_flops_per_sequence(cfg, 4) == 2 * 4 * kernels + attention


def test_published_peak_by_device_kind():
  assert flops.published_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
  assert flops.published_peak_flops("NVIDIA H100 PCIe") == 756e12
  assert flops.published_peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
  assert flops.published_peak_flops("TPU v5 lite") == 197e12
  assert flops.published_peak_flops("TPU v4") == 275e12
  assert flops.published_peak_flops("NVIDIA L40") is None  # Not "l4".
  assert flops.published_peak_flops("cpu") is None


def test_cpu_peak_is_measured_once_and_cached(tmp_path):
  rate, what = flops.peak_flops(str(tmp_path))
  assert rate > 1e8 and "float32 matmul rate measured" in what
  cached = json.loads((tmp_path / layout.PEAK_FLOPS).read_text())
  assert cached == {"flops_per_second": rate, "source": what}
  cached["flops_per_second"] = 123.0
  (tmp_path / layout.PEAK_FLOPS).write_text(json.dumps(cached))
  assert flops.peak_flops(str(tmp_path)) == (123.0, what)  # Read back, not measured again.
