"""Protocol buffers' text format, as TensorFlow Serving's config files are written, read into
Python values without the protobuf library.

TensorFlow Serving reads ``--model_config_file`` and ``--batching_parameters_file`` in this format::

    model_config_list {
      config {
        name: 'digits'
        base_path: '/models/digits'
        model_version_policy { specific { versions: 1 versions: 2 } }
        version_labels { key: 'stable' value: 1 }
      }
    }

:func:`read_text_format` gives a message as a dict: a scalar field its value (a string, an int, a
float, True or False, or an enum's name as a string), a message field a dict, and a field named in
``repeated`` a list of every value given for it, in order (written once or many times, or as a
``[...]`` list). What the fields mean is the reader's (:mod:`malinn.serve.config`); this module
knows only the syntax: ``#`` comments, ``name: value``, ``name { ... }`` or ``name: { ... }`` or
``< ... >``, ``[a, b]`` lists, fields apart by spaces, commas or semicolons, strings in single or
double quotes (adjacent ones joined; C escapes), decimal, hexadecimal and octal integers, floats
(``1.5``, ``1e3``, ``2.0f``, ``inf``, ``nan``).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["TextFormatError", "read_text_format"]


class TextFormatError(ValueError):
    """Text that is not protocol buffers' text format; the message names the line and column."""


_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\n\f\v]+|\#[^\n]*)
  | (?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?[fF]?))
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[{}<>\[\]:,;-])
    """,
    re.VERBOSE,
)

_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.S)
_CLOSING = {"{": "}", "<": ">"}


def read_text_format(text: str, repeated: frozenset = frozenset()) -> dict:
    """The message ``text`` writes, as a dict (the module's docstring says how).

    Args:
        text: a message in protocol buffers' text format.
        repeated: the names of the repeated fields (each a list, however often given).

    Returns:
        The fields given, by name, in the order first given.

    Raises:
        TextFormatError: the text is not in the format, or gives a field not in ``repeated`` twice;
            the message names the line and column.
    """
    return _Reader(text, repeated).message(None)


class _Reader:
    def __init__(self, text: str, repeated: frozenset):
        self.text, self.repeated = text, repeated
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, offset)
        at = 0
        while at < len(text):
            found = _TOKEN.match(text, at)
            if found is None:
                if text[at] in "'\"":
                    raise self._error(at, "a string not closed on its line")
                raise self._error(at, f"unexpected {text[at]!r}")
            if found.lastgroup != "space":
                self.tokens.append((found.lastgroup or "", found.group(), at))
            at = found.end()
        self.at = 0

    def _error(self, offset: int, what: str) -> TextFormatError:
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return TextFormatError(f"line {line}, column {column}: {what}")

    def _peek(self) -> tuple[str, str, int]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "", len(self.text))

    def _take(self, text: str | None = None) -> tuple[str, str, int]:
        token = self._peek()
        if text is not None and token[1] != text:
            raise self._error(token[2], f"expected {text!r}, got {_shown(token)}")
        if token[0] == "end":
            raise self._error(token[2], "unexpected end of the text")
        self.at += 1
        return token

    def message(self, closing: str | None) -> dict:
        fields: dict[str, Any] = {}
        while True:
            kind, text, offset = self._peek()
            if kind == "end":
                if closing is not None:
                    raise self._error(offset, f"expected {closing!r} before the end of the text")
                return fields
            if text == closing:
                self._take()
                return fields
            if kind != "name":
                raise self._error(offset, f"expected a field's name, got {_shown((kind, text, offset))}")
            self._take()
            colon = self._peek()[1] == ":"
            if colon:
                self._take()
            opening = self._peek()
            if opening[1] == "[" and colon:
                self._take()
                values = []
                while self._peek()[1] != "]":
                    values.append(self._value())
                    if self._peek()[1] == ",":
                        self._take()
                    elif self._peek()[1] != "]":
                        raise self._error(self._peek()[2], f"expected ',' or ']', got {_shown(self._peek())}")
                self._take("]")
                self._store(fields, text, offset, values, listed=True)
            elif opening[1] in _CLOSING:
                self._take()
                self._store(fields, text, offset, self.message(_CLOSING[opening[1]]))
            elif colon:
                self._store(fields, text, offset, self._scalar())
            else:
                raise self._error(opening[2], f"expected ':' or '{{' after {text!r}, got {_shown(opening)}")
            if self._peek()[1] in (",", ";"):
                self._take()

    def _store(self, fields: dict, name: str, offset: int, value: Any, listed: bool = False) -> None:
        if name in self.repeated:
            fields.setdefault(name, []).extend(value if listed else [value])
        elif listed:
            raise self._error(offset, f"{name!r} is given a list; it takes one value")
        elif name in fields:
            raise self._error(offset, f"{name!r} is given twice; it takes one value")
        else:
            fields[name] = value

    def _value(self) -> Any:
        opening = self._peek()
        if opening[1] in _CLOSING:
            self._take()
            return self.message(_CLOSING[opening[1]])
        return self._scalar()

    def _scalar(self) -> Any:
        kind, text, offset = self._take()
        if kind == "string":
            parts = [text]
            while self._peek()[0] == "string":
                parts.append(self._take()[1])
            return "".join(_unquoted(p) for p in parts)
        if kind == "number":
            try:
                return _number(text)
            except ValueError:
                raise self._error(offset, f"{text!r} is not a number") from None
        negative = text == "-"
        if negative:
            kind, text, offset = self._take()
        if kind == "name":
            lowered = text.lower()
            if lowered in ("inf", "infinity", "nan"):
                value = float(lowered)
                return -value if negative else value
            if not negative:
                return {"true": True, "t": True, "false": False, "f": False}.get(text, text)
        raise self._error(offset, f"expected a value, got {_shown((kind, text, offset))}")


def _shown(token: tuple) -> str:
    return "the end of the text" if token[0] == "end" else repr(token[1])


def _number(text: str) -> int | float:
    body = text.lstrip("+-")
    sign = -1 if text.startswith("-") else 1
    if body[:2] in ("0x", "0X"):
        return sign * int(body, 16)
    if body.isdigit():
        return sign * (int(body, 8) if len(body) > 1 and body.startswith("0") else int(body))
    return float(text.rstrip("fF"))


def _unquoted(quoted: str) -> str:
    def escape(found: re.Match) -> str:
        octal, hexadecimal, other = found.groups()
        if octal is not None:
            return chr(int(octal, 8))
        if hexadecimal is not None:
            return chr(int(hexadecimal, 16))
        return _ESCAPES.get(other, "\\" + other)

    return _ESCAPE.sub(escape, quoted[1:-1])
