"""What every Hugging Face family shares: reading a folder, strict accounting, the vocabulary.

`read_folder` reads config.json and the safetensors weights (never pickles). `Fields`
accounts for every config.json key (mapped, checked against the one value this
codebase implements, or listed as irrelevant) and `Tensors` for every tensor (taken,
a known buffer, or a head with no place here): anything left over stops the import,
naming it. `VocabularyMap` renumbers a vocabulary to the ids every pipeline here
assumes (pad 0, eos 1, bos 2, unk 3). The family modules (gpt2.py, bert.py,
marian.py, t5.py, llama.py, gemma.py) build a `Converted` from these.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import numpy as np
from absl import logging

from transformer.config.errors import ConfigError
from transformer.data.tokenizers import run_vocabulary
from transformer.model import fp8
from transformer.model import layers
from transformer.model import lora
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import progress

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
           "flax_model.msgpack")
ROLES = ("pad", "eos", "bos", "unk")  # Internal ids 0..3 (tokenizers.PAD_ID, ...).
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
    "begin_suppress_tokens", "tie_encoder_decoder", "is_encoder_decoder",
    # transformers' choice of key/value cache class for generate (Gemma 2 / 3: "hybrid").
    "cache_implementation"))


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
    files = _shards_of_index(hf_dir)
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
  reading = progress.Progress(f"import: reading {hf_dir}", len(files), "safetensors files")
  for name in files:
    tensors.update(load_file(os.path.join(hf_dir, name)))
    reading.update()
  reading.finish(f"{len(tensors)} tensors")
  return config, tensors


def _shards_of_index(hf_dir: str) -> list[str]:
  """The shard files model.safetensors.index.json names; ConfigError if one is missing."""
  index = os.path.join(hf_dir, SAFETENSORS_INDEX)
  with open(index, encoding="utf-8") as f:
    try:
      weight_map = json.load(f)["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
      raise ConfigError(f"{index} is not a safetensors index (a JSON object with a "
                        f"'weight_map'): {type(e).__name__}: {e}; download it again") from None
  names = sorted(set(weight_map.values()))
  missing = [n for n in names if not os.path.isfile(os.path.join(hf_dir, n))]
  if missing:
    raise ConfigError(f"{index} names {len(missing)} shard file(s) that {hf_dir} does not "
                      f"have: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
                      "download the missing shards (or the whole folder) again")
  return names


class Fields:
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


class Tensors:
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

  def split(self, name: str, parts: list[tuple[str, int]]) -> None:
    """Replaces the fused tensor `name` by its row blocks, each (name, rows) in order
    (Phi-3's qkv_proj and gate_up_proj); each part is then taken like any tensor."""
    if name not in self._tensors:
      raise ConfigError(f"{self.where} has no tensor {name!r}, which this model needs")
    value = self._tensors[name]
    if sum(rows for _, rows in parts) != value.shape[0]:
      raise ConfigError(f"{self.where}: {name!r} has {value.shape[0]} rows; the config "
                        f"makes {' + '.join(f'{rows} ({part})' for part, rows in parts)}")
    self._taken.add(name)
    start = 0
    for part, rows in parts:
      self._tensors[part] = value[start:start + rows]
      start += rows

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


def activation(fields: Fields, key: str, default: str) -> str:
  names = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
           "gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu"}
  value = fields.require(key, default, tuple(names), "the MLP activation")
  return names[value]


def attention_dropout(rate: float) -> dict[str, Any]:
  """Attention-probability dropout exists only in the einsum reference attention here."""
  return {"attention_dropout": float(rate),
          **({"attention_impl": "einsum"} if rate > 0 else {})}


# ---------------------------------------------------------------- the vocabulary


@dataclasses.dataclass(frozen=True)
class VocabularyMap:
  """Which source row each internal id holds (see data/tokenizers/hf_vocab.py)."""

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


def export_inputs(workdir: str, run: Any) -> tuple[dict, dict | None, VocabularyMap]:
  """What every exporter starts from: a loaded run's parameters, bundle and vocabulary map.

  Args:
    workdir: the run's workdir (its tokenizer bundle, if imported, lies there).
    run: `inference.loaded.load_run(workdir, ...)`.

  Returns:
    (parameters as unrolled float32 NumPy arrays, LoRA adapters merged into their
    kernels (model/lora.py), the imported tokenizer bundle or None
    for a vocabulary trained here, the map from internal ids to source rows: the
    identity without a bundle).
  """
  # model.quantization="fp8": its scaling state is no weight of the exported model.
  params = jax.tree.map(lambda x: np.asarray(jax.device_get(x), np.float32),
                        fp8.split_state(run.params)[0])
  if run.config.model.lora_rank:  # A LoRA run exports merged: kernel + alpha / r * A . B.
    params = lora.merge(params, run.config.model)
  if run.config.model.scan_layers:
    params = layers.scanned_to_unrolled(params)
  bundle_path = os.path.join(workdir, layout.HF_TOKENIZER)
  if not os.path.isfile(bundle_path):
    size = run.config.model.vocab_size
    return params, None, VocabularyMap(size, tuple(range(size)), ())
  with open(bundle_path, encoding="utf-8") as f:
    bundle = json.load(f)
  return params, bundle, VocabularyMap(bundle["hf_vocab_size"],
                                       tuple(bundle["internal_to_hf"]), tuple(bundle["added"]))


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


# ---------------------------------------------------------------- what a family returns


@dataclasses.dataclass
class Converted:
  """A folder as this codebase's model: config.model fields, parameters, vocabulary."""

  family: str
  model: dict[str, Any]  # config.model fields.
  params: dict[str, Any]  # Nested dicts of float32 numpy arrays, unrolled blocks.
  vocabulary: VocabularyMap
  mask: int | None = None  # Internal id of the mask token.
  decode: dict[str, Any] = dataclasses.field(default_factory=dict)  # decode.* fields.


def split_heads(kernel_EX: np.ndarray, heads: int) -> np.ndarray:
  """[E, H * D] -> [E, H, D] (the query/key/value kernels' full-rank layout)."""
  return kernel_EX.reshape(kernel_EX.shape[0], heads, -1)


def attention_params(q, k, v, out, heads: int) -> dict[str, Any]:
  """(kernel [E, H*D] as in x @ W, bias or None) pairs -> this codebase's attention params."""
  params = {}
  for name, (kernel, bias) in (("query", q), ("key", k), ("value", v)):
    params[name] = {"kernel": split_heads(kernel, heads)}
    if bias is not None:
      params[name]["bias"] = bias.reshape(heads, -1)
  kernel, bias = out
  params["out"] = {"kernel": kernel.reshape(heads, -1, kernel.shape[-1])}
  if bias is not None:
    params["out"]["bias"] = bias
  return params


def expert_params(t: Tensors, count: int, name: Callable[[int, str], str],
                  projections: dict[str, str]) -> dict[str, Any]:
  """A MoE layer's routed experts: each expert's torch weight [out, in], transposed and
  stacked as this codebase's `experts/<ours>/kernel` [experts, in, out].

  Args:
    count: the number of experts.
    name: (expert, the folder's projection name) -> the tensor's name.
    projections: ours ("wi", "wi_gate", "wo") -> the folder's projection name.
  """
  return {ours: {"kernel": np.stack([t.take(name(e, hf)).T for e in range(count)])}
          for ours, hf in projections.items()}


def moe_layer_fields(where: str, sparse: dict[str, list[bool]], source: str) -> dict[str, Any]:
  """Which layers are MoE, as model.mlp / moe_every / moe_offset.

  Args:
    where: config.json's path, for the error.
    sparse: each stack's (e.g. "decoder") per-layer flags, as the folder's code sets them.
    source: the config.json keys that set them, for the error.

  Raises:
    ConfigError: the flags are no `index % moe_every == moe_offset` pattern shared by
      every stack.
  """
  flags = [f for stack in sparse.values() for f in stack]
  if not any(flags):
    return {"mlp": "dense"}
  longest = max(len(stack) for stack in sparse.values())
  for every in range(1, longest + 1):
    for offset in range(every):
      if all(stack == [i % every == offset for i in range(len(stack))]
             for stack in sparse.values()):
        return {"mlp": "moe", "moe_every": every, "moe_offset": offset}
  layers = {k: [i for i, f in enumerate(v) if f] for k, v in sparse.items()}
  raise ConfigError(f"{where}: {source} make layers {layers} sparse, which is no "
                    "pattern of this codebase (the MoE layers of every stack are those "
                    "with index % model.moe_every == model.moe_offset)")


def norm(t: Tensors, name: str) -> dict[str, np.ndarray]:
  return {"scale": t.take(f"{name}.weight"), "bias": t.take(f"{name}.bias")}


def linear(t: Tensors, name: str) -> tuple[np.ndarray, np.ndarray]:
  """torch.nn.Linear ([out, in] weight) -> (kernel [in, out], bias)."""
  return t.take(f"{name}.weight").T, t.take(f"{name}.bias")


def dense(pair: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
  return {"kernel": pair[0], "bias": pair[1]}


def folder_files(hf_dir: str) -> dict[str, str]:
  """{file name: path} of a folder's files."""
  return {n: os.path.join(hf_dir, n) for n in sorted(os.listdir(hf_dir))}


def empty_directory(path: str, flag: str) -> str:
  """`path` made absolute; process 0 checks that it is new or empty (nothing is overwritten).

  Nothing is created: the folder is written through `files.complete_or_absent`.
  """
  target = os.path.abspath(path)
  if jax.process_index() == 0:
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
      raise ConfigError(f"{flag}={path!r} exists and is not an empty directory; choose a "
                        "new one (nothing is overwritten)")
  return target


HF_TOKENIZER_FILE = "tokenizer.json"  # A `tokenizers` tokenizer, as transformers reads it.
# What transformers reads beside it: the tokenizer's class and special tokens, and
# generate()'s defaults (without it: no end-of-sequence id, at most 20 tokens).
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def generation_config(hf_config: dict[str, Any], max_len: int) -> dict[str, Any]:
  """generation_config.json: config.json's bos / eos / pad ids (those it has) and the
  model's context as max_length, as transformers' GenerationConfig reads them."""
  return {**{k: hf_config[k] for k in _SPECIAL_IDS if hf_config.get(k) is not None},
          "max_length": int(max_len)}


def tokenizer_config(bundle: dict[str, Any], hf_config: dict[str, Any],
                     max_len: int) -> dict[str, Any]:
  """tokenizer_config.json for the exported tokenizer.json: transformers'
  PreTrainedTokenizerFast (which takes tokenizer.json's own pre- and post-processing as
  they are) with the special tokens of config.json's ids, unk the vocabulary's own
  (a role the source vocabulary lacked has none), and the context as model_max_length."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  tokenizer = tokenizers.Tokenizer.from_str(json.dumps(bundle["tokenizer_json"]))
  unk = ROLES.index("unk")
  ids = {f"{key.removesuffix('_token_id')}_token": hf_config.get(key) for key in _SPECIAL_IDS}
  ids["unk_token"] = (None if unk in bundle["added"] else bundle["internal_to_hf"][unk])
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(max_len),
            "clean_up_tokenization_spaces": False}
  for key, hf_id in ids.items():
    token = None if hf_id is None else tokenizer.id_to_token(int(hf_id))
    if token is not None:
      config[key] = token
  return config


def write_folder(hf_dir: str, tensors: dict[str, np.ndarray], hf_config: dict[str, Any],
                 bundle: dict[str, Any] | None, run: Any, family: str) -> str:
  """Writes an exported model: model.safetensors, config.json, generation_config.json
  and, when the run has one, tokenizer.json with its tokenizer_config.json; returns the
  folder. One way for every family.

  Every file goes through the one atomic write: whole files, readable by everyone
  (0644), as safetensors' own save_file (0600 temporary files) would not leave them;
  the folder through `files.complete_or_absent`: all of it or none. A
  run without a Hugging Face tokenizer (its vocabulary was trained here) exports the
  weights alone, with a warning that says why.

  Args:
    hf_dir: the folder to write; must not exist or be empty.
    tensors: Hugging Face tensor names -> float32 arrays.
    hf_config: the folder's config.json.
    bundle: the run's hf_tokenizer.json contents, or None.
    run: the inference.loaded.LoadedRun exported (for messages and its tokenizer kind).
    family: the family's name, for the closing line.
  """
  target = empty_directory(hf_dir, "--hf_dir")
  if jax.process_index() != 0:
    return target
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
  has_tokenizer = bool(bundle and bundle.get("tokenizer_json") is not None)
  # Complete or absent: a full disk leaves no empty or partial --hf_dir behind.
  with files.complete_or_absent(target, "--hf_dir") as partial, \
      progress.stage(f"export: writing {len(tensors)} tensors to {target}"):
    files.write_atomically(os.path.join(partial, SAFETENSORS),
                           save({k: np.ascontiguousarray(v, np.float32)
                                 for k, v in tensors.items()}, metadata={"format": "pt"}))
    files.write_atomically(os.path.join(partial, CONFIG), json.dumps(hf_config, indent=2))
    max_len = run.config.model.max_len
    files.write_atomically(os.path.join(partial, GENERATION_CONFIG),
                           json.dumps(generation_config(hf_config, max_len), indent=2))
    if has_tokenizer:
      files.write_atomically(os.path.join(partial, HF_TOKENIZER_FILE),
                             json.dumps(bundle["tokenizer_json"]))
      files.write_atomically(os.path.join(partial, TOKENIZER_CONFIG), json.dumps(
          tokenizer_config(bundle, hf_config, max_len), indent=2))
  print(f"Exported {run.checkpoint_label()} of {run.workdir} to {target} ({family})",
        flush=True)
  if not has_tokenizer:
    kind = run_vocabulary.tokenizer_kind(run.tokenizer)
    why = (f"its {kind} vocabulary was trained here and has no Hugging Face "
           "tokenizer.json form that this export writes" if kind != "huggingface" else
           "the folder it was imported from had no tokenizer.json")
    logging.warning("NO TOKENIZER EXPORTED: %s has no %s because %s. The weights load, "
                    "but text cannot be encoded with this folder alone (re-importing it "
                    "gives a model that cannot generate from text); encode with the run "
                    "itself (--mode=generate --workdir=%s)", target, HF_TOKENIZER_FILE, why,
                    run.workdir)
  return target
