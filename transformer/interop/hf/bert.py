"""BERT folders (BertForMaskedLM, BertForPreTraining): MLM head, pooler, token types,
embedding LayerNorm; the next-sentence head is dropped (logged).
"""

from __future__ import annotations

import json
from typing import Any

from absl import logging

from transformer.config.errors import ConfigError
from transformer.interop.hf import common

PREFIXES = ("bert.",)  # Tensor-name prefixes a headless checkpoint lacks.


def _bert_specials(files: dict[str, str], fields: common.Fields) -> dict[str, int | None]:
  """[PAD] [SEP] [CLS] [UNK] [MASK] ids from tokenizer.json or vocab.txt (else BERT's)."""
  names = {"pad": "[PAD]", "eos": "[SEP]", "bos": "[CLS]", "unk": "[UNK]", "mask": "[MASK]"}
  ids: dict[str, int] = {}
  if "tokenizer.json" in files:
    with open(files["tokenizer.json"], encoding="utf-8") as f:
      vocab = json.load(f)["model"].get("vocab", {})
    ids = {role: vocab[name] for role, name in names.items() if name in vocab}
  elif "vocab.txt" in files:
    with open(files["vocab.txt"], encoding="utf-8") as f:
      vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
    ids = {role: vocab[name] for role, name in names.items() if name in vocab}
  else:
    logging.warning("%s: no tokenizer.json or vocab.txt; assuming bert-base's special ids "
                    "([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103)", fields.where)
    ids = {"pad": 0, "unk": 100, "bos": 101, "eos": 102, "mask": 103}
  ids.setdefault("pad", fields.get("pad_token_id", 0))
  return ids


def convert(fields: common.Fields, t: common.Tensors, files: dict[str, str]) -> common.Converted:
  d_model = fields.get("hidden_size", 768)
  heads = fields.get("num_attention_heads", 12)
  layers_ = fields.get("num_hidden_layers", 12)
  fields.require("position_embedding_type", "absolute", ("absolute",),
                 "learned absolute positions")
  fields.require("is_decoder", False, (False,), "a causal BERT")
  fields.require("add_cross_attention", False, (False,), "cross-attention in a BERT")
  fields.require("tie_word_embeddings", True, (True,), "the MLM decoder tied to the "
                 "word embeddings")
  specials = _bert_specials(files, fields)
  fields.get("pad_token_id")
  vocab = common.vocabulary_map(fields.get("vocab_size", 30522), specials)
  dropout = fields.get("hidden_dropout_prob", 0.1)
  model = dict(
      arch="encoder", head="mlm", vocab_size=len(vocab.internal_to_hf), d_model=d_model,
      num_layers=layers_, num_heads=heads, num_kv_heads=0, head_dim=0,
      mlp_dim=fields.get("intermediate_size", 3072),
      max_len=fields.get("max_position_embeddings", 512), position="learned", norm="post",
      norm_type="layernorm", norm_epsilon=fields.get("layer_norm_eps", 1e-12),
      activation=common.activation(fields, "hidden_act", "gelu"), use_bias=True,
      tie_embeddings=True, scale_embeddings=False, embed_norm=True, init="bert",
      num_token_types=fields.get("type_vocab_size", 2), pooler=t.has("pooler.dense.weight"),
      embed_dropout=dropout, residual_dropout=dropout, mlp_dropout=0.0,
      never_predict=vocab.added,
      **common.attention_dropout(fields.get("attention_probs_dropout_prob", 0.1)))
  if not model["num_token_types"]:
    model["num_token_types"] = 0
  t.skip(lambda n: n.startswith("embeddings.position_ids") or n.startswith(
      "embeddings.token_type_ids"), "")
  t.skip(lambda n: n.startswith("cls.seq_relationship."),
         "the next-sentence-prediction head; no such objective here")
  e = "embeddings."
  embedder = {"token_embed": {"embedding": vocab.rows(t.take(e + "word_embeddings.weight"))},
              "position_embed": t.take(e + "position_embeddings.weight"),
              "embed_norm": common.norm(t, e + "LayerNorm")}
  if model["num_token_types"]:
    embedder["token_type_embed"] = t.take(e + "token_type_embeddings.weight")
  params: dict[str, Any] = {"embedder": embedder}
  for i in range(layers_):
    p = f"encoder.layer.{i}."
    a = p + "attention."
    params[f"block_{i}"] = {
        "self_attention": common.attention_params(
            common.linear(t, a + "self.query"), common.linear(t, a + "self.key"),
            common.linear(t, a + "self.value"), common.linear(t, a + "output.dense"), heads),
        "self_attention_norm": common.norm(t, a + "output.LayerNorm"),
        "mlp": {"wi": common.dense(common.linear(t, p + "intermediate.dense")),
                "wo": common.dense(common.linear(t, p + "output.dense"))},
        "mlp_norm": common.norm(t, p + "output.LayerNorm")}
  if model["pooler"]:
    params["pooler"] = common.dense(common.linear(t, "pooler.dense"))
  c = "cls.predictions."
  if not t.has(c + "bias"):
    raise ConfigError(f"{t.where} has no masked-LM head (cls.predictions.*): import a "
                      "BertForMaskedLM or BertForPreTraining checkpoint (the hub's bert-base-* "
                      "folders are)")
  params["mlm_transform"] = common.dense(common.linear(t, c + "transform.dense"))
  params["mlm_norm"] = common.norm(t, c + "transform.LayerNorm")
  params["mlm_bias"] = vocab.rows(t.take_tied(c + "bias", c + "decoder.bias"))
  if t.has(c + "decoder.weight"):
    t.take_tied(e + "word_embeddings.weight", c + "decoder.weight")
  mask = specials.get("mask")
  return common.Converted("bert", model, params, vocab,
                   mask=None if mask is None else vocab.internal(mask))
