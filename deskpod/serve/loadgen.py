"""A load generator for any v2 inference server, over HTTP or gRPC: closed loop at given concurrencies, open loop
at given rates.

Closed loop: C connections, each sends a request as soon as its previous answer arrives — throughput at a fixed
number of clients in flight; a client refused with 429/503 pauses 20 ms before it tries again (retrying at once
would measure how fast the server can say no, not how it serves). Open loop: requests start on a fixed schedule (R per second) whatever the server
does, each on an idle keep-alive connection (a new one when all are busy, up to ``max_connections``); latency is
measured from the *scheduled* start, so a server that falls behind shows it (no coordinated omission).

The client is lean on purpose — it shares the CPU with the server it measures: the request bytes are built once,
each connection is an ``asyncio.Protocol`` that only splits responses by Content-Length, and only the first
response is decoded and checked (outside the timed part). Every non-200 answer is counted by status.

Over gRPC (``protocol="grpc"``, the service ``inference.GRPCInferenceService``) a connection is a channel of its
own (its own HTTP/2 connection, one call in flight, as an HTTP connection has); the ``ModelInferRequest`` is
serialized once and the answer is not parsed in the timed part either. Tensors go as ``raw_input_contents``
(``binary=False``: typed ``contents``). Failed calls are counted by their code (``UNAVAILABLE``, ...); a client
refused with UNAVAILABLE backs off as one refused with 503 does. The same figures come out for both protocols.
With ``protocol="grpc-stream"`` each connection opens one ``ModelStreamInfer`` stream and sends its requests on
it, one in flight (what ``tritonclient.grpc``'s ``async_stream_infer`` and ``perf_analyzer --streaming`` use);
an answer carrying ``error_message`` is counted as ``stream-error``, a stream that fails by its code.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from deskpod.errors import RunError, UsageError
from deskpod.serve.protocol import DTYPES, _bytes_tensor, _raw, datatype_of, decode_response, encode_request

PROTOCOLS = ("http", "grpc", "grpc-stream")
OVERLOADED = (429, 503, "UNAVAILABLE")
"""Answers after which a closed-loop client backs off: HTTP 429/503 and gRPC UNAVAILABLE."""
_INFER = "/inference.GRPCInferenceService/ModelInfer"
_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
_STREAM_OK = b"\x12"
"""A serialized ``ModelStreamInferResponse`` that starts with field 2 (``infer_response``) has no error message
(field 1, which protobuf writes first when set)."""
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadSpec:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str
    inputs: dict[str, np.ndarray] = field(hash=False)
    binary: bool = True
    duration_s: float = 5.0
    warmup_s: float = 1.0
    max_connections: int = 1024
    overload_backoff_s: float = 0.02
    """Closed loop: a client pauses this long after a 429/503 (gRPC UNAVAILABLE) instead of retrying at once."""
    protocol: str = "http"
    """``http``, ``grpc`` (unary ModelInfer calls) or ``grpc-stream`` (a ModelStreamInfer stream per connection)."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise UsageError(f"protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")

    def request_bytes(self) -> bytes:
        if self.protocol != "http":
            return grpc_request(self.model, self.inputs, raw=self.binary).SerializeToString()  # type: ignore[no-any-return]
        body, hl = encode_request(self.inputs, binary=self.binary, binary_outputs=self.binary)
        head = f"POST /v2/models/{self.model}/infer HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
        if hl is not None:
            head += f"Inference-Header-Content-Length: {hl}\r\n"
        return head.encode() + b"\r\n" + body


@dataclass(slots=True)
class LoadResult:
    mode: str  # "closed" or "open"
    level: float  # concurrency or requests/s
    duration_s: float
    ok: int
    errors: dict[str, int]
    throughput: float  # answered OK per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Conn(asyncio.Protocol):
    """One keep-alive client connection with at most one request in flight."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes, int | None]] | None = None
        self.need: tuple[int, int, int | None] | None = None  # status, end of body, header length
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports subclass nothing in asyncio

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed by the server"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.need is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            status, length, hl = int(lines[0].split(" ")[1]), 0, None
            for line in lines[1:]:
                k, _, v = line.partition(":")
                k = k.strip().lower()
                if k == "content-length":
                    length = int(v)
                elif k == "inference-header-content-length":
                    hl = int(v)
            del self.buf[: end + 4]
            self.need = (status, length, hl)
        status, length, hl = self.need
        if len(self.buf) >= length:
            body = bytes(self.buf[:length])
            del self.buf[:length]
            self.need = None
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result((status, body, hl))

    async def request(self, data: bytes) -> tuple[int, bytes, int | None]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


class _GrpcConn:
    """One gRPC channel (its own HTTP/2 connection) with at most one call in flight; the `_Conn` interface."""

    def __init__(self, spec: LoadSpec) -> None:
        import grpc

        # A local subchannel pool: channels with equal options would otherwise share one TCP connection.
        self.channel = grpc.aio.insecure_channel(
            f"{spec.host}:{spec.port}",
            options=[("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", -1)],
        )
        self.call = self.channel.unary_unary(_INFER)  # no serializers: bytes in, bytes out
        self.error = grpc.aio.AioRpcError
        self.closed = False

    async def request(self, data: bytes) -> tuple[int | str, bytes, int | None]:
        try:
            return 200, await self.call(data), None
        except self.error as e:
            return e.code().name, (e.details() or "").encode(), None


class _GrpcStreamConn(_GrpcConn):
    """One ModelStreamInfer stream on a channel of its own, one request in flight; the `_Conn` interface."""

    def __init__(self, spec: LoadSpec) -> None:
        super().__init__(spec)
        self.stream: Any = None

    async def request(self, data: bytes) -> tuple[int | str, bytes, int | None]:
        if self.stream is None:
            self.stream = self.channel.stream_stream(_STREAM)()
        try:
            await self.stream.write(data)
            answer = await self.stream.read()
        except self.error as e:
            self.closed = True
            return e.code().name, (e.details() or "").encode(), None
        if not isinstance(answer, bytes):  # the server ended the stream
            self.closed = True
            return "stream-ended", b"", None
        return (200 if answer[:1] == _STREAM_OK else "stream-error"), answer, None


Conn = _Conn | _GrpcConn


async def _connect(spec: LoadSpec) -> Conn:
    if spec.protocol != "http":
        c = _GrpcStreamConn(spec) if spec.protocol == "grpc-stream" else _GrpcConn(spec)
        try:
            await asyncio.wait_for(c.channel.channel_ready(), CONNECT_TIMEOUT_S)
        except TimeoutError:  # an OSError, as a refused HTTP connection is
            await c.channel.close()
            raise TimeoutError(
                f"no gRPC connection to {spec.host}:{spec.port} within {CONNECT_TIMEOUT_S:g} s"
            ) from None
        return c
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(_Conn, spec.host, spec.port)
    return conn


async def _close(conns: list[Conn]) -> None:
    for c in conns:
        if isinstance(c, _GrpcStreamConn) and c.stream is not None:
            c.stream.cancel()
        if isinstance(c, _GrpcConn):
            await c.channel.close()
        elif c.transport is not None:
            c.transport.close()


def grpc_request(model: str, inputs: dict[str, np.ndarray], *, raw: bool = True) -> Any:
    """A ``ModelInferRequest`` for ``inputs``: raw contents, or typed ``contents`` (``raw=False``)."""
    from tritonclient.grpc import service_pb2 as pb

    from deskpod.serve.grpc_server import CONTENTS

    req = pb.ModelInferRequest(model_name=model)
    for name, arr in inputs.items():
        t = req.inputs.add(name=name, datatype=datatype_of(arr.dtype), shape=arr.shape)
        if raw:
            req.raw_input_contents.append(_raw(arr))
        else:
            getattr(t.contents, CONTENTS[t.datatype]).extend(arr.reshape(-1).tolist())
    return req


def decode_grpc_response(data: bytes) -> dict[str, np.ndarray]:
    """The outputs of a serialized ``ModelInferResponse`` (raw output contents, as Triton and deskpod send)."""
    from tritonclient.grpc import service_pb2 as pb

    return _outputs(pb.ModelInferResponse.FromString(data))


def _outputs(resp: Any) -> dict[str, np.ndarray]:
    """The outputs of a parsed ``ModelInferResponse``."""
    out: dict[str, np.ndarray] = {}
    for t, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
        shape = tuple(t.shape)
        if t.datatype == "BYTES":
            out[t.name] = _bytes_tensor(raw, math.prod(shape), t.name).reshape(shape)
        else:
            out[t.name] = np.frombuffer(raw, dtype=DTYPES[t.datatype]).reshape(shape)
    return out


def _summary(mode: str, level: float, lat: list[float], errors: Counter[str], duration: float) -> LoadResult:
    a = np.sort(np.asarray(lat)) * 1000 if lat else np.zeros(1) * math.nan
    return LoadResult(
        mode=mode,
        level=level,
        duration_s=round(duration, 3),
        ok=len(lat),
        errors=dict(errors),
        throughput=len(lat) / duration,
        p50_ms=float(np.percentile(a, 50)),
        p90_ms=float(np.percentile(a, 90)),
        p99_ms=float(np.percentile(a, 99)),
        mean_ms=float(a.mean()),
    )


async def check(spec: LoadSpec) -> dict[str, np.ndarray]:
    """Send one request and decode the answer: the load is only measured against a server that answers right."""
    try:
        conn = await _connect(spec)
    except OSError as e:
        raise RunError(f"cannot connect to {spec.host}:{spec.port} ({spec.protocol}): {e}") from None
    try:
        status, body, hl = await conn.request(spec.request_bytes())
    finally:
        await _close([conn])
    streamed = None
    if spec.protocol == "grpc-stream" and status in (200, "stream-error"):
        from tritonclient.grpc import service_pb2 as pb

        streamed = pb.ModelStreamInferResponse.FromString(body)
        body = streamed.error_message.encode() or body
    if status != 200:
        raise RunError(f"server answered {status} to a check request: {body[:300]!r}")
    if streamed is not None:
        return _outputs(streamed.infer_response)
    return decode_grpc_response(body) if spec.protocol == "grpc" else decode_response(body, hl)


async def closed_loop(spec: LoadSpec, concurrency: int) -> LoadResult:
    if not 1 <= concurrency <= spec.max_connections:
        raise UsageError(f"concurrency {concurrency} must be in 1..{spec.max_connections}")
    data = spec.request_bytes()
    conns = await asyncio.gather(*(_connect(spec) for _ in range(concurrency)))
    loop = asyncio.get_running_loop()
    t_start = loop.time() + spec.warmup_s
    t_end = t_start + spec.duration_s
    lat: list[float] = []
    errors: Counter[str] = Counter()

    async def client(c: Conn) -> None:
        while not c.closed:
            t0 = loop.time()
            if t0 >= t_end:
                return
            try:
                status, _body, _ = await c.request(data)
            except ConnectionError:
                if t0 >= t_start:
                    errors["connection"] += 1
                return
            if t0 >= t_start:
                if status == 200:
                    lat.append(loop.time() - t0)
                else:
                    errors[str(status)] += 1
            if status in OVERLOADED:
                await asyncio.sleep(spec.overload_backoff_s)  # a well-behaved client backs off when refused

    await asyncio.gather(*(client(c) for c in conns))
    await _close(list(conns))
    return _summary("closed", concurrency, lat, errors, spec.duration_s)


async def open_loop(spec: LoadSpec, rate: float) -> LoadResult:
    if rate <= 0:
        raise UsageError(f"rate {rate} must be > 0 requests/s")
    data = spec.request_bytes()
    loop = asyncio.get_running_loop()
    idle: list[Conn] = []
    opened = 0
    lat: list[float] = []
    errors: Counter[str] = Counter()
    t0 = loop.time()
    t_start, t_end = t0 + spec.warmup_s, t0 + spec.warmup_s + spec.duration_s
    tasks: set[asyncio.Task[None]] = set()

    async def one(scheduled: float) -> None:
        nonlocal opened
        timed = scheduled >= t_start
        if idle:
            c = idle.pop()
        elif opened < spec.max_connections:
            opened += 1
            try:
                c = await _connect(spec)
            except OSError:
                errors["connect"] += int(timed)
                return
        else:
            errors["client-saturated"] += int(timed)
            return
        try:
            status, _, _ = await c.request(data)
        except ConnectionError:
            errors["connection"] += int(timed)
            return
        if not c.closed:
            idle.append(c)
        if timed:
            if status == 200:
                lat.append(loop.time() - scheduled)
            else:
                errors[str(status)] += 1

    i = 0
    while True:
        scheduled = t0 + i / rate
        if scheduled >= t_end:
            break
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    await _close(idle)
    return _summary("open", rate, lat, errors, spec.duration_s)


def run_load(spec: LoadSpec, concurrencies: list[int], rates: list[float]) -> list[LoadResult]:
    """Check once, then each closed-loop concurrency and each open-loop rate in turn."""

    for c in concurrencies:
        if not 1 <= c <= spec.max_connections:
            raise UsageError(f"concurrency {c} must be in 1..{spec.max_connections}")
    for r in rates:
        if r <= 0:
            raise UsageError(f"rate {r} must be > 0 requests/s")

    async def main() -> list[LoadResult]:
        await check(spec)
        out = [await closed_loop(spec, c) for c in concurrencies]
        out += [await open_loop(spec, r) for r in rates]
        return out

    return asyncio.run(main())


def inputs_from_metadata(
    host: str, port: int, model: str, batch: int, seed: int = 0, protocol: str = "http"
) -> dict[str, np.ndarray]:
    """Random inputs of the model's shape (batch ``batch``, variable dims 1), from its v2 metadata."""
    import urllib.error
    import urllib.request

    if protocol != "http":
        meta = _grpc_metadata(host, port, model)
    else:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/v2/models/{model}", timeout=10) as r:
                meta = json.loads(r.read())
        except (urllib.error.URLError, OSError) as e:
            raise RunError(f"cannot read the metadata of model {model!r} at {host}:{port}: {e}") from None
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for t in meta["inputs"]:
        if t["datatype"] not in DTYPES:
            raise UsageError(f"input {t['name']!r} is {t['datatype']}: the load generator sends numeric tensors only")
        shape = [d if d > 0 else 1 for d in t["shape"]]
        if shape and t["shape"][0] == -1:
            shape[0] = batch
        out[t["name"]] = rng.random(shape).astype(DTYPES[t["datatype"]])
    return out


def _grpc_metadata(host: str, port: int, model: str) -> dict[str, Any]:
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    try:
        with grpc.insecure_channel(f"{host}:{port}") as channel:
            call = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelMetadata",
                request_serializer=pb.ModelMetadataRequest.SerializeToString,
                response_deserializer=pb.ModelMetadataResponse.FromString,
            )
            m = call(pb.ModelMetadataRequest(name=model), timeout=CONNECT_TIMEOUT_S)
    except grpc.RpcError as e:
        raise RunError(f"cannot read the metadata of model {model!r} at {host}:{port} (gRPC): {e.details()}") from None
    return {"inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in m.inputs]}


def format_table(results: list[LoadResult]) -> str:
    rows = [f"{'mode':<7}{'level':>8}{'req/s':>10}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'ok':>8}  errors"]
    for r in results:
        errs = ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())) or "-"
        rows.append(
            f"{r.mode:<7}{r.level:>8g}{r.throughput:>10.1f}{r.p50_ms:>9.2f}{r.p90_ms:>9.2f}{r.p99_ms:>9.2f}{r.ok:>8}  {errs}"
        )
    return "\n".join(rows)


def to_json(results: list[LoadResult]) -> str:
    return json.dumps([r.as_dict() for r in results], indent=2)
