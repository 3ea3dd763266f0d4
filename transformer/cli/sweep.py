"""--mode=sweep: a grid of config overrides, one training run each, in subfolders of
--workdir; rerunning resumes it; then the runs are compared.

  python launch.py --mode=sweep --config=configs/shakespeare_char.py:cpu \
    --workdir=runs/ablation --sweep='model.norm=pre,post;model.position=learned,rope'

The spec (`--sweep`) is either
  - a grid: `key=v1,v2;key2=v3,v4` (config keys without the `config.` prefix; `;`
    between keys, `,` between values; the cartesian product, the first key varying
    slowest), or
  - the path of a JSON file holding the same grid, {"model.norm": ["pre", "post"]},
    or a list of runs, [{"model.norm": "pre"}, {"model.norm": "post",
    "model.num_layers": 6}], for runs that are not a grid or values with commas
    (tuples such as mesh.shape are JSON lists there).
Values take the type of the key's value in the config (`true`/`false` for booleans).
Every run's config is built and validated before the first run starts: an unknown
key, a value of the wrong type, an empty list or a value `validate` rejects stops
the sweep with the key named.

Each run is `python launch.py --mode=train` in a process of its own (XLA state and
memory are released between runs; other `--config.x` flags and the jax.distributed
flags are passed on) with the workdir `<sweep dir>/<short key>=<value>+...`, e.g.
`norm=post+position=rope` (full keys where the last parts would collide). The runs go
one after another, or with --devices_per_run=K as many at once as the host's devices
allow, K each (cli/sweep_devices.py; each in a thread waiting for its process), or
with --ray_address as Ray tasks on a cluster's nodes (cli/sweep_ray.py). A run that
fails or diverges (its exit status is not 0; a diverged run's error line is a
FloatingPointError) does not stop the sweep: its status ("failed" / "diverged"), the last
step it logged and its error line (the reason) go
into sweep.json, and the next run starts. A rerun with another list keeps the
record's history: sweep.json lists the runs of the current list ("current": true)
and those earlier lists ran ("current": false), with every list given ("sweeps"), the
comparison keeps their rows (status "... (earlier --sweep list)"), and one line says
what changed. At the end the comparison
(transformer/reports/compare.py) is written into the sweep dir, failed runs marked as
such, and the sweep exits 1 if any run did not finish. Rerunning the same command
resumes the sweep: a run whose newest complete checkpoint is at train.num_steps is
finished and skipped; any other run (failed, diverged, stopped, not started) is started
again in its workdir, which resumes it from its checkpoint. sweep.json's runs each
carry "status": pending, running, finished, failed, diverged, stopped or "in use".

A rerun first compares each run's config.json with what the command now gives it,
through the resume's own check (training/resume.py): a difference that a resume refuses
stops the whole sweep before anything runs or sweep.json changes, listing each run's
changes in the resume's words (with checkpoint.on_config_change=allow, unfinished runs
resume with the changes; a finished run keeps its config.json and says so). A run
whose workdir another command holds (workdir/lock.py) is "in use by PID N on HOST":
not started, not finished, and the sweep exits 1.

A signal (Ctrl-C, SIGTERM) is passed to the running run once per signal: it stops
after the current step and saves (a second one aborts it), and the sweep ends; the
same command resumes it. Runs are children in their own session, so a terminal's
Ctrl-C reaches them only through the sweep (once); a sweep killed outright sends its
run SIGTERM (Linux), so no run outlives its sweep to train beside a rerun of it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import ml_collections
from absl import flags

from transformer.cli import common
from transformer.cli import sweep_devices
from transformer.cli.sweep_spec import SweepArm, build_runs
# The spelling of a value on a command line, in each run's command and in sweep.json.
from transformer.cli.sweep_spec import as_flag as _as_flag
from transformer.config.errors import ConfigError
from transformer.reports import compare
from transformer.reports import plots
from transformer.training import resume
from transformer.workdir import checkpointing
from transformer.workdir import files
from transformer.workdir import layout
from transformer.workdir import lock
from transformer.workdir.console import format_duration
from transformer.workdir.metrics_file import read_rows

SWEEP = flags.DEFINE_string(
    "sweep", "", "sweep: config overrides to grid over, 'model.norm=pre,post;"
    "model.position=rope,alibi', or a JSON file (transformer/cli/sweep.py).")
STARTS_JAX = False  # Each run is a launch.py process of its own that needs the devices.
# The flags of cli/common.py this mode reads (launch.py refuses the others it is given).
SHARED_FLAGS = ("log_steps", "ray_address")
DEVICES_PER_RUN = flags.DEFINE_integer(
    "devices_per_run", 0, "sweep: run as many arms at once as the host's devices allow, this "
    "many devices each (GPUs, TPU chips, or CPU cores with simulated devices); with "
    "--ray_address, on a Ray cluster's nodes. 0 (default): one run at a time on every device.")
# launch.py's flags passed on to each run of a sweep: every run is one jax.distributed job.
LAUNCHER_FLAGS = ("distributed", "coordinator_address", "num_processes", "process_id",
                  "heartbeat_timeout_seconds")


def check_config(config: ml_collections.ConfigDict, workdir: str = "") -> None:
  """Builds and validates every run's config; launch.py calls it before the sweep folder
  (`workdir`) is created or locked, so a sweep that fails validation creates nothing."""
  del workdir  # Each run's own launch.py process checks its run's folder.
  build_runs(config, SWEEP.value, flags.FLAGS["config"].override_values)
  _slots(0)


def _launcher_flags() -> list[str]:
  return [f"--{name}={flags.FLAGS[name].value}" for name in LAUNCHER_FLAGS
          if flags.FLAGS[name].present]


def _slots(arms: int, sweep_dir: str = "") -> list[sweep_devices.Slot] | None:
  """The slots --devices_per_run cuts this host's devices into (with --ray_address, one
  per arm of `arms`: Ray places them, once every node is checked against `sweep_dir`
  when given); None: one run at a time.

  Raises:
    ConfigError: --ray_address without --devices_per_run, --devices_per_run with the
      jax.distributed flags, or devices the host does not have (sweep_devices.slots).
  """
  per_run, address, launcher = DEVICES_PER_RUN.value, common.RAY_ADDRESS.value, _launcher_flags()
  if address and not per_run:
    raise ConfigError(f"--ray_address={address} with --mode=sweep needs --devices_per_run=K "
                      "(the devices each arm takes on the cluster's nodes)")
  if per_run and launcher:
    raise ConfigError(f"--devices_per_run={per_run} runs arms side by side on one host's "
                      f"devices; it cannot be combined with {' '.join(launcher)} (a run over "
                      "several hosts): leave one out")
  if not per_run and DEVICES_PER_RUN.present:
    raise ConfigError("--devices_per_run=0 is invalid: expected a number of devices >= 1 "
                      "(or leave it out: every run takes all devices, one run at a time)")
  if address:
    from transformer.cli import sweep_ray  # pylint: disable=g-import-not-at-top  (imports Ray)
    return sweep_ray.slots(address, per_run, arms, sweep_dir, LAUNCH)
  return sweep_devices.slots(per_run) if per_run else None


def main(config: ml_collections.ConfigDict, workdir: str) -> int:
  """launch.py --mode=sweep; returns the exit status."""
  config_flag = flags.FLAGS["config"]
  return run_sweep(config, config_flag.config_filename, workdir, SWEEP.value,
                   fixed=config_flag.override_values, launcher_flags=_launcher_flags(),
                   log_steps=common.LOG_STEPS.value,
                   slots=_slots(len(build_runs(config, SWEEP.value, config_flag.override_values)),
                                workdir))

LAUNCH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "launch.py")


finished_step = checkpointing.newest_complete_step  # What a rerun of a run would resume.


def recorded_config_changes(sweep_dir: str, runs: Sequence[SweepArm]) -> dict[str, str]:
  """{name: the resume check's refusal} of each run whose config.json the command changes.

  The check is the resume's own (training/resume.py), with checkpoint.on_config_change
  forced to 'stop' so that it reports the changes however the run would treat them. A
  run with no config.json, or no checkpoint beside it, has nothing to compare.
  model.vocab_size=0 compares as the run's resolved size: a resume keeps its vocabulary.
  """
  changes = {}
  for run in runs:
    workdir = os.path.join(sweep_dir, run.name)
    path = os.path.join(workdir, layout.CONFIG)
    if not os.path.exists(path):
      continue
    arm = run.config.copy_and_resolve_references()
    if not arm.model.vocab_size:
      try:
        with open(path, encoding="utf-8") as f:
          arm.model.vocab_size = int(json.load(f)["model"]["vocab_size"])
      except (OSError, ValueError, KeyError, TypeError):
        pass  # Unreadable: the check below says so in its own words.
    arm.checkpoint.on_config_change = "stop"
    try:
      resume.check_config_change(arm, workdir)
    except ConfigError as e:
      changes[run.name] = str(e)
  return changes


def _command(config_arg: str, workdir: str, run: SweepArm, fixed: Mapping[str, Any],
             launcher_flags: Sequence[str]) -> list[str]:
  return ([sys.executable, LAUNCH, "--mode=train", f"--config={config_arg}",
           f"--workdir={workdir}"] + list(launcher_flags) +
          [f"--config.{key}={_as_flag(value)}" for key, value in fixed.items()] +
          [f"--config.{key}={value}" for key, value in run.overrides.items()])


def _summary(workdir: str) -> str:
  """'eval_loss 1.906 (best 1.899 at 1750)' from the run's metrics, or ''."""
  try:
    series = plots.read_series(workdir).get("eval_loss")
  except ConfigError:
    return ""
  if series is None:
    return ""
  best = int(series.values.argmin())
  return (f": eval_loss {series.values[-1]:.4g} (best {series.values[best]:.4g} at step "
          f"{series.steps[best]})")


class _Forward:
  """While runs are going, passes each SIGINT/SIGTERM the sweep receives on to each."""

  def __init__(self):
    self.processes: set[Any] = set()  # Popen, or sweep_ray.RayRun
    self.signals: list[int] = []

  def __enter__(self):
    self._previous = {sig: signal.signal(sig, self._handle)
                      for sig in (signal.SIGINT, signal.SIGTERM)}
    return self

  def _handle(self, signum, frame):
    del frame
    self.signals.append(signum)
    for process in list(self.processes):
      if process.poll() is None:
        process.send_signal(signum)
    print(f"sweep: signal {signum} passed to the running runs; each stops after its step and "
          "saves (another signal aborts them without saving)", flush=True)

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _write_record(sweep_dir: str, config_arg: str, spec: str, fixed: Mapping[str, Any],
                  runs: Sequence[SweepArm], outcomes: Mapping[str, dict[str, Any]],
                  history: tuple[list[str], list[dict[str, Any]]]) -> None:
  """sweep.json: the spec, each run with its outcome (status, step, reason) and
  "current": true, then the runs of earlier --sweep lists ("current": false), and every
  list given in this folder ("sweeps", oldest first)."""
  specs, earlier = history
  record = {"config": config_arg, "sweep": spec, "sweeps": specs,
            "flags": [f"--config.{k}={_as_flag(v)}" for k, v in fixed.items()],
            "runs": [{"name": run.name, "overrides": run.overrides, "current": True,
                      **outcomes.get(run.name, {"status": "pending"})} for run in runs]
                    + [dict(arm, current=False) for arm in earlier]}
  files.write_atomically(os.path.join(sweep_dir, layout.SWEEP_RECORD),
                         json.dumps(record, indent=1))


def _history(sweep_dir: str, spec: str,
             runs: Sequence[SweepArm]) -> tuple[list[str], list[dict[str, Any]]]:
  """(every --sweep list given here, oldest first; the runs earlier lists ran that this
  one lacks, as sweep.json recorded them), and one line when the list changed.

  A record keeps its history: a rerun with another list never drops a run that was
  started (its folder stays, and so does its row in sweep.json and compare.md).
  """
  try:
    with open(os.path.join(sweep_dir, layout.SWEEP_RECORD), encoding="utf-8") as f:
      previous = json.load(f)
  except (OSError, ValueError):
    previous = {}
  if not isinstance(previous, dict):
    previous = {}
  specs = list(previous.get("sweeps") or ([previous["sweep"]] if "sweep" in previous else []))
  current = {run.name for run in runs}
  recorded = [r for r in compare.sweep_runs(sweep_dir) if isinstance(r, dict) and "name" in r]
  earlier = [{k: v for k, v in r.items() if k != "current"} for r in recorded
             if r["name"] not in current and (r.get("status", "pending") != "pending"
                                              or os.path.isdir(os.path.join(sweep_dir,
                                                                            r["name"])))]
  last_list = [r["name"] for r in recorded if r.get("current", True)]
  if previous and last_list and set(last_list) != current:
    gone = [name for name in last_list if name not in current]
    new = [run.name for run in runs if run.name not in last_list]
    print(f"sweep: the --sweep list changed ({previous.get('sweep')!r} -> {spec!r}): "
          + (f"{', '.join(gone)} no longer in it (kept in {layout.SWEEP_RECORD} and "
             f"{layout.COMPARE} as runs of an earlier list)" if gone else "no run dropped")
          + (f"; new: {', '.join(new)}" if new else ""), flush=True)
  if not specs or specs[-1] != spec:
    specs.append(spec)
  return specs, earlier


# A line that names an exception, as launch.py's one-line errors and tracebacks end.
_ERROR_LINE = re.compile(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b")
# Exit statuses of a run stopped by SIGINT / SIGTERM after saving (launch.py).
_INTERRUPTED = (130, 143)


def _relay_errors(lines: Iterable[str], prefix: str = "") -> tuple[str, str]:
  """Copies the run's stderr to ours as it comes (each line after `prefix`: runs side by
  side); returns (its last error line, last line)."""
  last, error = "", ""
  for line in lines:
    sys.stderr.write(prefix + line)
    sys.stderr.flush()
    if line.strip():
      last = line.strip()
      if _ERROR_LINE.match(last):
        error = last
  return error, last


def _last_logged_step(workdir: str) -> int | None:
  rows, _ = read_rows(os.path.join(workdir, layout.METRICS))
  return max((int(row["step"]) for row in rows), default=None)


def _previous_outcomes(sweep_dir: str) -> dict[str, dict[str, Any]]:
  """{name: outcome} from an earlier sweep.json in `sweep_dir` (shown until retried)."""
  return {run["name"]: {k: run[k] for k in ("status", "step", "reason") if k in run}
          for run in compare.sweep_runs(sweep_dir) if "name" in run and "status" in run}


def run_sweep(config: ml_collections.ConfigDict, config_arg: str, sweep_dir: str, spec: str,
              fixed: Mapping[str, Any] | None = None, launcher_flags: Sequence[str] = (),
              log_steps: bool = False,
              slots: Sequence[sweep_devices.Slot] | None = None) -> int:
  """Runs (or resumes) every run of the sweep, then compares them.

  Args:
    config: the base config (--config with its --config.x flags applied).
    config_arg: the --config value (configs/x.py:arg), passed to each run.
    sweep_dir: the sweep folder; each run's workdir is a subfolder.
    spec: the --sweep value (see the module docstring).
    fixed: {key: value} of the --config.x flags, passed to each run.
    launcher_flags: other launch.py flags for each run (the jax.distributed ones).
    log_steps: a log-scaled step axis on the comparison's curves.
    slots: the device slots to run arms side by side on (--devices_per_run); None: one
      run at a time on every device.

  Returns:
    0 when every run has finished, else the exit status to end with (the failed
    run's, or 1 for a run stopped by a signal).

  Raises:
    ConfigError: a bad spec or run config, before any run starts.
  """
  fixed = dict(fixed or {})
  runs = build_runs(config, spec, fixed)
  # A rerun asks each run for what its command now says: a run whose config.json says
  # otherwise is refused as its resume would refuse it, before sweep.json records the
  # new flags; a finished run would otherwise be "finished" with settings it never had.
  changes = recorded_config_changes(sweep_dir, runs)
  _refuse_changed_runs(runs, changes)
  os.makedirs(sweep_dir, exist_ok=True)
  outcomes = _previous_outcomes(sweep_dir)
  history = _history(sweep_dir, spec, runs)
  record_lock = threading.Lock()  # Runs side by side record from their own threads.

  def record() -> None:
    with record_lock:
      _write_record(sweep_dir, config_arg, spec, fixed, runs, outcomes, history)

  record()
  print(f"sweep: {len(runs)} runs in {os.path.abspath(sweep_dir)}", flush=True)
  stop_with_the_sweep = sweep_devices.stop_with_the_parent()
  todo = []
  with _Forward() as forward:
    for index, run in enumerate(runs, 1):
      label = f"run {index}/{len(runs)} {run.label}"
      workdir = os.path.join(sweep_dir, run.name)
      step = finished_step(workdir)
      if _in_use_or_finished(label, workdir, run, step, changes, outcomes, record):
        continue
      command = _command(config_arg, workdir, run, fixed, launcher_flags)
      if slots is not None:
        todo.append(_Arm(label, workdir, run, step, command))
        continue
      code = _train_run(label, workdir, run, step, command, outcomes, record, forward,
                        stop_with_the_sweep)
      if code:
        return code
    if todo:
      code = _side_by_side(todo, slots, outcomes, record, forward, stop_with_the_sweep)
      if code:
        return code
  return _compare_runs(sweep_dir, runs, history, outcomes, log_steps)


def _refuse_changed_runs(runs: Sequence[SweepArm], changes: Mapping[str, str]) -> None:
  """ConfigError listing each run whose recorded config the command changes, unless
  checkpoint.on_config_change=allow lets that run resume with the changes."""
  refused = [(index, run) for index, run in enumerate(runs, 1)
             if run.name in changes and run.config.checkpoint.on_config_change != "allow"]
  if refused:
    raise ConfigError(
        f"--mode=sweep: {len(refused)} of {len(runs)} runs were started with other settings "
        "than this command gives them; nothing was run or recorded:\n" + "\n".join(
            f"run {index}/{len(runs)} {run.label}: {changes[run.name]}"
            for index, run in refused))


def _in_use_or_finished(label: str, workdir: str, run: SweepArm, step: int | None,
                        changes: Mapping[str, str], outcomes: dict[str, dict[str, Any]],
                        record: Callable[[], None]) -> bool:
  """Whether the run is not to be started: another command holds its workdir, or its
  newest checkpoint (`step`) is at train.num_steps (its plots written if missing);
  recorded."""
  num_steps = run.config.train.num_steps
  holder = lock.in_use_by(workdir)
  if holder:  # Another command trains it now: neither finished nor ours to start.
    outcomes[run.name] = {"status": "in use", "step": step, "reason": f"in use by {holder}"}
    record()
    print(f"{label}: in use by {holder} (its workdir {workdir} is locked), not started; "
          "rerun the sweep once that command has ended", file=sys.stderr, flush=True)
    return True
  if step is not None and step >= num_steps:
    outcomes[run.name] = {"status": "finished", "step": step}
    kept = ""
    if run.name in changes:  # on_config_change=allow, but nothing is left to train.
      kept = (" with the settings of its config.json: the changes allowed by "
              "checkpoint.on_config_change=allow are not applied to a finished run")
      outcomes[run.name]["reason"] = changes[run.name]
    print(f"{label}: finished (checkpoint {step}/{num_steps}), skipped{kept}"
          f"{_summary(workdir)}", flush=True)
    record()
    if not os.path.isdir(os.path.join(workdir, layout.PLOTS)):
      plots.write_plots_after_training(workdir)
    return True
  return False


def _train_run(label: str, workdir: str, run: SweepArm, step: int | None, command: list[str],
               outcomes: dict[str, dict[str, Any]], record: Callable[[], None],
               forward: _Forward, stop_with_the_sweep: Callable[[], None] | None,
               slot: sweep_devices.Slot | None = None) -> int:
  """Starts (or resumes) the run and waits for it; records its outcome. Returns 0 to go
  on with the next run (finished, failed, diverged), else the exit status the sweep
  stops with (a run stopped by a signal). `slot`: the devices it takes (side by side)."""
  num_steps = run.config.train.num_steps
  start = "starting" if step is None else f"resuming from step {step}/{num_steps}"
  on = f" on {slot.where}" if slot else ""
  print(f"{label}: {start}{on} in {workdir}\n  {shlex.join(command)}", flush=True)
  outcomes[run.name] = {"status": "running"}
  record()
  started = time.perf_counter()
  # A session of its own: a terminal's Ctrl-C reaches the run once, through _Forward.
  prefix = f"[{run.name}] " if slot else ""
  if slot and slot.ray:
    from transformer.cli import sweep_ray  # pylint: disable=g-import-not-at-top  (imports Ray)
    process = sweep_ray.RayRun(command, slot, label, workdir)
  else:
    process = subprocess.Popen(command, start_new_session=True, preexec_fn=stop_with_the_sweep,
                               env={**os.environ, **slot.env} if slot else None,
                               stderr=subprocess.PIPE, text=True, errors="replace")
  forward.processes.add(process)
  if forward.signals:  # Ctrl-C came while it started: it stops with the others.
    process.send_signal(forward.signals[-1])
  if isinstance(process, subprocess.Popen):
    error, last_line = _relay_errors(process.stderr, prefix)
    code = process.wait()
  else:  # A Ray task: its stderr comes back when it ends.
    code, stderr = process.wait()
    error, last_line = _relay_errors(stderr.splitlines(keepends=True), prefix)
    print(f"{label}: ran on node {process.node or '(its node died)'}", flush=True)
  # The reason: the run's error line; for a killed run (no error printed) the signal.
  reason = error or (f"the run was killed by signal {-code}" if code < 0 else last_line)
  forward.processes.discard(process)
  step = finished_step(workdir)
  elapsed = format_duration(time.perf_counter() - started)
  if code == 0 and not forward.signals and step is not None and step >= num_steps:
    print(f"{label}: finished in {elapsed}{_summary(workdir)}", flush=True)
    outcomes[run.name] = {"status": "finished", "step": step}
    record()
    return 0
  logged = _last_logged_step(workdir)
  if forward.signals or code in _INTERRUPTED or code == 0:
    # Stopped by a signal (ours, passed on, or its own): the sweep stops with it.
    outcomes[run.name] = {"status": "stopped", "step": step,
                          "reason": reason or "stopped by a signal"}
    record()
    print(f"{label} stopped after {elapsed} at checkpoint {step}/{num_steps}; rerun the "
          "same command to resume the sweep from it", file=sys.stderr, flush=True)
    return code if code > 0 else 1
  # Failed or diverged: recorded, and the sweep goes on with the next run.
  how = f"exited with status {code}" if code > 0 else f"was killed by signal {-code}"
  status = "diverged" if reason.startswith("FloatingPointError") else "failed"
  outcomes[run.name] = {"status": status, "step": logged,
                        "reason": reason or f"the run {how}"}
  record()
  print(f"{label} {status}: {how} after {elapsed}, last logged step {logged}: "
        f"{reason or '(no error line)'}; the sweep goes on (rerunning it retries this "
        "run)", file=sys.stderr, flush=True)
  return 0


class _Arm(NamedTuple):
  """A run to start side by side: _train_run's first arguments."""
  label: str
  workdir: str
  run: SweepArm
  step: int | None
  command: list[str]


def _side_by_side(todo: Sequence[_Arm], slots: Sequence[sweep_devices.Slot],
                  outcomes: dict[str, dict[str, Any]], record: Callable[[], None],
                  forward: _Forward, stop_with_the_sweep: Callable[[], None] | None) -> int:
  """Runs the arms, each on a free slot as one frees up (in the sweep's order), each in a
  thread of its own that waits for its process; a line says which run where at each
  start and end. Returns 0, or the exit status of the first run stopped by a signal (no
  further arm is started; the running ones stop with their checkpoints on Ctrl-C)."""
  free, waiting = list(slots), list(todo)
  running: dict[str, str] = {}
  done: queue.Queue = queue.Queue()
  codes: list[int] = []

  def work(arm: _Arm, slot: sweep_devices.Slot) -> None:
    code = 1
    try:
      code = _train_run(*arm, outcomes, record, forward, stop_with_the_sweep, slot=slot)
    finally:
      done.put((arm, slot, code))

  def say() -> None:
    print(f"sweep: running {'; '.join(f'{label} on {where}' for label, where in running.items())}"
          f"; {len(waiting)} waiting", flush=True)

  print(f"sweep: {len(todo)} runs side by side, at most {len(slots)} at once on "
        f"{', '.join(slot.where for slot in slots)}", flush=True)
  while waiting or running:
    started = False
    while waiting and free and not forward.signals and not codes:
      arm, slot = waiting.pop(0), free.pop(0)
      running[arm.label] = slot.where
      threading.Thread(target=work, args=(arm, slot), daemon=True).start()
      started = True
    if started:
      say()
    if not running:
      break  # Stopped: the waiting arms stay pending.
    try:
      arm, slot, code = done.get(timeout=0.5)  # A timeout: signals reach this thread.
    except queue.Empty:
      continue
    del running[arm.label]
    free.append(slot)
    free.sort(key=slots.index)
    if code:
      codes.append(code)
  return codes[0] if codes else 0


def _compare_runs(sweep_dir: str, runs: Sequence[SweepArm], history: tuple[list[str],
                  list[dict[str, Any]]], outcomes: Mapping[str, dict[str, Any]],
                  log_steps: bool) -> int:
  """The comparison of the runs (and those of earlier --sweep lists); 0 when every run
  has finished, else 1."""
  # The runs of earlier --sweep lists stay in the comparison, marked as such.
  earlier = [os.path.join(sweep_dir, arm["name"]) for arm in history[1]]
  # A run whose folder is gone (deleted; or a run that failed before it wrote anything)
  # is listed as missing under the table, not dropped.
  text = compare.compare([path for path in [os.path.join(sweep_dir, run.name) for run in runs]
                          + earlier if os.path.isdir(path)],
                         sweep_dir, log_steps, missing=compare.missing_runs(sweep_dir))
  print(text, flush=True)
  failed = [run.name for run in runs if outcomes[run.name]["status"] != "finished"]
  if failed:
    print(f"sweep: {len(runs) - len(failed)} of {len(runs)} runs finished; not finished: "
          f"{', '.join(failed)} (status and reason in {layout.SWEEP_RECORD} and "
          f"{layout.COMPARE}); rerun the same command to retry them", file=sys.stderr,
          flush=True)
    return 1
  print(f"sweep: all {len(runs)} runs finished; {os.path.join(sweep_dir, layout.COMPARE)}"
        " and compare_*.png written", flush=True)
  return 0
