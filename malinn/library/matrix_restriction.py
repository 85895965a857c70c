"""What a kernel asks of its matrix arguments: their names, layouts and alignments."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import LayoutError
from .layout import Layout, parse_layout

__all__ = ["MATRIX_NAMES", "VECTOR_NAMES", "SCRATCH_NAME", "MatrixRestriction"]

MATRIX_NAMES = ("a", "b", "r")
VECTOR_NAMES = ("bias", "scale", "shift", "head", "head_bias")
#: a buffer the runtime allocates for the kernel's own use (its size: the entry's ``scratch_bytes``)
SCRATCH_NAME = "scratch"


@dataclass(frozen=True)
class MatrixRestriction:
    """What a kernel asks of one matrix argument."""

    representation: str  # a layout string, or "*" for any layout
    row_align: int
    col_align: int
    image: bool = False  # passed as an RGBA float image2d (texel = 4 rows of a column)
    logical_rows: bool = False  # reads rows < m rounded up to the alignment only: A needs no more

    @property
    def any_layout(self) -> bool:
        return self.representation == "*"

    @property
    def layout(self) -> Layout:
        if self.any_layout:
            raise LayoutError("this restriction accepts any layout; ask the matrix for its own")
        return parse_layout(self.representation)

    @property
    def row_multiple(self) -> int:
        """Rows must be a multiple of this: the alignment and the layout's top chunk."""
        return self.row_align if self.any_layout else math.lcm(self.row_align, self.layout.row_multiple)

    @property
    def col_multiple(self) -> int:
        return self.col_align if self.any_layout else math.lcm(self.col_align, self.layout.col_multiple)
