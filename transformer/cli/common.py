"""What several command-line modes share: their common flags and file handling.

Flags that belong to one mode live in that mode's module (cli/evaluate.py defines
--split, cli/translate.py --input, ...); those here serve several modes, and each
mode's docstring says what they mean for it. launch.py defines the flags every
mode has (--config, --workdir, --mode and the jax.distributed ones).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Collection, Sequence, TextIO

import ml_collections
from absl import flags
from absl import logging

from transformer.config import train as train_config
from transformer.config.checks import lookup
from transformer.config.errors import ConfigError
from transformer.workdir import files

CHECKPOINT_STEP = flags.DEFINE_integer(
    "checkpoint_step", None, "evaluate, translate, generate, passkey, benchmark, average, "
    "export: the checkpoint to use (default: the newest).")
AVERAGE_LAST = flags.DEFINE_integer(
    "average_last", 0, "evaluate, translate, generate, passkey, benchmark, average: use the "
    "mean of the parameters of the newest N checkpoints (up to --checkpoint_step); the paper: 5 for "
    "base, 20 for big. 0: no averaging.")
INPUT = flags.DEFINE_string(
    "input", "", "translate, classify, generate: a UTF-8 file (or pipe), one text a line "
    "(default stdin).")
OUTPUT = flags.DEFINE_string(
    "output", "", "Where a mode writes its result: translate, the translations, "
    "generate, the continuations, and classify, the classes (default stdout); evaluate, "
    "passkey and benchmark, the result JSON (default in the workdir); average, the new "
    "workdir; compile, the JSON report.")
OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "translate, generate, classify, evaluate, passkey, benchmark: allow "
    "replacing an existing --output.")
SEED = flags.DEFINE_integer(
    "seed", None, "evaluate, translate, generate: sampling seed; passkey: the keys' seed (default "
    "config.seed).")
RAY_ADDRESS = flags.DEFINE_string(
    "ray_address", "", "prepare: run the tasks on a running Ray cluster's nodes; sweep: run "
    "the arms there as Ray tasks (with --devices_per_run): 'auto' (on a node of it) or "
    "HOST:PORT of its head; '' (default): this machine. Keep the cluster's ports inside a "
    "private network (docs/corpus.md).")
LOG_STEPS = flags.DEFINE_bool("log_steps", False, "plot, compare, sweep: log-scaled step axis.")
HF_DIR = flags.DEFINE_string(
    "hf_dir", "", "import: the Hugging Face model folder to read (config.json + "
    "model.safetensors); export: the folder to write.")
# decode.* fields these flags set, over the workdir's (or --config's) values.
DECODE_FLAGS = {
    "beam_size": flags.DEFINE_integer(
        "beam_size", None, "decode.beam_size: 1 is greedy; translate's default is the run's "
        "decode.beam_size (4), generate's is 1 (greedy)."),
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


# The flags `loading_flags` reads: what a mode that loads a run for inference lists in
# its SHARED_FLAGS.
DECODE_FLAG_NAMES = tuple(flag.name for flag in DECODE_FLAGS.values())
LOADING_FLAGS = ("checkpoint_step", "average_last", *DECODE_FLAG_NAMES)


def config_overrides() -> dict[str, Any]:
  """{key: value} of the --config.x flags given on the command line (config_flags records them)."""
  if "config" not in flags.FLAGS or flags.FLAGS["config"].value is None:
    return {}  # No --config (a reading mode): no overrides, and none recorded to ask for.
  return dict(flags.FLAGS["config"].override_values)


def fit_steps_per_call(config: ml_collections.ConfigDict, explicit: Collection[str],
                       where: str = "") -> None:
  """Lowers a preset's train.steps_per_call to a divisor of every cadence, said in one line.

  train.steps_per_call is a speed knob (the same updates, fewer compiled calls) that the
  CPU presets set to 10; a cadence the user sets (--config.train.log_every=5) must not
  be refused for it. Unless the command line sets train.steps_per_call itself, it
  becomes the largest value <= the preset's that divides train.log_every,
  train.eval_every and checkpoint.every; an explicit value that conflicts is left for
  `validate` to refuse. Every process that builds the config (a sweep and each of its
  runs) derives the same value from the same flags.

  Args:
    config: the config to adjust in place (a locked ConfigDict may change values).
    explicit: the keys the command line sets (config_overrides(), a sweep run's keys).
    where: what to prefix the line with (a sweep's run), "" for none.
  """
  per_call = config.train.steps_per_call
  cadences = {key: lookup(config, key) for key in train_config.STEPS_PER_CALL_CADENCES}
  if ("train.steps_per_call" in explicit or isinstance(per_call, bool)
      or not isinstance(per_call, int) or per_call < 1
      or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                 for v in cadences.values())):
    return  # Explicit, or a value validate refuses in its own words.
  common_divisor = math.gcd(*cadences.values())
  if common_divisor % per_call == 0:
    return
  fitted = max(d for d in range(1, per_call + 1) if common_divisor % d == 0)
  config.train.steps_per_call = fitted
  logging.warning(
      "%strain.steps_per_call=%d (the preset's) does not divide %s: using %d, the largest "
      "value <= %d that divides them all (set --config.train.steps_per_call to choose)",
      f"{where}: " if where else "", per_call,
      ", ".join(f"{key}={every}" for key, every in cadences.items() if every % per_call),
      fitted, per_call)


def model_overrides() -> dict[str, Any]:
  """The --config.model.* flags of the command line, {"model.rope_scaling": "linear", ...}.

  A mode that reads a run takes its model from config.json; these are the fields the
  command changes on purpose (loaded.load_config refuses those that would not fit the
  checkpoint, rather than ignoring them).
  """
  return {k: v for k, v in config_overrides().items() if k.startswith("model.")}


def loading_flags(config: Any) -> dict[str, Any]:
  """The keyword arguments of `inference.loaded.load_run` that the flags give."""
  return dict(config=config, checkpoint_step=CHECKPOINT_STEP.value,
              average_last=AVERAGE_LAST.value,
              decode_overrides={key: flag.value for key, flag in DECODE_FLAGS.items()},
              model_overrides=model_overrides())


def decode_utf8(raw: bytes, where: str) -> str:
  """`raw` as UTF-8; ConfigError naming the line, column and byte of the first bad byte."""
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    line = raw.count(b"\n", 0, e.start) + 1
    column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
    raise ConfigError(
        f"{where}:{line}: undecodable UTF-8 at byte {column} of the line (0x{raw[e.start]:02x},"
        f" byte offset {e.start}): the input must be UTF-8; re-encode it, e.g. "
        "`iconv -f latin1 -t utf-8`") from None


def check_text(text: str, where: str) -> str:
  """Refuses text holding lone surrogates (undecodable bytes smuggled in by the OS)."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    # Python decodes undecodable command-line bytes as surrogates U+DC80..U+DCFF.
    byte = ord(text[e.start]) - 0xDC00 if 0xDC80 <= ord(text[e.start]) <= 0xDCFF else None
    raise ConfigError(
        f"{where}: undecodable UTF-8 at character {e.start + 1}"
        + (f" (byte 0x{byte:02x})" if byte is not None else "")
        + ": the text must be UTF-8; re-encode it, e.g. `iconv -f latin1 -t utf-8`") from None
  return text


def read_lines(path: str, stream: TextIO) -> list[str]:
  """Lines of a UTF-8 file (or `stream` for ""), without line ends; '\\n'-separated only.

  `path` may be anything readable (a pipe such as `<(...)`, /dev/null, a FIFO), not only a
  regular file. A leading UTF-8 byte-order mark is dropped, and said once (strip_bom).

  Raises:
    ConfigError: a missing, unreadable or folder path, or bytes that are not UTF-8
      (naming line and byte).
  """
  # Lazy: data/local_files imports tensorflow_datasets; flags parse before such imports.
  from transformer.data.datasets import local_files  # pylint: disable=g-import-not-at-top
  if path:
    text = decode_utf8(read_input(path), path)
  else:
    buffer = getattr(stream, "buffer", None)  # Bytes, so that a bad byte can be named.
    text = (decode_utf8(buffer.read(), "stdin") if buffer is not None
            else check_text(stream.read(), "stdin"))
  text = local_files.strip_bom(text, path or "stdin")
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # The final newline ends the last line; it does not start another.
  return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_input(path: str, flag: str = "--input") -> bytes:
  """The bytes of `path`: a file, a pipe, a FIFO or a device; ConfigError in one line if not."""
  if os.path.isdir(path):
    raise ConfigError(f"{flag}={path!r} is a folder; give a file (or a pipe) with one text a "
                      f"line, or leave {flag} out to read stdin")
  try:
    with open(path, "rb") as f:
      return f.read()
  except FileNotFoundError:
    raise ConfigError(f"{flag}={path!r} does not exist; give a file (or a pipe) with one text "
                      f"a line, or leave {flag} out to read stdin") from None
  except PermissionError:
    raise ConfigError(f"{flag}={path!r} is not readable by this user (permission denied); "
                      "chmod it, or pipe it on stdin") from None


def check_output(path: str, overwrite: bool, inputs: Sequence[str] = (),
                 given: bool = True) -> None:
  """Refuses to write over an input, or over an existing file without `overwrite`.

  Args:
    path: where the result goes.
    overwrite: --overwrite.
    inputs: files the command reads, never written over.
    given: whether `path` is the user's --output (else the command's default path, and
      the message must not speak of an --output the user never gave).
  """
  for other in inputs:
    if other and os.path.exists(path) and os.path.samefile(path, other):
      raise ConfigError(f"--output={path!r} is the input file; write elsewhere (the input is "
                        "never overwritten)")
  if os.path.exists(path) and not overwrite:
    if not given:
      raise ConfigError(f"{path} exists: an earlier run of this command wrote this result; "
                        "read it, pass --overwrite to compute it again, or --output=PATH to "
                        "write elsewhere")
    raise ConfigError(f"--output={path!r} exists; pass --overwrite to replace it, or choose "
                      "another path")


def write_result(text: str, count: int, what: str, output_path: str | None,
                 overwrite: bool, input_path: str | None, stdout=None) -> None:
  """A text mode's result: to --output whole (checked again, written atomically), or to
  stdout; process 0 only, the caller checks."""
  if output_path:
    check_output(output_path, overwrite, [input_path])  # None appeared meanwhile.
    files.write_atomically(output_path, text, flag="--output", keep_existing=not overwrite)
    logging.info("Wrote %d %s to %s", count, what, output_path)
  else:
    out = stdout or sys.stdout
    out.write(text)
    out.flush()
