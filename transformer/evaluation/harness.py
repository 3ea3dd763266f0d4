"""lm-evaluation-harness's model for this project's runs: every lm-eval task on a workdir.

An optional extra (`pip install lm-eval==0.4.13`, requirements-benchmarks.txt; it pulls
`datasets`, pandas and scikit-learn, not torch). `TransformerLM` is lm-eval's
`TemplateLM` over a loaded run, registered as model "transformer", in-process as
Levanter's harness model is:

  loglikelihood          text -> (context ids, continuation ids) by --mode=benchmark's
                         encoder (requests.Encoding: lm-eval 0.4.13's HF backend's
                         split and special tokens, causal or seq2seq), then its scorer
                         (evaluation/scoring.py: packed, batched, sharded over the mesh,
                         the context left-truncated to min(data.seq_len,
                         model.max_len)); a request the HF backend refuses (no context
                         token, a continuation longer than the window) stops the run
                         with one line, as the HF backend's assertion does;
  loglikelihood_rolling  a text's every token once, in windows with the most context
                         (requests.Encoding.rolling, lm-eval's windows);
  generate_until         greedy decoding of the run's KV-cached decoder (inference/
                         text.py), cut at the first `until` string.

lm-eval 0.4.13's command line finds models in its own table only (lm_eval/models/
__init__.py), so this module is also its command line with the model registered:

  python -m transformer.evaluation.harness --model transformer \\
      --model_args workdir=RUN[,checkpoint_step=N,batch_rows=16] --tasks hellaswag

takes every argument of `lm_eval run`. From Python: import this module, then
`lm_eval.simple_evaluate(model="transformer", model_args="workdir=RUN", tasks=[...])`.
"""

from __future__ import annotations

import sys
from typing import Any

from transformer.workdir import console

# Before lm-eval and the run's loading import JAX: on a host with no TPU or GPU, JAX's
# CPU backend only, the CUDA plugin's and libtpu's start-up lines kept off the console
# (the same call launch.py and api.py make).
console.quiet_absent_accelerators()

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax

with console.backends_starting():  # The plugin's line as the backends start: log only.
  jax.devices()

import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from transformer.config.errors import ConfigError
from transformer.data.tokenizers import vocabularies
from transformer.evaluation import requests as requests_lib
from transformer.evaluation import scoring
from transformer.inference import loaded
from transformer.inference import text

MODEL_NAME = "transformer"


@register_model(MODEL_NAME)
class TransformerLM(TemplateLM):
  """A workdir's decoder LM or encoder-decoder as an lm-eval model (see the module
  docstring)."""

  def __init__(self, workdir: str, checkpoint_step: int | str | None = None,
               average_last: int | str = 0, batch_rows: int | str = 0,
               max_gen_toks: int | str = 256, **unused: Any):
    """lm-eval's --model_args: workdir=RUN, checkpoint_step=N, average_last=N,
    batch_rows=N (rows of packed requests a batch; 0: the run's data.batch_size),
    max_gen_toks=N. lm-eval's own batch_size and device, which it passes every model
    (batch_size 1 unless told), are not used: requests are packed many to a row and the
    run's mesh places them."""
    super().__init__()
    del unused
    self.run = loaded.load_run(
        workdir, checkpoint_step=None if checkpoint_step in (None, "") else int(checkpoint_step),
        average_last=int(average_last))
    self.scorer = scoring.LogLikelihoodScorer.create(self.run.config, self.run.mesh,
                                                     self.run.param_shardings,
                                                     int(batch_rows), mode="lm_eval")
    self.max_gen_toks = int(max_gen_toks)
    self.encoding = requests_lib.Encoding(self.run.tokenizer, self.scorer.seq2seq)
    self.backend = "seq2seq" if self.scorer.seq2seq else "causal"
    print(f"lm-eval model {MODEL_NAME}: {self.encoding.sentence()}", file=sys.stderr)

  @property
  def eot_token_id(self) -> int:
    return vocabularies.EOS_ID

  @property
  def prefix_token_id(self) -> int:
    return self.encoding.prefix_id  # lm-eval's: the tokenizer's bos, else its eos.

  @property
  def max_length(self) -> int:
    return self.scorer.length

  def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                 **kwargs: Any) -> list[int]:
    """HFLM.tok_encode's ids of `string`: the tokenizer's special tokens unless
    `add_special_tokens` is False (None: unless `string` starts with the prefix token)."""
    del kwargs
    return self.encoding.encode(string, add_special_tokens)

  def tok_decode(self, tokens: list[int], **kwargs: Any) -> str:
    return self.run.tokenizer.decode(tokens)

  def _score(self, pairs: list[requests_lib.Request]) -> scoring.Scores:
    return self.scorer.score(self.run.params, pairs)

  def loglikelihood(self, requests, disable_tqdm: bool = False
                    ) -> list[tuple[float, bool]]:
    """(log-likelihood, greedy) of each request's (context, continuation) of text, split
    by --mode=benchmark's encoder (requests.Encoding.pair)."""
    return self._loglikelihood_tokens(
        [((c, x), *self.encoding.pair(c, x)) for c, x in (r.args for r in requests)],
        disable_tqdm)

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False,
                            **kwargs: Any) -> list[tuple[float, bool]]:
    """(log-likelihood, greedy) of each ((context, continuation), ids, ids) request.

    Raises:
      ConfigError: a request lm-eval's HF backend refuses (requests.refusal), counted
        and named: the HF backend stops there too (an assertion), and a partial score
        would be compared with whole ones.
    """
    pairs = [(tuple(context), tuple(continuation)) for _, context, continuation in requests]
    refused = [(strings, why) for (strings, _, _), why in zip(
        requests, (requests_lib.refusal(p, self.max_length) for p in pairs)) if why]
    if refused:
      (context, continuation), why = refused[0]
      raise ConfigError(
          f"{len(refused)} of {len(pairs)} lm-eval requests cannot be scored whole with a "
          f"window of {self.max_length} tokens, the first because "
          f"{requests_lib.REFUSALS[why]} (context {context[-40:]!r}, continuation "
          f"{continuation[:40]!r}); lm-eval's HF backend refuses them too. Use a run "
          "with a longer data.seq_len/model.max_len, or tasks with shorter continuations")
    scores = self._score(pairs)
    answers = [(float(ll), bool(g)) for ll, g in zip(scores.loglik, scores.greedy)]
    for (strings, _, _), answer in zip(requests, answers):
      self.cache_hook.add_partial("loglikelihood", strings, answer)
    return answers

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """The log-likelihood of each request's whole text (its every token once)."""
    pairs, owner = [], []
    for index, request in enumerate(requests):
      windows = self.encoding.rolling(request.args[0], self.max_length)
      pairs += windows
      owner += [index] * len(windows)
    scores = self._score(pairs)
    totals = np.zeros(len(requests))
    np.add.at(totals, np.asarray(owner, np.int64), scores.loglik)
    for request, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", (request.args[0],), float(total))
    return [float(t) for t in totals]

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Greedy continuations, each cut at the first of its `until` strings.

    Raises:
      ConfigError: an encoder-decoder run (its generation is --mode=translate's).
    """
    if self.scorer.seq2seq:
      raise ConfigError("lm-eval's generate_until on an encoder-decoder run is not served "
                        "by this model (loglikelihood tasks are); translate with "
                        "--mode=translate")
    outputs = []
    for request in requests:
      context, options = request.args
      until = options.get("until", [])
      until = [until] if isinstance(until, str) else list(until)
      max_new = int(options.get("max_gen_toks", self.max_gen_toks))
      max_new = max(1, min(max_new, self.max_length - 2))
      greedy = self.run.config.decode.copy_and_resolve_references()
      greedy.update(beam_size=1, temperature=0.0, top_k=0, top_p=1.0)
      policy = text.prompt_policy(self.run.config, max_new, "truncate")
      with self.run.context():
        output = text.continue_texts(self.run.model_config, self.run.params,
                                     self.run.tokenizer, [context or " "], greedy, policy,
                                     max_new_tokens=max_new, names=["lm-eval request"])[0]
      cuts = [output.index(stop) for stop in until if stop and stop in output]
      output = output[:min(cuts)] if cuts else output
      self.cache_hook.add_partial("generate_until", (context, options), output)
      outputs.append(output)
    return outputs


def main(argv: list[str] | None = None) -> None:
  """lm-eval's command line with model "transformer" registered (module docstring)."""
  from lm_eval.__main__ import cli_evaluate  # pylint: disable=g-import-not-at-top
  if argv is not None:
    sys.argv = [sys.argv[0]] + list(argv)
  try:
    cli_evaluate()
  except ConfigError as e:  # A request or run it cannot score: one line, as launch.py says.
    sys.stderr.write(f"\nConfigError: {e}\n")
    sys.exit(2)


if __name__ == "__main__":
  main()
