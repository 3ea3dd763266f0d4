"""T5 folders (T5ForConditionalGeneration; model_type "t5" and "mt5"): v1.0 (ReLU, tied),
v1.1 / Flan-T5 / mT5 (gated GELU in its tanh form, untied lm_head) and gated-SiLU
feed-forwards; relative position buckets. Switch Transformers
(SwitchTransformersForConditionalGeneration, model_type "switch_transformers") is T5
v1.0 with routed experts on some layers (`_switch_fields`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from absl import logging

from transformer.config.errors import ConfigError
from transformer.interop.hf import common

# T5 v1.1's "gated-gelu" is gelu_new (tanh) on wi_0 times wi_1: geglu_tanh here.
_T5_ACTIVATIONS = {"relu": "relu", "gated-silu": "swiglu", "gated-gelu": "geglu_tanh"}
PREFIXES = ()  # Tensor-name prefixes a headless checkpoint lacks.
# Switch's dense_act_fn (transformers' ACT2FN names) -> this codebase's activation.
_SWITCH_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                       "silu": "silu"}


def _switch_sparse(fields: common.Fields, side: str, count: int) -> list[bool]:
  """Which of a Switch stack's layers have experts, as transformers' stack decides:
  layer i when i % step == 1, or every layer when step == 1 (step 0: none)."""
  key = "num_layers" if side == "encoder" else "num_decoder_layers"
  sparse_count = fields.get(f"num_sparse_{side}_layers", 3)
  # The config derives the step from the counts; a saved step (always written) wins.
  derived = fields.get(key, count) // sparse_count if sparse_count > 0 else count
  step = fields.get(f"{side}_sparse_step", derived)
  return [(i % step == 1 or step == 1) if step > 0 else False for i in range(count)]


def _switch_fields(fields: common.Fields, encoder_layers: int,
                   decoder_layers: int) -> dict[str, Any]:
  """Switch's router and experts as model.* fields: top-1 of a float32 softmax, the output
  times that probability (not renormalised), dropless here (see docs/configuration.md,
  "Mixture of experts", on expert_capacity)."""
  pattern = common.moe_layer_fields(
      fields.where, {"encoder": _switch_sparse(fields, "encoder", encoder_layers),
                     "decoder": _switch_sparse(fields, "decoder", decoder_layers)},
      "encoder_sparse_step and decoder_sparse_step")
  fields.require("router_bias", False, (False,), "a bias on the router")
  # This codebase's router is always float32; a float16 / bfloat16 one rounds differently.
  fields.require("router_dtype", "float32", ("float32",), "the router's precision")
  # Token dropping past expert_capacity (per expert and sequence) is not reproduced:
  # the import is dropless, equal to transformers wherever nothing would drop.
  capacity = fields.get("expert_capacity", 64)
  if capacity < fields.get("n_positions", 512):
    logging.warning("%s: expert_capacity=%d: transformers drops the tokens past it (per "
                    "expert and sequence); this import routes every token (dropless), "
                    "so outputs differ where a sequence sends an expert more",
                    fields.where, capacity)
  # What forward returns, padding's share of the auxiliary loss, and what the config
  # derives the steps from (read above).
  fields.ignore("add_router_probs", "router_ignore_padding_tokens", "output_router_logits")
  if pattern["mlp"] == "dense":
    return pattern
  return dict(pattern, num_experts=fields.get("num_experts", 8), experts_per_token=1,
              moe_mlp_dim=fields.get("d_ff", 2048), moe_router="softmax",
              moe_renormalize=False, moe_dispatch="dropless",
              moe_aux_loss=float(fields.get("router_aux_loss_coef", 0.001)),
              moe_z_loss=float(fields.get("router_z_loss_coef", 0.001)),
              moe_router_jitter=float(fields.get("router_jitter_noise", 0.01)))


def convert(fields: common.Fields, t: common.Tensors, files: dict[str, str]) -> common.Converted:
  """T5 v1.0 (ReLU, tied), v1.1 / Flan-T5 / mT5 (gated GELU, untied) and gated-SiLU
  variants, and Switch Transformers; relative position buckets, RMSNorm."""
  del files  # The tokenizer files are read by importer.tokenizer_bundle.
  switch = fields.get("model_type") == "switch_transformers"
  activation, gated = _activation(fields, switch)
  model, vocab = _model_fields(fields, activation, switch)
  params = _params(t, model, vocab, switch=switch, gated=gated)
  return common.Converted(fields.get("model_type"), model, params, vocab)


def _activation(fields: common.Fields, switch: bool) -> tuple[str, bool]:
  """(model.activation, whether T5's feed-forward is gated: wi_0 and wi_1)."""
  if switch:  # Switch's MLPs are never gated; dense_act_fn names the activation.
    projection = fields.get("dense_act_fn", "relu")
    if projection not in _SWITCH_ACTIVATIONS:
      raise ConfigError(f"{fields.where}: dense_act_fn={projection!r} is not supported; "
                        f"this import implements {sorted(_SWITCH_ACTIVATIONS)}")
    return _SWITCH_ACTIVATIONS[projection], False
  projection = fields.get("feed_forward_proj", "relu")
  if projection not in _T5_ACTIVATIONS:
    raise ConfigError(f"{fields.where}: feed_forward_proj={projection!r} is not "
                      f"supported; this import implements {sorted(_T5_ACTIVATIONS)}")
  # transformers derives dense_act_fn and is_gated_act from feed_forward_proj.
  fields.ignore("dense_act_fn", "is_gated_act")
  return _T5_ACTIVATIONS[projection], projection.startswith("gated")


def _model_fields(fields: common.Fields, activation: str,
                  switch: bool) -> tuple[dict[str, Any], common.VocabularyMap]:
  """The model.* fields of a T5 / Switch config.json, and its vocabulary map."""
  fields.ignore("initializer_factor")
  tie = fields.get("tie_word_embeddings", True)
  pad, eos = fields.get("pad_token_id", 0), fields.get("eos_token_id", 1)
  start = fields.get("decoder_start_token_id", pad)
  vocab = common.vocabulary_map(fields.get("vocab_size", 32128),
                         {"pad": pad, "eos": eos, "bos": start, "unk": 2})
  dropout = fields.get("dropout_rate", 0.1)
  encoder_layers = fields.get("num_layers", 6)
  decoder_layers = fields.get("num_decoder_layers") or encoder_layers
  moe = _switch_fields(fields, encoder_layers, decoder_layers) if switch else {}
  model = dict(
      arch="encoder_decoder", head="lm", vocab_size=len(vocab.internal_to_hf),
      d_model=fields.get("d_model", 512), num_layers=encoder_layers,
      num_decoder_layers=decoder_layers, num_heads=fields.get("num_heads", 8),
      num_kv_heads=0, head_dim=fields.get("d_kv", 64), mlp_dim=fields.get("d_ff", 2048),
      max_len=fields.get("n_positions", 512), position="relative",
      relative_buckets=fields.get("relative_attention_num_buckets", 32),
      relative_max_distance=fields.get("relative_attention_max_distance", 128),
      norm="pre", norm_type="rmsnorm", norm_epsilon=fields.get("layer_norm_epsilon", 1e-6),
      activation=activation, use_bias=False, tie_embeddings=bool(tie),
      share_embeddings=True, scale_embeddings=False, embed_norm=False, init="gpt2",
      logits_bias=False, embed_dropout=dropout, residual_dropout=dropout,
      mlp_dropout=dropout, never_predict=vocab.added, **moe,
      **common.attention_dropout(dropout))
  return model, vocab


def _params(t: common.Tensors, model: dict[str, Any], vocab: common.VocabularyMap, *,
            switch: bool, gated: bool) -> dict[str, Any]:
  """The checkpoint's tensors as this codebase's parameters of `model`."""
  d_model, heads, tie = model["d_model"], model["num_heads"], model["tie_embeddings"]
  # T5 does not divide attention logits by sqrt(head_dim) (its init absorbs it); this
  # codebase does, so the query kernels are multiplied by it here.
  query_scale = np.float32(np.sqrt(model["head_dim"]))
  embedding = t.take_tied("shared.weight", "encoder.embed_tokens.weight",
                          "decoder.embed_tokens.weight",
                          *(("lm_head.weight",) if tie else ()))
  params: dict[str, Any] = {
      "source_embedder": {"token_embed": {"embedding": vocab.rows(embedding)}}}

  def kernel(name):
    return t.take(f"{name}.weight").T, None

  def attention(name):
    q, k, v, o = (kernel(f"{name}.{x}") for x in ("q", "k", "v", "o"))
    return common.attention_params((q[0] * query_scale, None), k, v, o, heads)

  for side, count in (("encoder", model["num_layers"]),
                      ("decoder", model["num_decoder_layers"])):
    stack = params[side] = {
        "relative_bias": {"embedding": t.take(
            f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")},
        "final_norm": {"scale": t.take(f"{side}.final_layer_norm.weight")}}
    for i in range(count):
      p = f"{side}.block.{i}.layer."
      block = {"self_attention": attention(p + "0.SelfAttention"),
               "self_attention_norm": {"scale": t.take(p + "0.layer_norm.weight")}}
      ff = p + ("2" if side == "decoder" else "1")
      if side == "decoder":
        block["cross_attention"] = attention(p + "1.EncDecAttention")
        block["cross_attention_norm"] = {"scale": t.take(p + "1.layer_norm.weight")}
      if switch:
        block["mlp"] = _switch_mlp(t, ff + ".mlp.", model, i)
      else:
        block["mlp"] = {"wi": {"kernel": kernel(ff + (".DenseReluDense.wi_0" if gated
                                                      else ".DenseReluDense.wi"))[0]},
                        "wo": {"kernel": kernel(ff + ".DenseReluDense.wo")[0]}}
        if gated:
          block["mlp"]["wi_gate"] = {"kernel": kernel(ff + ".DenseReluDense.wi_1")[0]}
      block["mlp_norm"] = {"scale": t.take(ff + ".layer_norm.weight")}
      stack[f"block_{i}"] = block
  if tie:
    # Tied T5 scales the decoder output by d_model^-0.5 before the projection; the
    # decoder's final RMSNorm scale absorbs it exactly.
    params["decoder"]["final_norm"]["scale"] *= np.float32(d_model ** -0.5)
  else:
    params["lm_head"] = {"kernel": vocab.rows(t.take("lm_head.weight")).T}
  return params


def _switch_mlp(t: common.Tensors, prefix: str, moe: dict[str, Any],
                layer: int) -> dict[str, Any]:
  """A Switch block's feed-forward under `prefix` ("<side>.block.<i>.layer.<ff>.mlp."):
  dense wi / wo, or the router's classifier and the experts' wi / wo."""
  if moe["mlp"] == "dense" or layer % moe["moe_every"] != moe["moe_offset"]:
    return {ours: {"kernel": t.take(f"{prefix}{ours}.weight").T} for ours in ("wi", "wo")}
  return {"router": {"kernel": t.take(prefix + "router.classifier.weight").T},
          "experts": common.expert_params(
              t, moe["num_experts"], lambda e, hf: f"{prefix}experts.expert_{e}.{hf}.weight",
              {"wi": "wi", "wo": "wo"})}
