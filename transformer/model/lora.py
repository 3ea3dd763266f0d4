"""LoRA: a low-rank adapter beside a projection, and its merge into the kernel.

A projection y = x . W (W of shape in_dims + out_dims, e.g. [E, H, D] for the query)
with an adapter computes y = x . W + alpha / r * (dropout(x) . A) . B, with A of shape
in_dims + [r] and B of shape [r] + out_dims (Hu et al. 2021; peft's and Levanter's
convention). A starts as peft's kaiming-uniform (bound 1 / sqrt(fan_in)), B at zero,
so a model with fresh adapters computes exactly its base model's function. The
parameters sit inside the projection's module, `<projection>/lora_a` and `lora_b`,
beside its `kernel`; their rank axis is the logical axis "lora" (replicated by the
base rules), the others are the kernel's, so fsdp / tensor sharding splits them as
it splits the kernel. Which projections carry one: config.model.lora_targets
(config/lora.py); which parameters train: training/optim.py's `trainable_mask`.
"""

from __future__ import annotations

import string
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.config.model import ModelConfig
from transformer.model.dropout import Dropout

ADAPTER_NAMES = ("lora_a", "lora_b")


def scale(config: Any) -> float:
  """alpha / r, the factor of A . B (config: a ModelConfig or the model ConfigDict)."""
  return config.lora_alpha / config.lora_rank


def adapted(config: ModelConfig, name: str) -> ModelConfig | None:
  """`config` when the projection `name` carries an adapter, else None (the modules'
  `lora` field). "wi_gate" goes with "wi": the gated MLP's two input halves."""
  target = "wi" if name == "wi_gate" else name
  return config if config.lora_rank and target in config.lora_targets else None


def adapter_delta(module: nn.Module, config: ModelConfig, x: jax.Array,
                  in_axes: tuple[str, ...], out_axes: tuple[str, ...],
                  in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> jax.Array:
  """alpha / r * (dropout(x) . A) . B, creating `lora_a`, `lora_b` in `module`'s scope.

  Called from inside `module`'s compact __call__ (the projection's own module).

  Args:
    module: the projection module (EinsumDense, the MLP's Dense).
    config: the model config (lora_rank, lora_alpha, lora_dropout, deterministic).
    x: the projection's input; its trailing len(in_shape) axes are contracted.
    in_axes, out_axes: the kernel's logical axis names, input and output side.
    in_shape, out_shape: the kernel's shape, input and output side.

  Returns:
    The adapter's addition to the projection output, x.shape[:-len(in_shape)] + out_shape.
  """
  rank, n_in = config.lora_rank, len(in_shape)
  # Kaiming-uniform with a = sqrt(5), as peft and torch.nn.Linear: bound 1 / sqrt(fan_in).
  a_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform",
                                            in_axis=tuple(range(n_in)), out_axis=-1)
  lora_a = module.param("lora_a", nn.with_logical_partitioning(a_init, in_axes + ("lora",)),
                        in_shape + (rank,), config.param_dtype)
  lora_b = module.param("lora_b", nn.with_logical_partitioning(nn.initializers.zeros,
                                                               ("lora",) + out_axes),
                        (rank,) + out_shape, config.param_dtype)
  x = Dropout(config.lora_dropout, deterministic=config.deterministic)(x)
  ins = string.ascii_lowercase[:n_in]
  outs = string.ascii_lowercase[n_in:n_in + len(out_shape)]
  low = jnp.einsum(f"...{ins},{ins}z->...z", x.astype(config.dtype),
                   lora_a.astype(config.dtype))
  delta = jnp.einsum(f"...z,z{outs}->...{outs}", low, lora_b.astype(config.dtype))
  return delta * jnp.asarray(scale(config), config.dtype)


def merged_kernel(kernel: Any, lora_a: Any, lora_b: Any, factor: float,
                  xp: Any = np) -> Any:
  """kernel + factor * A . B in float32; any leading stacked axes (a scanned stack's
  layers) are shared by all three. `xp`: NumPy (export, averaging on the host) or
  jax.numpy (inside a jit that keeps the kernel's sharding, init_from)."""
  kernel, lora_a, lora_b = (xp.asarray(v, xp.float32) for v in (kernel, lora_a, lora_b))
  lead = lora_a.ndim + lora_b.ndim - 2 - kernel.ndim  # Axes all three share in front.
  n_in = lora_a.ndim - 1 - lead
  letters = iter(string.ascii_lowercase[:25])
  lead_s = "".join(next(letters) for _ in range(lead))
  ins = "".join(next(letters) for _ in range(n_in))
  outs = "".join(next(letters) for _ in range(lora_b.ndim - 1 - lead))
  delta = xp.einsum(f"{lead_s}{ins}z,{lead_s}z{outs}->{lead_s}{ins}{outs}", lora_a, lora_b)
  return kernel + xp.float32(factor) * delta


def merge(params: dict, config: Any, xp: Any = np) -> dict:
  """The parameters with every adapter folded into its kernel and removed.

  The merged model (config.model with lora_rank=0) computes what the adapted one
  computes, up to float rounding. Parameters without adapters come back unchanged.

  Args:
    params: a parameter tree (nested dicts of arrays), adapters anywhere in it.
    config: the model config the adapters were built with (lora_alpha, lora_rank).
    xp: NumPy (host arrays) or jax.numpy (inside a jit, sharded arrays).

  Returns:
    A new tree without `lora_a` / `lora_b` leaves; adapted kernels in float32.
  """
  if not isinstance(params, dict):
    return params
  if "lora_a" in params:
    if "lora_b" not in params or "kernel" not in params:
      raise ValueError(f"an adapter needs lora_a, lora_b and kernel together; got "
                       f"{sorted(params)}")
    out = {k: v for k, v in params.items() if k not in ADAPTER_NAMES}
    out["kernel"] = merged_kernel(params["kernel"], params["lora_a"], params["lora_b"],
                                  scale(config), xp)
    return out
  return {k: merge(v, config, xp) for k, v in params.items()}


def is_adapter(path: tuple[str, ...]) -> bool:
  """Whether a parameter path ("block_0", "attention", "query", "lora_a") is an adapter's."""
  return bool(path) and path[-1] in ADAPTER_NAMES
