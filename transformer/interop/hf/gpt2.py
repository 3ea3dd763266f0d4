"""GPT-2 folders both ways: import (GPT2LMHeadModel, GPT2Model; every size) and export
of a GPT-2-shaped decoder back to a Hugging Face folder.
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections
import numpy as np

from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies
from transformer.inference import loaded
from transformer.interop.hf import common

PREFIXES = ("transformer.",)  # Tensor-name prefixes a headless checkpoint lacks.


def convert(fields: common.Fields, t: common.Tensors, files: dict[str, str]) -> common.Converted:
  """GPT-2 of every size: learned positions, pre-LN, fused c_attn split into q, k, v."""
  del files  # GPT-2 needs no file beyond the weights and config.json.
  d_model = fields.get("n_embd", 768)
  heads = fields.get("n_head", 12)
  layers_ = fields.get("n_layer", 12)
  max_len = fields.get("n_positions", 1024)
  if fields.get("n_ctx", max_len) != max_len:
    raise ConfigError(f"{fields.where}: n_ctx={fields.get('n_ctx')} differs from "
                      f"n_positions={max_len}; expected one context length")
  fields.require("scale_attn_weights", True, (True,), "attention logits scaled by 1/sqrt(d)")
  fields.require("scale_attn_by_inverse_layer_idx", False, (False,),
                 "attention logits also scaled by 1/layer")
  fields.require("add_cross_attention", False, (False,), "cross-attention in a GPT-2")
  # Upcasting the attention logits to float32 changes nothing here: softmax is float32.
  fields.ignore("reorder_and_upcast_attn", "summary_type", "summary_use_proj",
                "summary_activation", "summary_proj_to_labels", "summary_first_dropout")
  tie = fields.get("tie_word_embeddings", True)
  eos = fields.get("eos_token_id", 50256)
  fields.get("bos_token_id")
  fields.get("pad_token_id")  # Usually unset: the map adds a pad row.
  vocab = common.vocabulary_map(fields.get("vocab_size", 50257), {"eos": eos, "bos": eos})
  model = dict(
      arch="decoder", head="lm", vocab_size=len(vocab.internal_to_hf), d_model=d_model,
      num_layers=layers_, num_heads=heads, num_kv_heads=0, head_dim=0,
      mlp_dim=fields.get("n_inner") or 4 * d_model, max_len=max_len, position="learned",
      norm="pre", norm_type="layernorm", norm_epsilon=fields.get("layer_norm_epsilon", 1e-5),
      activation=common.activation(fields, "activation_function", "gelu_new"), use_bias=True,
      tie_embeddings=bool(tie), scale_embeddings=False, embed_norm=False, init="gpt2",
      embed_dropout=fields.get("embd_pdrop", 0.1),
      residual_dropout=fields.get("resid_pdrop", 0.1), mlp_dropout=0.0,
      never_predict=vocab.added,
      **common.attention_dropout(fields.get("attn_pdrop", 0.1)))
  t.skip(lambda n: n.endswith(("attn.bias", "attn.masked_bias")) and "c_attn" not in n, "")
  params: dict[str, Any] = {"embedder": {
      "token_embed": {"embedding": vocab.rows(t.take("wte.weight"))},
      "position_embed": t.take("wpe.weight")}}
  for i in range(layers_):
    p = f"h.{i}."
    qkv_kernel, qkv_bias = t.take(p + "attn.c_attn.weight"), t.take(p + "attn.c_attn.bias")
    split = lambda x: np.split(x, 3, axis=-1)  # pylint: disable=unnecessary-lambda-assignment
    q, k, v = zip(split(qkv_kernel), split(qkv_bias))
    params[f"block_{i}"] = {
        "self_attention_norm": common.norm(t, p + "ln_1"),
        "self_attention": common.attention_params(q, k, v, (t.take(p + "attn.c_proj.weight"),
                                               t.take(p + "attn.c_proj.bias")), heads),
        "mlp_norm": common.norm(t, p + "ln_2"),
        "mlp": {"wi": {"kernel": t.take(p + "mlp.c_fc.weight"),
                       "bias": t.take(p + "mlp.c_fc.bias")},
                "wo": {"kernel": t.take(p + "mlp.c_proj.weight"),
                       "bias": t.take(p + "mlp.c_proj.bias")}}}
  params["final_norm"] = common.norm(t, "ln_f")
  if tie:
    if t.has("lm_head.weight"):
      t.take_tied("wte.weight", "lm_head.weight")
  else:
    params["lm_head"] = {"kernel": vocab.rows(t.take("lm_head.weight")).T}
  return common.Converted("gpt2", model, params, vocab)


# ---------------------------------------------------------------- export (GPT-2)


_GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def gpt2_shape_problem(model: ml_collections.ConfigDict) -> str:
  """Why `model` has no GPT-2 folder, naming the first field ("" when it has one)."""
  expected = dict(arch="decoder", head="lm", position="learned", norm="pre",
                  norm_type="layernorm", use_bias=True, scale_embeddings=False,
                  embed_norm=False, num_token_types=0, logits_bias=False, pooler=False,
                  qk_norm=False, attention_softcap=0.0, final_logit_softcap=0.0,
                  sliding_window=0, parallel_block=False, qkv_bias=False)
  for key, value in expected.items():
    if model[key] != value:
      return f"model.{key}={model[key]!r}, but a GPT-2 folder needs {value!r}"
  if model.activation not in _GPT2_ACTIVATIONS:
    return (f"model.activation={model.activation!r} has no GPT-2 equivalent; exportable: "
            f"{sorted(_GPT2_ACTIVATIONS)}")
  if model.num_kv_heads not in (0, model.num_heads):
    return (f"model.num_kv_heads={model.num_kv_heads} (grouped-query attention) has no "
            "GPT-2 equivalent")
  if model.head_dim not in (0, model.d_model // model.num_heads) or (
      model.d_model % model.num_heads):
    return f"model.head_dim={model.head_dim} must be d_model / num_heads in GPT-2"
  return ""


def _gpt2_shaped(model: ml_collections.ConfigDict, where: str) -> None:
  """Stops, naming the field, unless the model is a GPT-2 up to sizes."""
  problem = gpt2_shape_problem(model)
  if problem:
    raise ConfigError(f"{where}: {problem}; only GPT-2-shaped decoders export as GPT-2")


def export_gpt2(workdir: str, hf_dir: str, *, checkpoint_step: int | None = None) -> str:
  """Writes a trained GPT-2-shaped decoder as a Hugging Face GPT-2 folder.

  config.json + model.safetensors (GPT2LMHeadModel names), and tokenizer.json when
  the workdir was imported from a folder that had one; otherwise a warning says that
  the folder has no tokenizer and why. Every file is written whole and readable (0644). An imported model gets its
  source vocabulary order back (the rows the import added are dropped; <|endoftext|>
  takes the eos row); any other run keeps its own ids (pad 0, eos 1, bos 2).

  Args:
    workdir: a run or import workdir.
    hf_dir: the folder to write (must not exist or be empty).
    checkpoint_step: the checkpoint to export; None: the newest.

  Returns:
    hf_dir.
  """
  run = loaded.load_run(workdir, checkpoint_step=checkpoint_step)
  model = run.config.model
  _gpt2_shaped(model, os.path.join(workdir, common.CONFIG))
  params, bundle, vocab = common.export_inputs(workdir, run)
  if bundle is not None:
    eos = int(vocab.internal_to_hf[vocabularies.EOS_ID])
    specials = {"bos_token_id": eos, "eos_token_id": eos}
  else:
    specials = {"bos_token_id": vocabularies.BOS_ID, "eos_token_id": vocabularies.EOS_ID,
                "pad_token_id": vocabularies.PAD_ID}
  heads, d_model = model.num_heads, model.d_model
  tensors = {"transformer.wte.weight": vocab.unrows(
                 params["embedder"]["token_embed"]["embedding"]),
             "transformer.wpe.weight": params["embedder"]["position_embed"]}
  for i in range(model.num_layers):
    block, p = params[f"block_{i}"], f"transformer.h.{i}."
    attention = block["self_attention"]
    tensors[p + "ln_1.weight"] = block["self_attention_norm"]["scale"]
    tensors[p + "ln_1.bias"] = block["self_attention_norm"]["bias"]
    tensors[p + "attn.c_attn.weight"] = np.concatenate(
        [attention[n]["kernel"].reshape(d_model, -1) for n in ("query", "key", "value")], 1)
    tensors[p + "attn.c_attn.bias"] = np.concatenate(
        [attention[n]["bias"].reshape(-1) for n in ("query", "key", "value")])
    tensors[p + "attn.c_proj.weight"] = attention["out"]["kernel"].reshape(-1, d_model)
    tensors[p + "attn.c_proj.bias"] = attention["out"]["bias"]
    tensors[p + "ln_2.weight"] = block["mlp_norm"]["scale"]
    tensors[p + "ln_2.bias"] = block["mlp_norm"]["bias"]
    for name, hf in (("wi", "c_fc"), ("wo", "c_proj")):
      tensors[p + f"mlp.{hf}.weight"] = block["mlp"][name]["kernel"]
      tensors[p + f"mlp.{hf}.bias"] = block["mlp"][name]["bias"]
  tensors["transformer.ln_f.weight"] = params["final_norm"]["scale"]
  tensors["transformer.ln_f.bias"] = params["final_norm"]["bias"]
  if not model.tie_embeddings:
    tensors["lm_head.weight"] = vocab.unrows(params["lm_head"]["kernel"].T)
  hf_config = {
      "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
      "vocab_size": vocab.hf_vocab_size, "n_positions": model.max_len, "n_embd": d_model,
      "n_layer": model.num_layers, "n_head": heads, "n_inner": model.mlp_dim,
      "activation_function": _GPT2_ACTIVATIONS[model.activation],
      "layer_norm_epsilon": model.norm_epsilon, "resid_pdrop": model.residual_dropout,
      "embd_pdrop": model.embed_dropout, "attn_pdrop": model.attention_dropout,
      "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
      "reorder_and_upcast_attn": False, "tie_word_embeddings": bool(model.tie_embeddings),
      "initializer_range": 0.02, "use_cache": True, **specials}
  return common.write_folder(hf_dir, tensors, hf_config, bundle, run, "GPT-2")
