"""The Job page's live stream: one Server-Sent Events connection per open page, sending only deltas.

``GET /ui/jobs/<id>/events`` answers ``text/event-stream``; each event's ``data`` is one JSON object::

    state    the job's header (state, reason, times, what the buttons may do) and its history:
             on connect, and whenever it changed
    metrics  new points of the charted series since the last event, {"series": {"train/loss": [[step, v], ...]}}
    reset    every charted series afresh (downsampled): the client had no cursor, or metrics.jsonl was
             rewritten (a resumed run drops the records past its checkpoint), or the client is far behind
    log      new text of the job's output.log, {"text", "offset"}; with "reset": true the client replaces
             its view by ``text`` (the log's tail: first connect, a truncated log, or too far behind)
    run      the run's summary, checkpoints and resolved config as HTML, {"html": {container id: html}}:
             on connect, and whenever a checkpoint, the config or the summary was written
    end      the job is final and everything was sent; the page closes its EventSource (which would
             otherwise reconnect)

Every event carries ``id: <inode>.<train rows>.<val rows>.<log offset>`` — how far this client has
got — so a reconnect (``Last-Event-ID``, or ``?cursor=`` from the page's own data) resumes where it
stopped instead of starting over; a cursor from another file (its inode changed) gets a reset.

Cheap enough for 50 tabs beside a busy scheduler: a connection polls at 4 Hz, and a tick costs two
``stat`` calls and one integer compare (`Store.touched`); the job is re-read only when the store
wrote to it (and then once for all connections, shared through ``web.cache``), metrics.jsonl is parsed
only when its size changed, once for every reader (`web.series`), and big reads go to a thread. A
comment line every 15 s keeps proxies from closing an idle stream. The generator ends within a
tick once the daemon shuts down (``pod.stopping``), the client goes away, or its viewer is revoked
or signed out (`Store.revocations` moved and the viewer's session or token is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deskpod.envs.userfiles import read_path, stat_path
from deskpod.jobs.states import FINAL, REQUEUABLE, JobState
from deskpod.jobs.store import JobRecord
from deskpod.train.runs import RunPaths
from deskpod.web import logs, render, runinfo
from deskpod.web.app import Web
from deskpod.web.series import KINDS, Series

POLL_S = 0.25
RUN_CHECK_S = 1.0
"""How often a stream looks for new checkpoints, config or summary (they change rarely)."""
HEARTBEAT_S = 15.0
DISCONNECT_CHECK_S = 5.0
"""How often a stream asks whether its client left (a write to a gone client also ends it)."""
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


@dataclass
class ChartLine:
    """One line of a chart: a series of ``[x, y]`` points, drawn in colour ``color`` (``--s1`` ..)."""

    id: str
    label: str
    color: str
    points: list[list[float]]


@dataclass
class Chart:
    """A chart as the page's script draws it."""

    id: str
    title: str
    unit: str
    series: list[ChartLine]


def charts(points: dict[str, list[list[float]]]) -> list[Chart]:
    """The Job page's charts over ``points`` (`chart_points`)."""

    def line(i: int, kind: str, key: str, label: str) -> ChartLine:
        return ChartLine(series_id(kind, key), label, f"--s{i + 1}", points[series_id(kind, key)])

    return [Chart(c.id, c.title, c.unit, [line(i, *s) for i, s in enumerate(c.series)]) for c in CHARTS]


def chart_points(s: Series, rows: dict[str, int], max_points: int = MAX_POINTS) -> dict[str, list[list[float]]]:
    """Every charted series up to ``rows`` (per kind), downsampled to ``max_points``."""
    return {
        series_id(kind, key): s.points(kind, key, end=rows.get(kind, 0), max_points=max_points) for kind, key in CHARTED
    }


def _shared(web: Web, key: tuple[Any, ...], make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``make()``, computed once for every tab that needs it at this position of a run's metrics (tabs opened or
    reconnecting together after a daemon restart): the object is shared, so `Follower.event` encodes it once."""
    memo: dict[tuple[Any, ...], dict[str, Any]] = web.cache.setdefault("stream.deltas", {})
    hit = memo.get(key)
    if hit is None:
        if len(memo) > 1024:
            memo.clear()
        hit = memo[key] = make()
    return hit


def _reset(web: Web, s: Series, generation: int, rows: dict[str, int], max_points: int) -> dict[str, Any]:
    """A reset's data: every charted series up to ``rows``."""
    key = ("reset", str(s.path), generation, max_points, *(rows[k] for k in KINDS))
    return _shared(web, key, lambda: {"series": chart_points(s, rows, max_points)})


def is_final(job: JobRecord) -> bool:
    """Ended for good: succeeded or cancelled, or failed/lost with no retry left (a user may still requeue)."""
    return job.state in (JobState.SUCCEEDED, JobState.CANCELLED) or (job.state in FINAL and job.failures > job.retries)


@dataclass
class Live:
    """The part of the Job page that changes with the job's state (the header, its buttons, its history): what a
    ``state`` event sends."""

    id: str
    state: str
    reason: str
    devices: int
    assigned: list[int]
    attempt: int
    exit_code: int | None
    stopping: str | None
    """Why the job is being stopped (None: it is not)."""
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    active: bool
    final: bool
    can_cancel: bool
    can_requeue: bool
    events: list[dict[str, Any]]
    """`Store.events`: its history."""


def job_state(job: JobRecord, events: list[dict[str, Any]]) -> Live:
    active = job.state.active
    return render.fields_from(
        Live,
        job.to_json(),
        active=active,
        final=is_final(job),
        can_cancel=(job.state is JobState.QUEUED or active) and not job.stop_reason,
        can_requeue=job.state in REQUEUABLE or active,
        events=events,
    )


def _cached_job(web: Web, job_id: int, version: int) -> tuple[JobRecord | None, list[dict[str, Any]]] | None:
    """What another stream of this job already read at its ``version`` (`Store.touched`; None: nobody has)."""
    hit = web.cache.setdefault("stream.jobs", {}).get(job_id)
    return (hit[1], hit[2]) if hit is not None and hit[0] == version else None


def _read_job(web: Web, job_id: int, version: int) -> tuple[JobRecord | None, list[dict[str, Any]]]:
    """The job and its history at its ``version`` (`Store.touched`), read once for every stream of that job."""
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


class Follower:
    """One client's view of one job: what was sent, and what is new since."""

    def __init__(self, web: Web, job: JobRecord, cursor: Cursor | None, *, max_points: int = MAX_POINTS) -> None:
        self.web, self.job, self.job_id, self.max_points = web, job, job.id, max_points
        run = web.run_dir(job)
        self.run: Path | None = run
        self.metrics: Path | None = None if run is None else RunPaths(run).metrics
        self._run_sig: tuple[int, ...] | None = None
        self.log = web.pod.job_folder(job) / "output.log"
        self.cursor = cursor or Cursor()
        self.version = -1
        self.header: Live | None = None
        self.final = False
        self._metrics_sig: tuple[int, int, int] | bool | None = False  # False: never looked
        self._series: Series | None = None
        self._generation = -1

    def event(self, name: str, data: Any) -> str:
        bodies: dict[int, tuple[Any, str]] = self.web.cache.setdefault("stream.bodies", {})
        hit = bodies.get(id(data))
        if hit is not None and hit[0] is data:  # a shared delta (`_delta`): encoded once for every tab
            body = hit[1]
        else:
            body = render.json_text(data, separators=(",", ":"), allow_nan=False)
            if name in ("metrics", "reset"):
                if len(bodies) > 1024:
                    bodies.clear()
                bodies[id(data)] = (data, body)
        return f"id: {self.cursor.encode()}\nevent: {name}\ndata: {body}\n\n"

    async def step(self) -> list[str]:
        """The events of one tick: state first (so a final job's files are read after it ended)."""
        out: list[str] = []
        version = self.web.store.touched(self.job_id)  # changes only when this job was written
        if version != self.version:
            self.version = version
            got = _cached_job(self.web, self.job_id, version)  # the other tabs of this job read it already
            job, events = got if got is not None else await asyncio.to_thread(_read_job, self.web, self.job_id, version)
            if job is None:  # gone from the store: nothing more will come
                self.final = True
            else:
                head = job_state(job, events)
                self.final = head.final
                if head != self.header:
                    self.header = head
                    out.append(self.event("state", head))
        if self.metrics is not None:
            out.extend(await self._metrics(self.metrics))
        if self.run is not None:  # the job's `Watch` looks at the run's files once a second and wakes us
            out.extend(await self._run(self.run))
        out.extend(await self._log())
        return out

    async def _run(self, run: Path) -> list[str]:
        sig = runinfo.signature(run)  # three stat calls
        if sig == self._run_sig or self.metrics is None:
            return []
        self._run_sig = sig
        s = await asyncio.to_thread(self.web.series.get, self.metrics)
        html = await asyncio.to_thread(runinfo.parts, self.web, self.job, run, s)
        return [self.event("run", {"html": html})]

    async def _metrics(self, path: Path) -> list[str]:
        st = stat_path(path)  # no link the job's user planted is followed, no FIFO waited on
        sig = None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)
        if sig == self._metrics_sig:
            return []
        # Another tab of this run has usually read the new rows already: then no thread hop, no I/O.
        ready = None if st is None else self.web.series.current(path, st)
        s: Series = ready if ready is not None else await asyncio.to_thread(self.web.series.get, path)
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
            name, data = "reset", _reset(self.web, s, gen, rows, self.max_points)
        else:
            name, data = "metrics", _delta(self.web, s, gen, c.rows, rows)
        if s.generation != gen:  # rewritten while we read: look again next tick
            self._metrics_sig = False
            return []
        self._series, self._generation, self._metrics_sig = s, gen, sig
        c.inode, c.rows = inode, rows
        return [self.event(name, data)] if reset or data["series"] else []

    async def _log(self) -> list[str]:
        st = stat_path(self.log)
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


def _delta(web: Web, s: Series, generation: int, start: dict[str, int], end: dict[str, int]) -> dict[str, Any]:
    """The new points between two positions of a run's metrics."""

    def points() -> dict[str, Any]:
        pts = {series_id(kind, k): s.points(kind, k, start=start.get(kind, 0), end=end[kind])
               for kind, k in CHARTED if end[kind] > start.get(kind, 0)}  # fmt: skip
        return {"series": {k: v for k, v in pts.items() if v}}

    return _shared(web, (str(s.path), generation, *(start.get(k, 0) for k in KINDS), *(end[k] for k in KINDS)), points)


def _read(path: Path, offset: int, n: int) -> bytes:
    try:
        return read_path(path, offset=offset, limit=n)
    except OSError:
        return b""


async def _aread(path: Path, offset: int, n: int) -> bytes:
    return _read(path, offset, n)


class Watch:
    """One poller per watched job, shared by all of its streams: every ``poll_s`` it looks at the job's
    store entry (`Store.touched`) and its files (two ``stat`` calls; the run's checkpoints, config and
    summary once a second) and wakes the streams when something changed. A stream costs nothing between
    changes, however many tabs are open; the poller ends with its last stream."""

    def __init__(self, web: Web, job: JobRecord, poll_s: float) -> None:
        self.web, self.job_id, self.poll_s = web, job.id, poll_s
        run = web.run_dir(job)
        self.run: Path | None = run
        self.files = [p for p in (None if run is None else RunPaths(run).metrics, web.pod.job_folder(job) / "output.log")
                      if p is not None]  # fmt: skip
        self.streams = 0
        self.generation = 0
        """Counts the changes seen: a stream that has handled generation g waits only if nothing came since."""
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def join(self) -> None:
        self.streams += 1
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    def leave(self) -> None:
        self.streams -= 1

    async def wait(self, seen: int, timeout: float) -> None:
        """Until a change after generation ``seen`` (at once if one came already), or ``timeout`` seconds."""
        if self.generation != seen:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)

    def _wake(self) -> None:
        self.generation += 1
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    async def _loop(self) -> None:
        stopping = self.web.pod.stopping
        last: tuple[Any, ...] | None = None
        run_sig: tuple[int, ...] = ()
        run_checked = -RUN_CHECK_S
        while self.streams > 0 and not stopping.is_set():
            now = time.monotonic()
            if self.run is not None and now - run_checked >= RUN_CHECK_S:
                run_checked, run_sig = now, runinfo.signature(self.run)
            stats = tuple((st.st_ino, st.st_size, st.st_mtime_ns) if (st := stat_path(p)) else None for p in self.files)
            sig = (self.web.store.touched(self.job_id), self.web.store.revocations, stats, run_sig)
            if sig != last:
                last = sig
                self._wake()
            await asyncio.sleep(self.poll_s)
        self._wake()  # shutting down (or no stream left): nobody waits for ever


def _watch(web: Web, job: JobRecord, poll_s: float) -> Watch:
    watches: dict[int, Watch] = web.cache.setdefault("stream.watches", {})
    w = watches.get(job.id)
    if w is None or (w.streams <= 0 and w._task is not None and w._task.done()):
        w = watches[job.id] = Watch(web, job, poll_s)
    return w


async def job_events(
    web: Web,
    job: JobRecord,
    cursor: Cursor | None,
    disconnected: Callable[[], Awaitable[bool]],
    *,
    signed_in: Callable[[], Awaitable[bool]] | None = None,
    poll_s: float = POLL_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> AsyncIterator[str]:
    """The event stream of one job for one client (see the module docstring). ``signed_in`` is asked before each
    step (`deskpod.web.session.SignedIn`): the stream ends once its viewer is revoked or signed out, within a tick
    of the revocation, which the job's poller turns into a wake-up (it watches `Store.revocations`)."""
    follower = Follower(web, job, cursor)
    watch = _watch(web, job, poll_s)
    watch.join()
    stopping = web.pod.stopping
    try:
        yield "retry: 2000\n\n"
        last_sent = last_check = time.monotonic()
        while not stopping.is_set():
            seen = watch.generation
            if signed_in is not None and not await signed_in():
                return
            events = await follower.step()
            if events:
                yield "".join(events)  # one write per wake-up, however many events
            now = time.monotonic()
            if events:
                last_sent = now
                continue  # step again at once: the rest of a long log, or the end of a job that just ended
            if follower.final:  # nothing new after the job ended: everything was sent
                yield follower.event("end", {"state": follower.header.state if follower.header else None})
                return
            if now - last_sent >= heartbeat_s:
                yield ": keep-alive\n\n"
                last_sent = now
            if now - last_check >= DISCONNECT_CHECK_S:
                last_check = now
                if await disconnected():
                    return
            # Until the job's poller sees a change; at the latest when the next check is due.
            await watch.wait(seen, max(0.05, min(last_sent + heartbeat_s, last_check + DISCONNECT_CHECK_S) - now))
    finally:
        watch.leave()
