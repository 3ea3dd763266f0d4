"""The position-wise feed-forward (dense MLP) and the activation table it shares with moe.py.

Shape letters as in the package legend (transformer/model/__init__.py).
"""

from __future__ import annotations

import math

import jax
from flax import linen as nn

from transformer.config.model import GATED_ACTIVATIONS, ModelConfig, pallas_mlp_refusal
from transformer.model import context
from transformer.model import fp8
from transformer.model import initializers
from transformer.model import lora
from transformer.model import mlp_pallas
from transformer.model.dropout import Dropout


def gelu_exact(x: jax.Array) -> jax.Array:
  """The exact GELU, x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2))).

  The same function as `jax.nn.gelu(x, approximate=False)`, which writes it with erfc
  (within 1e-6 of it in float32 over [-10, 10], gradients within 3e-7); XLA:CPU
  computes erf as one rational polynomial but erfc with an exponential and selects
  for the tails: on a [768, 512] float32 input, forward and backward took 1.72 ms
  against 2.40 ms, and the whole train step of nanoGPT's CPU shape about 5% less
  (docs/performance.md).
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))).astype(x.dtype))


ACTIVATION_FNS = {
    "relu": jax.nn.relu,
    "gelu": gelu_exact,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2's GELU.
    "silu": jax.nn.silu,
    "swiglu": jax.nn.silu,  # Gated: silu(x W) * (x V).
    "geglu": gelu_exact,  # Gated: gelu(x W) * (x V).
    # Gated with the tanh GELU: T5 v1.1's "gated-gelu", Gemma's GeGLU.
    "geglu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def activation(name: str, h: jax.Array, gate: jax.Array | None = None,
               h_bias: jax.Array | None = None, gate_bias: jax.Array | None = None
               ) -> jax.Array:
  """ACTIVATION_FNS[name](h + h_bias), times gate + gate_bias for a gated MLP, with only
  the matmuls' outputs (h, gate) kept for the backward pass, which recomputes the rest
  (jax.checkpoint). Autodiff of the tanh GELU otherwise keeps its tanh too, and a bias
  added outside it keeps h + bias beside h: one more [tokens, mlp_dim] buffer written in
  the forward and read in the backward each (gpt_small 32 x 1024 on an H100: 201 MB a
  layer each way, each)."""
  fn = ACTIVATION_FNS[name]
  biased = lambda x, b: x if b is None else x + b.reshape((1,) * (x.ndim - 1) + b.shape)
  if gate is None:
    return jax.checkpoint(lambda a, b: fn(biased(a, b)))(h, h_bias)
  return jax.checkpoint(lambda a, b, g, c: fn(biased(a, b)) * biased(g, c))(
      h, h_bias, gate, gate_bias)


class Dense(nn.Dense):
  """flax's Dense (the same parameters and numbers), plus a LoRA adapter when `lora` is
  set; with `bias_outside`, (inputs @ kernel, bias) for the caller to add the bias
  (activation() adds it inside its recomputed part)."""

  axes: tuple[str, str] = ("embed", "mlp")  # The kernel's logical axes, for the adapter's.
  lora: ModelConfig | None = None  # The config when an adapter rides along (lora.py).
  bias_outside: bool = False
  quantization: str = ""  # model.quantization: "fp8" multiplies in fp8 (fp8.py).

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array | tuple[jax.Array, jax.Array | None]:
    # flax.linen.Dense's own steps (parameters in its order, its promotion and product).
    kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features),
                        self.param_dtype)
    bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias else None)
    x, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    y = fp8.dot_general(self.quantization)(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                                           precision=self.precision)
    if self.bias_outside and self.lora is None:
      return y, bias
    if bias is not None:
      y += bias.reshape((1,) * (y.ndim - 1) + (-1,))
    if self.lora is not None:
      y = y + lora.adapter_delta(self, self.lora, inputs, self.axes[:1], self.axes[1:],
                                 (inputs.shape[-1],), (self.features,))
    return (y, None) if self.bias_outside else y


def _dense(config: ModelConfig, features: int, axes: tuple[str, str], name: str,
           residual_adds: int = 0, bias_outside: bool = False) -> Dense:
  kernel_init = initializers.dense_kernel(config, residual_adds=residual_adds)
  return Dense(
      features, use_bias=config.use_bias, dtype=config.dtype, param_dtype=config.param_dtype,
      name=name, axes=axes, lora=lora.adapted(config, name), bias_outside=bias_outside,
      quantization=config.quantization,
      kernel_init=nn.with_logical_partitioning(kernel_init, axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]))


def pallas_chosen(config: ModelConfig, width: int = 0) -> bool:
  """Whether model.mlp_impl takes the Pallas MLP (mlp_pallas.py) for the layer being
  traced: "pallas" always (validation refused what it cannot run; a mesh it cannot run
  on is refused here), "auto" on a GPU where it can run, with dropout off or 0, outside
  cached decoding. `width`: this layer's hidden size (0: model.mlp_dim; MoE's shared
  expert has its own, which validation does not see)."""
  if config.mlp_impl == "xla":
    return False
  refusal = pallas_mlp_refusal(config, training=not config.deterministic)
  if config.activation not in mlp_pallas.ACTIVATIONS and config.activation not in (
      mlp_pallas.GATED):
    refusal = refusal or f"no kernel computes model.activation={config.activation!r}"
  sharded = mlp_pallas.weights_sharded()
  if sharded:
    refusal = refusal or (f"the mesh shards the MLP's weights over {sharded}, and its "
                          "kernels take them whole")
  if width and width % mlp_pallas.ALIGN:
    refusal = refusal or f"this MLP's width {width} is not a multiple of {mlp_pallas.ALIGN}"
  if mlp_pallas.uses_context():
    refusal = refusal or "the sequence is cut over context shards"
  if config.mlp_impl == "pallas":
    if refusal:
      raise ValueError(f"model.mlp_impl='pallas': {refusal}; use 'auto' or 'xla'")
    return True
  # Not for a cached decoding step: a few tokens a call, where the weights' reads are the
  # step and XLA's autotuned GEMMs have nothing to lose to an activation pass.
  return (refusal is None and not config.decode
          and mlp_pallas.platform() in mlp_pallas.GPU_PLATFORMS)


class _Weights(nn.Module):
  """A Dense layer's parameters alone (the same names, shapes, initialisers and logical
  axes as _dense's), for the Pallas MLP, which multiplies them itself."""

  config: ModelConfig
  features: int
  axes: tuple[str, str]
  residual_adds: int = 0

  @nn.compact
  def __call__(self, in_features: int) -> tuple[jax.Array, jax.Array | None]:
    cfg = self.config
    init = nn.with_logical_partitioning(
        initializers.dense_kernel(cfg, residual_adds=self.residual_adds), self.axes)
    kernel = self.param("kernel", init, (in_features, self.features), cfg.param_dtype)
    bias = (self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                            self.axes[1:]),
                       (self.features,), cfg.param_dtype) if cfg.use_bias else None)
    return kernel, bias


class MLP(nn.Module):
  """Position-wise feed-forward: wo(act(wi x)), or wo(act(wi x) * wi_gate x) when gated;
  model.mlp_impl picks XLA's matmuls or the Pallas kernels (pallas_chosen)."""

  config: ModelConfig
  residual_adds: int = 0  # Of this block's stack, for the init of `wo` (initializers.py).
  mlp_dim: int = 0  # Hidden width; 0 = config.mlp_dim (moe.py's shared expert sets its own).

  @nn.compact
  def __call__(self, x_BLE: jax.Array) -> jax.Array:
    cfg = self.config
    width = self.mlp_dim or cfg.mlp_dim
    # Tokens on one axis (N = B * L): see EinsumDense for why this is faster on CPU.
    # Not with the length sharded over context (context.tokens_mergeable): flax's Dense
    # contracts the last axis of any rank, so the same weights serve [B, L, E].
    x_NE = x_BLE.reshape(-1, x_BLE.shape[-1]) if context.tokens_mergeable() else x_BLE
    if pallas_chosen(cfg, width):
      return self._pallas(x_NE, width).reshape(x_BLE.shape)
    h_NF, h_bias = _dense(cfg, width, ("embed", "mlp"), "wi", bias_outside=True)(x_NE)
    gate_NF, gate_bias = (
        _dense(cfg, width, ("embed", "mlp"), "wi_gate", bias_outside=True)(x_NE)
        if cfg.activation in GATED_ACTIVATIONS else (None, None))
    h_NF = activation(cfg.activation, h_NF, gate_NF, h_bias, gate_bias)
    h_NF = Dropout(cfg.mlp_dropout, deterministic=cfg.deterministic)(h_NF)
    y_NE = _dense(cfg, cfg.d_model, ("mlp", "embed"), "wo", self.residual_adds)(h_NF)
    return y_NE.reshape(x_BLE.shape)



  def _pallas(self, x_NE: jax.Array, width: int) -> jax.Array:
    """The same MLP by mlp_pallas.mlp: the parameters _dense would make, under its names."""
    cfg = self.config
    wi, bi = _Weights(cfg, width, ("embed", "mlp"), name="wi")(x_NE.shape[-1])
    gate = (_Weights(cfg, width, ("embed", "mlp"), name="wi_gate")(x_NE.shape[-1])
            if cfg.activation in GATED_ACTIVATIONS else None)
    wo, bo = _Weights(cfg, cfg.d_model, ("mlp", "embed"), self.residual_adds,
                      name="wo")(width)
    x_NE = x_NE.astype(cfg.dtype)
    y_NE = mlp_pallas.mlp(cfg.activation, x_NE, wi, bi, wo, cfg.dtype,
                          interpret=mlp_pallas.platform() == "cpu", gate=gate)
    return y_NE if bo is None else y_NE + bo.astype(y_NE.dtype)[None, :]
