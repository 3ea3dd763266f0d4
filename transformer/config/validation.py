"""`validate(config)`: every group's checks, in the order their errors are reported.

The first problem raises, so the order is part of the behaviour: the model first
(data, decode and the evaluation hooks read it), the mesh last (the expert split
reads the checked mesh.shape).
"""

from __future__ import annotations

import ml_collections

from transformer.config import data
from transformer.config import decode
from transformer.config import mesh
from transformer.config import model
from transformer.config import moe
from transformer.config import train


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks every field and cross-field constraint; raises ConfigError on the first problem.

  Runs before anything touches data or compiles, so a wrong value fails in seconds
  with a message that names the key, the value and what would be valid.

  Args:
    config: the full experiment config (see configs/base.py).

  Raises:
    ConfigError: naming the key, the offending value and what would be valid.
  """
  model.validate_model(config)
  data.validate_data(config)
  decode.validate_decode(config)
  train.validate_evaluation_hooks(config)
  train.validate_optimizer(config)
  train.validate_train(config)
  mesh.validate_mesh(config)
  mesh.validate_context(config)
  moe.validate_expert_mesh(config)
