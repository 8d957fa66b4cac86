"""The KServe/Triton v2 protocol over gRPC: ``inference.GRPCInferenceService`` on grpcio's asyncio server.

It runs in the same process and on the same event loop as the HTTP server and shares everything behind the
protocol with it: the registry, the batcher, the statistics. An infer request goes through the same three
steps as an HTTP one — `admit` (the model, its version, a full queue refused before decoding), `check_inputs`
and `submit` (in server.py; an image model's JPEG/PNG input is decoded by images.py in between, then queued by
`submit` too) — so both protocols answer the same numbers and the same errors: a failed request ends with
the gRPC code of the HTTP status the same error gets, and the same message text::

    HTTP 400 -> INVALID_ARGUMENT   404 -> NOT_FOUND        413 -> RESOURCE_EXHAUSTED
         503 -> UNAVAILABLE        504 -> DEADLINE_EXCEEDED 500 -> INTERNAL

The messages are those of the protocol's own ``grpc_service.proto`` and ``model_config.proto``, as compiled
and shipped by ``tritonclient[grpc]`` (``tritonclient.grpc.service_pb2``, ``model_config_pb2``). Inputs may come
as typed ``contents`` or as ``raw_input_contents`` (every input or none, as Triton requires); outputs always go
as ``raw_output_contents``, as Triton sends them; an output asked for with ``parameters["classification"] = k``
comes back as Triton's classification strings (`images.classify`). Served: ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata, ModelInfer, ModelStreamInfer, ModelConfig, ModelStatistics, RepositoryIndex,
RepositoryModelLoad/Unload; any other method of the service (shared memory, trace and log settings) answers
UNIMPLEMENTED.

``ModelStreamInfer`` is Triton's bidirectional stream (``tritonclient.grpc``'s ``start_stream`` and
``async_stream_infer``, ``perf_analyzer --streaming``): each ``ModelInferRequest`` on the stream is one infer,
answered on the same stream as soon as it is done — in the order they finish, each with its request's ``id`` —
as a ``ModelStreamInferResponse`` holding the response, or the error's message in ``error_message`` (Triton's
way: a bad request does not end the stream). Many requests may be in flight on one stream; they batch like
any others. It saves the per-call cost of a unary RPC (a new HTTP/2 stream, headers, trailers).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from deskpod import __version__
from deskpod.errors import DeskpodError, UsageError
from deskpod.serve.batcher import ModelUnavailable
from deskpod.serve.images import decode_inputs, decoder_pool, preprocess_of
from deskpod.serve.protocol import DATATYPES, DTYPES, InferRequest, ProtocolError, _raw, datatype_of, raw_tensor
from deskpod.serve.registry import ModelNotFound
from deskpod.serve.server import EXTENSIONS, App, admit, check_inputs, metadata, outputs_of, status_of, submit

log = logging.getLogger("deskpod.serve")
SERVICE = "inference.GRPCInferenceService"
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
         413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
         504: grpc.StatusCode.DEADLINE_EXCEEDED, 500: grpc.StatusCode.INTERNAL}  # fmt: skip
"""The gRPC code of each HTTP status the server answers (`status_of`)."""
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}  # fmt: skip
"""The ``InferTensorContents`` field of each datatype (FP16 has none: raw contents only)."""


def code_of(e: BaseException) -> grpc.StatusCode:
    """The gRPC status code of an error: that of the HTTP status the HTTP server answers it with."""
    return CODES.get(status_of(e), grpc.StatusCode.INTERNAL)


def _parameter(p: Any) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def decode_infer_request(msg: Any) -> InferRequest:
    """A ``ModelInferRequest`` as the `InferRequest` the HTTP decoder builds; a bad one is a `ProtocolError`."""
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise ProtocolError(
            f"raw_input_contents has {len(raw)} entries for {len(msg.inputs)} inputs; use it for every input or none"
        )
    inputs: dict[str, np.ndarray] = {}
    for i, t in enumerate(msg.inputs):
        name, datatype = t.name, t.datatype
        if name in inputs:
            raise ProtocolError(f"input {name!r} appears twice")
        if datatype not in DATATYPES:
            raise ProtocolError(f"input {name!r}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
        shape = tuple(t.shape)
        if any(d < 0 for d in shape):
            raise ProtocolError(f"input {name!r}: shape must be a list of non-negative integers, got {list(shape)}")
        count = math.prod(shape)
        if raw:
            arr = raw_tensor(raw[i], shape, datatype, name, "raw_input_contents has")
        else:
            field = CONTENTS.get(datatype)
            if field is None:
                raise ProtocolError(f"input {name!r}: {datatype} has no typed contents; send it in raw_input_contents")
            values = getattr(t.contents, field)
            try:
                arr = np.array(values, dtype=object if datatype == "BYTES" else DTYPES[datatype])
            except (ValueError, TypeError, OverflowError) as e:
                raise ProtocolError(f"input {name!r}: contents are not {datatype}: {e}") from None
            if arr.size != count:
                raise ProtocolError(
                    f"input {name!r}: shape {list(shape)} needs {count} elements, contents has {arr.size}"
                )
        inputs[name] = arr.reshape(shape)
    return InferRequest(
        inputs=inputs,
        id=msg.id or None,
        parameters={k: _parameter(v) for k, v in msg.parameters.items()},
        outputs=[o.name for o in msg.outputs] or None,
    )


def encode_infer_response(model: str, version: str, request_id: str | None, outputs: dict[str, np.ndarray]) -> Any:
    """A ``ModelInferResponse`` with every output in ``raw_output_contents`` (in output order)."""
    resp = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id or "")
    for name, arr in outputs.items():
        resp.outputs.add(name=name, datatype=datatype_of(arr.dtype), shape=arr.shape)
        resp.raw_output_contents.append(_raw(arr))
    return resp


def classifications(msg: Any) -> dict[str, int]:
    """The outputs asked for as classifications (``parameters["classification"]``): name -> k."""
    out: dict[str, int] = {}
    for o in msg.outputs:
        if "classification" in o.parameters:
            k = _parameter(o.parameters["classification"])
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ProtocolError(f"output {o.name!r}: classification must be a positive integer, got {k!r}")
            out[o.name] = k
    return out


class GrpcService:
    """The handlers of ``inference.GRPCInferenceService`` over the HTTP server's `App` (registry, readiness)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.registry = app.registry

    def handlers(self) -> dict[str, Any]:
        """grpcio's method handlers of this service's methods, by method name (others: UNIMPLEMENTED)."""
        calls: dict[str, tuple[Callable[[Any, Any], Awaitable[Any]], Any]] = {
            "ServerLive": (self.server_live, pb.ServerLiveRequest),
            "ServerReady": (self.server_ready, pb.ServerReadyRequest),
            "ModelReady": (self.model_ready, pb.ModelReadyRequest),
            "ServerMetadata": (self.server_metadata, pb.ServerMetadataRequest),
            "ModelMetadata": (self.model_metadata, pb.ModelMetadataRequest),
            "ModelInfer": (self.model_infer, pb.ModelInferRequest),
            "ModelConfig": (self.model_config, pb.ModelConfigRequest),
            "ModelStatistics": (self.model_statistics, pb.ModelStatisticsRequest),
            "RepositoryIndex": (self.repository_index, pb.RepositoryIndexRequest),
            "RepositoryModelLoad": (self.repository_model_load, pb.RepositoryModelLoadRequest),
            "RepositoryModelUnload": (self.repository_model_unload, pb.RepositoryModelUnloadRequest),
        }
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._guarded(fn), request_deserializer=req.FromString, response_serializer=_serialize
            )
            for name, (fn, req) in calls.items()
        }
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self.model_stream_infer,
            request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=_serialize,
        )
        return handlers

    @staticmethod
    def _guarded(fn: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        async def call(request: Any, context: Any) -> Any:
            try:
                return await fn(request, context)
            except Exception as e:
                if isinstance(e, grpc.aio.AbortError):
                    raise
                await abort(context, e)

        return call

    async def server_live(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.app.ready)

    async def model_ready(self, request: Any, context: Any) -> Any:
        try:  # unknown, unavailable and unloaded all read as not ready, as HTTP's 404/503 do to its clients
            self.registry.get(request.name, request.version or None)
        except (ModelNotFound, ModelUnavailable):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def server_metadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="deskpod", version=__version__, extensions=EXTENSIONS)

    async def model_metadata(self, request: Any, context: Any) -> Any:
        lv = self.registry.get(request.name, request.version or None)
        doc = metadata(lv, sorted(self.registry.models[request.name].versions, key=int))
        return pb.ModelMetadataResponse(
            name=doc["name"],
            versions=doc["versions"],
            platform=doc["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in doc["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in doc["outputs"]],
        )

    def _start(self, request: Any) -> tuple[Any, InferRequest, dict[str, int], asyncio.Future[Any] | None]:
        """Admit and decode one ModelInferRequest and queue it: (model, request, classifications, future). An image
        model's request is not queued yet (future None): its images are decoded off the loop first."""
        lv = admit(self.registry, request.model_name, request.model_version or None)
        req = decode_infer_request(request)
        classes = classifications(request)
        return lv, req, classes, submit(lv, req) if preprocess_of(lv.config) is None else None

    async def _decoded(self, lv: Any, req: InferRequest, t0: float) -> asyncio.Future[Any]:
        """An image model's request queued once its images are decoded (on the decoder's threads)."""
        pre = preprocess_of(lv.config)
        assert pre is not None
        check_inputs(lv.config, req)
        inputs = await asyncio.get_running_loop().run_in_executor(decoder_pool(), decode_inputs, req.inputs, pre)
        return submit(lv, req, inputs, t0)

    @staticmethod
    def _finish(lv: Any, req: InferRequest, classes: dict[str, int], t0: float, fut: asyncio.Future[Any]) -> Any:
        """The ModelInferResponse of a request whose future is done (or its error, raised); counted either way."""
        return encode_infer_response(lv.config.name, lv.version, req.id, outputs_of(lv, req, classes, t0, fut))

    async def model_infer(self, request: Any, context: Any) -> Any:
        t0 = time.perf_counter()
        lv, req, classes, fut = self._start(request)
        if fut is None:
            fut = await self._decoded(lv, req, t0)
        with contextlib.suppress(Exception):  # _finish counts it and raises it
            await fut
        return self._finish(lv, req, classes, t0, fut)

    async def model_stream_infer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Triton's ModelStreamInfer: every request on the stream answered on it as soon as it is done.

        A request is queued as it is read (no task of its own unless it carries images), and its answer goes
        into ``answers`` from its future's callback; this generator yields them in the order they come."""
        loop = asyncio.get_running_loop()
        answers: asyncio.Queue[Any] = asyncio.Queue()
        state = {"open": 0, "reading": True}

        def answer(build: Callable[[], Any]) -> None:
            try:
                answers.put_nowait(pb.ModelStreamInferResponse(infer_response=build()))
            except Exception as e:
                if status_of(e) == 500 and not isinstance(e, DeskpodError):
                    log.exception("unexpected error", exc_info=e)
                answers.put_nowait(pb.ModelStreamInferResponse(error_message=str(e) or type(e).__name__))

        def finished(lv: Any, req: InferRequest, classes: dict[str, int], t0: float, fut: asyncio.Future[Any]) -> None:
            answer(functools.partial(self._finish, lv, req, classes, t0, fut))

        def decoded(lv: Any, req: InferRequest, classes: dict[str, int], t0: float, task: asyncio.Task[Any]) -> None:
            e = task.exception()
            if e is not None:
                answer(functools.partial(_raise, e))
            else:
                task.result().add_done_callback(functools.partial(finished, lv, req, classes, t0))

        async def read() -> None:
            try:
                async for msg in requests:
                    state["open"] += 1
                    t0 = time.perf_counter()
                    try:
                        lv, req, classes, fut = self._start(msg)
                    except Exception as e:
                        answer(functools.partial(_raise, e))
                        continue
                    if fut is not None:
                        fut.add_done_callback(functools.partial(finished, lv, req, classes, t0))
                    else:
                        task = loop.create_task(self._decoded(lv, req, t0))
                        task.add_done_callback(functools.partial(decoded, lv, req, classes, t0))
            finally:
                state["reading"] = False
                answers.put_nowait(None)

        reader = loop.create_task(read())
        try:
            while state["reading"] or state["open"]:
                item = await answers.get()
                if item is None:
                    continue
                state["open"] -= 1
                yield item
            failed = reader.exception() if reader.done() and not reader.cancelled() else None
            if failed is not None:
                raise failed  # the stream itself failed, not one request on it
        finally:
            reader.cancel()

    async def model_config(self, request: Any, context: Any) -> Any:
        lv = self.registry.get(request.name, request.version or None)
        config = json_format.ParseDict(lv.config.triton_config(), mc.ModelConfig(), ignore_unknown_fields=True)
        return pb.ModelConfigResponse(config=config)

    async def model_statistics(self, request: Any, context: Any) -> Any:
        if request.name:
            lv = self.registry.get(request.name, request.version or None)
            entry = self.registry.models[request.name]
            stats = [lv.stats] if request.version else [v.stats for v in entry.versions.values()]
        else:
            stats = self.registry.all_stats()
        doc = {"model_stats": [s.triton_json() for s in stats]}
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    async def repository_index(self, request: Any, context: Any) -> Any:
        rows = self.registry.index()
        if request.ready:
            rows = [r for r in rows if r["state"] == "READY"]
        models = [
            pb.RepositoryIndexResponse.ModelIndex(
                name=r["name"], version=r.get("version", ""), state=r["state"], reason=r["reason"]
            )
            for r in rows
        ]
        return pb.RepositoryIndexResponse(models=models)

    async def repository_model_load(self, request: Any, context: Any) -> Any:
        await self.registry.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(self, request: Any, context: Any) -> Any:
        await self.registry.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def _raise(e: BaseException) -> NoReturn:
    raise e


def _serialize(msg: Any) -> bytes:
    return msg.SerializeToString()  # type: ignore[no-any-return]


async def abort(context: Any, e: BaseException) -> NoReturn:
    """End the call with the gRPC code and the message the HTTP server answers this error with."""
    if status_of(e) == 500 and not isinstance(e, DeskpodError):
        log.exception("unexpected error", exc_info=e)
    await context.abort(code_of(e), str(e) or type(e).__name__)
    raise AssertionError("unreachable: context.abort raises")


class GrpcListener:
    """The gRPC service as one of `serve`'s listeners: ``deskpod serve REPO --grpc-port P``."""

    def __init__(self, host: str, port: int, max_message_bytes: int) -> None:
        if not 0 <= port < 65536:
            raise UsageError(f"--grpc-port {port} is not a TCP port (0..65535)")
        self.host, self.port, self.max_message_bytes = host, port, max_message_bytes
        self.server: Any = None

    async def start(self, app: App) -> dict[str, str]:
        self.server, port = await start_grpc(app, self.host, self.port, self.max_message_bytes)
        near = (
            "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else f"[{self.host}]" if ":" in self.host else self.host
        )
        return {"grpc": f"{near}:{port}"}  # the address a client dials, as the port file's "url" is

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(1.0)  # calls in flight get a second to finish, then are cancelled
            self.server = None


async def start_grpc(app: App, host: str, port: int, max_message_bytes: int) -> tuple[Any, int]:
    """Start the gRPC server on ``host:port`` (0: any free port) on the running loop; returns it and its port."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),  # a port already taken is an error, not a silently shared socket
        ]
    )
    handlers = GrpcService(app).handlers()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise UsageError(f"--grpc-port {port}: cannot listen on {address} ({e})") from None
    if not bound:
        raise UsageError(f"--grpc-port {port}: cannot listen on {address} (in use?)")
    await server.start()
    return server, bound
