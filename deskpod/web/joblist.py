"""The Jobs page: queue and history, filtered and paged on the server; cancel and requeue.

Paging is by keyset (``before=<id>``: the jobs older than the last one shown), so the thousandth
page costs what the first does. Each queued job shows its place in the queue, the scheduler's
stated reason and an estimated start (`deskpod.jobs.forecast`, cached until the store changes);
each running train job its progress and a sparkline of its loss.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from deskpod.errors import DeskpodError
from deskpod.jobs.api import parse_state, visible_owner
from deskpod.jobs.forecast import Forecast
from deskpod.jobs.states import REQUEUABLE, JobState
from deskpod.jobs.store import JobRecord
from deskpod.train.runs import RunPaths
from deskpod.web import render
from deskpod.web.session import ROOT, Viewer, form_csrf, safe_next, viewer

PAGE_SIZE = 50
SPARK_POINTS = 40
FORECAST_MAX_AGE_S = 1.0
"""A forecast is reused while the store is unchanged, and at most this long while it changes."""

Signed = Annotated[Viewer, Depends(viewer)]


def forecast(web: Any) -> Forecast:
    """The queue's forecast, recomputed only when the store changed (and at most once a second)."""
    version, now = web.store.version, time.time()
    cached = web.cache.get("forecast")
    if cached is not None and (cached[0] == version or now - cached[1] < FORECAST_MAX_AGE_S):
        return cached[2]  # type: ignore[no-any-return]
    got = web.pod.forecast(now)
    web.cache["forecast"] = (version, now, got)
    return got  # type: ignore[no-any-return]


def progress(web: Any, job: JobRecord) -> dict[str, Any] | None:
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
    return {
        "step": int(step),
        "total_steps": total,
        "fraction": min(1.0, step / total) if total else None,
        "loss": loss,
        "last_loss": series.last("train", "loss"),
    }


def _total_steps(web: Any, launch: Path) -> int | None:
    """``total_steps`` from the run's ``launch.json``, re-read only when the file changes."""
    try:
        mtime = launch.stat().st_mtime_ns
    except OSError:
        return None
    cache: dict[Path, tuple[int, int | None]] = web.cache.setdefault("launch", {})
    hit = cache.get(launch)
    if hit is None or hit[0] != mtime:
        try:
            total = json.loads(launch.read_text()).get("total_steps")
        except (OSError, ValueError, AttributeError, RecursionError):
            total = None
        hit = cache[launch] = (mtime, int(total) if isinstance(total, int) else None)
    return hit[1]


def job_row(web: Any, job: JobRecord, fc: Forecast | None) -> dict[str, Any]:
    """One job as the Jobs page (and its JSON twin) shows it."""
    row = job.to_json()
    queued = job.state is JobState.QUEUED and fc is not None
    row["position"] = fc.position.get(job.id) if queued and fc is not None else None
    row["estimated_start"] = fc.start.get(job.id) if queued and fc is not None else None
    row["estimated"] = queued and fc is not None and job.id in fc.start  # False beyond the forecast's horizon
    row["progress"] = progress(web, job) if job.state.active else None
    row["can_cancel"] = (job.state is JobState.QUEUED or job.state.active) and not job.stop_reason
    row["can_requeue"] = job.state in REQUEUABLE or job.state.active
    return row


def list_jobs(
    web: Any, who: Viewer, *, user: str | None, state: str | None, name: str | None, before: int | None, limit: int
) -> dict[str, Any]:
    """The Jobs page's data: filters (with a message per bad one), the page of jobs, the cursor."""
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
    out: dict[str, Any] = {
        "filters": {"user": user or "", "state": state or "", "name": name or ""},
        "errors": errors,
        "states": [s.value for s in JobState],
        "users": [u.name for u in web.store.users()] if who.user.admin else [who.user.name],
        "counts": web.store.counts() if who.user.admin else None,
        "jobs": [],
        "total": 0,
        "next": None,
    }
    if errors:
        return out
    jobs = web.store.jobs(user=owner, states=states, name=name or None, before=before, limit=limit)
    fc = forecast(web) if any(j.state is JobState.QUEUED for j in jobs) else None
    out["jobs"] = [job_row(web, j, fc) for j in jobs]
    out["total"] = web.store.count(user=owner, states=states, name=name or None)
    out["next"] = str(jobs[-1].id) if len(jobs) == limit else None
    return out


def register(app: FastAPI, web: Any) -> None:
    @app.get("/jobs.json")
    @app.get("/jobs")
    def jobs_page(
        request: Request,
        who: Signed,
        user: Annotated[str | None, Query(max_length=64)] = None,
        state: Annotated[str | None, Query(max_length=32)] = None,
        name: Annotated[str | None, Query(max_length=64)] = None,
        before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = PAGE_SIZE,
    ) -> Response:
        data = list_jobs(web, who, user=user, state=state, name=name, before=before, limit=limit)
        status = 400 if data["errors"] else 200
        keep = {k: v for k, v in data["filters"].items() if v}
        extra = {
            "now": time.time(),
            "request_before": before is not None,
            "first_query": urlencode(keep),
            "next_query": urlencode({**keep, "before": data["next"]}) if data["next"] else "",
        }
        return render.page(request, "jobs.html", data, who, title="Jobs", status=status, extra=extra)

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

    @app.post("/jobs/{job_id}/requeue")
    async def requeue(request: Request, job_id: str, who: Signed) -> Response:
        fields = await form_csrf(request, who)
        return _after(request, web.pod.requeue(who.user, job_id), fields.get("next"))


def _after(request: Request, job: JobRecord, next_page: str | None) -> Response:
    """A script gets the job; a browser goes back to ``next`` (a dashboard page) or to the job's page."""
    if render.wants_json(request):
        return JSONResponse(job.to_json())
    target = safe_next(next_page) if next_page else f"{ROOT}/jobs/{job.id}"
    return RedirectResponse(target, status_code=303)
