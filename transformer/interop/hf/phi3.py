"""Phi-3 and Phi-4-mini (Phi3ForCausalLM): llama.py's decoder with fused projections.

A Llama-shaped decoder whose q/k/v are one `qkv_proj` ([q; k; v] rows) and whose
SwiGLU halves are one `gate_up_proj` ([gate; up], the gate activated): both are split
into Llama's names and mapped by `llama.decoder_params`. What Phi-3 adds is partial
rotary (`partial_rotary_factor` -> model.rope_fraction) and LongRoPE as it writes it:
rope_scaling {"type": "longrope" (or the older "su"), "short_factor", "long_factor"}
with the switch length at the top-level `original_max_position_embeddings`
(model.rope_scaling="longrope", docs/configuration.md#long-context-rope). A sliding
window, when set, covers every layer (as Mistral's). No export: a Llama folder holds
the weights of a full-rotary one.
"""

from __future__ import annotations

from typing import Any

from transformer.interop.hf import common
from transformer.interop.hf import llama

PREFIXES = llama.PREFIXES
# transformers' Phi3Config reads these older rope_scaling types as LongRoPE.
_ROPE_ALIASES = {"su": "longrope", "yarn": "longrope"}


def convert(fields: common.Fields, t: common.Tensors, files: dict[str, str]) -> common.Converted:
  """Phi3ForCausalLM folders."""
  del files  # The tokenizer files are read by importer.tokenizer_bundle.
  d_model, heads = fields.get("hidden_size"), fields.get("num_attention_heads")
  kv_heads = fields.get("num_key_value_heads") or heads
  num_layers, mlp_dim = fields.get("num_hidden_layers"), fields.get("intermediate_size")
  head_dim = fields.get("head_dim") or d_model // heads
  for i in range(num_layers):
    p = f"layers.{i}."
    t.split(p + "self_attn.qkv_proj.weight", [
        (p + "self_attn.q_proj.weight", heads * head_dim),
        (p + "self_attn.k_proj.weight", kv_heads * head_dim),
        (p + "self_attn.v_proj.weight", kv_heads * head_dim)])
    t.split(p + "mlp.gate_up_proj.weight", [(p + "mlp.gate_proj.weight", mlp_dim),
                                             (p + "mlp.up_proj.weight", mlp_dim)])
  window = fields.get("sliding_window")
  layer_types = None if window is None else ["sliding_attention"] * num_layers
  window_fields = llama.window_fields(fields, layer_types, num_layers)
  rope = llama.rope_fields(fields, _ROPE_ALIASES)
  if rope.get("rope_scaling") != "longrope":
    # Only LongRoPE switches at it; Phi3Config always writes one (4096 by default).
    fields.ignore("original_max_position_embeddings")
  tied = bool(fields.get("tie_word_embeddings", False))
  vocab = llama.vocabulary(fields)
  model: dict[str, Any] = dict(
      arch="decoder", head="lm", vocab_size=len(vocab.internal_to_hf), d_model=d_model,
      num_layers=num_layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
      mlp_dim=mlp_dim, max_len=fields.get("max_position_embeddings"), position="rope",
      rope_fraction=float(fields.get("partial_rotary_factor", 1.0)), **rope,
      **window_fields, norm="pre", norm_type="rmsnorm",
      norm_epsilon=fields.get("rms_norm_eps", 1e-5),
      activation=llama.gated_activation(fields, "hidden_act", "silu"), use_bias=False,
      tie_embeddings=tied, scale_embeddings=False, embed_norm=False, init="gpt2",
      embed_dropout=float(fields.get("embd_pdrop", 0.0)),
      residual_dropout=float(fields.get("resid_pdrop", 0.0)), mlp_dropout=0.0,
      never_predict=vocab.added,
      **common.attention_dropout(fields.get("attention_dropout", 0.0)))
  params = llama.decoder_params(
      t, num_layers=num_layers, heads=heads, kv_heads=kv_heads, vocab=vocab, tied=tied,
      norm_names={"self_attention_norm": "input_layernorm",
                  "mlp_norm": "post_attention_layernorm"})
  return common.Converted("phi3", model, params, vocab)
