"""The building blocks every topology shares: norm, MLP, positions and the Block.

Shape legend as in attention.py: B batch, L length, E embed, F mlp hidden.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.configuration import GATED_ACTIVATIONS, ModelConfig
from transformer.model import initializers
from transformer.model import positions as positions_lib
from transformer.model.attention import MultiHeadAttention
from transformer.model.norms import make_norm  # Re-exported: models.py and tests import it here.

ACTIVATION_FNS = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's GELU.
    "silu": jax.nn.silu,
    "swiglu": jax.nn.silu,  # Gated: silu(x W) * (x V).
    "geglu": lambda x: jax.nn.gelu(x, approximate=False),  # Gated: gelu(x W) * (x V).
    # Gated with the tanh GELU: T5 v1.1's "gated-gelu", Gemma's GeGLU.
    "geglu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def activation_constraint(x_BLE: jax.Array) -> jax.Array:
  """Pins the residual stream's layout at block boundaries (batch over data/fsdp)."""
  return nn.with_logical_constraint(x_BLE, ("batch", "length", None))


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
    if cfg.activation in GATED_ACTIVATIONS:
      h_NF = h_NF * _dense(cfg, cfg.mlp_dim, ("embed", "mlp"), "wi_gate")(x_NE)
    h_NF = nn.Dropout(cfg.mlp_dropout, deterministic=cfg.deterministic)(h_NF)
    y_NE = _dense(cfg, cfg.d_model, ("mlp", "embed"), "wo", self.residual_adds)(h_NF)
    return y_NE.reshape(x_BLE.shape)


def _per_layer(is_local: bool | jax.Array, local, global_):
  """`local` on a local layer, else `global_`; `is_local` is traced in a scanned stack."""
  if isinstance(is_local, bool):
    return local if is_local else global_
  return jnp.where(is_local, local, global_)


def rope_timescale(config: ModelConfig, is_local: bool | jax.Array = False) -> jax.Array:
  """RoPE's timescales for a layer: local layers (sliding window) use their own base and
  no long-context scaling (Gemma 3), global layers the scaled `rope_max_wavelength`."""
  rotary_dim = round(config.head_dim * config.rope_fraction)
  global_R = positions_lib.rope_timescales(
      rotary_dim, config.rope_max_wavelength, scaling=config.rope_scaling,
      factor=config.rope_scaling_factor, low_freq_factor=config.rope_low_freq_factor,
      high_freq_factor=config.rope_high_freq_factor,
      original_max_len=config.rope_original_max_len)
  if not config.sliding_window:
    return global_R
  local_R = positions_lib.rope_timescales(rotary_dim, config.rope_local_max_wavelength)
  return _per_layer(is_local, local_R, global_R)


class Block(nn.Module):
  """One Transformer block: self-attention (+ cross-attention) + MLP, pre-, post- or
  sandwich-norm, sequential or parallel.

  The same block serves every topology. Causality and document boundaries live in
  the masks, built once at the top of the model; `cross_attention` adds the
  encoder-decoder sublayer. The call returns (x, None) so that the block can be the
  body of `nn.scan` unchanged. A local (sliding-window) layer gets `is_local` True
  (a Python bool unrolled, a traced scalar scanned) and attends through
  `local_mask_B1LL` instead of `self_mask_B1LL`.
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
               cross_mask_B1LS: jax.Array | None = None,
               local_mask_B1LL: jax.Array | None = None,
               is_local: bool | jax.Array = False) -> tuple[jax.Array, None]:
    cfg = self.config
    rope = (positions_BL, positions_BL) if cfg.position == "rope" else None
    timescale_R = rope_timescale(cfg, is_local) if rope else None
    if local_mask_B1LL is not None:
      self_mask_B1LL = _per_layer(is_local, local_mask_B1LL, self_mask_B1LL)
    sublayers = [("self_attention", lambda h: MultiHeadAttention(
        cfg, cache="self" if cfg.decode and self.causal else None,
        residual_adds=self.residual_adds, name="self_attention")(
            h, h, self_mask_B1LL, bias_BHLS=self_bias_BHLL, rope_positions=rope,
            rope_timescale_R=timescale_R, positions_BL=positions_BL))]
    if self.cross_attention:
      # No position signal across sequences: the source carries its own. When decoding,
      # encoded_BSE is None after the first step: the keys/values come from the cache.
      sublayers.append(("cross_attention", lambda h: MultiHeadAttention(
          cfg, cache="cross" if cfg.decode else None, residual_adds=self.residual_adds,
          name="cross_attention")(
              h, encoded_BSE, cross_mask_B1LS)))
    sublayers.append(("mlp", lambda h: MLP(cfg, self.residual_adds, name="mlp")(h)))
    # A Dropout per residual add, created where it is used: its auto-name (Dropout_0, ...)
    # picks its rng stream, which a checkpointed run's resumption depends on.
    dropout = lambda: nn.Dropout(cfg.residual_dropout, deterministic=cfg.deterministic)

    if cfg.parallel_block:  # GPT-J / PaLM: every sublayer reads the same normed input.
      h_BLE = make_norm(cfg, "parallel_norm")(x_BLE).astype(cfg.dtype)
      for _, sublayer in sublayers:
        x_BLE = x_BLE + dropout()(sublayer(h_BLE))
      return activation_constraint(x_BLE), None
    for name, sublayer in sublayers:
      norm = make_norm(cfg, f"{name}_norm")
      if cfg.norm == "pre":
        y = sublayer(norm(x_BLE).astype(cfg.dtype))
        x_BLE = x_BLE + dropout()(y)
      elif cfg.norm == "sandwich":  # Gemma 2/3: the sublayer's output is normed too.
        y = sublayer(norm(x_BLE).astype(cfg.dtype))
        y = make_norm(cfg, f"{name}_post_norm")(y).astype(cfg.dtype)
        x_BLE = x_BLE + dropout()(y)
      else:  # The paper's post-norm: LayerNorm(x + Sublayer(x)).
        y = sublayer(x_BLE)
        x_BLE = norm(x_BLE + dropout()(y)).astype(cfg.dtype)
    return activation_constraint(x_BLE), None


REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def run_blocks(config: ModelConfig, num_layers: int, x_BLE: jax.Array, *args,
               local_mask_B1LL: jax.Array | None = None,
               cross_attention: bool = False, causal: bool = False,
               name: str = "block") -> jax.Array:
  """Applies `num_layers` Blocks, unrolled (`block_0`, ...) or scanned (`blocks`).

  Call from inside a compact module: the blocks become its children. `args` are the
  per-stack inputs every block shares (masks, positions, biases, encoder output).
  With `config.sliding_window`, `local_mask_B1LL` is the windowed self-attention mask
  of the layers `config.local_layers` marks local; a scanned stack receives those
  flags as a [num_layers] array scanned with the parameters.
  With `config.scan_layers` the parameters gain a leading "layers" axis; see
  `scanned_to_unrolled` / `unrolled_to_scanned` for converting checkpoints.
  """
  block = Block
  residual_adds = num_layers * (3 if cross_attention else 2)
  local_flags = config.local_layers(num_layers)
  in_axes = (nn.broadcast,) * len(args)
  if config.sliding_window:
    if local_mask_B1LL is None:
      raise ValueError("model.sliding_window > 0 needs the stack's local_mask_B1LL")
    # Block's positional order: the two cross-attention inputs (None without) come first.
    args = args + (None,) * (5 - len(args)) + (local_mask_B1LL,)
    in_axes = (nn.broadcast,) * len(args) + (0,)
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
        in_axes=in_axes, length=num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"})
    scanned = (jnp.asarray(local_flags),) if config.sliding_window else ()
    x_BLE, _ = stack(config, cross_attention, causal, residual_adds,
                     name=f"{name}s")(x_BLE, *args, *scanned)
    return x_BLE
  for i in range(num_layers):
    per_layer = (local_flags[i],) if config.sliding_window else ()
    x_BLE, _ = block(config, cross_attention, causal, residual_adds,
                     name=f"{name}_{i}")(x_BLE, *args, *per_layer)
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
