"""Tables and PNGs of the long-context evaluations: perplexity by position, passkey retrieval.

Drawn from the records the modes write (`--mode=evaluate --by_position=W`'s rows,
`--mode=passkey`'s cells), no devices: the console tables and the figures (a line of
perplexity against position; a heat map of retrieval accuracy, context length against
the depth of the key), on matplotlib's Agg canvas (plots.png_bytes), written by the mode
with its JSON.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from transformer.reports import plots


def position_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
  """The console table of evaluate's by-position rows: one line per bucket of positions."""
  lines = [f"  {'positions':<14}{'tokens':>10}{'loss':>10}{'perplexity':>12}{'accuracy':>10}"]
  for row in rows:
    span = f"{row['start']}-{row['end'] - 1}"
    lines.append(f"  {span:<14}{row['tokens']:>10.0f}{row['loss']:>10.4f}"
                 f"{row['perplexity']:>12.4g}{row['accuracy']:>10.4f}")
  return lines


def position_figure(curves: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], title: str,
                    trained_len: int = 0):
  """Perplexity against token position, one line per (label, by-position rows).

  Each point is a bucket, drawn at its middle position. `trained_len` > 0 draws a
  dashed vertical line there: the length the model was trained at.
  """
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figure = Figure(figsize=(6.4, 4.0), dpi=100)
  figure.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.9)
  axes = figure.subplots()
  for label, rows in curves:
    middles = [(row["start"] + row["end"] - 1) / 2 for row in rows]
    axes.plot(middles, [row["perplexity"] for row in rows], marker="o", markersize=3,
              label=label)
  if trained_len > 0:
    axes.axvline(trained_len, color="gray", linestyle="--", linewidth=1,
                 label=f"trained length {trained_len}")
  axes.set_yscale("log")
  axes.set_xlabel("token position (bucket middle)")
  axes.set_ylabel("perplexity")
  axes.set_title(title)
  axes.grid(True, alpha=0.3)
  axes.legend()
  return figure


def position_plot_png(rows: Sequence[Mapping[str, Any]], title: str,
                      trained_len: int = 0) -> bytes:
  """position_figure of one run's rows as PNG bytes (written with the JSON beside it)."""
  return plots.png_bytes(position_figure([("eval", rows)], title, trained_len))


def passkey_grid(cells: Sequence[Mapping[str, Any]], key: str = "accuracy"
                 ) -> tuple[list[int], list[float], np.ndarray]:
  """(lengths, depths, [lengths, depths] values of `key`) from passkey cells."""
  lengths = sorted({int(cell["length"]) for cell in cells})
  depths = sorted({float(cell["depth"]) for cell in cells})
  grid = np.full((len(lengths), len(depths)), np.nan)
  for cell in cells:
    grid[lengths.index(int(cell["length"])), depths.index(float(cell["depth"]))] = cell[key]
  return lengths, depths, grid


def passkey_table(cells: Sequence[Mapping[str, Any]]) -> list[str]:
  """The console table: a row per context length, a column per depth, accuracy in each."""
  lengths, depths, grid = passkey_grid(cells)
  lines = ["  length \\ depth" + "".join(f"{depth:>8.2f}" for depth in depths) + "    mean"]
  for i, length in enumerate(lengths):
    lines.append(f"  {length:<15d}" + "".join(f"{value:>8.2f}" for value in grid[i])
                 + f"{np.nanmean(grid[i]):>8.2f}")
  return lines


def passkey_figure(cells: Sequence[Mapping[str, Any]], title: str):
  """The heat map: retrieval accuracy per (context length, key depth), 0 red to 1 green."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  lengths, depths, grid = passkey_grid(cells)
  figure = Figure(figsize=(max(4.0, 1.0 + 0.7 * len(depths)),
                           max(3.0, 1.5 + 0.45 * len(lengths))), dpi=100)
  axes = figure.subplots()
  image = axes.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto",
                      origin="lower")
  for i in range(len(lengths)):
    for j in range(len(depths)):
      axes.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
  axes.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
  axes.set_yticks(range(len(lengths)), [str(n) for n in lengths])
  axes.set_xlabel("depth of the key (0: start of the filler, 1: its end)")
  axes.set_ylabel("context length (tokens)")
  axes.set_title(title)
  figure.colorbar(image, ax=axes, label="accuracy")
  figure.tight_layout()
  return figure


def passkey_heatmap_png(cells: Sequence[Mapping[str, Any]], title: str) -> bytes:
  """passkey_figure as PNG bytes (written with the JSON beside it)."""
  return plots.png_bytes(passkey_figure(cells, title))
