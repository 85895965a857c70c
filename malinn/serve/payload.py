"""TensorFlow Serving's predict payloads: a request's JSON as input arrays, output arrays as JSON.

The row form (``{"instances": [...]}``: one item per sample, an object of named inputs for a
model of several) is answered in the row form (``{"predictions": [...]}``), the columnar form
(``{"inputs": ...}``: the whole batch, an object of named inputs for several) in the columnar form
(``{"outputs": ...}``); a single output is given without its name, several as objects by name.
Numbers may be ``NaN``, ``Infinity`` and ``-Infinity``, as TensorFlow Serving reads and writes them.
A model of one input takes it under any one name (a Keras Sequential's input is named otherwise
after conversion: the metadata API gives the name malinn knows).

Every refusal is a :class:`BadRequest` naming the input, what was expected (dtype, shape) and what
was given, answered 400.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import numpy as np

from .signature import SIGNATURE_NAME, TF_DTYPES, Signature, TensorSpec

_orjson: ModuleType | None
try:  # optional (the serve extra): a faster reader of the request's numbers
    import orjson as _orjson
except ImportError:  # pragma: no cover - the stdlib reader alone
    _orjson = None

__all__ = [
    "BadRequest",
    "PredictRequest",
    "parse_predict",
    "format_predict",
    "encode_predict",
    "writes_fast",
    "dumps",
]


class BadRequest(ValueError):
    """A request the model cannot answer as given (400, TensorFlow Serving's INVALID_ARGUMENT)."""


class PredictRequest:
    """A parsed predict request: one float32 array per model input (batch first), the sample count
    and whether it came in the columnar form."""

    __slots__ = ("arrays", "samples", "columnar")

    def __init__(self, arrays: list, samples: int, columnar: bool):
        self.arrays, self.samples, self.columnar = arrays, samples, columnar


def parse_predict(body: bytes, signature: Signature) -> PredictRequest:
    """The arrays of a predict request's ``body`` for a model of ``signature``.

    Raises:
        BadRequest: the body is not a JSON object of TensorFlow Serving's predict form, names
            another signature, misses an input or names an unknown one, or gives an input values of
            the wrong type or shape; the message names the input and both shapes.
    """
    try:
        request = _loads(body)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"malformed JSON: the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (byte {exc.pos} of {len(body)})"
        ) from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    if not isinstance(request, dict):
        raise BadRequest(
            f"the request body must be a JSON object with 'instances' or 'inputs', got {_json_type(request)}"
        )
    unknown = [] if request.keys() <= _KEYS else sorted(set(request) - _KEYS)
    if unknown:
        raise BadRequest(
            f"unknown key(s) {', '.join(map(repr, unknown))} in the request (expected 'instances' or "
            f"'inputs', and optionally 'signature_name')"
        )
    name = request.get("signature_name", "")
    if name not in ("", None, SIGNATURE_NAME):
        raise BadRequest(f"serving signature name {name!r} not found: the model has {SIGNATURE_NAME!r} alone")
    if "instances" in request and "inputs" in request:
        raise BadRequest("a request has 'instances' (row form) or 'inputs' (columnar form), not both")
    if "instances" in request:
        return _rows(request["instances"], signature)
    if "inputs" in request:
        return _columns(request["inputs"], signature)
    raise BadRequest("missing 'instances' (row form) or 'inputs' (columnar form) in the request")


#: the keys of a predict request
_KEYS = frozenset(("signature_name", "instances", "inputs"))


def _loads(body: bytes) -> Any:
    """``body``'s JSON document: read by orjson where it is installed (the ``serve`` extra brings
    it: it reads a request's decimal numbers 3 to 11 times faster than Python's json, to the same
    doubles), else, and for whatever orjson refuses (NaN, Infinity, a number beyond a double's range,
    malformed JSON), by Python's json, whose reading and error messages are the API's."""
    if _orjson is not None:
        try:
            return _orjson.loads(body)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(body.decode("utf-8"))  # NaN, Infinity and -Infinity read as Python's json reads them


def _json_type(value: Any) -> str:
    """What JSON value ``value`` is, with its article: ``an object``, ``a list``, ``null``..."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _rows(instances: Any, signature: Signature) -> PredictRequest:
    if not isinstance(instances, list):
        raise BadRequest(f"'instances' must be a list of samples, got {_json_type(instances)}")
    if not instances:
        raise BadRequest("'instances' is empty: give at least one sample")
    names = signature.input_names
    named = isinstance(instances[0], dict)
    if len(names) > 1 and not named:
        raise BadRequest(
            f"the model has {len(names)} inputs ({', '.join(names)}): each of 'instances' must be an "
            f"object of them by name"
        )
    if named:
        columns: dict[str, list[Any]] = {name: [] for name in names}
        for i, item in enumerate(instances):
            if not isinstance(item, dict):
                raise BadRequest(
                    f"instances[{i}] is {_json_type(item)}, the first an object: give every sample "
                    f"as an object of the inputs by name"
                )
            if len(names) == 1 and len(item) == 1:  # one input, under whatever name the client knows it by
                columns[names[0]].append(next(iter(item.values())))
                continue
            _check_names(item, names, f"instances[{i}]")
            for name in names:
                columns[name].append(item[name])
        values = [columns[name] for name in names]
    else:
        values = [instances]
    arrays = [_array(v, spec, "instances") for v, spec in zip(values, signature.inputs)]
    return PredictRequest(arrays, len(instances), columnar=False)


def _columns(inputs: Any, signature: Signature) -> PredictRequest:
    names = signature.input_names
    if isinstance(inputs, dict) and len(names) == 1 and len(inputs) == 1:
        values = list(inputs.values())  # one input, under whatever name the client knows it by
    elif isinstance(inputs, dict):
        _check_names(inputs, names, "'inputs'")
        values = [inputs[name] for name in names]
    elif len(names) > 1:
        raise BadRequest(
            f"the model has {len(names)} inputs ({', '.join(names)}): 'inputs' must be an object of "
            f"them by name, got {_json_type(inputs)}"
        )
    else:
        values = [inputs]
    arrays = [_array(v, spec, "inputs") for v, spec in zip(values, signature.inputs)]
    counts = [a.shape[0] for a in arrays]
    if len(set(counts)) > 1:
        raise BadRequest(
            "the inputs have different numbers of samples: "
            + ", ".join(f"{spec.name!r} {n}" for spec, n in zip(signature.inputs, counts))
        )
    if counts[0] == 0:
        raise BadRequest(f"input {names[0]!r} has no samples: give at least one")
    return PredictRequest(arrays, counts[0], columnar=True)


def _check_names(given: dict, names: list, where: str) -> None:
    missing = [n for n in names if n not in given]
    extra = [n for n in given if n not in names]
    if missing or extra:
        parts = ([f"missing input(s) {', '.join(map(repr, missing))}"] if missing else []) + (
            [f"unknown input(s) {', '.join(map(repr, extra))}"] if extra else []
        )
        raise BadRequest(f"{where}: {' and '.join(parts)}; the model's inputs are {', '.join(map(repr, names))}")


def _array(value: Any, spec: TensorSpec, form: str) -> np.ndarray:
    """``value`` (one input's whole batch) as a float32 array, checked against ``spec``."""
    if not isinstance(value, list):
        raise BadRequest(f"{_what(spec)}: expected a list of samples in {form!r}, got {_json_type(value)}")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        raise BadRequest(f"{_what(spec)}: the nested lists are ragged (samples or rows of different lengths)") from None
    kind = array.dtype.kind
    if kind != "f":  # a float array (every number request) needs no check of its kind
        if kind in "US":
            raise BadRequest(f"{_what(spec)}: expected numbers, got strings")
        if kind == "O":
            raise BadRequest(
                f"{_what(spec)}: expected numbers, got nested lists of different depths, null, objects, "
                f"or integers beyond 64 bits"
            )
        if kind == "b" and spec.dtype != "bool":
            raise BadRequest(f"{_what(spec)}: expected numbers, got booleans")
    elif spec.dtype.startswith(("int", "uint")) and not np.all(np.floor(array) == array):
        bad = np.flatnonzero(np.floor(array) != array)[0]
        raise BadRequest(f"{_what(spec)}: expected integers, got {array.reshape(-1)[bad].item()!r}")
    if spec.dtype.startswith(("int", "uint")) and array.size:
        _check_range(array, spec)
    if array.shape[1:] != tuple(spec.shape):
        given = "(" + ", ".join(str(d) for d in array.shape) + ("," if array.ndim == 1 else "") + ")"
        hint = " (the batch axis first: a list of samples)" if array.shape == tuple(spec.shape) else ""
        raise BadRequest(
            f"input {spec.name!r} ({TF_DTYPES.get(spec.dtype, spec.dtype)}): expected shape {spec.batch_shape}, "
            f"got {given}{hint}"
        )
    with np.errstate(over="ignore"):
        return array.astype(np.float32, copy=False)


def _check_range(array: np.ndarray, spec: TensorSpec) -> None:
    """Refuses an integer beyond the range of the integer input ``spec`` (as TensorFlow Serving
    does): cast, it would wrap round to another value."""
    try:
        limits = np.iinfo(spec.dtype)
    except ValueError:  # a dtype name numpy does not know: nothing to check against
        return
    low, high = array.min(), array.max()
    if low < limits.min or high > limits.max:
        bad = low if low < limits.min else high
        raise BadRequest(
            f"{_what(spec)}: {bad.item()!r} is out of the range of {spec.dtype} ({limits.min} to {limits.max})"
        )


def _what(spec: TensorSpec) -> str:
    """How an error names the input of ``spec``: its name, dtype and batch shape."""
    return f"input {spec.name!r} ({TF_DTYPES.get(spec.dtype, spec.dtype)}, shape {spec.batch_shape})"


def format_predict(outputs: list, signature: Signature, columnar: bool) -> dict:
    """The response to a predict request of ``outputs`` (one array per output, batch first)."""
    if columnar:
        if len(outputs) == 1:
            return {"outputs": outputs[0].tolist()}
        return {"outputs": {spec.name: out.tolist() for spec, out in zip(signature.outputs, outputs)}}
    if len(outputs) == 1:
        return {"predictions": outputs[0].tolist()}
    columns = [out.tolist() for out in outputs]
    names = [spec.name for spec in signature.outputs]
    return {"predictions": [dict(zip(names, row)) for row in zip(*columns)]}


def writes_fast() -> bool:
    """Whether answers are written by orjson (installed), not by Python's json alone."""
    return _orjson is not None


def encode_predict(outputs: list, signature: Signature, columnar: bool) -> bytes:
    """The response's JSON bytes for ``outputs``: :func:`format_predict`, then written by orjson
    where it is installed and every value is finite (the same doubles as Python's json writes, about
    14 times faster: 0.04 ms for a classifier's 1,000 classes against 0.5), else by :func:`dumps`
    (orjson would write NaN and the infinities as null)."""
    document = format_predict(outputs, signature, columnar)
    if _orjson is not None:
        written = _orjson.dumps(document)
        # a value that is not finite is written null, so an answer without "null" had none; one with
        # it (or an output named so) is checked
        if b"null" not in written or all(np.isfinite(out).all() for out in outputs):
            return written
    return dumps(document)


def dumps(document: Any) -> bytes:
    """``document`` as compact JSON bytes, NaN and infinities as TensorFlow Serving writes them."""
    return json.dumps(document, separators=(",", ":"), allow_nan=True).encode()
