"""The objective is one resolved object: no code outside its registry compares names.

`transformer/config/objective.py` holds one `Objective` per training objective; everything
else asks the resolved entry (`objective.sides`, `objective.classifies`, ...). These
tests keep it that way: a comparison against an objective's name anywhere else in the
package fails here, naming the file and line, and every entry's pipeline and model
inputs must exist.
"""

from __future__ import annotations

import ast
import pathlib
import re

import ml_collections
import numpy as np
import pytest

from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.data import pipeline
from transformer.model import objectives
from transformer.model.models import ARCHITECTURES

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "transformer"
REGISTRY = PACKAGE / "config" / "objective.py"
# The pattern issue 29 named, and what it misses: `objective_of(...) != "causal_lm"`.
PATTERN = re.compile(r"objective ==|objective in \(|objective !=")


def _is_pipeline(node: ast.AST) -> bool:
  """`objective.pipeline` / `pipeline`: an input pipeline's key ("lm", "mlm", ...)."""
  return (isinstance(node, ast.Attribute) and node.attr == "pipeline") or (
      isinstance(node, ast.Name) and node.id == "pipeline")


def _name_comparisons(source: str) -> list[int]:
  """Lines comparing anything with an objective's name ("seq2seq" == x; a head with
  "classification": `classifies` answers it), or a pipeline with a pipeline's key."""
  names = set(objective_lib.OBJECTIVES)
  lines = [number for number, line in enumerate(source.splitlines(), 1)
           if PATTERN.search(line)]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Compare):
      operands = [node.left, *node.comparators]
      named = names | (set(pipeline.PIPELINES) if any(map(_is_pipeline, operands)) else set())
      for operand in operands:
        elements = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [
            operand]
        if any(isinstance(e, ast.Constant) and e.value in named for e in elements):
          lines.append(node.lineno)
  return sorted(set(lines))


def test_no_objective_name_is_compared_outside_the_registry():
  found = [f"{path.relative_to(ROOT)}:{line}"
           for path in sorted(PACKAGE.rglob("*.py")) if path != REGISTRY
           for line in _name_comparisons(path.read_text(encoding="utf-8"))]
  assert not found, ("compare no objective names outside transformer/config/objective.py; ask "
                     f"the resolved Objective (objective.resolve(config.model)): {found}")


@pytest.mark.parametrize("line", [
    'if objective == "seq2seq": pass', 'sides = 2 if objective_of(a, h) != "seq2seq" else 1',
    'ok = name in ("causal_lm", "masked_lm")', 'ok = objective in (a, b)',
    'ok = config.model.objective == "classification"',
    'if model.head == "classification": pass', 'if head != "classification": pass',
    'if objective.pipeline not in ("lm", "mlm"): pass', 'ok = pipeline == "seq2seq"'])
def test_the_check_finds_a_comparison(line):
  assert _name_comparisons(
      f"a = h = name = b = objective = objective_of = model = head = pipeline = None\n{line}\n")


@pytest.mark.parametrize("line", [
    'ok = model.head == "lm"', 'ok = model.head != "mlm"', 'ok = model.arch == "decoder"'])
def test_head_structure_questions_are_not_objective_names(line):
  """The heads' own names ("lm": the plain projection, "mlm": BERT's transform and bias)
  are model choices; only "classification" is an objective's name too."""
  assert not _name_comparisons(f"model = None\n{line}\n")


def test_every_entry_has_its_pipeline_and_its_pairs_name_real_topologies():
  for entry in objective_lib.OBJECTIVES.values():
    assert entry.pipeline in pipeline.PIPELINES, entry
    assert entry.pairs and all(arch in ARCHITECTURES for arch, _ in entry.pairs), entry
    for arch, head in entry.pairs:  # A text-to-text entry as its converter makes it.
      resolved = objective_lib.of(arch, head, entry.name)
      assert resolved.sides == (2 if "decoder_inputs" in resolved.model_inputs else 1), entry
  used = {entry.pipeline for entry in objective_lib.OBJECTIVES.values()}
  assert used == set(pipeline.PIPELINES)


@pytest.mark.parametrize("arch, head, name, sides, classifies, translates, generates", [
    ("decoder", "lm", "causal_lm", 1, False, False, True),
    ("encoder", "mlm", "masked_lm", 1, False, False, False),
    ("encoder_decoder", "lm", "seq2seq", 2, False, True, False),
    ("encoder", "classification", "classification", 1, True, False, False),
    ("decoder", "classification", "classification", 1, True, False, False),
])
def test_resolve_reads_arch_and_head(arch, head, name, sides, classifies, translates,
                                     generates):
  model = ml_collections.ConfigDict({"arch": arch, "head": head, "objective": "auto",
                                     "prefix_attention": "bidirectional"})
  entry = objective_lib.resolve(model)
  assert (entry.name, entry.sides, entry.classifies, entry.translates, entry.generates) == (
      name, sides, classifies, translates, generates)
  assert entry.decodes == (generates or translates)
  assert objective_lib.get(name) is entry


def test_an_unknown_pair_names_the_topologys_heads():
  with pytest.raises(ConfigError, match=re.escape(
      "config.model.head='mlm' is invalid: model.arch='decoder' supports heads "
      "['classification', 'lm']")):
    objective_lib.of("decoder", "mlm")
  with pytest.raises(ValueError, match=r"unknown objective 'lm'; valid: \["):
    objective_lib.get("lm")


def test_the_model_side_reads_the_entry():
  """Inputs in the entry's order; the classifier scores its label, the LM its targets."""
  classifier = objective_lib.get("classification")
  batch = {key: np.full((2, 3), i) for i, key in enumerate(
      ("inputs", "segment_ids", "positions", "targets", "label", "weights"))}
  assert [int(x[0, 0]) for x in objectives.model_inputs(classifier, batch)] == [0, 1, 2]
  assert int(objectives.targets_and_weights(classifier, batch)[0][0, 0]) == 4
  assert int(objectives.targets_and_weights("causal_lm", batch)[0][0, 0]) == 3
  init = objectives.init_batch("seq2seq", 2, 5)
  assert list(init) == list(objective_lib.get("seq2seq").model_inputs)
  assert int(init["targets_segment_ids"].min()) == 1 and int(init["decoder_inputs"].max()) == 0


@pytest.mark.parametrize("name", ["span_corruption", "prefix_lm", "ul2"])
def test_a_text_to_text_objective_is_converted_onto_each_topology(name):
  """seqio's converters: the encoder-decoder reads two sides, the decoder one row with
  a prefix (none with prefix_attention='causal'); an explicit name never changes "auto"."""
  encdec = objective_lib.of("encoder_decoder", "lm", name)
  assert (encdec.name, encdec.sides, encdec.pipeline) == (name, 2, "text_to_text")
  assert encdec.model_inputs == objective_lib.get("seq2seq").model_inputs
  decoder = objective_lib.of("decoder", "lm", name)
  assert decoder.model_inputs == ("inputs", "segment_ids", "positions", "prefix")
  assert decoder.sides == 1 and decoder.generates and not decoder.classifies
  causal = objective_lib.of("decoder", "lm", name, prefix_attention="causal")
  assert causal.model_inputs == ("inputs", "segment_ids", "positions")
  assert objective_lib.of("decoder", "lm").name == "causal_lm"
  assert objective_lib.of("encoder_decoder", "lm").name == "seq2seq"


def test_an_objective_a_topology_cannot_train_is_one_line_naming_both_sides():
  with pytest.raises(ConfigError) as error:
    objective_lib.of("encoder", "mlm", "span_corruption")
  assert str(error.value) == (
      "config.model.objective='span_corruption' is invalid: model.arch='encoder' cannot "
      "train it (it trains ['masked_lm', 'classification']); span_corruption trains on "
      "model.arch ['decoder', 'encoder_decoder'].")
  with pytest.raises(ConfigError, match=r"model.arch='encoder_decoder' cannot train it \(it "
                     r"trains \['seq2seq', 'span_corruption', 'prefix_lm', 'ul2'\]\)"):
    objective_lib.of("encoder_decoder", "lm", "masked_lm")
  with pytest.raises(ConfigError, match=r"model.head='classification' is invalid: "
                     r"model.objective='prefix_lm' on model.arch='decoder' needs "
                     r"model.head='lm'"):
    objective_lib.of("decoder", "classification", "prefix_lm")
