"""The building blocks every topology shares: norm, MLP, positions and the Block.

Shape legend as in attention.py: B batch, L length, E embed, F mlp hidden.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.configuration import ModelConfig
from transformer.model import initializers
from transformer.model.attention import MultiHeadAttention

ACTIVATION_FNS = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's GELU.
    "silu": jax.nn.silu,
    "swiglu": jax.nn.silu,  # Gated: silu(x W) * (x V).
    "geglu": lambda x: jax.nn.gelu(x, approximate=False),  # Gated: gelu(x W) * (x V).
}


def activation_constraint(x_BLE: jax.Array) -> jax.Array:
  """Pins the residual stream's layout at block boundaries (batch over data/fsdp)."""
  return nn.with_logical_constraint(x_BLE, ("batch", "length", None))


def make_norm(config: ModelConfig, name: str) -> nn.Module:
  """LayerNorm or RMSNorm over the embed axis, computed in float32."""
  scale_init = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
  if config.norm_type == "rmsnorm":
    return nn.RMSNorm(epsilon=config.norm_epsilon, dtype=jnp.float32,
                      param_dtype=config.param_dtype, scale_init=scale_init, name=name)
  return nn.LayerNorm(
      epsilon=config.norm_epsilon, use_bias=config.use_bias, dtype=jnp.float32,
      param_dtype=config.param_dtype, scale_init=scale_init, name=name,
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))


def sinusoidal_table(max_len: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
  """The paper's PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...).

  `layout="halves"` puts the same sines in the first half of the features and the
  cosines in the second (Marian's table, which Hugging Face's opus-mt models use).
  """
  positions = np.arange(max_len)[:, None]
  div = np.power(10000.0, np.arange(0, d_model, 2) / d_model)
  sines, cosines = np.sin(positions / div), np.cos(positions / div)[:, : d_model // 2]
  table = np.zeros((max_len, d_model), dtype=np.float32)
  if layout == "halves":
    table[:, :sines.shape[1]], table[:, sines.shape[1]:] = sines, cosines
  else:
    table[:, 0::2], table[:, 1::2] = sines, cosines
  return table


def _dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str,
           residual_adds: int = 0) -> nn.Dense:
  kernel_init = initializers.dense_kernel(config, residual_adds=residual_adds)
  return nn.Dense(
      features, use_bias=config.use_bias, dtype=config.dtype, param_dtype=config.param_dtype,
      name=name,
      kernel_init=nn.with_logical_partitioning(kernel_init, axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]))


class MLP(nn.Module):
  """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi x) * wi_gate x) when gated."""

  config: ModelConfig
  residual_adds: int = 0  # Of this block's stack, for the init of `wo` (initializers.py).

  @nn.compact
  def __call__(self, x_BLE: jax.Array) -> jax.Array:
    cfg = self.config
    # Tokens on one axis (N = B * L): see EinsumDense for why this is faster on CPU.
    x_NE = x_BLE.reshape(-1, x_BLE.shape[-1])
    h_NF = ACTIVATION_FNS[cfg.activation](_dense(cfg, cfg.mlp_dim, ("embed", "mlp"), "wi")(x_NE))
    if cfg.activation in ("swiglu", "geglu"):
      h_NF = h_NF * _dense(cfg, cfg.mlp_dim, ("embed", "mlp"), "wi_gate")(x_NE)
    h_NF = nn.Dropout(cfg.mlp_dropout, deterministic=cfg.deterministic)(h_NF)
    y_NE = _dense(cfg, cfg.d_model, ("mlp", "embed"), "wo", self.residual_adds)(h_NF)
    return y_NE.reshape(x_BLE.shape)


class Block(nn.Module):
  """One Transformer block: self-attention (+ cross-attention) + MLP, pre- or post-norm.

  The same block serves every topology. Causality and document boundaries live in
  the masks, built once at the top of the model; `cross_attention` adds the
  encoder-decoder sublayer. The call returns (x, None) so that the block can be the
  body of `nn.scan` unchanged.
  """

  config: ModelConfig
  cross_attention: bool = False
  causal: bool = False  # Decoder side: when decoding, its self-attention keeps a k/v cache.
  # Residual additions in this block's whole stack (GPT-2's init scales the projections
  # into the residual stream by 1/sqrt of it): 2 per block, 3 with cross-attention.
  residual_adds: int = 0

  @nn.compact
  def __call__(self, x_BLE: jax.Array, self_mask_B1LL: jax.Array,
               positions_BL: jax.Array, self_bias_BHLL: jax.Array | None = None,
               encoded_BSE: jax.Array | None = None,
               cross_mask_B1LS: jax.Array | None = None) -> tuple[jax.Array, None]:
    cfg = self.config
    rope = (positions_BL, positions_BL) if cfg.position == "rope" else None
    sublayers = [("self_attention", lambda h: MultiHeadAttention(
        cfg, cache="self" if cfg.decode and self.causal else None,
        residual_adds=self.residual_adds, name="self_attention")(
            h, h, self_mask_B1LL, bias_BHLS=self_bias_BHLL, rope_positions=rope,
            positions_BL=positions_BL))]
    if self.cross_attention:
      # No position signal across sequences: the source carries its own. When decoding,
      # encoded_BSE is None after the first step: the keys/values come from the cache.
      sublayers.append(("cross_attention", lambda h: MultiHeadAttention(
          cfg, cache="cross" if cfg.decode else None, residual_adds=self.residual_adds,
          name="cross_attention")(
              h, encoded_BSE, cross_mask_B1LS)))
    sublayers.append(("mlp", lambda h: MLP(cfg, self.residual_adds, name="mlp")(h)))

    for name, sublayer in sublayers:
      norm = make_norm(cfg, f"{name}_norm")
      if cfg.norm == "pre":
        y = sublayer(norm(x_BLE).astype(cfg.dtype))
        x_BLE = x_BLE + nn.Dropout(cfg.residual_dropout, deterministic=cfg.deterministic)(y)
      else:  # The paper's post-norm: LayerNorm(x + Sublayer(x)).
        y = sublayer(x_BLE)
        x_BLE = norm(x_BLE + nn.Dropout(cfg.residual_dropout,
                                        deterministic=cfg.deterministic)(y)).astype(cfg.dtype)
    return activation_constraint(x_BLE), None


REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def run_blocks(config: ModelConfig, num_layers: int, x_BLE: jax.Array, *args,
               cross_attention: bool = False, causal: bool = False,
               name: str = "block") -> jax.Array:
  """Applies `num_layers` Blocks, unrolled (`block_0`, ...) or scanned (`blocks`).

  Call from inside a compact module: the blocks become its children. `args` are the
  per-stack inputs every block shares (masks, positions, biases, encoder output).
  With `config.scan_layers` the parameters gain a leading "layers" axis; see
  `scanned_to_unrolled` / `unrolled_to_scanned` for converting checkpoints.
  """
  block = Block
  residual_adds = num_layers * (3 if cross_attention else 2)
  if config.remat != "none" and not config.decode:  # Decoding has no backward pass.
    # prevent_cse only matters outside scan, where XLA could merge the recomputation away.
    block = nn.remat(Block, policy=REMAT_POLICIES[config.remat],
                     prevent_cse=not config.scan_layers)
  if config.scan_layers:
    # The cache stacks its layers on axis 1, so that every cache array has the batch on
    # axis 0, scanned or not: decoding expands and reorders beams along that axis.
    stack = nn.scan(
        block, variable_axes={"params": 0, "cache": 1},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * len(args), length=num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"})
    x_BLE, _ = stack(config, cross_attention, causal, residual_adds,
                     name=f"{name}s")(x_BLE, *args)
    return x_BLE
  for i in range(num_layers):
    x_BLE, _ = block(config, cross_attention, causal, residual_adds,
                     name=f"{name}_{i}")(x_BLE, *args)
  return x_BLE


def scanned_to_unrolled(params: dict, num_layers: int | None = None,
                        name: str = "block") -> dict:
  """Splits every `<name>s` subtree (leading layers axis) into `<name>_0`, `<name>_1`, ...

  Each stack is split by its own depth (the leading axis), so an encoder-decoder with
  different encoder and decoder depths converts in one call.

  Raises:
    ValueError: if `num_layers` is given and a stack has another depth (a checkpoint
      that does not match the model it is meant for).
  """
  out = {}
  for key, value in params.items():
    if key == f"{name}s":
      depths = {x.shape[0] for x in jax.tree.leaves(value)}
      if len(depths) != 1 or (num_layers is not None and depths != {num_layers}):
        raise ValueError(f"stack {key!r} has {sorted(depths)} layers; expected "
                         f"{num_layers if num_layers is not None else 'one depth'}")
      for i in range(depths.pop()):
        out[f"{name}_{i}"] = jax.tree.map(lambda x, i=i: x[i], value)
    elif isinstance(value, dict):
      out[key] = scanned_to_unrolled(value, num_layers, name)
    else:
      out[key] = value
  return out


def unrolled_to_scanned(params: dict, name: str = "block") -> dict:
  """Stacks `<name>_0`, `<name>_1`, ... subtrees into one `<name>s` subtree."""
  prefix = f"{name}_"
  layers = sorted((int(k[len(prefix):]), v) for k, v in params.items()
                  if k.startswith(prefix) and k[len(prefix):].isdigit())
  out = {k: (unrolled_to_scanned(v, name) if isinstance(v, dict) else v)
         for k, v in params.items() if not (k.startswith(prefix) and k[len(prefix):].isdigit())}
  if layers:
    if [i for i, _ in layers] != list(range(len(layers))):
      raise ValueError(f"layers {[i for i, _ in layers]} are not 0..{len(layers) - 1}")
    out[f"{name}s"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[v for _, v in layers])
  return out
