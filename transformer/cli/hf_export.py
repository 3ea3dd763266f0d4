"""--mode=export: --workdir's GPT-2-shaped decoder -> a Hugging Face folder --hf_dir
(interop/hf/gpt2.py)."""

from __future__ import annotations

import ml_collections
from absl import app

from transformer.cli import common
from transformer.interop.hf import gpt2

STARTS_JAX = True


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=export (--config is not used)."""
  del config
  if not common.HF_DIR.value:
    raise app.UsageError("--mode=export needs --hf_dir=DIR, the Hugging Face folder")
  gpt2.export_gpt2(workdir, common.HF_DIR.value, checkpoint_step=common.CHECKPOINT_STEP.value)
