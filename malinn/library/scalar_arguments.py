"""The scalar arguments of a kernel: the ``arglist`` letters and their values, and the defines a
source takes as arguments (``argdefines``, with ``divide:NAME`` magic numbers)."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["SCALAR_LETTERS", "letter_values", "DIVIDE", "division_magic", "check_argdefines"]

#: the letters of an ``arglist`` (and of ``ndrange``) -> the value each passes
SCALAR_LETTERS = {
    "l": "padded common dimension K",
    "h": "padded rows of r",
    "w": "padded columns of r",
    "m": "logical rows of r",
    "n": "logical columns of r",
    "H": "padded rows of a",
    "W": "padded columns of a",
    "M": "logical rows of a",
    "N": "logical columns of a",
    "K": "logical rows of b",
    "c": "padded columns of b",
    "p": "the next float parameter",
}


def letter_values(
    r_shape: tuple,
    r_padded: tuple,
    a_shape: tuple | None = None,
    a_padded: tuple | None = None,
    b_shape: tuple | None = None,
    b_padded: tuple | None = None,
) -> dict:
    """The value of each scalar letter (:data:`SCALAR_LETTERS`) for a result ``r`` and operands
    ``a``, ``b`` (absent: None) of these logical shapes and paddings."""
    common = b_padded[0] if b_padded is not None else (a_padded[1] if a_padded is not None else 0)
    return {
        "l": common,
        "h": r_padded[0],
        "w": r_padded[1],
        "m": r_shape[0],
        "n": r_shape[1],
        "H": a_padded[0] if a_padded is not None else 0,
        "W": a_padded[1] if a_padded is not None else 0,
        "M": a_shape[0] if a_shape is not None else 0,
        "N": a_shape[1] if a_shape is not None else 0,
        "K": b_shape[0] if b_shape is not None else 0,
        "c": b_padded[1] if b_padded is not None else 0,
    }


#: an ``argdefines`` entry ``divide:NAME``: the two magic numbers that divide by define NAME
DIVIDE = "divide:"
#: the most elements of a result a kernel that divides by its sizes (``divide:``) indexes: its
#: element numbers are 32-bit
DIVIDE_MAX_ELEMENTS = 0xFFFFFFFF


def division_magic(divisor: int) -> list:
    """``[M, L]`` that divide any 32-bit ``n`` by ``divisor`` with a multiplication (Granlund and
    Montgomery, as a compiler does for a constant): ``t = mul_hi(M, n)``, ``n / divisor = (t + ((n -
    t) >> min(L, 1))) >> (max(L, 1) - 1)``, with ``L = ceil(log2 divisor)`` (kernels/window.clh
    ``window_divide``). A divisor below 1 divides as 1."""
    d = max(1, int(divisor))
    shift = (d - 1).bit_length()
    return [((1 << 32) * ((1 << shift) - d) // d + 1) & 0xFFFFFFFF, shift]


def check_argdefines(names: Any, defines: dict, fail: Callable[[str, str], None]) -> tuple:
    """The entry's ``argdefines``, checked: names of its defines (or ``divide:`` one of them, a
    positive one), whose values are whole numbers."""
    plain = (
        [n[len(DIVIDE) :] if isinstance(n, str) and n.startswith(DIVIDE) else n for n in names]
        if isinstance(names, list)
        else None
    )
    if plain is None or not all(isinstance(n, str) and n in defines for n in plain) or len(set(names)) < len(names):
        fail("restrictions.argdefines", f"expected a list of the entry's define names (or divide:NAME), got {names!r}")
        return ()
    for name, define in zip(names, plain):
        try:
            value = int(str(defines[define]))
        except ValueError:
            fail("restrictions.argdefines", f"define {define} is {defines[define]!r}, not a whole number")
            continue
        if not -(2**31) <= value < 2**32 or (name != define and value < 1):
            fail(
                "restrictions.argdefines",
                f"define {define} is {value}, not a 32-bit int or uint"
                f"{' (a divisor: 1 or more)' if name != define else ''}",
            )
    return tuple(names)
