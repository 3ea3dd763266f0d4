"""Mixture-of-experts decoders: Mixtral and Qwen2-MoE folders (llama.py's decoder + experts).

Both are Llama-shaped decoders (llama.convert_decoder reads everything but the
feed-forward) whose MLPs are routed experts (model.mlp="moe", model/moe.py): a router
`gate` [X, D] whose float32 softmax over all experts picks the top
`num_experts_per_tok`, and SwiGLU experts (gate_proj / w1 the activated half -> wi,
up_proj / w3 -> wi_gate, down_proj / w2 -> wo), dropless in transformers and here.

  Mixtral    every layer sparse, the top-k weights renormalised to sum to 1,
             `sliding_window` on every layer (or null) as Mistral.
  Qwen2-MoE  weights not renormalised unless norm_topk_prob, a shared expert on every
             sparse layer scaled by sigmoid(shared_expert_gate x), q/k/v biases; layer i
             is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in
             mlp_only_layers, the others dense of intermediate_size.

OLMoE is not imported: its q_norm / k_norm are RMSNorms over the whole q / k projection
(all heads at once), where this codebase's qk_norm normalises each head.
"""

from __future__ import annotations

from typing import Any

from transformer.config.errors import ConfigError
from transformer.interop.hf import common
from transformer.interop.hf import llama

PREFIXES = llama.PREFIXES
# The experts' names: model_type -> (the block's MoE module, ours -> the folder's projection).
_EXPERTS = {"mixtral": ("block_sparse_moe", {"wi": "w1", "wi_gate": "w3", "wo": "w2"}),
            "qwen2_moe": ("mlp", {"wi": "gate_proj", "wi_gate": "up_proj",
                                  "wo": "down_proj"})}


def _sparse_layers(fields: common.Fields, family: str, num_layers: int) -> list[bool]:
  """Which layers have experts, as transformers' decoder layers decide."""
  if family == "mixtral":
    return [True] * num_layers
  step = fields.get("decoder_sparse_step", 1)
  dense_only = set(fields.get("mlp_only_layers") or ())
  experts = fields.get("num_experts")
  return [i not in dense_only and experts > 0 and step > 0 and (i + 1) % step == 0
          for i in range(num_layers)]


def convert(fields: common.Fields, t: common.Tensors, files: dict[str, str]) -> common.Converted:
  """MixtralForCausalLM and Qwen2MoeForCausalLM folders."""
  del files  # The tokenizer files are read by importer.tokenizer_bundle.
  family = fields.get("model_type")
  mixtral = family == "mixtral"
  count = fields.get("num_local_experts" if mixtral else "num_experts")
  top_k = fields.get("num_experts_per_tok", 2)
  renormalize = True if mixtral else bool(fields.get("norm_topk_prob", False))
  if renormalize and top_k == 1 and count > 1:
    raise ConfigError(f"{fields.where}: num_experts_per_tok=1 with renormalised weights "
                      "(every token's weight is 1) is not supported; this codebase "
                      "imports top-1 only without renormalisation (norm_topk_prob=false)")
  sparse = _sparse_layers(fields, family, fields.get("num_hidden_layers"))
  pattern = common.moe_layer_fields(fields.where, {"decoder": sparse},
                                    "decoder_sparse_step and mlp_only_layers")
  moe: dict[str, Any] = dict(pattern)
  if pattern["mlp"] == "moe":
    moe.update(
        num_experts=count, experts_per_token=top_k, moe_router="softmax",
        moe_renormalize=renormalize, moe_dispatch="dropless",
        moe_mlp_dim=fields.get("intermediate_size" if mixtral else "moe_intermediate_size"),
        moe_aux_loss=float(fields.get("router_aux_loss_coef", 0.001)), moe_z_loss=0.0,
        # Mixtral's jitter multiplies the router's input in training only, as here.
        moe_router_jitter=float(fields.get("router_jitter_noise", 0.0) if mixtral else 0.0))
    if not mixtral:
      moe.update(moe_shared_mlp_dim=fields.get("shared_expert_intermediate_size"),
                 moe_shared_gate=True)
  fields.ignore("output_router_logits")  # What forward returns, not what it computes.
  module, projections = _EXPERTS[family]

  def mlp(t: common.Tensors, prefix: str, layer: int) -> dict[str, Any]:
    if not sparse[layer]:
      return llama.dense_mlp(t, prefix, layer)
    p = f"{prefix}{module}."
    params = {"router": {"kernel": t.take(p + "gate.weight").T},
              "experts": common.expert_params(
                  t, count, lambda e, hf: f"{p}experts.{e}.{hf}.weight", projections)}
    if not mixtral:
      params["shared"] = llama.dense_mlp(t, p, layer, mlp="shared_expert")
      params["shared_gate"] = {"kernel": t.take(p + "shared_expert_gate.weight").T}
    return params

  return llama.convert_decoder(fields, t, moe=moe, mlp=mlp)
