"""data.mixture: several prepared corpora, mixed by weight into one stream of rows.

  --config.data.name=corpus --config.data.mixture=web:0.7:/data/fineweb,code:0.3:/data/stack

Each component is a prepared corpus (docs/corpus.md) read exactly as `data.path` alone
would be (packed rows with segment ids, or random windows; this process's share); the
rows of the components are then interleaved by grain's own `IterDataset.mix`, keyed by
the components' names. Why grain's and not a hand-written sampler:
  - it is deterministic: the component of the k-th row is a function of k and the
    weights alone (no random draw), so every process and every rerun agrees;
  - its iterator state holds the mixture's position and each component's own position,
    so the checkpointed data state (prefetch.CallBatches saves it) resumes the mixture
    exactly, as it resumes a single corpus;
  - the realised proportions after n rows follow from n and the weights (`row_counts`),
    so they are logged without counting anything at run time.
The mixture is of rows, so the weights are shares of *tokens* (packed rows are full).
A component that runs out repeats (training repeats every split, each epoch reshuffled):
a small corpus with a large weight is seen more often, as the weights ask.

Every component is tokenized with one tokenizer: the first component's (bytes, a
vocabulary trained on its sample, or init_from's); `--mode=prepare` prepares each
component with it. Evaluation mixes the validation splits by the same weights and ends
when the first of them is exhausted.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import grain
import ml_collections
import numpy as np
from absl import logging

from transformer.config.data import parse_mixture
from transformer.data.corpus import for_config

# Metric keys of the realised proportions: mixture_<component name>.
METRIC_PREFIX = "mixture_"
# grain.IterDataset.mix turns weights into integer proportions by scaling the smallest
# to this (grain/_src/python/dataset/transformations/mix.py, _float_to_int_proportions);
# row_counts must use the same integers to give the rows grain actually chose
# (test_mixture.py holds the two equal).
_GRAIN_SCALE_MIN_TO = 100


@dataclasses.dataclass(frozen=True)
class Component:
  """One corpus of a mixture."""
  name: str
  weight: float
  path: str


def components(config: ml_collections.ConfigDict) -> tuple[Component, ...]:
  """data.mixture's components in order; () without a mixture."""
  if not config.data.mixture:
    return ()
  return tuple(Component(*fields) for fields in parse_mixture(config.data.mixture))


def component_configs(config: ml_collections.ConfigDict) -> list[ml_collections.ConfigDict]:
  """One config per corpus to prepare or read: data.path set to each component's path
  (the config itself without a mixture)."""
  if not config.data.mixture:
    return [config]
  out = []
  for component in components(config):
    one = ml_collections.ConfigDict(config.to_dict())
    one.data.update(path=component.path, mixture="")
    out.append(one)
  return out


class MixtureSplit:
  """One split of every component: what the input pipeline mixes (`mix_rows`)."""

  def __init__(self, name: str, splits: dict[str, Any], weights: dict[str, float]):
    self.name, self.splits, self.weights = name, splits, weights


class MixedCorpus:
  """The prepared corpora of a mixture, opened (their manifests only)."""

  def __init__(self, corpora: dict[str, Any], weights: dict[str, float]):
    self.corpora, self.weights = corpora, weights

  def split(self, name: str) -> MixtureSplit:
    """`name` ("train" or "validation") of every component."""
    return MixtureSplit(name, {key: c.split(name) for key, c in self.corpora.items()},
                        self.weights)

  def record(self) -> dict[str, Any]:
    """The run's data identity (dataset.json): each component's, its weight beside it."""
    records = {key: c.record() for key, c in self.corpora.items()}
    return {"name": "mixture/" + "+".join(f"{key}:{self.weights[key]:g}" for key in records),
            "files": {f"{key}/{path}": digest for key, record in records.items()
                      for path, digest in record["files"].items()},
            "components": {key: {"weight": self.weights[key], **record}
                           for key, record in records.items()}}


def open_for_training(config: ml_collections.ConfigDict, tokenizer_workdir: str = ""
                      ) -> tuple[MixedCorpus, Any]:
  """The mixture's prepared corpora and their one tokenizer (the first component's).

  Raises:
    ConfigError: a component not prepared with that tokenizer, or changed since; the
      message names the component's path and the prepare command.
  """
  parts, configs = components(config), component_configs(config)
  tokenizer = for_config.tokenizer_for(configs[0], tokenizer_workdir, create=False)
  corpora = {part.name: for_config.open_for_training(one, tokenizer_workdir,
                                                     tokenizer=tokenizer)[0]
             for part, one in zip(parts, configs)}
  weights = {part.name: part.weight for part in parts}
  total = sum(weights.values())
  logging.info("Mixture of %d corpora by weight: %s", len(parts), ", ".join(
      f"{name} {weights[name] / total:.1%} ({c.manifest['splits']['train']['tokens']:,} train "
      "tokens)" for name, c in corpora.items()))
  return MixedCorpus(corpora, weights), tokenizer


def component_seed(seed: int, index: int) -> int:
  """Component `index`'s shuffle seed: `seed` for the first (a single corpus's rows are
  those of before), one derived from it for the others, so they shuffle differently."""
  if index == 0:
    return seed
  return int(np.random.SeedSequence((seed, index)).generate_state(1)[0] >> 1)


def mix_rows(source: Any, rows: Callable[[Any, int], grain.IterDataset]) -> grain.IterDataset:
  """`rows(split, seed_index)` for one split, or the components' rows mixed by weight.

  Args:
    source: a random-access split, or a MixtureSplit.
    rows: builds one corpus's rows (before batching) from its split; the second argument
      is the component's index (0 without a mixture), for its seed.
  """
  if not isinstance(source, MixtureSplit):
    return rows(source, 0)
  parts = {name: rows(split, i) for i, (name, split) in enumerate(source.splits.items())}
  return grain.IterDataset.mix(parts, {name: source.weights[name] for name in parts})


def integer_proportions(weights: Sequence[float]) -> list[int]:
  """grain's integer proportions for `weights` (the smallest scaled to 100)."""
  scale = _GRAIN_SCALE_MIN_TO / min(weights)
  return [int(w * scale) for w in weights]


def row_counts(weights: Sequence[float], rows: int) -> list[int]:
  """How many of the first `rows` mixed rows come from each component, exactly.

  grain's interleave (mix.py, _dataset_and_key_of_next_element) gives component i the
  positions where k * (rest - p_i) // rest steps, over the positions the components
  before it left; the count among the first n is n - n * (rest - p_i) // rest.
  """
  proportions = integer_proportions(weights)
  rest, left, counts = sum(proportions), rows, []
  for p in proportions:
    passed_on = left * (rest - p) // rest
    counts.append(left - passed_on)
    left, rest = passed_on, rest - p
  return counts


def realised(config: ml_collections.ConfigDict, rows: int) -> dict[str, float]:
  """mixture_<name>: each component's share of the first `rows` rows of this process
  (every process mixes its own rows by the same rule, so it is the run's share too);
  {} without a mixture or before any row."""
  parts = components(config)
  if not parts or rows <= 0:
    return {}
  counts = row_counts([part.weight for part in parts], rows)
  return {METRIC_PREFIX + part.name: count / rows for part, count in zip(parts, counts)}


def describe(fractions: dict[str, float]) -> str:
  """'mix web 70% code 30%' for the progress line; "" without a mixture."""
  if not fractions:
    return ""
  return "mix " + " ".join(f"{key[len(METRIC_PREFIX):]} {100 * value:.0f}%"
                           for key, value in fractions.items())

