"""The building blocks every topology shares: norm, MLP, positions and the Block.

Shape letters as in the package legend (transformer/model/__init__.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct
from jax.ad_checkpoint import checkpoint_name

from transformer.config.model import REMAT_POLICIES, RESIDUAL_NAME, ModelConfig
from transformer.model import attention_ops
from transformer.model import positions as positions_lib
from transformer.model.dropout import Dropout
from transformer.model.attention import MultiHeadAttention
from transformer.model.moe import MoeMLP
from transformer.model.mlp import MLP
from transformer.model.norms import NORM_PLACEMENTS, make_norm

def activation_constraint(x_BLE: jax.Array) -> jax.Array:
  """Pins the residual stream's layout at block boundaries: rows over the batch axes, the
  length over "activation_length"'s (the tensor axis in base.py: sequence parallelism)."""
  return nn.with_logical_constraint(x_BLE, ("batch", "activation_length", None))


def _per_layer(is_local: bool | jax.Array, local, global_):
  """`local` on a local layer, else `global_`; `is_local` is traced in a scanned stack."""
  if isinstance(is_local, bool):
    return local if is_local else global_
  return jnp.where(is_local, local, global_)


def rope_scaling_params(config: ModelConfig) -> positions_lib.RopeScaling:
  """model.rope_*'s long-context scaling parameters (positions.RopeScaling)."""
  return positions_lib.RopeScaling(
      factor=config.rope_scaling_factor, low_freq_factor=config.rope_low_freq_factor,
      high_freq_factor=config.rope_high_freq_factor,
      original_max_len=config.rope_original_max_len, beta_fast=config.rope_yarn_beta_fast,
      beta_slow=config.rope_yarn_beta_slow, truncate=config.rope_yarn_truncate,
      short_factor=config.rope_short_factor, long_factor=config.rope_long_factor,
      attention_factor=config.rope_attention_factor)


def rope_timescale(config: ModelConfig, is_local: bool | jax.Array = False,
                   positions_BL: jax.Array | None = None) -> jax.Array:
  """RoPE's timescales for a layer: local layers (sliding window) use their own base and
  no long-context scaling (Gemma 3), global layers the scaled `rope_max_wavelength`.

  [R], or [B, R] for a scaling that reads each row's length from `positions_BL`
  (positions.LENGTH_DEPENDENT: "dynamic", "longrope").
  """
  rotary_dim = round(config.head_dim * config.rope_fraction)
  length_B = (positions_lib.rope_lengths(positions_BL)
              if config.rope_scaling in positions_lib.LENGTH_DEPENDENT else None)
  global_R = positions_lib.rope_timescales(
      rotary_dim, config.rope_max_wavelength, scaling=config.rope_scaling,
      length_B=length_B, **dataclasses.asdict(rope_scaling_params(config)))
  if not config.sliding_window:
    return global_R
  local_R = positions_lib.rope_timescales(rotary_dim, config.rope_local_max_wavelength)
  if global_R.ndim == 2:  # Per row: the local layers' one row, for the per-layer choice.
    local_R = local_R[None, :]
  return _per_layer(is_local, local_R, global_R)


def rope_attention_factor(config: ModelConfig,
                          is_local: bool | jax.Array = False) -> float | jax.Array:
  """YaRN's / LongRoPE's factor on the rotated q and k of a layer; 1.0 on local layers,
  which are never scaled."""
  factor = positions_lib.rope_attention_factor(config.rope_scaling,
                                               rope_scaling_params(config))
  if not config.sliding_window or factor == 1.0:
    return factor
  return _per_layer(is_local, 1.0, factor)


@struct.dataclass
class StackInputs:
  """What every block of a stack reads besides the residual stream, built once per stack.

  One pytree, passed whole through `Block`, `BlockGroup`, `nn.scan` and `nn.remat`
  (which take their inputs positionally): fields a stack lacks stay None, an empty
  subtree, so no argument list is padded to a fixed length.

  Attributes:
    positions_BL: each token's position in its own document (RoPE, the "self" cache).
    self_mask_B1LS: the self-attention mask (S = L, or the cache's max_len slots when
      decoding).
    self_bias_BHLS: the stack's additive self-attention bias (T5 relative, ALiBi).
    local_mask_B1LS: the sliding-window self-attention mask of the local layers
      (model.sliding_window).
    encoded_BSE: the encoder output a cross-attention attends to; None without
      cross-attention, and on decoding steps after the first (the cache holds it).
    cross_mask_B1LS: the cross-attention mask; None without cross-attention.
    is_local: which layers attend through `local_mask_B1LS`: the stack's flags (a
      [num_layers] array, or [num_layers / k, k] for groups of k) until `run_blocks`
      hands each scanned layer or group its slice and each unrolled layer its bool.
    segment_ids_BL: the stack's own segment ids, for the fused attention kernels (which
      take packed documents and padding as ids, not as a dense mask); None when decoding.
    encoded_segment_ids_BS: the source's segment ids a cross-attention's fused kernel reads.
    prefix: whether `self_mask_B1LS` holds a bidirectional prefix (make_attention_mask).
  """

  positions_BL: jax.Array
  self_mask_B1LS: jax.Array
  self_bias_BHLS: jax.Array | None = None
  local_mask_B1LS: jax.Array | None = None
  encoded_BSE: jax.Array | None = None
  cross_mask_B1LS: jax.Array | None = None
  is_local: bool | jax.Array = False
  segment_ids_BL: jax.Array | None = None
  encoded_segment_ids_BS: jax.Array | None = None
  # Static: the self mask lets each segment's prefix attend both ways (a prefix LM's
  # rows), a mask only the dense kernels express (attention_ops.LayerKind.prefix).
  prefix: bool = struct.field(pytree_node=False, default=False)

  def scan_axes(self) -> StackInputs:
    """nn.scan's `in_axes` for these inputs: all broadcast, the local flags scanned."""
    axes = jax.tree.map(lambda _: nn.broadcast, self.replace(is_local=None))
    return axes.replace(is_local=0 if isinstance(self.is_local, jax.Array) else nn.broadcast)


class Block(nn.Module):
  """One Transformer block: self-attention (+ cross-attention) + MLP, pre-, post- or
  sandwich-norm, sequential or parallel.

  The same block serves every topology. Causality and document boundaries live in
  the masks, built once at the top of the model; `cross_attention` adds the
  encoder-decoder sublayer. The call returns (x, None) so that the block can be the
  body of `nn.scan` unchanged. A local (sliding-window) layer gets `inputs.is_local`
  True (a Python bool unrolled, a traced scalar scanned) and attends through
  `inputs.local_mask_B1LS` instead of `inputs.self_mask_B1LS`.
  """

  config: ModelConfig
  cross_attention: bool = False
  causal: bool = False  # Decoder side: when decoding, its self-attention keeps a k/v cache.
  # Residual additions in this block's whole stack (GPT-2's init scales the projections
  # into the residual stream by 1/sqrt of it): 2 per block, 3 with cross-attention.
  residual_adds: int = 0
  moe: bool = False  # A mixture of experts (moe.py) in place of the dense MLP.

  @nn.compact
  def __call__(self, x_BLE: jax.Array, inputs: StackInputs) -> tuple[jax.Array, None]:
    """Applies the block to the residual stream `x_BLE`; returns (x_BLE, None)."""
    cfg = self.config
    positions_BL = inputs.positions_BL
    rotary = positions_lib.POSITIONS[cfg.position].rotary
    rope = (positions_BL, positions_BL) if rotary else None
    timescale_R = rope_timescale(cfg, inputs.is_local, positions_BL) if rope else None
    rope_factor = rope_attention_factor(cfg, inputs.is_local) if rope else 1.0
    self_mask_B1LS = inputs.self_mask_B1LS
    if inputs.local_mask_B1LS is not None:
      self_mask_B1LS = _per_layer(inputs.is_local, inputs.local_mask_B1LS, self_mask_B1LS)
    seg_BL = inputs.segment_ids_BL
    self_segments = None if seg_BL is None else attention_ops.Segments(seg_BL, seg_BL)
    local = inputs.is_local if cfg.sliding_window else False
    sublayers = [("self_attention", lambda h: MultiHeadAttention(
        cfg, cache="self" if cfg.decode and self.causal else None,
        residual_adds=self.residual_adds, name="self_attention")(
            h, h, self_mask_B1LS, bias_BHLS=inputs.self_bias_BHLS, rope_positions=rope,
            rope_timescale_R=timescale_R, rope_attention_factor=rope_factor,
            positions_BL=positions_BL,
            segments=self_segments, causal=self.causal, prefix=inputs.prefix,
            local=local))]
    if self.cross_attention:
      # No position signal across sequences: the source carries its own. When decoding,
      # encoded_BSE is None after the first step: the keys/values come from the cache.
      cross_segments = (None if seg_BL is None or inputs.encoded_segment_ids_BS is None else
                        attention_ops.Segments(seg_BL, inputs.encoded_segment_ids_BS))
      sublayers.append(("cross_attention", lambda h: MultiHeadAttention(
          cfg, cache="cross" if cfg.decode else None, residual_adds=self.residual_adds,
          cross=True, name="cross_attention")(
              h, inputs.encoded_BSE, inputs.cross_mask_B1LS, segments=cross_segments)))
    feed_forward = MoeMLP if self.moe else MLP
    sublayers.append(("mlp", lambda h: feed_forward(cfg, self.residual_adds, name="mlp")(h)))
    # Every sublayer's output enters the residual stream in the stream's layout: under
    # tensor parallelism the projection into it (attention out, MLP down) then ends in a
    # reduce-scatter over the length, not an all-reduce whose full [B, L, E] result remat
    # keeps (24 GiB a chip on the 32B recipe of docs/scaling.md; one constraint at the
    # block's end is too late for the attention's).
    sublayers = [(name, lambda h, f=f: activation_constraint(f(h))) for name, f in sublayers]
    # A Dropout per residual add, created where it is used: its auto-name (Dropout_0, ...)
    # picks its rng stream, which a checkpointed run's resumption depends on.
    dropout = lambda: Dropout(cfg.residual_dropout, deterministic=cfg.deterministic)

    if cfg.parallel_block:  # GPT-J / PaLM: every sublayer reads the same normed input.
      h_BLE = make_norm(cfg, "parallel_norm")(x_BLE).astype(cfg.dtype)
      for _, sublayer in sublayers:
        x_BLE = x_BLE + dropout()(sublayer(h_BLE))
      return activation_constraint(x_BLE), None
    placement = NORM_PLACEMENTS[cfg.norm]
    for i, (name, sublayer) in enumerate(sublayers):
      x_BLE = placement.residual(cfg, name, sublayer, x_BLE, dropout)
      if i < len(sublayers) - 1:  # The stream inside the block, in its own layout.
        x_BLE = checkpoint_name(activation_constraint(x_BLE), RESIDUAL_NAME)
    return activation_constraint(x_BLE), None


class BlockGroup(nn.Module):
  """`len(moe)` consecutive Blocks (`block_0`, ...): the body of a scan whose layers differ.

  With model.moe_every = k > 1 the layers repeat with period k (one MoE, k - 1 dense),
  so the scan runs over groups of k; `inputs.is_local` then holds the group's k flags.
  """

  config: ModelConfig
  cross_attention: bool
  causal: bool
  residual_adds: int
  moe: tuple[bool, ...]

  @nn.compact
  def __call__(self, x_BLE: jax.Array, inputs: StackInputs) -> tuple[jax.Array, None]:
    """Applies the group's blocks in order; returns (x_BLE, None)."""
    for j, moe in enumerate(self.moe):
      layer_inputs = inputs
      if self.config.sliding_window:
        layer_inputs = inputs.replace(is_local=inputs.is_local[j])
      x_BLE, _ = Block(self.config, self.cross_attention, self.causal, self.residual_adds,
                       moe, name=f"block_{j}")(x_BLE, layer_inputs)
    return x_BLE, None


def run_blocks(config: ModelConfig, num_layers: int, x_BLE: jax.Array,
               inputs: StackInputs, *, cross_attention: bool = False, causal: bool = False,
               name: str = "block") -> jax.Array:
  """Applies `num_layers` Blocks, unrolled (`block_0`, ...) or scanned (`blocks`).

  Call from inside a compact module: the blocks become its children. `inputs` are the
  stack's inputs every block shares (masks, positions, biases, encoder output). With
  `config.sliding_window`, `inputs.local_mask_B1LS` is the windowed self-attention mask
  of the layers `config.local_layers` marks local; their flags go into `inputs.is_local`
  here: a scanned stack scans them with the parameters, an unrolled one gives each layer
  its own.
  With `config.scan_layers` the parameters gain a leading "layers" axis; see
  `scanned_to_unrolled` / `unrolled_to_scanned` for converting checkpoints. When the
  MoE layers (`config.moe_layers`) are every k-th, the scan runs over groups of k
  (`blocks/block_0`, ..., `blocks/block_{k-1}`, each with a leading [num_layers / k]).
  """
  residual_adds = num_layers * (3 if cross_attention else 2)
  local_flags = config.local_layers(num_layers)
  moe_flags = config.moe_layers(num_layers)
  group = config.moe_every if config.mlp == "moe" and config.moe_every > 1 else 1
  if config.sliding_window and inputs.local_mask_B1LS is None:
    raise ValueError("model.sliding_window > 0 needs the stack's local_mask_B1LS")
  if config.scan_layers:
    if num_layers % group:  # config validation says so first, naming the keys.
      raise ValueError(f"model.moe_every={group} must divide the {num_layers} layers to scan")
    body, attributes = Block, (moe_flags[0],)
    if group > 1:
      body, attributes = BlockGroup, (moe_flags[:group],)
    body = _remat(config, body)
    if config.sliding_window:
      flags = jnp.asarray(local_flags)
      inputs = inputs.replace(is_local=flags.reshape(-1, group) if group > 1 else flags)
    # The cache stacks its layers on axis 1, so that every cache array has the batch on
    # axis 0, scanned or not: decoding expands and reorders beams along that axis. The
    # MoE statistics ("moe", sown) stack on axis 0 like the parameters.
    stack = nn.scan(
        body, variable_axes={"params": 0, "cache": 1, "moe": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(inputs.scan_axes(),), length=num_layers // group,
        metadata_params={nn.PARTITION_NAME: "layers"})
    x_BLE, _ = stack(config, cross_attention, causal, residual_adds, *attributes,
                     name=f"{name}s")(x_BLE, inputs)
    return x_BLE
  block = _remat(config, Block)
  for i in range(num_layers):
    layer_inputs = inputs.replace(is_local=local_flags[i]) if config.sliding_window else inputs
    x_BLE, _ = block(config, cross_attention, causal, residual_adds, moe_flags[i],
                     name=f"{name}_{i}")(x_BLE, layer_inputs)
  return x_BLE


def _remat(config: ModelConfig, module: type[nn.Module]) -> type[nn.Module]:
  """`module` rematerialised with model.remat's policy (not when decoding: no backward)."""
  if config.remat == "none" or config.decode:
    return module
  # prevent_cse only matters outside scan, where XLA could merge the recomputation away.
  return nn.remat(module, policy=REMAT_POLICIES[config.remat],
                  prevent_cse=not config.scan_layers)


def _group_of(stack: dict, name: str) -> list[dict]:
  """The per-position subtrees of a scanned stack: [stack], or a BlockGroup's k blocks."""
  keys = [f"{name}_{j}" for j in range(len(stack))]
  return [stack[k] for k in keys] if set(stack) == set(keys) else [stack]


def scanned_to_unrolled(params: dict, num_layers: int | None = None,
                        name: str = "block") -> dict:
  """Splits every `<name>s` subtree (leading layers axis) into `<name>_0`, `<name>_1`, ...

  Each stack is split by its own depth (the leading axis), so an encoder-decoder with
  different encoder and decoder depths converts in one call. A stack scanned in groups
  of k (`<name>s/<name>_0..k-1`, model.moe_every = k) gives layer g * k + j from group
  g's block j.

  Raises:
    ValueError: if `num_layers` is given and a stack has another depth (a checkpoint
      that does not match the model it is meant for).
  """
  out = {}
  for key, value in params.items():
    if key == f"{name}s":
      group = _group_of(value, name)
      depths = {x.shape[0] * len(group) for x in jax.tree.leaves(value)}
      if len(depths) != 1 or (num_layers is not None and depths != {num_layers}):
        raise ValueError(f"stack {key!r} has {sorted(depths)} layers; expected "
                         f"{num_layers if num_layers is not None else 'one depth'}")
      for i in range(depths.pop()):
        g, j = divmod(i, len(group))
        out[f"{name}_{i}"] = jax.tree.map(lambda x, g=g: x[g], group[j])
    elif isinstance(value, dict):
      out[key] = scanned_to_unrolled(value, num_layers, name)
    else:
      out[key] = value
  return out


def unrolled_to_scanned(params: dict, name: str = "block", group: int = 1) -> dict:
  """Stacks `<name>_0`, `<name>_1`, ... subtrees into one `<name>s` subtree.

  With `group` = k > 1 (model.moe_every) layer i goes to `<name>s/<name>_{i % k}`.
  """
  prefix = f"{name}_"
  layers = sorted((int(k[len(prefix):]), v) for k, v in params.items()
                  if k.startswith(prefix) and k[len(prefix):].isdigit())
  out = {k: (unrolled_to_scanned(v, name, group) if isinstance(v, dict) else v)
         for k, v in params.items() if not (k.startswith(prefix) and k[len(prefix):].isdigit())}
  if layers:
    if [i for i, _ in layers] != list(range(len(layers))):
      raise ValueError(f"layers {[i for i, _ in layers]} are not 0..{len(layers) - 1}")
    stacked = [jax.tree.map(lambda *xs: jnp.stack(xs), *[v for _, v in layers[j::group]])
               for j in range(group)]
    out[f"{name}s"] = stacked[0] if group == 1 else {
        f"{name}_{j}": tree for j, tree in enumerate(stacked)}
  return out


@dataclasses.dataclass(frozen=True)
class LayerPiece:
  """Where one parameter of the unrolled model lies in a tree, scanned or not."""

  path: tuple[str, ...]  # The tree's leaf holding it.
  index: int | None  # Its slice on that leaf's leading (layers) axis; None: the whole leaf.
  shape: tuple[int, ...]  # The unrolled parameter's shape.


def unrolled_view(shapes: dict[tuple[str, ...], tuple[int, ...]],
                  name: str = "block") -> dict[tuple[str, ...], LayerPiece]:
  """Every parameter under the path the unrolled model gives it, and where it lies.

  `shapes` is a flat tree, {path: shape}, unrolled or scanned: a scanned stack's leaf
  `.../<name>s/<rest>` of shape [L, ...] is the L parameters `.../<name>_<i>/<rest>`;
  grouped (`.../<name>s/<name>_<j>/<rest>`, [L / k, ...]; model.moe_every = k) layer
  g * k + j is slice g of group j's, as `scanned_to_unrolled` splits them. Every other
  leaf is itself. Names and shapes only, so a checkpoint's metadata reads as well as
  arrays: init_from matches a source and a model of either layout by these paths.
  """
  stack = f"{name}s"
  children: dict[tuple[str, ...], set[str]] = {}
  for path in shapes:
    if stack in path[:-1]:
      i = path.index(stack)
      children.setdefault(path[:i + 1], set()).add(path[i + 1])
  grouped = {prefix for prefix, keys in children.items()
             if keys == {f"{name}_{j}" for j in range(len(keys))}}
  view = {}
  for path, shape in shapes.items():
    if stack not in path[:-1]:
      view[path] = LayerPiece(path, None, tuple(shape))
      continue
    i = path.index(stack)
    k, j, rest = 1, 0, path[i + 1:]
    if path[:i + 1] in grouped:
      k, j, rest = len(children[path[:i + 1]]), int(path[i + 1][len(name) + 1:]), path[i + 2:]
    for g in range(shape[0]):
      view[path[:i] + (f"{name}_{g * k + j}",) + rest] = LayerPiece(path, g, tuple(shape[1:]))
  return view
