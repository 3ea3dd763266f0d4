"""The three topologies, all built from the shared Block, and the registry that picks them.

Masks and position biases are built once here, at the top of each stack, from
integer segment ids (0 = padding, 1, 2, ... = packed documents) and positions,
then passed down to every block.

Shape letters as in the package legend (transformer/model/__init__.py): in an
encoder-decoder, S is the source's length and L the target's.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.model import attention_ops
from transformer.model import context
from transformer.model import initializers
from transformer.model.lm_head import HeadKernel, LogitsHead, make_head
from transformer.model import positions as positions_lib
from transformer.model.attention import make_attention_mask
from transformer.config.model import ModelConfig
from transformer.model.layers import StackInputs, activation_constraint, make_norm, run_blocks
from transformer.model.mlp import ACTIVATION_FNS
from transformer.model.norms import NORM_PLACEMENTS
from transformer.model.dropout import Dropout


class Embedder(nn.Module):
  """Token (+ absolute position) embedding; its table is the tied LM head's weight."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.token_embed = nn.Embed(
        cfg.vocab_size, cfg.d_model, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        embedding_init=nn.with_logical_partitioning(
            initializers.token_embedding(cfg), ("vocab", "embed")))
    absolute = positions_lib.POSITIONS[cfg.position].embedding_table
    self.position_table = absolute(self, cfg) if absolute is not None else None
    if cfg.num_token_types:  # BERT's segment A/B table; single-segment inputs add row 0.
      self.token_type_embed = self.param(
          "token_type_embed",
          nn.with_logical_partitioning(initializers.position_embedding(cfg), (None, "embed")),
          (cfg.num_token_types, cfg.d_model), cfg.param_dtype)
    if cfg.embed_norm:  # BERT normalises the embedding sum before the first block.
      self.embed_norm = make_norm(cfg, "embed_norm")

  def __call__(self, tokens_BL: jax.Array, positions_BL: jax.Array) -> jax.Array:
    cfg = self.config
    x_BLE = self.token_embed(tokens_BL)
    if cfg.scale_embeddings:
      x_BLE = x_BLE * jnp.sqrt(jnp.asarray(cfg.d_model, cfg.dtype))
    if cfg.num_token_types:
      x_BLE = x_BLE + self.token_type_embed[0].astype(cfg.dtype)[None, None, :]
    if self.position_table is not None:
      x_BLE = x_BLE + jnp.take(self.position_table, positions_BL, axis=0).astype(cfg.dtype)
    if cfg.embed_norm:
      x_BLE = self.embed_norm(x_BLE).astype(cfg.dtype)
    return x_BLE

  @property
  def embedding_VE(self) -> jax.Array:
    """The [V, E] token table (the tied LM head's weight)."""
    return self.token_embed.embedding


def self_attention_bias(config: ModelConfig, q_positions_BL: jax.Array,
                        kv_positions_BS: jax.Array, *, causal: bool,
                        name: str) -> jax.Array | None:
  """The additive logit bias of a stack's self-attention (T5 relative or ALiBi), or None.

  Must be called inside a compact module; T5's bias table is shared by the stack.
  """
  bias = positions_lib.POSITIONS[config.position].self_attention_bias
  if bias is None:
    return None
  return bias(config, q_positions_BL, kv_positions_BS, causal=causal, name=name)


def _stack(config: ModelConfig, num_layers: int, x_BLE: jax.Array, segment_ids_BL: jax.Array,
           positions_BL: jax.Array, *, causal: bool, bias_name: str,
           encoded_BSE: jax.Array | None = None,
           encoded_segment_ids_BS: jax.Array | None = None,
           prefix_BL: jax.Array | None = None) -> jax.Array:
  """Masks + position bias + the blocks of one stack (encoder or decoder side).

  `prefix_BL` (a causal stack's prefix LM rows; nonzero on each segment's prefix) makes
  the self-attention mask bidirectional among a segment's prefix tokens
  (make_attention_mask); when decoding, it marks the prompt's slots, which must all be
  written by the call that carries it (Decoder.__call__'s contract).

  When decoding, the keys are the cache's max_len slots, slot s holding position s:
  a query at position p sees slots <= p, which are exactly the ones filled so far.
  A stack has cross-attention when given `encoded_segment_ids_BS`; `encoded_BSE` may
  then be None, on decoding steps after the first (the keys/values are cached).
  """
  # Context parallelism (context.py): the stack runs in the zig-zag order, undone on its
  # output; masks and biases read positions and segment ids, so they follow the order.
  shards = 1 if config.decode else context.size()
  # jnp: numpy inputs (model.init's batch) would build an [L, L] mask eagerly in numpy.
  if prefix_BL is not None and not causal:
    raise ValueError("a prefix (prefix_BL) is a causal stack's: a bidirectional one "
                     "already sees every token of its segment")
  x_BLE, segment_ids_BL, positions_BL = (context.zigzag(jnp.asarray(a), shards)
                                         for a in (x_BLE, segment_ids_BL, positions_BL))
  if prefix_BL is not None:
    prefix_BL = context.zigzag(jnp.asarray(prefix_BL), shards)
  kv_segment_ids_BS, kv_positions_BS, kv_prefix_BS = segment_ids_BL, positions_BL, prefix_BL
  if config.decode and causal:
    batch = segment_ids_BL.shape[0]
    kv_positions_BS = jnp.broadcast_to(jnp.arange(config.max_len), (batch, config.max_len))
    kv_segment_ids_BS = jnp.ones_like(kv_positions_BS)
    if prefix_BL is not None:  # The cache's slots that this call's prefix tokens fill.
      kv_prefix_BS = jnp.zeros((batch, config.max_len), jnp.int32).at[
          jnp.arange(batch)[:, None], positions_BL].max(prefix_BL.astype(jnp.int32))
  masks = functools.partial(make_attention_mask, segment_ids_BL, kv_segment_ids_BS,
                            causal=causal, q_positions=positions_BL,
                            kv_positions=kv_positions_BS, q_prefix=prefix_BL,
                            kv_prefix=kv_prefix_BS)
  inputs = StackInputs(
      positions_BL=positions_BL,
      segment_ids_BL=None if config.decode else segment_ids_BL,
      self_mask_B1LS=masks(),
      self_bias_BHLS=self_attention_bias(config, positions_BL, kv_positions_BS,
                                         causal=causal, name=bias_name),
      prefix=prefix_BL is not None)
  if config.sliding_window:  # For the layers window_pattern marks local.
    inputs = inputs.replace(local_mask_B1LS=masks(window=config.sliding_window))
  cross_attention = encoded_segment_ids_BS is not None
  if cross_attention:
    # Cross-attention: target segment k sees exactly source segment k of the same row.
    inputs = inputs.replace(encoded_BSE=encoded_BSE, encoded_segment_ids_BS=encoded_segment_ids_BS,
                            cross_mask_B1LS=make_attention_mask(
        segment_ids_BL, encoded_segment_ids_BS, causal=False))
  x_BLE = activation_constraint(
      Dropout(config.embed_dropout, deterministic=config.deterministic)(x_BLE))
  x_BLE = run_blocks(config, num_layers, x_BLE, inputs, cross_attention=cross_attention,
                     causal=causal)
  # Constrained again: the natural order's shards are not a reshape of the zig-zag ones,
  # and unconstrained GSPMD gathered the whole row (every chip computed all the logits).
  return activation_constraint(context.unzigzag(x_BLE, shards))


def _final_norm(config: ModelConfig, x_BLE: jax.Array, name: str) -> jax.Array:
  # In the compute dtype, as the blocks' outputs: every head casts to it before its
  # matmul anyway, and the loss head's chunks then read and its gradient writes half
  # the bytes (bfloat16 on accelerators).
  if not NORM_PLACEMENTS[config.norm].ends_in_norm:
    return make_norm(config, name)(x_BLE).astype(config.dtype)
  return x_BLE


def _single_stack(config: ModelConfig, tokens_BL: jax.Array, segment_ids_BL: jax.Array,
                  positions_BL: jax.Array, *, causal: bool,
                  prefix_BL: jax.Array | None = None) -> tuple[Embedder, jax.Array]:
  """Embedding + blocks + final norm of an encoder-only or decoder-only model.

  Called inside the model's compact method, so the parameters sit at its top level
  (`embedder`, `block_0`, ..., `final_norm`), a checkpoint API kept stable.
  """
  embedder = Embedder(config, name="embedder")
  x_BLE = _stack(config, config.num_layers, embedder(tokens_BL, positions_BL),
                 segment_ids_BL, positions_BL, causal=causal, bias_name="relative_bias",
                 prefix_BL=prefix_BL)
  return embedder, _final_norm(config, x_BLE, "final_norm")


class ClassificationHead(nn.Module):
  """Pools the sequence ("cls" first token, "mean" over real tokens, "last" real token)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BLE: jax.Array, segment_ids_BL: jax.Array,
               pooler: nn.Module | None = None) -> jax.Array:
    """Pools, applies `pooler` (the model's, when it has one), dropout and the classifier."""
    cfg = self.config
    real_BL = (segment_ids_BL > 0).astype(jnp.float32)
    x_BLE = x_BLE.astype(jnp.float32)
    if cfg.pooling == "cls":
      pooled_BE = x_BLE[:, 0]
    elif cfg.pooling == "mean":
      pooled_BE = (jnp.einsum("BLE,BL->BE", x_BLE, real_BL)
                   / jnp.maximum(real_BL.sum(axis=1, keepdims=True), 1.0))
    else:  # "last": the last real token, the only one a causal decoder lets see everything.
      last_B = jnp.maximum(real_BL.sum(axis=1).astype(jnp.int32) - 1, 0)
      pooled_BE = jnp.take_along_axis(x_BLE, last_B[:, None, None], axis=1)[:, 0]
    if pooler is not None:
      pooled_BE = jnp.tanh(pooler(pooled_BE))
    pooled_BE = Dropout(cfg.residual_dropout, deterministic=cfg.deterministic)(pooled_BE)
    return nn.Dense(
        cfg.num_classes, dtype=jnp.float32, param_dtype=cfg.param_dtype, name="classifier",
        kernel_init=nn.with_logical_partitioning(initializers.dense_kernel(cfg),
                                                 ("embed", None)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)))(pooled_BE)


def _pooler(config: ModelConfig) -> nn.Dense | None:
  """BERT's pooler (dense, then tanh in the head) at the model's top level, or None.

  Top level, so that an MLM encoder (which creates it without using it) and a
  classifier share its path and `init_from` carries it over.
  """
  if not config.pooler:
    return None
  return nn.Dense(
      config.d_model, dtype=jnp.float32, param_dtype=config.param_dtype, name="pooler",
      kernel_init=nn.with_logical_partitioning(initializers.dense_kernel(config),
                                               ("embed", None)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)))


def _logits_bias(module: nn.Module, config: ModelConfig) -> jax.Array:
  """The [V] `logits_bias` parameter of `module` (Marian's final_logits_bias)."""
  return module.param("logits_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                  ("vocab",)),
                      (config.vocab_size,), config.param_dtype)


def _never_predicted(config: ModelConfig, logits_BLV: jax.Array) -> jax.Array:
  """When decoding, -inf on the `never_predict` ids (metrics.loss_sums leaves them out)."""
  if not (config.decode and config.never_predict):
    return logits_BLV
  return logits_BLV.at[:, :, jnp.asarray(config.never_predict)].set(-jnp.inf)


def _lm_head(config: ModelConfig, embedder: Embedder, bias_V: jax.Array | None,
             kernel: nn.Module | None = None) -> LogitsHead:
  """The LM head: tied to the embedding, or the `lm_head` kernel (created here when a
  compact model gives no `kernel` module of its own)."""
  if config.tie_embeddings:
    return make_head(config, embedder.embedding_VE, bias_V, tied=True)
  kernel = kernel if kernel is not None else HeadKernel(config, name="lm_head")
  return make_head(config, kernel(), bias_V, tied=False)


def _outputs(config: ModelConfig, head: LogitsHead, x_BLE: jax.Array, hidden: bool
             ) -> jax.Array | tuple[jax.Array, LogitsHead]:
  """(hidden states, head) when asked for `hidden`, else the float32 [B, L, V] logits."""
  if hidden:
    return x_BLE, head
  return _never_predicted(config, head(x_BLE))


class Decoder(nn.Module):
  """Decoder-only model (GPT): causal blocks; next-token logits or a classification."""

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BL: jax.Array, segment_ids_BL: jax.Array,
               positions_BL: jax.Array, prefix_BL: jax.Array | None = None,
               hidden: bool = False) -> Any:
    """Returns float32 logits: [B, L, V] for the LM head, [B, num_classes] for classification.

    Args:
      tokens_BL: int token ids.
      segment_ids_BL: 0 for padding, 1, 2, ... for the packed documents of a row.
      positions_BL: position of each token inside its own document.
      prefix_BL: a prefix LM's rows (the batch's `prefix` field): 1 on the tokens of each
        packed segment's prefix (its inputs part), 0 elsewhere. Prefix tokens of a
        segment attend to each other both ways; every other query is causal (T5's
        decoder_causal_attention). None: causal everywhere.
      hidden: return (final hidden states [B, L, E], LogitsHead) instead of LM logits.

    Decoding with a KV cache (config.decode): the prompt is the prefix. Its first
    (prefill) call passes the whole prompt with `prefix_BL` 1 on its real tokens, so
    that every prompt token's keys are in the cache before any prompt query attends
    (a prompt split over several calls would let its early tokens miss later ones);
    later calls pass their generated tokens with `prefix_BL` 0 (or None): they attend
    causally to everything cached, prompt included.
    """
    cfg = self.config
    embedder, x_BLE = _single_stack(cfg, tokens_BL, segment_ids_BL, positions_BL, causal=True,
                                    prefix_BL=prefix_BL)
    if objective_lib.resolve(cfg).classifies:
      return ClassificationHead(cfg, name="classification_head")(x_BLE, segment_ids_BL,
                                                                 _pooler(cfg))
    bias_V = _logits_bias(self, cfg) if cfg.logits_bias else None
    return _outputs(cfg, _lm_head(cfg, embedder, bias_V), x_BLE, hidden)


class Encoder(nn.Module):
  """Encoder-only model (BERT): bidirectional blocks; masked-LM logits or a classification."""

  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BL: jax.Array, segment_ids_BL: jax.Array,
               positions_BL: jax.Array, hidden: bool = False) -> Any:
    """Returns float32 logits: [B, L, V] for the MLM head, [B, num_classes] for classification.

    With `hidden`, the MLM head's transformed states [B, L, E] and its LogitsHead instead.
    """
    cfg = self.config
    embedder, x_BLE = _single_stack(cfg, tokens_BL, segment_ids_BL, positions_BL,
                                    causal=False)
    pooler = _pooler(cfg)
    if objective_lib.resolve(cfg).classifies:
      return ClassificationHead(cfg, name="classification_head")(x_BLE, segment_ids_BL, pooler)
    if pooler is not None:  # Unused by the MLM head; created so that fine-tuning gets it.
      pooler(x_BLE[:, 0].astype(jnp.float32))
    # BERT's MLM head: dense + activation + norm, then the tied projection plus a bias.
    h_BLE = nn.Dense(
        cfg.d_model, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="mlm_transform",
        kernel_init=nn.with_logical_partitioning(initializers.dense_kernel(cfg),
                                                 ("embed", None)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)))(x_BLE)
    h_BLE = make_norm(cfg, "mlm_norm")(ACTIVATION_FNS[cfg.activation](h_BLE))
    bias_V = self.param("mlm_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                 ("vocab",)),
                        (cfg.vocab_size,), cfg.param_dtype)
    return _outputs(cfg, _lm_head(cfg, embedder, bias_V), h_BLE, hidden)


class Stack(nn.Module):
  """One side of the encoder-decoder: blocks + final norm, under its own name scope."""

  config: ModelConfig
  num_layers: int
  causal: bool

  @nn.compact
  def __call__(self, x_BLE: jax.Array, segment_ids_BL: jax.Array, positions_BL: jax.Array,
               encoded_BSE: jax.Array | None = None,
               encoded_segment_ids_BS: jax.Array | None = None) -> jax.Array:
    x_BLE = _stack(self.config, self.num_layers, x_BLE, segment_ids_BL, positions_BL,
                   causal=self.causal, bias_name="relative_bias", encoded_BSE=encoded_BSE,
                   encoded_segment_ids_BS=encoded_segment_ids_BS)
    return _final_norm(self.config, x_BLE, "final_norm")


class EncoderDecoder(nn.Module):
  """The paper's model: encoder + decoder with cross-attention in every decoder block."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.source_embedder = Embedder(cfg)
    self.target_embedder = self.source_embedder if cfg.share_embeddings else Embedder(cfg)
    self.encoder = Stack(cfg, cfg.num_layers, causal=False)
    self.decoder = Stack(cfg, cfg.num_decoder_layers, causal=True)
    if not cfg.tie_embeddings:
      self.lm_head = HeadKernel(cfg)
    if cfg.logits_bias:
      self.logits_bias = _logits_bias(self, cfg)

  def encode(self, inputs_BS: jax.Array, inputs_segment_ids_BS: jax.Array,
             inputs_positions_BS: jax.Array) -> jax.Array:
    """Encodes the source once; decoding reuses the result."""
    return self.encoder(self.source_embedder(inputs_BS, inputs_positions_BS),
                        inputs_segment_ids_BS, inputs_positions_BS)

  def decode(self, decoder_inputs_BL: jax.Array, targets_segment_ids_BL: jax.Array,
             targets_positions_BL: jax.Array, encoded_BSE: jax.Array | None,
             inputs_segment_ids_BS: jax.Array, hidden: bool = False) -> Any:
    """Float32 next-token logits [B, L, V] of the target given the encoded source.

    In decode mode the first call fills the cross-attention cache from `encoded_BSE`;
    later calls may pass None and reuse it (decoding.py). With `hidden`, the decoder's
    final states [B, L, E] and its LogitsHead instead.
    """
    x_BLE = self.decoder(self.target_embedder(decoder_inputs_BL, targets_positions_BL),
                         targets_segment_ids_BL, targets_positions_BL, encoded_BSE,
                         inputs_segment_ids_BS)
    cfg = self.config
    head = _lm_head(cfg, self.target_embedder, self.logits_bias if cfg.logits_bias else None,
                    kernel=None if cfg.tie_embeddings else self.lm_head)
    return _outputs(cfg, head, x_BLE, hidden)

  def __call__(self, inputs_BS: jax.Array, inputs_segment_ids_BS: jax.Array,
               inputs_positions_BS: jax.Array, decoder_inputs_BL: jax.Array,
               targets_segment_ids_BL: jax.Array, targets_positions_BL: jax.Array,
               hidden: bool = False) -> Any:
    encoded_BSE = self.encode(inputs_BS, inputs_segment_ids_BS, inputs_positions_BS)
    return self.decode(decoder_inputs_BL, targets_segment_ids_BL, targets_positions_BL,
                       encoded_BSE, inputs_segment_ids_BS, hidden=hidden)


# The one place an architecture name becomes a class.
ARCHITECTURES: dict[str, type[nn.Module]] = {
    "decoder": Decoder,
    "encoder": Encoder,
    "encoder_decoder": EncoderDecoder,
}


def make_model(config: ModelConfig) -> nn.Module:
  """Instantiates `config.arch` from ARCHITECTURES; unknown names list the valid ones."""
  if config.arch not in ARCHITECTURES:
    raise ValueError(f"model.arch={config.arch!r} is not a known architecture; "
                     f"valid: {sorted(ARCHITECTURES)}")
  # An explicit fused attention kernel that cannot serve this model: one line, before
  # anything is traced (the lengths' rule is config validation's: data.seq_len).
  refused = attention_ops.check_explicit(
      config.attention_impl, attention_ops.layer_kinds(config), dtype=config.dtype,
      head_dim=config.head_dim, seq_len=None)
  if refused:
    raise ConfigError(refused)
  return ARCHITECTURES[config.arch](config)
