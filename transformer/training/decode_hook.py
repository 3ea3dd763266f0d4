"""What the training loop decodes at each evaluation: in-training BLEU, label accuracy
and a sample.

BLEU on the first `train.bleu_examples` sentences of the eval split (translation
runs), the label accuracy of the first `train.label_examples` texts (a labelled text
trained text-to-text) and a greedy continuation of `train.sample_prompt` (decoder LMs),
through the same text in / text out path as --mode=translate, --mode=evaluate and
--mode=generate (inference/text.py). `DecodeAtEvaluation` is the loop's after_eval hook (hooks.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

import jax
import ml_collections
from absl import logging

from transformer.config import objective as objective_lib
from transformer.config.model import ModelConfig
from transformer.data import sources
from transformer.data.datasets import catalog
from transformer.data.tokenizers import run_vocabulary
from transformer.inference import text
from transformer.training import hooks

_TRAINING_INPUTS: dict[str, Any] = {}  # Loaded once per run: tokenizer and BLEU sentences.
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
  if message not in _WARNED:
    _WARNED.add(message)
    logging.warning("%s", message)


def _training_inputs(config: ml_collections.ConfigDict, workdir: str,
                     bleu_examples: int, label_examples: int) -> dict[str, Any]:
  """The tokenizer and the first eval sentences (or labelled texts), read on the first
  evaluation only."""
  key = json.dumps([workdir, config.data.to_dict(), bleu_examples, label_examples],
                   sort_keys=True)
  if key not in _TRAINING_INPUTS:
    inputs: dict[str, Any] = {"tokenizer": run_vocabulary.load_workdir_tokenizer(workdir)}
    if bleu_examples or label_examples:
      split = catalog.data_source(catalog.load_builder(config.data), config.data.eval_split)
    if bleu_examples:
      inputs["texts"], inputs["references"] = text.source_and_reference_texts(config.data, split,
                                                                bleu_examples)
    if label_examples:
      inputs["names"] = sources.label_names(split, config.data.label_key)
      inputs["labelled"], inputs["labels"] = text.labelled_texts(
          config.data, split, inputs["names"], label_examples)
    _TRAINING_INPUTS[key] = inputs
  return _TRAINING_INPUTS[key]


def decode_at_evaluation(config: ml_collections.ConfigDict, workdir: str, model_config: ModelConfig,
                         params: Any, writer: Any, step: int) -> dict[str, float]:
  """What the training loop adds to an evaluation: eval_bleu, eval_label_accuracy and a
  sample, as configured.

  With `train.bleu_examples` = n > 0 on a translation run, the first n sentences of
  the eval split are translated with decode.* (beam search by default) and scored
  with sacreBLEU; two of them are logged (source / reference / output) and written to
  TensorBoard as text. With `train.sample_prompt` on a decoder LM, a greedy
  continuation of decode.max_new_tokens tokens is logged and written likewise. With
  `train.label_examples` = n > 0 on a labelled text trained text-to-text, the first n
  texts are answered with decode.* and scored as --mode=evaluate scores them
  (eval_label_accuracy, eval_label_unknown). Every
  process decodes (the parameters are sharded over all of them); process 0 writes.

  Args:
    config: the run's config (model.vocab_size resolved).
    workdir: the run's workdir, whose tokenizer files are read once.
    model_config: the run's ModelConfig (`Trainer.model_config`).
    params: the current parameters; call inside `Trainer.context()`.
    writer: the run's metrics_file.MetricWriter.
    step: the step being evaluated.

  Returns:
    {"eval_bleu": ...} on translation runs with train.bleu_examples > 0,
    {"eval_label_accuracy": ..., "eval_label_unknown": ...} on labelled runs with
    train.label_examples > 0, else {}.
  """
  objective = objective_lib.resolve(config.model)
  bleu_examples = config.train.bleu_examples
  if bleu_examples and not (objective.translates and sources.is_translation(config.data)):
    _warn_once(f"config.train.bleu_examples={bleu_examples} is ignored: BLEU needs a "
               "translation run (data.source_language and data.target_language, and an "
               f"objective that reads pairs: {objective_lib.describe(lambda o: o.translates)})")
    bleu_examples = 0
  prompt = config.train.sample_prompt
  if prompt and not text.generate_serves(objective):
    _warn_once(f"config.train.sample_prompt={prompt!r} is ignored: samples come from "
               f"{objective_lib.describe(text.generate_serves)}, not the {objective.name} "
               "objective")
    prompt = ""
  label_examples = config.train.label_examples  # validate() checked the run reads labels.
  if not bleu_examples and not prompt and not label_examples:
    return {}
  inputs = _training_inputs(config, workdir, bleu_examples, label_examples)
  tokenizer = inputs["tokenizer"]
  metrics = {}
  if bleu_examples:
    # Never stop a run over one long eval sentence: truncate it whatever decode.overlong.
    policy = text.source_policy(config, "truncate")
    start = time.perf_counter()
    outputs = text.translate_texts(model_config, params, tokenizer, inputs["texts"], config.decode,
                              policy, names=[f"{config.data.eval_split}[{i}]"
                                             for i in range(len(inputs["texts"]))],
                              rng=jax.random.PRNGKey(config.seed))
    scores = text.corpus_scores(outputs, inputs["references"])
    metrics["eval_bleu"] = scores["bleu"]
    logging.info("eval_bleu %.2f at step %d on the first %d sentences of %s (%s, %.1f s): %s",
                 scores["bleu"], step, len(outputs), config.data.eval_split,
                 ", ".join(f"{k} {v}" for k, v in text.describe_search(config.decode).items()),
                 time.perf_counter() - start,
                 scores["bleu_signature"])
    examples = []
    for i in range(min(2, len(outputs))):
      logging.info("translation %d at step %d\n  source:    %s\n  reference: %s\n  output:    %s",
                   i, step, inputs["texts"][i], inputs["references"][i], outputs[i])
      examples.append(f"**source:** {inputs['texts'][i]}  \n**reference:** "
                      f"{inputs['references'][i]}  \n**output:** {outputs[i]}")
    writer.write_text(step, "translations", "\n\n".join(examples))
  if label_examples:
    metrics.update(_label_accuracy(config, model_config, params, inputs, step))
  if prompt:
    # As many tokens as asked when the prompt leaves room; else at least half the context.
    context, prompt_len = text.source_context(config), 1 + len(tokenizer.encode(prompt))
    max_new = min(config.decode.max_new_tokens, max(context - prompt_len + 1, context // 2))
    greedy = ml_collections.ConfigDict(dict(config.decode.to_dict(), beam_size=1,
                                            temperature=0.0, top_k=0, top_p=1.0))
    continuation = text.generate_texts(config, model_config, params, tokenizer, [prompt],
                                       greedy, max_new_tokens=max_new, overlong="truncate",
                                       names=["train.sample_prompt"])[0]
    logging.info("sample at step %d (greedy, %d tokens at most): %r -> %r", step, max_new,
                 prompt, continuation)
    writer.write_text(step, "sample", f"**prompt:** {prompt}  \n**continuation:** "
                      f"{continuation}")
  return metrics


def _label_accuracy(config: ml_collections.ConfigDict, model_config: ModelConfig,
                    params: Any, inputs: dict[str, Any], step: int) -> dict[str, float]:
  """eval_label_accuracy and eval_label_unknown of the first train.label_examples texts."""
  start = time.perf_counter()
  texts = inputs["labelled"]
  outputs = text.translate_texts(model_config, params, inputs["tokenizer"], texts,
                                 config.decode, text.source_policy(config, "truncate"),
                                 names=[f"{config.data.eval_split}[{i}]"
                                        for i in range(len(texts))],
                                 rng=jax.random.PRNGKey(config.seed))
  scores = text.label_scores(outputs, inputs["labels"], inputs["names"])
  logging.info("eval_label_accuracy %.4f at step %d on the first %d texts of %s (%.4f "
               "named no class of %s; %s, %.1f s)", scores["label_accuracy"], step,
               len(texts), config.data.eval_split, scores["label_unknown"],
               list(inputs["names"]), ", ".join(
                   f"{k} {v}" for k, v in text.describe_search(config.decode).items()),
               time.perf_counter() - start)
  return {f"eval_{name}": value for name, value in scores.items()}


class DecodeAtEvaluation(hooks.Hook):
  """`decode_at_evaluation` as the loop's after_eval hook: adds eval_bleu (and
  eval_label_accuracy) to the row."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str,
               model_config: ModelConfig, writer: Any):
    self.config, self.workdir = config, workdir
    self.model_config, self.writer = model_config, writer

  def after_eval(self, step: int, state: Any, metrics: dict[str, float]) -> None:
    metrics.update(decode_at_evaluation(self.config, self.workdir, self.model_config,
                                        state.params, self.writer, step))
