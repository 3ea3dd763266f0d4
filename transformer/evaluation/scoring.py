"""Log-likelihoods of requests on a decoder LM or an encoder-decoder, batched, packed and
sharded over the mesh.

`LogLikelihoodScorer` is the benchmark's counterpart of training/trainer.py's Scorer:
the same deterministic model, parameters placed as the run placed them, batches
sharded over the mesh's data axes (sharding.place_batch) and one compiled step. Where
that step sums a split's loss, this one returns, per position, the log-probability of
each target slot and the argmax token (requests.PackedRequests reads a request's
scores from them); the vocabulary is projected a slice of positions at a time
(lm_head.logits_chunk_length, as the loss does), never as whole float32 [B, L, V]
logits. model.never_predict rows are outside the softmax, as in the loss.

A decoder LM reads context + continuation in one segment (requests.pack); an
encoder-decoder (whatever its objective: two token sides) reads the context on the
encoder side and the continuation as the decoder's target (requests.pack_pairs), as
lm-eval's seq2seq backend does; a prefix LM (a decoder whose objective feeds the batch
field `prefix`) reads the context as its bidirectional prefix (requests.pack with
prefix). The compiled step is the same: the objective's model
inputs, the decoder's hidden states, the log-probabilities of the targets.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn

from transformer import sharding
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.evaluation import requests as requests_lib
from transformer.inference import text
from transformer.model import attention_ops
from transformer.model import lm_head
from transformer.model import moe
from transformer.model import objectives
from transformer.model.models import make_model
from transformer.workdir import progress as progress_lib

SLOTS = 8  # Targets a position may be scored against (requests.pack's shared inputs).
# What a batch's rows hold: several requests a row, padding after them (and empty rows).
ROWS = objective_lib.RowLayout(packed=True, padded=True)
_EXCLUDED_LOGIT = -1e30  # model.never_predict rows: outside the softmax.
PREFIX = "prefix"  # The batch field of a prefix LM's bidirectional prefix (1 on it).


def scores_text(objective: objective_lib.Objective) -> bool:
  """Whether a model trained on `objective` gives log p(continuation | context): it
  continues text (a decoder LM, a prefix LM) or has a decoder after an encoder (an
  encoder-decoder, whatever its objective: seq2seq, span corruption, UL2)."""
  return objective.decodes or reads_pairs(objective)  # config/train.py checks the same.


def reads_pairs(objective: objective_lib.Objective) -> bool:
  """Whether the context goes to an encoder side: an encoder-decoder, whose steps read
  two token sides."""
  return objective.sides == 2


def is_seq2seq(config: ml_collections.ConfigDict) -> bool:
  """Whether `config`'s model reads a request's context on an encoder side."""
  return reads_pairs(objective_lib.resolve(ModelConfig.from_config(config.model)))


def token_scores(params: Any, batch: dict[str, jax.Array], *, model: nn.Module,
                 objective: objective_lib.Objective, never_predict: tuple[int, ...]
                 ) -> tuple[jax.Array, jax.Array]:
  """(log p(targets) [B, L, K], argmax ids [B, L]) of one packed batch.

  batch: the objective's model inputs [B, L] (requests.PackedRequests.arrays) and
  targets [B, L, K].
  """
  (x_BLE, head), _ = model.apply({"params": params}, *objectives.model_inputs(objective, batch),
                                 mutable=[moe.COLLECTION], hidden=True)
  targets_BLK = batch["targets"]
  B, L, _ = x_BLE.shape
  c = lm_head.logits_chunk_length(0, L, head.vocab_size, lm_head.rows_per_device(B),
                                 x_BLE.shape[-1])
  pad = -L % c
  n = (L + pad) // c

  def chunked(a):  # [B, L, ...] -> [n, B, c, ...]
    a = jnp.pad(a, ((0, 0), (0, pad)) + ((0, 0),) * (a.ndim - 2))
    return jnp.moveaxis(a.reshape((B, n, c) + a.shape[2:]), 1, 0)

  def one_chunk(xs):
    x_BcE, t_BcK = xs
    logits_BcV = head(x_BcE)
    if never_predict:
      logits_BcV = logits_BcV.at[..., jnp.asarray(never_predict)].set(_EXCLUDED_LOGIT)
    log_z_Bc = jax.nn.logsumexp(logits_BcV, axis=-1)
    logp_BcK = jnp.take_along_axis(logits_BcV, t_BcK, axis=-1) - log_z_Bc[..., None]
    return logp_BcK, jnp.argmax(logits_BcV, axis=-1).astype(jnp.int32)

  logp, argmax = jax.lax.map(one_chunk, (chunked(x_BLE), chunked(targets_BLK)))
  unchunk = lambda a: jnp.moveaxis(a, 0, 1).reshape((B, n * c) + a.shape[3:])[:, :L]
  return unchunk(logp), unchunk(argmax)


@dataclasses.dataclass(frozen=True)
class Scores:
  """Per request: log-likelihood, greedy or not, whether it was truncated on the left."""
  loglik: np.ndarray
  greedy: np.ndarray
  truncated: np.ndarray
  segments: int  # Segments placed (fewer than requests where inputs were shared).
  rows: int


@dataclasses.dataclass
class LogLikelihoodScorer:
  """A decoder LM's or an encoder-decoder's jitted token scoring on a mesh (see the
  module docstring)."""

  mesh: jax.sharding.Mesh
  rules: tuple
  length: int  # Tokens a row (a side): min(data.seq_len, model.max_len).
  batch_size: int  # Rows a global batch.
  step: Callable
  input_shard: sharding.InputShard
  packed_rows_limit: int | None
  seq2seq: bool = False  # An encoder-decoder: context to the encoder (requests.pack_pairs).
  prefix: bool = False  # A prefix LM: the context is the bidirectional prefix.

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
             param_shardings: Any, batch_size: int = 0, mode: str = "benchmark"
             ) -> "LogLikelihoodScorer":
    """The scorer of `config.model` for parameters placed as `param_shardings`.

    batch_size: rows a batch (0: data.batch_size); must split over the data axes.

    Raises:
      ConfigError: neither a decoder LM nor an encoder-decoder, or a batch size the
        mesh cannot split.
    """
    # Packed requests with padding after them: the row layout the kernels are told.
    model_config = dataclasses.replace(ModelConfig.from_config(config.model),
                                       deterministic=True, rows_packed=ROWS.packed,
                                       rows_padded=ROWS.padded)
    objective = objective_lib.resolve(model_config)
    if not scores_text(objective):
      raise ConfigError(
          f"--mode={mode} scores continuations by their log-likelihood, which needs a "
          f"decoder LM (model.arch='decoder', head='lm') or an encoder-decoder "
          f"(model.arch='encoder_decoder', head='lm'); this run is a {objective.name} model")
    rules = tuple(sharding.rules_of(config.mesh, mesh))
    ways = sharding.data_parallel_size(mesh, rules)
    batch_size = batch_size or config.data.batch_size
    if batch_size < 1 or batch_size % ways:
      raise ConfigError(f"benchmark batch size {batch_size} must be a positive multiple of "
                        f"the {ways} data-parallel shards of mesh {dict(mesh.shape)}")
    step = jax.jit(functools.partial(
        token_scores, model=make_model(model_config), objective=objective,
        never_predict=tuple(model_config.never_predict)),
                   in_shardings=(param_shardings, sharding.batch_sharding(mesh, rules)),
                   out_shardings=sharding.replicated(mesh))
    return cls(mesh=mesh, rules=rules, length=text.source_context(config),
               batch_size=batch_size, step=step,
               input_shard=sharding.input_shard(mesh, rules),
               packed_rows_limit=attention_ops.mesh_packed_rows_limit(model_config, mesh,
                                                                      rules),
               seq2seq=reads_pairs(objective),
               prefix=PREFIX in objective.model_inputs)

  def score(self, params: Any, requests: Sequence[requests_lib.Request],
            progress: progress_lib.Progress | None = None) -> Scores:
    """Log-likelihood and greediness of every request (every process the same).

    `progress` counts the requests scored.
    """
    if self.seq2seq:
      packed = requests_lib.pack_pairs(requests, self.length,
                                       max_segments=self.packed_rows_limit or 0)
    else:
      packed = requests_lib.pack(requests, self.length, SLOTS,
                                 max_segments=self.packed_rows_limit or 0,
                                 prefix=self.prefix)
    order = np.argsort(packed.row, kind="stable")  # Requests by row: a batch's are a slice.
    bounds = np.searchsorted(packed.row[order], np.arange(0, packed.num_rows + self.batch_size,
                                                          self.batch_size))
    loglik, greedy = np.zeros(len(requests)), np.zeros(len(requests), bool)
    share = (self.input_shard.index, self.input_shard.count)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      for number, local in enumerate(packed.batches(self.batch_size, share)):
        attention_ops.check_rows(local, self.packed_rows_limit, ROWS)
        placed = sharding.place_batch(local, sharding.batch_sharding(self.mesh, self.rules),
                                      self.input_shard)
        logp, argmax = jax.device_get(self.step(params, placed))
        first = number * self.batch_size
        mine = order[bounds[number]:bounds[number + 1]]
        part_ll, part_greedy = packed.scores(np.asarray(logp), np.asarray(argmax),
                                             mine, first)
        loglik[mine], greedy[mine] = part_ll, part_greedy
        if progress is not None:
          progress.update(len(mine))
    return Scores(loglik, greedy, packed.truncated, packed.segments, packed.num_rows)


def requests_per_batch(scores: Scores, batch_size: int) -> float:
  """Requests a batch held on average (how much packing saved)."""
  return len(scores.loglik) / max(1, math.ceil(scores.rows / batch_size))
