"""Validation of the Llama / Mistral / Qwen / Gemma axes: softcaps, windows, RoPE variants.

A step of `model.validate_model`: each value, then the combinations the modules
cannot run (docs/configuration.md, "Model fields"). model/attention.py, positions.py and
layers.py implement what it allows.
"""

from __future__ import annotations

import ml_collections

from transformer.config import attention
from transformer.config import objective as objective_lib
from transformer.config.checks import check_bool, check_choice, is_int, is_number
from transformer.config.errors import fail

# model.rope_scaling; model/positions.py implements each (tests/test_config_registries.py).
ROPE_SCALINGS = ("none", "linear", "llama3", "yarn", "dynamic", "longrope")
# The scalings that read model.rope_original_max_len.
_ORIGINAL_LEN_SCALINGS = ("llama3", "yarn", "dynamic", "longrope")


def validate_modern_axes(config: ml_collections.ConfigDict) -> None:
  """The axes of the Llama / Mistral / Qwen / Gemma families: each value, then combinations."""
  m, model = "model.", config.model
  for key in ("norm_scale_plus_one", "qk_norm", "parallel_block", "qkv_bias"):
    check_bool(config, m + key)
  for key in ("attention_softcap", "final_logit_softcap", "rope_local_max_wavelength"):
    value = model[key]
    if not is_number(value) or not value >= 0:
      fail(m + key, value, "expected a float > 0, or 0 for off")
  kernel = attention.KERNELS.get(model.attention_impl)
  if model.attention_softcap and kernel and not kernel.softcap:
    fail(m + "attention_softcap", model.attention_softcap,
          f"model.attention_impl={model.attention_impl!r} cannot cap the scores before its "
          f"softmax; set model.attention_impl to one of "
          f"{[n for n, k in attention.KERNELS.items() if k.softcap]} (or 'auto': splash on "
          "TPUs, einsum elsewhere)")
  if model.final_logit_softcap and objective_lib.resolve(model).classifies:
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
  _validate_windows(config)
  _validate_rope_scaling(config)
  _validate_yarn_and_longrope(config)


def _validate_windows(config: ml_collections.ConfigDict) -> None:
  """Local layers: model.sliding_window, window_pattern and the local RoPE base."""
  m, model = "model.", config.model
  window = model.sliding_window
  if not is_int(window) or window < 0:
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


def _validate_rope_scaling(config: ml_collections.ConfigDict) -> None:
  """RoPE's long-context scaling (model.rope_scaling and its factors) and partial rotary."""
  m, model = "model.", config.model
  window, pattern = model.sliding_window, model.window_pattern
  check_choice(config, m + "rope_scaling", ROPE_SCALINGS)
  factor = model.rope_scaling_factor
  if not is_number(factor) or not factor > 0:
    fail(m + "rope_scaling_factor", factor, "expected a float > 0")
  scaling = model.rope_scaling
  if scaling == "none" and factor != 1.0:
    fail(m + "rope_scaling_factor", factor, "only applies with a model.rope_scaling other "
          "than 'none'; leave it at 1.0 with 'none'")
  if scaling != "none" and window and "g" not in pattern:
    fail(m + "rope_scaling", scaling, "long-context scaling applies to global "
          f"layers only (Gemma 3), and model.window_pattern={pattern!r} has none")
  if scaling != "none" and model.position != "rope":
    fail(m + "rope_scaling", scaling, "scales rotary positions: needs "
          f"model.position='rope' (got {model.position!r})")
  if scaling == "llama3":
    low, high = model.rope_low_freq_factor, model.rope_high_freq_factor
    if not (is_number(low) and low > 0):
      fail(m + "rope_low_freq_factor", low, "expected a float > 0")
    if not (is_number(high) and high > low):
      fail(m + "rope_high_freq_factor", high,
            f"expected a float > model.rope_low_freq_factor={low}")
  if scaling in _ORIGINAL_LEN_SCALINGS:
    original = model.rope_original_max_len
    if not is_int(original) or original < 1 or (scaling == "longrope" and original < 2):
      fail(m + "rope_original_max_len", original, "expected an integer >= 1 (>= 2 with "
            "'longrope', whose attention factor divides by its log)")
  fraction = model.rope_fraction
  head_dim = model.head_dim or model.d_model // model.num_heads
  if not is_number(fraction) or not 0 < fraction <= 1:
    fail(m + "rope_fraction", fraction, "expected a fraction in (0, 1]")
  if fraction != 1.0 and model.position != "rope":
    fail(m + "rope_fraction", fraction, f"partial rotary needs model.position='rope' (got "
          f"{model.position!r}); leave it at 1.0")
  rotary = head_dim * fraction
  if model.position == "rope" and (rotary != int(rotary) or int(rotary) % 2 or not rotary):
    fail(m + "rope_fraction", fraction, f"head_dim={head_dim} x rope_fraction must be an "
          "even number of features to rotate in pairs")


def _validate_yarn_and_longrope(config: ml_collections.ConfigDict) -> None:
  """YaRN's ramp, LongRoPE's factor lists and their attention factor."""
  m, model = "model.", config.model
  scaling = model.rope_scaling
  check_bool(config, m + "rope_yarn_truncate")
  fast, slow = model.rope_yarn_beta_fast, model.rope_yarn_beta_slow
  if not (is_number(slow) and slow > 0):
    fail(m + "rope_yarn_beta_slow", slow, "expected a float > 0 (rotations)")
  if not (is_number(fast) and fast >= slow):
    fail(m + "rope_yarn_beta_fast", fast,
          f"expected a float >= model.rope_yarn_beta_slow={slow}")
  attention = model.rope_attention_factor
  if not (is_number(attention) and attention >= 0):
    fail(m + "rope_attention_factor", attention, "expected a float > 0, or 0 for derived")
  if attention and scaling not in ("yarn", "longrope"):
    fail(m + "rope_attention_factor", attention, "only 'yarn' and 'longrope' scale the "
          f"attention; leave it at 0 with model.rope_scaling={scaling!r}")
  head_dim = model.head_dim or model.d_model // model.num_heads
  pairs = round(head_dim * model.rope_fraction) // 2
  if scaling == "dynamic" and pairs < 2:
    fail(m + "rope_scaling", scaling, "dynamic NTK raises the base to d / (d - 2), d the "
          f"rotated features: needs at least 4 (head_dim={head_dim} x rope_fraction="
          f"{model.rope_fraction})")
  for key in ("rope_short_factor", "rope_long_factor"):
    value = model[key]
    if scaling != "longrope":
      if len(value):
        fail(m + key, value, f"only 'longrope' reads it; leave it () with "
              f"model.rope_scaling={scaling!r}")
      continue
    if (not isinstance(value, (tuple, list)) or len(value) != pairs or
        not all(is_number(f) and f > 0 for f in value)):
      fail(m + key, value, f"expected {pairs} floats > 0, one per rotated pair "
            f"(head_dim={head_dim} x rope_fraction={model.rope_fraction} / 2)")
