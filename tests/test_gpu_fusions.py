"""What XLA's GPU compiler fuses in the train step's hot spots, compiled for an H100 here.

Each test compiles a few ops of the model for `h100:1` (jax's CUDA plugin, no GPU; skipped
with the reason without the plugin) and counts the kernels of the optimised program with
planning/hlo.py, the count the compile mode's bytes come from: a change that brings back a
pass over an activation fails here in seconds, not only in a 10-minute compile of the step
(docs/performance.md, "Fewer bytes").
"""

from __future__ import annotations

import glob
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import accelerator
from transformer.model import attention
from transformer.model import mlp_pallas
from transformer.model.lm_head import LogitsHead
from transformer.planning import gpu
from transformer.planning import hlo
from transformer.training import metrics

needs_plugin = pytest.mark.skipif(
    gpu.wheels_missing() is not None,
    reason=f"jax's CUDA plugin is not installed ({gpu.INSTALL_HINT}): XLA's GPU compiler")

B, L, E, H, D = 8, 512, 256, 4, 64  # Activations far larger than the weights.


def _kernels(fn, *shapes, mesh: bool = False) -> list[hlo.Launch]:
  """The kernels of `fn` compiled for one H100 on abstract inputs of `shapes`
  ((shape, dtype) pairs), as the compile mode compiles a step (its GPU flags); `mesh`:
  traced under a mesh of that H100, as the compile mode traces (code that asks which
  platform it is traced for gets the GPU, not JAX's default backend, this CPU)."""
  device = gpu.devices(gpu.parse("h100:1"))[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  args = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in shapes]
  if mesh:
    with jax.set_mesh(jax.sharding.Mesh(np.array([device]), ("data",))):
      lowered = jax.jit(fn).lower(*args)
  else:
    lowered = jax.jit(fn).lower(*args)
  with tempfile.TemporaryDirectory() as dump:
    options = {"xla_dump_to": dump, "xla_dump_hlo_as_text": True}
    options.update(accelerator.gpu_compiler_options())
    with gpu.plugin_noise_filtered():
      lowered.compile(compiler_options=options)
    (path,) = [p for p in glob.glob(os.path.join(dump, "*after_optimizations.txt"))
               if "buffer-assignment" not in p and "live-range" not in p]
    with open(path, encoding="utf-8") as f:
      text = f.read()
  return [launch for launch in hlo.launches(text)[0] if launch.is_kernel]


def _big(kernels: list[hlo.Launch], nbytes: int) -> list[hlo.Launch]:
  """The kernels that move at least `nbytes`: the passes over activations."""
  return [k for k in kernels if k.bytes >= nbytes]


ACTIVATION = B * L * E * 2  # One [B, L, E] bfloat16 array.
QKV = ((B, L, E), jnp.bfloat16), ((E, H, D), jnp.float32), ((H, D), jnp.float32)


@needs_plugin
def test_a_biased_projection_is_one_matmul_kernel():
  """The bias rides in the matmul's epilogue: one kernel, the product written once."""
  kernels = _kernels(lambda x, w, b: attention.biased_product(
      "BLE,EHD->BLHD", x, w.astype(jnp.bfloat16), b, jnp.bfloat16), *QKV)
  big = _big(kernels, ACTIVATION // 2)
  assert len(big) == 1 and big[0].kind == "matmul triton gemm fusion", (
      [(k.instruction.name, k.bytes) for k in kernels])


@needs_plugin
def test_joined_qkv_backward_sums_the_bias_gradients_in_its_one_pass_over_the_pieces():
  """Backward with biases: dq, dk and dv joined and the biases' gradients summed in one
  pass, then one matmul for x's gradient and one for the kernels' (from a concatenation,
  the sums took a pass of their own)."""
  def backward(x, wq, wk, wv, bq, bk, bv, dq, dk, dv):
    # pylint: disable-next=protected-access
    return attention._joined_qkv_bwd(jnp.bfloat16, (x, (wq, wk, wv), (bq, bk, bv)),
                                     (dq, dk, dv))

  cotangent = ((B, L, H, D), jnp.bfloat16)
  shapes = (QKV[0],) + (QKV[1],) * 3 + (QKV[2],) * 3 + (cotangent,) * 3
  kernels = _kernels(backward, *shapes)
  outputs = lambda k: hlo.text.array_bytes(k.instruction.shape)
  # The pass that joins dq, dk and dv writes them side by side, 3 activations...
  joins = [k for k in kernels if not k.kind and max(outputs(k)) >= 3 * ACTIVATION]
  # ... and no other kernel reads them for the biases' sums (small outputs in the compute
  # dtype; the kernels' float32 gradients are sliced out of split matmul sums).
  sums = [k for k in kernels if not k.kind and k.bytes >= 3 * ACTIVATION
          and max(outputs(k)) < ACTIVATION and k.instruction.shape.lstrip("(").startswith("bf16")]
  listed = [(k.kind or k.instruction.name, k.bytes) for k in kernels]
  assert len(joins) == 1 and not sums, listed
  assert sum(1 for k in kernels if k.kind == "matmul triton gemm fusion") == 2, listed


@needs_plugin
@pytest.mark.parametrize("act", ["gelu_tanh", "swiglu"])
def test_the_pallas_mlp_makes_no_pass_of_its_own_over_a_hidden_activation(act):
  """model.mlp_impl='pallas' forward and backward: the [N, F] arrays written are h (with
  the gate, one joined product), by XLA's matmul, and their gradients, by the kernel that
  makes them from wo's output gradient: no activation pass, no gradient written between
  a matmul and the activation's derivative, no copy of h and the gate out of a merged
  product. The three kernels' FLOPs are read from their names."""
  N, F = B * L, 4 * E
  gated = act == "swiglu"

  def step(x, wi, bi, wo, wg, dy):
    def mlp(x, wi, bi, wo, wg):  # Gated as llama's: no biases.
      return mlp_pallas.mlp(act, x, wi, None if gated else bi, wo, jnp.bfloat16, False,
                            gate=(wg, None) if gated else None)
    y, vjp = jax.vjp(mlp, x, wi, bi, wo, wg)
    return y, vjp(dy)

  kernels = _kernels(step, ((N, E), jnp.bfloat16), ((E, F), jnp.float32),
                     ((F,), jnp.float32), ((F, E), jnp.float32), ((E, F), jnp.float32),
                     ((N, E), jnp.bfloat16))
  listed = [(k.kind or k.instruction.name, k.bytes) for k in kernels]
  # Gated, h and the gate are one [N, 2F] product, and their gradients [N, 2, F].
  shapes = [f"[{N},{F}]"] if not gated else [f"[{N},{2 * F}]", f"[{N},2,{F}]"]
  writers = sorted(k.kind or k.instruction.name for k in kernels
                   if any(shape in k.instruction.shape for shape in shapes))
  assert writers == sorted(["matmul triton gemm fusion",
                           f"matmul pallas mlp_matmul_d{act}_{N}x{F}x{E}"]), listed
  pallas = {k.kind: k.flops for k in kernels if "pallas" in (k.kind or "")}
  assert pallas == {f"matmul pallas mlp_{act}_matmul_{N}x{E}x{F}": 2 * N * E * F,
                    f"matmul pallas mlp_{act}_matmul_t_{F}x{E}x{N}": 2 * N * E * F,
                    f"matmul pallas mlp_matmul_d{act}_{N}x{F}x{E}": 2 * N * E * F}, listed


@needs_plugin
def test_the_pallas_loss_head_never_writes_the_logit_gradient():
  """model.loss_head_impl='auto' on a GPU (Pallas), one chunk differentiated: the [N, V] logits are
  written by XLA's matmul and read by the statistics' reduction and the two Pallas
  kernels; no kernel writes an [N, V] array but the logits' matmul."""
  V = 2048
  head = lambda w: LogitsHead(weight=w, bias_V=None, tied=True, dtype=jnp.bfloat16,
                              softcap=0.0, impl="auto")  # Pallas on a GPU.

  def step(w, x, targets):
    loss = lambda w, x: metrics.head_loss_sums(
        head(w), x, targets, jnp.ones(targets.shape, jnp.float32),
        chunk=L)["objective_sum"]
    return jax.grad(loss, argnums=(0, 1))(w, x)

  kernels = _kernels(step, ((V, E), jnp.float32), ((B, L, E), jnp.bfloat16),
                     ((B, L), jnp.int32), mesh=True)  # "auto" and interpret read it.
  logits = B * L * V * 2
  listed = [(k.kind or k.instruction.name, k.bytes) for k in kernels]
  writers = [k for k in kernels if max(hlo.text.array_bytes(k.instruction.shape)) >= logits]
  assert [k.kind for k in writers] == ["matmul triton gemm fusion"], listed
  readers = sorted(k.kind or "" for k in _big(kernels, logits) if k not in writers)
  assert [k for k in readers if k.startswith("matmul")] == [
      f"matmul pallas loss_head_dw_{V}x{E}x{B * L}",
      f"matmul pallas loss_head_dx_{B * L}x{E}x{V}"], listed
