"""The package's layout: imports run downwards, and every package says what it owns.

`ALLOWED` is the architecture in one table: for each top-level part of `transformer/`,
the parts it may import. A module that imports a part not listed for its own (for
example `model/` importing `training/`, or the training loop importing `reports/`)
fails here, naming the file and the import. A new subpackage must be added to the
table, which is also the place to read the layout from (docs/layout.md
draws the same picture).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "transformer"

# From the ground up. `configs` (the presets package beside `transformer/`) is not
# checked: configs/base.py is the one declaration of every key.
ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "distributed": set(),
    "hardware": set(),
    "accelerator": set(),
    "plugin_noise": set(),
    "gc_tuning": set(),
    "sharding": {"config"},
    "workdir": {"config", "accelerator", "plugin_noise"},
    "model": {"config", "accelerator"},
    "data": {"config", "distributed", "workdir"},
    "inference": {"config", "distributed", "sharding", "model", "data", "workdir"},
    "evaluation": {"config", "sharding", "model", "data", "inference", "workdir"},
    "training": {"config", "distributed", "hardware", "sharding", "model", "data",
                 "inference", "evaluation", "workdir"},
    "reports": {"config", "workdir"},
    "interop": {"config", "distributed", "sharding", "model", "data", "inference", "workdir"},
    "planning": {"config", "distributed", "hardware", "accelerator", "sharding", "model",
                 "data", "inference", "training", "workdir", "plugin_noise"},
    "cli": {"config", "distributed", "hardware", "accelerator", "sharding", "model", "data",
            "inference", "evaluation", "training", "reports", "interop", "planning",
            "workdir", "plugin_noise"},
    # The notebook facade (docs/python.md): over everything, imported by nothing.
    "api": {"config", "distributed", "hardware", "accelerator", "sharding", "model", "data",
            "inference", "evaluation", "training", "reports", "interop", "planning",
            "workdir", "plugin_noise", "cli"},
}


def _part(path: pathlib.Path) -> str:
  """transformer/model/layers.py -> 'model'; transformer/sharding.py -> 'sharding'."""
  return path.relative_to(PACKAGE).with_suffix("").parts[0]


def _imported_parts(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, part) for every `transformer.<part>` import in the file, nested ones too."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      module = node.module.split(".")
      if module[0] != "transformer":
        continue
      parts = [module[1]] if len(module) > 1 else [alias.name for alias in node.names]
      found += [(node.lineno, part) for part in parts]
    elif isinstance(node, ast.Import):
      found += [(node.lineno, alias.name.split(".")[1]) for alias in node.names
                if alias.name.startswith("transformer.")]
  return found


def _modules() -> list[pathlib.Path]:
  return sorted(PACKAGE.rglob("*.py"))


def test_every_part_is_in_the_table():
  parts = {_part(path) for path in _modules()} - {"__init__"}
  assert parts <= set(ALLOWED), (f"{sorted(parts - set(ALLOWED))}: add them to ALLOWED in "
                                 "this file, with the parts they may import")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_downwards(path):
  own = _part(path)
  if own == "__init__":
    return
  upward = [f"{path.relative_to(ROOT)}:{line} imports transformer.{part}"
            for line, part in _imported_parts(path)
            if part != own and part not in ALLOWED[own]]
  assert not upward, (f"{own} may import only {sorted(ALLOWED[own])}: " + "; ".join(upward))


def test_the_table_catches_an_upward_import(tmp_path):
  """The check itself: a model file importing the training loop is found."""
  fake = PACKAGE / "model" / "attention.py"
  source = tmp_path / "attention.py"
  source.write_text(fake.read_text(encoding="utf-8") +
                    "\nfrom transformer.training import loop\n", encoding="utf-8")
  imported = {part for _, part in _imported_parts(source)}
  assert "training" in imported and "training" not in ALLOWED["model"]


def test_each_package_docstring_is_its_map():
  for init in sorted(PACKAGE.rglob("__init__.py")):
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    modules = sorted(p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py")
    missing = [m for m in modules if m not in doc]
    assert not missing, f"{init.relative_to(ROOT)}'s docstring does not mention {missing}"
    if init.parent != PACKAGE:
      assert "import" in doc, f"{init.relative_to(ROOT)}: say what the package may import"


def test_launch_dispatches_through_the_cli_package():
  """launch.py is thin: it imports the mode modules and the package's ground, no more."""
  imported = {part for _, part in _imported_parts(ROOT / "launch.py")}
  assert imported <= {"cli", "workdir", "config", "distributed", "plugin_noise", "accelerator",
                      "gc_tuning"}, imported


def _module_graph(paths: list[pathlib.Path]) -> dict[str, set[str]]:
  """Module -> the package modules it imports, at the top or inside a function."""
  names = {}
  for path in paths:
    parts = path.relative_to(ROOT).with_suffix("").parts
    names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  graph: dict[str, set[str]] = {name: set() for name in names}
  for name, path in names.items():
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      targets = []
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets = [f"{node.module}.{alias.name}" for alias in node.names]
      elif isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
      for target in targets:
        while target not in names and "." in target:
          target = target.rsplit(".", 1)[0]
        if target in names and target != name:
          graph[name].add(target)
  return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The groups of modules that reach each other (strongly connected, more than one)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node: str) -> None:
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for other in graph[node]:
      if other not in index:
        visit(other)
        low[node] = min(low[node], low[other])
      elif other in on_stack:
        low[node] = min(low[node], index[other])
    if low[node] == index[node]:
      group = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        group.append(member)
        if member == node:
          break
      if len(group) > 1:
        found.append(sorted(group))

  for node in graph:
    if node not in index:
      visit(node)
  return found


def test_no_module_reaches_one_that_reaches_it_back():
  """No circle of imports anywhere in the package, imports inside functions included
  (one there hides a circle rather than removing it)."""
  circles = _circles(_module_graph(_modules()))
  assert not circles, f"modules that import each other (directly or around): {circles}"


def test_the_circle_check_finds_a_lazy_one(tmp_path):
  """The check itself: a function-level import closing a circle is found."""
  package = tmp_path / "transformer"
  (package / "data").mkdir(parents=True)
  (package / "data" / "a.py").write_text("from transformer.data import b\n")
  (package / "data" / "b.py").write_text("def f():\n  from transformer.data import a\n")
  global ROOT  # pylint: disable=global-statement
  saved, ROOT = ROOT, tmp_path
  try:
    graph = _module_graph(sorted(package.rglob("*.py")))
  finally:
    ROOT = saved
  assert _circles(graph) == [["transformer.data.a", "transformer.data.b"]]
