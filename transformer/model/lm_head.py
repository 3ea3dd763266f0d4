"""The vocabulary projection, as a value: the model's own arrays plus the one function that
turns final hidden states into float32 logits.

Every model projects through `LogitsHead.__call__`: the product in the compute dtype
(bfloat16 on accelerators: their matmul rate) accumulated in float32, the logits bias,
then Gemma 2's softcap. Asked for `hidden=True`, a model returns its final hidden
states and its `LogitsHead` instead of the logits, so that the loss can project a slice
of the sequence at a time (training/metrics.head_loss_sums) and never hold the float32
[B, L, V] logits whole: on `configs/llama.py:1b` at 8 x 2048 they and their gradient are
two 7.8 GiB buffers.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct

from transformer.config.model import ModelConfig
from transformer.model import initializers


@struct.dataclass
class LogitsHead:
  """Hidden states -> float32 logits, with the model's arrays (a pytree: differentiable).

  `weight` is the token embedding [V, E] when `tied`, else the lm_head kernel [E, V].
  """

  weight: jax.Array
  bias_V: jax.Array | None
  tied: bool = struct.field(pytree_node=False)
  dtype: Any = struct.field(pytree_node=False)
  softcap: float = struct.field(pytree_node=False)

  def __call__(self, x_BLE: jax.Array) -> jax.Array:
    """Float32 [B, L, V] logits of hidden states [B, L, E]."""
    equation = "BLE,VE->BLV" if self.tied else "BLE,EV->BLV"
    logits_BLV = jnp.einsum(equation, x_BLE.astype(self.dtype), self.weight.astype(self.dtype),
                            preferred_element_type=jnp.float32)
    if self.bias_V is not None:
      logits_BLV = logits_BLV + self.bias_V.astype(jnp.float32)[None, None, :]
    if self.softcap:  # Gemma 2: cap * tanh(logits / cap).
      logits_BLV = self.softcap * jnp.tanh(logits_BLV / self.softcap)
    return logits_BLV

  @property
  def vocab_size(self) -> int:
    return self.weight.shape[0] if self.tied else self.weight.shape[1]


class HeadKernel(nn.Module):
  """The untied lm_head's [E, V] kernel at `<name>/kernel` (the path nn.Dense gave it:
  checkpoints, `init_from` and the Hugging Face mappings read it there)."""

  config: ModelConfig

  @nn.compact
  def __call__(self) -> jax.Array:
    cfg = self.config
    return self.param("kernel", nn.with_logical_partitioning(
        initializers.dense_kernel(cfg), ("embed", "vocab")),
        (cfg.d_model, cfg.vocab_size), cfg.param_dtype)


def make_head(config: ModelConfig, weight: jax.Array, bias_V: jax.Array | None,
              *, tied: bool) -> LogitsHead:
  """The model's head: its compute dtype and softcap, the arrays given."""
  return LogitsHead(weight=weight, bias_V=bias_V, tied=tied, dtype=config.dtype,
                    softcap=float(config.final_logit_softcap or 0.0))
