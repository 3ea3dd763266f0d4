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
  assert imported <= {"cli", "workdir", "config", "distributed", "plugin_noise", "accelerator"}, imported
