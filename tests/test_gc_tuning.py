"""transformer/gc_tuning.py: what launch.py does to Python's garbage collector."""

import json
import subprocess
import sys
import textwrap

import launch
from transformer import gc_tuning

_CHILD = textwrap.dedent("""
    import gc, json, weakref
    from transformer import gc_tuning
    before = gc.get_freeze_count()
    gc_tuning.tune()
    frozen = gc.get_freeze_count()

    class Node:
      pass

    # A cycle made after tune() is still garbage the collector finds.
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    del a, b
    gc.collect()
    print(json.dumps({"before": before, "frozen": frozen, "threshold": gc.get_threshold(),
                      "cycle_collected": alive() is None}))
""")


def test_tune_freezes_what_exists_and_still_collects_new_cycles():
  out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                       check=True, cwd=launch.__file__.rsplit("/", 1)[0]).stdout
  result = json.loads(out.splitlines()[-1])
  assert result["before"] == 0 and result["frozen"] > 1000  # The imports, out of sight.
  assert tuple(result["threshold"]) == gc_tuning.THRESHOLDS
  assert result["cycle_collected"]


def test_the_command_tunes_the_collector_before_it_runs(monkeypatch):
  calls = []
  # console_main marks the process as the command and sets __main__'s docstring: both
  # put back after the test.
  monkeypatch.setitem(launch._AS_SCRIPT, "running", False)  # pylint: disable=protected-access
  monkeypatch.setattr(sys.modules["__main__"], "__doc__", sys.modules["__main__"].__doc__)
  monkeypatch.setattr(gc_tuning, "tune", lambda: calls.append("tune"))
  monkeypatch.setattr(launch, "run", lambda: calls.append("run"))
  monkeypatch.setattr(launch, "_finished", lambda: None)
  launch.console_main()
  assert calls == ["tune", "run"]
