"""The table :meth:`~malinn.model.model.PlannedModel.summary` prints, fitted as Keras fits its own:
to the terminal's width, or to the ``line_length`` and ``positions`` given."""

from __future__ import annotations

import shutil
import textwrap

__all__ = ["SUMMARY_WIDTH", "column_widths", "wrapped"]

#: the widest a summary's table is by default (a wider terminal still gets a table of at most this)
SUMMARY_WIDTH = 100
#: the narrowest a summary's column is made to fit the terminal (a column of shorter cells keeps its width)
_NARROWEST_COLUMN = 12


def wrapped(cell: str, width: int) -> list:
    """``cell`` as lines of at most ``width`` characters (at least one line; broken at spaces where
    it can be, else inside a word)."""
    if len(cell) <= width:
        return [cell]
    return textwrap.wrap(cell, max(1, width), break_on_hyphens=False) or [""]


def _fitted(natural: list, width: int) -> list:
    """``natural`` column widths narrowed to ``width`` in all: the widest column loses a character
    at a time, down to :data:`_NARROWEST_COLUMN` (or its own width where that is less)."""
    widths = list(natural)
    floors = [min(w, _NARROWEST_COLUMN) for w in natural]
    while sum(widths) > width:
        i = max(range(len(widths)), key=lambda j: widths[j] - floors[j])
        if widths[i] <= floors[i]:
            break
        widths[i] -= 1
    return widths


def column_widths(rows: list, line_length, positions) -> list:
    """The summary's column widths: as wide as each column's longest cell (and 2 more), narrowed to
    the terminal's width (at most :data:`SUMMARY_WIDTH`), or, with ``line_length`` or ``positions``,
    where Keras's would end them."""
    columns = len(rows[0])
    if line_length is None and positions is None:
        width = min(shutil.get_terminal_size((SUMMARY_WIDTH, 24)).columns, SUMMARY_WIDTH)
        return _fitted([max(len(r[i]) for r in rows) + 2 for i in range(columns)], width)
    if line_length is not None and (isinstance(line_length, bool) or not isinstance(line_length, int)
                                    or line_length < columns):
        raise ValueError(f"summary: line_length must be an integer of at least {columns}, got {line_length!r}")
    if positions is None:   # Keras's for a Sequential's three columns and a graph's four; even ones otherwise
        positions = {3: [0.45, 0.85, 1.0], 4: [0.33, 0.55, 0.67, 1.0]}.get(
            columns, [(i + 1) / columns for i in range(columns)])
    positions = list(positions)
    if len(positions) != columns:
        raise ValueError(f"summary: positions must give {columns} column ends, got {len(positions)}")
    if all(0 < p <= 1 for p in positions):   # fractions, as Keras's: characters of line_length, each column one at least
        ends = [int(p * (line_length or 98)) for p in positions]
        positions = [max(end, i + 1) for i, end in enumerate(ends)]
        for i in range(1, len(positions)):
            positions[i] = max(positions[i], positions[i - 1] + 1)
    if any(not isinstance(p, (int, float)) for p in positions) or \
            any(b <= a for a, b in zip([0] + positions, positions)):
        raise ValueError(f"summary: positions must increase, got {positions}")
    return [int(b) - int(a) for a, b in zip([0] + positions, positions)]
