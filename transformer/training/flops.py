"""Model FLOPs of a training step and the peak they are measured against (MFU).

Model FLOPs utilisation = model FLOPs per step / seconds per step / peak FLOP/s of the
devices. Model FLOPs use the standard count (PaLM, appendix B): per token, 6 x the
weights of every matmul the token goes through (2 for the forward multiply-add, 4 for
the backward), plus 12 x layers x heads x head_dim x context for the attention scores
and the weighted sum of values. Conventions, as in PaLM:
  - the token and position embedding lookups are not matmuls and do not count; the
    output projection to the vocabulary does (tied or not: it is a matmul either way);
  - biases, norms, activations, softmax and the optimizer update are elementwise and do
    not count (under 1% of the total for these models);
  - causal attention counts the full context (no halving for the mask), padding
    counts as tokens, and rematerialised work does not count (it is MFU, not HFU);
  - a local (sliding-window) layer's context is the keys its window holds: the
    window (causal) or 2 x window - 1 (bidirectional), at most the sequence;
  - a parallel block (model.parallel_block) does the same matmuls as a sequential one;
  - a mixture-of-experts layer (model.mlp="moe") counts its active weights: the router,
    experts_per_token experts (not the dispatch einsums, nor capacity's empty slots),
    the shared expert and its gate;
  - with LoRA adapters the frozen weights count 4, not 6 (no weight gradient; see
    `train_flops_per_step`).

The peak is the device's published dense bfloat16 rate (`PEAK_BF16_FLOPS`) on GPUs and
TPUs, and on CPU (or an accelerator missing from the table) the rate of a large matmul
measured on this host, so that a number near 100% means "as fast as this machine
multiplies matrices".

Shape legend: B batch, L target length, S source length, E embed, H heads, K kv heads,
D head dim, F mlp hidden, V vocab, C classes.
"""

from __future__ import annotations

import json
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from transformer import hardware
from transformer.config import objective as objective_lib
from transformer.config.model import GATED_ACTIVATIONS, ModelConfig
from transformer.workdir import files
from transformer.workdir import layout

# Dense bfloat16 peak FLOP/s of one JAX device, by the words its lower-case device_kind
# contains ("NVIDIA A100-SXM4-80GB" has "a100"; the longest match wins, so "TPU v5 lite"
# is "tpu v5 lite", not "tpu v5"). On TPU v2 and v3 a JAX device is one TensorCore (half
# a chip); from v4 on it is a chip. The figures and their sources live in hardware.py.
PEAK_BF16_FLOPS = {
    **{key: chip.bf16_flops for key, chip in hardware.CHIPS.items()},
    **{alias: hardware.CHIPS[key].bf16_flops for alias, key in hardware.ALIASES.items()},
}



def published_peak_flops(device_kind: str) -> float | None:
  """The table's dense bf16 FLOP/s for `device_kind`, or None if it is not listed."""
  kind = device_kind.lower()
  matches = [key for key in PEAK_BF16_FLOPS
             if re.search(rf"(^|[\s_-]){re.escape(key)}($|[\s_-])", kind)]
  return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None


def measure_matmul_flops(size: int = 1024, repeats: int = 10,
                         dtype: jnp.dtype = jnp.float32,
                         device: jax.Device | None = None) -> float:
  """FLOP/s of a [size, size] x [size, size] matmul on one device: the best of `repeats`.

  The best run is the one least disturbed by other work on the machine. On 2 CPU
  cores 1024 already runs at the rate of larger sizes and takes ~20 ms.
  """
  device = device or jax.local_devices()[0]
  # A mesh of this one device: the caller may be inside a training run's mesh context,
  # which jit would otherwise require the operands to span.
  with jax.set_mesh(jax.sharding.Mesh(np.array([device]), ("measure",))):
    a = jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (size, size), dtype), device)
    b = jax.device_put(jax.random.normal(jax.random.PRNGKey(1), (size, size), dtype), device)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # Compile.
    best = float("inf")
    for _ in range(repeats):
      start = time.perf_counter()
      matmul(a, b).block_until_ready()
      best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best


def peak_flops(workdir: str | None = None) -> tuple[float, str]:
  """Peak FLOP/s of all the run's devices together, and where the number comes from.

  GPUs/TPUs in the table: the published bf16 peak x the device count. Otherwise
  (CPU, an unlisted accelerator) a matmul rate measured once on this process's first
  device (float32 on CPU, bfloat16 elsewhere) x the devices it stands for: one host on
  CPU (its devices share the cores), each device on an accelerator. The measurement is
  cached in `<workdir>/peak_flops.json`, so that a resumed run keeps its denominator.
  """
  device = jax.devices()[0]
  published = published_peak_flops(device.device_kind)
  if device.platform != "cpu" and published:
    return (published * jax.device_count(),
            f"published bf16 peak of {jax.device_count()} x {device.device_kind}")
  on_cpu = device.platform == "cpu"
  dtype = jnp.float32 if on_cpu else jnp.bfloat16
  units = jax.process_count() if on_cpu else jax.device_count()
  what = (f"{jnp.dtype(dtype).name} matmul rate measured on {device.device_kind} x "
          f"{units} {'host' if on_cpu else 'device'}{'s' if units > 1 else ''}")
  path = os.path.join(workdir, layout.PEAK_FLOPS) if workdir else None
  rate = _read_cached_rate(path, what)
  if rate is None:
    # Once per process (a sweep or a test session trains many runs in one), then per workdir.
    if what not in _MEASURED:
      _MEASURED[what] = measure_matmul_flops(dtype=dtype) * units
    rate = _MEASURED[what]
    if path and jax.process_index() == 0:
      try:
        files.write_atomically(path, json.dumps({"flops_per_second": rate, "source": what}))
      except OSError as e:
        logging.warning("Cannot cache the measured matmul rate in %s: %s", path, e)
  return rate, what


_MEASURED: dict[str, float] = {}  # peak_flops' measurements in this process, by source.


def _read_cached_rate(path: str | None, what: str) -> float | None:
  if not path or not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      cached = json.load(f)
    return float(cached["flops_per_second"]) if cached["source"] == what else None
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _attention_flops(cfg: ModelConfig, q_tokens: int, kv_tokens: int, *,
                     kv_projection_tokens: int, scores: bool = True) -> int:
  """Forward FLOPs of one attention sublayer over one sequence (pair); `scores=False`:
  the projections alone (the matmuls with weights)."""
  E, H, K, D = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  projections = 2 * q_tokens * (E * H * D + H * D * E) + 2 * kv_projection_tokens * 2 * E * K * D
  scores_and_values = 2 * 2 * q_tokens * kv_tokens * H * D
  return projections + (scores_and_values if scores else 0)


def _mlp_flops(cfg: ModelConfig, tokens: int, mlp_dim: int | None = None) -> int:
  matrices = 3 if cfg.activation in GATED_ACTIVATIONS else 2
  return 2 * tokens * matrices * cfg.d_model * (cfg.mlp_dim if mlp_dim is None else mlp_dim)


def _mlp_stack_flops(cfg: ModelConfig, num_layers: int, tokens: int) -> int:
  """Forward FLOPs of a stack's feed-forward sublayers, MoE layers at their active size:
  the router, experts_per_token routed experts, the shared expert and its gate."""
  total = 0
  for moe in cfg.moe_layers(num_layers):
    if not moe:
      total += _mlp_flops(cfg, tokens)
      continue
    total += 2 * tokens * cfg.d_model * cfg.num_experts  # The router.
    total += cfg.experts_per_token * _mlp_flops(cfg, tokens, cfg.moe_mlp_dim)
    total += _mlp_flops(cfg, tokens, cfg.moe_shared_mlp_dim)  # 0 without a shared expert.
    total += 2 * tokens * cfg.d_model if cfg.moe_shared_gate else 0
  return total


def _self_attention_stack_flops(cfg: ModelConfig, num_layers: int, length: int, *,
                                causal: bool, scores: bool = True) -> int:
  """Forward FLOPs of a stack's self-attention sublayers; local layers see their window."""
  window = cfg.sliding_window if causal else 2 * cfg.sliding_window - 1
  return sum(_attention_flops(cfg, length, min(length, window) if local else length,
                              kv_projection_tokens=length, scores=scores)
             for local in cfg.local_layers(num_layers))


def forward_flops_per_sequence(cfg: ModelConfig, seq_len: int,
                               source_len: int | None = None, *, scores: bool = True) -> int:
  """Model FLOPs of one forward pass over one row (one source/target pair for seq2seq).

  Args:
    cfg: the model.
    seq_len: tokens per row (the target side for encoder_decoder).
    source_len: the source side of encoder_decoder (default `seq_len`).
    scores: False: the matmuls with weights alone, without attention's scores and
      weighted values.
  """
  E, V, L = cfg.d_model, cfg.vocab_size, seq_len
  if objective_lib.resolve(cfg).classifies:
    head = 2 * E * cfg.num_classes  # On one pooled vector per row.
  elif cfg.head == "mlm":
    head = 2 * L * (E * E + E * V)  # The transform, then the vocabulary projection.
  else:
    head = 2 * L * E * V
  if cfg.arch in ("decoder", "encoder"):
    return (_self_attention_stack_flops(cfg, cfg.num_layers, L, causal=cfg.arch == "decoder",
                                        scores=scores)
            + _mlp_stack_flops(cfg, cfg.num_layers, L) + head)
  if cfg.arch != "encoder_decoder":
    raise ValueError(f"model.arch={cfg.arch!r}; valid: 'decoder', 'encoder', "
                     "'encoder_decoder'")
  S = source_len or seq_len
  encoder = (_self_attention_stack_flops(cfg, cfg.num_layers, S, causal=False, scores=scores)
             + _mlp_stack_flops(cfg, cfg.num_layers, S))
  cross = _attention_flops(cfg, L, S, kv_projection_tokens=S, scores=scores)  # k, v of S.
  decoder = (_self_attention_stack_flops(cfg, cfg.num_decoder_layers, L, causal=True,
                                         scores=scores)
             + cfg.num_decoder_layers * cross
             + _mlp_stack_flops(cfg, cfg.num_decoder_layers, L))
  return encoder + decoder + head


def train_flops_per_step(cfg: ModelConfig, batch_size: int, seq_len: int,
                         source_len: int | None = None) -> int:
  """Model FLOPs of one training step: 3 x the forward (the backward costs two forwards).

  With LoRA (cfg.lora_rank > 0) the frozen weights get no gradient: their matmuls cost
  the forward and the gradient of their input, 2 x the forward, not 3 x; attention's
  scores and values and a classification head (it trains in full) keep 3 x. The
  adapters' own products (about 2 r / d_model of their projection's) are not counted,
  like biases and norms.
  """
  forward = forward_flops_per_sequence(cfg, seq_len, source_len)
  if not cfg.lora_rank:
    return 3 * batch_size * forward
  frozen = forward_flops_per_sequence(cfg, seq_len, source_len, scores=False)
  if objective_lib.resolve(cfg).classifies:
    frozen -= 2 * cfg.d_model * cfg.num_classes
  return batch_size * (3 * forward - frozen)
