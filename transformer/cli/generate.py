"""--mode=generate: continue --prompt (or each stdin line) with a decoder LM.

Reads --workdir's model, vocabulary and checkpoint (inference/loaded.py says what comes
from where); --config is optional and only its data.* and decode.* are used; the
decode flags (cli/common.py) set single decode.* fields.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping, Sequence, TextIO

import jax
import ml_collections
from absl import flags

from transformer.cli import common
from transformer.config.errors import ConfigError
from transformer.inference import loaded
from transformer.inference import text

PROMPT = flags.DEFINE_string(
    "prompt", None, "generate: the text to continue (default: each line of stdin).")
STARTS_JAX = True


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=generate."""
  prompts = None if PROMPT.value is None else [PROMPT.value]
  generate(workdir, prompts, seed=common.SEED.value, **common.loading_flags(config))


def generate(workdir: str, prompts: Sequence[str] | None = None, *,
             config: ml_collections.ConfigDict | None = None,
             checkpoint_step: int | None = None, average_last: int = 0,
             decode_overrides: Mapping[str, Any] | None = None, seed: int | None = None,
             stdin: TextIO | None = None, stdout: TextIO | None = None) -> list[str]:
  """Continues prompts with a decoder LM and prints each continuation.

  Each prompt is [bos] + its ids, as training documents begin. The search follows
  decode.* (see text.search_options): greedy for beam_size 1 at temperature 0,
  beam search for beam_size > 1, sampling (temperature, top_k, top_p) for
  temperature > 0; decode.max_new_tokens tokens at most.

  Args:
    workdir: the run's workdir.
    prompts: the texts to continue; None reads stdin, one prompt per line.
    config, checkpoint_step, average_last, decode_overrides: as for `inference.loaded.load_run`.
    seed: the sampling seed; None: the run's config.seed.
    stdin: where prompts are read when `prompts` is None (default sys.stdin).
    stdout: where continuations are printed, one after another, each followed by a
      newline (default sys.stdout).

  Returns:
    The continuations, in prompt order.

  Raises:
    ConfigError: not a decoder LM, an empty prompt, or (decode.overlong='error') a
      prompt that does not fit the context with max_new_tokens.
  """
  run = loaded.load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                 average_last=average_last, decode_overrides=decode_overrides)
  run.require("decoder", "lm", "generate",
           "Use --mode=translate for an encoder-decoder.")
  if prompts is None:
    prompts = common.read_lines("", stdin or sys.stdin)
    names = [f"stdin line {i + 1}" for i in range(len(prompts))]
  else:
    names = ["--prompt"] if len(prompts) == 1 else [f"prompt {i + 1}"
                                                     for i in range(len(prompts))]
  if not prompts:
    raise ConfigError("no prompt: give --prompt=TEXT or lines on stdin")
  prompts = [common.check_text(p, name) for p, name in zip(prompts, names)]
  decode = run.config.decode
  policy = text.prompt_policy(run.config, decode.max_new_tokens, decode.overlong)
  with run.context():
    continuations = text.continue_texts(
        run.model_config, run.params, run.tokenizer, prompts, decode, policy,
        max_new_tokens=decode.max_new_tokens, names=names, rng=run.sampling_rng(seed))
  out = stdout or sys.stdout
  if jax.process_index() == 0:
    for continuation in continuations:
      out.write(continuation + "\n")
    out.flush()
  return continuations
