"""A predict body read by orjson (the serve extra's JSON reader) and by Python's json alone gives the
same float32 arrays, and the same refusal word for word: orjson reads what it can, Python's json
what orjson refuses (NaN, Infinity, numbers beyond a double's range, malformed JSON)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import malinn
from malinn.layers import Dense
from malinn.serve import payload
from malinn.serve.payload import BadRequest, parse_predict
from malinn.serve.signature import Signature

orjson = pytest.importorskip("orjson")  # in the serve and test extras


@pytest.fixture(scope="module")
def signature() -> Signature:
    model = malinn.Sequential([Dense(3)], name="tiny")
    model.build((None, 4))
    return Signature(model)


def outcome(body: bytes, signature: Signature, fast: bool):
    """``parse_predict``'s arrays, samples and form, or its refusal's message, read by orjson
    (``fast``) or by Python's json alone."""
    saved = payload._orjson
    payload._orjson = orjson if fast else None
    try:
        parsed = parse_predict(body, signature)
        return [a.dtype.str for a in parsed.arrays], parsed.arrays, parsed.samples, parsed.columnar
    except BadRequest as exc:
        return str(exc)
    finally:
        payload._orjson = saved


def same(body: bytes, signature: Signature):
    fast, slow = outcome(body, signature, True), outcome(body, signature, False)
    if isinstance(slow, str):
        assert fast == slow
        return slow
    assert not isinstance(fast, str), fast
    assert fast[0] == slow[0] == ["<f4"] and fast[2:] == slow[2:]
    for a, b in zip(fast[1], slow[1]):
        assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))  # the same bits
    return fast


BODIES = [
    json.dumps({"instances": np.random.default_rng(0).random((5, 4), dtype=np.float32).tolist()}).encode(),
    json.dumps({"inputs": np.random.default_rng(1).standard_normal((3, 4)).tolist()}).encode(),
    json.dumps({"instances": [{"x": [1, 2, 3, 4]}], "signature_name": "serving_default"}).encode(),
    b'{"instances": [[NaN, Infinity, -Infinity, 0.5]]}',
    b'{"instances": [[1e400, -1e400, 1e-400, 3.4028235677973366e38]]}',
    b'{"instances": [[0.1000000000000000055511151231257827021181583404541015625, 1E5, -0, 7e-46]]}',
    b'{"instances": [[1.00000005960464477539062500000000001, 2.5e-45, 1.4e-45, 123456789012345678]]}',
    b' \n{"instances" : [ [ 1 , 2 , 3 , 4 ] ] } \n',
]
REFUSED = [
    b'{"instances": [[1, 2',
    b"\xff\xfe",
    b"\xef\xbb\xbf" + BODIES[0],
    b'{"instances": [[1, 2, 3, 4],]}',
    b'{"instances": [[1, 2, 3, 4]]} x',
    b"[1, 2]",
    b'{"instances": [[1, 2, 3]]}',
    b'{"instances": [[1, 2, 3, 4], [1, 2, 3]]}',
    b'{"instances": [["a", 2, 3, 4]]}',
    b'{"instances": [[null, 2, 3, 4]]}',
    b'{"instances": [[true, false, true, false]]}',
    b'{"instances": [[1, 2, 3, 4]], "extra": 1}',
    b'{"instances": "\\ud800"}',
    b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}",
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_orjson_and_json_read_a_body_to_the_same_float32_bits(body, signature):
    assert not isinstance(same(body, signature), str)


@pytest.mark.parametrize("body", REFUSED, ids=range(len(REFUSED)))
def test_orjson_and_json_refuse_a_body_with_the_same_message(body, signature):
    assert isinstance(same(body, signature), str)


def test_an_integer_beyond_64_bits_is_read_as_a_double_by_orjson(signature):
    """The one difference: orjson reads an integer beyond 64 bits as the nearest double (as it
    reads 1.8446744073709552e19), Python's json as an integer numpy cannot hold (refused)."""
    body = b'{"instances": [[18446744073709551616, 1, 2, 3]]}'
    fast = outcome(body, signature, True)
    assert not isinstance(fast, str) and fast[1][0][0, 0] == np.float32(2.0**64)
    assert "integers beyond 64 bits" in outcome(body, signature, False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.floats(width=32, allow_nan=False, allow_infinity=False),
            st.integers(-(2**63), 2**63 - 1),
            st.from_regex(r"-?[1-9][0-9]{0,30}\.[0-9]{1,30}e-?[0-9]{1,2}", fullmatch=True),
        ),
        min_size=4,
        max_size=4,
    )
)
def test_any_numbers_read_alike(signature, numbers):
    row = ", ".join(n if isinstance(n, str) else json.dumps(n) for n in numbers)
    same(('{"instances": [[' + row + "]]}").encode(), signature)


@pytest.mark.parametrize("columnar", [False, True])
def test_an_answer_written_by_orjson_reads_back_as_the_same_doubles_and_nan_is_written_as_json_writes_it(
    signature, columnar
):
    rng = np.random.default_rng(3)
    values = (rng.standard_normal((64, 3)) * 10.0 ** rng.integers(-40, 38, (64, 3))).astype(np.float32)
    fast = payload.encode_predict([values], signature, columnar)
    saved = payload._orjson
    payload._orjson = None
    try:
        slow = payload.encode_predict([values], signature, columnar)
        with_nan = values.copy()
        with_nan[0, :] = [np.nan, np.inf, -np.inf]
        want_nan = payload.encode_predict([with_nan], signature, columnar)
    finally:
        payload._orjson = saved
    assert json.loads(fast) == json.loads(slow)  # the same doubles: each float32 value exactly
    key = "outputs" if columnar else "predictions"
    assert np.array_equal(np.asarray(json.loads(fast)[key], np.float32).view(np.uint32), values.view(np.uint32))
    assert payload.encode_predict([with_nan], signature, columnar) == want_nan
    assert b"NaN,Infinity,-Infinity" in want_nan
