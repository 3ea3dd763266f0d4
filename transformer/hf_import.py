"""Pretrained weights in and out: local Hugging Face model folders <-> workdirs.

`import_folder` (launch.py --mode=import) reads a folder as `save_pretrained` writes
it and the hub serves it (config.json + model.safetensors, PyTorch tensor names),
builds the matching config.model, maps every tensor into this codebase's parameter
tree and writes a workdir that --mode=generate / translate / evaluate and
config.init_from read: config.json, the tokenizer (data/hf_tokenizer.py) and
checkpoints/0/state holding only the parameters (as `--mode=average` writes).
`export_gpt2` (--mode=export) writes a GPT-2-shaped decoder back as a GPT-2 folder.

Families (the folder's config.json `model_type`): "gpt2" (GPT2LMHeadModel,
GPT2Model; every size), "bert" (BertForMaskedLM, BertForPreTraining: MLM head,
pooler, token types, embedding LayerNorm), "marian" (MarianMTModel, opus-mt) and "t5"
(T5ForConditionalGeneration: v1.0 and gated-SiLU feed-forwards).

Every config field of a family is mapped to a model field, checked against the one
value this codebase implements, or listed as irrelevant here (initialisation ranges,
generation defaults, bookkeeping); a field outside those lists is logged. Every tensor
is mapped, or is a known buffer (GPT-2's causal-mask buffers, Marian's fixed
sinusoidal tables, checked equal to ours) or a head with no place here (BERT's
next-sentence head, logged as dropped); anything else stops the import, naming it.

Safetensors only: pickle files (pytorch_model.bin) are never opened, since loading
one runs arbitrary code. A folder with only those stops with the command that
converts it.

The vocabulary is renumbered to the ids every pipeline here assumes (pad 0, eos 1,
bos 2, unk 3): see `vocabulary_map` and data/hf_tokenizer.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from configs import base
from transformer import layers
from transformer.configuration import ConfigError, validate
from transformer.data import hf_tokenizer
from transformer.data import sources
from transformer.data import tokenizers

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
           "flax_model.msgpack")
ROLES = ("pad", "eos", "bos", "unk")  # Internal ids 0..3 (tokenizers.PAD_ID, ...).
# The model fields an import takes from --config (how to run it), not from the folder.
RUNTIME_FIELDS = ("scan_layers", "remat", "dtype", "param_dtype", "attention_impl")
# Fields of every Hugging Face config that say nothing about the computation here.
_GENERIC = frozenset((
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "_name_or_path", "use_cache", "initializer_range", "init_std", "id2label", "label2id",
    "task_specific_params", "finetuning_task", "problem_type", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "pruned_heads", "chunk_size_feed_forward", "tokenizer_class", "prefix",
    "gradient_checkpointing", "classifier_dropout", "num_labels", "sep_token_id",
    # Generation defaults (decode.* here): num_beams and bad_words_ids are read.
    "max_length", "min_length", "do_sample", "early_stopping", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "tie_encoder_decoder", "is_encoder_decoder"))


# ---------------------------------------------------------------- reading a folder


def read_folder(hf_dir: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """config.json and every tensor of model.safetensors (or its shards), as numpy.

  Raises:
    ConfigError: no folder or config.json, or no safetensors file (pickle-only
      folders get the conversion command).
  """
  if not os.path.isdir(hf_dir):
    raise ConfigError(f"--hf_dir={hf_dir!r} is not a directory; expected a local Hugging "
                      "Face model folder (config.json + model.safetensors)")
  config_path = os.path.join(hf_dir, CONFIG)
  if not os.path.isfile(config_path):
    raise ConfigError(f"{hf_dir} has no {CONFIG}; expected a Hugging Face model folder")
  with open(config_path, encoding="utf-8") as f:
    config = json.load(f)
  if os.path.isfile(os.path.join(hf_dir, SAFETENSORS_INDEX)):
    with open(os.path.join(hf_dir, SAFETENSORS_INDEX), encoding="utf-8") as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
  elif os.path.isfile(os.path.join(hf_dir, SAFETENSORS)):
    files = [SAFETENSORS]
  else:
    pickles = [n for n in PICKLES if os.path.exists(os.path.join(hf_dir, n))]
    found = f"it has only {', '.join(pickles)}" if pickles else "it has none"
    raise ConfigError(
        f"{hf_dir} has no {SAFETENSORS} ({found}). Pickle checkpoints are never loaded "
        "here (unpickling runs code). Convert the folder once where torch is installed: "
        "python -c \"import transformers as t; m = t.AutoModel.from_pretrained('DIR'); "
        "m.save_pretrained('DIR_safetensors', safe_serialization=True)\" (use the model's "
        "own class, e.g. GPT2LMHeadModel or MarianMTModel, to keep its head), or download "
        "the model's model.safetensors from the hub")
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  tensors = {}
  for name in files:
    tensors.update(load_file(os.path.join(hf_dir, name)))
  return config, tensors


class _Fields:
  """A config.json whose fields are each read, checked or ignored exactly once."""

  def __init__(self, config: dict[str, Any], where: str):
    self._config, self.where = config, where
    self._seen: set[str] = set()

  def get(self, key: str, default: Any = None) -> Any:
    self._seen.add(key)
    return self._config.get(key, default)

  def require(self, key: str, default: Any, allowed: tuple, feature: str) -> Any:
    """The value of `key`; stops unless it is one of `allowed`."""
    value = self.get(key, default)
    if value not in allowed:
      raise ConfigError(f"{self.where}: {key}={value!r} is not supported ({feature}); "
                        f"this codebase implements {' or '.join(map(repr, allowed))}")
    return value

  def ignore(self, *keys: str) -> None:
    self._seen.update(keys)

  def finish(self) -> None:
    unknown = sorted(set(self._config) - self._seen - _GENERIC)
    if unknown:
      logging.warning("%s: fields not known to this importer, ignored: %s", self.where,
                      ", ".join(unknown))


class _Tensors:
  """The folder's tensors; each is taken once, and leftovers stop the import."""

  def __init__(self, tensors: dict[str, np.ndarray], where: str, prefixes: tuple[str, ...]):
    self.where = where
    self._tensors = {}
    for name, value in tensors.items():
      for prefix in prefixes:  # GPT2LMHeadModel saves "transformer.h.0...", GPT2Model "h.0...".
        if name.startswith(prefix):
          name = name[len(prefix):]
          break
      # TF-era BERT names.
      name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
          "LayerNorm.beta", "LayerNorm.bias")
      self._tensors[name] = value
    self._taken: set[str] = set()
    self.dropped: list[str] = []

  def has(self, name: str) -> bool:
    return name in self._tensors

  def take(self, name: str) -> np.ndarray:
    if name not in self._tensors:
      raise ConfigError(f"{self.where} has no tensor {name!r}, which this model needs")
    self._taken.add(name)
    return np.asarray(self._tensors[name], np.float32)

  def take_tied(self, name: str, *copies: str) -> np.ndarray:
    """`name`, or the first of `copies` present; any others must hold the same values."""
    present = [n for n in (name,) + copies if n in self._tensors]
    if not present:
      raise ConfigError(f"{self.where} has none of the tensors {(name,) + copies}")
    value = self.take(present[0])
    for other in present[1:]:
      if not np.array_equal(self.take(other), value):
        raise ConfigError(f"{self.where}: {other!r} differs from {present[0]!r}, but the "
                          "config ties them (untied weights are not supported here)")
    return value

  def skip(self, matches: Callable[[str], bool], reason: str) -> None:
    names = sorted(n for n in self._tensors if n not in self._taken and matches(n))
    self._taken.update(names)
    if names and reason:
      self.dropped.append(f"{', '.join(names)} ({reason})")

  def finish(self) -> None:
    left = sorted(set(self._tensors) - self._taken)
    if left:
      raise ConfigError(f"{self.where} holds tensors this codebase has no place for "
                        f"(features it lacks): {', '.join(left)}")
    for line in self.dropped:
      logging.warning("%s: dropped %s", self.where, line)


def _activation(fields: _Fields, key: str, default: str) -> str:
  names = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
           "gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu"}
  value = fields.require(key, default, tuple(names), "the MLP activation")
  return names[value]


def _attention_dropout(rate: float) -> dict[str, Any]:
  """Attention-probability dropout exists only in the einsum reference attention here."""
  return {"attention_dropout": float(rate),
          **({"attention_impl": "einsum"} if rate > 0 else {})}


# ---------------------------------------------------------------- the vocabulary


@dataclasses.dataclass(frozen=True)
class VocabularyMap:
  """Which source row each internal id holds (see data/hf_tokenizer.py)."""

  hf_vocab_size: int
  internal_to_hf: tuple[int, ...]  # -1: an added row of zeros.
  added: tuple[int, ...]  # Internal ids of rows the import added (copies or zeros).

  def rows(self, table: np.ndarray) -> np.ndarray:
    """`table` (first axis = source vocabulary) in internal order; added -1 rows zero."""
    index = np.asarray(self.internal_to_hf)
    out = table[np.maximum(index, 0)].copy()
    out[index < 0] = 0
    return out

  def unrows(self, table: np.ndarray) -> np.ndarray:
    """The inverse of `rows`: the source order back, added rows dropped."""
    index = np.full(self.hf_vocab_size, -1)
    for internal, hf in enumerate(self.internal_to_hf):
      if internal not in self.added:
        index[hf] = internal
    return table[index]

  def internal(self, hf_id: int) -> int:
    for internal, hf in enumerate(self.internal_to_hf):
      if hf == hf_id and internal not in self.added:
        return internal
    raise ValueError(f"source id {hf_id} has no row")


def vocabulary_map(hf_vocab_size: int, roles: dict[str, int | None]) -> VocabularyMap:
  """Moves the special roles to internal ids 0..3; the other tokens follow in order.

  Args:
    hf_vocab_size: the source embedding's rows.
    roles: for "pad", "eos", "bos", "unk": the source id with that role, or None when
      the vocabulary has none. A role whose token an earlier role already took (GPT-2's
      bos = eos) gets an added copy of that row; a missing one an added row of zeros.

  Returns:
    The map; its added ids are what `model.never_predict` lists.
  """
  order, added, used = [], [], set()
  for role in ROLES:
    hf = roles.get(role)
    if hf is None or hf in used:
      added.append(len(order))
    else:
      used.add(hf)
    order.append(-1 if hf is None else int(hf))
  order += [h for h in range(hf_vocab_size) if h not in used]
  return VocabularyMap(hf_vocab_size, tuple(order), tuple(added))


# ---------------------------------------------------------------- the families


@dataclasses.dataclass
class Converted:
  """A folder as this codebase's model: config.model fields, parameters, vocabulary."""

  family: str
  model: dict[str, Any]  # config.model fields.
  params: dict[str, Any]  # Nested dicts of float32 numpy arrays, unrolled blocks.
  vocabulary: VocabularyMap
  mask: int | None = None  # Internal id of the mask token.
  decode: dict[str, Any] = dataclasses.field(default_factory=dict)  # decode.* fields.


def _split_heads(kernel_EX: np.ndarray, heads: int) -> np.ndarray:
  """[E, H * D] -> [E, H, D] (the query/key/value kernels' full-rank layout)."""
  return kernel_EX.reshape(kernel_EX.shape[0], heads, -1)


def _attention(q, k, v, out, heads: int) -> dict[str, Any]:
  """(kernel [E, H*D] as in x @ W, bias or None) pairs -> this codebase's attention params."""
  params = {}
  for name, (kernel, bias) in (("query", q), ("key", k), ("value", v)):
    params[name] = {"kernel": _split_heads(kernel, heads)}
    if bias is not None:
      params[name]["bias"] = bias.reshape(heads, -1)
  kernel, bias = out
  params["out"] = {"kernel": kernel.reshape(heads, -1, kernel.shape[-1])}
  if bias is not None:
    params["out"]["bias"] = bias
  return params


def _norm(t: _Tensors, name: str) -> dict[str, np.ndarray]:
  return {"scale": t.take(f"{name}.weight"), "bias": t.take(f"{name}.bias")}


def _linear(t: _Tensors, name: str) -> tuple[np.ndarray, np.ndarray]:
  """torch.nn.Linear ([out, in] weight) -> (kernel [in, out], bias)."""
  return t.take(f"{name}.weight").T, t.take(f"{name}.bias")


def _dense(pair: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
  return {"kernel": pair[0], "bias": pair[1]}


def _gpt2(fields: _Fields, t: _Tensors) -> Converted:
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
  vocab = vocabulary_map(fields.get("vocab_size", 50257), {"eos": eos, "bos": eos})
  model = dict(
      arch="decoder", head="lm", vocab_size=len(vocab.internal_to_hf), d_model=d_model,
      num_layers=layers_, num_heads=heads, num_kv_heads=0, head_dim=0,
      mlp_dim=fields.get("n_inner") or 4 * d_model, max_len=max_len, position="learned",
      norm="pre", norm_type="layernorm", norm_epsilon=fields.get("layer_norm_epsilon", 1e-5),
      activation=_activation(fields, "activation_function", "gelu_new"), use_bias=True,
      tie_embeddings=bool(tie), scale_embeddings=False, embed_norm=False, init="gpt2",
      embed_dropout=fields.get("embd_pdrop", 0.1),
      residual_dropout=fields.get("resid_pdrop", 0.1), mlp_dropout=0.0,
      never_predict=vocab.added,
      **_attention_dropout(fields.get("attn_pdrop", 0.1)))
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
        "self_attention_norm": _norm(t, p + "ln_1"),
        "self_attention": _attention(q, k, v, (t.take(p + "attn.c_proj.weight"),
                                               t.take(p + "attn.c_proj.bias")), heads),
        "mlp_norm": _norm(t, p + "ln_2"),
        "mlp": {"wi": {"kernel": t.take(p + "mlp.c_fc.weight"),
                       "bias": t.take(p + "mlp.c_fc.bias")},
                "wo": {"kernel": t.take(p + "mlp.c_proj.weight"),
                       "bias": t.take(p + "mlp.c_proj.bias")}}}
  params["final_norm"] = _norm(t, "ln_f")
  if tie:
    if t.has("lm_head.weight"):
      t.take_tied("wte.weight", "lm_head.weight")
  else:
    params["lm_head"] = {"kernel": vocab.rows(t.take("lm_head.weight")).T}
  return Converted("gpt2", model, params, vocab)


def _bert_specials(files: dict[str, str], fields: _Fields) -> dict[str, int | None]:
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


def _bert(fields: _Fields, t: _Tensors, files: dict[str, str]) -> Converted:
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
  vocab = vocabulary_map(fields.get("vocab_size", 30522), specials)
  dropout = fields.get("hidden_dropout_prob", 0.1)
  model = dict(
      arch="encoder", head="mlm", vocab_size=len(vocab.internal_to_hf), d_model=d_model,
      num_layers=layers_, num_heads=heads, num_kv_heads=0, head_dim=0,
      mlp_dim=fields.get("intermediate_size", 3072),
      max_len=fields.get("max_position_embeddings", 512), position="learned", norm="post",
      norm_type="layernorm", norm_epsilon=fields.get("layer_norm_eps", 1e-12),
      activation=_activation(fields, "hidden_act", "gelu"), use_bias=True,
      tie_embeddings=True, scale_embeddings=False, embed_norm=True, init="bert",
      num_token_types=fields.get("type_vocab_size", 2), pooler=t.has("pooler.dense.weight"),
      embed_dropout=dropout, residual_dropout=dropout, mlp_dropout=0.0,
      never_predict=vocab.added,
      **_attention_dropout(fields.get("attention_probs_dropout_prob", 0.1)))
  if not model["num_token_types"]:
    model["num_token_types"] = 0
  t.skip(lambda n: n.startswith("embeddings.position_ids") or n.startswith(
      "embeddings.token_type_ids"), "")
  t.skip(lambda n: n.startswith("cls.seq_relationship."),
         "the next-sentence-prediction head; no such objective here")
  e = "embeddings."
  embedder = {"token_embed": {"embedding": vocab.rows(t.take(e + "word_embeddings.weight"))},
              "position_embed": t.take(e + "position_embeddings.weight"),
              "embed_norm": _norm(t, e + "LayerNorm")}
  if model["num_token_types"]:
    embedder["token_type_embed"] = t.take(e + "token_type_embeddings.weight")
  params: dict[str, Any] = {"embedder": embedder}
  for i in range(layers_):
    p = f"encoder.layer.{i}."
    a = p + "attention."
    params[f"block_{i}"] = {
        "self_attention": _attention(
            _linear(t, a + "self.query"), _linear(t, a + "self.key"),
            _linear(t, a + "self.value"), _linear(t, a + "output.dense"), heads),
        "self_attention_norm": _norm(t, a + "output.LayerNorm"),
        "mlp": {"wi": _dense(_linear(t, p + "intermediate.dense")),
                "wo": _dense(_linear(t, p + "output.dense"))},
        "mlp_norm": _norm(t, p + "output.LayerNorm")}
  if model["pooler"]:
    params["pooler"] = _dense(_linear(t, "pooler.dense"))
  c = "cls.predictions."
  if not t.has(c + "bias"):
    raise ConfigError(f"{t.where} has no masked-LM head (cls.predictions.*): import a "
                      "BertForMaskedLM or BertForPreTraining checkpoint (the hub's bert-base-* "
                      "folders are)")
  params["mlm_transform"] = _dense(_linear(t, c + "transform.dense"))
  params["mlm_norm"] = _norm(t, c + "transform.LayerNorm")
  params["mlm_bias"] = vocab.rows(t.take_tied(c + "bias", c + "decoder.bias"))
  if t.has(c + "decoder.weight"):
    t.take_tied(e + "word_embeddings.weight", c + "decoder.weight")
  mask = specials.get("mask")
  return Converted("bert", model, params, vocab,
                   mask=None if mask is None else vocab.internal(mask))


def _marian(fields: _Fields, t: _Tensors, files: dict[str, str]) -> Converted:
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
  vocab = vocabulary_map(vocab_size, {"pad": pad, "eos": eos, "bos": start, "unk": unk})
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
      activation=_activation(fields, "activation_function", "swish"), use_bias=True,
      tie_embeddings=True, share_embeddings=True,
      scale_embeddings=bool(fields.get("scale_embedding", True)), embed_norm=False,
      init="gpt2", logits_bias=True, embed_dropout=dropout, residual_dropout=dropout,
      mlp_dropout=fields.get("activation_dropout", 0.0), never_predict=tuple(sorted(never)),
      **_attention_dropout(fields.get("attention_dropout", 0.0)))
  table = layers.sinusoidal_table(max_len, d_model, "halves")
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
        return _attention(*(_linear(t, f"{p}{name}.{x}_proj") for x in ("q", "k", "v", "out")),
                          heads)
      block = {"self_attention": attention("self_attn"),
               "self_attention_norm": _norm(t, p + "self_attn_layer_norm"),
               "mlp": {"wi": _dense(_linear(t, p + "fc1")), "wo": _dense(_linear(t, p + "fc2"))},
               "mlp_norm": _norm(t, p + "final_layer_norm")}
      if side == "decoder":
        block["cross_attention"] = attention("encoder_attn")
        block["cross_attention_norm"] = _norm(t, p + "encoder_attn_layer_norm")
      stack[f"block_{i}"] = block
  decode = {}
  if fields.get("num_beams"):
    decode["beam_size"] = int(fields.get("num_beams"))
  return Converted("marian", model, params, vocab, decode=decode)


_T5_ACTIVATIONS = {"relu": "relu", "gated-silu": "swiglu"}


def _t5(fields: _Fields, t: _Tensors) -> Converted:
  """T5 v1.0 (ReLU, tied) and gated-SiLU variants; relative position buckets, RMSNorm."""
  d_model, heads = fields.get("d_model", 512), fields.get("num_heads", 8)
  head_dim = fields.get("d_kv", 64)
  projection = fields.get("feed_forward_proj", "relu")
  if projection not in _T5_ACTIVATIONS:
    raise ConfigError(f"{fields.where}: feed_forward_proj={projection!r} is not supported "
                      f"(T5 v1.1's gated-gelu is model.activation='geglu_tanh', whose "
                      f"import is not written yet); this import implements "
                      f"{sorted(_T5_ACTIVATIONS)}")
  fields.ignore("dense_act_fn", "is_gated_act", "initializer_factor")
  tie = fields.get("tie_word_embeddings", True)
  pad, eos = fields.get("pad_token_id", 0), fields.get("eos_token_id", 1)
  start = fields.get("decoder_start_token_id", pad)
  vocab = vocabulary_map(fields.get("vocab_size", 32128),
                         {"pad": pad, "eos": eos, "bos": start, "unk": 2})
  dropout = fields.get("dropout_rate", 0.1)
  encoder_layers = fields.get("num_layers", 6)
  decoder_layers = fields.get("num_decoder_layers") or encoder_layers
  model = dict(
      arch="encoder_decoder", head="lm", vocab_size=len(vocab.internal_to_hf),
      d_model=d_model, num_layers=encoder_layers, num_decoder_layers=decoder_layers,
      num_heads=heads, num_kv_heads=0, head_dim=head_dim, mlp_dim=fields.get("d_ff", 2048),
      max_len=fields.get("n_positions", 512), position="relative",
      relative_buckets=fields.get("relative_attention_num_buckets", 32),
      relative_max_distance=fields.get("relative_attention_max_distance", 128),
      norm="pre", norm_type="rmsnorm", norm_epsilon=fields.get("layer_norm_epsilon", 1e-6),
      activation=_T5_ACTIVATIONS[projection], use_bias=False, tie_embeddings=bool(tie),
      share_embeddings=True, scale_embeddings=False, embed_norm=False, init="gpt2",
      logits_bias=False, embed_dropout=dropout, residual_dropout=dropout,
      mlp_dropout=dropout, never_predict=vocab.added, **_attention_dropout(dropout))
  # T5 does not divide attention logits by sqrt(head_dim) (its init absorbs it); this
  # codebase does, so the query kernels are multiplied by it here.
  query_scale = np.float32(np.sqrt(head_dim))
  embedding = t.take_tied("shared.weight", "encoder.embed_tokens.weight",
                          "decoder.embed_tokens.weight",
                          *(("lm_head.weight",) if tie else ()))
  params: dict[str, Any] = {
      "source_embedder": {"token_embed": {"embedding": vocab.rows(embedding)}}}

  def kernel(name):
    return t.take(f"{name}.weight").T, None

  def attention(name):
    q, k, v, o = (kernel(f"{name}.{x}") for x in ("q", "k", "v", "o"))
    return _attention((q[0] * query_scale, None), k, v, o, heads)

  for side, count in (("encoder", encoder_layers), ("decoder", decoder_layers)):
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
      gated = projection.startswith("gated")
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
  return Converted("t5", model, params, vocab)


def _family(config: dict[str, Any], where: str) -> str:
  family = config.get("model_type")
  if family not in ("gpt2", "bert", "marian", "t5"):
    raise ConfigError(f"{where}: model_type={family!r} is not supported; this codebase "
                      "imports 'gpt2', 'bert', 'marian' and 't5' folders")
  return family


def _folder_files(hf_dir: str) -> dict[str, str]:
  return {n: os.path.join(hf_dir, n) for n in sorted(os.listdir(hf_dir))}


def convert_folder(hf_dir: str) -> Converted:
  """Reads and maps a folder: config.model fields, parameters and vocabulary (no writing).

  Raises:
    ConfigError: an unsupported family, field value or tensor, a missing tensor, or
      a folder without safetensors.
  """
  config, tensors = read_folder(hf_dir)
  where = os.path.join(hf_dir, CONFIG)
  family = _family(config, where)
  fields = _Fields(config, where)
  fields.get("model_type")
  files = _folder_files(hf_dir)
  weights = os.path.join(hf_dir, SAFETENSORS)
  if family == "gpt2":
    t = _Tensors(tensors, weights, ("transformer.",))
    converted = _gpt2(fields, t)
  elif family == "bert":
    t = _Tensors(tensors, weights, ("bert.",))
    converted = _bert(fields, t, files)
  elif family == "marian":
    t = _Tensors(tensors, weights, ("model.",))
    converted = _marian(fields, t, files)
  else:
    t = _Tensors(tensors, weights, ())
    converted = _t5(fields, t)
  t.finish()
  fields.finish()
  return converted


# ---------------------------------------------------------------- writing a workdir


def imported_config(converted: Converted,
                    config: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """The workdir's config: `config` (or configs/base.py) with the folder's model.

  Only the RUNTIME_FIELDS of `config.model` survive (how to run the model, not what
  it is); data.seq_len is capped at the model's context.
  """
  result = base.get_config() if config is None else ml_collections.ConfigDict(
      config.to_dict())
  runtime = {k: result.model[k] for k in RUNTIME_FIELDS}
  defaults = base.get_config().model
  result.model.update({k: v for k, v in defaults.items() if k not in RUNTIME_FIELDS})
  result.model.update(converted.model)
  for key, value in runtime.items():
    if key == "attention_impl" and converted.model.get("attention_impl") == "einsum":
      continue  # Attention dropout needs the einsum attention.
    result.model[key] = value
  result.data.seq_len = min(result.data.seq_len, result.model.max_len)
  result.decode.update(converted.decode)
  result.init_from = ""
  validate(result)
  return result


def tokenizer_bundle(converted: Converted, hf_dir: str) -> dict[str, Any]:
  """The hf_tokenizer.json contents: the vocabulary map and the folder's tokenizer."""
  bundle = {"family": converted.family, "hf_vocab_size": converted.vocabulary.hf_vocab_size,
            "internal_to_hf": list(converted.vocabulary.internal_to_hf),
            "added": list(converted.vocabulary.added), "mask": converted.mask,
            "tokenizer_json": None, "sentencepiece": None}
  files = hf_tokenizer.bundle_from_folder(_folder_files(hf_dir))
  if files is None:
    logging.warning("%s has no tokenizer.json (nor Marian's source.spm, target.spm and "
                    "vocab.json): the model imports, but text cannot be encoded", hf_dir)
  else:
    bundle.update(files)
  return bundle


def _empty_workdir(workdir: str, flag: str) -> str:
  """Creates `workdir` (process 0 checks that it is new or empty: nothing is overwritten)."""
  target = os.path.abspath(workdir)
  if jax.process_index() == 0:
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
      raise ConfigError(f"{flag}={workdir!r} exists and is not an empty directory; choose a "
                        "new one (nothing is overwritten)")
    os.makedirs(target, exist_ok=True)
  return target


def import_folder(hf_dir: str, workdir: str,
                  config: ml_collections.ConfigDict | None = None) -> str:
  """Writes a workdir holding the folder's model: config.json, tokenizer, checkpoint 0.

  Args:
    hf_dir: a local Hugging Face model folder.
    workdir: the new workdir (must not exist or be empty).
    config: optional (launch.py --config): its data.*, decode.*, mesh.* and other
      sections, and the model's RUNTIME_FIELDS (scan_layers, dtypes, ...), are kept.

  Returns:
    The checkpoint directory written.
  """
  from transformer import sharding  # pylint: disable=g-import-not-at-top
  from transformer import train  # pylint: disable=g-import-not-at-top
  converted = convert_folder(hf_dir)
  run_config = imported_config(converted, config)
  target = _empty_workdir(workdir, "--workdir")
  params = converted.params
  if run_config.model.scan_layers:
    params = layers.unrolled_to_scanned(params)
  if jax.process_index() == 0:
    with open(os.path.join(target, CONFIG), "w", encoding="utf-8") as f:
      f.write(run_config.to_json_best_effort(indent=2))
    with open(os.path.join(target, hf_tokenizer.FILE), "w", encoding="utf-8") as f:
      json.dump(tokenizer_bundle(converted, hf_dir), f)
    sources.save_tokenizer(target, hf_tokenizer.HFTokenizer(
        os.path.join(target, hf_tokenizer.FILE)))
  trainer = train.Trainer.create(run_config, sharding.make_mesh(run_config.mesh))
  abstract = trainer.abstract_state.params
  _check_tree(params, abstract)
  placed = jax.tree.map(lambda a, s: jax.device_put(a.astype(s.dtype), s.sharding),
                        params, abstract)
  manager = ocp.CheckpointManager(
      os.path.join(target, "checkpoints"),
      options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False))
  try:
    manager.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": placed})))
  finally:
    manager.close()
  path = os.path.join(target, "checkpoints", "0")
  count = sum(x.size for x in jax.tree.leaves(params))
  if jax.process_index() == 0:
    print(f"Imported {converted.family} from {hf_dir} ({count:,} parameters) to {path}",
          flush=True)
  return path


def _paths(tree: Any) -> dict[str, tuple[int, ...]]:
  return {jax.tree_util.keystr(p, simple=True, separator="/"): tuple(np.shape(x))
          for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _check_tree(params: Any, abstract: Any) -> None:
  """The mapped tree must be exactly the model's: same paths, same shapes."""
  have, want = _paths(params), _paths(abstract)
  problems = [f"missing {p}" for p in sorted(set(want) - set(have))]
  problems += [f"extra {p}" for p in sorted(set(have) - set(want))]
  problems += [f"{p} is {have[p]}, the model wants {want[p]}"
               for p in sorted(set(have) & set(want)) if have[p] != want[p]]
  if problems:
    raise ValueError("the mapped parameters do not fit the model: " + "; ".join(problems))


# ---------------------------------------------------------------- export (GPT-2)


_GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def _gpt2_shaped(model: ml_collections.ConfigDict, where: str) -> None:
  """Stops, naming the field, unless the model is a GPT-2 up to sizes."""
  expected = dict(arch="decoder", head="lm", position="learned", norm="pre",
                  norm_type="layernorm", use_bias=True, scale_embeddings=False,
                  embed_norm=False, num_token_types=0, logits_bias=False, pooler=False,
                  qk_norm=False, attention_softcap=0.0, final_logit_softcap=0.0,
                  sliding_window=0, parallel_block=False, qkv_bias=False)
  for key, value in expected.items():
    if model[key] != value:
      raise ConfigError(f"{where}: model.{key}={model[key]!r}, but a GPT-2 folder needs "
                        f"{value!r}; only GPT-2-shaped decoders export")
  if model.activation not in _GPT2_ACTIVATIONS:
    raise ConfigError(f"{where}: model.activation={model.activation!r} has no GPT-2 "
                      f"equivalent; exportable: {sorted(_GPT2_ACTIVATIONS)}")
  if model.num_kv_heads not in (0, model.num_heads):
    raise ConfigError(f"{where}: model.num_kv_heads={model.num_kv_heads} (grouped-query "
                      "attention) has no GPT-2 equivalent")
  if model.head_dim not in (0, model.d_model // model.num_heads) or (
      model.d_model % model.num_heads):
    raise ConfigError(f"{where}: model.head_dim={model.head_dim} must be d_model / num_heads "
                      "in GPT-2")


def export_gpt2(workdir: str, hf_dir: str, *, checkpoint_step: int | None = None) -> str:
  """Writes a trained GPT-2-shaped decoder as a Hugging Face GPT-2 folder.

  config.json + model.safetensors (GPT2LMHeadModel names), and tokenizer.json when
  the workdir was imported from a folder that had one. An imported model gets its
  source vocabulary order back (the rows the import added are dropped; <|endoftext|>
  takes the eos row); any other run keeps its own ids (pad 0, eos 1, bos 2).

  Args:
    workdir: a run or import workdir.
    hf_dir: the folder to write (must not exist or be empty).
    checkpoint_step: the checkpoint to export; None: the newest.

  Returns:
    hf_dir.
  """
  from transformer import commands  # pylint: disable=g-import-not-at-top
  run = commands.load_run(workdir, checkpoint_step=checkpoint_step)
  model = run.config.model
  _gpt2_shaped(model, os.path.join(workdir, CONFIG))
  params = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32), run.params)
  if model.scan_layers:
    params = layers.scanned_to_unrolled(params)
  bundle_path = os.path.join(workdir, hf_tokenizer.FILE)
  bundle = None
  if os.path.isfile(bundle_path):
    with open(bundle_path, encoding="utf-8") as f:
      bundle = json.load(f)
    vocab = VocabularyMap(bundle["hf_vocab_size"], tuple(bundle["internal_to_hf"]),
                          tuple(bundle["added"]))
    eos = int(vocab.internal_to_hf[tokenizers.EOS_ID])
    specials = {"bos_token_id": eos, "eos_token_id": eos}
  else:
    vocab = VocabularyMap(model.vocab_size, tuple(range(model.vocab_size)), ())
    specials = {"bos_token_id": tokenizers.BOS_ID, "eos_token_id": tokenizers.EOS_ID,
                "pad_token_id": tokenizers.PAD_ID}
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
  target = _empty_workdir(hf_dir, "--hf_dir")
  if jax.process_index() == 0:
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              os.path.join(target, SAFETENSORS), metadata={"format": "pt"})
    with open(os.path.join(target, CONFIG), "w", encoding="utf-8") as f:
      json.dump(hf_config, f, indent=2)
    if bundle and bundle.get("tokenizer_json") is not None:
      with open(os.path.join(target, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(bundle["tokenizer_json"], f)
    print(f"Exported {run.checkpoint_label()} of {workdir} to {target} (GPT-2)", flush=True)
  return target
