"""--mode=import: a local Hugging Face folder --hf_dir -> a new --workdir that the other
modes and config.init_from read (interop/hf/importer.py: any family of importer.FAMILIES).

MODEL_TYPES is the list launch.py's --help and docs/huggingface.md print (a test holds
the docs to it).
"""

from __future__ import annotations

import ml_collections
from absl import app

from transformer.cli import common
from transformer.interop.hf import importer

STARTS_JAX = True
# The config.json model_types an import reads, from the family table itself.
MODEL_TYPES = ", ".join(importer.FAMILIES)
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("hf_dir",)


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=import; --config, when given, supplies data.*, decode.*, mesh.*."""
  if not common.HF_DIR.value:
    raise app.UsageError("--mode=import needs --hf_dir=DIR, the Hugging Face folder")
  importer.import_folder(common.HF_DIR.value, workdir, config)
