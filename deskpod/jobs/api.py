"""The pod service's HTTP API (FastAPI); its OpenAPI document is served at ``/openapi.json``.

Every endpoint except ``/health`` needs ``Authorization: Bearer <token>`` — or, on the pod's Unix
socket, nothing: there the kernel says who the caller is (``SO_PEERCRED``; `deskpod.jobs.identity`). Every error, whatever
raised it (a bad spec, an unknown route, a query parameter of the wrong type, a bug), answers
``{"error": "..."}`` with a 4xx status for bad input and 5xx for our failures. Bodies are read
with a size cap before any parsing, and specs are validated by `deskpod.jobs.spec` — the schema in
the OpenAPI document describes them, `parse_spec` enforces them.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from deskpod import __version__
from deskpod.errors import (
    AccessError,
    AuthError,
    ConfigError,
    ConflictError,
    DeskpodError,
    NotFoundError,
    TooLargeError,
    UnavailableError,
    UsageError,
)
from deskpod.jobs import auth, metrics
from deskpod.jobs.doctor import MAX_AGE_S
from deskpod.jobs.pod import WATCH_MAX_S, Pod
from deskpod.jobs.spec import MAX_RUNTIME_S, SPEC_SCHEMA
from deskpod.jobs.states import JobState
from deskpod.jobs.store import User
from deskpod.serve import protocol

MAX_BODY = 4 << 20
"""Bytes; a spec is a few hundred, one carrying its environment's lock file up to a few MiB. Larger
bodies get 413 before they are parsed."""
MAX_DEPTH = 32
"""Arrays and objects nested in a body at most; a spec nests six (a train table's arrays in tables). Deeper JSON
is refused before anything walks it (the parser itself stops at Python's recursion limit, near 1,000)."""
MAX_LOG_CHUNK = 1 << 20
ERROR: dict[str, Any] = {
    "description": "the request was refused; `error` says why in one line",
    "content": {"application/json": {"schema": {"type": "object", "required": ["error"],
                                                "properties": {"error": {"type": "string"}}}}},
}  # fmt: skip
"""An error answer, for the OpenAPI document's responses."""

WHY: dict[int, str] = {
    400: "bad input: a field, value or body that is not valid; `error` names it and says what is valid",
    401: "no token, a malformed `Authorization` header, or a token the pod does not know",
    403: "a caller without the right to this (not an admin, another user's jobs, a priority above the pod's limit),"
    " or on the Unix socket an OS account that is no deskpod user",
    404: "no such job or user (another user's job looks like none)",
    409: "valid, but the pod's current state refuses it",
    413: f"a request body over {MAX_BODY} bytes",
    422: "a query parameter of the wrong type or outside its range",
    500: "the pod service failed while doing valid work (a bug if it says `internal error`)",
}
"""What each error status of the API means, for the OpenAPI document."""
STATES = [s.value for s in JobState]
SUBMIT_CONFLICT = (
    "a valid spec this box cannot take: it can never fit the devices, its workdir or serve run is not here, it needs"
    " a cluster (nodes), or an interpreter, container runtime, OS account or extra (serve) this box lacks"
)
LOG_HEADERS: dict[str, Any] = {
    "X-Deskpod-Offset": {"required": True, "description": "the offset to ask for next",
                         "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "X-Deskpod-State": {"required": True, "description": "the job's state", "schema": {"type": "string", "enum": STATES}},
}  # fmt: skip


JOB_OPERATIONS = (("get", "/v1/jobs/{job_id}"), ("get", "/v1/jobs/{job_id}/log"), ("post", "/v1/jobs/{job_id}/cancel"),
                  ("post", "/v1/jobs/{job_id}/requeue"), ("post", "/v1/jobs/{job_id}/extend"))  # fmt: skip
USER_OPERATIONS = (("post", "/v1/users/{name}/tokens"), ("post", "/v1/users/{name}/revoke"))


def links(parameter: str, field: str, operations: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """OpenAPI links from an answer that made something to the operations on it: ``parameter`` of each is the
    answer's ``field`` (a client, or a fuzzer, follows them from a new job to its log, cancel and requeue)."""
    return {
        f"{method}{path.replace('/', '_').replace('{', '').replace('}', '')}": {
            "operationRef": f"#/paths/{path.replace('~', '~0').replace('/', '~1')}/{method}",
            "parameters": {parameter: f"$response.body#/{field}"},
        }
        for method, path in operations
    }


def errors(*codes: int, **why: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of the given error statuses, each with the error body; ``why`` (``s409=...``)
    says what a status means for this operation. 401 and 500 are added: every operation with a caller has them."""
    answers: dict[int | str, dict[str, Any]] = {}
    for code in sorted({*codes, 401, 500}):
        answers[code] = {**ERROR, "description": why.get(f"s{code}", WHY[code])}
    return answers


def status_of(e: DeskpodError) -> int:
    """The HTTP status of an error deskpod raised on purpose (4xx bad input, 5xx our failures)."""
    for cls, code in (
        (AuthError, 401),
        (AccessError, 403),
        (NotFoundError, 404),
        (ConflictError, 409),
        (TooLargeError, 413),
        (UsageError, 400),
        (UnavailableError, 503),
    ):
        if isinstance(e, cls):
            return code
    return 500


class ServerTiming:
    """Adds ``Server-Timing: app;dur=<ms>`` to every answer: the time until its headers were ready,
    which for a JSON answer or a page is the whole of its server work (the benchmarks read it)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def timed(message: Any) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - t0) * 1000
                message["headers"] = [*message.get("headers", []), (b"server-timing", f"app;dur={ms:.2f}".encode())]
            await send(message)

        await self.app(scope, receive, timed)


PEER = "deskpod.peer"
"""The scope key under which the daemon's HTTP protocol puts a Unix-socket caller's `identity.Peer`."""


BEARER = HTTPBearer(
    auto_error=False,
    description="a deskpod token (`deskpod user add NAME` makes one); not needed on the pod's Unix socket",
)
"""The document's security scheme; `current_user` reads the header itself (its messages, the Unix socket)."""


def current_user(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None) -> User:
    """The caller: from its bearer token, or on the Unix socket from the kernel (every endpoint but /health)."""
    pod: Pod = request.app.state.pod
    authorization = request.headers.get("authorization")
    peer = request.scope.get(PEER)
    if peer is not None and not authorization and pod.accounts is not None:
        return pod.accounts.user_of(peer)
    return auth.authenticate(pod.store, authorization, pod.trust)


Caller = Annotated[User, Depends(current_user)]


def create_app(
    pod: Pod, *, on_shutdown: Callable[[bool], None], extensions: Sequence[Callable[[FastAPI, Pod], None]] = ()
) -> FastAPI:
    """The API over one `Pod`; ``on_shutdown(stop_jobs)`` is what ``POST /v1/shutdown`` calls.

    Each of ``extensions`` is called with the app and the pod to add its own routes (the dashboard
    of `deskpod.web`): whoever starts the daemon hands them in, so this package never imports them.
    """
    app = FastAPI(title="deskpod pod service", version=__version__, description=__doc__)
    app.add_middleware(ServerTiming)
    store = pod.store
    app.state.pod = pod

    @app.exception_handler(DeskpodError)
    async def _deskpod_error(_: Request, e: DeskpodError) -> JSONResponse:
        return JSONResponse({"error": str(e)}, status_code=status_of(e))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        parts = []
        for err in e.errors()[:3]:
            where = ".".join(str(x) for x in err.get("loc", ()))
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return JSONResponse({"error": "bad request: " + "; ".join(parts)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        headers = {**(e.headers or {}), **({"Allow": allowed_methods(request)} if e.status_code == 405 else {})}
        return JSONResponse({"error": str(e.detail)}, status_code=e.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"error": f"internal error: {type(e).__name__}: {e}"}, status_code=500)

    spec_schema = spec_document(environment=pod.isolation is not None, stack=pod.stacks is not None)

    @app.get("/health", tags=["service"])
    def health() -> dict[str, str]:
        """Liveness, and the pod's name (what a fleet's assertions for it name); the only endpoint without a token."""
        return {"status": "ok", "version": __version__, "name": pod.config.name}

    @app.get("/v1/whoami", tags=["users"], responses=errors(403))
    def whoami(user: Caller) -> dict[str, Any]:
        """Who the caller is here: ``fleet`` is the trusted fleet whose assertion it came with (else null)."""
        return {"name": user.name, "admin": user.admin, "runs_as": runs_as(pod, user), "fleet": user.fleet}

    @app.post(
        "/v1/jobs",
        status_code=201,
        tags=["jobs"],
        responses={
            201: {"description": "the job, queued", "links": links("job_id", "id", JOB_OPERATIONS)},
            **errors(400, 403, 409, 413, 422, s409=SUBMIT_CONFLICT),
        },
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": spec_schema}}}},
    )
    async def submit(
        request: Request,
        user: Caller,
        lease: Annotated[float | None, Query(ge=1, le=3600, description="a fleet's forwarded job: seconds it may "
                                             "start in unless the fleet renews it (POST /v1/leases)")] = None,
        key: Annotated[str | None, Query(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._:-]+$",
                                         description="a fleet's forward: its idempotency key; the job may start at "
                                         "once, and a forward with the same key gets the same job")] = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Queue a job; refused with 400 when the spec is bad, 409 when this box cannot take a valid one (it can
        never fit, its workdir or serve run is not here, it needs a cluster or environments this pod lacks)."""
        data = await json_body(request)
        job = await run_in_threadpool(lambda: pod.submit(user, data, lease_s=lease, key=key))
        return job.to_json()

    @app.post("/v1/leases/lookup", tags=["jobs"], responses=errors(400, 403, 413), openapi_extra=KEYS_BODY)
    async def lookup(request: Request, user: Caller) -> dict[str, Any]:
        """A fleet (acting as itself) asks which of its forwards arrived, by their keys: ``jobs`` maps each key
        found to its job; a key not found is closed, and a forward with it that arrives later is refused (409)."""
        keys = forward_keys(await json_body(request))
        found = await run_in_threadpool(pod.lookup, user, keys)
        return {"jobs": {k: {f: v for f, v in j.to_json().items() if f != "spec"} for k, j in found.items()}}

    @app.post("/v1/leases", tags=["jobs"], responses=errors(400, 403, 413),
              openapi_extra=held_jobs_body("seconds", 1, 3600))  # fmt: skip
    async def renew(request: Request, user: Caller) -> dict[str, Any]:
        """A fleet (acting as itself) renews the leases of the queued jobs it forwarded here for ``seconds``, and
        reads the state of every listed job it holds, in one request (`deskpod.jobs.trust`)."""
        ids, seconds = held_jobs(await json_body(request), "seconds", 1, 3600)
        held = await run_in_threadpool(pod.renew, user, ids, seconds)
        return {"jobs": [{k: v for k, v in j.to_json().items() if k != "spec"} for j in held]}

    @app.post("/v1/leases/watch", tags=["jobs"], responses=errors(400, 403, 413),
              openapi_extra=held_jobs_body("wait", 0, WATCH_MAX_S))  # fmt: skip
    async def watch(request: Request, user: Caller) -> dict[str, Any]:
        """A fleet (acting as itself) waits up to ``wait`` seconds for one of the listed jobs it forwarded that has
        not started yet to run or end here, then reads the state of every listed job it holds; renews nothing."""
        ids, wait = held_jobs(await json_body(request), "wait", 0, WATCH_MAX_S)
        held = await run_in_threadpool(pod.watch, user, ids, wait)
        return {"jobs": [{k: v for k, v in j.to_json().items() if k != "spec"} for j in held]}

    @app.get("/v1/jobs", tags=["jobs"], responses=errors(400, 403, 422))
    def list_jobs(
        user: Caller,
        state: Annotated[str | None, Query(max_length=32, json_schema_extra={"enum": STATES})] = None,
        limit: Annotated[int, Query(ge=1, le=100000)] = 1000,
        owner: Annotated[str | None, Query(alias="user", max_length=64)] = None,
        name: Annotated[str | None, Query(max_length=64)] = None,
        before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    ) -> dict[str, Any]:
        """Your jobs (every job for an admin, or one user's with ``user``), newest first; ``name`` keeps
        those whose name contains it. Pages: pass the answer's ``next`` as ``before`` for the next one."""
        states = None if state is None else [parse_state(state)]
        jobs = store.jobs(user=visible_owner(user, owner), states=states, name=name, before=before, limit=limit)
        nxt = str(jobs[-1].id) if len(jobs) == limit else None
        return {"jobs": [j.to_json() for j in jobs], "next": nxt}

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], responses=errors(403, 404))
    def show(job_id: str, user: Caller) -> dict[str, Any]:
        job = pod.visible_job(user, job_id)
        return {**job.to_json(), "events": store.events(job.id)}

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"], responses=errors(403, 404))
    def cancel(job_id: str, user: Caller) -> dict[str, Any]:
        """Cancel a queued job at once, or stop a running one (SIGTERM, grace, SIGKILL)."""
        return pod.cancel(user, job_id).to_json()

    @app.post(
        "/v1/jobs/{job_id}/requeue",
        tags=["jobs"],
        responses=errors(403, 404, 409, s409="the job succeeded: a finished success is not run again"),
    )
    def requeue(job_id: str, user: Caller) -> dict[str, Any]:
        """Send a cancelled, failed or lost job back to the queue, or stop a running one and requeue it
        (a train job resumes from its checkpoint); 409 for a job that succeeded."""
        return pod.requeue(user, job_id).to_json()

    @app.post(
        "/v1/jobs/{job_id}/extend",
        tags=["jobs"],
        responses=errors(400, 403, 404, 409, 413, s409="beyond the pod's longest session, not a session, or ended"),
        openapi_extra=body_doc({"seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_RUNTIME_S}},
                               required=["seconds"]),
    )  # fmt: skip
    async def extend_time(job_id: str, request: Request, user: Caller) -> dict[str, Any]:
        """Give a queued or running session (notebook, shell, tensorboard) ``seconds`` more, never past the pod's
        longest session (``deskpod up --session-max-time``); its owner's (or an admin's) to ask."""
        seconds = body_object(await json_body(request), ("seconds",), required=("seconds",))["seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= MAX_RUNTIME_S:
            raise ConfigError(f"seconds = {seconds!r:.40}: expected seconds above 0 and at most {MAX_RUNTIME_S:.0f}")
        return (await run_in_threadpool(pod.extend, user, job_id, float(seconds))).to_json()

    @app.get(
        "/v1/jobs/{job_id}/log",
        tags=["jobs"],
        response_class=PlainTextResponse,
        responses={200: {"headers": LOG_HEADERS}, **errors(403, 404, 422)},
    )
    def log(
        job_id: str,
        user: Caller,
        offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_LOG_CHUNK)] = MAX_LOG_CHUNK,
    ) -> Response:
        """Log bytes from ``offset``; ``X-Deskpod-Offset`` is where to ask next, ``X-Deskpod-State`` the job's state."""
        job = pod.visible_job(user, job_id)
        data = pod.executor.log(pod, job, offset, limit)
        headers = {"X-Deskpod-Offset": str(offset + len(data)), "X-Deskpod-State": job.state.value}
        return Response(content=data, media_type="text/plain; charset=utf-8", headers=headers)

    @app.get("/v1/status", tags=["service"], responses=errors(403))
    def status(user: Caller) -> dict[str, Any]:
        """Each device: free, or which job and user holds it; queue and running counts; the pod's ``settings``
        (`PodConfig`: what each ``deskpod up`` flag set)."""
        return {**pod.status(), **pod.outlook(), "settings": pod.config.to_json()}

    @app.get("/v1/doctor", tags=["service"], responses=errors(403, 422))
    async def doctor(
        user: Caller,
        max_age: Annotated[float, Query(ge=0, le=86400, description="seconds a kept report may be old")] = MAX_AGE_S,
    ) -> dict[str, Any]:
        """This box's ``deskpod doctor`` (a cluster's ``--cluster`` behind a Slurm login node): the kept report when
        younger than ``max_age`` (and always when younger than 10 s), else a new run's, which takes seconds. An
        admin's, or a trusted fleet's acting as itself."""
        if not auth.fleet_itself(user):
            auth.require_admin(user)
        answer = await run_in_threadpool(pod.doctor.latest, max_age)
        return {"name": pod.config.name, **answer.to_json()}

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse, responses=errors(403))
    def prometheus(user: Caller) -> Response:
        text = metrics.render(pod.status(), store.counts(), store.durations())
        return Response(content=text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post(
        "/v1/users",
        status_code=201,
        tags=["users"],
        responses={
            201: {"description": "the user and its first token", "links": links("name", "name", USER_OPERATIONS)},
            **errors(400, 403, 409, 413, s409="the user exists already, or `os_user` names no account of this box"),
        },
        openapi_extra=body_doc({
            "name": {"type": "string", "pattern": auth.USER_RE.pattern}, "admin": {"type": "boolean"},
            "os_user": {"type": "string", "minLength": 1, "maxLength": 64,
                        "description": "the OS account the user's jobs run as (a root pod)"}}, required=["name"]),
    )  # fmt: skip
    async def add_user(request: Request, user: Caller) -> dict[str, Any]:
        """Create a user and its first token (admin only); the token is shown only here."""
        auth.require_admin(user)
        data = body_object(await json_body(request), ("name", "admin", "os_user"))
        name = auth.check_user_name(data.get("name"))
        admin = data.get("admin", False)
        if not isinstance(admin, bool):
            raise ConfigError(f"admin = {admin!r}: expected true or false")
        wanted = data.get("os_user")
        if wanted is not None and (not isinstance(wanted, str) or not 0 < len(wanted) <= 64):
            raise ConfigError(f"os_user = {wanted!r:.80}: expected the name of an OS account of this box, e.g. alice")
        os_user = None
        if pod.accounts is not None:
            try:
                os_user = pod.accounts.check_os_user(wanted)
            except ConfigError as e:  # a well-formed name this box has no account for: its state, not bad input
                raise ConflictError(str(e)) from None
        if not store.add_user(name, admin, os_user):
            raise ConflictError(f"user {name!r} exists already; make another token with POST /v1/users/{name}/tokens")
        made = {"name": name, "admin": admin, "token": auth.new_token(store, name)}
        return {**made, "runs_as": runs_as(pod, store.user(name))}

    @app.get("/v1/users", tags=["users"], responses=errors(403))
    def list_users(user: Caller) -> dict[str, Any]:
        auth.require_admin(user)
        return {"users": [{"name": u.name, "admin": u.admin, "runs_as": runs_as(pod, u)} for u in store.users()]}

    def existing_self_or_admin(name: str, user: User) -> None:
        """Refuse a caller acting on user ``name`` unless it is that user or an admin, and a user that is not."""
        if name != user.name:
            auth.require_admin(user)
        if store.user(name) is None:
            raise NotFoundError(f"no user {name!r}")

    @app.post("/v1/users/{name}/revoke", tags=["users"], responses=errors(403, 404))
    def revoke(name: str, user: Caller) -> dict[str, Any]:
        """Revoke every token and dashboard session of a user: an admin for anyone, a user for themself."""
        existing_self_or_admin(name, user)
        return {"name": name, "revoked": store.revoke(name)}

    @app.post("/v1/users/{name}/tokens", status_code=201, tags=["users"], responses=errors(403, 404))
    def add_token(name: str, user: Caller) -> dict[str, Any]:
        """Another token for a user: an admin for anyone, a user for themself."""
        existing_self_or_admin(name, user)
        return {"name": name, "token": auth.new_token(store, name)}

    @app.post(
        "/v1/shutdown",
        status_code=202,
        tags=["service"],
        responses=errors(400, 403, 413),
        openapi_extra=body_doc({"stop_jobs": {"type": "boolean"}}, optional=True),
    )
    async def shutdown(request: Request, user: Caller) -> dict[str, Any]:
        """Stop the daemon (admin only). ``{"stop_jobs": true}`` also stops and requeues running jobs."""
        auth.require_admin(user)
        data = body_object(await json_body(request, empty={}), ("stop_jobs",))  # no body; not a body of null
        stop_jobs = data.get("stop_jobs", False)
        if not isinstance(stop_jobs, bool):
            raise ConfigError(f"stop_jobs = {stop_jobs!r}: expected true or false")
        on_shutdown(stop_jobs)
        return {"stopping": True, "stop_jobs": stop_jobs}

    for extend in extensions:
        extend(app, pod)

    def document() -> dict[str, Any]:
        """FastAPI's document less its own 422 answers: where one can happen the route lists it with `ERROR`."""
        if app.openapi_schema is None:
            doc = FastAPI.openapi(app)
            for ops in doc.get("paths", {}).values():
                for op in ops.values():
                    answer = op.get("responses", {}).get("422", {})
                    if "HTTPValidationError" in json.dumps(answer):
                        del op["responses"]["422"]
            for name in ("HTTPValidationError", "ValidationError"):
                doc.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]
    return app


async def json_body(request: Request, empty: Any = None) -> Any:
    """The body as JSON (`parse_json`), or ``empty`` when there is none."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and (len(declared) > 12 or int(declared) > MAX_BODY):
        raise TooLargeError(f"request body of {declared:.20} bytes is over the limit of {MAX_BODY}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise TooLargeError(f"request body is over the limit of {MAX_BODY} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    return parse_json(body) if body else empty


def body_doc(properties: dict[str, Any], *, required: Sequence[str] = (), optional: bool = False) -> dict[str, Any]:
    """The ``openapi_extra`` of an operation whose body is a JSON object of ``properties`` and no other field
    (`body_object` checks it), ``required`` among them; ``optional``: the body may be left out."""
    schema = {"type": "object", "additionalProperties": False, **({"required": list(required)} if required else {}),
              "properties": properties}  # fmt: skip
    return {"requestBody": {"required": not optional, "content": {"application/json": {"schema": schema}}}}


def held_jobs_body(field: str, low: float, high: float) -> dict[str, Any]:
    """The OpenAPI body of a fleet's request about the jobs it holds here: ``jobs`` and seconds in ``field``."""
    return body_doc({"jobs": {"type": "array", "maxItems": 100000, "items": {"type": "string", "maxLength": 20}},
                     field: {"type": "number", "minimum": low, "maximum": high}}, required=["jobs", field])  # fmt: skip


KEY_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
"""A forward's idempotency key (``POST /v1/jobs?key=``, ``POST /v1/leases/lookup``)."""
KEYS_BODY = body_doc(
    {"keys": {"type": "array", "maxItems": 10000, "items": {"type": "string", "pattern": KEY_PATTERN.pattern}}},
    required=["keys"],
)
"""The OpenAPI body of ``POST /v1/leases/lookup``."""


def forward_keys(data: Any) -> list[str]:
    """``POST /v1/leases/lookup``'s body, checked: the keys."""
    keys = body_object(data, ("keys",), required=("keys",))["keys"]
    if (
        not isinstance(keys, list)
        or len(keys) > 10000
        or not all(isinstance(k, str) and KEY_PATTERN.match(k) for k in keys)
    ):
        raise ConfigError(
            f"keys = {str(keys)[:60]}: expected a list of at most 10000 forward keys (1-100 letters, digits, "
            "'.', '_', ':' or '-'), e.g. [\"fleet-a.12.3f9c\"]"
        )
    return keys


def held_jobs(data: Any, field: str, low: float, high: float) -> tuple[list[str], float]:
    """Such a body, checked: (the job ids, the seconds)."""
    got = body_object(data, ("jobs", field))
    ids, seconds = got.get("jobs"), got.get(field)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > 100000:
        raise ConfigError(f'jobs = {str(ids)[:60]}: expected a list of job ids, e.g. ["12", "13"]')
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not low <= seconds <= high:
        raise ConfigError(f"{field} = {seconds!r}: expected seconds from {low:g} to {high:g}")
    return ids, float(seconds)


def body_object(data: Any, fields: tuple[str, ...], *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A request body's object of ``fields`` (those ``required`` there): unknown fields and nulls are refused."""
    if not isinstance(data, dict):
        raise ConfigError(f"request body: expected a JSON object with {', '.join(fields)}")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"request body: unknown field {unknown[0]!r}; valid: {', '.join(fields)}")
    null = next((k for k, v in data.items() if v is None), None)
    if null is not None:  # no field takes null (the document says so): leave it out for its default
        raise ConfigError(f"request body: {null} = null is not valid; leave {null} out for its default")
    missing = [k for k in required if k not in data]
    if missing:
        raise ConfigError(f"request body: {missing[0]} is missing; expected {', '.join(required)}")
    return data


def allowed_methods(request: Request) -> str:
    """The ``Allow`` header of a 405: every method that a route of the request's app takes at its path (Starlette
    names only those of the first route it found there, e.g. ``POST`` for ``/v1/jobs``, which takes ``GET`` too)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


def parse_json(body: bytes) -> Any:
    """A request body as JSON, or `ConfigError` saying why not: malformed, nested deeper than `MAX_DEPTH`, or a
    number of more digits than Python converts (``sys.get_int_max_str_digits``, 4,300)."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise ConfigError(f"request body: JSON nested too deeply; at most {MAX_DEPTH} arrays or objects") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"request body is not valid JSON: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"request body is not valid JSON: {e}") from None
    except ValueError:  # int() refused a literal (the parser's only other ValueError)
        raise ConfigError(
            f"request body: a number has more than {sys.get_int_max_str_digits()} digits; no field takes one that long"
        ) from None
    if nesting(data) > MAX_DEPTH:
        raise ConfigError(f"request body: JSON nested too deeply; at most {MAX_DEPTH} arrays or objects")
    return data


def nesting(data: Any) -> int:
    """How deeply arrays and objects nest in decoded JSON (0 for a scalar), walked no deeper than `MAX_DEPTH` + 1."""
    return protocol.nesting(data, MAX_DEPTH)


def spec_document(*, environment: bool, stack: bool) -> dict[str, Any]:
    """`SPEC_SCHEMA` as this pod takes it: without ``environment`` where it builds no environments (no isolation:
    the field is refused, 409), without ``stack`` where it is no fleet (the field is refused, 400)."""
    left_out = {name for name, kept in (("environment", environment), ("stack", stack)) if not kept}
    props = {k: v for k, v in SPEC_SCHEMA["properties"].items() if k not in left_out}
    kinds = [{**kind, "properties": {k: v for k, v in kind["properties"].items() if k not in left_out}}
             for kind in SPEC_SCHEMA["oneOf"]]  # fmt: skip
    return {**SPEC_SCHEMA, "properties": props, "oneOf": kinds}


def runs_as(pod: Pod, user: User | None) -> str | None:
    """The OS account a user's jobs run as (None: the pod does not switch accounts, or none fits)."""
    if user is None or pod.accounts is None:
        return None
    try:
        return pod.accounts.account_for(user).name
    except DeskpodError:
        return None


def parse_state(state: str) -> JobState:
    """A job state from a query parameter; `ConfigError` listing the valid ones."""
    try:
        return JobState(state)
    except ValueError:
        names = ", ".join(s.value for s in JobState)
        raise ConfigError(f"state {state!r} is not a job state; valid: {names}") from None


def visible_owner(user: User, owner: str | None) -> str | None:
    """Whose jobs ``user`` lists: an admin anyone's (None: everyone's), a user only their own."""
    if user.admin:
        return owner or None
    if owner and owner != user.name:
        raise AccessError(f"user {user.name!r} sees only their own jobs; only an admin lists another user's")
    return user.name
