"""The dashboard as a sub-application of the pod service, mounted at ``/ui``.

Its own app, so its errors are pages (a 404 page, the sign-in page) while the REST API's stay JSON,
and so its routes stay out of the API's OpenAPI document. Each page module has ``register(app, web)``
and is listed in `PAGES`; `Web` is what they share: the pod, its store, and the caches of run files.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from deskpod.errors import DeskpodError
from deskpod.jobs import auth
from deskpod.jobs.api import allowed_methods, status_of
from deskpod.jobs.kinds.session import PREFIX
from deskpod.jobs.pod import Pod
from deskpod.jobs.store import JobRecord, Store
from deskpod.web import render
from deskpod.web.series import SeriesCache
from deskpod.web.session import (
    ROOT,
    Signed,
    SignInRequired,
    Viewer,
    check_login_token,
    clear_session_cookie,
    forget_session,
    form_csrf,
    login_token,
    login_url,
    safe_next,
    set_login_cookie,
    set_session_cookie,
    viewer,
)

PAGES = (
    "deskpod.web.home",
    "deskpod.web.joblist",
    "deskpod.web.jobpage",
    "deskpod.web.launch",
    "deskpod.web.sessionlist",
    "deskpod.web.terminal_page",
    "deskpod.web.compare",
    "deskpod.web.models",
    "deskpod.web.video",
)
"""Modules that add pages, each with ``register(app, web)``."""
SESSIONS = "deskpod.web.sessions"
"""The proxy to session jobs (``register(app, web)`` too), mounted beside the dashboard at ``/sessions``."""


@dataclass
class Web:
    """What every page reads: the pod (same process as the API) and shared caches."""

    pod: Pod
    series: SeriesCache = field(default_factory=SeriesCache)
    """Parsed ``metrics.jsonl`` of runs, read incrementally (charts, sparklines, streams)."""
    cache: dict[str, Any] = field(default_factory=dict)
    """Per-module caches (datasets, networks, the queue forecast), keyed by the module's name."""

    @property
    def store(self) -> Store:
        return self.pod.store

    @property
    def home(self) -> Path:
        return self.pod.config.home

    def job(self, viewer: Viewer, job_id: str) -> JobRecord:
        """The job if this viewer may see it; another user's job is a 404, like one that does not exist."""
        return self.pod.visible_job(viewer.user, job_id)

    def run_dir(self, job: JobRecord) -> Path | None:
        return self.pod.run_dir(job)


def mount(api: FastAPI, pod: Pod, pages: Sequence[Callable[[FastAPI, Web], None]] = ()) -> None:
    """Add the dashboard to the pod service's ``api`` app; ``pages`` register pages beside `PAGES`' (a fleet's)."""
    app = FastAPI(title="deskpod dashboard", openapi_url=None, docs_url=None, redoc_url=None)
    web = Web(pod)
    app.state.web = web
    _errors(app)
    app.mount("/static", StaticFiles(packages=[("deskpod.web", "static")]), name="static")
    _sign_in(app, web)
    for name in PAGES:
        importlib.import_module(name).register(app, web)
    for register in pages:
        register(app, web)
    api.mount(ROOT, app)
    proxy = FastAPI(title="deskpod sessions", openapi_url=None, docs_url=None, redoc_url=None)
    proxy.state.web = web
    _errors(proxy)  # the dashboard's sign-in and error pages, outside /ui
    importlib.import_module(SESSIONS).register(proxy, web)
    api.mount(PREFIX, proxy)

    @api.get("/", include_in_schema=False)
    def root() -> Response:
        return RedirectResponse(f"{ROOT}/", status_code=303)


def _sign_in(app: FastAPI, web: Web) -> None:
    @app.get("/login")
    async def login_page(request: Request, next: str | None = None) -> Response:
        target = safe_next(next)
        try:
            await viewer(request)
            return RedirectResponse(target, status_code=303)  # signed in already
        except DeskpodError:
            pass
        return _login_form(request, target, "", status=200)

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        target = safe_next(fields.get("next"))
        try:
            check_login_token(request, fields.get("csrf"))
        except DeskpodError as e:
            return _login_form(request, target, str(e), status=403)
        token = fields.get("token", "").strip()
        try:
            if not token:
                raise SignInRequired("paste your token (it starts with dp_)")
            user = auth.authenticate(web.store, f"Bearer {token}")
        except DeskpodError as e:
            return _login_form(request, target, str(e), status=401)
        session, _ = auth.new_session(web.store, user, time.time())
        response = RedirectResponse(target, status_code=303)
        set_session_cookie(response, request, session)
        return response

    @app.post("/logout")
    async def logout(request: Request, who: Signed) -> Response:
        await form_csrf(request, who)
        if who.session is not None:
            auth.end_session(web.store, who.session)
            forget_session(request, who.session)
        response = RedirectResponse(f"{ROOT}/login", status_code=303)
        clear_session_cookie(response)
        return response


def _login_form(request: Request, target: str, error: str, *, status: int) -> Response:
    token = login_token(request)
    response = render.page(
        request, "login.html", {"error": error} if error else {}, None, title="Sign in", status=status,
        extra={"login_csrf": token, "next": target, "error": error},
    )  # fmt: skip
    set_login_cookie(response, token)
    return response


def _errors(app: FastAPI) -> None:
    async def answer(request: Request, status: int, message: str) -> Response:
        if status == 401:
            return _to_sign_in(request, message)
        try:
            who = await viewer(request)
        except DeskpodError as e:
            return _to_sign_in(request, str(e))  # anonymous: the sign-in page (or 401), never an error's details
        if render.wants_json(request) or request.headers.get("accept", "") == "text/event-stream":
            return JSONResponse({"error": message}, status_code=status)
        return render.page(request, "error.html", {"error": message, "status": status}, who,
                           title=f"{status}", status=status)  # fmt: skip

    @app.exception_handler(DeskpodError)
    async def _deskpod_error(request: Request, e: DeskpodError) -> Response:
        return await answer(request, status_of(e), str(e))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> Response:
        parts = []
        for err in e.errors()[:3]:
            where = ".".join(str(x) for x in err.get("loc", ()) if x not in ("query", "path", "body"))
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return await answer(request, 400, "bad request: " + "; ".join(parts))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> Response:
        message = "no such page" if e.status_code == 404 else str(e.detail)
        response = await answer(request, e.status_code, message)
        if e.status_code == 405 and response.status_code == 405:
            response.headers["Allow"] = allowed_methods(request)
        return response

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> Response:  # Starlette logs the traceback after this
        return await answer(request, 500, f"internal error: {type(e).__name__}: {e}")


def _to_sign_in(request: Request, message: str) -> Response:
    """The sign-in page for a browser (then back to what it asked for); 401 for a script."""
    if render.wants_json(request) or request.headers.get("accept", "") == "text/event-stream":
        return JSONResponse({"error": str(message)}, status_code=401)
    if request.method == "GET":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    else:  # a form posted with an expired session: back to the page it was posted from
        referer = request.headers.get("referer", "")
        target = referer[referer.find(ROOT) :] if ROOT in referer else f"{ROOT}/"
    return RedirectResponse(login_url(safe_next(target)), status_code=303)
