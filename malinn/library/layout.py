"""Hybrid Morton Order layouts (Rovder, sections 8.1-8.3).

A layout is written ``B0[_Y1_X1_B1[_Y2_X2_B2 ...]]`` with each ``B`` either ``R`` or ``C``. The
padded matrix is cut into chunks of ``Y1`` rows by ``X1`` columns ordered by ``B0`` (``R``: along
chunk-rows first, ``C``: along chunk-columns first); each chunk is cut into ``Y2 x X2`` sub-chunks
ordered by ``B1``, and so on; the elements of the last chunks are ordered by the last ``B``.
``R`` alone is row-major and ``C`` alone column-major.

With ``Y0 = rows``, ``X0 = cols`` and a last level of 1 x 1::

    index(r, c) = sum_k order(Bk, Yk/Y(k+1), Xk/X(k+1), (r mod Yk) div Y(k+1), (c mod Xk) div X(k+1))
                        * Y(k+1) * X(k+1)
    order(R, nrows, ncols, i, j) = i * ncols + j
    order(C, nrows, ncols, i, j) = j * nrows + i

Host-side packing uses the equivalent reshape/transpose form: the padded matrix is viewed with
one axis per level of row digits and column digits, and the axes are put in the order the bases
name. :meth:`Layout.index` computes the formula itself; tests hold the two against each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike

from ..errors import LayoutError

__all__ = ["Layout", "parse_layout", "padded_shape", "convert"]

_BASES = ("R", "C")


@dataclass(frozen=True)
class Layout:
    """A parsed Hybrid Morton layout.

    Attributes:
        bases: ``B0, B1, ..., BL``, each ``"R"`` or ``"C"``.
        blocks: ``((Y1, X1), ..., (YL, XL))``, the chunk shape of each level below the top.
    """

    bases: tuple[str, ...]
    blocks: tuple[tuple[int, int], ...]

    # ---------------------------------------------------------------- construction
    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Parses a representation string such as ``"C_4_2_C"``.

        Args:
            text: the representation, ``B0[_Y1_X1_B1 ...]``.

        Returns:
            The :class:`Layout`.

        Raises:
            LayoutError: a token is not a base or a positive integer where one is expected, the
                string has the wrong number of tokens, or a chunk size does not divide its parent.
        """
        return _parse(text)

    def __str__(self) -> str:
        parts = [self.bases[0]]
        for (y, x), base in zip(self.blocks, self.bases[1:]):
            parts += [str(y), str(x), base]
        return "_".join(parts)

    def __repr__(self) -> str:
        return f"Layout('{self}')"

    # ---------------------------------------------------------------- geometry
    @property
    def row_multiple(self) -> int:
        """Rows of the padded matrix must be a multiple of this (``Y1``, or 1 for R and C)."""
        return self.blocks[0][0] if self.blocks else 1

    @property
    def col_multiple(self) -> int:
        """Columns of the padded matrix must be a multiple of this (``X1``, or 1)."""
        return self.blocks[0][1] if self.blocks else 1

    def padded_shape(self, rows: int, cols: int, row_align: int = 1, col_align: int = 1) -> tuple[int, int]:
        """The smallest padded shape that holds ``rows x cols`` in this layout.

        Args:
            rows, cols: the logical shape.
            row_align, col_align: extra alignment asked for by a kernel.

        Returns:
            ``(padded_rows, padded_cols)``, multiples of the chunk shape and of the alignments.
        """
        return (
            round_up(rows, math.lcm(self.row_multiple, row_align)),
            round_up(cols, math.lcm(self.col_multiple, col_align)),
        )

    def check_padded(self, padded: tuple[int, int]) -> None:
        """Raises :class:`LayoutError` if ``padded`` is not a whole number of top-level chunks."""
        prow, pcol = padded
        if prow < 0 or pcol < 0 or prow % self.row_multiple or pcol % self.col_multiple:
            raise LayoutError(
                f"layout {self}: a padded shape of {prow}x{pcol} is not a whole number of "
                f"{self.row_multiple}x{self.col_multiple} chunks"
            )

    def _levels(self, padded: tuple[int, int]) -> list[tuple]:
        """(base, Yk, Xk, Y(k+1), X(k+1)) for each level, top first, ending at 1 x 1."""
        sizes = [tuple(padded)] + list(self.blocks) + [(1, 1)]
        return [
            (self.bases[k], sizes[k][0], sizes[k][1], sizes[k + 1][0], sizes[k + 1][1]) for k in range(len(self.bases))
        ]

    # ---------------------------------------------------------------- indices
    def index(self, rows: ArrayLike, cols: ArrayLike, padded: tuple[int, int]) -> np.ndarray:
        """Memory index of each element ``(rows[i], cols[i])`` in a matrix of shape ``padded``.

        Args:
            rows, cols: integer arrays (broadcast together) of coordinates in the padded matrix.
            padded: the padded shape.

        Returns:
            An ``int64`` array of flat indices, the formula in the module docstring.
        """
        self.check_padded(padded)
        r = np.asarray(rows, dtype=np.int64)
        c = np.asarray(cols, dtype=np.int64)
        total = np.zeros(np.broadcast(r, c).shape, dtype=np.int64)
        for base, yk, xk, yn, xn in self._levels(padded):
            i = (r % yk) // yn
            j = (c % xk) // xn
            nrows, ncols = yk // yn, xk // xn
            total += (i * ncols + j if base == "R" else j * nrows + i) * (yn * xn)
        return total

    def index_table(self, padded: tuple[int, int]) -> np.ndarray:
        """The memory index of every element of the padded matrix, as a ``padded``-shaped array."""
        r, c = np.indices(padded, dtype=np.int64)
        return self.index(r, c, padded)

    def index_terms(self):
        """The index formula's terms, top level first: ``(base, (Yk, Xk), (Y(k+1), X(k+1)))``.

        ``(Yk, Xk)`` is ``(None, None)`` at the top level, where it is the padded shape (known only
        at launch time); the last level ends at ``(1, 1)``. Backends render these as index macros in
        their kernel language (:meth:`malinn.backends.base.Device.render_index`).
        """
        sizes = [(None, None)] + list(self.blocks) + [(1, 1)]
        return [(base, sizes[k], sizes[k + 1]) for k, base in enumerate(self.bases)]

    def index_expression(
        self, literal: str = "", row: str = "(R_)", col: str = "(C_)", prows: str = "(P_R)", pcols: str = "(P_C)"
    ) -> str:
        """:meth:`index` as a C-like expression, for a backend's index macro: ``row`` and ``col``
        the element's coordinates, ``prows`` and ``pcols`` the padded shape (known only at launch
        time), each as the backend spells it (a cast), ``literal`` the integer literals' suffix
        (``"u"`` in GLSL, which converts no ``int`` to ``uint``)."""
        terms = []
        for base, (yk, xk), (yn, xn) in self.index_terms():
            i = row if yk is None else f"({row} % {yk}{literal})"
            j = col if xk is None else f"({col} % {xk}{literal})"
            if yn != 1:
                i = f"({i} / {yn}{literal})"
            if xn != 1:
                j = f"({j} / {xn}{literal})"
            nrows = f"({prows} / {yn}{literal})" if yk is None else f"({yk // yn}{literal})"
            ncols = f"({pcols} / {xn}{literal})" if xk is None else f"({xk // xn}{literal})"
            order = f"({i} * {ncols} + {j})" if base == "R" else f"({j} * {nrows} + {i})"
            weight = "" if (yn, xn) == (1, 1) else f" * {yn * xn}{literal}"
            terms.append(f"{order}{weight}")
        return " + ".join(terms)

    # ---------------------------------------------------------------- host conversion
    def _digit_shape(self, padded):
        """Shape that splits rows and columns into one digit axis per level."""
        levels = self._levels(padded)
        row_digits = [yk // yn for _, yk, _, yn, _ in levels]
        col_digits = [xk // xn for _, _, xk, _, xn in levels]
        perm = []
        n = len(levels)
        for k, (base, *_rest) in enumerate(levels):
            perm += [k, n + k] if base == "R" else [n + k, k]
        return row_digits + col_digits, perm

    def pack(self, matrix: np.ndarray, padded: tuple[int, int] | None = None) -> np.ndarray:
        """Lays a 2-D matrix out as a flat float32 buffer, zero-padded to ``padded``.

        Args:
            matrix: a 2-D array of shape ``(rows, cols)``.
            padded: the padded shape (default: :meth:`padded_shape` with no extra alignment).

        Returns:
            A 1-D ``float32`` array of ``padded[0] * padded[1]`` elements.

        Raises:
            LayoutError: ``matrix`` is not 2-D, or does not fit in ``padded``.
        """
        matrix = np.asarray(matrix)
        if matrix.ndim != 2:
            raise LayoutError(f"layout {self}: expected a 2-D matrix, got shape {matrix.shape}")
        rows, cols = matrix.shape
        prow, pcol = padded if padded is not None else self.padded_shape(rows, cols)
        padded = (prow, pcol)
        self.check_padded(padded)
        if rows > padded[0] or cols > padded[1]:
            raise LayoutError(f"layout {self}: a {rows}x{cols} matrix does not fit in {padded[0]}x{padded[1]}")
        full = np.zeros(padded, dtype=np.float32)
        full[:rows, :cols] = matrix
        shape, perm = self._digit_shape(padded)
        return np.ascontiguousarray(full.reshape(shape).transpose(perm)).reshape(-1)

    def unpack(self, flat: np.ndarray, shape: tuple[int, int], padded: tuple[int, int]) -> np.ndarray:
        """Reads the logical ``shape`` matrix back out of a flat buffer in this layout.

        Args:
            flat: the 1-D buffer (``padded[0] * padded[1]`` elements).
            shape: the logical ``(rows, cols)`` to return.
            padded: the padded shape the buffer was laid out with.

        Returns:
            A ``float32`` C-contiguous array of ``shape``.
        """
        self.check_padded(padded)
        flat = np.asarray(flat).reshape(-1)
        if flat.size != padded[0] * padded[1]:
            raise LayoutError(f"layout {self}: a buffer of {flat.size} elements is not {padded[0]}x{padded[1]}")
        digit_shape, perm = self._digit_shape(padded)
        stored = flat.reshape([digit_shape[p] for p in perm])
        full = stored.transpose(np.argsort(perm)).reshape(padded)
        return np.ascontiguousarray(full[: shape[0], : shape[1]], dtype=np.float32)


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``, at least one multiple (an empty
    dimension still takes one block)."""
    return max(1, -(-value // multiple)) * multiple


@lru_cache(maxsize=256)
def _parse(text: str) -> Layout:
    if not isinstance(text, str) or not text:
        raise LayoutError(f"layout {text!r}: expected a representation string such as 'R', 'C' or 'C_4_2_C'")
    tokens = text.split("_")
    if len(tokens) % 3 != 1:
        raise LayoutError(
            f"layout {text!r}: {len(tokens)} tokens; a layout is B0 followed by groups of Y_X_B "
            f"(e.g. 'R_2_4_R'), so it has 1, 4, 7, ... tokens"
        )
    bases, blocks = [], []
    for pos, tok in enumerate(tokens):
        if pos % 3 == 0:
            if tok not in _BASES:
                raise LayoutError(f"layout {text!r}: bad token {tok!r} at position {pos}: expected 'R' or 'C'")
            bases.append(tok)
        else:
            if not tok.isdigit() or int(tok) < 1:
                what = "rows (Y)" if pos % 3 == 1 else "columns (X)"
                raise LayoutError(
                    f"layout {text!r}: bad token {tok!r} at position {pos}: expected a positive integer for chunk {what}"
                )
            if pos % 3 == 2:
                blocks.append((int(tokens[pos - 1]), int(tok)))
    for k in range(1, len(blocks)):
        (py, px), (y, x) = blocks[k - 1], blocks[k]
        if py % y or px % x:
            raise LayoutError(
                f"layout {text!r}: level {k + 1} chunk {y}x{x} does not divide its parent chunk {py}x{px}"
            )
    return Layout(tuple(bases), tuple(blocks))


def parse_layout(text: "str | Layout") -> Layout:
    """Returns ``text`` parsed as a :class:`Layout` (a :class:`Layout` is returned as is)."""
    return text if isinstance(text, Layout) else _parse(text)


def padded_shape(layout: Layout | str, rows: int, cols: int, row_align: int = 1, col_align: int = 1) -> tuple[int, int]:
    """Shorthand for ``parse_layout(layout).padded_shape(...)``."""
    return parse_layout(layout).padded_shape(rows, cols, row_align, col_align)


def convert(
    flat: np.ndarray,
    shape: tuple[int, int],
    src: Layout | str,
    src_padded: tuple[int, int],
    dst: Layout | str,
    dst_padded: tuple[int, int],
) -> np.ndarray:
    """Re-lays a flat buffer from one layout (and padding) into another, on the host.

    Args:
        flat: the buffer in layout ``src`` with padded shape ``src_padded``.
        shape: the logical shape of the matrix.
        src, dst: the layouts (strings or :class:`Layout`).
        src_padded, dst_padded: the padded shapes.

    Returns:
        A flat float32 buffer in layout ``dst``.
    """
    matrix = parse_layout(src).unpack(flat, shape, src_padded)
    return parse_layout(dst).pack(matrix, dst_padded)
