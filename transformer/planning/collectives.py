"""Bytes each kind of collective moves per step, read from a compiled program's HLO text.

Each collective instruction counts the bytes of its result on one chip (an all-gather's
gathered array, an all-reduce's reduced one, ...): what the chip must receive, a lower
bound on what crosses its links. An instruction inside a loop counts once per trip when
XLA knows the trip count (`known_trip_count` of the while loop: scanned layers,
micro-batches, decoding steps); a loop with an unknown count (a decode that stops at
eos) counts once, and `UNKNOWN_TRIPS` says how many such loops held collectives.
"""

from __future__ import annotations

import re

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
UNKNOWN_TRIPS = "loops_with_unknown_trip_count"

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
          "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?.*\{\s*$")
_INSTRUCTION = re.compile(
    r"=\s*(.*?)\s+(" + "|".join(KINDS) + r")(-start)?\(")
_CALLEE = re.compile(r"\b(?:calls|to_apply|body|condition|true_computation|"
                     r"false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def _array_bytes(shape_text: str) -> list[int]:
  sizes = []
  for dtype, dims in _ARRAY.findall(shape_text):
    if dtype in _BYTES:
      count = 1
      for d in filter(None, dims.split(",")):
        count *= int(d)
      sizes.append(count * _BYTES[dtype])
  return sizes


def _parse(hlo_text: str) -> tuple[dict, dict, str]:
  """computation -> ({kind: bytes}, [(callee, trips or None)]), and the entry's name."""
  own: dict[str, dict[str, int]] = {}
  calls: dict[str, list[tuple[str, int | None]]] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if current is None:
      match = _COMPUTATION.match(stripped)
      if match and not stripped.startswith(("HloModule", "//")):
        current = match.group(1)
        own[current], calls[current] = {}, []
        if stripped.startswith("ENTRY"):
          entry = current
      continue
    if stripped == "}":
      current = None
      continue
    match = _INSTRUCTION.search(stripped)
    if match:
      result, kind, started = match.groups()
      sizes = _array_bytes(result)
      # An async start returns (operand, result[, context]): the largest is the result.
      nbytes = max(sizes, default=0) if started else sum(sizes)
      own[current][kind] = own[current].get(kind, 0) + nbytes
    trips_match = _TRIPS.search(stripped)
    trips = int(trips_match.group(1)) if trips_match else None
    is_loop = " while(" in stripped
    for callee in _CALLEE.findall(stripped):
      calls[current].append((callee, trips if is_loop else 1))
    for branches in _BRANCHES.findall(stripped):
      for callee in branches.split(","):
        calls[current].append((callee.strip().lstrip("%"), 1))
  return own, calls, entry


def collective_bytes(hlo_text: str) -> dict[str, int]:
  """{kind: bytes per chip per step} for every kind in KINDS, plus UNKNOWN_TRIPS."""
  own, calls, entry = _parse(hlo_text)
  memo: dict[str, tuple[dict[str, int], int]] = {}

  def total(name: str, depth: int = 0) -> tuple[dict[str, int], int]:
    if name in memo or name not in own or depth > 64:
      return memo.get(name, ({}, 0))
    sums, unknown = dict(own[name]), 0
    for callee, trips in calls[name]:
      inner, inner_unknown = total(callee, depth + 1)
      if trips is None and inner:
        unknown += 1
      for kind, nbytes in inner.items():
        sums[kind] = sums.get(kind, 0) + nbytes * (trips or 1)
      unknown += inner_unknown
    memo[name] = (sums, unknown)
    return memo[name]

  sums, unknown = total(entry) if entry else ({}, 0)
  result = {kind: int(sums.get(kind, 0)) for kind in KINDS}
  result[UNKNOWN_TRIPS] = unknown
  return result
