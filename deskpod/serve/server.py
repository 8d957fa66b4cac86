"""The v2 inference server: a lean HTTP/1.1 server on asyncio, speaking the KServe/Triton v2 protocol.

Why not a framework: on two shared cores the per-request Python work *is* the overhead. An ``asyncio.Protocol``
that parses the request line and headers itself, answers keep-alive requests in order, and hands infer requests
to the batcher through a future callback (no task per request) does the least work per request. Every socket
sets TCP_NODELAY (without it Nagle plus delayed ACKs cap a connection at ~40 requests/s).

Endpoints (``{m}`` a model, ``[/versions/{v}]`` optional)::

    GET  /v2/health/live  /v2/health/ready  /v2            GET  /metrics (Prometheus)
    GET  /v2/models/{m}[/versions/{v}]      (metadata)     GET  .../ready  .../config  .../stats
    POST /v2/models/{m}[/versions/{v}]/infer               GET  /v2/models/stats
    POST /v2/repository/index   /v2/repository/models/{m}/load   /v2/repository/models/{m}/unload

Errors answer ``{"error": "..."}``: 400 bad input, 404 unknown model/version/path, 413 body too large,
503 overloaded or not ready, 504 timed out, 500 a failed batch. A bad request never stops the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

import numpy as np

from deskpod import __version__
from deskpod.environment.files import write_json
from deskpod.errors import DeskpodError, NotFoundError, TooLargeError, UsageError
from deskpod.serve.batcher import ModelUnavailable, Overloaded, RequestTimeout
from deskpod.serve.images import (
    RAW_IMAGE_TOP_K,
    classification_requests,
    classify,
    decoder,
    preprocess_of,
)
from deskpod.serve.metrics import prometheus_text
from deskpod.serve.protocol import DTYPES as _DTYPE
from deskpod.serve.protocol import InferRequest, ProtocolError, datatype_of, decode_request, encode_response
from deskpod.serve.registry import LoadedVersion, ModelNotFound, ModelRegistry
from deskpod.serve.repository import ModelConfig

log = logging.getLogger("deskpod.serve")
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
           413: "Payload Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable", 504: "Gateway Timeout"}  # fmt: skip
_OBJECT = np.dtype(object)
EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics", "model_configuration", "schedule_policy",
              "classification"]  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeConfig:
    repo: Path
    """The model repository (one folder per model)."""
    host: str = "127.0.0.1"
    port: int = 8000
    """0: any free port (printed on startup)."""
    models: tuple[str, ...] | None = None
    """Models to load at startup (None: every model in the repository)."""
    max_body_bytes: int = 64 << 20
    max_connections: int = 4096
    """Connections beyond this are answered 503 and closed."""
    idle_timeout_s: float = 60.0
    """A connection with no request in flight and no bytes for this long is closed (slow or vanished clients)."""
    port_file: Path | None = None
    """Where to write ``{"url", "pid", "models", "ready"}`` (atomically) once listening, when ready and on stop;
    each of `serve`'s listeners adds its address (gRPC: ``"grpc": "host:port"``)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise UsageError(f"--port {self.port} is not a TCP port (0..65535)")
        if self.max_body_bytes < 1024:
            raise UsageError(f"max_body_bytes {self.max_body_bytes} is too small (at least 1024)")


def status_of(e: BaseException) -> int:
    if isinstance(e, NotFoundError):
        return 404
    if isinstance(e, TooLargeError):
        return 413
    if isinstance(e, Overloaded | ModelUnavailable):
        return 503
    if isinstance(e, RequestTimeout):
        return 504
    return 400 if isinstance(e, UsageError) else 500


def check_inputs(config: ModelConfig, req: InferRequest) -> None:
    """The request's tensors against the model's inputs: names, datatypes, shapes, batch size."""
    if len(req.inputs) != len(config.inputs) or any(t.name not in req.inputs for t in config.inputs):
        want = {t.name for t in config.inputs}
        unknown = sorted(set(req.inputs) - want)
        if unknown:
            raise ProtocolError(f"unknown input {unknown[0]!r}; model {config.name!r} has inputs {sorted(want)}")
        raise ProtocolError(
            f"missing input {sorted(want - set(req.inputs))[0]!r}; model {config.name!r} needs {sorted(want)}"
        )
    rows = -1
    batched = config.max_batch_size > 0
    for t in config.inputs:
        a = req.inputs[t.name]
        if a.dtype != _DTYPE.get(t.datatype, _OBJECT):
            raise ProtocolError(f"input {t.name!r} is {datatype_of(a.dtype)}, model expects {t.datatype}")
        shape = a.shape
        dims = shape[1:] if batched else shape
        ok = len(shape) == len(t.dims) + batched and (not batched or 1 <= shape[0] <= config.max_batch_size)
        if ok and dims != t.dims:
            ok = all(d == w or w == -1 for d, w in zip(dims, t.dims, strict=True))
        if not ok:
            expect = ["-1" if d == -1 else str(d) for d in t.dims]
            if batched:
                expect.insert(0, f"1..{config.max_batch_size}")
            raise ProtocolError(f"input {t.name!r} has shape {list(shape)}, model expects [{', '.join(expect)}]")
        if batched:
            if rows not in (-1, shape[0]):
                raise ProtocolError(f"inputs disagree on the batch size: {rows} and {shape[0]}")
            rows = shape[0]
    if req.outputs is not None:
        have = [t.name for t in config.outputs]
        for o in req.outputs:
            if o not in have:
                raise ProtocolError(f"unknown output {o!r}; model {config.name!r} has outputs {have}")


def metadata(lv: LoadedVersion, all_versions: list[str]) -> dict[str, Any]:
    c = lv.config
    batch = [-1] if c.max_batch_size else []

    def t(s: Any) -> dict[str, Any]:
        return {"name": s.name, "datatype": s.datatype, "shape": batch + list(s.dims)}

    doc = {"name": c.name, "versions": all_versions, "platform": c.triton_config()["platform"],
           "inputs": [t(s) for s in c.inputs], "outputs": [t(s) for s in c.outputs]}  # fmt: skip
    if c.labels:
        doc["parameters"] = {"labels": list(c.labels)}
    if c.preprocess:
        doc.setdefault("parameters", {})["preprocess"] = dict(c.preprocess)
    return doc


def admit(registry: ModelRegistry, name: str, version: str | None) -> LoadedVersion:
    """The model version an infer request goes to, refused at once when its queue is full (HTTP 503, gRPC
    UNAVAILABLE). Call it before decoding the request: under overload a refusal must cost far less than service."""
    lv = registry.get(name, version)
    if lv.batcher.full():
        lv.stats.rejected += 1
        raise Overloaded(f"queue full ({lv.config.max_queue_size} requests waiting); retry later")
    return lv


def submit(
    lv: LoadedVersion, req: InferRequest, decoded: dict[str, np.ndarray] | None = None, t0: float = 0.0
) -> asyncio.Future[dict[str, np.ndarray]]:
    """Check a decoded request against the model and queue it with its timeout (the request's, else the model's);
    the future resolves to its outputs. The one path of both protocols (HTTP and gRPC) into the batcher.

    An image request queues its ``decoded`` tensors instead (``req`` already passed `check_inputs` as sent), with
    what is left of its timeout since ``t0`` (``time.perf_counter()`` at arrival). A refusal is counted."""
    if decoded is None:
        check_inputs(lv.config, req)
    timeout_us = req.timeout_us
    timeout = timeout_us / 1e6 if timeout_us else (lv.config.timeout_ms / 1000 or None)
    if decoded is not None and timeout is not None:
        timeout = max(1e-6, timeout - (time.perf_counter() - t0))
    try:
        return lv.batcher.submit(req.inputs if decoded is None else decoded, timeout)
    except Overloaded:
        lv.stats.rejected += 1
        raise


def outputs_of(
    lv: LoadedVersion, req: InferRequest, classes: dict[str, int], t0: float, fut: asyncio.Future[Any]
) -> dict[str, np.ndarray]:
    """What a request whose future is done answers with (its error, raised); counted either way. The outputs it
    asked for, each of ``classes`` as its top-k class strings (Triton's classification extension), not the tensor."""
    exc = fut.exception()
    lv.stats.record_request(time.perf_counter() - t0, exc is None)
    if exc is not None:
        raise exc
    outputs: dict[str, np.ndarray] = fut.result()
    if req.outputs is not None:
        outputs = {n: outputs[n] for n in req.outputs}
    for n, k in classes.items():
        outputs[n] = classify(outputs, n, lv.config.labels, k)
    return outputs


class App:
    """Routing and handlers; one per server, shared by every connection."""

    def __init__(self, config: ServeConfig, registry: ModelRegistry) -> None:
        self.config = config
        self.registry = registry
        self.ready = False
        self.connections = 0
        self.open: set[HttpConnection] = set()

    def close_idle(self, now: float) -> int:
        """Close connections idle for longer than the timeout; returns how many."""
        idle = [c for c in self.open if not c.busy and now - c.last_active > self.config.idle_timeout_s]
        for c in idle:
            if c.transport is not None:
                c.transport.close()
        return len(idle)

    def handle(self, conn: HttpConnection, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        path = target.split("?", 1)[0].rstrip("/")
        parts = [unquote(p) for p in path.split("/")[1:]]
        try:
            if parts[:2] == ["v2", "models"] and len(parts) >= 3 and parts[2] != "stats":
                self._model_route(conn, method, parts[2:], headers, body)
            elif method == "GET" and path == "/metrics":
                text = prometheus_text(self.registry.all_stats(), self.connections)
                conn.respond(200, text.encode(), b"text/plain; version=0.0.4", None)
            elif method == "GET":
                conn.respond_json(200, self._get(path))
            elif method == "POST" and path.startswith("/v2/repository/"):
                self._repository(conn, parts[2:], body)
            else:
                raise ModelNotFound(f"no endpoint {method} {path}")
        except Exception as e:
            conn.respond_error(e)

    def _get(self, path: str) -> Any:
        if path == "/v2/health/live":
            return {"live": True}
        if path == "/v2/health/ready":
            if not self.ready:
                raise ModelUnavailable("server is still loading its models")
            return {"ready": True}
        if path == "/v2":
            return {"name": "deskpod", "version": __version__, "extensions": EXTENSIONS}
        if path == "/v2/models/stats":
            return {"model_stats": [s.triton_json() for s in self.registry.all_stats()]}
        raise ModelNotFound(f"no endpoint GET {path}")

    def _model_route(
        self, conn: HttpConnection, method: str, parts: list[str], headers: dict[str, str], body: bytes
    ) -> None:
        name, version, rest = parts[0], None, parts[1:]
        if rest[:1] == ["versions"] and len(rest) >= 2:
            version, rest = rest[1], rest[2:]
        action = rest[0] if rest else ""
        if len(rest) > 1 or action not in ("", "ready", "config", "stats", "infer"):
            raise ModelNotFound(f"no endpoint {method} /v2/models/{'/'.join(parts)}")
        if (method == "POST") != (action == "infer"):
            raise _MethodNotAllowed(f"{method} is not allowed on {action or 'metadata'}; infer is POST, the rest GET")
        if action == "infer":
            self._infer(conn, name, version, headers, body)
            return
        lv = self.registry.get(name, version)
        if action == "":
            doc = metadata(lv, sorted(self.registry.models[name].versions, key=int))
        elif action == "ready":
            doc = {"name": name, "ready": True}
        elif action == "config":
            doc = lv.config.triton_config()
        else:
            entry = self.registry.models[name]
            vs = [lv] if version else list(entry.versions.values())
            doc = {"model_stats": [v.stats.triton_json() for v in vs]}
        conn.respond_json(200, doc)

    def _repository(self, conn: HttpConnection, parts: list[str], body: bytes) -> None:
        if parts == ["index"]:
            conn.respond_json(200, self.registry.index())
            return
        if len(parts) != 3 or parts[0] != "models" or parts[2] not in ("load", "unload"):
            raise ModelNotFound(f"no endpoint POST /v2/repository/{'/'.join(parts)}")
        name, op = parts[1], parts[2]
        coro = self.registry.load(name) if op == "load" else self.registry.unload(name)
        conn.busy = True
        task = asyncio.ensure_future(coro)
        task.add_done_callback(
            lambda t: conn.respond_error(t.exception()) if t.exception() else conn.respond_json(200, {})
        )

    def _infer(
        self, conn: HttpConnection, name: str, version: str | None, headers: dict[str, str], body: bytes
    ) -> None:
        t0 = time.perf_counter()
        lv = admit(self.registry, name, version)
        enc = headers.get("content-encoding")
        if enc in ("gzip", "deflate"):
            d = zlib.decompressobj(wbits=31 if enc == "gzip" else 15)
            try:
                body = d.decompress(body, self.config.max_body_bytes)
            except zlib.error as e:
                raise ProtocolError(f"body is not valid {enc}: {e}") from None
            if d.unconsumed_tail:
                raise TooLargeError(f"decompressed body exceeds {self.config.max_body_bytes} bytes")
        hl = headers.get("inference-header-content-length")
        try:
            header_length = None if hl is None else int(hl)
        except ValueError:
            raise ProtocolError(f"Inference-Header-Content-Length {hl!r} is not an integer") from None
        pre = preprocess_of(lv.config)
        if pre is not None and headers.get("content-type", "").startswith("image/"):
            # The body is one encoded image itself (``curl --data-binary @cat.jpg -H 'Content-Type: image/jpeg'``):
            # answered as a v2 request for that one row, each output as its top classes (JSON).
            req = InferRequest(inputs={pre.input: np.array([body], dtype=object)})
            classes = {t.name: RAW_IMAGE_TOP_K for t in lv.config.outputs}
        elif pre is None and headers.get("content-type", "").startswith("image/"):
            raise ProtocolError(
                f"model {lv.config.name!r} takes tensors, not an image body; export it with --image-input to send images"
            )
        else:
            req = decode_request(body, header_length)
            classes = classification_requests(body, header_length)
        if pre is None:
            fut = submit(lv, req)
            conn.busy = True
            fut.add_done_callback(lambda f: self._infer_done(conn, lv, req, t0, f, classes))
            return
        # An image model: check the request as sent (BYTES, one image per row), decode off the event loop,
        # then queue the decoded tensor like any request; a bad image is answered 400 on its own.
        check_inputs(lv.config, req)
        try:
            decoding = decoder().decode(req.inputs, pre)
        except Overloaded:
            lv.stats.rejected += 1
            raise
        conn.busy = True
        decoding.add_done_callback(lambda f: self._infer_decoded(conn, lv, req, t0, f, classes))

    def _infer_decoded(
        self,
        conn: HttpConnection,
        lv: LoadedVersion,
        req: InferRequest,
        t0: float,
        decoding: asyncio.Future[dict[str, np.ndarray]],
        classes: dict[str, int],
    ) -> None:
        """An image request's decoded tensors into the batcher, with what is left of its timeout."""
        try:
            fut = submit(lv, req, decoding.result(), t0)
        except Exception as e:
            conn.respond_error(e)
            return
        fut.add_done_callback(lambda f: self._infer_done(conn, lv, req, t0, f, classes))

    def _infer_done(
        self,
        conn: HttpConnection,
        lv: LoadedVersion,
        req: InferRequest,
        t0: float,
        fut: asyncio.Future[Any],
        classes: dict[str, int],
    ) -> None:
        try:
            outputs = outputs_of(lv, req, classes, t0, fut)
        except Exception as e:
            conn.respond_error(e)
            return
        body, hl = encode_response(lv.config.name, lv.version, outputs, req)
        conn.respond(200, body, b"application/octet-stream" if hl is not None else b"application/json", hl)


class _MethodNotAllowed(UsageError):
    pass


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection: parse requests, answer them in order (one in flight at a time)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False
        self.last_active = time.monotonic()
        self.keep_alive = True
        self.head: tuple[str, str, dict[str, str], int, int] | None = None  # parsed, waiting for the body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.app.connections += 1
        self.app.open.add(self)
        if self.app.connections > self.app.config.max_connections:
            self.keep_alive = False
            self.respond_error(Overloaded(f"too many connections (limit {self.app.config.max_connections})"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.app.connections -= 1
        self.app.open.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        self.buf += data
        if not self.busy:
            self._next()
        elif len(self.buf) > self.app.config.max_body_bytes and self.transport is not None:
            self.transport.pause_reading()  # a client pipelining faster than we answer waits in TCP

    def _fail(self, status: int, message: str) -> None:
        self.keep_alive = False
        self.respond(status, json.dumps({"error": message}).encode(), b"application/json", None)

    def _next(self) -> None:
        while not self.busy and self.transport is not None and not self.transport.is_closing():
            if self.head is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > 65536:
                        self._fail(431, "request headers exceed 64 KiB")
                    return
                lines = self.buf[:end].decode("latin-1").split("\r\n")
                first = lines[0].split(" ")
                if len(first) != 3 or not first[2].startswith("HTTP/1."):
                    self._fail(400, f"malformed request line {lines[0][:100]!r}")
                    return
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                if "transfer-encoding" in headers:
                    self._fail(411, "chunked bodies are not supported; send Content-Length")
                    return
                try:
                    length = int(headers.get("content-length", "0"))
                    if length < 0:
                        raise ValueError
                except ValueError:
                    self._fail(400, f"bad Content-Length {headers.get('content-length')!r}")
                    return
                if length > self.app.config.max_body_bytes:
                    self._fail(413, f"body of {length} bytes exceeds the limit of {self.app.config.max_body_bytes}")
                    return
                conn = headers.get("connection", "").lower()
                self.keep_alive = conn != "close" and (first[2] == "HTTP/1.1" or conn == "keep-alive")
                self.head = (first[0], first[1], headers, end + 4, length)
            method, target, headers, start, length = self.head
            if len(self.buf) < start + length:
                if headers.pop("expect", "").lower() == "100-continue" and self.transport is not None:
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits 1 s for this otherwise
                return
            with memoryview(self.buf) as view:
                body = bytes(view[start : start + length])  # one copy, not two
            del self.buf[: start + length]
            self.head = None
            if self.transport is not None and len(self.buf) < 65536:
                self.transport.resume_reading()
            self.app.handle(self, method, target, headers, body)

    def respond(self, status: int, body: bytes, content_type: bytes, header_length: int | None) -> None:
        self.busy = False
        self.last_active = time.monotonic()
        t = self.transport
        if t is None or t.is_closing():
            return
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
            status, REASONS.get(status, "Error").encode(), content_type, len(body))  # fmt: skip
        if header_length is not None:
            head += b"Inference-Header-Content-Length: %d\r\n" % header_length
        if not self.keep_alive:
            head += b"Connection: close\r\n"
        t.write(head + b"\r\n" + body)
        if not self.keep_alive:
            t.close()
        elif self.buf:
            asyncio.get_running_loop().call_soon(self._next)  # pipelined requests, without recursion

    def respond_json(self, status: int, doc: Any) -> None:
        self.respond(status, json.dumps(doc, separators=(",", ":")).encode(), b"application/json", None)

    def respond_error(self, e: BaseException | None) -> None:
        status = 405 if isinstance(e, _MethodNotAllowed) else status_of(e or Exception())
        if status == 500 and not isinstance(e, DeskpodError):
            log.exception("unexpected error", exc_info=e)
        self.respond_json(status, {"error": str(e) or type(e).__name__})


def port_doc(host: str, port: int, registry: ModelRegistry, *, ready: bool, stopped: bool = False) -> dict[str, Any]:
    """What the port file says: the URL to call (loopback for a wildcard bind), this pid, the models ready,
    those that failed (name -> reason), and whether loading is over."""
    rows = registry.index()
    near = "127.0.0.1" if host in ("", "0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    doc: dict[str, Any] = {
        "url": f"http://{near}:{port}",
        "pid": os.getpid(),
        "models": sorted({r["name"] for r in rows if r["state"] == "READY"}),
        "unavailable": {r["name"]: r["reason"] for r in rows if r["state"] == "UNAVAILABLE"} if ready else {},
        "ready": ready,
    }
    if stopped:
        doc["stopped"] = True
    return doc


class Listener(Protocol):
    """Another front end of the same `App` — the gRPC service (deskpod/serve/grpc_server.py) — handed to `serve`
    by whoever starts it (the CLI), so this module never imports it."""

    async def start(self, app: App) -> dict[str, str]:
        """Listen; returns what the port file gains, e.g. ``{"grpc": "127.0.0.1:8001"}`` (also printed)."""
        ...

    async def stop(self) -> None:
        """Stop listening; calls in flight may finish first."""
        ...


async def serve(
    config: ServeConfig, started: asyncio.Future[int] | None = None, listeners: Sequence[Listener] = ()
) -> int:
    """Run the server until SIGINT/SIGTERM: listen first (live; HTTP, then each of ``listeners``), load the models,
    then report ready.

    Returns the number of the signal that stopped it (the CLI exits with 128 + it, as a stopped training does)."""
    loop = asyncio.get_running_loop()
    registry = ModelRegistry(config.repo)
    app = App(config, registry)
    server = await loop.create_server(lambda: HttpConnection(app), config.host, config.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"deskpod serve: listening on http://{config.host}:{port}", flush=True)
    addresses: dict[str, str] = {}
    started_listeners: list[Listener] = []
    try:
        for listener in listeners:
            more = await listener.start(app)
            started_listeners.append(listener)
            for scheme, address in more.items():
                print(f"deskpod serve: listening on {scheme}://{address}", flush=True)
            addresses |= more
    except BaseException:
        server.close()
        for listener in started_listeners:
            await listener.stop()
        raise

    def write_port(**kw: bool) -> None:
        if config.port_file is not None:
            write_json(config.port_file, port_doc(config.host, port, registry, **kw) | addresses)

    write_port(ready=False)
    if started is not None:
        started.set_result(port)
    await registry.load_all(list(config.models) if config.models is not None else None)
    for row in registry.index():
        print(
            f"deskpod serve: model {row['name']} {row.get('version', '-')} {row['state']} {row['reason']}".rstrip(),
            flush=True,
        )
    app.ready = True
    write_port(ready=True)

    def sweep() -> None:
        app.close_idle(time.monotonic())
        loop.call_later(max(1.0, config.idle_timeout_s / 4), sweep)

    sweep()
    print("deskpod serve: ready", flush=True)
    stop = asyncio.Event()
    stopped_by: list[int] = []

    def on_signal(sig: int) -> None:
        stopped_by.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, int(sig))
    await stop.wait()
    server.close()
    for listener in started_listeners:
        await listener.stop()
    write_port(ready=False, stopped=True)  # still there, but no longer serving: say so before unloading
    await registry.close()
    return stopped_by[0]
