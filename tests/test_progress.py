"""What long modes say while they work (workdir/progress.py), the sharding table's place
(sharding.log_sharding_report) and --help's list of modes (cli/usage.modes_help).

The modes' own progress lines are checked beside each mode's test (test_commands.py:
evaluate, average; test_long_context.py: passkey; test_hf_import.py: import, export;
test_compile_mode.py: compile), on their tiny runs with `progress.EVERY_SECONDS = 0`.
"""

from __future__ import annotations

import logging
import re
import time
import types

import jax
import pytest
from absl import flags

from test_data import _code_lines  # pylint: disable=protected-access
from transformer import sharding
from transformer.cli import keys as keys_mode
from transformer.cli import usage
from transformer.data.tokenizers import vocabularies
from transformer.training import loop
from transformer.training import trainer as trainer_lib
from transformer.workdir import console
from transformer.workdir import progress


class _Clock:
  """A clock the test moves by hand: no timing thresholds."""

  def __init__(self):
    self.now = 100.0

  def __call__(self) -> float:
    return self.now


def _lines(caplog) -> list[str]:
  return [record.getMessage() for record in caplog.records]


def test_progress_says_done_total_rate_and_eta_at_most_every_interval(caplog):
  clock = _Clock()
  counted = progress.Progress("evaluate test", total=10, unit="batches", every=5.0, clock=clock)
  with caplog.at_level(logging.INFO):
    clock.now += 2.0
    counted.update(2)  # 2 s since the start: under the interval, nothing said.
    assert not _lines(caplog)
    clock.now += 3.0
    counted.update(3)  # 5 s: 5 of 10 at 1 batch/s, 5 s to go.
    clock.now += 1.0
    counted.update(1)  # 1 s after the last line: quiet again.
    clock.now += 2.0
    counted.finish("12 examples scored")
  assert _lines(caplog) == [
      "evaluate test: 5/10 batches (1 batches/s), ETA 5.0s",
      "evaluate test: 6 batches in 8.0s (0.75 batches/s); 12 examples scored"]


def test_progress_without_a_total_has_no_eta_and_long_times_read_as_minutes(caplog):
  clock = _Clock()
  counted = progress.Progress("scoring", unit="rows", every=0, clock=clock)
  with caplog.at_level(logging.INFO):
    clock.now += 125.0
    counted.update(250)
    counted.finish()
  assert _lines(caplog) == ["scoring: 250 rows (2 rows/s)", "scoring: 250 rows in 2m05s (2 rows/s)"]


def test_a_stage_says_its_start_and_its_time_and_an_error_only_itself(caplog):
  clock = _Clock()
  with caplog.at_level(logging.INFO):
    with progress.stage("compile: lowering the train step", clock=clock):
      clock.now += 1.25
    with pytest.raises(ValueError):
      with progress.stage("compile: XLA compiling the train step", clock=clock):
        raise ValueError("refused")
  assert _lines(caplog) == ["compile: lowering the train step ...",
                            "compile: lowering the train step: 1.2s",
                            "compile: XLA compiling the train step ..."]


def test_only_process_0_says_progress(caplog, monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  with caplog.at_level(logging.INFO):
    with progress.stage("import: writing"):
      progress.Progress("passkey", 4, "prompts", every=0).update()
  assert not _lines(caplog)


def test_progress_lines_are_project_records_the_console_shows(caplog):
  with caplog.at_level(logging.INFO):
    progress.say("average: writing")
  (record,) = caplog.records
  assert console.is_project_record(record) and console.show_on_console(record)


# ---------------------------------------------------------------- the sharding table


def _create(tiny_config, data: int, caplog, log_file=None):
  """Trainer.create on `data` devices (fsdp = tensor = 1); the table's records."""
  config = tiny_config
  config.model.update(d_model=64, num_heads=8, mlp_dim=128, vocab_size=384)
  config.data.batch_size = 8
  config.mesh.shape = (("data", data), ("fsdp", 1), ("tensor", 1))
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:data])
  handler = logging.FileHandler(log_file) if log_file else None
  if handler:
    logging.getLogger().addHandler(handler)
  try:
    with caplog.at_level(logging.INFO):
      trainer_lib.Trainer.create(config, mesh)
  finally:
    if handler:
      logging.getLogger().removeHandler(handler)
      handler.close()
  return [r for r in caplog.records if r.getMessage().startswith("Parameter sharding")]


def test_one_device_keeps_the_sharding_table_in_the_log_file(tiny_config, caplog, tmp_path):
  log_file = tmp_path / "log.txt"
  table, pointer = _create(tiny_config, 1, caplog, str(log_file))
  assert "block_" in table.getMessage() and not console.show_on_console(table)
  assert console.show_on_console(pointer)
  assert pointer.getMessage() == (
      "Parameter sharding: every mesh axis is 1 ({'data': 1, 'fsdp': 1, 'tensor': 1}), "
      f"nothing is split; the table is in {log_file}")


def test_a_split_mesh_or_no_log_file_shows_the_table_on_the_console(tiny_config, caplog,
                                                                    tmp_path):
  (table,) = _create(tiny_config, 2, caplog, str(tmp_path / "log.txt"))
  assert "'data': 2" in table.getMessage() and console.show_on_console(table)
  caplog.clear()
  (table,) = _create(tiny_config, 1, caplog)  # Nowhere else to read it: the console.
  assert console.show_on_console(table)


def test_a_model_built_only_to_be_measured_keeps_its_table_off_the_console(tiny_config,
                                                                         caplog):
  """--mode=compile's depth probes and trials: the table once, the model's (three
  tables on a one-device mesh for one compile before)."""
  with sharding.tables_off_the_console():
    (table,) = _create(tiny_config, 2, caplog)
  assert not console.show_on_console(table)


def test_a_stage_that_cannot_count_says_it_is_still_running(caplog):
  """A SentencePiece vocabulary trained for 3 minutes without a console line: a stage
  with a heartbeat says so while it runs, then its time."""
  with caplog.at_level(logging.INFO):
    with progress.stage("building", heartbeat=0.01):
      deadline = time.monotonic() + 60
      while "building: still running, " not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
  lines = _lines(caplog)
  assert lines[0] == "building ..." and lines[1].startswith("building: still running, ")
  assert re.fullmatch(r"building: \d+\.\ds", lines[-1]), lines


def test_sentencepiece_training_is_a_stage_with_a_heartbeat(tmp_path, caplog, monkeypatch):
  monkeypatch.setattr(vocabularies, "HEARTBEAT_SECONDS", 0.01)
  real = vocabularies._train_sentencepiece  # pylint: disable=protected-access

  def slow(*args):  # Trains once the heartbeat has spoken (a long training's case).
    deadline = time.monotonic() + 60
    while "still running" not in caplog.text and time.monotonic() < deadline:
      time.sleep(0.01)
    real(*args)

  monkeypatch.setattr(vocabularies, "_train_sentencepiece", slow)
  lines = _code_lines(2000)
  with caplog.at_level(logging.INFO):
    vocabularies.train_sentencepiece(lines, 400, str(tmp_path / "spm.model"), 10_000)
  assert "SentencePiece: training 400 unigram pieces ..." in caplog.text
  assert "SentencePiece: training 400 unigram pieces: still running, " in caplog.text
  assert any(re.fullmatch(r"SentencePiece: training 400 unigram pieces: \d+\.\ds", line)
             for line in _lines(caplog))


def test_an_evaluation_inside_training_counts_its_batches(tiny_config, caplog, monkeypatch):
  """The loop's evaluation hands evaluate_split a Progress, as --mode=evaluate does."""
  monkeypatch.setattr(loop, "EVAL_PROGRESS_SECONDS", 0)

  def scored(trainer, params, dataset, local_batch_size, counted):
    for _ in range(2):
      counted.update()
    return {"eval_loss": 1.0}

  monkeypatch.setattr(loop, "evaluate_split", scored)
  tiny_config.train.eval_batches = 2
  run = types.SimpleNamespace(config=tiny_config, trainer=None, eval_data=None,
                              local_batch_size=8, hooks=[],
                              writer=types.SimpleNamespace(write=lambda step, row: None))
  with caplog.at_level(logging.INFO):
    loop._evaluate(run, types.SimpleNamespace(params=None), 3)  # pylint: disable=protected-access
  lines = _lines(caplog)
  assert re.match(r"eval at step 3: 1/2 batches \(.*\), ETA ", lines[0]), lines
  assert lines[1].startswith("eval at step 3: 2/2 batches"), lines


@pytest.mark.slow  # A training (~13 s on two cores).
def test_an_evaluation_inside_training_says_its_progress(tiny_config, tmp_path, caplog,
                                                         monkeypatch):
  """--mode=evaluate counted its batches, the evaluations inside training did not (1.5
  minutes without a line)."""
  monkeypatch.setattr(loop, "EVAL_PROGRESS_SECONDS", 0)  # A line at every batch.
  tiny_config.train.update(num_steps=2, eval_every=2, eval_batches=2)
  tiny_config.checkpoint.every = 2
  with caplog.at_level(logging.INFO):
    loop.train_and_evaluate(tiny_config, str(tmp_path / "run"))
  lines = _lines(caplog)
  assert any(re.match(r"eval at step 2: 1/2 batches \(.*\), ETA ", line) for line in lines)
  assert any(line.startswith("eval at step 2: 2/2 batches") for line in lines)


# ---------------------------------------------------------------- --help


def test_help_lists_every_mode_from_its_docstring_and_points_at_keys():
  import launch  # pylint: disable=g-import-not-at-top
  listed = [line.split()[0].removeprefix("--mode=") for line in launch.__doc__.splitlines()
            if line.startswith("  --mode=")]
  assert listed == list(launch.MODES) == list(flags.FLAGS["mode"].parser.enum_values)
  help_text = " ".join(launch.__doc__.split())
  for name, module in launch.MODES.items():
    assert f"--mode={name} {usage.mode_summary(name, module)}" in help_text
  # Config keys: --help names --mode=keys, which is the mode that reads configs/base.py.
  assert launch.MODES["keys"] is keys_mode
  assert "`--mode=keys` lists every key" in launch.__doc__
  assert usage.mode_summary("keys", keys_mode).startswith("every config key")


def test_a_mode_without_its_docstring_line_stops_the_help():
  undocumented = types.ModuleType("transformer.cli.new_mode")
  with pytest.raises(ValueError, match=r"new_mode's docstring must start with "
                     r"'--mode=new: '"):
    usage.modes_help({"new": undocumented})
  undocumented.__doc__ = "Does something new."
  with pytest.raises(ValueError, match="--mode=new: "):
    usage.modes_help({"new": undocumented})
