"""--mode=export: --workdir's decoder -> a Hugging Face folder --hf_dir, in the first family
its shape fits (interop/hf/gpt2.py, interop/hf/llama.py).

GPT-2, or the Llama family (Llama, Qwen2, Qwen3, Mistral)."""

from __future__ import annotations

import os

import ml_collections
from absl import app

from transformer.cli import common
from transformer.config.errors import ConfigError
from transformer.inference import loaded
from transformer.interop.hf import gpt2
from transformer.interop.hf import llama

STARTS_JAX = True
# The model_types an export writes, in the order export tries them (launch.py's --help
# and docs/huggingface.md print this list).
MODEL_TYPES = ", ".join(("gpt2", *llama.EXPORT_MODEL_TYPES))
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("hf_dir", "checkpoint_step")


def export(workdir: str, hf_dir: str, *, checkpoint_step: int | None = None) -> str:
  """Exports through the family whose folder can express the run's model.

  Raises:
    ConfigError: naming, for each family, the first field it cannot express.
  """
  model = loaded.load_config(workdir).model
  gpt2_problem, llama_problem = gpt2.gpt2_shape_problem(model), llama.llama_shape_problem(model)
  if not gpt2_problem:
    return gpt2.export_gpt2(workdir, hf_dir, checkpoint_step=checkpoint_step)
  if not llama_problem:
    return llama.export_llama(workdir, hf_dir, checkpoint_step=checkpoint_step)
  raise ConfigError(f"{os.path.join(workdir, 'config.json')}: no exportable family fits "
                    f"this model: GPT-2: {gpt2_problem}; Llama: {llama_problem}")


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=export (--config is not used)."""
  del config
  if not common.HF_DIR.value:
    raise app.UsageError("--mode=export needs --hf_dir=DIR, the Hugging Face folder")
  export(workdir, common.HF_DIR.value, checkpoint_step=common.CHECKPOINT_STEP.value)
