"""Metrics as sums plus a denominator, and the progress line.

Token-weighted sums stay exact when added across devices, batches and steps; a
mean is taken only when a metric is reported. The rows go to metrics.jsonl and
TensorBoard through workdir/metrics_file.py.
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterator, Mapping, Sequence, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from transformer.config.model import ModelConfig
from transformer.model import context
from transformer.model import mlp_pallas
from transformer.model import moe
from transformer.model.lm_head import logits_chunk_length, rows_per_device
from transformer.model.lm_head import LogitsHead
from transformer.training import head_loss
from transformer.workdir import layout
from transformer.workdir.console import format_duration
from transformer.workdir.metrics_file import GROUP_SEPARATOR as _GROUP_SEPARATOR
from transformer.workdir.metrics_file import MOE_LOAD_PREFIX

T = TypeVar("T")

# Keys that are sums to be divided by `weight_sum` when reported.
SUM_KEYS = ("loss_sum", "correct_sum")
# The per-bucket arrays of loss_sums' by-position sums: by_position_rows reports them,
# summarize leaves them out.
BY_POSITION_PREFIX = head_loss.BY_POSITION_PREFIX
# The per-tag arrays of loss_sums' sums by a per-token tag (evaluation's UL2 denoisers):
# `name_tags` turns them into GROUP_SEPARATOR-named sums that summarize reports.
BY_TAG_PREFIX = "by_tag_"
# "loss_sum/R": a sum over one named group of the tokens (summarize: eval_loss/R).
GROUP_SEPARATOR = _GROUP_SEPARATOR
# Row keys that measure speed: the only ones a rerun of the same steps may not reproduce.
TIMING_KEYS = ("seconds_per_step", "tokens_per_second", "mfu", "data_wait_fraction")


def loss_sums(logits_BLV: jax.Array, targets_BL: jax.Array, weights_BL: jax.Array,
              label_smoothing: float = 0.0, z_loss: float = 0.0,
              never_predict: tuple[int, ...] = (), positions_BL: jax.Array | None = None,
              bucket: int = 0, num_buckets: int = 0, tags_BL: jax.Array | None = None,
              num_tags: int = 0) -> dict[str, jax.Array]:
  """Token-weighted sums for the objective and the reported metrics of given logits.

  Args:
    logits_BLV: [B, L, V] logits (any float dtype; the loss is float32); a classifier's
      [B, C] with [B] targets and weights.
    targets_BL: [B, L] target ids.
    weights_BL: [B, L] token weights (0 for padding).
    label_smoothing: of the objective's cross-entropy (loss_sum stays the plain NLL).
    z_loss: PaLM's auxiliary coefficient: the objective adds z_loss * log(Z)^2 per
      target token, Z the softmax normaliser, which keeps log Z near 0.
    never_predict: vocabulary rows left out of the softmax (model.never_predict: rows
      an import adds), so the loss, accuracy and perplexity are the source model's.
    positions_BL: with `bucket` > 0, each target's position id (p: p tokens of its
      document before it in the row), for the sums by position.
    bucket, num_buckets: > 0: also loss_sum, correct_sum and weight_sum per bucket of
      `bucket` positions, [num_buckets] arrays under BY_POSITION_PREFIX + the key
      (bucket p // bucket; positions past the last bucket count in it). Each token
      counts in one bucket, so they add up to the totals exactly.
    tags_BL, num_tags: > 0: also the three sums per tag (each target's tag in
      [0, num_tags): evaluation's UL2 denoiser, 0 on padding), [num_tags] arrays under
      BY_TAG_PREFIX + the key; they add up to the totals exactly, as the buckets do.

  Returns:
    `objective_sum` (with label smoothing and the z-loss), `loss_sum` (plain NLL),
    `correct_sum` (argmax hits: the first largest logit is the target) and `weight_sum`
    (number of real target tokens); with `z_loss` > 0 also `z_loss_sum`, the z-loss
    term's token-weighted sum; with `bucket` the sums by position, with `num_tags` the
    sums by tag. Only objective_sum is differentiable (head_loss.py: its gradient is
    formed with the statistics).
  """
  groups, ids = _token_groups(targets_BL, positions_BL, bucket, num_buckets, tags_BL,
                              num_tags)
  return head_loss.logits_loss(logits_BLV, targets_BL, weights_BL, ids,
                               _options(label_smoothing, z_loss, never_predict, groups))


def _token_groups(targets_BL: jax.Array, positions_BL: jax.Array | None, bucket: int,
                  num_buckets: int, tags_BL: jax.Array | None, num_tags: int
                  ) -> tuple[tuple[tuple[str, int], ...], jax.Array]:
  """head_loss's groupings of the targets (LossOptions.groups) and their ids [..., G]:
  by position bucket with `bucket` > 0, by tag with `num_tags` > 0 (G = 0: neither)."""
  groups, ids = [], []
  if bucket > 0:
    groups.append((BY_POSITION_PREFIX, int(num_buckets)))
    ids.append(jnp.minimum(positions_BL // bucket, num_buckets - 1))
  if num_tags > 0:
    groups.append((BY_TAG_PREFIX, int(num_tags)))
    ids.append(tags_BL)
  if not ids:  # An empty last axis: nothing grouped, nothing computed.
    return (), jnp.zeros(targets_BL.shape + (0,), jnp.int32)
  return tuple(groups), jnp.stack([i.astype(jnp.int32) for i in ids], axis=-1)


def _options(label_smoothing, z_loss, never_predict, groups) -> head_loss.LossOptions:
  return head_loss.LossOptions(label_smoothing=float(label_smoothing), z_loss=float(z_loss),
                               never_predict=tuple(int(i) for i in never_predict),
                               groups=groups)


def name_tags(sums: dict[str, jax.Array], names: Sequence[str]) -> dict[str, jax.Array]:
  """loss_sums' sums by tag -> `loss_sum/<name>` and `weight_sum/<name>` scalars, tag
  i + 1 being names[i] (tag 0, padding, dropped), which `summarize` reports as
  loss/<name> and tokens/<name>; the token-weighted losses of the names recombine to
  the total loss (their weights add up to weight_sum where every target has a tag)."""
  out = {k: v for k, v in sums.items() if not k.startswith(BY_TAG_PREFIX)}
  for index, name in enumerate(names, start=1):
    for key in ("loss_sum", "weight_sum"):
      out[key + GROUP_SEPARATOR + name] = sums[BY_TAG_PREFIX + key][index]
  return out


def by_position_rows(sums: Mapping[str, Any], bucket: int) -> list[dict[str, float]]:
  """loss_sums' sums by position (added over batches) -> a row per bucket holding tokens.

  Each row: start, end (the positions [start, end) it covers), tokens, loss, perplexity
  and accuracy of the tokens there.
  """
  loss = np.asarray(sums[BY_POSITION_PREFIX + "loss_sum"], np.float64)
  correct = np.asarray(sums[BY_POSITION_PREFIX + "correct_sum"], np.float64)
  weight = np.asarray(sums[BY_POSITION_PREFIX + "weight_sum"], np.float64)
  rows = []
  for index in np.flatnonzero(weight > 0):
    mean = float(loss[index] / weight[index])
    rows.append({"start": int(index) * bucket, "end": (int(index) + 1) * bucket,
                 "tokens": float(weight[index]), "loss": mean,
                 "perplexity": math.exp(min(mean, 50.0)),
                 "accuracy": float(correct[index] / weight[index])})
  return rows


def head_spec(head: LogitsHead, d_model: int, logits_dtype: str = "auto",
              context_shards: int = 1) -> head_loss.HeadSpec:
  """The loss head's static half, with model.loss_head_impl decided for the platform being
  traced: "pallas" always (what its kernels cannot take is refused here, by name),
  "auto" on a GPU where they can (head_pallas.refusal, the weight whole on the mesh, no
  context shards), "xla" never."""
  from transformer.training import head_pallas  # pylint: disable=g-import-not-at-top
  pallas = False
  if head.impl != "xla":
    why = head_pallas.refusal(head.vocab_size, d_model, head.bias_V is not None)
    sharded = head_pallas.weight_sharded()
    why = why or (f"the mesh shards the head's weight over {sharded}" if sharded else None)
    why = why or ("the sequence is cut over context shards" if context_shards > 1 else None)
    if head.impl == "pallas" and why:
      raise ValueError(f"model.loss_head_impl='pallas': {why}; use 'auto' or 'xla'")
    pallas = why is None and (head.impl == "pallas" or
                              mlp_pallas.platform() in mlp_pallas.GPU_PLATFORMS)
  return head_loss.HeadSpec(
      tied=head.tied, dtype=jnp.dtype(head.dtype),
      logits_dtype=jnp.dtype(head.dtype if logits_dtype == "auto" else logits_dtype),
      softcap=head.softcap, pallas=pallas, interpret=mlp_pallas.platform() == "cpu")


def head_loss_sums(head: LogitsHead, x_BLE: jax.Array,
                   targets_BL: jax.Array, weights_BL: jax.Array, *, chunk: int = 0,
                   label_smoothing: float = 0.0, z_loss: float = 0.0,
                   never_predict: tuple[int, ...] = (), positions_BL: jax.Array | None = None,
                   bucket: int = 0, num_buckets: int = 0, tags_BL: jax.Array | None = None,
                   num_tags: int = 0, logits_dtype: str = "auto") -> dict[str, jax.Array]:
  """loss_sums of `head(x_BLE)`, projecting `chunk` positions at a time (head_loss.py).

  The [B, L, V] logits are never held whole: each chunk's are made, scored and, when
  the loss is differentiated, turned into their gradient's two matmuls at once
  (head_loss.py says how). The sums are those of loss_sums on the whole logits
  (float32 reassociation aside). A length that `chunk` does not divide is padded with
  weight-0 positions.

  Args:
    head: the model's LogitsHead (its arrays, layout, compute dtype and softcap).
    x_BLE: final hidden states.
    chunk: train.logits_chunk (0 = auto, see logits_chunk_length).
    logits_dtype: a chunk's logits between the matmul (accumulated in float32) and the
      softmax statistics (train.logits_dtype; "auto": the head's compute dtype).
    Others: as loss_sums.
  """
  B, L, _ = x_BLE.shape
  # Context parallelism (model/context.py): each of p shards holds L / p positions, and a
  # chunk takes c of each shard's, so the scan never slices across the sharded length
  # (slicing it all-gathered the whole row's hidden states every chunk: 264 GiB a step
  # for llama 1B at 131k tokens on v5p:2x2x2).
  p = context.size()
  spec = head_spec(head, x_BLE.shape[-1], logits_dtype, context_shards=p)
  c = logits_chunk_length(max(chunk // p, 1) if chunk else 0, L // p, head.vocab_size,
                          rows_per_device(B), x_BLE.shape[-1],
                          spec.logits_dtype.itemsize + spec.dtype.itemsize)
  pad = -(L // p) % c  # Weight-0 positions at the end of each shard: counted nowhere.
  n = (L // p + pad) // c
  groups, ids = _token_groups(targets_BL, positions_BL, bucket, num_buckets, tags_BL,
                              num_tags)
  return head_loss.head_loss(
      head.weight, head.bias_V, x_BLE, targets_BL, weights_BL, ids, spec=spec,
      options=_options(label_smoothing, z_loss, never_predict, groups),
      layout=(B, L, p, c, n, pad))


def objective_sums(outputs: Any, targets_BL: jax.Array, weights_BL: jax.Array, *,
                   chunk: int = 0, logits_dtype: str = "auto", label_smoothing: float = 0.0, z_loss: float = 0.0,
                   never_predict: tuple[int, ...] = (), positions_BL: jax.Array | None = None,
                   bucket: int = 0, num_buckets: int = 0, tags_BL: jax.Array | None = None,
                   num_tags: int = 0) -> dict[str, jax.Array]:
  """loss_sums of a forward's outputs: logits, or (hidden states, LogitsHead) in chunks."""
  if isinstance(outputs, tuple):
    x_BLE, head = outputs
    return head_loss_sums(head, x_BLE, targets_BL, weights_BL, chunk=chunk,
                          logits_dtype=logits_dtype,
                          label_smoothing=label_smoothing, z_loss=z_loss,
                          never_predict=never_predict, positions_BL=positions_BL,
                          bucket=bucket, num_buckets=num_buckets, tags_BL=tags_BL,
                          num_tags=num_tags)
  return loss_sums(outputs, targets_BL, weights_BL, label_smoothing, z_loss, never_predict,
                   positions_BL, bucket, num_buckets, tags_BL, num_tags)


def summarize(sums: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """Turns accumulated sums into loss, perplexity and accuracy; copies other scalars.

  A named group's sums (`name_tags`: loss_sum/R, weight_sum/R) become loss/R and
  tokens/R after the totals, for each group that holds tokens.
  """
  weight = float(sums["weight_sum"])
  whole = {k: v for k, v in sums.items()
           if GROUP_SEPARATOR not in k and not k.startswith(BY_POSITION_PREFIX)}
  out = {}
  if weight > 0:
    loss = float(sums["loss_sum"]) / weight
    out[prefix + "loss"] = loss
    out[prefix + "perplexity"] = math.exp(min(loss, 50.0))
    out[prefix + "accuracy"] = float(sums["correct_sum"]) / weight
    # Other token-weighted sums (z_loss_sum, moe_*_sum) are reported as per-token means.
    for key, value in whole.items():
      if key.endswith("_sum") and key not in SUM_KEYS + ("weight_sum", "objective_sum"):
        out[prefix + key[:-len("_sum")]] = float(value) / weight
  out[prefix + "tokens"] = weight
  for key, value in whole.items():
    if not key.endswith("_sum"):
      out[prefix + key] = float(value)
  groups = [k.split(GROUP_SEPARATOR, 1)[1] for k in sums
            if k.startswith("weight_sum" + GROUP_SEPARATOR)]
  for name in groups:
    tokens = float(sums["weight_sum" + GROUP_SEPARATOR + name])
    if tokens > 0:
      out[prefix + "loss" + GROUP_SEPARATOR + name] = (
          float(sums["loss_sum" + GROUP_SEPARATOR + name]) / tokens)
      out[prefix + "tokens" + GROUP_SEPARATOR + name] = tokens
  return out


def add_moe_sums(sums: dict[str, jax.Array], stats: Mapping[str, jax.Array],
                 aux_loss: float = 0.0, z_loss: float = 0.0,
                 per_expert: bool = True) -> dict[str, jax.Array]:
  """Adds a forward's MoE statistics (objectives.make_forward) to a batch's `sums`.

  Each statistic is a mean over the batch's tokens and the MoE layers; it enters as
  that mean times `weight_sum`, so that `summarize` reports it (as moe_aux_loss,
  moe_z_loss, moe_dropped_fraction, moe_load_<e>) exactly across batches and steps.
  The objective gains aux_loss * load-balancing loss + z_loss * router z-loss per
  target token; train_step's division by the token count leaves the batch's means.

  Args:
    sums: loss_sums' output (with `objective_sum` and `weight_sum`).
    stats: {} without MoE layers (then `sums` is returned unchanged).
    aux_loss: coefficient of the load-balancing loss (model.moe_aux_loss).
    z_loss: coefficient of the router z-loss (model.moe_z_loss).
    per_expert: also each expert's share of the assignments (training's rows).
  """
  if not stats:
    return sums
  weight = sums["weight_sum"]
  out = dict(sums)
  out["objective_sum"] = sums["objective_sum"] + weight * (
      aux_loss * stats["aux_loss"] + z_loss * stats["z_loss"])
  for name in ("aux_loss", "z_loss", "dropped_fraction"):
    out[f"moe_{name}_sum"] = weight * stats[name]
  if per_expert:
    for e in range(stats["load"].shape[0]):
      out[f"{MOE_LOAD_PREFIX}{e}_sum"] = weight * stats["load"][e]
  return out


def add_sums(total: dict[str, Any] | None, sums: Mapping[str, Any]) -> dict[str, Any]:
  """Adds sums of one batch to a running total (None starts a new total)."""
  sums = {k: np.asarray(v, np.float64) for k, v in sums.items()}
  if total is None:
    return sums
  return {k: total[k] + sums[k] for k in total}


class TrainProgress:
  """Step time, throughput, MFU, data wait and ETA for the progress line (the first
  step's compile excluded).

  Rates are averages over the steps since the previous `rates()` call (one logged
  row), without the time of evaluations (see `restart_clock`). The data wait is the
  time the loop spent blocked on its next batch (`waited`), as a fraction of that
  window's wall time: near 0 when the input pipeline keeps ahead of the step, near 1
  when the step is input-bound.
  """

  def __init__(self, start_step: int, num_steps: int, tokens_per_step: int,
               flops_per_step: float = 0.0, peak_flops: float = 0.0):
    """`flops_per_step`: model FLOPs (flops.py); `peak_flops`: of all devices, 0 = unknown."""
    self.num_steps = num_steps
    self.tokens_per_step = tokens_per_step
    self.flops_per_step = flops_per_step
    self.peak_flops = peak_flops
    self._mark_step = start_step
    self._mark_time = time.perf_counter()
    self._started = False
    self._window_seconds, self._window_steps = 0.0, 0
    # Waits since the last mark (they belong to the interval the next update closes)
    # and those of the closed intervals of the current window.
    self._pending_wait, self._window_wait = 0.0, 0.0
    self.seconds_per_step = float("nan")
    self.data_wait_fraction = float("nan")
    self._explained_mfu = False  # Whether an MFU above 100% was explained in the log.

  def update(self, step: int) -> None:
    """Call after `step` is complete; the first call only starts the clock."""
    now = time.perf_counter()
    if self._started and step > self._mark_step:
      self._window_seconds += now - self._mark_time
      self._window_steps += step - self._mark_step
      self._window_wait += self._pending_wait
    self._pending_wait = 0.0  # Before the clock starts: waits behind the compile, dropped.
    self._started = True
    self._mark_step, self._mark_time = step, now

  def restart_clock(self) -> None:
    """Call after work that is not training (an evaluation): its time is not counted."""
    self._mark_time = time.perf_counter()
    self._pending_wait = 0.0  # The interval it belonged to is dropped too.

  def waited(self, seconds: float) -> None:
    """Adds `seconds` the loop spent waiting for its next batch (data_wait_fraction)."""
    self._pending_wait += seconds

  def next_batch(self, batches: Iterator[T]) -> T:
    """next(batches), its blocking time counted as data wait (the loop's one call)."""
    start = time.perf_counter()
    try:
      return next(batches)
    finally:
      self.waited(time.perf_counter() - start)

  def rates(self) -> dict[str, float]:
    """seconds_per_step, tokens_per_second, data_wait_fraction and mfu over the steps
    since the last call.

    Empty before a step was timed; without `mfu` when the peak is unknown.
    """
    if self._window_steps:
      self.seconds_per_step = self._window_seconds / self._window_steps
      # At most 1: a wait measured just before a mark is a little longer than the part
      # of the interval it ended in.
      self.data_wait_fraction = min(1.0, self._window_wait / max(self._window_seconds, 1e-12))
      self._window_seconds, self._window_steps, self._window_wait = 0.0, 0, 0.0
    sps = self.seconds_per_step
    if not sps > 0:  # Also NaN: nothing timed yet.
      return {}
    out = {"seconds_per_step": sps, "tokens_per_second": self.tokens_per_step / sps,
           "data_wait_fraction": self.data_wait_fraction}
    if self.peak_flops > 0 and self.flops_per_step > 0:
      out["mfu"] = self.flops_per_step / sps / self.peak_flops
    return out

  def line(self, step: int, metrics: Mapping[str, float]) -> str:
    """'step 120/1000 (12%) | loss 2.345 | lr 3.0e-04 | grad_norm 0.912 | 15.2k tok/s |
    MFU 41.3% | data wait 2% | ETA 4m03s'.

    The rates come from `metrics` (those of `rates()`), "--" when missing.
    """
    sps = metrics.get("seconds_per_step", float("nan"))
    known = sps > 0
    rate = f"{metrics['tokens_per_second'] / 1e3:.1f}k tok/s" if known else "-- tok/s"
    mfu = ""
    if "mfu" in metrics:
      mfu = f" | MFU {100 * metrics['mfu']:.1f}%"
      if metrics["mfu"] > 1.0:
        # Never shown above 100% unexplained: the measured peak is a matmul rate taken
        # once, under other load (other processes, clocks) than this step.
        mfu += " (above the measured peak)"
        if not self._explained_mfu:
          self._explained_mfu = True
          logging.warning(
              "MFU above 100%%: the step ran faster than the peak it is divided by, which "
              "on CPU (or an unlisted accelerator) is a matmul rate measured once, under "
              "other load than now (%s). Read MFU as relative between steps of this run; "
              "--mode=compare puts several runs on one peak.", layout.PEAK_FLOPS)
    wait = (f" | data wait {100 * metrics['data_wait_fraction']:.0f}%"
            if "data_wait_fraction" in metrics else "")
    eta = format_duration((self.num_steps - step) * sps) if known else "--"
    return (f"step {step}/{self.num_steps} ({100 * step / self.num_steps:.0f}%) | "
            f"loss {metrics.get('loss', float('nan')):.4f} | "
            f"lr {metrics.get('learning_rate', float('nan')):.2e} | "
            f"grad_norm {metrics.get('grad_norm', float('nan')):.3f} | {rate}{mfu}{wait} | "
            f"ETA {eta}")


def log_parameter_count(params: Any, model_config: ModelConfig | None = None,
                        trainable: Any = None) -> tuple[int, int]:
  """Logs and returns (all parameters, trainable ones); with MoE layers also the active
  ones. `trainable`: the tree the optimizer updates, when not all of `params` (LoRA:
  the adapters and a head; optim.split_trainable), said as peft says it."""
  count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  if trainable is None:
    trained = count
    logging.info("Model parameters: %s (%.1fM)", f"{count:,}", count / 1e6)
  else:
    trained = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(trainable))
    logging.info("Model parameters: trainable params: %s || all params: %s || "
                 "trainable%%: %.4f (LoRA: the rest is the frozen base)", f"{trained:,}",
                 f"{count:,}", 100 * trained / max(count, 1))
  if model_config is not None and model_config.mlp == "moe":
    active = moe.active_parameter_count(params, model_config)
    logging.info("Active parameters per token: %s (%.1fM; %d of %d experts in each MoE "
                 "layer)", f"{active:,}", active / 1e6, model_config.experts_per_token,
                 model_config.num_experts)
  return count, trained
