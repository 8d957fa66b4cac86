"""The Compare page: several runs' curves overlaid, how their configs differ, and their final metrics.

``/ui/compare?jobs=3,5,9`` (twin: ``/ui/compare.json?jobs=...``) is a URL to share: the form's
checkboxes submit ``jobs=3&jobs=5``, which is redirected to the comma form. Each chart of the Job
page becomes one chart here with a line per run (one colour per run, the legend naming job and
run); the config table lists the keys whose values differ across the runs first (highlighted), the
ones they share folded below. A job the viewer may not see is a 404, as everywhere; an id that is
not a number, or a job that is not a training, is a 400 with a message saying which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from deskpod.errors import ConfigError
from deskpod.jobs.store import JobRecord, job_number
from deskpod.train.runs import RunPaths
from deskpod.web import render, stream
from deskpod.web.app import Web
from deskpod.web.runinfo import display, read_summary, resolved_config
from deskpod.web.series import Series
from deskpod.web.session import Signed, Viewer
from deskpod.web.terminal import TENSORBOARD_PORT, event_folder, tensorboard_line

MAX_RUNS = 8
COLORS = 6
"""Series colours in the stylesheet (``--s1`` .. ``--s6``); a 7th run reuses the first."""
PICKER_JOBS = 100
FINAL_KEYS = (
    ("state", "run"),
    ("steps", "steps"),
    ("test_accuracy", "test accuracy"),
    ("test_loss", "test loss"),
    ("throughput_images_per_s", "images/s"),
    ("train_time_s", "train time (s)"),
    ("wall_time_s", "wall time (s)"),
    ("data_wait_fraction", "data wait"),
    ("restarts", "restarts"),
)
"""What the final-metrics table shows from each run's ``summary.json``."""


def parse_ids(text: str) -> list[str]:
    """``"3,5, 9"`` -> ``["3", "5", "9"]`` (duplicates dropped); `ConfigError` naming a bad entry."""
    ids: list[str] = []
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        if job_number(part) is None:
            raise ConfigError(
                f"jobs={text!r}: {part!r} is not a job id; give job numbers separated by commas, e.g. jobs=3,5"
            )
        if part not in ids:
            ids.append(part)
    if len(ids) > MAX_RUNS:
        raise ConfigError(f"jobs={text!r}: {len(ids)} runs; compare at most {MAX_RUNS} at once")
    return ids


@dataclass
class CompareRun:
    """One run of the comparison: who and what it is, its config, its final metrics."""

    id: str
    name: str
    user: str
    state: str
    label: str
    color: str
    """Its colour in every chart: ``--s1`` .. ``--s6``."""
    run: str | None
    config_source: str
    config: dict[str, Any]
    """The resolved config, by dotted key (`runinfo.resolved_config`)."""
    summary: dict[str, Any]
    """The `FINAL_KEYS` of its ``summary.json`` (None where it has none)."""
    last: dict[str, float | None]
    """The last train loss, validation accuracy and step in its metrics."""


def _run(web: Web, job: JobRecord, i: int) -> tuple[CompareRun, Series | None]:
    run = web.run_dir(job)
    config = resolved_config(web, job)
    summary = read_summary(run) or {}
    series = web.series.get(RunPaths(run).metrics) if run is not None else None
    last = {key: None if series is None else series.last(kind, key)
            for kind, key in (("train", "loss"), ("val", "val_accuracy"), ("train", "step"))}  # fmt: skip
    got = render.fields_from(
        CompareRun,
        job.to_json(),
        label=f"job {job.id} · {job.name}",
        color=f"--s{i % COLORS + 1}",
        run=None if run is None else str(run),
        config_source="" if config is None else config.source,
        config={} if config is None else config.values,
        summary={k: summary.get(k) for k, _ in FINAL_KEYS},
        last=last,
    )
    return got, series


@dataclass
class Differ:
    key: str
    values: list[str | None]
    """Each run's value as text, None where it lacks the key."""


@dataclass
class Same:
    key: str
    value: str


@dataclass
class ConfigDiff:
    differ: list[Differ]
    same: list[Same]


def config_diff(runs: list[CompareRun]) -> ConfigDiff:
    """Keys whose values differ across the runs (a key one run lacks differs), and the keys they share."""
    keys = sorted(set().union(*(r.config for r in runs))) if runs else []
    differ: list[Differ] = []
    same: list[Same] = []
    missing = object()
    for k in keys:
        values = [r.config.get(k, missing) for r in runs]
        shown = [None if v is missing else display(v) for v in values]
        if all(v is not missing for v in values) and all(v == values[0] for v in values[1:]):
            same.append(Same(k, display(values[0])))
        else:
            differ.append(Differ(k, shown))
    return ConfigDiff(differ, same)


@dataclass
class ComparePage:
    """The Compare page's data (its twin: ``/ui/compare.json?jobs=...``)."""

    jobs: str
    picker: list[dict[str, Any]]
    final_keys: list[dict[str, str]]
    runs: list[CompareRun] = field(default_factory=list)
    charts: list[stream.Chart] = field(default_factory=list)
    diff: ConfigDiff | None = None
    tensorboard: str | None = None
    error: str | None = render.unless_none()


def compare_view(web: Web, who: Viewer, jobs: str | None) -> tuple[ComparePage, int]:
    """The Compare page's data and its HTTP status (400 with ``error`` for a bad id list)."""
    owner = who.owner_filter()
    picker = [  # the newest training runs, however many jobs of other kinds came after them
        {"id": str(j.id), "name": j.name, "user": j.user, "state": j.state.value, "submitted_at": j.submitted_at}
        for j in web.store.jobs(user=owner, kind="train", limit=PICKER_JOBS)
    ]
    data = ComparePage(jobs or "", picker, [{"key": k, "label": label} for k, label in FINAL_KEYS])
    if not jobs:
        return data, 200
    try:
        ids = parse_ids(jobs)
        records = [web.job(who, i) for i in ids]  # NotFoundError (404) for a foreign or unknown job
        for j in records:
            if j.spec.train is None:
                raise ConfigError(f"job {j.id} ({j.name}) is a {j.spec.kind} job; only training runs can be compared")
    except ConfigError as e:
        data.error = str(e)
        return data, 400
    runs = [_run(web, j, i) for i, j in enumerate(records)]
    per_run = max(200, stream.MAX_POINTS // max(1, len(runs)))
    for c in stream.CHARTS:
        for kind, key, label in c.series:
            title = c.title if len(c.series) == 1 else f"{c.title} ({label})"
            lines = [
                stream.ChartLine(r.id, r.label, r.color, [] if s is None else s.points(kind, key, max_points=per_run))
                for r, s in runs
            ]
            data.charts.append(stream.Chart(f"{c.id}-{kind}", title, c.unit, lines))
    data.runs = [r for r, _ in runs]
    data.diff = config_diff(data.runs)
    data.tensorboard = tensorboard_line({f"job{j.id}": tb for j in records if (tb := event_folder(web, j)) is not None})
    return data, 200


def register(app: FastAPI, web: Web) -> None:
    @app.get("/compare.json")
    @app.get("/compare")
    def compare_page(request: Request, who: Signed) -> Response:
        given = request.query_params.getlist("jobs")
        if len(given) > 1:  # the form's checkboxes: to the shareable comma form
            joined = ",".join(v for v in given if v)
            path = request.url.path
            return RedirectResponse(f"{path}?jobs={quote(joined, safe=',')}", status_code=303)
        jobs = given[0] if given else None
        if jobs is not None and len(jobs) > 400:
            raise ConfigError("jobs=...: too long; compare at most 8 runs, e.g. jobs=3,5")
        data, status = compare_view(web, who, jobs)
        title = "Compare runs" if not data.runs else "Compare " + ", ".join(f"job {r.id}" for r in data.runs)
        return render.page(request, "compare.html", data, who, title=title, status=status,
                           extra={"tensorboard_port": TENSORBOARD_PORT})  # fmt: skip
