"""Golden training values: one and ten steps of a fixed tiny model in each topology.

This guards refactors (moving files, splitting modules, renaming internals): a change
that is meant to leave behaviour alone must leave every number here alone. The values
are the loss, gradient norm and parameter norm that `train_step` reports after step 1
and step 10, and two checksums of the parameters after step 10, recorded with jax 0.10.2
on CPU, one device, float32.

If a value moves:
  * and you meant to change nothing (a refactor): the change is not behaviour-neutral;
    find the difference, do not update the numbers;
  * and you changed the model, initialisation, loss, optimizer or schedule on purpose:
    update the numbers in the same commit and say in its message what moved and why;
  * and only after a JAX/XLA upgrade: the tolerance allows float32 reordering; a larger
    move needs a look before the numbers are re-recorded.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from transformer import sharding
from transformer.config.model import objective_of
from transformer.model import objectives
from transformer.training.trainer import Trainer

# arch -> (head, [(loss, grad_norm, param_norm) after steps 1 and 10], (sum, sum of |p|)).
GOLDEN = {
    "decoder": ("lm", [(5.967378, 0.951698, 13.026247), (5.323616, 0.554695, 13.303766)],
                (160.176271, 692.346062)),
    "encoder": ("mlm", [(5.960418, 0.971995, 14.213770), (5.358963, 0.739522, 14.391571)],
                (189.173198, 721.003077)),
    "encoder_decoder": ("lm", [(5.957170, 1.196418, 20.148800), (5.347941, 0.881932, 20.362276)],
                        (396.710284, 1474.664822)),
}


def _batch(objective: str, b: int, l: int) -> dict[str, np.ndarray]:
  """A fixed random batch with every field the objective reads."""
  rng = np.random.default_rng(0)
  batch = {key: value for key, value in objectives.init_batch(objective, b, l).items()}
  for key in batch:
    if key.endswith("positions"):
      batch[key] = np.broadcast_to(np.arange(l, dtype=np.int32), (b, l)).copy()
    elif not key.endswith("segment_ids"):
      batch[key] = rng.integers(4, 260, (b, l), dtype=np.int32)
  batch["targets"] = rng.integers(4, 260, (b, l), dtype=np.int32)
  batch["weights"] = np.ones((b, l), np.float32)
  return batch


@pytest.mark.parametrize("arch", list(GOLDEN))
def test_golden_steps(arch, tiny_config):
  head, expected_steps, expected_sums = GOLDEN[arch]
  tiny_config.model.update(arch=arch, head=head)
  tiny_config.optimizer.label_smoothing = 0.0
  trainer = Trainer.create(tiny_config, sharding.make_mesh(tiny_config.mesh, jax.devices()[:1]))
  batch = _batch(objective_of(arch, head), 8, 32)
  seen = []
  with trainer.context():
    state = trainer.init(jax.random.PRNGKey(0))
    for step in range(1, 11):
      state, metrics = trainer.train_step(state, trainer.global_batch(batch))
      if step in (1, 10):
        metrics = jax.device_get(metrics)
        seen.append((float(metrics["loss_sum"] / metrics["weight_sum"]),
                     float(metrics["grad_norm"]), float(metrics["param_norm"])))
    leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(state.params))]
  sums = (sum(float(x.sum()) for x in leaves), sum(float(np.abs(x).sum()) for x in leaves))
  print(arch, seen, sums)  # What to paste into GOLDEN after an intended change.
  np.testing.assert_allclose(seen, expected_steps, rtol=2e-4,
                             err_msg=f"{arch}: see this file's docstring before updating")
  np.testing.assert_allclose(sums, expected_sums, rtol=2e-4, atol=1e-2,
                             err_msg=f"{arch}: see this file's docstring before updating")
