"""Bytes each kind of collective moves per step, read from a compiled program's HLO text.

Each collective instruction counts the bytes of its result on one chip (an all-gather's
gathered array, an all-reduce's reduced one, ...): what the chip must receive, a lower
bound on what crosses its links. An instruction inside a loop counts once per trip
(scanned layers, micro-batches, decoding steps): hlo.py reads the trip count from XLA's
`known_trip_count` or, where the TPU compiler drops it, from the loop's condition; a
loop with an unknown count (a decode that stops at eos) counts once, and
`UNKNOWN_TRIPS` says how many such loops there were.
"""

from __future__ import annotations

from transformer.planning import hlo

KINDS = hlo.COLLECTIVES
UNKNOWN_TRIPS = "loops_with_unknown_trip_count"


def from_counts(counts: hlo.Counts) -> dict[str, int]:
  """{kind: bytes per chip per step} for every kind in KINDS, plus UNKNOWN_TRIPS."""
  result = {kind: int(counts.collective_bytes.get(kind, 0)) for kind in KINDS}
  result[UNKNOWN_TRIPS] = counts.unknown_loops
  return result


def collective_bytes(hlo_text: str) -> dict[str, int]:
  """{kind: bytes per chip per step} for every kind in KINDS, plus UNKNOWN_TRIPS."""
  return from_counts(hlo.count(hlo_text))
