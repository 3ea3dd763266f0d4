"""Parameter initialisation per model family: `model.init` = "gpt2" | "bert" | "xavier".

- "gpt2" (Radford et al. 2019): every weight N(0, 0.02), learned positions N(0, 0.01);
  the projections that write into the residual stream (attention `out`, MLP `wo`)
  N(0, 0.02 / sqrt(n)), n = the residual additions of their own stack: 2 per block,
  3 per block with cross-attention (an encoder-decoder counts its encoder and decoder
  separately, with their own depths).
- "bert" (Devlin et al. 2019): every weight and embedding truncated normal (2 sigma)
  with sigma 0.02, the TF `truncated_normal_initializer(0.02)` of the BERT code.
- "xavier" (Vaswani et al. 2017, as in tensor2tensor and the Flax WMT example):
  dense kernels Xavier-uniform over (fan in, fan out), token embeddings
  N(0, d_model^-0.5) (the model scales them back up by sqrt(d_model)), learned
  positions N(0, 0.02).

Biases are zero and norm scales one in every family. Only the draw changes: the
parameter tree (and so every checkpoint) is the same for all three. Each family is one
`Family` in `INITS`, the table the three functions below read.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

from flax import linen as nn

from transformer.config.model import ModelConfig

Initializer = nn.initializers.Initializer
Axes = int | Sequence[int]


@dataclasses.dataclass(frozen=True)
class Family:
  """One `model.init` family: the draw of each kind of weight (biases zero, norms one).

  Attributes:
    dense: (config, in_axis, out_axis, residual_adds) -> a dense / einsum kernel's
      initializer; see `dense_kernel`.
    token_embedding: config -> the token embedding's (and tied output's) initializer.
    position_embedding: the learned position (and token-type) table's initializer.
  """

  dense: Callable[[ModelConfig, Axes, Axes, int], Initializer]
  token_embedding: Callable[[ModelConfig], Initializer]
  position_embedding: Initializer


def _gpt2_dense(config: ModelConfig, in_axis: Axes, out_axis: Axes,
                residual_adds: int) -> Initializer:
  del config, in_axis, out_axis  # A fixed scale, whatever the shape.
  return nn.initializers.normal(0.02 / math.sqrt(residual_adds) if residual_adds else 0.02)


def _bert_dense(config: ModelConfig, in_axis: Axes, out_axis: Axes,
                residual_adds: int) -> Initializer:
  del config, in_axis, out_axis, residual_adds  # One draw for every weight.
  return nn.initializers.truncated_normal(0.02)


def _xavier_dense(config: ModelConfig, in_axis: Axes, out_axis: Axes,
                  residual_adds: int) -> Initializer:
  del config, residual_adds  # Scaled by the fans alone.
  return nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=in_axis,
                                          out_axis=out_axis)


# model.init -> its family; the names config/model.py's INITS validates
# (tests/test_config_registries.py holds them equal).
INITS: dict[str, Family] = {
    "gpt2": Family(_gpt2_dense, lambda config: nn.initializers.normal(0.02),
                   nn.initializers.normal(0.01)),
    "bert": Family(_bert_dense, lambda config: nn.initializers.truncated_normal(0.02),
                   nn.initializers.truncated_normal(0.02)),
    "xavier": Family(_xavier_dense, lambda config: nn.initializers.normal(config.d_model ** -0.5),
                     nn.initializers.normal(0.02)),
}


def dense_kernel(config: ModelConfig, *, in_axis: Axes = -2, out_axis: Axes = -1,
                 residual_adds: int = 0) -> Initializer:
  """The kernel initializer of a dense / einsum projection.

  Args:
    config: reads `init`.
    in_axis: the kernel axes that make up the fan-in (Xavier only).
    out_axis: the kernel axes that make up the fan-out (Xavier only).
    residual_adds: for a projection into the residual stream, the number of residual
      additions in its stack (GPT-2's scaling); 0 for any other projection.
  """
  return INITS[config.init].dense(config, in_axis, out_axis, residual_adds)


def token_embedding(config: ModelConfig) -> Initializer:
  """The token-embedding initializer (also the tied output projection's)."""
  return INITS[config.init].token_embedding(config)


def position_embedding(config: ModelConfig) -> Initializer:
  """The learned-position-table initializer."""
  return INITS[config.init].position_embedding
