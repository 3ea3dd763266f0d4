"""fp8 matmuls (model.quantization="fp8"): flax's delayed-scaling fp8 dot, its state in params.

The product is flax's `fp8_ops.fp8_scaled_dot_general`: the input and the kernel are
quantized to float8_e4m3fn and the output's gradient to float8_e5m2, each with a scale
from the largest |value| of the last AMAX_HISTORY steps (delayed scaling, as NVIDIA's
Transformer Engine and MaxText's "fp8" do: the scale a step uses needs no reduction over
the tensor before its matmul, which current scaling would). On an NVIDIA GPU with fp8
tensor cores (H100, H200) XLA rewrites the quantize -> dot -> scale pattern into
cuBLASLt fp8 GEMMs; on a CPU the same numbers are emulated. The master weights stay in
model.param_dtype and the optimizer sees only them.

The scaling state (three scales and three amax histories per matmul) is the "gradient"
flax's custom VJP returns for it: what `flax.linen.Fp8DirectDotGeneralOp` keeps in its
`_overwrite_with_gradient` collection. Here it lives in the params collection instead,
under a submodule named FP8_SCOPE, so that checkpoints, sharding (logical axes, every
leaf replicated), init_from (matched by path: a bf16 source leaves it initialised),
averaging and decoding carry it with no collection of their own; the trainer
(split_state) takes it out of the optimizer's tree and sets it to
its gradient each step.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import traverse_util
from flax.linen import fp8_ops

# The submodule that holds one matmul's scaling state; a path through it is state, not a
# weight (is_fp8_state).
FP8_SCOPE = "fp8"
# Steps of amax kept per tensor: flax's default (Fp8DotGeneralBase.amax_history_length),
# MaxText's and Transformer Engine's.
AMAX_HISTORY = 1024
_STATE = ("input_scale", "kernel_scale", "output_grad_scale", "input_amax_history",
          "kernel_amax_history", "output_grad_amax_history")


def is_fp8_state(path: tuple[str, ...]) -> bool:
  """Whether a parameter path ("block_0", "mlp", "wi", "fp8", "input_scale") is fp8
  scaling state rather than a weight."""
  return len(path) >= 2 and path[-2] == FP8_SCOPE and path[-1] in _STATE


class Fp8State(nn.Module):
  """One matmul's fp8 scaling state, `Fp8State(name=FP8_SCOPE)()` inside the layer that
  owns the kernel: {name: value} for fp8_scaled_dot_general's scale and history
  arguments (flax's Fp8DotGeneralBase's variables, in params)."""

  @nn.compact
  def __call__(self) -> dict[str, jax.Array]:
    state = {}
    for name in _STATE:  # Replicated (no logical axis): a few KiB a matmul.
      history = name.endswith("history")
      init = nn.initializers.zeros if history else nn.initializers.ones
      state[name] = self.param(name, nn.with_logical_partitioning(init, (None,)),
                               (AMAX_HISTORY if history else 1,), jnp.float32)
    return state


def _fp8_dot(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None,
             preferred_element_type=None, *, state: dict[str, jax.Array]) -> jax.Array:
  """lax.dot_general's signature over flax's fp8 product; rhs is the kernel in the
  compute dtype, the quantization's compute type (as flax's Fp8Einsum takes it)."""
  del precision  # fp8_scaled_dot_general sets its own (and warns on any other).
  return fp8_ops.fp8_scaled_dot_general(
      lhs.astype(rhs.dtype), rhs, dimension_numbers,
      preferred_element_type=preferred_element_type or rhs.dtype,
      lhs_scale=state["input_scale"], rhs_scale=state["kernel_scale"],
      grad_scale=state["output_grad_scale"],
      lhs_amax_history=state["input_amax_history"],
      rhs_amax_history=state["kernel_amax_history"],
      grad_amax_history=state["output_grad_amax_history"],
      quantize_compute_type=rhs.dtype)


def dot_general(quantization: str) -> Callable:
  """The dot_general of a layer's matmul under model.quantization: for "fp8" flax's fp8
  product over the state of an Fp8State submodule of the calling module (call this
  inside its nn.compact method), else lax.dot_general. Either takes jnp.einsum's
  `_dot_general` arguments (a partial: jnp.einsum hashes it)."""
  if quantization == "fp8":
    return functools.partial(_fp8_dot, state=Fp8State(name=FP8_SCOPE)())
  return jax.lax.dot_general


def split_state(params: dict) -> tuple[dict, dict]:
  """(weights, fp8 state) of a parameter tree (nested dicts; boxed leaves count as
  leaves); without fp8 layers (params, {}). The state is no weight: the optimizer, its
  clipping and weight decay, parameter counts and exports never see it; the train step
  sets it to its gradient, which flax's fp8 VJP makes the next scales and histories."""
  flat = traverse_util.flatten_dict(params)
  if not any(is_fp8_state(path) for path in flat):
    return params, {}
  weights, state = {}, {}
  for path, leaf in flat.items():
    (state if is_fp8_state(path) else weights)[path] = leaf
  return traverse_util.unflatten_dict(weights), traverse_util.unflatten_dict(state)


def with_initial_state(params: dict, abstract: dict) -> dict:
  """`params` plus, for every fp8 state leaf of `abstract` (a model's parameter tree of
  arrays or ShapeDtypeStructs) that params lacks, its initial value (scales 1, histories
  0): weights from elsewhere (a Hugging Face import) for a model.quantization="fp8" run."""
  flat = traverse_util.flatten_dict(params)
  for path, leaf in traverse_util.flatten_dict(abstract).items():
    if is_fp8_state(path) and path not in flat:
      fill = np.zeros if path[-1].endswith("history") else np.ones
      flat[path] = fill(leaf.shape, np.float32)
  return traverse_util.unflatten_dict(flat)
