"""--mode=generate: continue --prompt (or each line of --input, or of stdin) with a decoder LM
-> --output (or stdout); greedy unless --temperature (sampling) or --beam_size=N (beam search).

A text-to-text model (model.objective span_corruption, prefix_lm or ul2, on a decoder
or an encoder-decoder) answers each prompt as its training inputs: a prompt holding
`<extra_id_0>` ... gets those spans filled, shown as `<extra_id_0> ... <extra_id_1> ...`
(inference/text.py's generate_texts).

Greedy by default (the likeliest token each step); --temperature > 0 samples (with
--top_k / --top_p), --beam_size=N > 1 is beam search.

The continuations go to --output (written at the end, atomically; --overwrite to
replace it) or stdout, each followed by a newline, as translate and classify write.

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
from transformer.data.datasets import local_files
from transformer.inference import loaded
from transformer.inference import text
from transformer.workdir import progress as progress_lib

PROMPT = flags.DEFINE_string(
    "prompt", None, "generate: the text to continue (default: each line of --input, or of "
    "stdin).")
STARTS_JAX = True
# generate's search unless --beam_size asks for another: greedy (the run's
# decode.beam_size, 4 by default, is translation's beam).
GENERATE_BEAM_SIZE = 1
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("input", "output", "overwrite", "seed", *common.LOADING_FLAGS)


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=generate."""
  if PROMPT.value is not None and common.INPUT.value:
    raise ConfigError("--prompt and --input both give prompts; pass one of them")
  prompts = None if PROMPT.value is None else [PROMPT.value]
  loading = common.loading_flags(config)
  if loading["decode_overrides"]["beam_size"] is None and (
      "decode.beam_size" in common.config_overrides()):
    # --config.decode.beam_size on the command line asks for beam search as --beam_size does.
    loading["decode_overrides"]["beam_size"] = config.decode.beam_size
  generate(workdir, prompts, input_path=common.INPUT.value, output_path=common.OUTPUT.value,
           overwrite=common.OVERWRITE.value, seed=common.SEED.value, **loading)


def generate(workdir: str, prompts: Sequence[str] | None = None, *,
             input_path: str = "", output_path: str = "", overwrite: bool = False,
             config: ml_collections.ConfigDict | None = None,
             checkpoint_step: int | None = None, average_last: int = 0,
             decode_overrides: Mapping[str, Any] | None = None,
             model_overrides: Mapping[str, Any] | None = None, seed: int | None = None,
             stdin: TextIO | None = None, stdout: TextIO | None = None) -> list[str]:
  """Continues prompts with a decoder LM (or answers them with a text-to-text model:
  text.generate_texts) and prints each continuation.

  Each prompt is [bos] + its ids, as training documents begin. The search is greedy
  (the likeliest token each step) by default, as nanoGPT's and Hugging Face's: the
  run's decode.beam_size is translation's (4) and applies here only when
  `decode_overrides` gives a beam_size (--beam_size=N, beam search for N > 1); at
  decode.temperature > 0 it samples (temperature, top_k, top_p). decode.max_new_tokens
  tokens at most.

  Args:
    workdir: the run's workdir.
    prompts: the texts to continue; None reads `input_path` (or stdin), one prompt
      per line. A leading UTF-8 byte-order mark is dropped from each source.
    input_path: a UTF-8 file (or pipe), one prompt a line; "" reads `stdin`.
    output_path: where the continuations go (atomically, at the end); "" prints them.
      Never the input; an existing file only with `overwrite`.
    overwrite: allow replacing an existing output file.
    config, checkpoint_step, average_last, decode_overrides, model_overrides: as for
      `inference.loaded.load_run`.
    seed: the sampling seed; None: the run's config.seed.
    stdin: where prompts are read when `prompts` is None (default sys.stdin).
    stdout: where continuations are printed, one after another, each followed by a
      newline (default sys.stdout).

  Returns:
    The continuations, in prompt order.

  Raises:
    ConfigError: a model that neither continues nor answers text, an empty prompt, a missing input, an output that
      exists (or is the input), or (decode.overlong='error') a
      prompt that does not fit the context with max_new_tokens.
  """
  if output_path:
    common.check_output(output_path, overwrite, [input_path])
  read = prompts is None
  if read:  # Read (and checked) before the model loads.
    prompts = common.read_lines(input_path, stdin or sys.stdin)
    names = [f"{input_path or 'stdin'} line {i + 1}" for i in range(len(prompts))]
  else:
    names = ["--prompt"] if len(prompts) == 1 else [f"prompt {i + 1}"
                                                     for i in range(len(prompts))]
    prompts = [local_files.strip_bom(p, name) for p, name in zip(prompts, names)]
  if not prompts:
    raise ConfigError("no prompt: give --prompt=TEXT, --input=FILE or lines on stdin")
  prompts = [common.check_text(p, name) for p, name in zip(prompts, names)]
  decode_overrides = dict(decode_overrides or {})
  if decode_overrides.get("beam_size") is None:
    decode_overrides["beam_size"] = GENERATE_BEAM_SIZE
  run = loaded.load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                        average_last=average_last, decode_overrides=decode_overrides,
                        model_overrides=model_overrides)
  run.require("generate", text.generate_serves,
              "continues prompts (or fills a text-to-text model's sentinels)")
  decode = run.config.decode
  # Lines of a file or a pipe are counted; a --prompt is not.
  generating = progress_lib.Progress("generate", len(prompts), "prompts") if read else None
  with run.context():
    continuations = text.generate_texts(
        run.config, run.model_config, run.params, run.tokenizer, prompts, decode,
        max_new_tokens=decode.max_new_tokens, overlong=decode.overlong, names=names,
        rng=run.sampling_rng(seed), progress=generating)
  if generating:
    generating.finish()
  if jax.process_index() == 0:
    result = "".join(continuation + "\n" for continuation in continuations)
    common.write_result(result, len(continuations), "continuations", output_path, overwrite, input_path,
                        stdout)
  return continuations
