"""transformer/api.py, the notebook facade (docs/python.md): load, generate, score,
evaluate, build_model, train; and a quiet JAX start on import."""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from transformer import api
from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model(finished_tiny_run, tfds_data_dir, tmp_path_factory):
  """The session's finished tiny run (copied: evaluate writes its JSON there), through
  api.train (already complete: its logged metrics, nothing compiled) and api.load."""
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  run = str(tmp_path_factory.mktemp("api") / "run")
  shutil.copytree(finished_tiny_run, run)
  metrics = api.train(make_tiny_config(tfds_data_dir), run)
  assert np.isfinite(metrics["eval_loss"]) and np.isfinite(metrics["loss"]), metrics
  return api.load(run)


def test_score_is_the_sum_of_the_forward_log_probabilities(model):
  """score == log_softmax of build_model's module on the run's parameters, summed."""
  module, fresh = api.build_model(model.config)
  assert jax.tree.map(np.shape, fresh) == jax.tree.map(np.shape, model.params)
  text = "def f(x):"
  ids = np.asarray([vocabularies.BOS_ID, *model.tokenizer.encode(text)], np.int32)[None]
  inputs = ids[:, :-1]
  logits = module.apply({"params": model.params}, inputs, np.ones_like(inputs),
                        np.arange(inputs.shape[1])[None])
  logp = jax.nn.log_softmax(np.asarray(logits, np.float32))
  expected = float(np.take_along_axis(logp, ids[:, 1:, None], -1).sum())
  assert model.score(text) == pytest.approx(expected, rel=1e-4)
  assert model.score([text, text]) == pytest.approx([expected] * 2, rel=1e-4)


def test_generate_is_greedy_by_default_and_checks_its_options(model):
  greedy = model.generate("import ", max_new_tokens=4)
  assert isinstance(greedy, str)
  assert model.generate(["import ", "def "], max_new_tokens=4)[0] == greedy
  assert model.generate("import ", max_new_tokens=4, temperature=0.0, beam_size=1) == greedy
  with pytest.raises(ConfigError, match=r"\['top_q'\] unknown; valid: \['max_new_tokens'"):
    model.generate("import ", top_q=0.9)


def test_evaluate_returns_the_record(model):
  record = model.evaluate(max_examples=4)
  assert np.isfinite(record["metrics"]["loss"]), record


def test_import_starts_jax_without_plugin_noise():
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  result = subprocess.run(
      [sys.executable, "-c", "from transformer import api\nimport jax\nprint(jax.devices())"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True)
  assert "CpuDevice" in result.stdout
  for noise in ("cuda", "CUDA", "E0000", "TPU", "Traceback"):
    assert noise not in result.stderr, result.stderr[-3000:]
