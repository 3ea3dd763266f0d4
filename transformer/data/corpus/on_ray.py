"""--mode=prepare --ray_address: the preparation's tasks as Ray tasks on a cluster's nodes.

The same tasks as the local pool (preparation.run_task over files and parts, then
preparation.join_task), the same outputs: each task writes its own files in the corpus
folder, so the corpus is byte-identical to a one-process preparation whatever the nodes.

- Connect: `auto` (the cluster this machine belongs to) or HOST:PORT of its head. Nothing
  listening there is one line (Ray's own client would retry for minutes); the project's
  code is shipped to the nodes (runtime_env py_modules: the `transformer` package), its
  dependencies must be installed on every node (requirements.txt).
- Check every alive node first, with a task pinned to it: the packages import, the sources
  are there, and the corpus folder is the same folder (a marker written here is read
  there, a marker written there is read here): a shared file system or a mounted bucket.
  A node that fails is one line naming it.
- The vocabulary, trained once here, travels in the job (Job.tokenizer_data, one
  ray.put); a node writes it once into its temporary folder.
- Retries: a task whose worker process or node dies is run again (`max_retries`; Ray's
  system-failure retries); an error the task raises (a bad record) is not retried and
  stops the preparation in its one line. A file's shards are renamed into place only when
  complete, so a killed attempt leaves nothing a retry or a rerun would read.
- Progress: each task reports its bytes and tokens to a small actor at most every second
  (a retried attempt replaces its predecessor's counts); the driver's progress line reads
  the totals.

Security: a Ray head runs whatever a client that reaches its ports sends (no
authentication by default): the project never starts one; keep a cluster's ports inside a
private network (docs/corpus.md).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import socket
import sys
import time
import uuid
from typing import Any, Callable

from transformer.config.errors import ConfigError, DataError
from transformer.workdir import progress

MAX_RETRIES = 3  # Attempts after the first for a task whose worker or node died.
# What a node needs installed (requirements.txt's modules that preparation imports).
REQUIRED_MODULES = ("numpy", "absl", "array_record", "pyarrow", "zstandard", "sentencepiece",
                    "tokenizers", "ml_collections")
_REPORT_SECONDS = 1.0
_CONNECT_SECONDS = 5.0
_PROBE = ".ray-probe"  # The marker files of the folder check, removed after it.
_START_HINT = ("start one with `ray start --head --port=6379` on a machine of a private "
               "network (and `ray start --address=HEAD:6379` on the others), or pass "
               "--ray_address=auto on a node of a running cluster (docs/corpus.md)")


def parse_address(address: str) -> tuple[str, int] | None:
  """--ray_address -> (host, port); None for "auto".

  Raises:
    ConfigError: neither "auto" nor HOST:PORT.
  """
  if address == "auto":
    return None
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ConfigError(f"--ray_address={address!r} is invalid: expected 'auto' or HOST:PORT "
                      "of a running Ray cluster's head (e.g. 10.0.0.5:6379)")
  return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
  try:
    return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
  except (OSError, ValueError):
    return False


def _auto_address(address: str) -> tuple[str, int]:
  """Where `auto` points (RAY_ADDRESS, else the cluster this machine last started or
  joined), as Ray finds it, so that a stale one is checked like any address."""
  from ray._private import services  # pylint: disable=g-import-not-at-top  (Ray's own resolution; pinned Ray)
  try:
    # Not canonicalize_bootstrap_address: it turns 127.0.0.1 into the outward IP.
    resolved = services.get_ray_address_from_environment(address, None)
  except ConnectionError as e:
    raise ConfigError(f"--ray_address=auto: no Ray cluster found on this machine ("
                      f"{str(e).splitlines()[0]}); {_START_HINT}") from None
  host, _, port = resolved.rpartition(":")
  return host.strip("[]"), int(port)


def connect(address: str) -> None:
  """ray.init(address) after checking that a cluster answers there (one line if not);
  once a process (data.mixture prepares several corpora in turn)."""
  if "ray" in sys.modules and sys.modules["ray"].is_initialized():
    return
  where = parse_address(address) or _auto_address(address)
  if where:  # Always: the TCP check below keeps Ray's client from retrying for minutes.
    try:
      socket.create_connection(where, timeout=_CONNECT_SECONDS).close()
    except OSError as e:
      raise ConfigError(f"--ray_address={address}: no Ray cluster answers at "
                        f"{where[0]}:{where[1]} ("
                        f"{e.strerror or e}); {_START_HINT}") from None
    if _is_loopback(where[0]):
      # Ray turns a loopback address into this machine's outward IP, where a head bound
      # to 127.0.0.1 (a one-machine cluster kept off the network) does not listen; with
      # this variable it keeps 127.0.0.1 (it only disables multi-node `ray start` here).
      # Read when Ray is imported: `auto` has imported it already, to resolve itself.
      os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
      constants = sys.modules.get("ray._private.ray_constants")
      if constants is not None and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":
        constants.ENABLE_RAY_CLUSTER = False
  import ray  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top
  package = os.path.dirname(os.path.abspath(transformer.__file__))
  try:
    # Test-only variables (workdir/kill_points.py) travel to the tasks, as they reach
    # the local pool's forked workers; nothing else of this environment does.
    tests = {k: v for k, v in os.environ.items() if k.startswith("TRANSFORMER_TEST_")}
    ray.init(address=address, runtime_env={"py_modules": [package], "env_vars": tests},
             logging_level="ERROR", log_to_driver=False, configure_logging=False)
  except ConnectionError as e:
    raise ConfigError(f"--ray_address={address}: no Ray cluster found ({str(e).splitlines()[0]}); "
                      f"{_START_HINT}") from None


# What the node check calls the file it looks for, the folder it writes, and what every
# node needs at the same path: --mode=prepare's (the sweep passes its own).
PREPARE_NAMES = ("the source file", "the corpus folder", "the sources and data.data_dir")


def _probe(modules: tuple[str, ...], root: str, first: str, output: str, token: str,
           names: tuple[str, ...] = PREPARE_NAMES) -> dict:
  """On one node: what it lacks of `modules`, and whether it sees the folders."""
  import ray  # pylint: disable=g-import-not-at-top
  node = ray.util.get_node_ip_address()
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  problem = ""
  if importlib.util.find_spec("transformer") is None:  # Shipped by runtime_env py_modules.
    missing.append("transformer (the project's code)")
  if not os.path.exists(os.path.join(root, first)):
    problem = f"does not see {names[0]} {os.path.join(root, first)}"
  else:
    try:
      with open(os.path.join(output, _PROBE), encoding="utf-8") as f:
        seen = f.read()
      if seen != token:
        problem = f"sees another folder at {output} (not the one this machine writes)"
      else:
        mine = os.path.join(output, f"{_PROBE}-{uuid.uuid4().hex}")
        with open(mine, "w", encoding="utf-8") as f:
          f.write(token)
        return {"node": node, "missing": missing, "problem": "", "marker": mine}
    except OSError as e:
      problem = f"cannot read or write {names[1]} {output} ({e.strerror or e})"
  return {"node": node, "missing": missing, "problem": problem, "marker": ""}


def check_nodes(root: str, first: str, output: str, modules: tuple[str, ...] | None = None,
                names: tuple[str, ...] = PREPARE_NAMES) -> int:
  """Runs `_probe` pinned to every alive node; one line for the first that fails.

  Args:
    root, first: a file every node must see at the same path, os.path.join(root, first).
    output: the folder every node must share (written here, read there, and back).
    modules: what every node must have installed (None: REQUIRED_MODULES, read at call time
      so that the list stays one place to extend).
    names: the file's, the folder's and both's names in the messages (PREPARE_NAMES).

  Returns:
    The number of nodes.
  """
  import ray  # pylint: disable=g-import-not-at-top
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # pylint: disable=g-import-not-at-top
  modules = REQUIRED_MODULES if modules is None else modules
  token = uuid.uuid4().hex
  marker = os.path.join(output, _PROBE)
  with open(marker, "w", encoding="utf-8") as f:
    f.write(token)
  probe = ray.remote(num_cpus=0, max_retries=0)(_probe)
  nodes = [n for n in ray.nodes() if n["Alive"]]
  try:
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(modules, root, first, output, token, names)
            for n in nodes]
    try:
      answers = ray.get(refs)
    except ray.exceptions.RuntimeEnvSetupError as e:
      raise ConfigError("--ray_address: a node could not install the project's code (runtime_env "
                        f"py_modules): {str(e).strip().splitlines()[-1]}") from None
    for answer in answers:
      if answer["missing"]:
        raise ConfigError(f"--ray_address: node {answer['node']} lacks the project's packages "
                          f"{', '.join(answer['missing'])}: pip install -r requirements.txt "
                          "on every node of the cluster")
      if answer["problem"]:
        raise ConfigError(f"--ray_address: node {answer['node']} {answer['problem']}: every node "
                          f"needs {names[2]} at the same path (a shared file system or a "
                          "mounted bucket; docs/corpus.md)")
      if not os.path.exists(answer["marker"]):
        raise ConfigError(f"--ray_address: node {answer['node']} writes {output} but this "
                          f"machine does not see what it wrote: every node needs {names[2]} "
                          "at the same path (a shared file system or a mounted bucket)")
  finally:
    for name in os.listdir(output):
      if name.startswith(_PROBE):
        os.remove(os.path.join(output, name))
  return len(nodes)


def _run_one(setup: Callable[[Callable[[int, int], None]], None], fn: Callable[..., Any],
             job: Any, item: Any, totals: Any, key: int) -> Any:
  """A Ray task: `fn(job, item)`, its progress sent to the `totals` actor as it goes."""
  counts, last = [0, 0], [time.monotonic()]

  def report(read_bytes: int, tokens: int) -> None:
    counts[0] += read_bytes
    counts[1] += tokens
    if time.monotonic() - last[0] >= _REPORT_SECONDS:
      last[0] = time.monotonic()
      totals.set.remote(key, *counts)

  setup(report)
  result = fn(job, item)
  totals.set.remote(key, *counts)
  return result


class _Totals:
  """An actor: each task's latest (bytes, tokens), so a retried attempt replaces its own."""

  def __init__(self):
    self._counts: dict[int, tuple[int, int]] = {}

  def set(self, key: int, read_bytes: int, tokens: int) -> None:
    self._counts[key] = (read_bytes, tokens)

  def sum(self) -> tuple[int, int]:
    return (sum(c[0] for c in self._counts.values()), sum(c[1] for c in self._counts.values()))


def _describe(item: Any, job: Any) -> str:
  if isinstance(item, int):
    return f"the join of {job.names[item]}'s parts"
  part = f" (part {item.part + 1} of {item.parts})" if item.parts > 1 else ""
  return f"{job.names[item.file]}{part}"


def runner(address: str, job: Any, set_reporter: Callable[[Callable[[int, int], None]], None]
           ) -> Callable[..., None]:
  """Connects, checks the nodes, and returns preparation's Runner on the cluster.

  Args:
    address: --ray_address.
    job: the preparation (preparation.Job).
    set_reporter: preparation.set_reporter, called in each task with its progress report.
  """
  import dataclasses  # pylint: disable=g-import-not-at-top
  connect(address)
  import ray  # pylint: disable=g-import-not-at-top
  nodes = check_nodes(job.root, job.names[0], job.output)
  cpus = int(ray.cluster_resources().get("CPU", 0))
  progress.say(f"prepare: Ray cluster at {address}: {nodes} node(s), {cpus} CPUs")
  if job.tokenizer_path and not job.tokenizer_data:
    with open(job.tokenizer_path, "rb") as f:  # Trained once here; shipped with the job.
      job = dataclasses.replace(job, tokenizer_data=f.read())
  job_ref = ray.put(job)
  task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_run_one)
  totals_actor = ray.remote(num_cpus=0)(_Totals)

  def run(fn, _job, items: list[Any], on_done, counters) -> None:
    totals = totals_actor.remote()
    refs = {task.remote(set_reporter, fn, job_ref, item, totals, key): item
            for key, item in enumerate(items)}
    try:
      while refs:
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
        for ref in ready:
          item = refs.pop(ref)
          try:
            result = ray.get(ref)
          except ray.exceptions.RayTaskError as e:
            raise e.cause if isinstance(e.cause, (ConfigError, DataError, OSError)) else e
          except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                  ray.exceptions.ObjectLostError, ray.exceptions.OutOfMemoryError) as e:
            raise DataError(f"--ray_address: the task of {_describe(item, job)} failed "
                            f"{MAX_RETRIES + 1} times, its worker or node died each time "
                            f"({type(e).__name__}); rerun to resume, the files finished "
                            "so far are kept") from None
          on_done(item, result)
        counters[0].value, counters[1].value = ray.get(totals.sum.remote())
    finally:
      for ref in refs:  # An error or Ctrl-C: stop the tasks still running.
        ray.cancel(ref, force=True)
      ray.kill(totals)

  return run
