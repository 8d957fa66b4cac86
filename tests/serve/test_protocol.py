"""The v2 codec, without sockets: binary and JSON tensors both ways, and every malformed body refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from deskpod.serve.protocol import ProtocolError, decode_request, decode_response, encode_request, encode_response


@pytest.mark.parametrize("binary", [True, False])
def test_request_round_trip(binary: bool) -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ids = np.array([[1, 2], [3, 4]], dtype=np.int64)
    body, hl = encode_request({"x": x, "ids": ids}, binary=binary)
    assert (hl is not None) == binary
    req = decode_request(body, hl)
    np.testing.assert_array_equal(req.inputs["x"], x)
    np.testing.assert_array_equal(req.inputs["ids"], ids)
    assert req.inputs["ids"].dtype == np.int64


def test_bytes_tensor_round_trip() -> None:
    s = np.array([b"ab", b"", b"\x00\xff"], dtype=object)
    body, hl = encode_request({"s": s})
    np.testing.assert_array_equal(decode_request(body, hl).inputs["s"], s)


def test_response_binary_only_where_asked() -> None:
    out = {"a": np.ones((1, 2), np.float32), "b": np.full((1, 1), 7, np.int32)}
    body, hl = encode_request({"x": np.zeros((1, 2), np.float32)}, outputs=["a"], binary_outputs=False)
    rbody, rhl = encode_response("m", "1", out, decode_request(body, hl))
    assert rhl is None  # JSON asked for: no binary part at all
    assert json.loads(rbody)["outputs"][0]["data"] == [1.0, 1.0]
    body, hl = encode_request({"x": np.zeros((1, 2), np.float32)})  # tritonclient's default: binary outputs
    rbody, rhl = encode_response("m", "1", out, decode_request(body, hl))
    assert rhl is not None and len(rbody) == rhl + 8 + 4
    got = decode_response(rbody, rhl)
    np.testing.assert_array_equal(got["b"], out["b"])
    assert got["b"].dtype == np.int32


_B = b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}'


@pytest.mark.parametrize(
    ("body", "hl", "fragment"),
    [
        (b"{not json", None, "malformed"),
        (b'{"inputs": []}', None, "non-empty"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}', None, "needs 2 elements"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP99", "data": [1, 2]}]}', None, "datatype"),
        (b'{"inputs": [{"name": "x", "shape": [-2], "datatype": "FP32", "data": []}]}', None, "shape"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32"}]}', None, "neither"),
        (
            b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}',
            None,
            "Inference-Header",
        ),
        (_B + b"1234", len(_B), "runs past"),
        (_B.replace(b"[2]", b"[3]") + b"12345678", len(_B), "needs 12 bytes"),
        (_B + b"123456789", len(_B), "1 bytes of binary data after"),
        (b"{}", 500, "Inference-Header-Content-Length is 500"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": ["a", "b"]}]}', None, "not a flat list"),
    ],
)
def test_malformed_requests_name_the_problem(body: bytes, hl: int | None, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment):
        decode_request(body, hl)


def test_a_binary_head_is_the_json_the_standard_library_writes() -> None:
    """The binary head comes from orjson: the same JSON as json.dumps, a non-ASCII id and name included."""
    out = {"logits": np.ones((1, 3), np.float32), "ünïcode": np.zeros((1, 1), np.int64)}
    body, hl = encode_request({"x": np.zeros((1, 2), np.float32)})
    req = decode_request(body, hl)
    req.id = "réq-1"
    rbody, rhl = encode_response("modèle", "1", out, req)
    assert rhl is not None
    head = {"model_name": "modèle", "model_version": "1", "id": "réq-1", "outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [1, 3], "parameters": {"binary_data_size": 12}},
        {"name": "ünïcode", "datatype": "INT64", "shape": [1, 1], "parameters": {"binary_data_size": 8}},
    ]}  # fmt: skip
    assert json.loads(rbody[:rhl]) == head
    assert rbody[rhl:] == out["logits"].tobytes() + out["ünïcode"].tobytes()


def test_what_orjson_refuses_is_read_and_written_as_before() -> None:
    """NaN, integers past 64 bits and a lone surrogate: json.loads accepts them, and the answer still goes out."""
    body = b'{"id": "a\\ud800", "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [NaN, 1]}]}'
    req = decode_request(body, None)
    assert np.isnan(req.inputs["x"][0]) and req.inputs["x"][1] == 1 and req.id == "a\ud800"
    big = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "UINT64", "data": [18446744073709551616]}]}'
    with pytest.raises(ProtocolError, match="UINT64"):  # past 64 bits: json reads it, the tensor refuses it
        decode_request(big, None)
    req.binary_default = True
    rbody, rhl = encode_response("m", "1", {"y": np.ones((1,), np.float32)}, req)
    assert rhl is not None and json.loads(rbody[:rhl])["id"] == "a\ud800"  # json's escape, not orjson's refusal
    req.binary_default = False
    rbody, rhl = encode_response("m", "1", {"y": np.array([np.nan], np.float32)}, req)
    assert rhl is None and b"NaN" in rbody  # values as JSON: written by json, NaN as before
