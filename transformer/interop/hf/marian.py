"""Marian folders (MarianMTModel, opus-mt): sinusoidal positions checked equal to ours,
final_logits_bias, the two SentencePiece vocabularies.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from transformer.config.errors import ConfigError
from transformer.interop.hf import common
from transformer.model import positions

PREFIXES = ("model.",)  # Tensor-name prefixes a headless checkpoint lacks.


def convert(fields: common.Fields, t: common.Tensors, files: dict[str, str]) -> common.Converted:
  d_model = fields.get("d_model", 512)
  heads = fields.get("encoder_attention_heads", 8)
  ffn = fields.get("encoder_ffn_dim", 2048)
  for key, value in (("decoder_attention_heads", heads), ("decoder_ffn_dim", ffn)):
    if fields.get(key, value) != value:
      raise ConfigError(f"{fields.where}: {key}={fields.get(key)} differs from the encoder's "
                        f"{value}; this codebase's encoder and decoder share one width")
  for key in ("encoder_layerdrop", "decoder_layerdrop"):
    fields.require(key, 0.0, (0, 0.0), "LayerDrop")
  fields.require("share_encoder_decoder_embeddings", True, (True,),
                 "one embedding for source and target")
  fields.require("tie_word_embeddings", True, (True,), "the output projection tied to the "
                 "embedding")
  vocab_size = fields.get("vocab_size", 58101)
  fields.require("decoder_vocab_size", vocab_size, (vocab_size, None),
                 "a target vocabulary of its own")
  fields.require("static_position_embeddings", True, (True,), "sinusoidal positions")
  fields.require("normalize_embedding", False, (False,), "a LayerNorm on the embeddings")
  fields.ignore("normalize_before", "add_bias_logits", "add_final_layer_norm", "extra_pos_embeddings",
                "num_hidden_layers")
  pad, eos = fields.get("pad_token_id", vocab_size - 1), fields.get("eos_token_id", 0)
  start = fields.get("decoder_start_token_id", pad)
  unk = 1
  if "vocab.json" in files:
    with open(files["vocab.json"], encoding="utf-8") as f:
      unk = json.load(f).get("<unk>", 1)
  vocab = common.vocabulary_map(vocab_size, {"pad": pad, "eos": eos, "bos": start, "unk": unk})
  # Hugging Face's opus-mt configs forbid generating pad (bad_words_ids [[pad]]).
  never = set(vocab.added)
  for words in fields.get("bad_words_ids") or []:
    if len(words) == 1:
      never.add(vocab.internal(words[0]))
  max_len = fields.get("max_position_embeddings", 512)
  dropout = fields.get("dropout", 0.1)
  model = dict(
      arch="encoder_decoder", head="lm", vocab_size=len(vocab.internal_to_hf),
      d_model=d_model, num_layers=fields.get("encoder_layers", 6),
      num_decoder_layers=fields.get("decoder_layers", 6), num_heads=heads, num_kv_heads=0,
      head_dim=0, mlp_dim=ffn, max_len=max_len, position="sinusoidal",
      sinusoidal_layout="halves", norm="post", norm_type="layernorm", norm_epsilon=1e-5,
      activation=common.activation(fields, "activation_function", "swish"), use_bias=True,
      tie_embeddings=True, share_embeddings=True,
      scale_embeddings=bool(fields.get("scale_embedding", True)), embed_norm=False,
      init="gpt2", logits_bias=True, embed_dropout=dropout, residual_dropout=dropout,
      mlp_dropout=fields.get("activation_dropout", 0.0), never_predict=tuple(sorted(never)),
      **common.attention_dropout(fields.get("attention_dropout", 0.0)))
  table = positions.sinusoidal_table(max_len, d_model, "halves")
  for side in ("encoder", "decoder"):
    name = f"{side}.embed_positions.weight"
    if t.has(name) and np.abs(t.take(name) - table).max() > 1e-5:
      raise ConfigError(f"{t.where}: {name} is not Marian's sinusoidal table; learned "
                        "positions in a Marian model are not supported")
  embedding = t.take_tied("shared.weight", "encoder.embed_tokens.weight",
                          "decoder.embed_tokens.weight", "lm_head.weight")
  params: dict[str, Any] = {
      "source_embedder": {"token_embed": {"embedding": vocab.rows(embedding)}},
      "logits_bias": vocab.rows(t.take("final_logits_bias").reshape(-1))}
  for side, count in (("encoder", model["num_layers"]),
                      ("decoder", model["num_decoder_layers"])):
    stack = params[side] = {}
    for i in range(count):
      p = f"{side}.layers.{i}."
      def attention(name, p=p):
        return common.attention_params(*(common.linear(t, f"{p}{name}.{x}_proj") for x in ("q", "k", "v", "out")),
                          heads)
      block = {"self_attention": attention("self_attn"),
               "self_attention_norm": common.norm(t, p + "self_attn_layer_norm"),
               "mlp": {"wi": common.dense(common.linear(t, p + "fc1")), "wo": common.dense(common.linear(t, p + "fc2"))},
               "mlp_norm": common.norm(t, p + "final_layer_norm")}
      if side == "decoder":
        block["cross_attention"] = attention("encoder_attn")
        block["cross_attention_norm"] = common.norm(t, p + "encoder_attn_layer_norm")
      stack[f"block_{i}"] = block
  decode = {}
  if fields.get("num_beams"):
    decode["beam_size"] = int(fields.get("num_beams"))
  return common.Converted("marian", model, params, vocab, decode=decode)


