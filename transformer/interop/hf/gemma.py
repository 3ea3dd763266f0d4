"""Gemma 1, 2 and 3 (text) folders: Llama-shaped decoders with Gemma's extras.

All three: RMSNorm multiplying by (1 + weight) (`norm_scale_plus_one`), the token
embedding times sqrt(hidden_size) rounded to the compute dtype (`scale_embeddings`),
GeGLU with the tanh GELU, tied output. Gemma 2 adds sandwich norms (input_layernorm /
post_attention_layernorm around attention, pre_ / post_feedforward_layernorm around
the MLP), soft-capped attention scores and logits, and local layers (`layer_types`);
Gemma 3 drops the caps, adds per-head q/k norms and gives local layers their own RoPE
base (rope_local_base_freq) while rope_scaling applies to the global ones only.
Queries are scaled by query_pre_attn_scalar^-0.5 there, 1/sqrt(head_dim) here: the
ratio is folded into the weights (llama.decoder_params).
"""

from __future__ import annotations

import numpy as np

from transformer.config.errors import ConfigError
from transformer.interop.hf import common
from transformer.interop.hf import llama

PREFIXES = llama.PREFIXES


def _layer_types(fields: common.Fields, family: str, num_layers: int) -> list[str] | None:
  """Which layers slide: config.json's layer_types, or transformers' default for
  folders written before it existed (Gemma 2: every other layer from the first;
  Gemma 3: sliding_window_pattern - 1 local layers, then a global one)."""
  layer_types = fields.get("layer_types")
  if family == "gemma":
    if layer_types is not None:
      raise ConfigError(f"{fields.where}: layer_types={layer_types!r} in a Gemma 1 folder; "
                        "Gemma 1 has no local layers")
    return None
  if family == "gemma3_text":
    # A bookkeeping copy transformers writes beside layer_types; older folders have
    # only sliding_window_pattern.
    pattern = fields.get("sliding_window_pattern", fields.get("_sliding_window_pattern", 6))
  else:
    pattern = 2
  if layer_types is None:
    layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                   for i in range(num_layers)]
  return layer_types


def convert(fields: common.Fields, t: common.Tensors, files: dict[str, str]) -> common.Converted:
  """GemmaForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM (text-only) folders."""
  del files  # The tokenizer files are read by importer.tokenizer_bundle.
  family = fields.get("model_type")
  d_model, heads = fields.get("hidden_size"), fields.get("num_attention_heads")
  kv_heads = fields.get("num_key_value_heads") or heads
  num_layers = fields.get("num_hidden_layers")
  head_dim = fields.get("head_dim") or d_model // heads
  fields.require("attention_bias", False, (False,), "biases on q/k/v and o_proj")
  if family == "gemma":
    # transformers' Gemma MLP reads hidden_act; hidden_activation, when set, must agree.
    activation = llama.gated_activation(fields, "hidden_act", "gelu_pytorch_tanh")
    other = fields.get("hidden_activation")
    if other is not None and llama.GATED.get(other) != activation:
      raise ConfigError(f"{fields.where}: hidden_activation={other!r} disagrees with "
                        f"hidden_act={fields.get('hidden_act')!r}, which transformers' "
                        "Gemma reads; make them equal")
  else:
    activation = llama.gated_activation(fields, "hidden_activation", "gelu_pytorch_tanh")
    fields.ignore("hidden_act")  # Not read by Gemma 2 / 3's modeling code.
    # An older name of sliding_window that transformers no longer reads.
    fields.ignore("sliding_window_size")
  if family == "gemma3_text":
    fields.require("use_bidirectional_attention", False, (False,),
                   "bidirectional attention in a Gemma 3 decoder")
  window = llama.window_fields(fields, _layer_types(fields, family, num_layers), num_layers)
  if not window["sliding_window"]:
    fields.get("sliding_window")  # Read only by local layers; there are none.
  caps = {}
  if family != "gemma":
    caps = {"attention_softcap": float(fields.get("attn_logit_softcapping") or 0.0),
            "final_logit_softcap": float(fields.get("final_logit_softcapping") or 0.0)}
  if caps.get("attention_softcap"):
    caps["attention_impl"] = "einsum"  # The only attention here that caps its scores.
  query_scalar = fields.get("query_pre_attn_scalar", head_dim) if family != "gemma" else (
      head_dim)
  query_scale = None
  if query_scalar != head_dim:
    query_scale = np.float32(np.sqrt(head_dim / query_scalar))
  rope = llama.rope_fields(fields)
  if family == "gemma3_text" and window["sliding_window"]:
    rope["rope_local_max_wavelength"] = float(fields.get("rope_local_base_freq", 10000.0))
  else:
    fields.ignore("rope_local_base_freq")  # Gemma 3 without local layers.
  tied = bool(fields.get("tie_word_embeddings", llama.TIED_BY_DEFAULT[family]))
  vocab = llama.vocabulary(fields)
  qk_norm = family == "gemma3_text"
  sandwich = family != "gemma"
  model = dict(
      arch="decoder", head="lm", vocab_size=len(vocab.internal_to_hf), d_model=d_model,
      num_layers=num_layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
      mlp_dim=fields.get("intermediate_size"), max_len=fields.get("max_position_embeddings"),
      position="rope", **rope, **window, norm="sandwich" if sandwich else "pre",
      norm_type="rmsnorm", norm_scale_plus_one=True,
      norm_epsilon=fields.get("rms_norm_eps", 1e-6), qk_norm=qk_norm,
      activation=activation, use_bias=False, tie_embeddings=tied, scale_embeddings=True,
      embed_norm=False, init="gpt2", embed_dropout=0.0, residual_dropout=0.0,
      mlp_dropout=0.0, never_predict=vocab.added)
  model.update(common.attention_dropout(fields.get("attention_dropout", 0.0)))
  model.update(caps)
  if sandwich:
    norm_names = {"self_attention_norm": "input_layernorm",
                  "self_attention_post_norm": "post_attention_layernorm",
                  "mlp_norm": "pre_feedforward_layernorm",
                  "mlp_post_norm": "post_feedforward_layernorm"}
  else:
    norm_names = {"self_attention_norm": "input_layernorm",
                  "mlp_norm": "post_attention_layernorm"}
  params = llama.decoder_params(
      t, num_layers=num_layers, heads=heads, kv_heads=kv_heads, vocab=vocab, tied=tied,
      norm_names=norm_names, qk_norm=qk_norm, query_scale=query_scale,
      query_norm_offset=True)
  # Gemma 3 keeps sqrt(hidden_size) as a buffer; scale_embeddings computes it.
  t.skip(lambda n: n.endswith("embed_scale"), "")
  return common.Converted(family, model, params, vocab)
