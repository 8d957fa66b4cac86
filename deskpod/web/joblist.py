"""The Jobs page: queue and history, filtered and paged on the server; cancel and requeue, one job or several.

Paging is by keyset (``before=<id>``: the jobs older than the last one shown), so the thousandth
page costs what the first does. Each queued job shows its place in the queue, the scheduler's
stated reason and an estimated start (`deskpod.jobs.forecast`, cached until the store changes; only
the front `HORIZON` of the queue is played forward, and a job behind it says so); each running train
job its progress and a sparkline of its loss.

::

    POST /ui/jobs/<id>/cancel     cancel one job (asks first without JavaScript)
    POST /ui/jobs/<id>/requeue    requeue one job
    POST /ui/jobs/<id>/extend     a session's time, ``time`` more (the job page's "Extend 1h")
    POST /ui/jobs/bulk            action=cancel|requeue on every ``job=<id>`` ticked in the list: each is done
                                  as the single action would be, for the jobs the viewer may touch; a script
                                  gets ``{"done": [jobs], "errors": {id: message}}``
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from deskpod.environment.sizes import parse_duration
from deskpod.envs.userfiles import read_path, stat_path
from deskpod.errors import ConfigError, DeskpodError
from deskpod.jobs.api import parse_state, visible_owner
from deskpod.jobs.forecast import Forecast
from deskpod.jobs.states import REQUEUABLE, JobState
from deskpod.jobs.store import JobRecord
from deskpod.train.runs import RunPaths
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.session import ROOT, Signed, Viewer, form_csrf, safe_next

PAGE_SIZE = 50
MAX_PAGE = 500
"""The most jobs one page lists, and so the most one bulk action takes."""
BULK_ACTIONS = ("cancel", "requeue")
SPARK_POINTS = 40
FORECAST_MAX_AGE_S = 1.0
"""A forecast is reused while the store is unchanged, and at most this long while it changes."""


def forecast(web: Web) -> Forecast:
    """The queue's forecast, recomputed only when the store changed (and at most once a second)."""
    version, now = web.store.version, time.time()
    cached = web.cache.get("forecast")
    if cached is not None and (cached[0] == version or now - cached[1] < FORECAST_MAX_AGE_S):
        return cached[2]  # type: ignore[no-any-return]
    got = web.pod.forecast(now)
    web.cache["forecast"] = (version, now, got)
    return got  # type: ignore[no-any-return]


@dataclass
class Progress:
    """How far a train job's run has got."""

    step: int
    total_steps: int | None
    fraction: float | None
    loss: list[float]
    """The train loss, downsampled to `SPARK_POINTS` (the Jobs page's sparkline)."""
    last_loss: float | None


def progress(web: Web, job: JobRecord) -> Progress | None:
    """Step, total steps and recent loss of a train job's run (None before it has written any)."""
    run = web.run_dir(job)
    if run is None:
        return None
    series = web.series.get(RunPaths(run).metrics)
    if not series.rows("train"):
        return None
    step = series.last("train", "step") or 0
    total = _total_steps(web, RunPaths(run).launch)
    loss = [p[1] for p in series.points("train", "loss", max_points=SPARK_POINTS)]
    fraction = min(1.0, step / total) if total else None
    return Progress(int(step), total, fraction, loss, series.last("train", "loss"))


def _total_steps(web: Web, launch: Path) -> int | None:
    """``total_steps`` from the run's ``launch.json``, re-read only when the file changes."""
    st = stat_path(launch)  # the job's user may have put a link or a FIFO there
    if st is None:
        return None
    mtime = st.st_mtime_ns
    cache: dict[Path, tuple[int, int | None]] = web.cache.setdefault("launch", {})
    hit = cache.get(launch)
    if hit is None or hit[0] != mtime:
        try:
            total = json.loads(read_path(launch, limit=1 << 20)).get("total_steps")
        except (OSError, ValueError, AttributeError, RecursionError):
            total = None
        hit = cache[launch] = (mtime, int(total) if isinstance(total, int) else None)
    return hit[1]


def job_row(web: Web, job: JobRecord, fc: Forecast | None) -> dict[str, Any]:
    """One job as the Jobs page (and its JSON twin) shows it."""
    row = job.to_json()
    queued = fc if job.state is JobState.QUEUED else None
    row["position"] = queued.position.get(job.id) if queued is not None else None
    row["estimated_start"] = queued.start.get(job.id) if queued is not None else None
    row["estimated"] = queued is not None and job.id in queued.start  # False beyond the forecast's horizon
    row["estimate_note"] = (
        f"no estimated start: only the first {queued.horizon} jobs of the queue are played forward"
        if queued is not None and queued.horizon and job.id not in queued.start
        else ""
    )
    row["progress"] = progress(web, job) if job.state.active else None
    row["can_cancel"] = (job.state is JobState.QUEUED or job.state.active) and not job.stop_reason
    row["can_requeue"] = job.state in REQUEUABLE or job.state.active
    return row


@dataclass
class JobsPage:
    """The Jobs page's data: filters (with a message per bad one), the page of jobs, the cursor."""

    filters: dict[str, str]
    errors: dict[str, str]
    states: list[str]
    users: list[str]
    counts: dict[str, int] | None
    """Jobs per state in the whole pod (admins only)."""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    """`job_row` of each job of the page."""
    total: int = 0
    next: str | None = None
    """The ``before=`` cursor of the next page, None on the last."""


def list_jobs(
    web: Web, who: Viewer, *, user: str | None, state: str | None, name: str | None, before: int | None, limit: int
) -> JobsPage:
    errors: dict[str, str] = {}
    states = None
    owner = who.owner_filter()
    if state:
        try:
            states = [parse_state(state)]
        except DeskpodError as e:
            errors["state"] = str(e)
    if user:
        try:
            owner = visible_owner(who.user, user)
        except DeskpodError as e:
            errors["user"] = str(e)
    out = JobsPage(
        filters={"user": user or "", "state": state or "", "name": name or ""},
        errors=errors,
        states=[s.value for s in JobState],
        users=[u.name for u in web.store.users()] if who.user.admin else [who.user.name],
        counts=web.store.counts() if who.user.admin else None,
    )
    if errors:
        return out
    jobs = web.store.jobs(user=owner, states=states, name=name or None, before=before, limit=limit)
    fc = forecast(web) if any(j.state is JobState.QUEUED for j in jobs) else None
    out.jobs = [job_row(web, j, fc) for j in jobs]
    out.total = web.store.count(user=owner, states=states, name=name or None)
    out.next = str(jobs[-1].id) if len(jobs) == limit else None
    return out


def register(app: FastAPI, web: Web) -> None:
    @app.get("/jobs.json")
    @app.get("/jobs")
    def jobs_page(
        request: Request,
        who: Signed,
        user: Annotated[str | None, Query(max_length=64)] = None,
        state: Annotated[str | None, Query(max_length=32)] = None,
        name: Annotated[str | None, Query(max_length=64)] = None,
        before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE_SIZE,
    ) -> Response:
        data = list_jobs(web, who, user=user, state=state, name=name, before=before, limit=limit)
        status = 400 if data.errors else 200
        keep = {k: v for k, v in data.filters.items() if v}
        extra = {
            "now": time.time(),
            "request_before": before is not None,
            "first_query": urlencode(keep),
            "next_query": urlencode({**keep, "before": data.next}) if data.next else "",
        }
        return render.page(request, "jobs.html", data, who, title="Jobs", status=status, extra=extra)

    @app.post("/jobs/bulk")  # before /jobs/{job_id}/...: a literal path, not a job id
    async def bulk(request: Request, who: Signed) -> Response:
        fields = await form_csrf(request, who)
        ids = [v for v in (await request.form()).getlist("job") if isinstance(v, str)]
        action = fields.get("action", "")
        if action not in BULK_ACTIONS:
            raise ConfigError(f"action {action!r}: choose {' or '.join(BULK_ACTIONS)}")
        if not ids:
            raise ConfigError(f"tick the jobs to {action} first (the boxes in the list)")
        if len(ids) > MAX_PAGE:
            raise ConfigError(f"{len(ids)} jobs at once: {action} at most {MAX_PAGE} (a page of the list)")
        nxt = safe_next(fields["next"]) if fields.get("next") else f"{ROOT}/jobs"
        if action == "cancel" and fields.get("confirmed") != "1" and not render.wants_json(request):
            jobs = [web.job(who, i).to_json() for i in dict.fromkeys(ids)]  # a foreign id: 404, as everywhere
            data: dict[str, Any] = {"jobs": jobs, "action": "cancel"}
            return render.page(request, "confirm.html", data, who, title=f"Cancel {len(jobs)} jobs?",
                               extra={"next": nxt})  # fmt: skip
        done, errors = await run_in_threadpool(bulk_action, web, who, action, ids)
        if render.wants_json(request):
            return JSONResponse({"done": done, "errors": errors}, status_code=200 if done or not errors else 400)
        if not errors:
            return RedirectResponse(nxt, status_code=303)
        data = {"action": action, "done": done, "errors": errors}
        return render.page(request, "bulk.html", data, who, title=f"{action.capitalize()} jobs", extra={"next": nxt},
                           status=200 if done else 400)  # fmt: skip

    @app.post("/jobs/{job_id}/cancel")
    async def cancel(request: Request, job_id: str, who: Signed) -> Response:
        fields = await form_csrf(request, who)
        job = web.job(who, job_id)
        if fields.get("confirmed") != "1" and not render.wants_json(request):
            # Without JavaScript the dialog never showed: ask here, with the same form and its token.
            data = {"job": job.to_json(), "action": "cancel"}
            extra = {"next": safe_next(fields["next"]) if fields.get("next") else ""}
            return render.page(request, "confirm.html", data, who, title=f"Cancel job {job.id}?", extra=extra)
        done = web.pod.cancel(who.user, job_id)
        return _after(request, done, fields.get("next"))

    @app.post("/jobs/{job_id}/extend")
    async def extend(request: Request, job_id: str, who: Signed) -> Response:
        """A session's time, one more ``time`` (a duration; the job page's button sends 1h)."""
        fields = await form_csrf(request, who)
        seconds = parse_duration(fields.get("time", "1h"), "time")
        done = await run_in_threadpool(web.pod.extend, who.user, job_id, seconds)
        return _after(request, done, fields.get("next"))

    @app.post("/jobs/{job_id}/requeue")
    async def requeue(request: Request, job_id: str, who: Signed) -> Response:
        fields = await form_csrf(request, who)
        return _after(request, web.pod.requeue(who.user, job_id), fields.get("next"))


def bulk_action(web: Web, who: Viewer, action: str, ids: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Cancel or requeue each job of ``ids`` as the single action does (the pod checks who may touch which):
    the jobs as each action left them, and a message per job it refused (another user's job is "not found")."""
    done: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    act = web.pod.cancel if action == "cancel" else web.pod.requeue
    for job_id in dict.fromkeys(ids):
        try:
            done.append(act(who.user, job_id).to_json())
        except DeskpodError as e:
            errors[job_id] = str(e)
    return done, errors


def _after(request: Request, job: JobRecord, next_page: str | None) -> Response:
    """A script gets the job; a browser goes back to ``next`` (a dashboard page) or to the job's page."""
    if render.wants_json(request):
        return JSONResponse(job.to_json())
    target = safe_next(next_page) if next_page else f"{ROOT}/jobs/{job.id}"
    return RedirectResponse(target, status_code=303)
