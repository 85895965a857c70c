"""Tiny integer expressions over a kernel's defines, for kernels/library.json.

Restriction values (``"rowAlign": "MWG"``, ``"rows": "MWG / MDIMC"``) and tuning constraints
(``"MWG % MDIMC == 0"``) are written over define names; this evaluates them without ``eval``:
integers, names, ``+ - * / %`` (``/`` is integer division), comparisons, ``and``/``or``/``not``.
"""

from __future__ import annotations

import ast
import operator

__all__ = ["evaluate", "names_in"]

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.floordiv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}


def evaluate(text, values: dict) -> int:
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
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"cannot parse {text!r}") from None
    return _eval(tree, values, text)


def _eval(node, values, text):
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise ValueError(f"{text!r} names {node.id!r}, which is not a define of this kernel")
        return int(values[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, values, text), _eval(node.right, values, text)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError(f"{text!r} divides by zero")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, values, text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return int(not _eval(node.operand, values, text))
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _eval(node.left, values, text)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, values, text)
            if not _COMPARE[type(op)](left, right):
                return 0
            left = right
        return 1
    if isinstance(node, ast.BoolOp):
        results = [_eval(v, values, text) for v in node.values]
        return int(all(results) if isinstance(node.op, ast.And) else any(results))
    raise ValueError(f"{text!r}: only integers, define names, + - * / %, comparisons, and/or/not are allowed")


def names_in(text) -> set:
    """The define names an expression uses."""
    if not isinstance(text, str):
        return set()
    try:
        return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()
