"""--mode=import's library: a local Hugging Face folder -> a workdir the other modes read.

`import_folder` reads a folder as `save_pretrained` writes it and the hub serves it
(config.json + model.safetensors, PyTorch tensor names), lets the family module of its
`model_type` map every field and tensor (FAMILIES below; the strict accounting is in
common.py), and writes a workdir that --mode=generate / translate / evaluate and
config.init_from read: config.json, the tokenizer (data/tokenizers/hf_vocab.py) and
checkpoints/0/state holding only the parameters (as --mode=average writes).
Export is per family (gpt2.py's `export_gpt2`, llama.py's `export_llama`; cli/hf_export.py
picks by the model's shape).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from configs import base
from transformer import distributed
from transformer import sharding
from transformer.config import model as model_config
from transformer.config.errors import ConfigError
from transformer.config.validation import validate
from transformer.data import run_data
from transformer.data import sources
from transformer.data.tokenizers import hf_vocab
from transformer.data.tokenizers import run_vocabulary
from transformer.inference import loaded
from transformer.interop.hf import bert
from transformer.interop.hf import common
from transformer.interop.hf import gemma
from transformer.interop.hf import gpt2
from transformer.interop.hf import llama
from transformer.interop.hf import marian
from transformer.interop.hf import mixtral
from transformer.interop.hf import phi3
from transformer.interop.hf import t5
from transformer.model import fp8
from transformer.model import layers
from transformer.workdir import checkpointing
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import progress

# The model fields an import takes from --config (how to run it), not from the folder:
# config/model.py's RUN_FIELDS of kind "compute" (scan_layers, remat, dtypes, the kernel).
RUNTIME_FIELDS = model_config.COMPUTE_FIELDS
# config.json's model_type -> the module that maps that family.
FAMILIES = {"gpt2": gpt2, "bert": bert, "marian": marian, "t5": t5, "mt5": t5,
            "llama": llama, "mistral": llama, "qwen2": llama, "qwen3": llama,
            "gemma": gemma, "gemma2": gemma, "gemma3_text": gemma,
            "mixtral": mixtral, "qwen2_moe": mixtral, "switch_transformers": t5,
            "phi3": phi3}


def _family(config: dict[str, Any], where: str) -> Any:
  """The module that maps config.json's model_type."""
  family = config.get("model_type")
  if family not in FAMILIES:
    raise ConfigError(f"{where}: model_type={family!r} is not supported; this codebase "
                      f"imports {', '.join(repr(f) for f in FAMILIES)} folders")
  return FAMILIES[family]


def convert_folder(hf_dir: str) -> common.Converted:
  """Reads and maps a folder: config.model fields, parameters and vocabulary (no writing).

  Raises:
    ConfigError: an unsupported family, field value or tensor, a missing tensor, or
      a folder without safetensors.
  """
  config, tensors = common.read_folder(hf_dir)
  where = os.path.join(hf_dir, common.CONFIG)
  family = _family(config, where)
  fields = common.Fields(config, where)
  fields.get("model_type")
  t = common.Tensors(tensors, os.path.join(hf_dir, common.SAFETENSORS), family.PREFIXES)
  converted = family.convert(fields, t, common.folder_files(hf_dir))
  t.finish()
  fields.finish()
  return converted


# ---------------------------------------------------------------- writing a workdir


def imported_config(converted: common.Converted,
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


def tokenizer_bundle(converted: common.Converted, hf_dir: str) -> dict[str, Any]:
  """The hf_tokenizer.json contents: the vocabulary map and the folder's tokenizer."""
  bundle = {"family": converted.family, "hf_vocab_size": converted.vocabulary.hf_vocab_size,
            "internal_to_hf": list(converted.vocabulary.internal_to_hf),
            "added": list(converted.vocabulary.added), "mask": converted.mask,
            "tokenizer_json": None, "sentencepiece": None}
  files = hf_vocab.bundle_from_folder(common.folder_files(hf_dir))
  if files is None:
    logging.warning("%s has no tokenizer.json (nor Marian's source.spm, target.spm and "
                    "vocab.json): the model imports, but text cannot be encoded", hf_dir)
  else:
    bundle.update(files)
  return bundle


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
  with progress.stage(f"import: reading and mapping {hf_dir}"):
    converted = convert_folder(hf_dir)
  run_config = imported_config(converted, config)
  target = common.empty_directory(workdir, "--workdir")
  params = converted.params
  if run_config.model.scan_layers:
    params = layers.unrolled_to_scanned(params)
  abstract = loaded.abstract_params(run_config, sharding.make_mesh(run_config.mesh))
  # model.quantization="fp8": the scaling state no Hugging Face model has starts fresh.
  params = fp8.with_initial_state(params, abstract)
  _check_tree(params, abstract)
  placed = jax.tree.map(lambda a, s: jax.device_put(a.astype(s.dtype), s.sharding),
                        params, abstract)
  writer = jax.process_index() == 0
  # Complete or absent: a failure (a full disk, Ctrl-C) leaves no partial --workdir.
  with files.complete_or_absent(target, "--workdir", writer=writer,
                                barrier=distributed.barrier) as partial, \
      progress.stage(f"import: writing {target}"):
    if writer:
      files.write_atomically(os.path.join(partial, layout.CONFIG),
                             run_config.to_json_best_effort(indent=2))
      files.write_atomically(os.path.join(partial, layout.HF_TOKENIZER),
                             json.dumps(tokenizer_bundle(converted, hf_dir)))
      tokenizer = hf_vocab.HFTokenizer(os.path.join(partial, layout.HF_TOKENIZER))
      run_vocabulary.save_tokenizer(partial, tokenizer)
      # No data, but the tokenizer's identity: every later use of the import checks
      # tokenizer.json against it (run_vocabulary._check_against_run).
      sources.save_dataset_record(partial, {run_data.TOKENIZER:
                                            run_vocabulary.tokenizer_identity(tokenizer)})
    checkpoints = os.path.join(partial, layout.CHECKPOINTS)
    with files.disk_errors_as_oserror(checkpoints, "--workdir"):
      checkpointing.save_params(checkpoints, 0, placed)
  path = os.path.join(target, layout.CHECKPOINTS, "0")
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
