"""Validation of the LoRA fields, model.lora_* (docs/configuration.md "LoRA").

`validate_lora` is a step of `model.validate_model`. LORA_TARGETS are the names of the
projections model/attention.py and model/mlp.py give an adapter (their parameter
modules' names, the checkpoint paths); model/lora.py implements the adapter.
"""

from __future__ import annotations

import ml_collections

from transformer.config.checks import check_int, check_positive, check_rate
from transformer.config.errors import fail

# Attention's four projections, then the MLP's input ("wi", with "wi_gate" beside it
# when the activation is gated) and output.
LORA_TARGETS = ("query", "key", "value", "out", "wi", "wo")
MLP_TARGETS = ("wi", "wo")


def validate_lora(config: ml_collections.ConfigDict) -> None:
  """model.lora_rank, lora_targets, lora_alpha, lora_dropout; checked whether on or off."""
  m, model = "model.", config.model
  check_int(config, m + "lora_rank", 0)
  check_positive(config, m + "lora_alpha")
  check_rate(config, m + "lora_dropout")
  targets = model.lora_targets
  if (not isinstance(targets, (tuple, list)) or not targets
      or not all(isinstance(t, str) and t in LORA_TARGETS for t in targets)
      or len(set(targets)) != len(targets)):
    fail(m + "lora_targets", targets, f"expected a non-empty tuple of distinct names "
         f"from {LORA_TARGETS}")
  if model.lora_rank and model.mlp == "moe" and set(targets) & set(MLP_TARGETS):
    fail(m + "lora_targets", tuple(targets), "adapters on the MLP projections "
         f"{MLP_TARGETS} are not built for model.mlp='moe' (its experts); target the "
         "attention projections only, e.g. ('query', 'key', 'value', 'out')")
