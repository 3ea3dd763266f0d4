"""What several command-line modes share: their common flags and file handling.

Flags that belong to one mode live in that mode's module (cli/evaluate.py defines
--split, cli/translate.py --input, ...); those here serve several modes, and each
mode's docstring says what they mean for it. launch.py defines the flags every
mode has (--config, --workdir, --mode and the jax.distributed ones).
"""

from __future__ import annotations

import os
from typing import Any, Sequence, TextIO

from absl import flags

from transformer.configuration import ConfigError

CHECKPOINT_STEP = flags.DEFINE_integer(
    "checkpoint_step", None, "evaluate, translate, generate, average, export: the "
    "checkpoint to use (default: the newest).")
AVERAGE_LAST = flags.DEFINE_integer(
    "average_last", 0, "evaluate, translate, generate, average: use the mean of the "
    "parameters of the newest N checkpoints (up to --checkpoint_step); the paper: 5 for "
    "base, 20 for big. 0: no averaging.")
OUTPUT = flags.DEFINE_string(
    "output", "", "Where a mode writes its result: translate, the translations (default "
    "stdout); evaluate, the result JSON (default in the workdir); average, the new "
    "workdir; compile, the JSON report.")
OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "translate, evaluate: allow replacing an existing --output.")
SEED = flags.DEFINE_integer("seed", None, "Sampling seed (default config.seed).")
LOG_STEPS = flags.DEFINE_bool("log_steps", False, "plot, compare, sweep: log-scaled step axis.")
HF_DIR = flags.DEFINE_string(
    "hf_dir", "", "import: the Hugging Face model folder to read (config.json + "
    "model.safetensors); export: the folder to write.")
# decode.* fields these flags set, over the workdir's (or --config's) values.
DECODE_FLAGS = {
    "beam_size": flags.DEFINE_integer("beam_size", None, "decode.beam_size: 1 is greedy."),
    "alpha": flags.DEFINE_float("alpha", None, "decode.alpha: beam length penalty."),
    "max_length_offset": flags.DEFINE_integer(
        "max_length_offset", None, "decode.max_length_offset: output <= source + this."),
    "max_new_tokens": flags.DEFINE_integer(
        "max_new_tokens", None, "decode.max_new_tokens: tokens generate adds."),
    "temperature": flags.DEFINE_float(
        "temperature", None, "decode.temperature: > 0 samples (0: greedy / beam)."),
    "top_k": flags.DEFINE_integer("top_k", None, "decode.top_k: sample among the k likeliest."),
    "top_p": flags.DEFINE_float("top_p", None, "decode.top_p: nucleus sampling mass."),
    "batch_size": flags.DEFINE_integer(
        "decode_batch_size", None, "decode.batch_size: sentences decoded together."),
    "overlong": flags.DEFINE_enum(
        "overlong", None, ["truncate", "error"], "decode.overlong: a source or prompt "
        "longer than the context is truncated (warned) or stops the command."),
}


def loading_flags(config: Any) -> dict[str, Any]:
  """The keyword arguments of `inference.loaded.load_run` that the flags give."""
  return dict(config=config, checkpoint_step=CHECKPOINT_STEP.value,
              average_last=AVERAGE_LAST.value,
              decode_overrides={key: flag.value for key, flag in DECODE_FLAGS.items()})


def read_lines(path: str, stream: TextIO) -> list[str]:
  """Lines of a UTF-8 file (or `stream` for ""), without line ends; '\\n'-separated only."""
  if path:
    if not os.path.isfile(path):
      raise ConfigError(f"--input={path!r} is not a file")
    with open(path, encoding="utf-8", newline="") as f:
      text = f.read()
  else:
    text = stream.read()
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # The final newline ends the last line; it does not start another.
  return [line[:-1] if line.endswith("\r") else line for line in lines]


def check_output(path: str, overwrite: bool, inputs: Sequence[str] = ()) -> None:
  """Refuses to write over an input, or over an existing file without `overwrite`."""
  for other in inputs:
    if other and os.path.exists(path) and os.path.samefile(path, other):
      raise ConfigError(f"--output={path!r} is the input file; write elsewhere (the input is "
                        "never overwritten)")
  if os.path.exists(path) and not overwrite:
    raise ConfigError(f"--output={path!r} exists; pass --overwrite to replace it, or choose "
                      "another path")
