"""One legend of shape letters for `transformer/model/`: every suffixed name follows it.

The legend is the table in `transformer/model/__init__.py`'s docstring (`  B  batch`).
A name such as `q_BLHD` ends in its axes; an uppercase einsum equation ("BLE,VE->BLV")
and a tuple of single-letter sizes (`B, L, E = x_BLE.shape`) use the same letters. A
letter the table does not hold, or one it gives two meanings, fails here with the file,
the line and the name. Static: reads the source, imports nothing of the model.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL = ROOT / "transformer" / "model"

# `q_BLHD`, `mask_B1LS`, `x32_BLHD`: a lowercase identifier, then _ and the axes. An
# ALL_CAPS constant (GATED_ACTIVATIONS) has no lowercase start, so it is not matched.
SUFFIXED = re.compile(r"\b[a-z][A-Za-z0-9_]*?_([A-Z][A-Z0-9]*)\b")
EINSUM = re.compile(r"""["']([A-Z0-9]+(?:,[A-Z0-9]+)*->[A-Z0-9]*)["']""")
SIZES = re.compile(r"^\s*([A-Z](?:\s*,\s*[A-Z_])*)\s*=(?!=)", re.MULTILINE)
LEGEND_ROW = re.compile(r"^  ([A-Z0-9])  \S")


def legend() -> dict[str, int]:
  """The legend's letters, each with how many rows define it (1 when well kept)."""
  doc = ast.get_docstring(ast.parse((MODEL / "__init__.py").read_text()), clean=False)
  counts: dict[str, int] = {}
  for line in doc.splitlines():
    match = LEGEND_ROW.match(line)
    if match:
      counts[match.group(1)] = counts.get(match.group(1), 0) + 1
  return counts


def undeclared(source: str, letters: set[str]) -> list[tuple[int, str]]:
  """(line, name) of every suffixed name, einsum equation or size tuple of `source`
  that uses a letter outside `letters` (digits are sizes, e.g. the 1 of `mask_B1LS`)."""
  found = []
  for pattern, group in ((SUFFIXED, 1), (EINSUM, 1), (SIZES, 1)):
    for match in pattern.finditer(source):
      used = {c for c in match.group(group) if c.isalpha()}
      if used - letters:
        found.append((source.count("\n", 0, match.start()) + 1, match.group(0).strip()))
  return found


def test_the_legend_gives_each_letter_one_meaning():
  counts = legend()
  assert {"B", "L", "S", "H", "K", "D", "E", "V"} <= set(counts), sorted(counts)
  assert all(n == 1 for n in counts.values()), {k: n for k, n in counts.items() if n > 1}


def test_every_shape_suffix_in_model_uses_the_legend():
  letters = set(legend())
  bad = {path.name: found for path in sorted(MODEL.glob("*.py"))
         if (found := undeclared(path.read_text(), letters))}
  assert not bad, f"shape letters outside transformer/model/__init__.py's legend: {bad}"


def test_the_check_finds_a_stray_letter():
  """The check itself: a name, an equation and a size tuple with letters outside it."""
  source = ('x_BLE = f(q_BLQD)\n'
            'y = jnp.einsum("BLE,EW->BLW", x, w)\n'
            'B, L, Z = x.shape\n'
            'GATED_ACTIVATIONS = 1; mask_B1LS = 2; top_k = 3\n')
  found = undeclared(source, set(legend()))
  assert [line for line, _ in found] == [1, 2, 3], found
  assert "q_BLQD" in found[0][1] and "EW" in found[1][1] and "Z" in found[2][1], found
