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

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct

from transformer.config.model import ModelConfig
from transformer.model import initializers


# The auto chunk (train.logits_chunk = 0): a device's chunk of logits and their gradient
# within AUTO_LOGITS_BYTES, raised up to AUTO_LOGITS_MAX_BYTES until the chunk has 4 x
# d_model tokens. Each chunk reads the head's weight twice and adds into its float32
# gradient (12 bytes per weight in bfloat16), against 12 bytes per logit for the chunk's
# own traffic: a chunk of c tokens moves E / c of its logits' bytes again in weights.
# Measured on compile-only targets (docs/performance.md): gpt_small 32 x 1024 on an
# H100, 16 chunks of 2,048 tokens moved 18.6 GB in the loss head, 4 of 8,192 14.8 GB.
AUTO_LOGITS_BYTES = 1 << 30
AUTO_LOGITS_MAX_BYTES = 1 << 32


def logits_chunk_length(chunk: int, length: int, vocab_size: int, rows: int,
                        d_model: int = 0, bytes_per_logit: int = 4) -> int:
  """Positions projected at a time by head_loss_sums (train.logits_chunk; 0 = auto).

  Auto: the largest power of two of positions whose chunk ([rows, c, vocab_size] logits
  and their gradient, `bytes_per_logit` together) fits AUTO_LOGITS_BYTES, raised towards
  4 x d_model tokens within AUTO_LOGITS_MAX_BYTES; the whole sequence when it fits (no
  loop: character and small-vocabulary models).
  """
  if chunk > 0:
    return min(chunk, length)
  per_position = max(1, rows) * vocab_size * bytes_per_logit

  def fitting(budget: int) -> int:
    return 1 << max(0, (budget // per_position).bit_length() - 1)

  c = fitting(AUTO_LOGITS_BYTES)
  wanted = -(-4 * d_model // max(1, rows))  # Positions for 4 x d_model tokens.
  if c < wanted:
    c = max(c, min(fitting(AUTO_LOGITS_MAX_BYTES), 1 << (wanted - 1).bit_length()))
  return min(length, c)


def rows_per_device(rows: int) -> int:
  """The batch rows one device holds while tracing under a mesh and logical rules (the
  mesh axes "batch" maps to divide them), else `rows`."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return rows
  axes = nn.logical_to_mesh_axes(("batch",))[0]
  if axes is None:
    return rows
  shards = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
  return max(1, rows // shards)


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
  # model.loss_head_impl: "auto" | "xla" | "pallas" (training/metrics.py's head_spec).
  impl: str = struct.field(pytree_node=False, default="xla")

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
                    softcap=float(config.final_logit_softcap or 0.0),
                    impl=config.loss_head_impl)
