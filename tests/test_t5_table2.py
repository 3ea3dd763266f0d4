"""configs/t5_table2.py and its sweep file: T5 Table 2's six arms validate as one sweep,
each the topology and objective the docstring's table names, all reading the same
token positions a row."""

from configs import t5_table2
from transformer.cli import sweep_spec
from transformer.config import objective as objective_lib

# (model.arch, objective, whether the decoder reads a bidirectional prefix)
ARMS = [("encoder_decoder", "span_corruption", False), ("encoder_decoder", "prefix_lm", False),
        ("decoder", "span_corruption", False), ("decoder", "causal_lm", False),
        ("decoder", "span_corruption", True), ("decoder", "prefix_lm", True)]


def test_the_six_arms_are_one_sweep_of_equal_tokens():
  config = t5_table2.get_config()
  config.data.path = "input.txt"  # Validation reads no file.
  arms = sweep_spec.build_runs(config, "configs/t5_table2.json")
  seen = []
  for arm in arms:
    objective = objective_lib.resolve(arm.config.model)
    seen.append((arm.config.model.arch, objective.name, "prefix" in objective.model_inputs))
    assert objective.sides * arm.config.data.seq_len == 128, arm.label
    assert arm.config.model.num_layers == 4 and arm.config.model.position == "relative"
    if arm.config.model.arch == "encoder_decoder":  # L + L layers: 2P.
      assert arm.config.model.num_decoder_layers == 4
  assert seen == ARMS
  assert len({arm.name for arm in arms}) == 6
