"""The Python API for a notebook or a script: docs/python.md is its page.

    from transformer import api            # first: JAX starts without plugin noise
    model = api.load("runs/quick")         # a trained run, or a --mode=import workdir
    model.generate("The meaning of")       # greedy continuation (text)
    model.score(["def f(x):"])             # log-likelihood of each text, in nats
    model.evaluate(max_examples=64)        # launch.py --mode=evaluate's record
    module, params = api.build_model(config)

A facade over what launch.py's modes use (inference/loaded.py, inference/text.py,
cli/evaluate.py, interop/hf/importer.py, training/loop.py), not a second copy of them.

Importing it on a host with no TPU or GPU starts JAX's CPU backend only, with the
CUDA plugin's and libtpu's start-up lines sent to the log instead of the notebook
(workdir/console.py's `quiet_absent_accelerators`, the same call launch.py makes). It
starts JAX's backends, so a multi-process job that calls `jax.distributed.initialize`
must do that before importing this module.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Sequence

from transformer.workdir import console

console.quiet_absent_accelerators()

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import ml_collections
import numpy as np
from flax import linen as nn

from transformer.cli import evaluate as evaluate_mode
from transformer.config import objective as objective_lib
from transformer.config.decode import validate_decode
from transformer.config.errors import ConfigError
from transformer.config.model import ModelConfig
from transformer.config.validation import validate
from transformer.data.tokenizers import vocabularies
from transformer.inference import loaded
from transformer.inference import passkey
from transformer.inference import text
from transformer.interop.hf import importer
from transformer.model import objectives
from transformer.model.models import make_model
from transformer.training import loop
# pylint: enable=g-import-not-at-top,wrong-import-position

with console.backends_starting():  # The CUDA plugin's "no driver" line: to the log.
  jax.devices()

# The decode.* fields `Model.generate` takes as keyword arguments.
GENERATE_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "beam_size", "alpha")


@dataclasses.dataclass
class Model:
  """A loaded run: `generate`, `score`, `evaluate`; `run` holds config, params, tokenizer."""

  run: loaded.LoadedRun

  @property
  def config(self) -> ml_collections.ConfigDict:
    return self.run.config

  @property
  def params(self) -> Any:
    return self.run.params

  @property
  def tokenizer(self) -> vocabularies.Tokenizer:
    return self.run.tokenizer

  def generate(self, prompts: str | Sequence[str], *, seed: int | None = None,
               **options: Any) -> str | list[str]:
    """Continues each prompt with a decoder LM (what --mode=generate prints).

    Greedy unless `temperature` > 0 (sampling, with `top_k` / `top_p`) or
    `beam_size` > 1 (beam search), as --mode=generate.

    Args:
      prompts: one text (returns one text) or a list of texts (returns a list).
      seed: the sampling seed; None: the run's config.seed.
      **options: decode.* fields of GENERATE_OPTIONS (max_new_tokens, temperature,
        top_k, top_p, beam_size, alpha); the run's own values otherwise (beam_size 1).

    Returns:
      The continuation of each prompt (the text after it, up to eos).

    Raises:
      ConfigError: an unknown or invalid option, a model that is not a decoder LM,
        an empty prompt, or one that does not fit the context.
    """
    self.run.require("generate", text.generate_serves,
                     "continues prompts (or fills a text-to-text model's sentinels)")
    unknown = sorted(set(options) - set(GENERATE_OPTIONS))
    if unknown:
      raise ConfigError(f"generate option(s) {unknown} unknown; valid: {list(GENERATE_OPTIONS)}")
    config = copy.deepcopy(self.run.config)
    config.decode.beam_size = 1  # Greedy by default, as --mode=generate.
    for key, value in options.items():
      config.decode[key] = type(config.decode[key])(value)
    validate_decode(config)
    decode = config.decode
    single = isinstance(prompts, str)
    texts = [prompts] if single else list(prompts)
    rng = None if decode.temperature <= 0 else jax.random.PRNGKey(
        config.seed if seed is None else seed)
    with self.run.context():
      outputs = text.generate_texts(config, self.run.model_config, self.run.params,
                                    self.tokenizer, texts, decode,
                                    max_new_tokens=decode.max_new_tokens,
                                    overlong=decode.overlong, rng=rng)
    return outputs[0] if single else outputs

  def score(self, texts: str | Sequence[str]) -> float | list[float]:
    """The log-likelihood (natural log) of each text under a decoder LM.

    A text is [bos] + its ids, as a training document begins; the score is the sum of
    log p of every id given those before it (bos itself is not scored, no eos is
    added). Divide by `len(model.tokenizer.encode(t))` for a per-token value.

    Raises:
      ConfigError: not a decoder LM, an empty text, or one longer than model.max_len.
    """
    self.run.require("score", lambda o: o.generates,
                     "scores texts by a decoder's log-likelihood (--mode=evaluate scores "
                     "any run)")
    single = isinstance(texts, str)
    texts = [texts] if single else list(texts)
    limit = self.run.config.model.max_len
    scores = []
    with self.run.context():
      for i, piece in enumerate(texts):
        ids = self.tokenizer.encode(piece) if piece else []
        if not len(ids) or len(ids) > limit:
          raise ConfigError(f"text {i + 1} has {len(ids)} tokens; score takes 1 to "
                            f"model.max_len={limit}")
        tokens = np.concatenate([[vocabularies.BOS_ID], ids]).astype(np.int32)[None]
        scorer = passkey.make_scorer(self.run.model_config, len(ids))
        logp_BL, _ = scorer(self.run.params, tokens)
        scores.append(float(np.sum(jax.device_get(logp_BL))))
    return scores[0] if single else scores

  def evaluate(self, split: str = "", *, max_examples: int = 0, **kwargs: Any
               ) -> dict[str, Any]:
    """launch.py --mode=evaluate on this run's checkpoint: prints the result, writes the
    JSON in the workdir and returns its record. `kwargs` as `cli.evaluate.evaluate`
    (output, overwrite, by_position, decode_overrides, ...)."""
    return evaluate_mode.evaluate(self.run.workdir, split=split, max_examples=max_examples,
                                  checkpoint_step=self.run.step if len(self.run.steps) == 1
                                  else None, **kwargs)


def load(workdir: str, *, checkpoint_step: int | None = None, average_last: int = 0,
         config: ml_collections.ConfigDict | None = None) -> Model:
  """A run's model from its workdir: a trained run, or a Hugging Face import.

  Args:
    workdir: the run's workdir (launch.py --workdir, or --mode=import's).
    checkpoint_step: the checkpoint; None: the newest.
    average_last: N > 1: the mean of the newest N checkpoints.
    config: optional; its data.* and decode.* replace the run's (inference/loaded.py).
  """
  return Model(loaded.load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                               average_last=average_last))


def import_hf(hf_dir: str, workdir: str,
              config: ml_collections.ConfigDict | None = None) -> Model:
  """launch.py --mode=import: a local Hugging Face folder -> a new workdir, loaded."""
  importer.import_folder(hf_dir, workdir, config)
  return load(workdir)


def build_model(config: ml_collections.ConfigDict, seed: int = 0) -> tuple[Any, Any]:
  """The model of a config (validated first) and freshly initialised parameters.

  Returns:
    (module, params): a deterministic flax module and its unboxed parameters; call
    `module.apply({"params": params}, *inputs)` with the objective's inputs (for a
    decoder LM: inputs, segment_ids, positions; tokens [B, L] int32).
  """
  validate(config)
  model_config = ModelConfig.from_config(config.model)
  module = make_model(dataclasses.replace(model_config, deterministic=True))
  objective = objective_lib.resolve(model_config)
  batch = objectives.init_batch(objective, 1, config.data.seq_len)
  variables = jax.jit(module.init)({"params": jax.random.PRNGKey(seed)},
                                   *objectives.model_inputs(objective, batch))
  return module, nn.meta.unbox(variables["params"])


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """launch.py --mode=train: trains (or resumes) `config` in `workdir`; the final metrics."""
  return loop.train_and_evaluate(config, workdir)
