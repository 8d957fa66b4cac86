"""``/sessions/<id>/``: the pod forwards a session job's URLs (HTTP and WebSocket) to its server, for its owner only.

A session (`deskpod.jobs.kinds.session`: a notebook, a shell, TensorBoard) serves on a Unix socket in its job folder.
Here the pod signs the caller in as its pages do (the dashboard's cookie, a bearer token, or the pod's own Unix
socket, where the kernel says who is calling) and forwards the request when the caller owns the job. Anyone else —
another user, an admin too — gets the 404 of a job that does not exist: a session runs code as its owner, and a
forwarded request is that owner's. Anonymous browsers get the sign-in page, then come back. The pod's own cookie and
``Authorization`` header are not forwarded: the session's code never sees the caller's pod credentials.

The job's folder is its owner's, so its owner could put another socket (or a link to one) where the session's should
be; every connection checks the kernel's word on who listens (``SO_PEERCRED``) against the job's account, so a
request never reaches another account's server (or the pod's own socket) through a planted link.

A session on a cluster node (the Slurm backend) is reached at the address it wrote in its folder instead, with the
secret the pod wrote there at submission (`deskpod.jobs.kinds.session.read_endpoint`), which its server asks of
every request: the pod adds it (`SECRET_HEADER`, dropped from what the browser sends); the browser never holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import socket
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpcore
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect, WebSocketState

from deskpod.errors import DeskpodError, NotFoundError, UnavailableError
from deskpod.jobs.api import PEER, status_of
from deskpod.jobs.kinds import KINDS
from deskpod.jobs.kinds.session import PREFIX, SECRET_HEADER, Endpoint, listener_uid, read_endpoint, socket_path
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord, User
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.session import COOKIE, SignInRequired, login_url, viewer

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host"})  # fmt: skip
"""Headers of one connection, not of the request (RFC 9110 7.6.1); ``host`` is set again from the request's."""
WS_HEADERS = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                        "sec-websocket-protocol", "sec-websocket-accept", "origin"})  # fmt: skip
"""What the WebSocket client library writes itself on the way to the session."""
CONNECT_S = 10.0
"""Seconds to connect to a session's socket and get its answer's head (a kernel's start answers within this)."""


class SessionNotReady(UnavailableError):
    """The session is queued or starting, or its server does not answer yet (HTTP 503: try again)."""


async def caller(connection: Request | WebSocket, web: Web) -> User:
    """Who is asking: on the pod's Unix socket the kernel says (when no cookie or token is sent); else the
    dashboard's session cookie or a bearer token (`deskpod.web.session.viewer`)."""
    peer = connection.scope.get(PEER)
    accounts = web.pod.accounts
    if peer is not None and accounts is not None and on_socket(connection):
        return accounts.user_of(peer)
    return (await viewer(cast(Request, connection))).user


def on_socket(connection: Request | WebSocket) -> bool:
    """Whether the caller is on the pod's Unix socket and sends no credentials: the kernel says who it is."""
    return (
        connection.scope.get(PEER) is not None
        and not connection.headers.get("authorization")
        and not connection.cookies.get(COOKIE)
    )


def session_job(web: Web, user: User, job_id: str) -> JobRecord:
    """The caller's own session job; anything else (another's, an admin's view of it, not a session) is a 404."""
    try:
        job = web.pod.visible_job(user, job_id)
    except NotFoundError:
        job = None
    if job is None or job.user != user.name or not KINDS[job.spec.kind].SESSION:
        raise NotFoundError(f"no session {job_id!r:.40} of yours (`deskpod jobs` lists your jobs)")
    if job.state in (JobState.QUEUED, JobState.STARTING, JobState.BUILDING):
        raise SessionNotReady(f"session {job.id} is {job.state.value}: {job.reason or 'waiting'}; it opens here when"
                              " it runs")  # fmt: skip
    if job.state is not JobState.RUNNING:
        raise NotFoundError(f"session {job.id} has ended ({job.state.value}); start a new one")
    return job


def account_uid(web: Web, user: User) -> int:
    """The uid the session's server runs as: the user's account on a pod with accounts, else the pod's own."""
    isolation = web.pod.isolation
    account = isolation.account(user) if isolation is not None else None
    return account.uid if account is not None else os.getuid()


def check_listener(sock: socket.socket, uid: int, where: Path) -> None:
    """Refuse a socket whose listening process is not the session's account (a planted link, a stale socket)."""
    if listener_uid(sock) != uid:
        raise SessionNotReady(f"the session's socket {where} is not served by its own account; it answers when the "
                              "session's server listens there again")  # fmt: skip


class CheckedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's own backend, refusing a Unix socket whose listener is not ``uid`` (`check_listener`)."""

    def __init__(self, uid: int, where: Path) -> None:
        self.uid, self.where, self.inner = uid, where, httpcore.AnyIOBackend()

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:  # fmt: skip
        stream = await self.inner.connect_unix_socket(path, timeout, socket_options)
        try:
            check_listener(stream.get_extra_info("socket"), self.uid, self.where)
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise RuntimeError("a session is reached on its Unix socket only")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where a session's requests go: a pool of connections to it, the URL prefix they name, and what the pod adds."""

    pool: httpcore.AsyncConnectionPool
    origin: str
    """``http://session`` for its Unix socket (the pool's), ``http://host:port`` on a cluster node."""
    endpoint: Endpoint | None
    """A session on a cluster node (its address and secret); None for one on the job folder's socket."""

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The session's secret, for one on a cluster node (never from or to the browser)."""
        return [] if self.endpoint is None else [(SECRET_HEADER, self.endpoint.secret)]


class Upstreams:
    """One connection pool per running session (kept while its socket file, or its node's address and secret, stay
    the same), so a page's many requests reuse their connections."""

    def __init__(self) -> None:
        self.pools: dict[int, tuple[object, Upstream]] = {}

    async def upstream(self, job: JobRecord, folder: Path, uid: int, *, on_nodes: bool) -> Upstream:
        endpoint = read_endpoint(folder) if on_nodes else None
        key: object
        if endpoint is not None:
            key = endpoint
        else:
            path = socket_path(folder)
            try:
                st = path.lstat()
            except OSError:
                raise SessionNotReady(f"session {job.id} is starting; its server does not listen yet") from None
            key = (st.st_ino, st.st_dev, uid)
        held = self.pools.get(job.id)
        if held is not None and held[0] == key:
            return held[1]
        if held is not None:
            await held[1].pool.aclose()
        for other in [j for j in self.pools if j != job.id and len(self.pools) > 256]:
            await self.pools.pop(other)[1].pool.aclose()
        if endpoint is not None:
            pool = httpcore.AsyncConnectionPool(max_connections=32, keepalive_expiry=30.0)
            made = Upstream(pool, f"http://{endpoint.host}:{endpoint.port}", endpoint)
        else:
            pool = httpcore.AsyncConnectionPool(uds=str(path), network_backend=CheckedBackend(uid, path),
                                                max_connections=32, keepalive_expiry=30.0)  # fmt: skip
            made = Upstream(pool, "http://session", None)
        self.pools[job.id] = (key, made)
        return made


def on_nodes(web: Web) -> bool:
    """Whether the pod's sessions run on cluster nodes (its executor is not the local one), where they listen on a
    node's address. A pod's own sessions are reached on their socket alone, whatever files their folder holds: its
    owner could write an address there, and the pod would be their way to it."""
    return web.pod.executor.name != "local"


def forwarded_headers(
    headers: Iterable[tuple[str, str]], *, drop: frozenset[str] = HOP_BY_HOP
) -> list[tuple[str, str]]:
    """The request's headers for the session: without the connection's, the pod's credentials (``Authorization``,
    the pod's session cookie) and ``drop``."""
    out = []
    for name, value in headers:
        low = name.lower()
        if low in drop or low in ("authorization", SECRET_HEADER.lower()):
            continue
        if low == "cookie":
            kept = [c for c in value.split(";") if c.strip() and c.strip().split("=", 1)[0] != COOKIE]
            if not kept:
                continue
            value = ";".join(kept).strip()
        out.append((name, value))
    return out


KERNEL_STARTS = (("POST", re.compile(r"api/kernels/?")), ("POST", re.compile(r"api/sessions/?")),
                 ("PATCH", re.compile(r"api/sessions/[^/]+")))  # fmt: skip
"""The requests with which JupyterLab starts (or swaps) a kernel: a released session asks for its devices first."""


async def devices_back(web: Web, job: JobRecord, method: str, path: str) -> JobRecord:
    """Before a kernel starts in a session that gave its devices back when idle (`deskpod.jobs.culler`): ask for
    the same devices and wait for them up to `CONNECT_S`; `SessionNotReady` saying who holds them after that."""
    if not job.released or not any(m == method and r.fullmatch(path) for m, r in KERNEL_STARTS):
        return job
    pod = web.pod
    deadline = asyncio.get_running_loop().time() + CONNECT_S
    while True:
        job = await run_in_threadpool(pod.want_devices, job)  # the store's lock may be the scheduler's now
        if not job.released or job.state is not JobState.RUNNING:
            return job
        if asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(0.1)
    mine = set(job.released)
    holders = [f"job {j.id} ({j.user})" for j in pod.store.jobs(states=[JobState.STARTING, JobState.BUILDING,
                                                                       JobState.RUNNING]) if mine & set(j.assigned)]  # fmt: skip
    raise SessionNotReady(
        f"session {job.id} gave devices {','.join(map(str, job.released))} back when idle; "
        f"{', '.join(holders) or 'another job'} holds them now: the kernel starts when they are free (try again)"
    )


def waiting(request: Request, web: Web, job_id: str, why: str) -> Response:
    """503 for a session that is not there yet: a page that reloads itself for a browser, JSON for a script."""
    if request.method != "GET" or render.wants_json(request) or "text/html" not in request.headers.get("accept", ""):
        return JSONResponse({"error": why}, status_code=503, headers={"Retry-After": "1"})
    return render.page(request, "session_wait.html", {"error": why, "job": job_id}, None, title="Starting",
                       status=503)  # fmt: skip


def register(app: FastAPI, web: Web) -> None:
    """The ``/sessions`` app (mounted at `PREFIX`): every method and the WebSocket of ``/<id>/<path>``."""
    upstreams = Upstreams()
    app.state.upstreams = upstreams
    general = app.exception_handlers.get(DeskpodError)

    @app.exception_handler(DeskpodError)
    async def refused(request: Request, e: DeskpodError) -> Response:
        """On the pod's Unix socket (no cookie, no token) the caller is known without signing in: its error as
        it is (503 while a session starts), not the sign-in page the dashboard's handler sends the anonymous."""
        if on_socket(request):
            return JSONResponse({"error": str(e)}, status_code=status_of(e))
        answer = general(request, e) if general is not None else None
        return cast(Response, await answer if inspect.isawaitable(answer) else answer)

    @app.api_route("/{job_id}", methods=["GET", "HEAD"])
    async def bare(job_id: str) -> Response:
        return RedirectResponse(f"{PREFIX}/{job_id}/", status_code=307)

    @app.api_route("/{job_id}/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
    async def forward(request: Request, job_id: str, path: str) -> Response:
        try:
            user = await caller(request, web)
        except SignInRequired:
            if request.method == "GET" and not render.wants_json(request):
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(login_url(target), status_code=303)
            raise
        try:
            job = session_job(web, user, job_id)
            folder = web.pod.job_folder(job)
            upstream = await upstreams.upstream(job, folder, account_uid(web, user), on_nodes=on_nodes(web))
            job = await devices_back(web, job, request.method, path)
        except SessionNotReady as e:
            return waiting(request, web, job_id, str(e))
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = [("Host", request.headers.get("host", "localhost")), *forwarded_headers(request.headers.items()),
                   *upstream.headers]  # fmt: skip
        if request.headers.get("content-length") is None and request.method in ("POST", "PUT", "PATCH"):
            headers.append(("Transfer-Encoding", "chunked"))
        elif request.headers.get("content-length") is not None:
            headers = [h for h in headers if h[0].lower() != "content-length"]
            headers.append(("Content-Length", request.headers["content-length"]))
        upstream_request = httpcore.Request(
            request.method, f"{upstream.origin}{target}", headers=headers, content=request.stream(),
            extensions={"timeout": {"connect": CONNECT_S, "read": None, "write": CONNECT_S, "pool": CONNECT_S}},
        )  # fmt: skip
        try:
            answer = await upstream.pool.handle_async_request(upstream_request)
        except SessionNotReady as e:
            return waiting(request, web, job_id, str(e))
        except (httpcore.ConnectError, httpcore.RemoteProtocolError, FileNotFoundError, ConnectionError) as e:
            why = f"session {job.id} does not answer yet ({type(e).__name__}); try again"
            return waiting(request, web, job_id, why)
        head = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in answer.headers]
        kept = {k: v for k, v in head if k.lower() not in HOP_BY_HOP and k.lower() != "set-cookie"}
        body = cast(AsyncIterator[bytes], answer.stream)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in body:
                    yield chunk
            finally:
                await answer.aclose()

        response = StreamingResponse(relay(), status_code=answer.status, headers=kept)
        for k, v in head:
            if k.lower() == "set-cookie":
                response.raw_headers.append((b"set-cookie", v.encode("latin-1")))
        return response

    @app.websocket("/{job_id}/{path:path}")
    async def forward_ws(websocket: WebSocket, job_id: str, path: str) -> None:
        import websockets
        from websockets.asyncio.client import connect

        try:
            user = await caller(websocket, web)
            job = session_job(web, user, job_id)
        except DeskpodError:  # a closed door looks the same for anonymous, another user and no such session
            await websocket.close(code=4404)
            return
        folder = web.pod.job_folder(job)
        endpoint = read_endpoint(folder) if on_nodes(web) else None
        where = socket_path(folder)
        target = websocket.url.path + (f"?{websocket.url.query}" if websocket.url.query else "")
        host = websocket.headers.get("host", "localhost")
        # The browser's Host goes on (its Origin is checked against it); the connection is made here, to the
        # session's socket or its node.
        family = socket.AF_UNIX if endpoint is None else socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        protocols: Any = [
            p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
        ]
        secret = [] if endpoint is None else [(SECRET_HEADER, endpoint.secret)]
        try:
            sock.setblocking(False)
            address: Any = (endpoint.host, endpoint.port) if endpoint else str(where)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, address), CONNECT_S)
            if endpoint is None:
                check_listener(sock, account_uid(web, user), where)
            upstream = await connect(
                uri=f"ws://{host}{target}", sock=sock, origin=websocket.headers.get("origin"),  # type: ignore[arg-type]
                subprotocols=protocols or None,
                additional_headers=[*forwarded_headers(websocket.headers.items(), drop=HOP_BY_HOP | WS_HEADERS),
                                    *secret],
                compression=None, max_size=None, ping_interval=None, user_agent_header=None, open_timeout=CONNECT_S,
            )  # fmt: skip
        except (OSError, TimeoutError, DeskpodError, websockets.InvalidHandshake):
            sock.close()
            await websocket.close(code=1013)  # try again later
            return
        async with upstream:
            await websocket.accept(subprotocol=upstream.subprotocol)

            async def down() -> None:  # session -> browser
                async for message in upstream:
                    if isinstance(message, str):
                        await websocket.send_text(message)
                    else:
                        await websocket.send_bytes(message)

            async def up() -> None:  # browser -> session
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        return
                    if message.get("text") is not None:
                        await upstream.send(message["text"])
                    elif message.get("bytes") is not None:
                        await upstream.send(message["bytes"])

            tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(up())]
            with contextlib.suppress(websockets.ConnectionClosed, WebSocketDisconnect, RuntimeError):
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*tasks, return_exceptions=True)
        if websocket.client_state is WebSocketState.CONNECTED:
            with contextlib.suppress(RuntimeError):
                await websocket.close(code=upstream.close_code or 1000)
