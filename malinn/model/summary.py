"""The table :meth:`~malinn.model.model.PlannedModel.summary` prints, fitted as Keras fits its own:
to the terminal's width, or to the ``line_length`` and ``positions`` given."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Sequence

from ..backends.base import size_text
from ..backends.selection import get_device
from ..errors import BackendError, DeviceError
from .buckets import batch_bucket
from .host import ModelHost

__all__ = ["SUMMARY_WIDTH", "Summarizing", "column_widths", "wrapped"]

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


def column_widths(rows: list, line_length: object, positions: Sequence[float] | None) -> list:
    """The summary's column widths: as wide as each column's longest cell (and 2 more), narrowed to
    the terminal's width (at most :data:`SUMMARY_WIDTH`), or, with ``line_length`` or ``positions``,
    where Keras's would end them."""
    columns = len(rows[0])
    if line_length is None and positions is None:
        width = min(shutil.get_terminal_size((SUMMARY_WIDTH, 24)).columns, SUMMARY_WIDTH)
        return _fitted([max(len(r[i]) for r in rows) + 2 for i in range(columns)], width)
    if line_length is not None and (
        isinstance(line_length, bool) or not isinstance(line_length, int) or line_length < columns
    ):
        raise ValueError(f"summary: line_length must be an integer of at least {columns}, got {line_length!r}")
    if positions is None:  # Keras's for a Sequential's three columns and a graph's four; even ones otherwise
        positions = {3: [0.45, 0.85, 1.0], 4: [0.33, 0.55, 0.67, 1.0]}.get(
            columns, [(i + 1) / columns for i in range(columns)]
        )
    positions = list(positions)
    if len(positions) != columns:
        raise ValueError(f"summary: positions must give {columns} column ends, got {len(positions)}")
    if all(0 < p <= 1 for p in positions):  # fractions, as Keras's: characters of line_length, each column one at least
        ends = [int(p * (line_length if isinstance(line_length, int) else 98)) for p in positions]  # int or None here
        positions = [max(end, i + 1) for i, end in enumerate(ends)]
        for i in range(1, len(positions)):
            positions[i] = max(positions[i], positions[i - 1] + 1)
    if any(not isinstance(p, (int, float)) for p in positions) or any(
        b <= a for a, b in zip([0] + positions, positions)
    ):
        raise ValueError(f"summary: positions must increase, got {positions}")
    return [int(b) - int(a) for a, b in zip([0] + positions, positions)]


class Summarizing(ModelHost):
    """:meth:`summary`, Keras's table of a model's layers with the kernels that run them (a mixin
    of :class:`~malinn.model.model.PlannedModel`, whose ``_compile``, ``built``, ``count_params``
    and ``_summary_rows`` it reads)."""

    def summary(
        self,
        line_length: int | Callable[[str], object] | None = None,
        positions: Sequence[float] | None = None,
        print_fn: Callable[[str], object] | None = None,
        batch: int = 1,
        show_kernels: bool = False,
    ) -> str:
        """Prints (and returns) the model as Keras does: each layer with its output shape and
        parameters (a graph's: the tensors it is connected to, ``layer[call][0]``), then the weights'
        device memory; with ``show_kernels``, also the kernels that run each layer on the current
        device for passes of ``batch`` samples, in order (a convolution as patches then a product:
        ``im2col, gemm_tiled + bias+relu``; layers fused into one launch share it).

        Args:
            line_length: the table's width in characters, as Keras's (default: the terminal's
                width, at most :data:`~malinn.model.summary.SUMMARY_WIDTH`; a narrower table where every cell fits). A
                cell longer than its column is wrapped onto the lines below.
            positions: where each column ends, as Keras's: fractions of ``line_length`` (each at
                most 1) or characters, one per column (default with ``line_length``: Keras's, 0.45,
                0.85, 1.0 for three columns and 0.33, 0.55, 0.67, 1.0 for four).
            print_fn: called once with the whole table (default: :func:`print`), as Keras's (also
                taken as the first argument, where earlier malinn code passes it there).
            batch: the pass size whose plan's kernels the table shows (default 1).
            show_kernels: add the column of the kernels that run each layer (default False: Keras's
                columns only; ``malinn summary`` shows them).

        Returns:
            The table's text. Where the device refuses the plan (a buffer that does not fit), the
            layers are still listed and the last line says why; an unbuilt model's parameters are
            counted as 0 (unbuilt).

        Raises:
            ValueError: ``line_length`` is not a positive integer, or ``positions`` do not give one
                increasing end per column.
        """
        if callable(line_length) and print_fn is None:  # summary(print): malinn 0.1's first argument
            line_length, print_fn = None, line_length
        kernels, weights, refused = self._kernels(batch)
        rows = self._summary_rows(kernels)
        if not show_kernels:
            rows = [row[:-1] for row in rows]
        widths = column_widths(rows, line_length, positions)
        return self._table(rows, widths, print_fn or print, weights, refused)

    def _summary_rows(self, kernels: dict) -> list:
        """The table's rows (the header first), each layer's kernels from ``kernels``."""
        raise NotImplementedError

    def _kernels(self, batch: int) -> tuple[dict, tuple | None, str | None]:
        """``(kernels, weights, refused)``: layer name -> the kernel (and what it fuses) that runs it
        on the current device, ``(bytes on the device, bytes in fp32)`` of the weights (None when
        the model is not built or cannot be planned), and why the device refused the plan (None
        where it did not)."""
        kernels: dict[str, str] = {}
        weights: tuple[int, int] | None = None
        refused: str | None = None
        if self.built:
            try:
                plan = self._compile(get_device(), batch_bucket(batch), False)
                launched: dict[str, list[str]] = {}
                for row in plan.describe():
                    for name in row["layers"]:  # every kernel a layer launches, in order, else "view (no copy)"
                        text = row["kernel"] + (" + " + "+".join(row["fused"]) if row["fused"] else "")
                        if row["view"]:
                            kernels.setdefault(name, text)
                        else:
                            launched.setdefault(name, []).append(text)
                kernels.update({name: ", ".join(texts) for name, texts in launched.items()})
                weights = (sum(plan.weight_sizes()), sum(4 * r * c for r, c in plan.weight_paddings()))
            except (DeviceError, BackendError) as exc:  # the table still shows the layers; the last line says why
                refused = " ".join(str(exc).split())
        return kernels, weights, refused

    def _table(
        self,
        rows: list,
        widths: list,
        print_fn: Callable[[str], object],
        weights: tuple | None = None,
        refused: str | None = None,
    ) -> str:
        """Prints (and returns) a Keras-style summary of ``rows`` (the header first) in columns of
        ``widths`` characters (a longer cell wrapped onto the lines below, as Keras's)."""
        line = "-" * sum(widths)
        out = [f'Model: "{self.name}"', line]
        for i, r in enumerate(rows):
            cells = [wrapped(c, w - 1) for c, w in zip(r, widths)]
            for k in range(max(len(c) for c in cells)):
                out.append("".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)).rstrip())
            if i == 0:
                out.append("=" * sum(widths))
        out += ["=" * sum(widths), f"Total params: {self.count_params() if self.built else '0 (unbuilt)'}"]
        if weights is not None and weights[1]:
            out.append(
                f"Weights on the device: {size_text(weights[0])} in {self._precision} "
                f"({weights[0] / weights[1]:.3f} of {size_text(weights[1])} in fp32)"
            )
        if refused is not None:
            out.append(f"No kernels on {get_device().name}: {refused}")
        out.append(line)
        text = "\n".join(out)
        print_fn(text)
        return text
