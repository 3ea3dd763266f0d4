"""Mixture of experts: a router sends each token to `experts_per_token` of `num_experts` MLPs.

`MoeMLP` replaces the dense MLP on the layers `ModelConfig.moe_layers` marks
(model.mlp="moe"); the Block, the stacks and decoding do not change. Per token:

  scores = softmax(x R) (or sigmoid), the top k of them (divided by their sum when
  model.moe_renormalize), y = sum_k score_k * expert_k(x) [+ shared(x) * gate(x)].

Two dispatches compute the same function when nothing is dropped:
  "dropless"  the (token, expert) assignments sorted by expert, each expert's rows
              multiplied by `jax.lax.ragged_dot` (a grouped matmul): no token is dropped.
  "capacity"  one-hot dispatch into [experts, capacity] slots per sequence (GShard,
              Switch): an expert takes at most ceil(factor * length * k / experts) of a
              sequence's assignments, first choices before second ones, earlier tokens
              first; the rest are dropped (the token keeps its residual only).

Each MoE layer sows into the "moe" collection (`self.sow`, carried out of `nn.scan` like
the parameters): the load-balancing loss num_experts * sum_e f_e * p_e (f_e the fraction
of tokens that chose e, p_e the mean router probability of e; it is experts_per_token when
perfectly balanced, as in transformers' Mixtral/Switch), the router z-loss
mean(logsumexp(logits)^2), the fraction of assignments dropped and each expert's share
of them. `moe_metrics` averages them over the layers. Padding tokens are routed and
counted like real ones.

Parameters of a MoE layer's `mlp`: `router/kernel` [E, X]; `experts/wi/kernel` [X, E, F]
(the activated branch, Mixtral w1 / OLMoE gate_proj / Switch wi), `experts/wi_gate/kernel`
(gated activations only: Mixtral w3 / OLMoE up_proj), `experts/wo/kernel` [X, F, E]
(w2 / down_proj / wo), each with a `bias` [X, out] when model.use_bias; `shared/...`
(a dense MLP of moe_shared_mlp_dim) and `shared_gate/kernel` [E, 1] when configured.

Shape letters as in the package legend (transformer/model/__init__.py); here N = B * L
tokens, T of the X experts per token, M = N * T assignments, C capacity slots.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from transformer.config.model import GATED_ACTIVATIONS, ModelConfig
from transformer.model import initializers
from transformer.model.mlp import MLP, activation
from transformer.model.dropout import Dropout

# The sown statistics of every MoE layer (the "moe" collection's leaf names).
COLLECTION = "moe"


def _per_expert(init: nn.initializers.Initializer) -> nn.initializers.Initializer:
  """`init` applied to each expert's [in, out] slice: fans are those of one expert."""
  def init_stacked(key, shape, dtype=jnp.float32):
    return jax.vmap(lambda k: init(k, shape[1:], dtype))(jax.random.split(key, shape[0]))
  return init_stacked


class ExpertDense(nn.Module):
  """One projection of all experts: kernel [X, in, out] (+ bias [X, out])."""

  config: ModelConfig
  features: int
  axes: tuple[str, str]
  residual_adds: int = 0

  @nn.compact
  def __call__(self, x: jax.Array, group_sizes_X: jax.Array | None = None,
               row_experts_M: jax.Array | None = None) -> jax.Array:
    """[M, in] rows sorted by expert (dropless) -> [M, out]; or [X, B, C, in] -> [X, B, C, out]."""
    cfg = self.config
    init = initializers.dense_kernel(cfg, residual_adds=self.residual_adds)
    kernel = self.param("kernel", nn.with_logical_partitioning(
        _per_expert(init), ("expert",) + self.axes),
        (cfg.num_experts, x.shape[-1], self.features), cfg.param_dtype).astype(cfg.dtype)
    x = x.astype(cfg.dtype)
    if group_sizes_X is not None:
      y = jax.lax.ragged_dot(x, kernel, group_sizes_X)
    else:
      y = jnp.einsum("XBCi,Xio->XBCo", x, kernel)
    if not cfg.use_bias:
      return y
    bias = self.param("bias", nn.with_logical_partitioning(
        nn.initializers.zeros, ("expert", self.axes[1])),
        (cfg.num_experts, self.features), cfg.param_dtype).astype(cfg.dtype)
    if group_sizes_X is not None:
      return y + bias[row_experts_M]
    return y + bias[:, None, None, :]


class Experts(nn.Module):
  """The routed experts' MLPs, stacked: wo(act(wi x) [* wi_gate x]) for each expert."""

  config: ModelConfig
  residual_adds: int = 0

  @nn.compact
  def __call__(self, x: jax.Array, group_sizes_X: jax.Array | None = None,
               row_experts_M: jax.Array | None = None) -> jax.Array:
    cfg = self.config
    route = dict(group_sizes_X=group_sizes_X, row_experts_M=row_experts_M)
    hidden = lambda name: ExpertDense(cfg, cfg.moe_mlp_dim, ("embed", "mlp"), name=name)(
        x, **route)
    h = activation(cfg.activation, hidden("wi"),
                   hidden("wi_gate") if cfg.activation in GATED_ACTIVATIONS else None)
    h = Dropout(cfg.mlp_dropout, deterministic=cfg.deterministic)(h)
    return ExpertDense(cfg, cfg.d_model, ("mlp", "embed"), self.residual_adds, name="wo")(
        h, **route)


def _softmax_scores(logits_NX: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Softmax over all experts, then top-k (Mixtral, OLMoE, Qwen-MoE, Switch)."""
  probs_NX = jax.nn.softmax(logits_NX, axis=-1)
  return probs_NX, probs_NX


def _sigmoid_scores(logits_NX: jax.Array) -> tuple[jax.Array, jax.Array]:
  """DeepSeek-V3: independent per-expert scores; the balance loss reads them normalised."""
  scores_NX = jax.nn.sigmoid(logits_NX)
  return scores_NX, scores_NX / jnp.sum(scores_NX, axis=-1, keepdims=True)


# model.moe_router -> (scores the top k is taken of, probabilities the balance loss reads);
# the names config/moe.py's MOE_ROUTERS validates (tests/test_config_registries.py).
ROUTERS = {"softmax": _softmax_scores, "sigmoid": _sigmoid_scores}


def route(config: ModelConfig, logits_NX: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Top-k routing of float32 router logits.

  Returns:
    (weights [N, T] float32, experts [N, T] int32, probabilities [N, X]): the weights
    the chosen experts' outputs are summed with; the probabilities (softmax, or the
    sigmoid scores divided by their sum) that the load-balancing loss reads.
  """
  scores_NX, probs_NX = ROUTERS[config.moe_router](logits_NX)
  weights_NT, experts_NT = jax.lax.top_k(scores_NX, config.experts_per_token)
  if config.moe_renormalize:
    weights_NT = weights_NT / jnp.sum(weights_NT, axis=-1, keepdims=True)
  return weights_NT, experts_NT, probs_NX


def capacity(config: ModelConfig, length: int) -> int:
  """Slots per expert for one sequence of `length` tokens (at most `length`)."""
  slots = math.ceil(config.moe_capacity_factor * length * config.experts_per_token
                    / config.num_experts)
  return max(1, min(length, slots))


class MoeMLP(nn.Module):
  """Routed experts (+ an optional shared expert) in place of the dense MLP."""

  config: ModelConfig
  residual_adds: int = 0  # Of this block's stack, for the init of `wo` (initializers.py).

  @nn.compact
  def __call__(self, x_BLE: jax.Array) -> jax.Array:
    cfg = self.config
    B, L, E = x_BLE.shape
    router_in_NE = x_BLE.reshape(B * L, E).astype(jnp.float32)
    if cfg.moe_router_jitter and not cfg.deterministic:  # Switch: training only.
      noise = jax.random.uniform(self.make_rng("dropout"), router_in_NE.shape,
                                 minval=1.0 - cfg.moe_router_jitter,
                                 maxval=1.0 + cfg.moe_router_jitter)
      router_in_NE = router_in_NE * noise
    # The router in float32 whatever the compute dtype (Switch): top-k is brittle.
    logits_NX = nn.Dense(
        cfg.num_experts, use_bias=False, dtype=jnp.float32, param_dtype=cfg.param_dtype,
        name="router", kernel_init=nn.with_logical_partitioning(
            initializers.dense_kernel(cfg), ("embed", None)))(router_in_NE)
    weights_NT, experts_NT, probs_NX = route(cfg, logits_NX)
    experts = Experts(cfg, self.residual_adds, name="experts")
    if cfg.moe_dispatch == "capacity":
      y_BLE, dropped = self._capacity_dispatch(experts, x_BLE, experts_NT, weights_NT)
    else:
      y_BLE = self._dropless_dispatch(experts, x_BLE.reshape(B * L, E), experts_NT,
                                      weights_NT).reshape(B, L, E)
      dropped = jnp.zeros((), jnp.float32)
    self._sow_statistics(logits_NX, experts_NT, probs_NX, dropped)
    if cfg.moe_shared_mlp_dim:
      shared_BLE = MLP(cfg, self.residual_adds, mlp_dim=cfg.moe_shared_mlp_dim,
                       name="shared")(x_BLE)
      if cfg.moe_shared_gate:  # Qwen2-MoE: sigmoid(x w) scales the shared expert per token.
        gate_BL1 = nn.Dense(
            1, use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            name="shared_gate", kernel_init=nn.with_logical_partitioning(
                initializers.dense_kernel(cfg), ("embed", None)))(x_BLE)
        shared_BLE = shared_BLE * jax.nn.sigmoid(gate_BL1)
      y_BLE = y_BLE + shared_BLE
    return y_BLE.astype(cfg.dtype)

  def _dropless_dispatch(self, experts: Experts, x_NE: jax.Array, experts_NT: jax.Array,
                         weights_NT: jax.Array) -> jax.Array:
    """Sort the N * T assignments by expert, one grouped matmul per projection, unsort."""
    N, T = experts_NT.shape
    experts_M = experts_NT.reshape(N * T)
    order_M = jnp.argsort(experts_M, stable=True)
    group_sizes_X = jnp.bincount(experts_M, length=self.config.num_experts).astype(jnp.int32)
    y_ME = experts(x_NE[order_M // T], group_sizes_X, experts_M[order_M])
    y_NTE = y_ME[jnp.argsort(order_M)].reshape(N, T, y_ME.shape[-1])
    return jnp.einsum("NTE,NT->NE", y_NTE, weights_NT.astype(y_NTE.dtype))

  def _capacity_dispatch(self, experts: Experts, x_BLE: jax.Array, experts_NT: jax.Array,
                         weights_NT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One-hot dispatch into [X, B, C] slots and back; returns (y, dropped fraction)."""
    cfg = self.config
    B, L, _ = x_BLE.shape
    T, X, C = cfg.experts_per_token, cfg.num_experts, capacity(cfg, L)
    chosen_BTLX = jax.nn.one_hot(experts_NT.reshape(B, L, T), X, dtype=jnp.int32
                                 ).transpose(0, 2, 1, 3)
    # Slot = how many assignments of the sequence reached the expert before this one,
    # first choices (t = 0) of every token before second choices (GShard's priority).
    position_BTLX = (jnp.cumsum(chosen_BTLX.reshape(B, T * L, X), axis=1)
                     .reshape(B, T, L, X) - 1)
    # one_hot of a slot >= C (or of -1, an expert not chosen) is all zeros: dropped.
    slot_BTLXC = jax.nn.one_hot(jnp.where(chosen_BTLX > 0, position_BTLX, -1), C,
                                dtype=cfg.dtype)
    dispatch_BLXC = jnp.sum(slot_BTLXC, axis=1)
    combine_BLXC = jnp.einsum("BTLXC,BLT->BLXC", slot_BTLXC,
                              weights_NT.reshape(B, L, T).astype(cfg.dtype))
    # Expert-parallel: the buffers live where their expert's weights do (their rows on
    # the other batch axes), so XLA moves tokens (all-to-all), not expert weights.
    constrain = lambda t: nn.with_logical_constraint(t, ("expert", "batch", None, None))
    x_XBCE = constrain(jnp.einsum("BLXC,BLE->XBCE", dispatch_BLXC, x_BLE.astype(cfg.dtype)))
    y_XBCE = constrain(experts(x_XBCE))
    y_BLE = jnp.einsum("BLXC,XBCE->BLE", combine_BLXC, y_XBCE)
    kept = jnp.sum(slot_BTLXC.astype(jnp.float32))
    return y_BLE, 1.0 - kept / (B * L * T)

  def _sow_statistics(self, logits_NX: jax.Array, experts_NT: jax.Array,
                      probs_NX: jax.Array, dropped: jax.Array) -> None:
    """Sows this layer's losses and load into the "moe" collection (a no-op unless mutable)."""
    X = self.config.num_experts
    chosen_NX = jnp.sum(jax.nn.one_hot(experts_NT, X, dtype=jnp.float32), axis=1)
    fraction_X = jnp.mean(chosen_NX, axis=0)  # Sums to T.
    self.sow(COLLECTION, "aux_loss", X * jnp.sum(fraction_X * jnp.mean(probs_NX, axis=0)))
    self.sow(COLLECTION, "z_loss", jnp.mean(jnp.square(jax.nn.logsumexp(logits_NX, axis=-1))))
    self.sow(COLLECTION, "dropped_fraction", dropped)
    self.sow(COLLECTION, "load", fraction_X / self.config.experts_per_token)


def moe_metrics(sown: Any) -> dict[str, jax.Array]:
  """The "moe" collection of a forward pass, averaged over its MoE layers.

  Returns:
    {} for a model without MoE layers; else `aux_loss`, `z_loss`, `dropped_fraction`
    (scalars) and `load` ([X], each expert's share of the assignments).
  """
  by_name: dict[str, list[jax.Array]] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(sown):
    name = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)][-1]
    by_name.setdefault(name, []).append(leaf)
  out = {}
  for name, leaves in by_name.items():
    width = leaves[0].shape[-1] if name == "load" else 1
    # Scanned stacks sow [layers] (or [groups]) arrays; unrolled ones scalars.
    out[name] = jnp.mean(jnp.concatenate([x.reshape(-1, width) for x in leaves]), axis=0)
    if name != "load":
      out[name] = out[name][0]
  return out


def active_parameter_count(params: Any, config: ModelConfig) -> int:
  """Parameters one token goes through: routed experts count experts_per_token / num_experts."""
  active = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    size = int(math.prod(leaf.shape))
    routed = any(getattr(k, "key", None) == "experts" for k in path)
    active += size * config.experts_per_token // config.num_experts if routed else size
  return active
