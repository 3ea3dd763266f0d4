"""A real two-process JAX run on localhost: training, checkpoints, resume, failures."""

import json
import os
import socket
import subprocess
import sys

import pytest
from tiny import subprocess_env

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess_worker.py")
KILL_AT = "TRANSFORMER_TEST_KILL_AT"  # fault_injection.KillAt.VARIABLE, without importing JAX here.


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_pair(tmp_path, data_dir, workdir, num_steps, tag, fail_at_batch=-1, timeout=240,
              kill_at="", extra=(), processes=2):
  """Starts processes 0 and 1 (2 CPU devices each) and waits for both.

  `fail_at_batch` makes process 1 raise, `kill_at` (a TRANSFORMER_TEST_KILL_AT value)
  SIGKILLs it; `extra` are more worker flags for both. `processes=1`: one process
  with all 4 devices instead, no jax.distributed (the reference run).
  """
  port = _free_port()
  env = subprocess_env(devices=4 // processes)
  env.pop(KILL_AT, None)
  procs, outs = [], []
  extra = (*extra, f"--num_processes={processes}")
  for pid in range(processes):
    out = str(tmp_path / f"{tag}_{pid}.json")
    outs.append(out)
    cmd = [sys.executable, WORKER, f"--process_id={pid}", f"--port={port}",
           f"--num_steps={num_steps}", f"--workdir={workdir}", f"--data_dir={data_dir}",
           f"--out={out}", f"--fail_at_batch={fail_at_batch if pid == 1 else -1}", *extra]
    log = open(tmp_path / f"{tag}_{pid}.log", "w", encoding="utf-8")
    process_env = dict(env, **{KILL_AT: kill_at}) if kill_at and pid == 1 else env
    procs.append((subprocess.Popen(cmd, env=process_env, stdout=log,
                                   stderr=subprocess.STDOUT), log))
  codes = []
  for proc, log in procs:
    try:
      codes.append(proc.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
      for p, _ in procs:
        p.kill()
      pytest.fail(f"{tag}: a process hung for {timeout} s (see {log.name})")
    log.close()
  logs = [open(tmp_path / f"{tag}_{pid}.log", encoding="utf-8").read()
          for pid in range(processes)]
  seen = [json.load(open(o, encoding="utf-8")) if os.path.exists(o) else None for o in outs]
  return codes, logs, seen


def _train_losses(seen):
  return {m["step"]: m["loss"] for m in seen["metrics"] if "loss" in m}


@pytest.fixture(scope="module")
def prepared_data_dir(tmp_path_factory):
  """Built once in this process so the pair does not spend its time preparing data."""
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  from transformer.data import sources  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path_factory.mktemp("mp_tfds"))
  sources.load_sources(make_tiny_config(data_dir))
  return data_dir


@pytest.mark.slow  # Two processes train, checkpoint and resume (~30 s on two cores).
def test_two_processes_train_checkpoint_and_resume(tmp_path, prepared_data_dir):
  workdir = str(tmp_path / "run")
  codes, logs, seen = _run_pair(tmp_path, prepared_data_dir, workdir, 4, "first")
  assert codes == [0, 0], logs
  # Every process sees the same global loss at every step.
  assert _train_losses(seen[0]) == _train_losses(seen[1])
  assert sorted(_train_losses(seen[0])) == [1, 2, 3, 4]
  # Each process read its own, disjoint slice of the data.
  rows = [{h for batch in s["rows"] for h in batch} for s in seen]
  assert rows[0] and rows[1] and not rows[0] & rows[1]
  # Orbax wrote one checkpoint, with each process's data-iterator position.
  data_files = sorted(os.listdir(os.path.join(workdir, "checkpoints", "4", "data")))
  assert {"process_0-of-2.json", "process_1-of-2.json"} <= set(data_files)
  # Only process 0 writes metrics.jsonl.
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    assert len([line for line in f if '"loss"' in line]) == 4

  # Resumed with train.steps_per_call=2: steps 5 and 6 in one call, each process
  # contributing its rows of both batches to the stacked global batch.
  codes, logs, seen = _run_pair(tmp_path, prepared_data_dir, workdir, 6, "resumed",
                                extra=("--steps_per_call=2",))
  assert codes == [0, 0], logs
  assert all("Resumed from checkpoint 4" in log for log in logs)
  assert sorted(_train_losses(seen[0])) == [6]  # One row for the call (log_every=2).
  assert _train_losses(seen[0]) == _train_losses(seen[1])
  # The call's input first (2 batches x 4 rows of each process), then the evaluation's.
  assert [len(batch) for batch in seen[0]["rows"]] == [8, 4, 4]
  assert not set(seen[0]["rows"][0]) & set(seen[1]["rows"][0])


def _rows_by_thread(seen: dict) -> dict[str, list[list[str]]]:
  """A worker's row digests grouped by the thread that built each batch, in order."""
  streams: dict[str, list[list[str]]] = {}
  for thread, batch in zip(seen["threads"], seen["rows"]):
    streams.setdefault(thread, []).append(batch)
  return streams


# The processes' devices split the mesh's first axis: with a tensor or context axis
# outermost, each process holds every row, and both must read the same ones.
SPANNING_MESHES = {
    "context": [["context", 4], ["data", 1], ["fsdp", 1], ["tensor", 1]],
    "tensor": [["tensor", 2], ["data", 2], ["fsdp", 1]],
}


@pytest.mark.slow  # Three processes start and compile: ~45 s each mesh on 2 shared cores.
@pytest.mark.parametrize("axis", sorted(SPANNING_MESHES))
def test_an_axis_across_processes_gives_the_losses_of_one_process(
    tmp_path, prepared_data_dir, axis):
  """Both processes hold every data shard, so they read the same rows (the whole batch),
  and two steps give the losses of one process with the same 4 devices and mesh."""
  mesh = ("--mesh=" + json.dumps(SPANNING_MESHES[axis]),)
  codes, logs, seen = _run_pair(tmp_path, prepared_data_dir, str(tmp_path / "pair"), 2,
                                "pair", extra=mesh)
  assert codes == [0, 0], logs
  codes, logs, alone = _run_pair(tmp_path, prepared_data_dir, str(tmp_path / "one"), 2,
                                 "one", extra=mesh, processes=1)
  assert codes == [0], logs
  # Per stream (training batches from the prefetch thread, evaluation's from the main
  # one): the two interleave in no fixed order, each stream's rows in a fixed one.
  streams = [_rows_by_thread(s) for s in (*seen, alone[0])]
  assert streams[0] == streams[1] == streams[2]
  assert {len(batch) for batch in alone[0]["rows"]} == {8}  # Every batch whole.
  losses = _train_losses(alone[0])
  assert sorted(losses) == [1, 2]
  for process in seen:
    assert _train_losses(process) == pytest.approx(losses, rel=1e-5)


def test_a_failing_process_ends_the_whole_run(tmp_path, prepared_data_dir):
  codes, logs, _ = _run_pair(tmp_path, prepared_data_dir, str(tmp_path / "run"), 6,
                             "fail", fail_at_batch=2, timeout=180)
  assert codes[1] != 0 and "injected failure in process 1" in logs[1]
  assert codes[0] != 0, logs[0]  # The healthy peer does not hang or pretend success.


# ---------------------------------------------------------------- faults


def _write_text_corpus(folder) -> str:
  """train.txt and a validation file of 3 documents (local_text cuts blocks of <= 2048
  characters): process 0 reads documents 0 and 2, process 1 only document 1."""
  os.makedirs(folder, exist_ok=True)
  line = "the quick brown fox jumps over the lazy dog {}\n"
  with open(os.path.join(folder, "train.txt"), "w", encoding="utf-8") as f:
    f.write("".join(line.format(i) for i in range(400)))
  with open(os.path.join(folder, "val.txt"), "w", encoding="utf-8") as f:
    f.write("".join(line.format(i) for i in range(100)))  # ~4,900 characters.
  return str(folder)


def _shard_evaluation(data_dir, text_path, state_dir):
  """Evaluates each process's shard of the validation split alone, in this process.

  Returns [(eval metrics, batches)] for process 0's shard and process 1's, with the
  parameters of `state_dir` on one device.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from tiny import make_tiny_config  # pylint: disable=g-import-not-at-top
  from transformer import sharding  # pylint: disable=g-import-not-at-top
  from transformer.training import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from transformer.data import packing, pipeline, sources  # pylint: disable=g-import-not-at-top
  config = make_tiny_config(data_dir)
  config.data.update(name="local_text", path=text_path)
  config.train.eval_batches = -1
  data = sources.load_sources(config)
  trainer = trainer_lib.Trainer.create(config, sharding.make_mesh(config.mesh, jax.devices()[:1]))
  params = ocp.StandardCheckpointer().restore(state_dir, trainer.abstract_state).params
  local_batch = config.data.batch_size // 2
  results = []
  for process_index in range(2):
    dataset = pipeline.make_dataset(
        config, "causal_lm", data.builder.as_data_source(split="validation"), data.tokenizer,
        train=False, batch_size=local_batch, split="validation", process_index=process_index,
        process_count=2)
    batches = sum(1 for _ in packing.iterate_eval(dataset, local_batch, -1))
    with trainer.context():
      results.append((trainer_lib.evaluate_split(trainer, params, dataset, local_batch), batches))
  return results


@pytest.mark.slow
def test_unequal_eval_shards_give_the_mean_over_both_shards(tmp_path, prepared_data_dir):
  """The validation split's shards differ in length: the shorter process feeds all-padding
  batches (weight 0) until the longer one is done, so the evaluation is the token-weighted
  mean over both shards, each packed by its own process."""
  text_path = _write_text_corpus(tmp_path / "text")
  workdir = str(tmp_path / "run")
  codes, logs, seen = _run_pair(tmp_path, prepared_data_dir, workdir, 2, "eval",
                                extra=(f"--text_path={text_path}", "--eval_batches=-1"))
  assert codes == [0, 0], logs
  evals = [{m["step"]: m for m in s["metrics"] if "eval_loss" in m} for s in seen]
  assert evals[0] == evals[1] and sorted(evals[0]) == [0, 2]

  shards = _shard_evaluation(prepared_data_dir, text_path,
                             os.path.join(workdir, "checkpoints", "2", "state"))
  (first, first_batches), (second, second_batches) = shards
  assert first_batches > second_batches  # The case under test: process 1 runs out first.
  tokens = first["eval_tokens"] + second["eval_tokens"]
  loss = (first["eval_loss"] * first["eval_tokens"] +
          second["eval_loss"] * second["eval_tokens"]) / tokens
  assert evals[0][2]["eval_tokens"] == tokens  # Nothing lost, nothing counted twice.
  assert evals[0][2]["eval_loss"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.slow
def test_a_process_killed_mid_checkpoint_ends_the_run_and_the_rerun_resumes(
    tmp_path, prepared_data_dir):
  """Process 1 is SIGKILLed while its part of checkpoint 4 is being written."""
  workdir = str(tmp_path / "run")
  heartbeat = ("--heartbeat_timeout_seconds=5",)
  codes, logs, _ = _run_pair(tmp_path, prepared_data_dir, workdir, 6, "killed",
                             kill_at="during_save:4", extra=heartbeat, timeout=180)
  assert codes[1] == -9 and "killing this process during_save 4" in logs[1], logs[1][-3000:]
  assert codes[0] != 0, logs[0][-3000:]  # An error, within the timeout: no hang ...
  assert "heartbeat" in logs[0], logs[0][-3000:]  # ... because process 1's heartbeats stopped.
  assert not os.path.exists(os.path.join(workdir, "checkpoints", "6"))
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  complete = sorted(ocp.utils.step_from_checkpoint_name(p.name) for p in
                    ocp.utils.checkpoint_steps_paths(os.path.join(workdir, "checkpoints")))
  assert complete and complete[-1] in (2, 4)

  codes, logs, seen = _run_pair(tmp_path, prepared_data_dir, workdir, 6, "rerun",
                                extra=heartbeat)
  assert codes == [0, 0], logs
  assert all(f"Resumed from checkpoint {complete[-1]}" in log for log in logs), logs
  losses = _train_losses(seen[0])
  assert sorted(losses) == list(range(complete[-1] + 1, 7))
  assert losses == _train_losses(seen[1])
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "6"))


# ---------------------------------------------------------------- processes that disagree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch_pair(tmp_path, data_dir, tag, per_process, cwds=(None, None), timeout=240):
  """`launch.py` (the real command) as processes 0 and 1 of one run, 2 CPU devices each;
  `per_process[i]`: process i's own extra flags. Returns (exit codes, stderr texts)."""
  port = _free_port()
  env = subprocess_env(devices=2)
  procs = []
  for pid in range(2):
    cmd = [sys.executable, os.path.join(ROOT, "launch.py"),
           f"--config={os.path.join(ROOT, 'tests', 'tiny.py')}:{data_dir}",
           f"--workdir={tmp_path / tag}", f"--coordinator_address=127.0.0.1:{port}",
           "--num_processes=2", f"--process_id={pid}", "--heartbeat_timeout_seconds=20",
           "--config.train.num_steps=2", *per_process[pid]]
    procs.append(subprocess.Popen(cmd, cwd=cwds[pid] or ROOT, env=env, text=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
  codes, errors = [], []
  for proc in procs:
    try:
      _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      pytest.fail(f"{tag}: a process hung for {timeout} s")
    codes.append(proc.returncode)
    errors.append(err)
  return codes, errors


def _error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith("ConfigError")]


@pytest.mark.slow  # Two launch.py processes start JAX and stop at the first exchange.
def test_processes_started_with_another_seed_stop_in_one_line(tmp_path, prepared_data_dir):
  codes, errors = _launch_pair(tmp_path, prepared_data_dir, "seed",
                               [["--config.seed=1"], ["--config.seed=2"]])
  expected = ("ConfigError: config differs between processes: seed is 1 on process 0 and "
              "2 on process 1;")
  for code, stderr in zip(codes, errors):
    assert code == 2, stderr[-3000:]
    assert [line[:len(expected)] for line in _error_lines(stderr)] == [expected], stderr
    assert "Traceback" not in stderr, stderr[-3000:]
  assert not os.path.exists(tmp_path / "seed")  # Nothing was created.


@pytest.mark.slow  # Two processes prepare their own copy of a local text folder.
def test_processes_that_read_other_bytes_behind_one_path_stop_naming_the_file(
    tmp_path, prepared_data_dir):
  """data.path is relative and the same on both processes, but each one's current
  directory holds other text (a stale copy on one host's disk)."""
  cwds = []
  for pid in range(2):
    folder = tmp_path / f"host{pid}" / "text"
    _write_text_corpus(folder)
    if pid == 1:
      with open(folder / "train.txt", "a", encoding="utf-8") as f:
        f.write("a line only host 1 has\n")
    cwds.append(str(tmp_path / f"host{pid}"))
  flags = ["--config.data.name=local_text", "--config.data.path=text"]
  codes, errors = _launch_pair(tmp_path, prepared_data_dir, "data", [flags, flags], cwds)
  expected = ('ConfigError: data differs between processes: file train.txt (sha256) is "')
  for code, stderr in zip(codes, errors):
    assert code == 2, stderr[-3000:]
    lines = _error_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith(expected), stderr[-3000:]
    assert "on process 0 and" in lines[0] and "on process 1" in lines[0]
