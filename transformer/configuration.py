"""Config validation and the frozen model config the modules read.

`validate` runs before anything touches data or compiles, so a wrong value fails
in seconds with a message that names the key, the value and what would be valid.
`ModelConfig` is the one object the model modules see; eval and decode variants
are derived from it with `dataclasses.replace` (Flax wmt style).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from transformer import config_checks
from transformer import moe_config
from transformer.config_checks import (check_choice, check_float, check_int, check_rate,
                                       fail, lookup)

# Defined in config_checks.py (moe_config.py raises it too); callers import it from here.
ConfigError = config_checks.ConfigError

ARCHS = ("decoder", "encoder", "encoder_decoder")
HEADS = ("lm", "mlm", "classification")
POOLINGS = ("cls", "mean", "last")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
POSITIONS = ("learned", "sinusoidal", "rope", "relative", "alibi", "none")
NORMS = ("pre", "post", "sandwich")
NORM_TYPES = ("layernorm", "rmsnorm")
INITS = ("gpt2", "bert", "xavier")
SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_tanh")
ROPE_SCALINGS = ("none", "linear", "llama3")
ATTENTION_IMPLS = ("xla", "cudnn", "einsum")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TOKENIZERS = ("sentencepiece", "bytes", "char")
SPM_MODEL_TYPES = ("unigram", "bpe")
PACKINGS = ("pack", "pad")
LM_WINDOWS = ("packed", "random")
OVERLONG_POLICIES = ("truncate", "drop")
DECODE_ERRORS = ("strict", "replace")
LOCAL_DATASETS = ("local_text", "local_parallel", "local_tsv")
SCHEDULES = ("warmup_rsqrt", "noam", "cosine", "constant")
MESH_AXES = ("data", "fsdp", "tensor")
# Mesh axes a mesh.shape may leave out (a rule naming one maps to None then).
OPTIONAL_MESH_AXES = ("expert",)
LOGICAL_AXES = ("batch", "length", "embed", "heads", "kv_heads", "head_dim", "mlp",
                "vocab", "layers", "expert")


class DataError(ValueError):
  """Input data is unusable; the message names the file, line and field, and what is valid."""


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks every field and cross-field constraint; raises ConfigError on the first problem.

  Args:
    config: the full experiment config (see configs/base.py).

  Raises:
    ConfigError: naming the key, the offending value and what would be valid.
  """
  m = "model."
  check_choice(config, m + "arch", ARCHS)
  check_choice(config, m + "head", HEADS)
  check_choice(config, m + "remat", REMAT_POLICIES)
  for key in ("d_model", "num_layers", "num_heads", "mlp_dim", "max_len",
              "num_classes", "relative_buckets", "relative_max_distance"):
    check_int(config, m + key, 1)
  for key in ("vocab_size", "num_kv_heads", "head_dim", "num_decoder_layers"):
    check_int(config, m + key, 0)
  check_choice(config, m + "position", POSITIONS)
  check_choice(config, m + "norm", NORMS)
  check_choice(config, m + "norm_type", NORM_TYPES)
  check_choice(config, m + "activation", ACTIVATIONS)
  check_choice(config, m + "init", INITS)
  check_choice(config, m + "sinusoidal_layout", SINUSOIDAL_LAYOUTS)
  check_int(config, m + "num_token_types", 0)
  for key in ("pooler", "logits_bias"):
    if not isinstance(config.model[key], bool):
      fail(m + key, config.model[key], "expected True or False")
  never = config.model.never_predict
  if not isinstance(never, (tuple, list)) or not all(
      isinstance(i, int) and not isinstance(i, bool) and 0 <= i and
      (config.model.vocab_size == 0 or i < config.model.vocab_size) for i in never):
    fail(m + "never_predict", never, "expected a tuple of token ids in [0, model.vocab_size)")
  if not isinstance(config.model.embed_norm, bool):
    fail(m + "embed_norm", config.model.embed_norm, "expected True or False")
  check_choice(config, m + "attention_impl", ATTENTION_IMPLS)
  check_choice(config, m + "dtype", DTYPES)
  check_choice(config, m + "param_dtype", DTYPES[1:])
  for key in ("embed_dropout", "residual_dropout", "attention_dropout", "mlp_dropout"):
    check_rate(config, m + key)
  model = config.model
  _validate_topology(model)
  _validate_modern_axes(model)
  moe_config.validate_moe(config)
  if not model.norm_epsilon > 0:
    fail(m + "norm_epsilon", model.norm_epsilon, "expected a positive float")
  if model.head_dim == 0 and model.d_model % model.num_heads:
    fail(m + "num_heads", model.num_heads,
          f"must divide model.d_model={model.d_model} when model.head_dim=0; "
          f"pick a divisor of {model.d_model} or set model.head_dim explicitly")
  kv_heads = model.num_kv_heads or model.num_heads
  if model.num_heads % kv_heads:
    fail(m + "num_kv_heads", model.num_kv_heads,
          f"must divide model.num_heads={model.num_heads} (0 means num_heads)")
  if model.attention_dropout > 0 and model.attention_impl != "einsum":
    fail(m + "attention_dropout", model.attention_dropout,
          f"jax.nn.dot_product_attention (model.attention_impl={model.attention_impl!r}) "
          "has no dropout on attention probabilities; set model.attention_dropout=0.0 "
          "or model.attention_impl='einsum'")

  _validate_data(config)
  validate_decode(config)
  _validate_evaluation_hooks(config)

  o = "optimizer."
  check_choice(config, o + "schedule", SCHEDULES)
  check_int(config, o + "warmup_steps", 0)
  if config.optimizer.schedule == "noam" and config.optimizer.warmup_steps == 0:
    fail(o + "warmup_steps", 0, "the noam schedule divides by warmup; expected >= 1")
  for key in ("learning_rate", "noam_scale", "eps"):
    if not lookup(config, o + key) > 0:
      fail(o + key, lookup(config, o + key), "expected a positive float")
  for key in ("b1", "b2", "label_smoothing"):
    check_rate(config, o + key)
  check_float(config, o + "z_loss", 0.0)
  for key in ("weight_decay", "grad_clip_norm"):
    if not lookup(config, o + key) >= 0:
      fail(o + key, lookup(config, o + key), "expected a float >= 0")
  check_int(config, o + "decay_steps", 0)
  check_int(config, o + "skip_nonfinite", 0)
  opt = config.optimizer
  min_lr = opt.min_learning_rate
  if isinstance(min_lr, bool) or not isinstance(min_lr, (int, float)) or not (
      0 <= min_lr <= opt.learning_rate):
    fail(o + "min_learning_rate", min_lr,
          f"expected a float in [0, optimizer.learning_rate={opt.learning_rate}]")
  if opt.schedule == "cosine":
    check_int(config, "train.num_steps", 1)  # The decay length when decay_steps is 0.
    decay_steps = opt.decay_steps or config.train.num_steps
    if decay_steps <= opt.warmup_steps and opt.decay_steps == 0:
      # The decay length is train.num_steps, the key a short run sets: name it first.
      fail("train.num_steps", config.train.num_steps,
            "with optimizer.schedule='cosine' and optimizer.decay_steps=0 the run is the "
            "cosine's length, which must end after the warmup: expected > "
            f"optimizer.warmup_steps={opt.warmup_steps}; set train.num_steps above "
            f"{opt.warmup_steps}, or lower the warmup (e.g. --config.optimizer.warmup_steps="
            f"{max(config.train.num_steps // 10, 0)})")
    if decay_steps <= opt.warmup_steps:
      fail(o + "decay_steps", opt.decay_steps,
            "with optimizer.schedule='cosine' the decay must end after the warmup (it counts "
            f"the warmup too): expected > optimizer.warmup_steps={opt.warmup_steps}")

  t = "train."
  check_int(config, t + "num_steps", 1)
  check_int(config, t + "microbatches", 1)
  check_int(config, t + "log_every", 1)
  check_int(config, t + "eval_every", 1)
  if config.train.eval_batches != -1:
    check_int(config, t + "eval_batches", 1)
  check_int(config, "checkpoint.every", 1)
  check_int(config, "checkpoint.keep", 1)
  check_int(config, t + "steps_per_call", 1)
  _check_steps_per_call(config)
  # Only the type here: whether the path holds a usable checkpoint is checked when loading.
  if not isinstance(config.init_from, str):
    fail("init_from", config.init_from, "expected '' or the path of a run's workdir or of "
          "one of its checkpoints/<step> directories")
  _validate_mesh(config)
  moe_config.validate_expert_mesh(config)


# The cadences train.steps_per_call must divide (cli/common.fit_steps_per_call reads it too).
STEPS_PER_CALL_CADENCES = ("train.log_every", "train.eval_every", "checkpoint.every")


def _check_steps_per_call(config: ml_collections.ConfigDict) -> None:
  """Rows, evaluations and checkpoints fall between calls: each cadence is a multiple."""
  per_call = config.train.steps_per_call
  for key in STEPS_PER_CALL_CADENCES:
    every = lookup(config, key)
    if every % per_call:
      divisors = [d for d in range(1, every + 1) if every % d == 0]
      fail("train.steps_per_call", per_call,
           f"{key}={every} is not a multiple of it: a call runs its steps without a "
           "stop in between, so every logged row, evaluation and checkpoint falls "
           f"between calls; use a divisor of {every} (" + ", ".join(map(str, divisors[:12]))
           + (", ..." if len(divisors) > 12 else "") + f") or make {key} a multiple of "
           f"{per_call}")


DECODE_OVERLONG = ("truncate", "error")


def validate_decode(config: ml_collections.ConfigDict) -> None:
  """Checks the decode.* fields (also after command-line flags changed them).

  Temperature > 0 samples (top_k / top_p apply, beam_size is not used); at
  temperature 0, beam_size 1 is greedy and beam_size > 1 is beam search.
  """
  k = "decode."
  for key in ("beam_size", "max_new_tokens", "batch_size"):
    check_int(config, k + key, 1)
  for key in ("max_length_offset", "top_k"):
    check_int(config, k + key, 0)
  check_choice(config, k + "overlong", DECODE_OVERLONG)
  dec = config.decode
  for key in ("alpha", "temperature"):
    value = dec[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
      fail(k + key, value, "expected a float >= 0")
  if isinstance(dec.top_p, bool) or not isinstance(dec.top_p, (int, float)) or not (
      0.0 < dec.top_p <= 1.0):
    fail(k + "top_p", dec.top_p, "expected a probability in (0, 1]")
  if dec.temperature == 0 and (dec.top_k or dec.top_p < 1.0):
    fail(k + ("top_k" if dec.top_k else "top_p"), dec.top_k or dec.top_p,
          "top_k and top_p only apply when sampling: set decode.temperature > 0 "
          "(--temperature), or leave them at 0 and 1.0")


def _validate_evaluation_hooks(config: ml_collections.ConfigDict) -> None:
  t = "train."
  check_int(config, t + "bleu_examples", 0)
  if config.train.bleu_examples and not (config.data.source_language and
                                         config.model.arch == "encoder_decoder"):
    fail(t + "bleu_examples", config.train.bleu_examples, "BLEU is computed for "
          "translation runs: model.arch='encoder_decoder' with data.source_language and "
          "data.target_language set")
  if config.train.sample_prompt and config.model.arch != "decoder":
    fail(t + "sample_prompt", config.train.sample_prompt, "samples come from a decoder "
          f"LM (model.arch='decoder'), not model.arch={config.model.arch!r}")


def _validate_data(config: ml_collections.ConfigDict) -> None:
  d, data, model = "data.", config.data, config.model
  check_choice(config, d + "tokenizer", TOKENIZERS)
  check_choice(config, d + "spm_model_type", SPM_MODEL_TYPES)
  check_choice(config, d + "packing", PACKINGS)
  check_choice(config, d + "lm_windows", LM_WINDOWS)
  check_choice(config, d + "overlong", OVERLONG_POLICIES)
  check_choice(config, d + "decode_errors", DECODE_ERRORS)
  for key in ("seq_len", "batch_size", "num_threads", "spm_train_sentences",
              "continuation_chars"):
    check_int(config, d + key, 1)
  for key in ("spm_vocab_size", "shuffle_rows"):
    check_int(config, d + key, 0)
  check_rate(config, d + "mask_rate")
  if not isinstance(data.val_fraction, (int, float)) or not 0.0 < data.val_fraction < 1.0:
    fail(d + "val_fraction", data.val_fraction, "expected a fraction in (0, 1)")
  if data.lm_windows == "random" and data.shuffle_rows:
    fail(d + "shuffle_rows", data.shuffle_rows, "random LM windows (data.lm_windows="
          "'random') are already drawn independently: set data.shuffle_rows=0, or "
          "data.lm_windows='packed'")
  if data.lm_windows == "random" and objective_of(model.arch, model.head) != "causal_lm":
    fail(d + "lm_windows", "random", "random windows are a causal-LM sampling (model.arch="
          f"'decoder', model.head='lm'), not for model.arch={model.arch!r}, "
          f"model.head={model.head!r}; use 'packed'")
  if model.head == "classification" and not data.label_key:
    fail(d + "label_key", "", "a classification head needs the dataset's label feature "
          "(e.g. 'label' for glue/sst2 and imdb_reviews)")
  if not data.name:
    fail(d + "name", data.name, "expected a TFDS dataset name such as 'python_stdlib', or "
          f"one of {LOCAL_DATASETS} with data.path")
  if data.name in LOCAL_DATASETS and not data.path:
    fail(d + "path", data.path, f"data.name={data.name!r} builds a dataset from local "
          "files: set data.path to the file or folder")
  if data.path and data.name not in LOCAL_DATASETS:
    fail(d + "path", data.path, f"only the local datasets {LOCAL_DATASETS} read "
          f"data.path, and data.name={data.name!r}; set data.name or clear data.path")
  if bool(data.source_language) != bool(data.target_language):
    fail(d + "source_language" if not data.source_language else d + "target_language", "",
          "translation needs both data.source_language and data.target_language "
          f"(got {data.source_language!r} -> {data.target_language!r})")
  if data.source_language and data.source_language == data.target_language:
    fail(d + "target_language", data.target_language, "must differ from "
          "data.source_language")
  if model.vocab_size == 0 and data.tokenizer == "sentencepiece" and not data.spm_vocab_size:
    fail(d + "spm_vocab_size", 0, "with model.vocab_size=0 (take the tokenizer's size), "
          "SentencePiece needs its own size: set data.spm_vocab_size, e.g. 8000")
  # Position tables have max_len rows; a lookup past the end returns NaN, not an error.
  if data.seq_len > model.max_len and model.position in ("learned", "sinusoidal"):
    fail(d + "seq_len", data.seq_len,
          f"must be <= model.max_len={model.max_len} with {model.position} positions")


# Which heads each topology can carry, and the training objective each pair implies.
OBJECTIVES = {
    ("decoder", "lm"): "causal_lm",
    ("decoder", "classification"): "classification",
    ("encoder", "mlm"): "masked_lm",
    ("encoder", "classification"): "classification",
    ("encoder_decoder", "lm"): "seq2seq",
}


def objective_of(arch: str, head: str) -> str:
  """The training objective of a (topology, head) pair; raises ConfigError if none."""
  if (arch, head) not in OBJECTIVES:
    valid = sorted(h for a, h in OBJECTIVES if a == arch)
    fail("model.head", head, f"model.arch={arch!r} supports heads {valid}")
  return OBJECTIVES[(arch, head)]


def _validate_topology(model: ml_collections.ConfigDict) -> None:
  objective_of(model.arch, model.head)
  if model.head == "classification":
    if model.pooling not in POOLINGS:
      fail("model.pooling", model.pooling,
            f"a classification head needs a pooling rule: one of {POOLINGS}")
    if model.arch == "decoder" and model.pooling == "cls":
      fail("model.pooling", "cls", "a causal decoder's first token sees nothing after "
            "it; use 'last' or 'mean' on a decoder")
    if model.arch == "encoder" and model.pooling == "last":
      fail("model.pooling", "last", "on a bidirectional encoder use 'cls' or 'mean'")
  if model.logits_bias and model.head != "lm":
    fail("model.logits_bias", True, f"a bias on LM logits needs model.head='lm' (the mlm "
          f"head has its own bias), not {model.head!r}")
  if model.pooler and model.head == "lm":
    fail("model.pooler", True, "the pooler feeds a classifier: use it with "
          "model.head='classification' (or 'mlm', which keeps BERT's pooler for fine-tuning)")
  if model.share_embeddings and model.arch != "encoder_decoder":
    fail("model.share_embeddings", True, "source/target sharing needs "
          "model.arch='encoder_decoder'")
  head_dim = model.head_dim or model.d_model // model.num_heads
  if model.position == "rope" and head_dim % 2:
    fail("model.position", "rope",
          f"rotary embeddings need an even head_dim, and head_dim={head_dim} (model.head_dim="
          f"{model.head_dim}, else model.d_model={model.d_model} // model.num_heads="
          f"{model.num_heads}); pick another model.head_dim or model.num_heads")


def _validate_modern_axes(model: ml_collections.ConfigDict) -> None:
  """The axes of the Llama / Mistral / Qwen / Gemma families: each value, then combinations."""
  m = "model."
  for key in ("norm_scale_plus_one", "qk_norm", "parallel_block", "qkv_bias"):
    if not isinstance(model[key], bool):
      fail(m + key, model[key], "expected True or False")
  for key in ("attention_softcap", "final_logit_softcap", "rope_local_max_wavelength"):
    value = model[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
      fail(m + key, value, "expected a float > 0, or 0 for off")
  if model.attention_softcap and model.attention_impl != "einsum":
    fail(m + "attention_softcap", model.attention_softcap,
          f"jax.nn.dot_product_attention (model.attention_impl={model.attention_impl!r}) "
          "cannot cap the scores before its softmax; set model.attention_impl='einsum'")
  if model.final_logit_softcap and model.head == "classification":
    fail(m + "final_logit_softcap", model.final_logit_softcap,
          "caps the token logits of an 'lm' or 'mlm' head, not model.head='classification'")
  if model.norm_scale_plus_one and model.norm_type != "rmsnorm":
    fail(m + "norm_scale_plus_one", True, "Gemma's (1 + scale) is an RMSNorm "
          f"parameterisation; set model.norm_type='rmsnorm' (got {model.norm_type!r})")
  if model.parallel_block and model.norm != "pre":
    fail(m + "parallel_block", True, "the parallel block (GPT-J, PaLM) feeds every "
          f"sublayer the same pre-norm input; set model.norm='pre' (got {model.norm!r})")
  if model.qkv_bias and model.use_bias:
    fail(m + "qkv_bias", True, "model.use_bias=True already puts biases on q/k/v; "
          "qkv_bias adds them to a model.use_bias=False model (Qwen2)")

  window = model.sliding_window
  if isinstance(window, bool) or not isinstance(window, int) or window < 0:
    fail(m + "sliding_window", window, "expected an integer >= 1, or 0 for no local layers")
  pattern = model.window_pattern
  if not isinstance(pattern, str) or not pattern or set(pattern) - {"l", "g"}:
    fail(m + "window_pattern", pattern, "expected a non-empty string of 'l' (local) and "
          "'g' (global) layers, tiled over each stack, e.g. 'l', 'lg', 'lllllg'")
  if not window and pattern != "l":
    fail(m + "window_pattern", pattern, "local layers need a window: set "
          "model.sliding_window > 0, or leave window_pattern='l'")
  if window and "l" not in pattern:
    fail(m + "window_pattern", pattern, f"with model.sliding_window={window} at least one "
          "layer must be local ('l'); for no local layers set model.sliding_window=0")
  if window and model.position == "relative" and model.arch != "decoder":
    fail(m + "sliding_window", window, "a window on a bidirectional stack with T5's "
          "relative buckets (model.position='relative') is no published model and cuts "
          "the buckets' reach; use model.position='rope' or model.sliding_window=0")
  if model.rope_local_max_wavelength and not (window and model.position == "rope"):
    fail(m + "rope_local_max_wavelength", model.rope_local_max_wavelength,
          "a RoPE base for local layers needs model.position='rope' and "
          "model.sliding_window > 0; 0 means rope_max_wavelength")

  if model.rope_scaling not in ROPE_SCALINGS:
    fail(m + "rope_scaling", model.rope_scaling,
          "valid values are " + ", ".join(repr(c) for c in ROPE_SCALINGS))
  factor = model.rope_scaling_factor
  if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
    fail(m + "rope_scaling_factor", factor, "expected a float > 0")
  if model.rope_scaling == "none" and factor != 1.0:
    fail(m + "rope_scaling_factor", factor, "only applies with model.rope_scaling='linear' "
          "or 'llama3'; leave it at 1.0 with 'none'")
  if model.rope_scaling != "none" and window and "g" not in pattern:
    fail(m + "rope_scaling", model.rope_scaling, "long-context scaling applies to global "
          f"layers only (Gemma 3), and model.window_pattern={pattern!r} has none")
  if model.rope_scaling != "none" and model.position != "rope":
    fail(m + "rope_scaling", model.rope_scaling, "scales rotary positions: needs "
          f"model.position='rope' (got {model.position!r})")
  if model.rope_scaling == "llama3":
    low, high = model.rope_low_freq_factor, model.rope_high_freq_factor
    if not (isinstance(low, (int, float)) and low > 0):
      fail(m + "rope_low_freq_factor", low, "expected a float > 0")
    if not (isinstance(high, (int, float)) and high > low):
      fail(m + "rope_high_freq_factor", high,
            f"expected a float > model.rope_low_freq_factor={low}")
    original = model.rope_original_max_len
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
      fail(m + "rope_original_max_len", original, "expected an integer >= 1")
  fraction = model.rope_fraction
  head_dim = model.head_dim or model.d_model // model.num_heads
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (
      0 < fraction <= 1):
    fail(m + "rope_fraction", fraction, "expected a fraction in (0, 1]")
  if fraction != 1.0 and model.position != "rope":
    fail(m + "rope_fraction", fraction, f"partial rotary needs model.position='rope' (got "
          f"{model.position!r}); leave it at 1.0")
  rotary = head_dim * fraction
  if model.position == "rope" and (rotary != int(rotary) or int(rotary) % 2 or not rotary):
    fail(m + "rope_fraction", fraction, f"head_dim={head_dim} x rope_fraction must be an "
          "even number of features to rotate in pairs")


def _validate_mesh(config: ml_collections.ConfigDict) -> None:
  shape = config.mesh.shape
  # Shape first: ('data', 2) is what (("data", 2)) parses to (one pair, no outer tuple).
  pairs = isinstance(shape, (tuple, list)) and all(
      isinstance(axis, (tuple, list)) and len(axis) == 2 and isinstance(axis[0], str)
      and isinstance(axis[1], int) and not isinstance(axis[1], bool) for axis in shape)
  if not pairs:
    fail("mesh.shape", shape, "expected a tuple of (name, size) pairs, one for each of "
          f"{MESH_AXES}, e.g. ((\"data\", -1), (\"fsdp\", 1), (\"tensor\", 1))")
  names = [axis[0] for axis in shape]
  optional = [n for n in names if n in OPTIONAL_MESH_AXES]
  if sorted(set(names) - set(optional)) != sorted(MESH_AXES) or len(set(names)) != len(names):
    fail("mesh.shape", shape, f"expected one (name, size) pair for each of {MESH_AXES}, "
          f"and optionally one for {OPTIONAL_MESH_AXES}")
  sizes = [axis[1] for axis in shape]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    fail("mesh.shape", shape, "sizes must be positive, with at most one -1")
  rules = config.mesh.rules
  if not (isinstance(rules, (tuple, list))
          and all(isinstance(r, (tuple, list)) and len(r) == 2 for r in rules)):
    fail("mesh.rules", rules, "expected a tuple of (logical axis, mesh axes) pairs")
  for logical, mesh_axes in rules:
    if logical not in LOGICAL_AXES:
      fail("mesh.rules", logical, f"logical axes are {LOGICAL_AXES}")
    targets = mesh_axes if isinstance(mesh_axes, (tuple, list)) else (mesh_axes,)
    for target in targets:
      if target is not None and target not in MESH_AXES + OPTIONAL_MESH_AXES:
        fail("mesh.rules", (logical, mesh_axes),
              f"mesh axes are {MESH_AXES + OPTIONAL_MESH_AXES} or None")


def resolve_dtype(name: str) -> jnp.dtype:
  """Maps a dtype name to a jnp dtype; "auto" is bfloat16 on GPU/TPU, float32 on CPU."""
  if name == "auto":
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  return jnp.dtype(name)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything the model modules read, resolved and frozen (hashable for jit)."""

  arch: str
  head: str
  pooling: str
  num_classes: int
  num_decoder_layers: int
  share_embeddings: bool
  scan_layers: bool
  remat: str
  rope_max_wavelength: float
  rope_local_max_wavelength: float
  rope_scaling: str
  rope_scaling_factor: float
  rope_low_freq_factor: float
  rope_high_freq_factor: float
  rope_original_max_len: int
  rope_fraction: float
  relative_buckets: int
  relative_max_distance: int
  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  max_len: int
  position: str
  norm: str
  norm_type: str
  norm_epsilon: float
  norm_scale_plus_one: bool
  qk_norm: bool
  attention_softcap: float
  final_logit_softcap: float
  sliding_window: int
  window_pattern: str
  parallel_block: bool
  activation: str
  use_bias: bool
  qkv_bias: bool
  tie_embeddings: bool
  scale_embeddings: bool
  embed_norm: bool
  init: str
  sinusoidal_layout: str
  num_token_types: int
  pooler: bool
  logits_bias: bool
  never_predict: tuple[int, ...]
  embed_dropout: float
  residual_dropout: float
  attention_dropout: float
  mlp_dropout: float
  dtype: Any
  param_dtype: Any
  attention_impl: str
  mlp: str
  num_experts: int
  experts_per_token: int
  moe_mlp_dim: int
  moe_router: str
  moe_renormalize: bool
  moe_shared_mlp_dim: int
  moe_shared_gate: bool
  moe_every: int
  moe_offset: int
  moe_dispatch: str
  moe_capacity_factor: float
  moe_router_jitter: float
  deterministic: bool = False  # True for evaluation: no dropout.
  # True for autoregressive decoding: causal self-attention appends its keys and values
  # to a "cache" collection of max_len slots, slot = token position (see decoding.py).
  decode: bool = False

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict) -> "ModelConfig":
    """Builds the frozen config from `config.model`, filling the 0 = derived fields."""
    if model.vocab_size == 0:
      raise ValueError("config.model.vocab_size=0 must be resolved from the tokenizer first "
                       "(transformer.data.sources.resolved_vocab_size)")
    fields = {f.name for f in dataclasses.fields(cls)} - {"deterministic", "decode"}
    values = {k: model[k] for k in fields}
    values["num_kv_heads"] = model.num_kv_heads or model.num_heads
    values["head_dim"] = model.head_dim or model.d_model // model.num_heads
    values["num_decoder_layers"] = model.num_decoder_layers or model.num_layers
    values["never_predict"] = tuple(model.never_predict)
    values["moe_mlp_dim"] = model.moe_mlp_dim or model.mlp_dim
    values["rope_local_max_wavelength"] = (model.rope_local_max_wavelength
                                           or model.rope_max_wavelength)
    values["dtype"] = resolve_dtype(model.dtype)
    values["param_dtype"] = resolve_dtype(model.param_dtype)
    return cls(**values)

  def moe_layers(self, num_layers: int) -> tuple[bool, ...]:
    """Which of a stack's `num_layers` blocks have a mixture of experts (mlp="moe")."""
    if self.mlp != "moe":
      return (False,) * num_layers
    return tuple(i % self.moe_every == self.moe_offset for i in range(num_layers))

  def local_layers(self, num_layers: int) -> tuple[bool, ...]:
    """Which of a stack's `num_layers` blocks use the sliding window (window_pattern tiled)."""
    if not self.sliding_window:
      return (False,) * num_layers
    pattern = self.window_pattern
    return tuple(pattern[i % len(pattern)] == "l" for i in range(num_layers))
