"""Models assembled from the shared Block, and the one registry that picks them.

Masks are built once here, at the top of each model, from integer segment ids
(0 = padding, 1, 2, ... = packed documents) and positions, then passed down.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.attention import make_attention_mask
from transformer.configuration import ModelConfig
from transformer.layers import Block, activation_constraint, make_norm, sinusoidal_table


class Embedder(nn.Module):
  """Token (+ position) embedding, and the tied output projection (`attend`)."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.token_embed = nn.Embed(
        cfg.vocab_size, cfg.d_model, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(0.02), ("vocab", "embed")))
    if cfg.position == "learned":
      self.position_embed = self.param(
          "position_embed",
          nn.with_logical_partitioning(nn.initializers.normal(0.01), ("length", "embed")),
          (cfg.max_len, cfg.d_model), cfg.param_dtype)

  def __call__(self, tokens_BL: jax.Array, positions_BL: jax.Array) -> jax.Array:
    cfg = self.config
    x_BLE = self.token_embed(tokens_BL)
    if cfg.scale_embeddings:
      x_BLE = x_BLE * jnp.sqrt(jnp.asarray(cfg.d_model, cfg.dtype))
    if cfg.position == "learned":
      x_BLE = x_BLE + jnp.take(self.position_embed, positions_BL, axis=0).astype(cfg.dtype)
    elif cfg.position == "sinusoidal":
      table = jnp.asarray(sinusoidal_table(cfg.max_len, cfg.d_model))
      x_BLE = x_BLE + jnp.take(table, positions_BL, axis=0).astype(cfg.dtype)
    return x_BLE

  def attend(self, x_BLE: jax.Array) -> jax.Array:
    """Logits against the token embedding, in float32.

    (nn.Embed.attend would cast back to the compute dtype, e.g. bfloat16.)
    """
    embedding_VE = self.token_embed.embedding.astype(jnp.float32)
    return jnp.einsum("BLE,VE->BLV", x_BLE.astype(jnp.float32), embedding_VE)


class Decoder(nn.Module):
  """Decoder-only language model (GPT): causal blocks over packed token rows."""

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BL: jax.Array, segment_ids_BL: jax.Array,
               positions_BL: jax.Array) -> jax.Array:
    """Returns float32 next-token logits [B, L, V].

    Args:
      tokens_BL: int token ids.
      segment_ids_BL: 0 for padding, 1, 2, ... for the packed documents of a row.
      positions_BL: position of each token inside its own document.
    """
    cfg = self.config
    mask_B1LL = make_attention_mask(segment_ids_BL, segment_ids_BL, causal=True,
                                    q_positions=positions_BL, kv_positions=positions_BL)
    embedder = Embedder(cfg, name="embedder")
    x_BLE = embedder(tokens_BL, positions_BL)
    x_BLE = nn.Dropout(cfg.embed_dropout, deterministic=cfg.deterministic)(x_BLE)
    x_BLE = activation_constraint(x_BLE)
    for i in range(cfg.num_layers):
      x_BLE = Block(cfg, causal=True, name=f"block_{i}")(x_BLE, mask_B1LL)
    if cfg.norm == "pre":  # Post-norm blocks already end in a norm.
      x_BLE = make_norm(cfg, "final_norm")(x_BLE)
    if cfg.tie_embeddings:
      return embedder.attend(x_BLE)
    return nn.Dense(
        cfg.vocab_size, use_bias=False, dtype=jnp.float32, param_dtype=cfg.param_dtype,
        name="lm_head",
        kernel_init=nn.with_logical_partitioning(
            nn.initializers.normal(0.02), ("embed", "vocab")))(x_BLE.astype(jnp.float32))


# The one place an architecture name becomes a class.
ARCHITECTURES: dict[str, type[nn.Module]] = {
    "decoder": Decoder,
}


def make_model(config: ModelConfig) -> nn.Module:
  """Instantiates `config.arch` from ARCHITECTURES; unknown names list the valid ones."""
  if config.arch not in ARCHITECTURES:
    raise ValueError(f"model.arch={config.arch!r} is not a known architecture; "
                     f"valid: {sorted(ARCHITECTURES)}")
  return ARCHITECTURES[config.arch](config)
