"""The KServe/Triton v2 inference protocol over HTTP: request decoding and response encoding.

A request body is either pure JSON (tensor ``data`` inline, flattened row-major) or the *binary tensor
extension*: the header ``Inference-Header-Content-Length: N`` says the first N bytes are JSON, and the raw
tensors follow in input order, each flagged with ``parameters.binary_data_size``. The official
``tritonclient`` uses the binary form by default and asks for binary outputs with
``parameters.binary_data_output: true`` when it lists no outputs; the response mirrors that layout.
Little-endian, row-major; a BYTES element is a 4-byte little-endian length and the bytes.

Everything here is pure (bytes in, numpy out and back) so it is tested without sockets. Every problem with
the input is a `ProtocolError` (HTTP 400) naming what is wrong.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from deskpod.errors import UsageError

# v2 datatype -> numpy dtype (little-endian); BYTES is handled apart (object arrays of bytes).
DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("bool"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
DATATYPES = (*DTYPES, "BYTES")  # BF16 has no numpy dtype: refused with a clear error
_BY_KIND = {v.str: k for k, v in DTYPES.items()} | {"|b1": "BOOL", "|i1": "INT8", "|u1": "UINT8"}


class ProtocolError(UsageError):
    """A request that does not follow the v2 protocol or does not fit the model (HTTP 400)."""


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The v2 datatype name of a numpy dtype (object/bytes arrays are BYTES)."""
    if dtype.kind in "OSU":
        return "BYTES"
    name = _BY_KIND.get(dtype.newbyteorder("<").str) or _BY_KIND.get(dtype.str)
    if name is None:
        raise ProtocolError(f"numpy dtype {dtype} has no v2 datatype; valid: {', '.join(DATATYPES)}")
    return name


@dataclass(slots=True)
class InferRequest:
    """One decoded ``/infer`` request."""

    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] | None = None  # None: every output
    binary_outputs: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False

    @property
    def timeout_us(self) -> int | None:
        """Per-request timeout in microseconds (tritonclient's ``timeout=``), if given."""
        t = self.parameters.get("timeout")
        if t is None:
            return None
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ProtocolError(f"parameters.timeout must be a non-negative integer of microseconds, got {t!r}")
        return t


def _bytes_tensor(raw: bytes | memoryview, count: int, name: str) -> np.ndarray:
    out = np.empty(count, dtype=object)
    mv = memoryview(raw)
    pos = 0
    for i in range(count):
        if pos + 4 > len(mv):
            raise ProtocolError(f"input {name!r}: BYTES data ends inside element {i} of {count}")
        (n,) = struct.unpack_from("<I", mv, pos)
        pos += 4
        if pos + n > len(mv):
            raise ProtocolError(f"input {name!r}: BYTES element {i} claims {n} bytes, only {len(mv) - pos} left")
        out[i] = bytes(mv[pos : pos + n])
        pos += n
    if pos != len(mv):
        raise ProtocolError(f"input {name!r}: {len(mv) - pos} bytes left over after {count} BYTES elements")
    return out


def raw_tensor(raw: bytes | memoryview, shape: tuple[int, ...], datatype: str, name: str, said: str) -> np.ndarray:
    """Input ``name``'s flat values from its bytes; `ProtocolError` when they are not ``shape``'s size (``said``
    names where the size came from: ``binary_data_size is``, ``raw_input_contents has``)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_tensor(raw, count, name)
    dt = DTYPES[datatype]
    if len(raw) != count * dt.itemsize:
        raise ProtocolError(
            f"input {name!r}: shape {list(shape)} of {datatype} needs {count * dt.itemsize} bytes, {said} {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dt)


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if type(value) is list:
        for d in value:
            if type(d) is not int or d < 0:  # bool is an int subclass: refused too
                break
        else:
            return tuple(value)
    raise ProtocolError(f"input {name!r}: shape must be a list of non-negative integers, got {value!r}")


MAX_DEPTH = 16
"""Arrays and objects nested in a request's JSON, its tensors' ``data`` aside (numpy reads those, and refuses more
than its 64 dimensions); a v2 request nests four. Deeper is refused before anything walks it (a repr, ``str`` of
an ``id``), which Python would do by recursion."""


def _loads(head: bytes) -> Any:
    """JSON as the standard library reads it, parsed by orjson (about 4x faster on a request's head); what orjson
    refuses (NaN, integers past 64 bits, malformed text) goes to ``json.loads``, for its values and its messages.
    `ProtocolError` for JSON nested too deeply (orjson stops at 1,024, ``json`` at Python's recursion limit) and for
    an integer of more digits than Python converts (4,300), which ``json`` refuses with advice for programmers."""
    try:
        return orjson.loads(head)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(head)
    except RecursionError:
        raise ProtocolError(f"request JSON is nested too deeply; at most {MAX_DEPTH} arrays or objects") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError:  # int() refused a literal: the parser's only other ValueError
        limit = sys.get_int_max_str_digits()
        raise ProtocolError(f"request JSON has a number of more than {limit} digits; no field takes one") from None


def nesting(data: Any, limit: int) -> int:
    """How deeply arrays and objects nest in decoded JSON (0 for a scalar); walked without recursion, and no
    deeper than ``limit`` + 1 (deeper is refused anyway: the walk stops there). The pod's API uses it too."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth)
            if depth <= limit:
                todo.extend((v, depth + 1) for v in value if isinstance(v, dict | list))
    return deepest


def decode_request(body: bytes, header_length: int | None) -> InferRequest:
    """Decode an infer request body; ``header_length`` is the Inference-Header-Content-Length value."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise ProtocolError(f"Inference-Header-Content-Length is {header_length} but the body has {len(body)} bytes")
    head = body if header_length is None else body[:header_length]
    try:
        doc = _loads(head)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ProtocolError(f"request JSON is malformed: {e}") from None
    walked = doc  # each input's ``data`` is left out of the count
    if isinstance(doc, dict) and isinstance(doc.get("inputs"), list):
        specs = [{k: v for k, v in s.items() if k != "data"} if isinstance(s, dict) else s for s in doc["inputs"]]
        walked = {**doc, "inputs": specs}
    if nesting(walked, MAX_DEPTH) > MAX_DEPTH:
        raise ProtocolError(f"request JSON is nested too deeply; at most {MAX_DEPTH} arrays or objects")
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise ProtocolError('request must be a JSON object with a non-empty "inputs" list')
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError('"parameters" must be a JSON object')
    view = memoryview(body)
    pos = header_length if header_length is not None else len(body)
    inputs: dict[str, np.ndarray] = {}
    for spec in doc["inputs"]:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ProtocolError(f'each input needs a "name", got {spec!r:.100}')
        name = spec["name"]
        if name in inputs:
            raise ProtocolError(f"input {name!r} appears twice")
        shape = _shape(spec.get("shape"), name)
        datatype = spec.get("datatype")
        if datatype not in DATATYPES:
            raise ProtocolError(f"input {name!r}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
        count = math.prod(shape)
        size = (spec.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if header_length is None:
                raise ProtocolError(
                    f"input {name!r} has binary_data_size but the Inference-Header-Content-Length header is missing"
                )
            if not isinstance(size, int) or size < 0 or pos + size > len(body):
                raise ProtocolError(
                    f"input {name!r}: binary_data_size {size!r} runs past the end of the body "
                    f"({len(body) - pos} bytes left)"
                )
            arr = raw_tensor(view[pos : pos + size], shape, datatype, name, "binary_data_size is")
            pos += size
        else:
            data = spec.get("data")
            if data is None:
                raise ProtocolError(f'input {name!r} has neither "data" nor parameters.binary_data_size')
            try:
                if datatype == "BYTES":
                    flat = np.asarray(data, dtype=object).reshape(-1)
                    if not all(isinstance(s, str) for s in flat):  # bytes(n) of a number n would allocate n bytes
                        raise ValueError("BYTES elements in JSON are strings")
                    arr = np.array([s.encode() for s in flat], dtype=object)
                else:
                    arr = np.asarray(data, dtype=DTYPES[datatype]).reshape(-1)
            except (ValueError, TypeError, OverflowError) as e:
                raise ProtocolError(f"input {name!r}: data is not a flat list of {datatype}: {e}") from None
            if arr.size != count:
                raise ProtocolError(f"input {name!r}: shape {list(shape)} needs {count} elements, data has {arr.size}")
        inputs[name] = arr.reshape(shape)
    if pos != len(body) and header_length is not None:
        raise ProtocolError(f"{len(body) - pos} bytes of binary data after the last input")
    outputs: list[str] | None = None
    binary_outputs: dict[str, bool] = {}
    if doc.get("outputs") is not None:
        if not isinstance(doc["outputs"], list):
            raise ProtocolError('"outputs" must be a list')
        outputs = []
        for o in doc["outputs"]:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise ProtocolError(f'each requested output needs a "name", got {o!r:.100}')
            outputs.append(o["name"])
            b = (o.get("parameters") or {}).get("binary_data")
            if b is not None:
                binary_outputs[o["name"]] = bool(b)
    rid = doc.get("id")
    return InferRequest(
        inputs=inputs,
        id=None if rid is None else str(rid),
        parameters=params,
        outputs=outputs,
        binary_outputs=binary_outputs,
        binary_default=bool(params.get("binary_data_output", False)),
    )


def _raw(arr: np.ndarray) -> bytes:
    if arr.dtype.kind in "OSU":
        parts = []
        for x in arr.reshape(-1):
            b = x.encode() if isinstance(x, str) else bytes(x)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _json_data(arr: np.ndarray) -> list[Any]:
    if arr.dtype.kind in "OSU":
        return [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in arr.reshape(-1)]
    return arr.reshape(-1).tolist()  # type: ignore[no-any-return]


def _tensor(name: str, arr: np.ndarray, binary: bool, blobs: list[bytes]) -> dict[str, Any]:
    """One tensor of a request's or response's head: its values in ``data``, or (``binary``) appended to ``blobs``
    with their size in the head."""
    t: dict[str, Any] = {"name": name, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
    if binary:
        raw = _raw(arr)
        t["parameters"] = {"binary_data_size": len(raw)}
        blobs.append(raw)
    else:
        t["data"] = _json_data(arr)
    return t


def _head_json(head: dict[str, Any], values: bool) -> bytes:
    """A response's JSON head. Without tensor values in it, orjson writes the same JSON about 20x faster (names as
    UTF-8 rather than escapes); with values, the standard library does (its float text, NaN as Python writes it),
    and so it does for a string orjson refuses (an id holding a lone surrogate, which ``json.loads`` accepts)."""
    if not values:
        try:
            return orjson.dumps(head)
        except TypeError:
            pass
    return json.dumps(head, separators=(",", ":")).encode()


def encode_response(
    model_name: str,
    model_version: str,
    outputs: dict[str, np.ndarray],
    request: InferRequest,
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length."""
    head: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        head["id"] = request.id
    blobs: list[bytes] = []
    binary = request.binary_outputs
    tensors = [_tensor(n, a, binary.get(n, request.binary_default), blobs) for n, a in outputs.items()]
    head["outputs"] = tensors
    js = _head_json(head, values=len(blobs) < len(tensors))
    if not blobs:
        return js, None
    return b"".join([js, *blobs]), len(js)


def encode_request(
    inputs: dict[str, np.ndarray], *, binary: bool = True, outputs: list[str] | None = None, binary_outputs: bool = True
) -> tuple[bytes, int | None]:
    """An infer request body (used by the load generator and tests); the JSON header length when binary."""
    blobs: list[bytes] = []
    head: dict[str, Any] = {"inputs": [_tensor(name, arr, binary, blobs) for name, arr in inputs.items()]}
    if outputs is not None:
        head["outputs"] = [{"name": o, "parameters": {"binary_data": binary_outputs}} for o in outputs]
    elif binary_outputs:
        head["parameters"] = {"binary_data_output": True}
    js = json.dumps(head, separators=(",", ":")).encode()
    return (b"".join([js, *blobs]), len(js)) if blobs else (js, None)


def decode_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """The output tensors of a v2 infer response (binary or JSON)."""
    head = json.loads(body if header_length is None else body[:header_length])
    if "error" in head:
        raise ProtocolError(f"server answered an error: {head['error']}")
    pos = header_length or 0
    out: dict[str, np.ndarray] = {}
    for t in head["outputs"]:
        shape = tuple(t["shape"])
        size = (t.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw = body[pos : pos + size]
            pos += size
            if t["datatype"] == "BYTES":
                out[t["name"]] = _bytes_tensor(raw, math.prod(shape), t["name"]).reshape(shape)
            else:
                out[t["name"]] = np.frombuffer(raw, dtype=DTYPES[t["datatype"]]).reshape(shape)
        else:
            out[t["name"]] = np.asarray(t["data"], dtype=DTYPES.get(t["datatype"], object)).reshape(shape)
    return out
