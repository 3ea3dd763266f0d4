"""Multi-head attention: the projections, RoPE, QK-norm and the KV cache around a kernel.

The product itself (which kernel, and the mask as that kernel wants it) is
attention_ops.py's.

Shape letters as in the package legend (transformer/model/__init__.py); grouped-query
attention splits the H query heads into K groups of G = H / K, one per key/value head.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer import accelerator
from transformer.config.model import ModelConfig
from transformer.model import attention_ops
from transformer.model import context
from transformer.model import fp8
from transformer.model import initializers
from transformer.model import lora
from transformer.model import norms
from transformer.model import positions
# The kernels and the mask helper live in attention_ops.py; these names stay importable here.
from transformer.model.attention_ops import einsum_attention, make_attention_mask  # pylint: disable=unused-import


class EinsumDense(nn.Module):
  """y = einsum(equation, x, kernel) + bias, with the kernel created at its full rank.

  (flax's DenseGeneral creates a flattened 2-D kernel first, which cannot carry
  3-D logical axis names such as ("embed", "heads", "head_dim").)
  """

  equation: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_axes: tuple[str, ...]  # The trailing kernel axes that make up the output.
  use_bias: bool
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  kernel_init: nn.initializers.Initializer = nn.initializers.normal(0.02)
  lora: ModelConfig | None = None  # The config when a LoRA adapter rides along (lora.py).
  quantization: str = ""  # model.quantization: "fp8" multiplies in fp8 (fp8.py).

  @nn.compact
  def __call__(self, x: jax.Array | None) -> jax.Array | tuple[jax.Array, jax.Array | None]:
    """The projection of x; with x None, only (kernel, bias) (the fused q/k/v product
    reads them: MultiHeadAttention._fused_qkv)."""
    kernel = self.param(
        "kernel", nn.with_logical_partitioning(self.kernel_init, self.kernel_axes),
        self.kernel_shape, self.param_dtype)
    if x is None:
      return kernel, self._bias()
    # The two token axes (batch, length) as one, N: the kernel's gradient then contracts
    # one axis, a plain matmul, where over two XLA:CPU copies the gradient transposed
    # first (a fifth of the tiny shape's step). The same numbers, fewer passes.
    inputs, output = self.equation.split("->")
    x_spec, kernel_spec = inputs.split(",")
    if x_spec[:2] != output[:2] or "N" in self.equation:
      raise ValueError(f"EinsumDense equation {self.equation!r}: x and the output must "
                       "begin with the same two token axes, e.g. 'BLE,EHD->BLHD'")
    y = _token_einsum(self.equation, x.astype(self.dtype), kernel.astype(self.dtype),
                      fp8.dot_general(self.quantization))
    if self.lora is not None:  # Its parameters before the bias (their init rngs' order).
      n_in = len(self.kernel_shape) - len(self.bias_axes)
      y = y + lora.adapter_delta(self, self.lora, x, self.kernel_axes[:n_in],
                                 self.bias_axes, self.kernel_shape[:n_in],
                                 self.kernel_shape[n_in:])
    bias = self._bias()
    if bias is not None:
      y = y + bias.astype(self.dtype).reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
    return y

  def _bias(self) -> jax.Array | None:
    if not self.use_bias:
      return None
    bias_shape = self.kernel_shape[len(self.kernel_shape) - len(self.bias_axes):]
    return self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                           self.bias_axes),
                      bias_shape, self.param_dtype)


def _token_einsum(equation: str, x: jax.Array, kernel: jax.Array,
                  dot_general: Callable = jax.lax.dot_general,
                  preferred_element_type: jnp.dtype | None = None) -> jax.Array:
  """einsum(equation) with x's two token axes merged into one where that is safe;
  `dot_general` multiplies (fp8.dot_general's); `preferred_element_type` is the
  product's dtype (None: the operands')."""
  inputs, output = equation.split("->")
  x_spec, kernel_spec = inputs.split(",")
  if not context.tokens_mergeable():  # The length sharded over context: XLA would gather.
    return jnp.einsum(equation, x, kernel, _dot_general=dot_general,
                      preferred_element_type=preferred_element_type)
  y = jnp.einsum(f"N{x_spec[2:]},{kernel_spec}->N{output[2:]}",
                 x.reshape((-1,) + x.shape[2:]), kernel, _dot_general=dot_general,
                 preferred_element_type=preferred_element_type)
  return y.reshape(x.shape[:2] + y.shape[1:])


def biased_product(equation: str, x: jax.Array, kernel: jax.Array, bias: jax.Array,
                   dtype: jnp.dtype) -> jax.Array:
  """_token_einsum(equation, x, kernel) + bias in `dtype`, the bias added to the float32
  product before its one rounding (not rounded to `dtype` first and added after).

  The reason is the GPU's: XLA fuses the add into the matmul's epilogue only when the
  bias reaches it as it is stored (a convert of the bias is a computation beside the
  product's path, which its Triton GEMM fusions do not take), so the product is written
  once, biased, instead of written and then read and written again by a pass of its own
  (with joined_qkv, gpt_small 32 x 1024 on an H100: 98.99 -> 96.70 GB a step, compiled
  without a device). In float32 it is the same sum; in bfloat16 one rounding, not three.
  """
  y = _token_einsum(equation, x, kernel, preferred_element_type=jnp.float32)
  return (y + bias.astype(jnp.float32).reshape((1,) * (y.ndim - bias.ndim) + bias.shape)
          ).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def joined_qkv(x_BLE: jax.Array, kernels: tuple[jax.Array, jax.Array, jax.Array],
               biases: tuple[jax.Array | None, ...], dtype: jnp.dtype
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """q [B, L, H, D], k and v [B, L, K, D] of x: three matmuls forward, one backward.

  Forward, each projection writes its own output, laid out as the attention kernel
  reads it, its bias added in the matmul's epilogue (biased_product): a joined matmul
  wrote [B, L, K, J, D] and a pass copied q, k and v out
  of it (cuDNN takes no strided operand; gpt_small 32 x 1024 on an H100: 3.6 GB a step,
  against 2.4 GB of x read twice more). Backward, the joined kernel [E, K, G + 2, D]
  (each key/value head's G query heads, its key and its value: sharded as the heads
  are) takes the joined gradient: one matmul for x's gradient instead of three and
  their sum, one for the kernels'. The same products as autodiff's of either form.

  Args:
    x_BLE: the input in the compute dtype.
    kernels: query [E, H, D], key and value [E, K, D] kernels (their storage dtype).
    biases: their biases ([H, D], [K, D], [K, D]) or None each.
    dtype: the compute dtype.
  """
  return _joined_qkv_fwd(x_BLE, kernels, biases, dtype)[0]


def _joined_qkv_fwd(x_BLE, kernels, biases, dtype):
  outputs = []
  for kernel, bias, equation in zip(kernels, biases,
                                    ("BLE,EHD->BLHD", "BLE,EKD->BLKD", "BLE,EKD->BLKD")):
    outputs.append(_token_einsum(equation, x_BLE, kernel.astype(dtype)) if bias is None else
                   biased_product(equation, x_BLE, kernel.astype(dtype), bias, dtype))
  return tuple(outputs), (x_BLE, kernels, biases)


def _joined_qkv_bwd(dtype, residuals, cotangents):
  x_BLE, (wq, wk, wv), biases = residuals
  dq_BLHD, dk_BLKD, dv_BLKD = cotangents
  (E, H, D), K = wq.shape, wk.shape[1]
  G = H // K
  B, L = x_BLE.shape[:2]
  kernel_EKJD = jnp.concatenate(
      [wq.reshape(E, K, G, D), wk[:, :, None], wv[:, :, None]], axis=2).astype(dtype)
  pieces = ((dq_BLHD.reshape(B, L, K, G, D), 0), (dk_BLKD[:, :, :, None], G),
            (dv_BLKD[:, :, :, None], G + 1))
  if biases[0] is None:
    dy_BLKJD = jnp.concatenate([piece for piece, _ in pieces], axis=3).astype(dtype)
  else:
    # With biases, summed from zero-padded pieces (autodiff's form of the slices'
    # gradient): XLA then makes it and the biases' gradients below in one pass over the
    # pieces; from a concatenation the sums took a pass of their own (gpt_small 32 x
    # 1024 on an H100: 150 MB a layer, the projections compiled alone). Without biases
    # the concatenation moves fewer bytes (llama:1b 32 x 2048: 1,019.77 GB a step
    # against 1,021.92).
    dy_BLKJD = sum(jax.lax.pad(piece.astype(dtype), jnp.zeros((), dtype),
                               ((0, 0, 0),) * 3 + ((start, G + 2 - start - piece.shape[3], 0),)
                               + ((0, 0, 0),))
                   for piece, start in pieces)
  dx_BLE = _token_einsum("BLKJD,EKJD->BLE", dy_BLKJD, kernel_EKJD)
  if context.tokens_mergeable():
    dkernel_EKJD = jnp.einsum("NE,NKJD->EKJD", x_BLE.reshape(B * L, E),
                              dy_BLKJD.reshape((B * L,) + dy_BLKJD.shape[2:]))
  else:
    dkernel_EKJD = jnp.einsum("BLE,BLKJD->EKJD", x_BLE, dy_BLKJD)
  dkernels = (dkernel_EKJD[:, :, :G].reshape(E, H, D).astype(wq.dtype),
              dkernel_EKJD[:, :, G].astype(wk.dtype), dkernel_EKJD[:, :, G + 1].astype(wv.dtype))
  dbiases = (None,) * 3
  if biases[0] is not None:
    # lax's sum in the compute dtype, as autodiff's of the broadcast bias (jnp.sum would
    # accumulate bfloat16 in float32).
    dbias_KJD = jax.lax.reduce(dy_BLKJD, jnp.zeros((), dtype), jax.lax.add, (0, 1))
    dbiases = (dbias_KJD[:, :G].reshape(H, D).astype(biases[0].dtype),
               dbias_KJD[:, G].astype(biases[1].dtype),
               dbias_KJD[:, G + 1].astype(biases[2].dtype))
  return dx_BLE.astype(x_BLE.dtype), dkernels, dbiases


joined_qkv.defvjp(_joined_qkv_fwd, _joined_qkv_bwd)


class MultiHeadAttention(nn.Module):
  """Self- or cross-attention with H query heads and K <= H key/value heads."""

  config: ModelConfig
  # Decoding (see decoding.py): "self" writes each call's keys/values into max_len cache
  # slots, slot = token position (causal self-attention); "cross" computes the keys/values
  # of the encoder output on the first call and reuses them on every later one.
  cache: str | None = None
  residual_adds: int = 0  # Of the block's stack, for the init of `out` (initializers.py).
  # Attends to another sequence (an encoder's output): its keys are in their own order,
  # never the queries' context-parallel zig-zag (attention_ops.LayerKind.cross).
  cross: bool = False

  @nn.compact
  def __call__(self, x_BLE: jax.Array, kv_BSE: jax.Array | None, mask_B1LS: jax.Array, *,
               bias_BHLS: jax.Array | None = None,
               rope_positions: tuple[jax.Array, jax.Array] | None = None,
               rope_timescale_R: jax.Array | None = None,
               rope_attention_factor: float | jax.Array = 1.0,
               positions_BL: jax.Array | None = None,
               segments: attention_ops.Segments | None = None, causal: bool = False,
               prefix: bool = False, local: bool | jax.Array = False) -> jax.Array:
    """Attends from x to kv.

    Args:
      x_BLE: queries' inputs.
      kv_BSE: keys' and values' inputs (x itself for self-attention); None for a
        "cross" cache that already holds them.
      mask_B1LS: boolean mask from make_attention_mask.
      bias_BHLS: optional additive logit bias (T5 relative, ALiBi).
      rope_positions: (query positions [B, L], key positions [B, S]) to rotate q and k.
      rope_timescale_R: RoPE's timescales (positions.rope_timescales); None: the
        unscaled ones of rope_max_wavelength over the whole head dim.
      rope_attention_factor: multiplies the rotated q and k features (YaRN's and
        LongRoPE's temperature, positions.rope_attention_factor).
      positions_BL: the queries' positions: the cache slots a "self" cache writes.
      segments: the queries' and keys' segment ids, for the fused kernels (which take
        the mask as the kernel wants it, not as `mask_B1LS`); None when decoding.
      causal: whether the mask is causal (a fused kernel's mask type).
      prefix: whether the mask also holds a prefix LM's bidirectional prefix (only the
        dense kernels express it: attention_ops.LayerKind.prefix).
      local: whether this layer attends through model.sliding_window (a traced scalar
        in a scanned stack with window_pattern): the fused kernels' window.

    Returns:
      The [B, L, E] attention output.
    """
    cfg = self.config
    query, key, value = self._qkv_projections()
    fused = kv_BSE is x_BLE and self._fusable()
    if fused:
      q_BLHD, *fused_kv = self._fused_qkv(x_BLE, query, key, value)
    else:
      q_BLHD, fused_kv = query(x_BLE), None
    if cfg.qk_norm:  # Per head, before RoPE (Qwen3, Gemma 3): bounds the scores' scale.
      q_BLHD = norms.make_norm(cfg, "query_norm", axis_name="head_dim")(q_BLHD).astype(
          cfg.dtype)
    rope = functools.partial(positions.apply_rope, max_wavelength=cfg.rope_max_wavelength,
                             timescale_R=rope_timescale_R,
                             attention_factor=rope_attention_factor)
    if rope_positions is not None:
      q_BLHD = rope(q_BLHD, rope_positions[0])
    k_BSKD, v_BSKD = self._keys_and_values(
        kv_BSE, key, value, fused_kv, rope=rope, positions_BL=positions_BL,
        key_positions=None if rope_positions is None else rope_positions[1])
    out_BLHD = self._attend(q_BLHD, k_BSKD, v_BSKD, mask_B1LS, bias_BHLS, segments,
                            causal=causal, prefix=prefix, local=local)
    H, D, E = cfg.num_heads, cfg.head_dim, cfg.d_model
    out_init = initializers.dense_kernel(cfg, in_axis=(0, 1), out_axis=2,
                                         residual_adds=self.residual_adds)
    return self._dense()(
        "BLHD,HDE->BLE", (H, D, E), ("heads", "head_dim", "embed"), ("embed",),
        kernel_init=out_init, lora=lora.adapted(cfg, "out"), name="out")(out_BLHD)

  def _dense(self) -> Callable[..., EinsumDense]:
    """EinsumDense with the model's dtypes, bias and initialisation of q/k/v."""
    cfg = self.config
    return functools.partial(EinsumDense, use_bias=cfg.use_bias, dtype=cfg.dtype,
                             param_dtype=cfg.param_dtype, quantization=cfg.quantization,
                             kernel_init=initializers.dense_kernel(cfg, in_axis=0,
                                                                   out_axis=(1, 2)))

  def _qkv_projections(self) -> tuple[EinsumDense, EinsumDense, EinsumDense]:
    """The query, key and value projections (their parameters: query/kernel, ...)."""
    cfg = self.config
    H, K, D, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.d_model
    # Qwen2 biases q/k/v (model.qkv_bias) in a model without other biases.
    qkv_dense = functools.partial(self._dense(), use_bias=cfg.use_bias or cfg.qkv_bias)
    query = qkv_dense("BLE,EHD->BLHD", (E, H, D), ("embed", "heads", "head_dim"),
                      ("heads", "head_dim"), lora=lora.adapted(cfg, "query"), name="query")
    key = qkv_dense("BSE,EKD->BSKD", (E, K, D), ("embed", "kv_heads", "head_dim"),
                    ("kv_heads", "head_dim"), lora=lora.adapted(cfg, "key"), name="key")
    value = qkv_dense("BSE,EKD->BSKD", (E, K, D), ("embed", "kv_heads", "head_dim"),
                      ("kv_heads", "head_dim"), lora=lora.adapted(cfg, "value"), name="value")
    return query, key, value

  def _keys_and_values(self, kv_BSE: jax.Array | None, key: EinsumDense,
                       value: EinsumDense, fused_kv: list[jax.Array] | None, *,
                       rope: Callable, positions_BL: jax.Array | None,
                       key_positions: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """k and v to attend to: a decoding cross-attention's cached ones once the source is
    cached; else projected (`fused_kv` when _fused_qkv made them), normed and rotated,
    then written to the layer's cache ("cross": once; "self": at positions_BL)."""
    cfg = self.config
    if kv_BSE is None:  # Decoding steps after the first: the source's k/v are cached.
      if self.cache != "cross" or not self.has_variable("cache", "cached_key"):
        raise ValueError("attention got no keys/values input; only a decoding cross-"
                         "attention can do without, once a first call with the encoder "
                         "output has cached them")
      return self.get_variable("cache", "cached_key"), self.get_variable("cache",
                                                                         "cached_value")
    k_BSKD, v_BSKD = fused_kv if fused_kv is not None else (key(kv_BSE), value(kv_BSE))
    if cfg.qk_norm:
      k_BSKD = norms.make_norm(cfg, "key_norm", axis_name="head_dim")(k_BSKD).astype(
          cfg.dtype)
    if key_positions is not None:
      k_BSKD = rope(k_BSKD, key_positions)
    # model.init only sizes the "self" cache: a "cross" cache's shape depends on the
    # source length, so it is created by the first decoding call instead.
    if self.cache == "cross" and not self.is_initializing():
      self.put_variable("cache", "cached_key", k_BSKD)
      self.put_variable("cache", "cached_value", v_BSKD)
    elif self.cache == "self":
      k_BSKD, v_BSKD = self._update_cache(k_BSKD, v_BSKD, positions_BL)
    return k_BSKD, v_BSKD

  def _fusable(self) -> bool:
    """Whether q, k and v may come from one matmul (self-attention's, _fused_qkv): no
    fp8 and no LoRA adapter on them, and their heads split over the mesh alike (the query heads'
    shards fall on whole key/value groups), so the joined kernel needs no resharding."""
    cfg = self.config
    # fp8 (model.quantization) scales each projection's tensors apart: three fp8 matmuls.
    if cfg.quantization or any(lora.adapted(cfg, name) for name in ("query", "key", "value")):
      return False
    try:  # One at a time: a spec uses each mesh axis once.
      heads, kv_heads = (nn.logical_to_mesh_axes((axis,))[0] for axis in ("heads", "kv_heads"))
    except (ValueError, KeyError):
      return False
    if heads != kv_heads:
      return False
    mesh = jax.sharding.get_abstract_mesh()
    axes = () if heads is None else (heads,) if isinstance(heads, str) else tuple(heads)
    shards = 1
    for axis in axes:
      shards *= 1 if mesh.empty else mesh.shape[axis]
    return cfg.num_kv_heads % shards == 0

  def _fused_qkv(self, x_BLE: jax.Array, query: nn.Module, key: nn.Module,
                 value: nn.Module) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q, k and v of self-attention by joined_qkv: three matmuls forward (their biases
    added in each one's epilogue: biased_product), the joined kernel [E, K, G + 2, D]
    (each key/value head's G query heads, its key and its value: the grouped-query
    layout, sharded as the heads are) backward, the parameters where the three
    projections keep them (query/kernel, ...). One matmul for the inputs' gradient
    instead of three and their sum (gpt_small 32 x 1024 on an H100: 4 GB a step)."""
    cfg = self.config
    (wq, bq), (wk, bk), (wv, bv) = query(None), key(None), value(None)
    return joined_qkv(x_BLE.astype(cfg.dtype), (wq, wk, wv), (bq, bk, bv), cfg.dtype)

  def _attend(self, q_BLHD, k_BSKD, v_BSKD, mask_B1LS, bias_BHLS, segments, *,
              causal: bool, prefix: bool, local: bool | jax.Array) -> jax.Array:
    """The product by the kernel `model.attention_impl` picks (attention_ops.py)."""
    cfg = self.config
    use_dropout = cfg.attention_dropout > 0.0 and not cfg.deterministic
    kind = attention_ops.LayerKind(
        causal=causal, prefix=prefix, has_bias=bias_BHLS is not None,
        softcap=cfg.attention_softcap,
        dropout=use_dropout, decoding=self.cache is not None or segments is None,
        cross=self.cross, packed=cfg.attention_max_segments > 1 and cfg.rows_packed)
    call = functools.partial(
        attention_ops.dot_product_attention, q_BLHD, k_BSKD, v_BSKD, impl=cfg.attention_impl,
        mask_B1LS=mask_B1LS, segments=segments, bias_BHLS=bias_BHLS,
        dropout_rate=cfg.attention_dropout if use_dropout else 0.0,
        dropout_rng=self.make_rng("dropout") if use_dropout else None,
        max_segments=cfg.attention_max_segments if cfg.rows_packed else 1,
        padded=cfg.rows_padded)
    if not cfg.sliding_window or local is False:
      return call(kind=kind)
    local_kind = dataclasses.replace(kind, window=cfg.sliding_window)
    if local is True:
      return call(kind=local_kind)
    # A scanned stack mixing local and global layers: the flag is traced. The dense
    # kernels read the per-layer mask already chosen; a fused one picks its window here.
    chosen = {attention_ops.choose_kernel(cfg.attention_impl, k,
                                          platform=accelerator.platform_of_mesh(),
                                          dtype=q_BLHD.dtype, head_dim=q_BLHD.shape[-1],
                                          q_len=q_BLHD.shape[1], kv_len=k_BSKD.shape[1],
                                          context=1 if kind.decoding else context.size())
              for k in (kind, local_kind)}
    if len(chosen) == 1 and not attention_ops.KERNEL_FUNCTIONS[chosen.pop()].takes_segments:
      return call(kind=kind)
    return jax.lax.cond(local, lambda: call(kind=local_kind), lambda: call(kind=kind))

  def _update_cache(self, k_BLKD: jax.Array, v_BLKD: jax.Array,
                    positions_BL: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Writes this call's keys/values into slots `positions_BL`; returns all max_len slots.

    Slot = position, per row, so the rows of a batch may sit at different positions
    (prompts of different lengths). The first call (model.init in decode mode, with a
    [B, max_len] input) only sizes the cache. Later calls may prefill several tokens at
    once or add one per step. A slot past a query's position is masked by causality, so
    whatever a slot held before it is written (zeros, a prompt's padding) is never read.
    """
    cfg = self.config
    B, _, K, D = k_BLKD.shape
    shape = (B, cfg.max_len, K, D)
    sizing = not self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, shape, k_BLKD.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, shape, v_BLKD.dtype)
    if sizing:
      return k_BLKD, v_BLKD
    rows_B1 = jnp.arange(B)[:, None]
    cached_k.value = cached_k.value.at[rows_B1, positions_BL].set(k_BLKD)
    cached_v.value = cached_v.value.at[rows_B1, positions_BL].set(v_BLKD)
    return cached_k.value, cached_v.value
