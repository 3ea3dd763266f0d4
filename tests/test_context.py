"""Context parallelism on 8 simulated CPU devices: the sequence sharded over a `context`
mesh axis gives the unsharded model's logits, gradients and training losses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer import sharding
from transformer.config.model import ModelConfig
from transformer.model import context
from transformer.model.models import make_model

from test_sharding import _batch, _config, _train


def test_zigzag_gives_each_shard_an_early_and_a_late_chunk_and_inverts():
  x = np.arange(16)[None]  # 4 shards, 8 chunks of 2.
  order = np.asarray(context.zigzag(jnp.asarray(x), 4))[0]
  assert order.reshape(4, 4).tolist() == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11],
                                          [6, 7, 8, 9]]
  np.testing.assert_array_equal(context.unzigzag(jnp.asarray(order)[None], 4), x)
  y = np.random.default_rng(0).normal(size=(2, 16, 3)).astype(np.float32)
  np.testing.assert_array_equal(context.unzigzag(context.zigzag(jnp.asarray(y), 2), 2), y)


def test_zigzag_rows_give_every_shard_the_same_splash_blocks():
  """Splash's block tables for a causal 4,096 x 4,096 mask in 4 row shards of 128-blocks:
  the natural order gives the shards 36, 100, 164, 228 blocks to compute, zig-zag 132 each."""
  # pylint: disable-next=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info
  from transformer.model import splash  # pylint: disable=g-import-not-at-top
  length, shards = 4096, 4
  computed = {}
  for name, order in (("natural", None),
                      ("zigzag", context.zigzag(np.arange(length)[None], shards)[0])):
    mask = splash.splash_mask(True, 0, length, length, 1, q_order=order)
    info, _ = splash_attention_mask_info.process_mask(mask, (128, 128), q_seq_shards=shards)
    blocks = np.asarray(info.block_mask)[0].reshape(shards, -1, length // 128)
    computed[name] = (blocks > 0).sum(axis=(1, 2)).tolist()
  assert computed == {"natural": [36, 100, 164, 228], "zigzag": [132] * 4}
  # The compile mode's count of the same blocks (planning/attention_cost.py), without splash.
  from transformer.planning import attention_cost  # pylint: disable=g-import-not-at-top
  rows = length // shards
  for shard in range(shards):
    share = attention_cost.visited_fraction(rows, length, 128, 128, True, 0,
                                            attention_cost.zigzag_rows(shard, shards, rows))
    assert share * (rows // 128) * (length // 128) == 132


def _logits_and_grads(config, shards):
  """Logits and the gradient of a scalar of them, on a mesh of `shards` context shards."""
  config.mesh.shape = (("data", 1), ("fsdp", 1), ("tensor", 1), ("context", shards))
  cfg = ModelConfig.from_config(config.model)
  model = make_model(cfg)
  batch = _batch(config)
  keys = (("inputs", "inputs_segment_ids", "inputs_positions", "decoder_inputs",
           "targets_segment_ids", "targets_positions") if cfg.arch == "encoder_decoder"
          else ("inputs", "segment_ids", "positions"))
  args = tuple(batch[k] for k in keys)
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:shards])
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.rules_of(config.mesh, mesh)):
    params = jax.jit(model.init)(jax.random.PRNGKey(0), *args)["params"]

    def scalar(params):  # sin: a gradient that differs per position and per vocab entry.
      logits = model.apply({"params": params}, *args)
      return jnp.sum(jnp.sin(logits)), logits

    step = jax.jit(jax.value_and_grad(scalar, has_aux=True))
    # GSPMD alone would also get the numbers right: check that attention is the
    # per-shard all-gather of context_attention.
    assert ("all_gather" in str(jax.make_jaxpr(step)(params))) == (shards > 1)
    (_, logits), grads = step(params)
  return np.asarray(logits), jax.device_get(grads)


def _assert_same(got, want):
  np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-5)
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got[1])[0],
                          jax.tree.leaves(want[1])):
    # Whole-tensor relative error: an exactly-zero true gradient (the key bias: softmax
    # ignores a per-query constant) is float noise either way.
    scale = max(np.linalg.norm(w), 1e-3)
    assert np.linalg.norm(np.asarray(g) - w) / scale < 1e-4, jax.tree_util.keystr(path)


def _small(tiny_config, arch, **model):
  config = _config(tiny_config)  # Sizes every mesh axis of 8 divides.
  config.data.update(batch_size=2, seq_len=32)
  config.model.update(dict(arch=arch, head="mlm" if arch == "encoder" else "lm",
                           d_model=32, num_heads=4, mlp_dim=64, dtype="float32",
                           attention_impl="xla", num_layers=1, num_decoder_layers=1) | model)
  return config


@pytest.fixture(scope="module")
def decoder_reference(tfds_data_dir):
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  return _logits_and_grads(_decoder(make_tiny_config(tfds_data_dir)), 1)


def _decoder(tiny_config):
  """Causal, packed (two documents and padding a row), GQA, a local and a global layer."""
  return _small(tiny_config, "decoder", num_kv_heads=2, sliding_window=5,
                window_pattern="lg", num_layers=2)


@pytest.mark.parametrize("shards", [2, pytest.param(4, marks=pytest.mark.slow), 8])
def test_decoder_with_context_shards_equals_unsharded(tiny_config, decoder_reference, shards):
  _assert_same(_logits_and_grads(_decoder(tiny_config), shards), decoder_reference)


# Slow (-m slow): a reference and a sharded compile each, ~30 s of CI time together.
@pytest.mark.slow
@pytest.mark.parametrize("arch,shards,model", [
    ("encoder", 4, {}),  # Bidirectional, packed.
    ("encoder_decoder", 2, {}),  # Cross-attention to a context-sharded source.
    ("decoder", 2, {"position": "alibi", "attention_impl": "einsum"}),  # A logit bias.
])
def test_other_attentions_with_context_shards_equal_unsharded(tfds_data_dir, arch, shards,
                                                              model):
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  want = _logits_and_grads(_small(make_tiny_config(tfds_data_dir), arch, **model), 1)
  got = _logits_and_grads(_small(make_tiny_config(tfds_data_dir), arch, **model), shards)
  _assert_same(got, want)


def test_training_with_context_4_gives_the_losses_of_context_1(tfds_data_dir):
  """Three steps of the trainer (Trainer.train_step, AdamW) from the same seed and data;
  the loss in chunks of 12 positions (3 of each context shard's 8, one of them padding)."""
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  runs = []
  for shards in (1, 4):
    config = _config(make_tiny_config(tfds_data_dir), use_bias=False)
    config.train.logits_chunk = 12
    config.mesh.shape = (("data", 2), ("fsdp", 1), ("tensor", 1), ("context", shards))
    losses, _, _ = _train(config, jax.devices()[: 2 * shards])
    runs.append(losses)
  np.testing.assert_allclose(runs[1], runs[0], rtol=1e-5)


@pytest.mark.slow  # Pallas's interpreter on CPU: ~40 s.
@pytest.mark.parametrize("window", [0, 40])
def test_splash_per_context_shard_equals_unsharded_xla(tfds_data_dir, window):
  """The TPU kernel (interpreted on CPU) with the zig-zag rows in its mask: causal, packed,
  GQA, windowed; 256 tokens, the shortest two shards tile in blocks of 128."""
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  results = []
  for impl, shards in (("xla", 1), ("splash", 2)):
    config = _small(make_tiny_config(tfds_data_dir), "decoder", num_kv_heads=2,
                    sliding_window=window, max_len=256, attention_impl=impl)
    config.data.update(batch_size=1, seq_len=256)
    results.append(_logits_and_grads(config, shards))
  np.testing.assert_allclose(results[1][0], results[0][0], atol=2e-5, rtol=1e-5)
  for g, w in zip(jax.tree.leaves(results[1][1]), jax.tree.leaves(results[0][1])):
    assert np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-3) < 1e-3


def test_per_token_layers_run_on_their_shards_tokens_only():
  """2 rows of 1,024 tokens a data shard, cut over 2 context shards: every projection of
  the compiled train step (attention's q/k/v/o, the MLP's wi/wo, forward and backward)
  multiplies the shard's own 1,024 tokens. Merging batch and length into one axis there
  made XLA gather the whole 2,048 onto both shards first (context.tokens_mergeable)."""
  import re  # pylint: disable=g-import-not-at-top
  from test_compile_mode import tiny  # pylint: disable=g-import-not-at-top
  from transformer.config import objective as objective_lib  # pylint: disable=g-import-not-at-top
  from transformer.planning import compiled  # pylint: disable=g-import-not-at-top
  config = tiny()
  config.model.update(num_layers=1, attention_impl="xla", max_len=1024)
  config.data.update(seq_len=1024, batch_size=4)
  config.mesh.shape = (("data", 2), ("fsdp", 1), ("tensor", 1), ("context", 2))
  trainer = compiled.build_trainer(compiled.target_config(config),
                                   sharding.make_mesh(config.mesh, jax.devices()[:4]))
  batch = compiled.abstract_batch(config, objective_lib.resolve(config.model),
                                  trainer.batch_sharding)
  with trainer.context():
    text = trainer.train_step.lower(trainer.abstract_state, batch).compile().as_text()
  products = re.findall(r"= [a-z0-9]+\[([0-9,]+)\][^ ]* (?:dot|convolution)\(", text)
  rows = [shape for shape in products if shape.split(",")[0] in ("1024", "2048")]
  assert rows and all(shape.split(",")[0] == "1024" for shape in rows), products
