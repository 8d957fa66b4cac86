"""The Sessions page: the viewer's notebooks (and other sessions) with their links, and "New notebook".

::

    GET  /ui/sessions             the viewer's sessions: running ones open at /sessions/<id>/, queued ones say why
    POST /ui/sessions/notebook    devices, time, folder -> a notebook job; the browser goes to its JupyterLab,
                                  which shows a waiting page until the session answers

A session started here is the same job as ``deskpod notebook`` submits: the viewer's own, in their sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from deskpod.environment.sizes import parse_duration
from deskpod.errors import ConfigError, DeskpodError
from deskpod.jobs.api import status_of
from deskpod.jobs.kinds import KINDS
from deskpod.jobs.kinds.session import PREFIX
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.session import ROOT, Signed, Viewer, form_csrf

SESSION_KINDS = tuple(k for k, m in KINDS.items() if m.SESSION)
LANDING = {"notebook": f"{PREFIX}/{{id}}/lab", "shell": f"{ROOT}/jobs/{{id}}/terminal",
           "tensorboard": f"{PREFIX}/{{id}}/"}  # fmt: skip
"""Where each kind opens: JupyterLab and TensorBoard through the proxy, a shell on its terminal page."""
SHOWN = (JobState.QUEUED, JobState.STARTING, JobState.BUILDING, JobState.RUNNING)
TIMES = ("1h", "4h", "8h", "24h")


@dataclass
class SessionRow:
    id: int
    kind: str
    name: str
    state: str
    devices: list[int]
    reason: str
    url: str | None
    """Where it opens, once it runs."""
    ends_at: float | None
    held: float = 0.0
    """Device-hours it held (this attempt), and ``used``: those its devices were seen at work."""
    used: float = 0.0
    released: list[int] = field(default_factory=list)
    """The devices it gave back while idle (a notebook); empty while it holds them."""


@dataclass
class SessionsPage:
    sessions: list[SessionRow]
    device_count: int | None
    errors: dict[str, str] = field(default_factory=dict)
    form: dict[str, str] = field(default_factory=dict)


def row(job: JobRecord) -> SessionRow:
    kind = job.spec.kind
    running = job.state is JobState.RUNNING
    ends = job.started_at + job.max_runtime if job.started_at and job.max_runtime else None
    hours = job.to_json()["device_hours"]
    return SessionRow(job.id, kind, job.name, job.state.value, list(job.assigned), job.reason or "",
                      LANDING.get(kind, f"{PREFIX}/{{id}}/").format(id=job.id) if running else None, ends,
                      hours["held"], hours["used"], list(job.released))  # fmt: skip


def page_data(web: Web, who: Viewer, errors: dict[str, str] | None = None,
              form: dict[str, str] | None = None) -> SessionsPage:  # fmt: skip
    jobs = [j for k in SESSION_KINDS for j in web.store.jobs(user=who.user.name, states=SHOWN, kind=k, limit=200)]
    rows = [row(j) for j in sorted(jobs, key=lambda j: -j.id)]
    return SessionsPage(rows, web.pod.executor.device_count, errors or {}, form or {})


def notebook_spec(fields: dict[str, str]) -> dict[str, Any]:
    """The form's notebook job: devices (a count), time (a duration), folder (absolute, optional)."""
    spec: dict[str, Any] = {"notebook": {}}
    devices = fields.get("devices", "1").strip() or "1"
    if not devices.isdigit():
        raise ConfigError(f"devices {devices!r}: expected a count, e.g. 1")
    spec["devices"] = int(devices)
    if fields.get("time", "").strip():
        spec["max_runtime"] = parse_duration(fields["time"], "time")
    if fields.get("folder", "").strip():
        spec["workdir"] = fields["folder"].strip()
    return spec


def register(app: FastAPI, web: Web) -> None:
    @app.get("/sessions.json")
    @app.get("/sessions")
    def sessions(request: Request, who: Signed) -> Response:
        return render.page(request, "sessions.html", page_data(web, who), who, title="Sessions",
                           extra={"times": TIMES})  # fmt: skip

    @app.post("/sessions/notebook")
    async def new_notebook(request: Request, who: Signed) -> Response:
        fields = await form_csrf(request, who)
        try:
            job = await run_in_threadpool(web.pod.submit, who.user, notebook_spec(fields))
        except DeskpodError as e:
            if render.wants_json(request):
                return JSONResponse({"error": str(e)}, status_code=status_of(e))
            data = page_data(web, who, {"notebook": str(e)}, fields)
            return render.page(request, "sessions.html", data, who, title="Sessions", status=status_of(e),
                               extra={"times": TIMES})  # fmt: skip
        if render.wants_json(request):
            return JSONResponse(job.to_json(), status_code=201)
        return RedirectResponse(f"{PREFIX}/{job.id}/lab", status_code=303)
