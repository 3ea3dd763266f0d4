"""An optimised HLO module's text, parsed: its computations and their instructions.

The one reader of XLA's printed programs for planning/: hlo.py counts what a step does
from it, attention_cost.py prices the fused attention calls in it.
"""

from __future__ import annotations

import dataclasses
import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
          "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
COMPUTATION_LINE = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?.*\{\s*$")
INSTRUCTION_LINE = re.compile(r"^(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
CALLEE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|"
                     r"false_computation)=%?([\w.\-]+)")
BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
OPERAND = re.compile(r"%([\w.\-]+)")
CUSTOM_TARGET = re.compile(r'custom_call_target="([^"]+)"')
CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
DIM_LABELS = re.compile(r"dim_labels=([\w]+)_([\w]+)->([\w]+)")
FEATURE_GROUPS = re.compile(r"feature_group_count=(\d+)")
CONSTANT = re.compile(r"constant\((-?\d+)\)")
# Custom calls that reserve or name a buffer and move no bytes (XLA's TPU compiler).
NO_TRAFFIC = re.compile(r'custom_call_target="(AllocateBuffer|Sharding|SPMDFullToShardShape|'
                         r'SPMDShardToFullShape|MoveToHost|MoveToDevice)"')


def array_bytes(shape_text: str) -> list[int]:
  """Bytes of each array in an HLO shape (a tuple gives several)."""
  sizes = []
  for dtype, dims in ARRAY.findall(shape_text):
    if dtype in BYTES:
      sizes.append(element_count(dims) * BYTES[dtype])
  return sizes


def dims(shape_text: str) -> list[int]:
  """The dimensions of the first array in an HLO shape."""
  match = ARRAY.search(shape_text)
  return [int(d) for d in match.group(2).split(",") if d] if match else []


def element_count(dimensions: str) -> int:
  """Elements of an array whose dimensions are printed as "4,8,16"."""
  count = 1
  for d in filter(None, dimensions.split(",")):
    count *= int(d)
  return count


_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass
class Instruction:
  """One printed instruction: `name = shape opcode(rest`."""

  name: str
  shape: str
  opcode: str
  rest: str  # Operands and attributes, as printed.

  @property
  def operands(self) -> list[str]:
    depth, end = 1, 0
    for end, char in enumerate(self.rest):
      depth += {"(": 1, ")": -1}.get(char, 0)
      if depth == 0:
        break
    return OPERAND.findall(self.rest[:end])

  @property
  def op_name(self) -> str:
    """The JAX program's name for where it came from (its metadata), or ""."""
    match = _OP_NAME.search(self.rest)
    return match.group(1) if match else ""


@dataclasses.dataclass
class Computation:
  """A named computation (the entry, a fusion's body, a loop's body, ...)."""

  name: str
  instructions: list[Instruction] = dataclasses.field(default_factory=list)
  root: Instruction | None = None

  shapes: dict[str, str] = dataclasses.field(default_factory=dict)  # Name -> result shape.

  def shape_of(self, name: str) -> str:
    return self.shapes.get(name, "")


def parse(hlo_text: str) -> tuple[dict[str, Computation], str]:
  """Computations by name, and the entry computation's name."""
  computations: dict[str, Computation] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if current is None:
      match = COMPUTATION_LINE.match(stripped)
      if match and not stripped.startswith(("HloModule", "//")):
        current = computations.setdefault(match.group(1), Computation(match.group(1)))
        if stripped.startswith("ENTRY"):
          entry = current.name
      continue
    if stripped == "}":
      current = None
      continue
    match = INSTRUCTION_LINE.match(stripped)
    if match:
      instruction = Instruction(*match.groups())
      current.instructions.append(instruction)
      current.shapes[instruction.name] = instruction.shape
      if stripped.startswith("ROOT"):
        current.root = instruction
    elif current.instructions:
      # An attribute printed over several lines (a Pallas kernel's kernel_metadata):
      # its op_name and backend_config follow on the next lines.
      current.instructions[-1].rest += "\n" + stripped
  return computations, entry
