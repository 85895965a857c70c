"""Tiny integer expressions over a kernel's defines, for kernels/library.json.

Restriction values (``"rowAlign": "MWG"``, ``"rows": "MWG / MDIMC"``) and tuning constraints
(``"MWG % MDIMC == 0"``) are written over define names; this evaluates them without ``eval``:
integers, names, ``+ - * / %`` (``/`` is integer division), comparisons, ``and``/``or``/``not``.
"""

from __future__ import annotations

import ast
import operator
from functools import lru_cache
from typing import Callable

__all__ = ["evaluate", "names_in"]

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def evaluate(text: object, values: dict) -> int:
    """The value of ``text`` (an int, or an expression string) with ``values`` for the names.

    Raises:
        ValueError: the expression uses something else, names an unknown define, or divides by 0.
    """
    if isinstance(text, bool):
        raise ValueError(f"expected an integer or an expression, got {text!r}")
    if isinstance(text, int):
        return text
    if not isinstance(text, str):
        raise ValueError(f"expected an integer or an expression, got {text!r}")
    return _compiled(text)(values)


@lru_cache(maxsize=4096)
def _compiled(text: str) -> Callable[[dict], int]:
    """``text`` parsed and turned into a function of the values, once per text: loading the kernel
    library evaluates a few thousand expressions over a few hundred distinct texts."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:

        def fail(values):
            raise ValueError(f"cannot parse {text!r}")

        return fail
    return _compile(tree, text)


def _compile(node, text):
    """A function ``values -> int`` computing ``node`` (an unsupported node raises when evaluated)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        value = node.value
        return lambda values: value
    if isinstance(node, ast.Name):
        name = node.id

        def lookup(values):
            if name not in values:
                raise ValueError(f"{text!r} names {name!r}, which is not a define of this kernel")
            try:
                return int(values[name])
            except (TypeError, ValueError):
                raise ValueError(f"{text!r}: {name} is {values[name]!r}, not an integer") from None

        return lookup
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right, op = _compile(node.left, text), _compile(node.right, text), _BINARY[type(node.op)]
        divides = isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod))

        def binary(values):
            a, b = left(values), right(values)
            if divides and b == 0:
                raise ValueError(f"{text!r} divides by zero")
            return op(a, b)

        return binary
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = _compile(node.operand, text)
        return lambda values: -operand(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        operand = _compile(node.operand, text)
        return lambda values: int(not operand(values))
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        first = _compile(node.left, text)
        chain = [(_COMPARE[type(op)], _compile(c, text)) for op, c in zip(node.ops, node.comparators)]

        def compare(values):
            left = first(values)
            for op, comparator in chain:  # stops at the first false link, as Python does
                right = comparator(values)
                if not op(left, right):
                    return 0
                left = right
            return 1

        return compare
    if isinstance(node, ast.BoolOp):
        parts = [_compile(v, text) for v in node.values]
        combine = all if isinstance(node.op, ast.And) else any
        return lambda values: int(combine([part(values) for part in parts]))  # every operand is evaluated

    def unsupported(values):
        raise ValueError(f"{text!r}: only integers, define names, + - * / %, comparisons, and/or/not are allowed")

    return unsupported


def names_in(text: object) -> set:
    """The define names an expression uses."""
    if not isinstance(text, str):
        return set()
    try:
        return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()
