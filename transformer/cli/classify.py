"""--mode=classify: label each line of --input (or stdin) with a classifier run (its class and
probability) -> --output (or stdout).

  python launch.py --mode=classify --workdir=runs/bert_base_sst2_local --input=reviews.txt

The counterpart of translate and generate for `model.head='classification'`: each line
is encoded as the classification pipeline encodes a training text ([bos] text [eos],
at most data.seq_len ids; a longer line is truncated with a warning naming it, or
stops the command with decode.overlong='error'), and one line per input line is
written to --output (or stdout): the predicted class and its softmax probability,
`<class>\t<probability>`, with the class name after a tab when --class_names is given.
Reads --workdir's model, vocabulary and checkpoint (inference/loaded.py).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Mapping, Sequence, TextIO

import jax
import ml_collections
import numpy as np
from absl import flags
from absl import logging

from transformer.cli import common
from transformer.config import objective as objective_lib
from transformer.config.errors import ConfigError
from transformer.data import packing
from transformer.data.tokenizers import vocabularies
from transformer.inference import loaded
from transformer.model.models import make_model
from transformer.workdir import progress as progress_lib

CLASS_NAMES = flags.DEFINE_list(
    "class_names", [], "classify: names of classes 0, 1, ... written after each class id.")
STARTS_JAX = True
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("input", "output", "overwrite", "checkpoint_step", "average_last",
                "decode_batch_size", "overlong")


def main(config: ml_collections.ConfigDict | None, workdir: str) -> None:
  """launch.py --mode=classify."""
  classify(workdir, input_path=common.INPUT.value, output_path=common.OUTPUT.value,
           overwrite=common.OVERWRITE.value, class_names=CLASS_NAMES.value,
           **common.loading_flags(config))


def classify(workdir: str, *, input_path: str = "", output_path: str = "",
             overwrite: bool = False, class_names: Sequence[str] = (),
             config: ml_collections.ConfigDict | None = None,
             checkpoint_step: int | None = None, average_last: int = 0,
             decode_overrides: Mapping[str, Any] | None = None,
             model_overrides: Mapping[str, Any] | None = None,
             stdin: TextIO | None = None, stdout: TextIO | None = None,
             **unused) -> list[tuple[int, float]]:
  """Predicts a class for every input line; writes `<class>\\t<probability>` lines.

  Args:
    workdir: a classifier run's workdir (model.head='classification').
    input_path: a UTF-8 file, one text a line; "" reads `stdin`.
    output_path: where the lines go; "" writes to `stdout`.
    overwrite: replace an existing `output_path`.
    class_names: names of the classes, in class order (optional).
    config, checkpoint_step, average_last, decode_overrides, model_overrides: as for
      loaded.load_run
      (decode.batch_size and decode.overlong are used).
    stdin, stdout: the streams for "" paths (default sys.stdin / sys.stdout).

  Returns:
    (class, probability) per line, in input order.

  Raises:
    ConfigError: not a classifier, a missing or non-UTF-8 input, an existing output,
      class names that do not match model.num_classes, or (decode.overlong='error') a
      line longer than data.seq_len.
  """
  del unused  # Decoding seeds: nothing is sampled here.
  if output_path:
    common.check_output(output_path, overwrite, [input_path])
  lines = common.read_lines(input_path, stdin or sys.stdin)
  run = loaded.load_run(workdir, config=config, checkpoint_step=checkpoint_step,
                        average_last=average_last, decode_overrides=decode_overrides,
                        model_overrides=model_overrides)
  if not objective_lib.resolve(run.config.model).classifies:
    raise ConfigError(f"--mode=classify needs a model with head='classification'; {workdir} "
                      f"holds arch={run.config.model.arch!r}, head={run.config.model.head!r}. "
                      "Use --mode=generate for a decoder LM, --mode=translate for an "
                      "encoder-decoder.")
  num_classes = run.config.model.num_classes
  if class_names and len(class_names) != num_classes:
    raise ConfigError(f"--class_names lists {len(class_names)} names but the model has "
                      f"model.num_classes={num_classes}; give one name per class, in order")
  rows = [_encode(line, run, f"{input_path or 'stdin'}:{i + 1}") for i, line in enumerate(lines)]
  predictions = _predict(run, rows)
  text = "".join(f"{label}\t{probability:.4f}"
                 + (f"\t{class_names[label]}" if class_names else "") + "\n"
                 for label, probability in predictions)
  if jax.process_index() == 0:
    common.write_result(text, len(predictions), "predictions", output_path, overwrite, input_path,
                        stdout)
  return predictions


def _encode(line: str, run: loaded.LoadedRun, where: str) -> dict[str, np.ndarray]:
  """[bos] ids [eos], as the classification pipeline encodes a training text, padded."""
  seq_len = run.config.data.seq_len
  ids = np.concatenate([[vocabularies.BOS_ID], run.tokenizer.encode(line),
                        [vocabularies.EOS_ID]]).astype(np.int32)
  if len(ids) > seq_len:
    if run.config.decode.overlong == "error":
      raise ConfigError(f"{where}: {len(ids)} tokens ([bos] and [eos] included) exceed "
                        f"data.seq_len={seq_len}; shorten the line, or set "
                        "--config.decode.overlong=truncate")
    logging.warning("%s: %d tokens exceed data.seq_len=%d: classified on its first %d",
                    where, len(ids), seq_len, seq_len)
    ids = ids[:seq_len]
  return packing.pad_to(packing.checked(ids, run.config.model.vocab_size), seq_len)


def _predict(run: loaded.LoadedRun, rows: list[dict[str, np.ndarray]]) -> list[tuple[int, float]]:
  """(argmax class, its probability) of each row, in batches of decode.batch_size."""
  model = make_model(dataclasses.replace(run.model_config, deterministic=True))

  @jax.jit
  def probabilities(params, inputs, segment_ids, positions):
    logits = model.apply({"params": params}, inputs, segment_ids, positions)
    return jax.nn.softmax(logits.astype(np.float32), axis=-1)

  batch_size = max(run.config.decode.batch_size, 1)
  out: list[tuple[int, float]] = []
  classifying = progress_lib.Progress("classify", len(rows), "lines")
  with run.context():
    for start in range(0, len(rows), batch_size):
      chunk = rows[start:start + batch_size]
      # One static shape: the last batch is filled with copies of a row (results dropped).
      filled = chunk + [chunk[0]] * (batch_size - len(chunk))
      stacked = {k: np.stack([row[k] for row in filled]) for k in filled[0]}
      p = np.asarray(jax.device_get(probabilities(
          run.params, stacked["tokens"], stacked["segment_ids"], stacked["positions"])))
      for row in p[:len(chunk)]:
        label = int(np.argmax(row))
        out.append((label, float(row[label])))
      classifying.update(len(chunk))
  classifying.finish()
  return out
