"""A measurement-only pytest plugin: each test's CPU seconds and JAX compilation-cache use.

One JSON line a test into $PYTEST_CPU_OUT: its wall seconds, the CPU seconds of the
process running it (user + sys) and of the child processes it reaped (launch.py
subprocesses), the xdist worker, and JAX's persistent-cache hits and misses with the
compile seconds, and by function name the count and seconds of JAX's tracing, lowering
and compiling (a program built again and again across tests shows there). CPU seconds
compare two trees fairly even on a busy machine, where wall times do not. Used for
docs/performance.md's "Test-suite run times":

  PYTEST_CPU_OUT=/tmp/new.jsonl PYTHONPATH=benchmarks python -m pytest tests -q -p pytest_cpu
  (the same in an older checkout into /tmp/old.jsonl, at the same time), then
  python benchmarks/pytest_cpu.py /tmp/new.jsonl /tmp/old.jsonl
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time

import pytest

_counts: dict[str, float] = {}
# Per traced / lowered / compiled function name: [count, seconds] of each stage, so that a
# program traced or compiled again and again across tests can be found.
_by_function: dict[str, dict[str, list[float]]] = {}
_STAGES = {"jaxpr_trace_duration": "trace", "jaxpr_to_mlir_module_duration": "lower",
           "backend_compile_duration": "compile"}


def _event(event: str, **kwargs) -> None:
  del kwargs
  if event.startswith("/jax/compilation_cache/cache_"):  # cache_hits, cache_misses
    key = event.rsplit("_", 1)[-1]
    _counts[key] = _counts.get(key, 0) + 1


def _duration(event: str, seconds: float, **kwargs) -> None:
  key = event.rsplit("/", 1)[-1]
  _counts[key] = _counts.get(key, 0.0) + seconds
  if key in _STAGES:
    stages = _by_function.setdefault(str(kwargs.get("fun_name", "?")), {})
    entry = stages.setdefault(_STAGES[key], [0, 0.0])
    entry[0] += 1
    entry[1] += seconds


def pytest_configure(config) -> None:
  del config
  from jax._src import monitoring  # pylint: disable=g-import-not-at-top
  monitoring.register_event_listener(_event)
  monitoring.register_event_duration_secs_listener(_duration)


def _cpu() -> tuple[float, float]:
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  _counts.clear()
  _by_function.clear()
  own, children, start = *_cpu(), time.time()
  yield
  own2, children2 = _cpu()
  row = dict(id=item.nodeid, wall=round(time.time() - start, 2), cpu=round(own2 - own, 2),
             child_cpu=round(children2 - children, 2),
             worker=os.environ.get("PYTEST_XDIST_WORKER", "-"),
             **{k: round(v, 2) if isinstance(v, float) else v for k, v in _counts.items()},
             functions={name: {stage: [n, round(t, 3)] for stage, (n, t) in stages.items()}
                        for name, stages in _by_function.items()})
  with open(os.environ.get("PYTEST_CPU_OUT", "pytest_cpu.jsonl"), "a",
            encoding="utf-8") as f:
    f.write(json.dumps(row) + "\n")


def _load(path: str) -> dict[str, float]:
  rows = (json.loads(line) for line in open(path, encoding="utf-8"))
  return {r["id"]: r["cpu"] + r["child_cpu"] for r in rows}


def main(argv: list[str]) -> None:
  """Prints the CPU by file of one record, and the tests common to two side by side."""
  if len(argv) not in (2, 3):
    sys.exit("usage: python benchmarks/pytest_cpu.py NEW.jsonl [OLD.jsonl]")
  new = _load(argv[1])
  by_file, count = collections.defaultdict(float), collections.Counter()
  for test, seconds in new.items():
    by_file[test.split("::")[0]] += seconds
    count[test.split("::")[0]] += 1
  print(f"{len(new)} tests, {sum(new.values()):.0f} CPU seconds")
  for name, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:25]:
    print(f"  {name:<45} {seconds:7.1f} s  {count[name]:4d} tests")
  if len(argv) == 3:
    old = _load(argv[2])
    common = set(new) & set(old)
    print(f"{len(common)} tests in both: {sum(new[t] for t in common):.0f} CPU seconds "
          f"here, {sum(old[t] for t in common):.0f} in the other")


if __name__ == "__main__":
  main(sys.argv)
