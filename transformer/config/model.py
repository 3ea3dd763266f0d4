"""Validation of the model.* fields, and the frozen ModelConfig the modules read.

`validate_model` checks each model.* value, then the combinations the modules
cannot build; the Llama/Gemma axes (modern.py) and mixture of experts (moe.py) are
steps of it. `ModelConfig` is the one object the model modules see, generated from
configs/base.py's model block (one field per key, never restated here); eval and
decode variants come from `dataclasses.replace` (Flax wmt style).

The valid values of each choice key are the tuples below. REMAT_POLICIES is the
implementing table itself (jax's policies: data, so it lives at the ground, and
model/layers.py and planning/search.py read it); ARCHS, ACTIVATIONS, POSITIONS, NORMS,
NORM_TYPES, INITS and SINUSOIDAL_LAYOUTS name code in model/ (architecture classes,
activation functions, position encodings, norm placements and modules, initialisation
families, sinusoidal layouts) that this ground module may not import, and
tests/test_config_registries.py holds each equal to its table.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from configs import base
from transformer.config import attention
from transformer.config import lora
from transformer.config import modern
from transformer.config import moe
from transformer.config import objective as objective_lib
from transformer.config.checks import (check_bool, check_choice, check_int, check_positive,
                                       check_rate, is_int)
from transformer.config.errors import fail

# The valid values of each model.* choice key, each in the order its error lists them.
# Tables in model/ the names must equal (tests/test_config_registries.py): ARCHS is
# models.py's ARCHITECTURES (and OBJECTIVES' topologies), ACTIVATIONS mlp.py's
# ACTIVATION_FNS, POSITIONS and SINUSOIDAL_LAYOUTS positions.py's tables of the same
# names, NORMS norms.py's NORM_PLACEMENTS, NORM_TYPES norms.py's NORM_TYPES, INITS
# initializers.py's INITS.
ARCHS = ("decoder", "encoder", "encoder_decoder")
HEADS = ("lm", "mlm", "classification")
POOLINGS = ("cls", "mean", "last")
# model.remat -> the policy nn.remat saves activations by; "none" does not rematerialise.
# The table itself: model/layers.py and planning/search.py read it from here.
# The residual stream between a block's sublayers, named (jax.ad_checkpoint.checkpoint_name)
# in its sharded layout: the dot policies keep it rather than the attention projection's
# output that rebuilds it, which tensor parallelism all-reduces to every chip (24 GiB a
# chip on the 32B recipe of docs/scaling.md, 6 GiB as the stream's shard). No larger
# without tensor parallelism: the same [B, L, E] either way.
RESIDUAL_NAME = "residual_stream"
_SAVE_RESIDUAL = jax.checkpoint_policies.save_only_these_names(RESIDUAL_NAME)
REMAT_POLICIES: dict[str, Any] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots, _SAVE_RESIDUAL),
    "dots_no_batch": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable, _SAVE_RESIDUAL),
}
POSITIONS = ("learned", "sinusoidal", "rope", "relative", "alibi", "none")
# The positions read from a table of model.max_len rows (positions.py's entries with an
# embedding_table): a longer sequence would read past it.
TABLE_POSITIONS = ("learned", "sinusoidal")
NORMS = ("pre", "post", "sandwich")
NORM_TYPES = ("layernorm", "rmsnorm")
INITS = ("gpt2", "bert", "xavier")
SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_tanh")  # silu/gelu(x W) * (x V) in mlp.py.
# config/attention.py's kernel table (model/attention_ops.py binds each to its code).
# "auto" picks the platform's fused kernel and falls back per layer.
ATTENTION_IMPLS = attention.ATTENTION_IMPLS
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("", "fp8")  # model.quantization (model/fp8.py).
# model.mlp_impl: the dense MLP's kernels. "pallas": the activation inside the matmuls
# (model/mlp_pallas.py); "auto" takes it on GPUs wherever `pallas_mlp_refusal` is None
# and the mesh keeps the MLP's weights whole, else XLA's; "xla" always XLA's.
MLP_IMPLS = ("auto", "xla", "pallas")
# model.loss_head_impl: the loss head's backward matmuls. "pallas": the logit gradient made
# in their prologue (training/head_pallas.py); "auto": that on GPUs where it applies.
LOSS_HEAD_IMPLS = ("auto", "xla", "pallas")
PALLAS_MLP_ALIGN = 16  # mlp_pallas.ALIGN: d_model and mlp_dim multiples of it.

# model.* fields that say how a run computes or regularises the model, not what the model
# is: none moves a parameter or changes what evaluation computes. A run started with
# config.init_from keeps its own value of each (training/fine_tune.py; every other model.*
# field comes from the source, bar the task keys); an import takes the "compute" ones from
# --config (interop/hf/importer.py). {field: (kind, why the run chooses it)}; docs/resume.md
# prints this table (tests/test_fine_tune.py holds the two equal).
RUN_FIELDS = {
    "attention_impl": ("compute", "the attention kernel for this run's hardware; the same "
                       "function"),
    "attention_max_segments": ("compute", "cuDNN's bound on the documents a row of this "
                               "run's batches packs"),
    "scan_layers": ("compute", "the layers' layout; init_from stacks or splits the "
                    "source's per-layer parameters to fit"),
    "remat": ("compute", "memory against recomputation in this run's backward pass"),
    "dtype": ("compute", "the compute precision of this run's hardware"),
    "param_dtype": ("compute", "the storage precision; float widths convert on load"),
    "mlp_impl": ("compute", "the MLP's kernels for this run's hardware; the same function"),
    "loss_head_impl": ("compute", "the loss head's kernels for this run's hardware; the "
                       "same function"),
    "quantization": ("compute", "the matmuls' precision on this run's hardware; its fp8 "
                     "scaling state starts fresh where the source has none"),
    "embed_dropout": ("training", "regularisation of this run's training; evaluation "
                      "has none"),
    "residual_dropout": ("training", "regularisation, as embed_dropout"),
    "attention_dropout": ("training", "regularisation, as embed_dropout"),
    "mlp_dropout": ("training", "regularisation, as embed_dropout"),
    "moe_aux_loss": ("training", "a term of this run's loss, not of the model"),
    "moe_z_loss": ("training", "a term of this run's loss, not of the model"),
    "moe_router_jitter": ("training", "noise on the router in training only"),
}
COMPUTE_FIELDS = tuple(k for k, (kind, _) in RUN_FIELDS.items() if kind == "compute")


def validate_model(config: ml_collections.ConfigDict) -> None:
  """Checks the model.* fields: each value, the topology, modern axes, MoE, then shapes.

  Args:
    config: the full experiment config (a few checks read other groups).

  Raises:
    ConfigError: naming the key, the offending value and what would be valid.
  """
  m = "model."
  check_choice(config, m + "arch", ARCHS)
  check_choice(config, m + "head", HEADS)
  check_choice(config, m + "objective", objective_lib.OBJECTIVE_NAMES)
  check_choice(config, m + "prefix_attention", objective_lib.PREFIX_ATTENTIONS)
  check_choice(config, m + "remat", tuple(REMAT_POLICIES))
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
    check_bool(config, m + key)
  never = config.model.never_predict
  if not isinstance(never, (tuple, list)) or not all(
      is_int(i) and 0 <= i and
      (config.model.vocab_size == 0 or i < config.model.vocab_size) for i in never):
    fail(m + "never_predict", never, "expected a tuple of token ids in [0, model.vocab_size)")
  check_bool(config, m + "embed_norm")
  check_choice(config, m + "attention_impl", ATTENTION_IMPLS)
  check_int(config, m + "attention_max_segments", 1)
  check_choice(config, m + "dtype", DTYPES)
  check_choice(config, m + "param_dtype", DTYPES[1:])
  check_choice(config, m + "quantization", QUANTIZATIONS)
  check_choice(config, m + "mlp_impl", MLP_IMPLS)
  check_choice(config, m + "loss_head_impl", LOSS_HEAD_IMPLS)
  if config.model.logits_bias and config.model.loss_head_impl == "pallas":
    fail(m + "loss_head_impl", "pallas", "its kernels do not make a logits bias's "
         "gradient (model.logits_bias=True); use 'auto' (XLA's head for this model) or "
         "'xla'")
  for key in ("embed_dropout", "residual_dropout", "attention_dropout", "mlp_dropout"):
    check_rate(config, m + key)
  model = config.model
  _validate_topology(model)
  modern.validate_modern_axes(config)
  moe.validate_moe(config)
  lora.validate_lora(config)
  check_positive(config, m + "norm_epsilon")
  if model.head_dim == 0 and model.d_model % model.num_heads:
    fail(m + "num_heads", model.num_heads,
          f"must divide model.d_model={model.d_model} when model.head_dim=0; "
          f"pick a divisor of {model.d_model} or set model.head_dim explicitly")
  kv_heads = model.num_kv_heads or model.num_heads
  if model.num_heads % kv_heads:
    fail(m + "num_kv_heads", model.num_kv_heads,
          f"must divide model.num_heads={model.num_heads} (0 means num_heads)")
  refusal = pallas_mlp_refusal(model) if model.mlp_impl == "pallas" else None
  if refusal:
    fail(m + "mlp_impl", "pallas", f"{refusal}; or set model.mlp_impl='auto' (XLA's MLP "
         "for this model) or 'xla'")
  kernel = attention.KERNELS.get(model.attention_impl)
  if kernel and not kernel.prefix and "prefix" in objective_lib.resolve(model).model_inputs:
    fail(m + "attention_impl", model.attention_impl,
         f"{model.attention_impl} attention cannot express a prefix LM's mask (a "
         "bidirectional prefix per row and packed segment; config/attention.py says why), "
         f"which model.objective={model.objective!r} with model.prefix_attention="
         "'bidirectional' attends through; use "
         + ", ".join(repr(n) for n, k in attention.KERNELS.items() if k.prefix)
         + " or 'auto' (xla for it), or model.prefix_attention='causal'")
  if model.attention_dropout > 0 and kernel and not kernel.dropout:
    fail(m + "attention_dropout", model.attention_dropout,
          f"model.attention_impl={model.attention_impl!r} has no dropout on attention "
          f"probabilities; set model.attention_dropout=0.0 or model.attention_impl="
          f"{[n for n, k in attention.KERNELS.items() if k.dropout]} (or 'auto', which "
          "uses one for this)")


def pallas_mlp_refusal(model, training: bool = True) -> str | None:
  """Why the Pallas MLP (model/mlp_pallas.py) cannot compute `model`'s dense MLP, as the
  fix a user makes; None when it can. `training` False: dropout is off (evaluation,
  decoding), so model.mlp_dropout does not stand in the way."""
  from transformer.config import lora as lora_config  # pylint: disable=g-import-not-at-top
  if model.quantization:
    return f"it multiplies in model.dtype, not model.quantization={model.quantization!r}"
  if model.lora_rank and set(model.lora_targets) & set(lora_config.MLP_TARGETS):
    return (f"LoRA adapters on {lora_config.MLP_TARGETS} (model.lora_targets="
            f"{tuple(model.lora_targets)}) need XLA's MLP; target the attention only")
  if training and model.mlp_dropout > 0:
    return (f"model.mlp_dropout={model.mlp_dropout} drops act(h) between its two matmuls, "
            "which its kernels never write; set it to 0.0")
  for key in ("d_model", "mlp_dim"):
    if getattr(model, key) % PALLAS_MLP_ALIGN:
      return f"model.{key}={getattr(model, key)} is not a multiple of {PALLAS_MLP_ALIGN}"
  return None


def objective_of(arch: str, head: str) -> str:
  """The name of a (topology, head) pair's objective (config/objective.py has the entry).

  Raises:
    ConfigError: for a pair no objective trains, listing the topology's heads.
  """
  return objective_lib.of(arch, head).name


def _validate_topology(model: ml_collections.ConfigDict) -> None:
  if objective_lib.resolve(model).classifies:  # One class per example: rows pooled.
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


def resolve_dtype(name: str) -> jnp.dtype:
  """Maps a dtype name to a jnp dtype; "auto" is bfloat16 on GPU/TPU, float32 on CPU."""
  if name == "auto":
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  return jnp.dtype(name)


# The model.* keys the modules never read: the MoE loss weights enter the train step's
# loss (training/), so a change to them does not make a new model (nor a new jit key).
NOT_MODEL_FIELDS = ("moe_aux_loss", "moe_z_loss")
# Fields whose type after `from_config` is not the key's: names resolved to dtypes.
_RESOLVED_TYPES = {"dtype": Any, "param_dtype": Any, "never_predict": tuple[int, ...],
                   "lora_targets": tuple[str, ...],
                   "rope_short_factor": tuple[float, ...],
                   "rope_long_factor": tuple[float, ...]}


class _ModelConfigMethods:
  """The behaviour of ModelConfig; its fields are generated below from configs/base.py."""

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict) -> "ModelConfig":
    """Builds the frozen config from `config.model`, filling the 0 = derived fields."""
    if model.vocab_size == 0:
      raise ValueError("config.model.vocab_size=0 must be resolved from the tokenizer first "
                       "(transformer.data.tokenizers.run_vocabulary.resolved_vocab_size)")
    fields = {f.name for f in dataclasses.fields(cls)} - set(MODE_FLAGS)
    values = {k: model[k] for k in fields}
    values["num_kv_heads"] = model.num_kv_heads or model.num_heads
    values["head_dim"] = model.head_dim or model.d_model // model.num_heads
    values["num_decoder_layers"] = model.num_decoder_layers or model.num_layers
    values["never_predict"] = tuple(model.never_predict)
    values["lora_targets"] = tuple(model.lora_targets)
    for key in ("rope_short_factor", "rope_long_factor"):  # Hashable, for jit.
      values[key] = tuple(float(f) for f in model[key])
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


def _fields() -> list[tuple[str, Any, dataclasses.Field]]:
  """One field per configs/base.py model key (sorted), then the mode flags (MODE_FLAGS)."""
  declared = base.get_config().model
  fields = [(key, _RESOLVED_TYPES.get(key, type(value))) for key, value in declared.items()
            if key not in NOT_MODEL_FIELDS]
  return fields + [
      ("deterministic", bool, dataclasses.field(default=False)),  # Evaluation: no dropout.
      # Autoregressive decoding: causal self-attention appends its keys and values to a
      # "cache" collection of max_len slots, slot = token position (see decoding.py).
      ("decode", bool, dataclasses.field(default=False)),
      # What the input rows may hold, as the run's input pipeline declares it (the trainer
      # sets both by replace; data/pipeline.row_layout): several documents a row, and
      # padding tokens. The defaults assume both; fused attention skips what cannot occur.
      ("rows_packed", bool, dataclasses.field(default=True)),
      ("rows_padded", bool, dataclasses.field(default=True)),
  ]


# ModelConfig's fields that are not configs/base.py keys: set by replace, never by the user.
MODE_FLAGS = ("deterministic", "decode", "rows_packed", "rows_padded")


ModelConfig = dataclasses.make_dataclass(
    "ModelConfig", _fields(), bases=(_ModelConfigMethods,), frozen=True,
    namespace={"__module__": __name__, "__doc__": "Everything the model modules read, "
               "resolved and frozen (hashable for jit); fields: configs/base.py's model.*."})
