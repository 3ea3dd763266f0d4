"""Validation of the mixture-of-experts fields, model.mlp="moe" (docs/configuration.md).

`validate_moe` is a step of `model.validate_model`, `validate_expert_mesh` one of
`validation.validate` (after the mesh is checked); model/moe.py implements what
they allow, its `ROUTERS` table the names MOE_ROUTERS lists.
"""

from __future__ import annotations

import ml_collections

from transformer.config.checks import (check_bool, check_choice, check_float, check_int,
                                       check_rate, is_number)
from transformer.config.errors import fail

MLPS = ("dense", "moe")
MOE_ROUTERS = ("softmax", "sigmoid")  # model/moe.py's ROUTERS (tests/test_config_registries.py).
MOE_DISPATCHES = ("dropless", "capacity")


def validate_moe(config: ml_collections.ConfigDict) -> None:
  """The mixture-of-experts fields (mlp="moe"): each value, then the layer pattern."""
  m, model = "model.", config.model
  check_choice(config, m + "mlp", MLPS)
  check_choice(config, m + "moe_router", MOE_ROUTERS)
  check_choice(config, m + "moe_dispatch", MOE_DISPATCHES)
  for key in ("num_experts", "experts_per_token", "moe_every"):
    check_int(config, m + key, 1)
  for key in ("moe_mlp_dim", "moe_shared_mlp_dim", "moe_offset"):
    check_int(config, m + key, 0)
  for key in ("moe_renormalize", "moe_shared_gate"):
    check_bool(config, m + key)
  for key in ("moe_aux_loss", "moe_z_loss"):
    check_float(config, m + key, 0.0)
  check_rate(config, m + "moe_router_jitter")
  factor = model.moe_capacity_factor
  if not is_number(factor) or not factor > 0:
    fail(m + "moe_capacity_factor", factor, "expected a float > 0 (tokens an expert takes, "
          "as a multiple of its even share)")
  if model.experts_per_token > model.num_experts:
    fail(m + "experts_per_token", model.experts_per_token,
          f"expected at most model.num_experts={model.num_experts}")
  if model.moe_shared_gate and not model.moe_shared_mlp_dim:
    fail(m + "moe_shared_gate", True, "gates the shared expert: set "
          "model.moe_shared_mlp_dim > 0")
  if model.moe_offset >= model.moe_every:
    fail(m + "moe_offset", model.moe_offset, f"selects no layer: MoE layers are those with "
          f"index % model.moe_every == model.moe_offset, so expected < moe_every="
          f"{model.moe_every}")
  if model.mlp != "moe":
    return
  if model.num_experts > 1 and model.experts_per_token == 1 and model.moe_renormalize:
    # The one chosen weight divided by itself is 1 for every token, so the main loss
    # sends the router no gradient (only the auxiliary losses train it): an error, not a
    # warning, since nothing a run wants needs it (Switch multiplies by the probability).
    fail(m + "moe_renormalize", True, "with model.experts_per_token=1 the chosen expert's "
         "weight is always 1 and the router learns nothing from the loss; set "
         "model.moe_renormalize=False (Switch: the output times the router probability) "
         "or experts_per_token >= 2")
  depths = {"model.num_layers": model.num_layers}
  if model.arch == "encoder_decoder":
    depths["model.num_decoder_layers"] = model.num_decoder_layers or model.num_layers
  for key, depth in depths.items():
    if depth <= model.moe_offset:
      fail(m + "moe_offset", model.moe_offset, f"selects no layer of the {depth} of "
            f"{key}; expected < {depth}")
    if model.scan_layers and depth % model.moe_every:
      fail(m + "moe_every", model.moe_every, f"with model.scan_layers=True the scan runs "
            f"over groups of moe_every layers, so it must divide {key}={depth}; pick a "
            "divisor or set model.scan_layers=False")


def validate_expert_mesh(config: ml_collections.ConfigDict) -> None:
  """num_experts splits evenly over the mesh axes the "expert" rule names (fixed sizes)."""
  if config.model.mlp != "moe":
    return
  sizes = dict(config.mesh.shape)
  for logical, mesh_axes in config.mesh.rules:
    if logical != "expert":
      continue
    targets = mesh_axes if isinstance(mesh_axes, (tuple, list)) else (mesh_axes,)
    ways = 1
    for target in targets:
      ways *= max(sizes.get(target, 1), 1)  # -1 (the remaining devices) is checked by JAX.
    if config.model.num_experts % ways:
      fail("model.num_experts", config.model.num_experts,
            f"must divide evenly over the {ways} devices of mesh axes {tuple(targets)} "
            "that mesh.rules maps 'expert' to")
