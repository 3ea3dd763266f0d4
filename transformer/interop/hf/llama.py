"""Llama-shaped decoders: Llama 2 and 3, Mistral, Qwen2 / 2.5 and Qwen3 folders, and export.

One mapping serves the four `model_type`s: RMSNorm before each sublayer, SwiGLU
(gate_proj -> mlp/wi, the activated half; up_proj -> mlp/wi_gate), rotary positions
in transformers' rotate-half layout (which is this codebase's, so q/k need no
permutation), grouped-query attention. What differs is a field each: RoPE scaling
(`rope_scaling`: linear, Llama 3.1's, YaRN, dynamic NTK, LongRoPE), Mistral's sliding
window on every layer, Qwen2's biases on q/k/v only (`qkv_bias`), Qwen3's per-head q/k
RMSNorm (`qk_norm`). gemma.py reuses `decoder_params`, `rope_fields` and `window_fields`.

`export_llama` writes the reverse: a Llama-shaped run as a Llama folder, or as Qwen2
(q/k/v biases), Qwen3 (QK-norm) or Mistral (a sliding window on every layer) when the
model has that family's one extra.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import ml_collections
import numpy as np
from absl import logging

from transformer.config.checks import is_int, is_number
from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies
from transformer.inference import loaded
from transformer.interop.hf import common
from transformer.model import positions

PREFIXES = ("model.",)  # LlamaForCausalLM saves "model.layers.0...", LlamaModel "layers.0...".
# hidden_act -> the gated activation it makes with up_proj.
GATED = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu_tanh",
         "gelu_new": "geglu_tanh", "gelu": "geglu"}
# Each model_type's tie_word_embeddings when config.json leaves it out (transformers'
# own defaults).
TIED_BY_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False,
                   "gemma": True, "gemma2": True, "gemma3_text": True, "mixtral": False,
                   "qwen2_moe": False}
# One block's `mlp` parameters from the tensors under its prefix ("layers.<i>."); layer i.
MlpMapping = Callable[[common.Tensors, str, int], dict[str, Any]]


# ---------------------------------------------------------------- shared with gemma.py


def gated_activation(fields: common.Fields, key: str, default: str) -> str:
  value = fields.require(key, default, tuple(GATED), "the MLP's gated activation")
  return GATED[value]


# rope_scaling's keys each rope_type reads (transformers 4.57's modeling_rope_utils.py),
# besides rope_type / type.
_ROPE_KEYS = {
    "default": (), "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "truncate", "mscale", "mscale_all_dim"),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "longrope": ("factor", "short_factor", "long_factor", "attention_factor",
                 "original_max_position_embeddings"),
}
# The rope_types imported: "default" ("none") and positions.ROPE_SCALINGS' others by
# name (tests/test_hf_import.py holds the two equal).
ROPE_TYPES = tuple(_ROPE_KEYS)


def rope_fields(fields: common.Fields,
                aliases: dict[str, str] | None = None) -> dict[str, Any]:
  """rope_theta and rope_scaling (docs/huggingface.md: every rope_type but "default" is
  the model.rope_scaling of its name) as model.rope_* fields; `aliases` renames a
  family's older rope_types (Phi-3's "su")."""
  result = {"rope_max_wavelength": float(fields.get("rope_theta", 10000.0))}
  scaling = fields.get("rope_scaling")
  if scaling is None:
    return result
  kind = scaling.get("rope_type", scaling.get("type"))
  kind = (aliases or {}).get(kind, kind)
  if kind not in ROPE_TYPES:
    raise ConfigError(f"{fields.where}: rope_scaling.rope_type={kind!r} is not supported; "
                      f"this codebase implements {', '.join(map(repr, ROPE_TYPES))} "
                      "(model.rope_scaling)")
  known = {"rope_type", "type", *_ROPE_KEYS[kind]}
  unknown = sorted(set(scaling) - known)
  if unknown:
    raise ConfigError(f"{fields.where}: rope_scaling has {', '.join(unknown)}, which "
                      f"rope_type={kind!r} does not read here; it reads {sorted(known)}")
  if kind == "default":
    return result
  max_len = fields.get("max_position_embeddings")

  def number(key: str, default: Any = None) -> float:
    value = scaling.get(key, default)
    if not is_number(value):
      raise ConfigError(f"{fields.where}: rope_scaling.{key}={value!r}; rope_type={kind!r} "
                        "needs a number")
    return float(value)

  result.update(rope_scaling=kind)
  if kind != "longrope":
    result.update(rope_scaling_factor=number("factor"))
  if kind == "llama3":
    result.update(
        rope_low_freq_factor=number("low_freq_factor"),
        rope_high_freq_factor=number("high_freq_factor"),
        rope_original_max_len=int(number("original_max_position_embeddings")))
  elif kind == "yarn":
    # transformers reads a missing or zero beta as the paper's 32 / 1, and a missing
    # original length as max_position_embeddings.
    factor = result["rope_scaling_factor"]
    attention = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attention is None and mscale and mscale_all_dim:  # DeepSeek's form of the factor.
      attention = (positions.yarn_mscale(factor, float(mscale))
                   / positions.yarn_mscale(factor, float(mscale_all_dim)))
    result.update(
        rope_original_max_len=int(scaling.get("original_max_position_embeddings") or max_len),
        rope_yarn_beta_fast=float(scaling.get("beta_fast") or 32.0),
        rope_yarn_beta_slow=float(scaling.get("beta_slow") or 1.0),
        rope_yarn_truncate=bool(scaling.get("truncate", True)),
        rope_attention_factor=0.0 if attention is None else float(attention))
  elif kind == "dynamic":
    # transformers 4.57 grows the base past max_position_embeddings, whatever rope_scaling
    # says (its "TODO: use original_max_position_embeddings"); a differing one is refused
    # rather than read one way or the other.
    original = scaling.get("original_max_position_embeddings", max_len)
    if original != max_len:
      raise ConfigError(f"{fields.where}: rope_scaling.original_max_position_embeddings="
                        f"{original!r} differs from max_position_embeddings={max_len!r}, "
                        "past which transformers' dynamic scaling grows the base; make "
                        "them equal")
    result.update(rope_original_max_len=int(max_len))
  elif kind == "longrope":
    result.update(_longrope_fields(fields, scaling, max_len))
  return result


def _longrope_fields(fields: common.Fields, scaling: dict[str, Any],
                     max_len: int) -> dict[str, Any]:
  """LongRoPE as transformers 4.57 reads it: the top-level original_max_position_embeddings
  (Phi-3's) is the switch length, and then max_position_embeddings / it the factor;
  without it, max_position_embeddings and rope_scaling.factor."""
  top = fields.get("original_max_position_embeddings")
  inner = scaling.get("original_max_position_embeddings")
  original = top or max_len
  if inner is not None and inner != original:
    switch = ("the top-level original_max_position_embeddings" if top else
              "max_position_embeddings")
    raise ConfigError(f"{fields.where}: rope_scaling.original_max_position_embeddings="
                      f"{inner!r}, but transformers' LongRoPE switches at {switch}="
                      f"{original!r}; set the top-level original_max_position_embeddings")
  factor = max_len / top if top else scaling.get("factor")
  if not is_number(factor):
    raise ConfigError(f"{fields.where}: rope_scaling.factor={factor!r}; LongRoPE without a "
                      "top-level original_max_position_embeddings needs a number")
  lists = {}
  for key in ("short_factor", "long_factor"):
    value = scaling.get(key)
    if not isinstance(value, list) or not all(is_number(f) for f in value):
      raise ConfigError(f"{fields.where}: rope_scaling.{key}={value!r}; expected a list "
                        "of numbers, one per rotated pair")
    lists[f"rope_{key}"] = tuple(float(f) for f in value)
  # Stored as a value, not derived: exported with the top-level original length, the
  # factor transformers derives it from may differ from this one.
  attention = scaling.get("attention_factor")
  if attention is None:
    attention = positions.rope_attention_factor("longrope", positions.RopeScaling(
        factor=float(factor), original_max_len=int(original)))
  return dict(rope_scaling_factor=float(factor), rope_original_max_len=int(original),
              rope_attention_factor=float(attention), **lists)


def window_fields(fields: common.Fields, layer_types: list[str] | None,
                  num_layers: int) -> dict[str, Any]:
  """`layer_types` ("sliding_attention" / "full_attention" per layer) as sliding_window
  and window_pattern (the shortest period of the layers' l/g string)."""
  if layer_types is None:
    return {"sliding_window": 0}
  kinds = {"sliding_attention": "l", "full_attention": "g"}
  unknown = sorted(set(layer_types) - set(kinds))
  if unknown or len(layer_types) != num_layers:
    raise ConfigError(f"{fields.where}: layer_types={layer_types!r}: expected "
                      f"num_hidden_layers={num_layers} entries of {sorted(kinds)}")
  letters = "".join(kinds[k] for k in layer_types)
  if "l" not in letters:
    return {"sliding_window": 0}
  window = fields.get("sliding_window")
  if not is_int(window) or window < 1:
    raise ConfigError(f"{fields.where}: sliding_window={window!r}, but layer_types has "
                      "sliding layers; expected an integer >= 1")
  # Both conventions agree: a query sees its own key and the window - 1 before it
  # (transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window).
  period = next(p for p in range(1, len(letters) + 1)
                if all(letters[i] == letters[i % p] for i in range(len(letters))))
  return {"sliding_window": window, "window_pattern": letters[:period]}


def eos_id(fields: common.Fields) -> int:
  """eos_token_id; a list (Llama 3 Instruct) gives its first, and says so."""
  eos = fields.get("eos_token_id")
  if isinstance(eos, list):
    if not eos:
      raise ConfigError(f"{fields.where}: eos_token_id=[]; expected an id")
    if len(eos) > 1:
      logging.warning("%s: eos_token_id=%s: decoding here stops at the first, %d, only",
                      fields.where, eos, eos[0])
    eos = eos[0]
  if eos is None:
    raise ConfigError(f"{fields.where}: eos_token_id is not set; decoding needs one")
  return int(eos)


def vocabulary(fields: common.Fields) -> common.VocabularyMap:
  """The renumbering of a decoder's vocabulary: pad, eos, bos to 0..2, unk an added row.

  A pad_token_id equal to eos or bos (set so by some folders) gets a row of zeros of
  its own instead: given the shared row, eos would become an added copy, which
  decoding never predicts.
  """
  eos, bos, pad = eos_id(fields), fields.get("bos_token_id"), fields.get("pad_token_id")
  if pad is not None and pad in (eos, bos):
    pad = None
  return common.vocabulary_map(fields.get("vocab_size"),
                               {"pad": pad, "eos": eos, "bos": bos, "unk": None})


def decoder_params(t: common.Tensors, *, num_layers: int, heads: int, kv_heads: int,
                   vocab: common.VocabularyMap, tied: bool, norm_names: dict[str, str],
                   qkv_bias: bool = False, qk_norm: bool = False,
                   query_scale: np.float32 | None = None,
                   query_norm_offset: bool = False,
                   mlp: MlpMapping | None = None) -> dict[str, Any]:
  """The parameter tree of a Llama-shaped decoder folder (unrolled blocks).

  Args:
    t: the folder's tensors, "model." stripped.
    num_layers, heads, kv_heads: the sizes.
    vocab: the renumbering of the embedding (and lm_head) rows.
    tied: lm_head is the embedding (a saved copy must equal it).
    norm_names: this codebase's block norm name -> the folder's, e.g.
      {"self_attention_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}.
    qkv_bias: q/k/v carry biases (Qwen2).
    qk_norm: per-head q_norm / k_norm (Qwen3, Gemma 3).
    query_scale: multiplies the queries (Gemma's query_pre_attn_scalar against this
      codebase's 1/sqrt(head_dim)); folded into the query kernel, or into q_norm's
      scale when QK-norm would undo a kernel scale.
    query_norm_offset: q_norm multiplies by (1 + scale) (Gemma 3), which the folded
      query_scale must respect.
    mlp: maps a block's feed-forward (mixtral.py's experts); None: the dense SwiGLU
      gate_proj / up_proj / down_proj.

  Returns:
    Nested dicts of float32 arrays.
  """
  params: dict[str, Any] = {"embedder": {"token_embed": {
      "embedding": vocab.rows(t.take("embed_tokens.weight"))}}}

  def projection(name, count, bias):
    kernel = t.take(f"{name}.weight").T
    return common.split_heads(kernel, count), (t.take(f"{name}.bias").reshape(count, -1)
                                                if bias else None)

  for i in range(num_layers):
    p = f"layers.{i}."
    attention = {}
    for ours, hf in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      kernel, bias = projection(p + f"self_attn.{hf}", heads if ours == "query" else
                                kv_heads, qkv_bias)
      attention[ours] = {"kernel": kernel, **({"bias": bias} if bias is not None else {})}
    out = t.take(p + "self_attn.o_proj.weight").T
    attention["out"] = {"kernel": out.reshape(heads, -1, out.shape[-1])}
    if qk_norm:
      attention["query_norm"] = {"scale": t.take(p + "self_attn.q_norm.weight")}
      attention["key_norm"] = {"scale": t.take(p + "self_attn.k_norm.weight")}
    if query_scale is not None:
      if qk_norm:  # The norm would undo a scaled kernel: scale its output instead.
        scale = attention["query_norm"]["scale"]
        attention["query_norm"]["scale"] = ((1 + scale) * query_scale - 1
                                            if query_norm_offset else scale * query_scale)
      else:
        attention["query"] = {k: v * query_scale for k, v in attention["query"].items()}
    block = {"self_attention": attention,
             "mlp": (mlp or dense_mlp)(t, p, i)}
    for ours, hf in norm_names.items():
      block[ours] = {"scale": t.take(p + f"{hf}.weight")}
    params[f"block_{i}"] = block
  params["final_norm"] = {"scale": t.take("norm.weight")}
  if tied:
    if t.has("lm_head.weight"):
      t.take_tied("embed_tokens.weight", "lm_head.weight")
  else:
    params["lm_head"] = {"kernel": vocab.rows(t.take("lm_head.weight")).T}
  # Older Llama checkpoints saved RoPE's inverse frequencies, which are recomputed here.
  t.skip(lambda n: n.endswith("rotary_emb.inv_freq"), "RoPE's inverse frequencies, "
         "recomputed from rope_theta")
  return params


def dense_mlp(t: common.Tensors, prefix: str, layer: int, mlp: str = "mlp") -> dict[str, Any]:
  """A SwiGLU MLP's gate_proj (the activated half), up_proj and down_proj under
  `prefix + mlp`, as this codebase's wi / wi_gate / wo."""
  del layer  # Every layer's MLP has the same names.
  return {ours: {"kernel": t.take(f"{prefix}{mlp}.{hf}.weight").T}
          for ours, hf in (("wi", "gate_proj"), ("wi_gate", "up_proj"), ("wo", "down_proj"))}


# ---------------------------------------------------------------- import


def convert(fields: common.Fields, t: common.Tensors, files: dict[str, str]) -> common.Converted:
  """LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM folders."""
  del files  # The tokenizer files are read by importer.tokenizer_bundle.
  return convert_decoder(fields, t)


def convert_decoder(fields: common.Fields, t: common.Tensors, *,
                    moe: dict[str, Any] | None = None,
                    mlp: MlpMapping | None = None) -> common.Converted:
  """A Llama-shaped decoder; mixtral.py adds its experts as `moe` (model fields) and
  `mlp` (the blocks' feed-forward mapping), Mixtral taking Mistral's window and
  Qwen2-MoE Qwen2's window and biases."""
  family = fields.get("model_type")
  d_model, heads = fields.get("hidden_size"), fields.get("num_attention_heads")
  kv_heads = fields.get("num_key_value_heads") or heads
  num_layers = fields.get("num_hidden_layers")
  head_dim = fields.get("head_dim") or d_model // heads
  # Biases: Llama and Qwen3's attention_bias would bias o_proj too, which has no place
  # here; Qwen2 always biases q/k/v (and never o_proj).
  if family in ("llama", "qwen3"):
    fields.require("attention_bias", False, (False,),
                   "biases on q/k/v and o_proj; model.qkv_bias has q/k/v only")
  fields.require("mlp_bias", False, (False,), "biases in the MLP of a bias-free model")
  # Splitting the matmuls over pretraining_tp ranks changes no value (transformers
  # ignores it too).
  fields.ignore("pretraining_tp")
  if family in ("mistral", "mixtral"):
    window = fields.get("sliding_window")
    layer_types = None if window is None else ["sliding_attention"] * num_layers
  elif family in ("qwen2", "qwen3", "qwen2_moe"):
    # layer_types says which layers slide; folders written before it existed derive it
    # as transformers does: layers from max_window_layers on, if use_sliding_window.
    sliding = fields.get("use_sliding_window", False)
    first_local = fields.get("max_window_layers", num_layers)
    # Qwen2-VL's multimodal RoPE, which Qwen2.5 text configs switch off.
    fields.require("use_mrope", False, (False,), "multimodal RoPE sections")
    layer_types = fields.get("layer_types")
    if family == "qwen2_moe" and sliding:
      # Its eager and flash attentions disagree on which layers slide.
      raise ConfigError(f"{fields.where}: use_sliding_window=True is not supported for "
                        "qwen2_moe (its attention implementations disagree on which "
                        "layers slide); this codebase imports use_sliding_window=False")
    if layer_types is None:
      layer_types = ["sliding_attention" if sliding and i >= first_local else
                     "full_attention" for i in range(num_layers)]
  else:
    layer_types = None
  window = window_fields(fields, layer_types, num_layers)
  if not window["sliding_window"]:
    fields.get("sliding_window")  # Read only by sliding layers; there are none.
  tied = bool(fields.get("tie_word_embeddings", TIED_BY_DEFAULT[family]))
  vocab = vocabulary(fields)
  # Qwen2-MoE's q/k/v biases are a field of its config (default on).
  qkv_bias = family == "qwen2" or (family == "qwen2_moe" and
                                   bool(fields.get("qkv_bias", True)))
  qk_norm = family == "qwen3"
  model = dict(
      arch="decoder", head="lm", vocab_size=len(vocab.internal_to_hf), d_model=d_model,
      num_layers=num_layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
      mlp_dim=fields.get("intermediate_size"), max_len=fields.get("max_position_embeddings"),
      position="rope", **rope_fields(fields), **window, norm="pre", norm_type="rmsnorm",
      norm_epsilon=fields.get("rms_norm_eps", 1e-6), qk_norm=qk_norm,
      activation=gated_activation(fields, "hidden_act", "silu"), use_bias=False,
      qkv_bias=qkv_bias, tie_embeddings=tied, scale_embeddings=False, embed_norm=False,
      init="gpt2", embed_dropout=0.0, residual_dropout=0.0, mlp_dropout=0.0,
      never_predict=vocab.added, **(moe or {}),
      **common.attention_dropout(fields.get("attention_dropout", 0.0)))
  params = decoder_params(
      t, num_layers=num_layers, heads=heads, kv_heads=kv_heads, vocab=vocab, tied=tied,
      norm_names={"self_attention_norm": "input_layernorm",
                  "mlp_norm": "post_attention_layernorm"},
      qkv_bias=qkv_bias, qk_norm=qk_norm, mlp=mlp)
  return common.Converted(family, model, params, vocab)


# ---------------------------------------------------------------- export


def _family_of(model: ml_collections.ConfigDict) -> tuple[str | None, str]:
  """(model_type, "") for a Llama-shaped model, or (None, the first field that is not)."""
  expected = dict(arch="decoder", head="lm", position="rope", norm="pre",
                  norm_type="rmsnorm", norm_scale_plus_one=False, use_bias=False,
                  activation="swiglu", scale_embeddings=False, embed_norm=False,
                  num_token_types=0, logits_bias=False, pooler=False, attention_softcap=0.0,
                  final_logit_softcap=0.0, parallel_block=False, rope_fraction=1.0)
  for key, value in expected.items():
    if model[key] != value:
      return None, f"model.{key}={model[key]!r}, but a Llama folder needs {value!r}"
  if model.qkv_bias and model.qk_norm:
    return None, ("model.qkv_bias=True with model.qk_norm=True: Qwen2 has no q/k norm "
                  "and Qwen3's attention_bias also biases o_proj")
  if model.sliding_window:
    if set(model.window_pattern) != {"l"} or model.qkv_bias or model.qk_norm or (
        model.rope_scaling != "none"):
      return None, (f"model.sliding_window={model.sliding_window} exports as Mistral only: "
                    "every layer local (window_pattern='l'), no qkv_bias, qk_norm or "
                    "rope_scaling")
    return "mistral", ""
  return ("qwen3" if model.qk_norm else "qwen2" if model.qkv_bias else "llama"), ""


def llama_shape_problem(model: ml_collections.ConfigDict) -> str:
  """Why `model` has no Llama-family folder ("" when it has one)."""
  return _family_of(model)[1]


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# The model_types an export writes (by the model's shape): --help and the docs list them.
EXPORT_MODEL_TYPES = tuple(_ARCHITECTURES)


def _rope_scaling(model: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """model.rope_* as config.json's rope_scaling (`rope_fields` reads it back)."""
  kind = model.rope_scaling
  if kind == "none":
    return None
  scaling = {"rope_type": kind, "factor": float(model.rope_scaling_factor)}
  if kind == "llama3":
    scaling.update(low_freq_factor=float(model.rope_low_freq_factor),
                   high_freq_factor=float(model.rope_high_freq_factor),
                   original_max_position_embeddings=int(model.rope_original_max_len))
  elif kind == "yarn":
    scaling.update(original_max_position_embeddings=int(model.rope_original_max_len),
                   beta_fast=float(model.rope_yarn_beta_fast),
                   beta_slow=float(model.rope_yarn_beta_slow),
                   truncate=bool(model.rope_yarn_truncate))
    if model.rope_attention_factor:
      scaling["attention_factor"] = float(model.rope_attention_factor)
  elif kind == "longrope":
    # Explicit: with the top-level original length written beside it, transformers
    # would derive the factor from max_position_embeddings instead.
    params = positions.RopeScaling(factor=float(model.rope_scaling_factor),
                                   original_max_len=int(model.rope_original_max_len),
                                   attention_factor=float(model.rope_attention_factor))
    scaling.update(short_factor=[float(f) for f in model.rope_short_factor],
                   long_factor=[float(f) for f in model.rope_long_factor],
                   attention_factor=positions.rope_attention_factor(kind, params))
  return scaling


def export_llama(workdir: str, hf_dir: str, *, checkpoint_step: int | None = None) -> str:
  """Writes a trained Llama-shaped decoder as a Hugging Face Llama-family folder.

  A Llama folder (LlamaForCausalLM names), or Qwen2 with q/k/v biases, Qwen3 with
  QK-norm, Mistral with a sliding window on every layer: config.json +
  model.safetensors, and tokenizer.json when the workdir was imported from a folder
  that had one. An imported model gets its source vocabulary order back (the rows the
  import added are dropped); any other run keeps its own ids (pad 0, eos 1, bos 2).

  Args:
    workdir: a run or import workdir.
    hf_dir: the folder to write (must not exist or be empty).
    checkpoint_step: the checkpoint to export; None: the newest.

  Returns:
    hf_dir.

  Raises:
    ConfigError: naming the first field no Llama-family folder can express.
  """
  run = loaded.load_run(workdir, checkpoint_step=checkpoint_step)
  model = run.config.model
  family, problem = _family_of(model)
  if family is None:
    raise ConfigError(f"{os.path.join(workdir, common.CONFIG)}: {problem}; only "
                      "Llama-shaped decoders export as Llama")
  params, bundle, vocab = common.export_inputs(workdir, run)
  tensors = _export_tensors(model, params, vocab)
  hf_config = _export_config(model, family, vocab)
  return common.write_folder(hf_dir, tensors, hf_config, bundle, run, family)


def _export_tensors(model: ml_collections.ConfigDict, params: dict[str, Any],
                    vocab: common.VocabularyMap) -> dict[str, np.ndarray]:
  """A Llama-shaped decoder's parameters under LlamaForCausalLM's tensor names."""
  tensors = {"model.embed_tokens.weight": vocab.unrows(
      params["embedder"]["token_embed"]["embedding"])}
  for i in range(model.num_layers):
    block, p = params[f"block_{i}"], f"model.layers.{i}."
    attention = block["self_attention"]
    for ours, hf in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      kernel = attention[ours]["kernel"]
      tensors[p + f"self_attn.{hf}.weight"] = kernel.reshape(kernel.shape[0], -1).T
      if model.qkv_bias:
        tensors[p + f"self_attn.{hf}.bias"] = attention[ours]["bias"].reshape(-1)
    out = attention["out"]["kernel"]
    tensors[p + "self_attn.o_proj.weight"] = out.reshape(-1, out.shape[-1]).T
    if model.qk_norm:
      tensors[p + "self_attn.q_norm.weight"] = attention["query_norm"]["scale"]
      tensors[p + "self_attn.k_norm.weight"] = attention["key_norm"]["scale"]
    tensors[p + "input_layernorm.weight"] = block["self_attention_norm"]["scale"]
    tensors[p + "post_attention_layernorm.weight"] = block["mlp_norm"]["scale"]
    for ours, hf in (("wi", "gate_proj"), ("wi_gate", "up_proj"), ("wo", "down_proj")):
      tensors[p + f"mlp.{hf}.weight"] = block["mlp"][ours]["kernel"].T
  tensors["model.norm.weight"] = params["final_norm"]["scale"]
  if not model.tie_embeddings:
    tensors["lm_head.weight"] = vocab.unrows(params["lm_head"]["kernel"].T)
  return tensors


def _export_config(model: ml_collections.ConfigDict, family: str,
                   vocab: common.VocabularyMap) -> dict[str, Any]:
  """The config.json of `family` (llama, mistral, qwen2, qwen3) for the model's fields."""
  def special(internal: int) -> int | None:  # A role the source vocabulary lacked: None.
    return None if internal in vocab.added else int(vocab.internal_to_hf[internal])

  heads, kv_heads = model.num_heads, model.num_kv_heads or model.num_heads
  head_dim = model.head_dim or model.d_model // heads
  hf_config = {
      "architectures": [_ARCHITECTURES[family]], "model_type": family,
      "vocab_size": vocab.hf_vocab_size, "hidden_size": model.d_model,
      "intermediate_size": model.mlp_dim, "num_hidden_layers": model.num_layers,
      "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
      "hidden_act": "silu", "max_position_embeddings": model.max_len,
      "rms_norm_eps": model.norm_epsilon, "rope_theta": model.rope_max_wavelength,
      "tie_word_embeddings": bool(model.tie_embeddings),
      "attention_dropout": model.attention_dropout, "initializer_range": 0.02,
      "use_cache": True, "torch_dtype": "float32",
      "bos_token_id": special(vocabularies.BOS_ID), "eos_token_id": special(vocabularies.EOS_ID),
      "pad_token_id": special(vocabularies.PAD_ID)}
  if family == "mistral":
    hf_config["sliding_window"] = model.sliding_window
  else:
    hf_config["rope_scaling"] = _rope_scaling(model)
  if model.rope_scaling == "dynamic":  # transformers grows the base past this length.
    hf_config["max_position_embeddings"] = model.rope_original_max_len
  if model.rope_scaling == "longrope":  # Phi-3's place for the switch length.
    hf_config["original_max_position_embeddings"] = model.rope_original_max_len
  if family in ("llama", "qwen3"):
    hf_config["attention_bias"] = False
  if family == "llama":
    hf_config.update(mlp_bias=False, pretraining_tp=1)
  if family in ("qwen2", "qwen3"):
    hf_config.update(use_sliding_window=False, sliding_window=None,
                     layer_types=["full_attention"] * model.num_layers)
  return hf_config
