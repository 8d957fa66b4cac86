"""The Job page: one job's header and buttons, live charts and log, log search, checkpoints, config,
state history, and every rank's Python stack on request.

::

    GET  /ui/jobs/<id>            the page (twin: /ui/jobs/<id>.json)
    GET  /ui/jobs/<id>/events     its live stream (Server-Sent Events, `deskpod.web.stream`)
    GET  /ui/jobs/<id>/search     the page with search results across every log (twin: .../search.json,
                                  which holds only the results)
    POST /ui/jobs/<id>/stacks     "where is it now?": py-spy stacks of its processes (`deskpod.web.stacks`)

The charts start from ``metrics.jsonl`` downsampled on the server (`Series.points` with at most
`stream.MAX_POINTS` per series), so a 100,000-step run draws as fast as a short one; the stream
then sends only what is appended. Another user's job is a 404 on every route, like a job that does
not exist (`Web.job`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from deskpod.envs.userfiles import stat_path
from deskpod.errors import ConfigError
from deskpod.jobs.kinds import KINDS as KIND_MODULES
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord
from deskpod.train.runs import RunPaths
from deskpod.web import logs, render, stacks, stream
from deskpod.web.app import Web
from deskpod.web.failures import failure
from deskpod.web.joblist import Progress, progress
from deskpod.web.runinfo import Checkpoint, RunConfig, checkpoints, read_summary, resolved_config
from deskpod.web.series import KINDS
from deskpod.web.session import ROOT, Signed, SignedIn, Viewer, form_csrf
from deskpod.web.terminal import TENSORBOARD_PORT, deskpod_line, event_folder, tensorboard_line


@dataclass
class LogTail:
    """The end of ``output.log`` the page starts with; the stream goes on from ``offset``."""

    file: str
    text: str
    offset: int
    cut: bool
    """True when the log is longer than what is shown."""


@dataclass
class Commands:
    """Terminal lines for what the page shows in part: the whole log, the run in TensorBoard."""

    logs: str
    tensorboard: str | None


@dataclass
class JobPage:
    """Everything the Job page shows (its twin: ``/ui/jobs/<id>.json``), and the cursor its stream goes on from."""

    job: dict[str, Any]
    """`JobRecord.to_json`."""
    live: stream.Live
    run: str | None
    progress: Progress | None
    charts: list[stream.Chart]
    cursor: str
    events_url: str
    log: LogTail
    log_files: list[str]
    checkpoints: list[Checkpoint]
    config: RunConfig | None
    failure: str | None
    summary: dict[str, Any] | None
    commands: Commands
    search: dict[str, Any] | None = None
    """`logs.search`'s results on the search page."""
    stacks: dict[str, Any] | None = None
    """`stacks.stacks`' answer after "where is it now?"."""
    extendable: bool = False
    """A queued or running session, which its owner may give more time ("Extend 1h")."""


def job_view(web: Web, job: JobRecord, max_points: int = stream.MAX_POINTS) -> JobPage:
    run = web.run_dir(job)
    folder = web.pod.job_folder(job)
    cursor = stream.Cursor()
    charts: list[stream.Chart] = []
    ckpts: list[Checkpoint] = []
    if run is not None:
        metrics = RunPaths(run).metrics
        st = stat_path(metrics)  # before reading: a file replaced meanwhile resets the stream
        cursor.inode = 0 if st is None else st.st_ino
        s = web.series.get(metrics)
        cursor.rows = {k: s.rows(k) for k in KINDS}
        charts = stream.charts(stream.chart_points(s, cursor.rows, max_points))
        ckpts = checkpoints(run, s)
    text, offset, cut = logs.tail(folder / "output.log")
    cursor.log = offset
    tb = event_folder(web, job)
    return JobPage(
        job=job.to_json(),
        live=stream.job_state(job, web.store.events(job.id)),
        run=None if run is None else str(run),
        progress=progress(web, job) if run is not None else None,
        charts=charts,
        cursor=cursor.encode(),
        events_url=f"{ROOT}/jobs/{job.id}/events",
        extendable=KIND_MODULES[job.spec.kind].SESSION
        and (job.state is JobState.QUEUED or job.state.active)
        and not job.stop_reason,
        log=LogTail("output.log", text, offset, cut),
        log_files=[f.label for f in logs.log_files(folder, run)],
        checkpoints=ckpts,
        config=resolved_config(web, job),
        failure=failure(web, job),
        summary=read_summary(run),
        commands=Commands(
            logs=deskpod_line(web, ["deskpod", "logs", str(job.id)]),
            tensorboard=None if tb is None else tensorboard_line({f"job{job.id}": tb}),
        ),
    )


def _page(request: Request, who: Viewer, job: JobRecord, data: JobPage, status: int = 200) -> Response:
    spec_text = json.dumps(data.job["spec"], indent=2, ensure_ascii=False)
    return render.page(
        request,
        "job.html",
        data,
        who,
        title=f"Job {job.id} · {job.name}",
        status=status,
        extra={"spec_text": spec_text, "tensorboard_port": TENSORBOARD_PORT},
    )


def run_search(web: Web, job: JobRecord, q: str, regex: bool, context: int) -> dict[str, Any]:
    files = logs.log_files(web.pod.job_folder(job), web.run_dir(job))
    return logs.search(files, q, regex=regex, context=context)


def register(app: FastAPI, web: Web) -> None:
    @app.get("/jobs/{job_id}/search")
    @app.get("/jobs/{job_id}/search.json")
    def search_page(
        request: Request,
        job_id: str,
        who: Signed,
        q: Annotated[str, Query(max_length=logs.MAX_QUERY)] = "",
        regex: bool = False,
        context: Annotated[int, Query(ge=0, le=logs.MAX_CONTEXT)] = 2,
    ) -> Response:
        job = web.job(who, job_id)
        if render.wants_json(request):
            return JSONResponse(run_search(web, job, q, regex, context))  # a bad query: {"error"} with 400
        data = job_view(web, job)
        status = 200
        try:
            data.search = run_search(web, job, q, regex, context)
        except ConfigError as e:
            data.search = {"error": str(e), "query": q, "regex": regex, "context": context}
            status = 400
        return _page(request, who, job, data, status)

    @app.get("/jobs/{job_id}/events")
    async def job_stream(request: Request, job_id: str, who: Signed, cursor: str | None = None) -> Response:
        job = await asyncio.to_thread(web.job, who, job_id)
        # A reconnecting EventSource sends the id of the last event it got; the page's first connect
        # passes the cursor of the data it was rendered with.
        resume = request.headers.get("last-event-id") or cursor
        events = stream.job_events(
            web, job, stream.Cursor.parse(resume), request.is_disconnected, signed_in=SignedIn(request, who)
        )
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Content-Type-Options": "nosniff"},
        )

    @app.post("/jobs/{job_id}/stacks")
    async def job_stacks(request: Request, job_id: str, who: Signed) -> Response:
        await form_csrf(request, who)
        job = await asyncio.to_thread(web.job, who, job_id)
        result = await stacks.stacks(job, web.run_dir(job))
        if render.wants_json(request):
            return JSONResponse(result)
        data = await asyncio.to_thread(job_view, web, job)
        data.stacks = result
        return _page(request, who, job, data)

    @app.get("/jobs/{job_id}")
    @app.get("/jobs/{job_id}.json")  # registered first (decorators apply bottom-up): it must win
    def job_page(
        request: Request,
        job_id: str,
        who: Signed,
        points: Annotated[int, Query(ge=100, le=10_000_000)] = stream.MAX_POINTS,
    ) -> Response:
        """``points``: how many points per series the charts start with (the server downsamples to it)."""
        job = web.job(who, job_id)
        data = job_view(web, job, points)
        return _page(request, who, job, data)
