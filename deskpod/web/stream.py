"""The Job page's live stream: one Server-Sent Events connection per open page, sending only deltas.

``GET /ui/jobs/<id>/events`` answers ``text/event-stream``; each event's ``data`` is one JSON object::

    state    the job's header (state, reason, times, what the buttons may do) and its history:
             on connect, and whenever it changed
    metrics  new points of the charted series since the last event, {"series": {"train/loss": [[step, v], ...]}}
    reset    every charted series afresh (downsampled): the client had no cursor, or metrics.jsonl was
             rewritten (a resumed run drops the records past its checkpoint), or the client is far behind
    log      new text of the job's output.log, {"text", "offset"}; with "reset": true the client replaces
             its view by ``text`` (the log's tail: first connect, a truncated log, or too far behind)
    end      the job is final and everything was sent; the page closes its EventSource (which would
             otherwise reconnect)

Every event carries ``id: <inode>.<train rows>.<val rows>.<log offset>`` — how far this client has
got — so a reconnect (``Last-Event-ID``, or ``?cursor=`` from the page's own data) resumes where it
stopped instead of starting over; a cursor from another file (its inode changed) gets a reset.

Cheap enough for 50 tabs beside a busy scheduler: a connection polls at 4 Hz, and a tick costs two
``stat`` calls and one integer compare (`Store.version`); the job is re-read only when the store
changed (and then once for all connections, shared through ``web.cache``), metrics.jsonl is parsed
only when its size changed, once for every reader (`web.series`), and big reads go to a thread. A
comment line every 15 s keeps proxies from closing an idle stream. The generator ends within a
tick once the daemon shuts down (``pod.stopping``) or the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deskpod.jobs.states import FINAL, REQUEUABLE, JobState
from deskpod.jobs.store import JobRecord
from deskpod.train.runs import RunPaths
from deskpod.web import logs
from deskpod.web.series import KINDS, Series

POLL_S = 0.25
HEARTBEAT_S = 15.0
DISCONNECT_CHECK_S = 1.0
MAX_POINTS = 2000
"""Points per series a chart starts with (the server downsamples longer runs to this)."""
LOG_CHUNK = 1024 * 1024
"""Log bytes sent per tick at most."""
LOG_MAX_BEHIND = 4 * 1024 * 1024
"""A client further behind than this gets the log's tail instead of everything it missed."""
INLINE_READ = 64 * 1024
"""Reads up to this size stay on the event loop; bigger ones go to a thread."""


@dataclass(frozen=True, slots=True)
class ChartDef:
    id: str
    title: str
    series: tuple[tuple[str, str, str], ...]
    """(kind, key, label) of each line: ``("train", "loss", "train")``."""
    unit: str = ""
    """``percent`` for fractions shown as %."""


CHARTS = (
    ChartDef("loss", "Loss", (("train", "loss", "train"), ("val", "val_loss", "validation"))),
    ChartDef("accuracy", "Validation accuracy", (("val", "val_accuracy", "validation"),), "percent"),
    ChartDef("lr", "Learning rate", (("train", "lr", "learning rate"),)),
    ChartDef("throughput", "Images per second", (("train", "images_per_s", "images/s"),)),
    ChartDef("data_wait", "Data wait (share of step time)", (("train", "data_wait_fraction", "data wait"),), "percent"),
)
"""What the Job page charts, from ``metrics.jsonl`` (see `deskpod.train.metrics`)."""

CHARTED = tuple(dict.fromkeys((kind, key) for c in CHARTS for kind, key, _ in c.series))


def series_id(kind: str, key: str) -> str:
    return f"{kind}/{key}"


def chart_defs() -> list[dict[str, Any]]:
    """The charts as the page's script builds them (points filled in by `chart_points`)."""
    return [
        {
            "id": c.id,
            "title": c.title,
            "unit": c.unit,
            "series": [
                {"id": series_id(kind, key), "label": label, "color": f"--s{i + 1}"}
                for i, (kind, key, label) in enumerate(c.series)
            ],
        }
        for c in CHARTS
    ]


def chart_points(s: Series, rows: dict[str, int], max_points: int = MAX_POINTS) -> dict[str, list[list[float]]]:
    """Every charted series up to ``rows`` (per kind), downsampled to ``max_points``."""
    return {
        series_id(kind, key): s.points(kind, key, end=rows.get(kind, 0), max_points=max_points) for kind, key in CHARTED
    }


def is_final(job: JobRecord) -> bool:
    """Ended for good: succeeded or cancelled, or failed/lost with no retry left (a user may still requeue)."""
    return job.state in (JobState.SUCCEEDED, JobState.CANCELLED) or (job.state in FINAL and job.failures > job.retries)


def job_state(job: JobRecord, events: list[dict[str, Any]]) -> dict[str, Any]:
    """The part of the Job page that changes with the job's state (the header, its buttons, its history)."""
    active = job.state.active
    return {
        "id": str(job.id),
        "state": job.state.value,
        "reason": job.reason,
        "devices": job.devices,
        "assigned": list(job.assigned),
        "attempt": job.attempt,
        "exit_code": job.exit_code,
        "stopping": job.stop_reason,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "active": active,
        "final": is_final(job),
        "can_cancel": (job.state is JobState.QUEUED or active) and not job.stop_reason,
        "can_requeue": job.state in REQUEUABLE or active,
        "events": events,
    }


def _cached_job(web: Any, job_id: int, version: int) -> tuple[JobRecord | None, list[dict[str, Any]]] | None:
    """What another stream of this job already read at store ``version`` (None: nobody has)."""
    hit = web.cache.setdefault("stream.jobs", {}).get(job_id)
    return (hit[1], hit[2]) if hit is not None and hit[0] == version else None


def _read_job(web: Any, job_id: int, version: int) -> tuple[JobRecord | None, list[dict[str, Any]]]:
    """The job and its history at store ``version``, read once for every stream of that job."""
    cache: dict[int, tuple[int, JobRecord | None, list[dict[str, Any]]]] = web.cache.setdefault("stream.jobs", {})
    hit = _cached_job(web, job_id, version)
    if hit is not None:
        return hit
    job = web.store.job(job_id)
    events = web.store.events(job_id) if job is not None else []
    if len(cache) > 4096:
        cache.clear()
    cache[job_id] = (version, job, events)  # tagged with the version read *before*: a later write re-reads
    return job, events


@dataclass
class Cursor:
    """How far a client has got: the metrics file's inode, rows per kind, and output.log bytes."""

    inode: int = -1
    """-1: nothing yet (the client gets a reset)."""
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    log: int = -1
    """-1: nothing yet (the client gets the log's tail)."""

    def encode(self) -> str:
        return ".".join([str(self.inode), *(str(self.rows.get(k, 0)) for k in KINDS), str(self.log)])

    @classmethod
    def parse(cls, text: str | None) -> Cursor | None:
        """The cursor of an event id; None for a missing or malformed one (the client starts afresh)."""
        if not text or len(text) > 200:
            return None
        parts = text.strip().split(".")
        if len(parts) != len(KINDS) + 2:
            return None
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            return None
        if nums[0] < -1 or nums[-1] < -1 or any(n < 0 for n in nums[1:-1]):
            return None
        return cls(nums[0], dict(zip(KINDS, nums[1:-1], strict=True)), nums[-1])


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


class Follower:
    """One client's view of one job: what was sent, and what is new since."""

    def __init__(self, web: Any, job: JobRecord, cursor: Cursor | None, *, max_points: int = MAX_POINTS) -> None:
        self.web, self.job_id, self.max_points = web, job.id, max_points
        run = web.run_dir(job)
        self.metrics: Path | None = None if run is None else RunPaths(run).metrics
        self.log = web.pod.job_folder(job) / "output.log"
        self.cursor = cursor or Cursor()
        self.version = -1
        self.header: dict[str, Any] | None = None
        self.final = False
        self._metrics_sig: tuple[int, int, int] | bool | None = False  # False: never looked
        self._series: Series | None = None
        self._generation = -1

    def event(self, name: str, data: Any) -> str:
        body = json.dumps(data, separators=(",", ":"), allow_nan=False)
        return f"id: {self.cursor.encode()}\nevent: {name}\ndata: {body}\n\n"

    async def step(self) -> list[str]:
        """The events of one tick: state first (so a final job's files are read after it ended)."""
        out: list[str] = []
        version = self.web.store.version
        if version != self.version:
            self.version = version
            got = _cached_job(self.web, self.job_id, version)  # the other tabs of this job read it already
            job, events = got if got is not None else await asyncio.to_thread(_read_job, self.web, self.job_id, version)
            if job is None:  # gone from the store: nothing more will come
                self.final = True
            else:
                head = job_state(job, events)
                self.final = bool(head["final"])
                if head != self.header:
                    self.header = head
                    out.append(self.event("state", head))
        if self.metrics is not None:
            out.extend(await self._metrics(self.metrics))
        out.extend(await self._log())
        return out

    async def _metrics(self, path: Path) -> list[str]:
        st = _stat(path)
        sig = None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)
        if sig == self._metrics_sig:
            return []
        s: Series = await asyncio.to_thread(self.web.series.get, path)
        gen = s.generation
        rows = {k: s.rows(k) for k in KINDS}
        inode = 0 if st is None else st.st_ino
        c = self.cursor
        new = sum(rows[k] - c.rows.get(k, 0) for k in KINDS)
        reset = (
            c.inode != inode
            or any(rows[k] < c.rows.get(k, 0) for k in KINDS)
            or (s is self._series and gen != self._generation)  # rewritten in place and read afresh
            or new > self.max_points
        )
        if reset:
            name, data = "reset", {"series": chart_points(s, rows, self.max_points)}
        else:
            pts = {
                series_id(kind, key): s.points(kind, key, start=c.rows.get(kind, 0), end=rows[kind])
                for kind, key in CHARTED
                if rows[kind] > c.rows.get(kind, 0)
            }
            name, data = "metrics", {"series": {k: v for k, v in pts.items() if v}}
        if s.generation != gen:  # rewritten while we read: look again next tick
            self._metrics_sig = False
            return []
        self._series, self._generation, self._metrics_sig = s, gen, sig
        c.inode, c.rows = inode, rows
        return [self.event(name, data)] if reset or data["series"] else []

    async def _log(self) -> list[str]:
        st = _stat(self.log)
        size = 0 if st is None else st.st_size
        c = self.cursor
        if c.log < 0 or size < c.log or size - c.log > LOG_MAX_BEHIND:
            skipped = max(0, size - c.log) if c.log >= 0 else 0
            text, offset, cut = await asyncio.to_thread(logs.tail, self.log)
            c.log = offset
            return [self.event("log", {"reset": True, "text": text, "offset": offset, "cut": cut, "skipped": skipped})]
        if size == c.log:
            return []
        want = min(size - c.log, LOG_CHUNK)
        chunk = await (
            asyncio.to_thread(_read, self.log, c.log, want) if want > INLINE_READ else _aread(self.log, c.log, want)
        )
        keep = len(chunk) if self.final else logs.utf8_cut(chunk)  # a final log gets its last bytes as they are
        if keep == 0:
            return []
        c.log += keep
        return [self.event("log", {"text": chunk[:keep].decode("utf-8", "replace"), "offset": c.log})]


def _read(path: Path, offset: int, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(n)
    except OSError:
        return b""


async def _aread(path: Path, offset: int, n: int) -> bytes:
    return _read(path, offset, n)


async def job_events(
    web: Any,
    job: JobRecord,
    cursor: Cursor | None,
    disconnected: Callable[[], Awaitable[bool]],
    *,
    poll_s: float = POLL_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> AsyncIterator[str]:
    """The event stream of one job for one client (see the module docstring)."""
    follower = Follower(web, job, cursor)
    stopping = web.pod.stopping
    yield "retry: 2000\n\n"
    last_sent = last_check = time.monotonic()
    while not stopping.is_set():
        events = await follower.step()
        for e in events:
            yield e
        now = time.monotonic()
        if events:
            last_sent = now
        elif follower.final:  # nothing new after the job ended: everything was sent
            yield follower.event("end", {"state": (follower.header or {}).get("state")})
            return
        if now - last_sent >= heartbeat_s:
            yield ": keep-alive\n\n"
            last_sent = now
        if now - last_check >= DISCONNECT_CHECK_S:
            last_check = now
            if await disconnected():
                return
        await asyncio.sleep(poll_s)
