"""The Video pages: queue a video job (``[video]``, `deskpod.jobs.kinds.video`), and watch one: each stream's fps,
lag, frames, tracks and state, the newest tracks with their thumbnails, and a search box that takes a photo of a
face and lists the tracks that match it.

::

    GET  /ui/video                      the viewer's video jobs and the New video job form (twin: /ui/video.json)
    POST /ui/video/new                  queue a video job (JSON with Accept: application/json: 201 and the job)
    GET  /ui/jobs/<id>/video            one video job's page (twin: /ui/jobs/<id>/video.json)
    GET  /ui/jobs/<id>/video/thumbs/N.jpg   track N's thumbnail
    POST /ui/jobs/<id>/video/search     a photo (multipart ``photo``): the tracks whose face matches it

The dashboard never imports the video application (its models would load into the pod service) and reads nothing
of the job's as root unchecked. The figures are the job folder's ``video-stats.json``, which the indexer rewrites
every few seconds (`deskpod.video.progress`), read as `deskpod.envs.userfiles` reads a user's file: no link
followed, the account's own. A thumbnail is read the same way from beside the job's database, and must be the
job's account's. A search runs ``deskpod video search --json`` in a process of the job's OS account (on a root
pod; the dashboard's own elsewhere), on the photo written to a folder of that account's: the database, its face
index and the photo are opened with the account's rights only. Another user's job is a 404, as on every page.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from deskpod.envs.accounts import Account, current_account
from deskpod.envs.userfiles import RefusedFile, check_owned, open_path, read_path, stat_path, write_no_follow
from deskpod.errors import ConfigError, ConflictError, DataError, DeskpodError, NotFoundError, RunError, TooLargeError
from deskpod.jobs.api import status_of
from deskpod.jobs.isolation import box_environment, open_as
from deskpod.jobs.kinds import video as kind
from deskpod.jobs.states import FINAL
from deskpod.jobs.store import JobRecord
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.session import ROOT, Signed, Viewer, form_csrf

MAX_PHOTO_BYTES = 10 << 20
"""The largest photo a search takes."""
MAX_THUMB_BYTES = 4 << 20
MAX_STATS_BYTES = 1 << 20
SEARCH_TIMEOUT_S = 180.0
"""A search loads dlib's models and the face index in a new process: seconds, more on a busy box."""
ALERTS = 50
"""Newest alerts shown."""
ALERTS_TTL_S = 4.0
"""How long one reading of a job's alerts serves its page (the page polls every `REFRESH_S`)."""
ALERTS_TIMEOUT_S = 60.0
REFRESH_S = 5
"""The page's script fetches its JSON twin this often while the job is active."""
ALERT_FIELDS = ("id", "rule", "kind", "track", "stream", "label", "t", "created", "state", "attempts", "error",
                "delivered")  # fmt: skip
TOP = 20
LISTED = 50
"""Video jobs listed on ``/ui/video``, newest first."""
_THUMB = re.compile(r"^[0-9]{1,18}\.jpg$")
_DESKPOD_ROOT = str(Path(__file__).resolve().parents[2])
"""Where the dashboard's own deskpod package lies: the search runs that one."""
_NO_DB = "job {job} has no index database yet (its folder {path!r} is not there); search once it has indexed"


@dataclass
class VideoPage:
    """One video job's page (twin: ``/ui/jobs/<id>/video.json``)."""

    job: dict[str, Any]
    """id, name, user, state."""
    sources: list[str]
    db: str
    stats: dict[str, Any] | None
    """The job's ``video-stats.json`` (`deskpod.video.progress`), each newest track with its ``thumbnail_url``;
    None before the indexer first wrote it."""
    updated_s: float | None
    """Seconds since the figures were written."""
    photo: str | None = None
    """The searched photo's file name."""
    results: list[dict[str, Any]] | None = None
    """The search's matches, best first: track, stream, start, end, similarity, thumbnail_url."""
    rules: list[dict[str, Any]] = field(default_factory=list)
    """The job's watch rules as given (kind, name, region or photos, ...)."""
    webhook: bool = False
    """Whether its alerts go to a webhook too (the URL is not shown: it may hold a token)."""
    alerts: list[dict[str, Any]] = field(default_factory=list)
    """Its newest alerts, newest first: id, rule, kind, track, stream, label, t, created, detail (a line), state,
    attempts, error, delivered, thumbnail_url."""
    alerts_error: str | None = None
    """Why the alerts could not be read (None when they were)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """The indexer's last events, newest first: t (Unix time), text (a stream's end or error, a drop, a
    reconnect, a webhook's failure)."""
    refresh_s: int | None = None
    """The page's script fetches this page's JSON twin this often (None: the job has ended)."""
    error: str | None = render.unless_none()


@dataclass
class VideoJobs:
    """``/ui/video``: the viewer's video jobs and the New video job form."""

    jobs: list[dict[str, Any]]
    detectors: list[str]
    device_count: int
    form: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)
    error: str | None = render.unless_none()


# ----------------------------------------------------------------------------------------- a job's files
def video_job(web: Web, who: Viewer, job_id: str) -> JobRecord:
    """The viewer's video job ``job_id``; a foreign, unknown or other kind of job is a 404."""
    job: JobRecord = web.job(who, job_id)
    if job.spec.video is None:
        raise NotFoundError(f"job {job.id} is not a video job; see {ROOT}/video")
    return job


def job_account(web: Web, job: JobRecord) -> Account | None:
    """The OS account the job runs as, when it is not the pod's own (a root pod's user's)."""
    isolation = web.pod.isolation
    user = web.store.user(job.user)
    if isolation is None or user is None:
        return None
    try:
        return isolation.account(user)
    except DeskpodError:  # the user's account went away: nothing of theirs is read for them
        raise NotFoundError(f"job {job.id}: its user {job.user!r} has no OS account on this box now") from None


def read_stats(web: Web, job: JobRecord) -> tuple[dict[str, Any] | None, float | None]:
    """The job's figures and their age in seconds (None, None before the first write, or when unreadable)."""
    path = web.pod.job_folder(job) / kind.STATS_FILE
    st = stat_path(path)  # the job's account may have put a link or a FIFO there
    if st is None:
        return None, None
    try:
        doc = json.loads(read_path(path, limit=MAX_STATS_BYTES))
    except (OSError, ValueError, RecursionError):
        return None, None
    if not isinstance(doc, dict) or not isinstance(doc.get("streams"), list):
        return None, None
    base = f"{ROOT}/jobs/{job.id}/video/thumbs"
    latest = [t for t in doc.get("latest") or [] if isinstance(t, dict)]
    for t in latest:
        thumb = str(t.get("thumbnail") or "")
        t["thumbnail_url"] = f"{base}/{thumb}" if _THUMB.match(thumb) else None
    doc["latest"] = latest
    doc["streams"] = [s for s in doc["streams"] if isinstance(s, dict)]
    return doc, max(0.0, time.time() - st.st_mtime)


def thumbnail(web: Web, job: JobRecord, name: str) -> bytes:
    """The bytes of thumbnail ``name`` (``N.jpg``) beside the job's database: opened with no link followed where
    the path is another account's (`open_path`), and refused unless it is the job's account's own file."""
    if not _THUMB.match(name):
        raise NotFoundError(f"no thumbnail {name!r}: thumbnails are named N.jpg")
    account = job_account(web, job)
    db = kind.db_path(job.spec.video or {}, web.pod.job_folder(job))
    path = db.with_name(db.name + ".thumbs") / name
    try:
        fd = open_path(path)
    except OSError:
        raise NotFoundError(f"job {job.id} has no thumbnail {name}") from None
    try:
        st = os.fstat(fd)
        if st.st_size > MAX_THUMB_BYTES:
            raise NotFoundError(f"thumbnail {name} is over {MAX_THUMB_BYTES >> 20} MiB")
        check_owned(st, str(path), account.uid if account is not None else os.geteuid())
        return os.pread(fd, MAX_THUMB_BYTES, 0)
    except RefusedFile:
        raise NotFoundError(f"job {job.id} has no thumbnail {name}") from None
    finally:
        os.close(fd)


def page_data(web: Web, job: JobRecord) -> VideoPage:
    video = job.spec.video or {}
    stats, age = read_stats(web, job)
    events = [e for e in (stats or {}).pop("events", None) or [] if isinstance(e, dict)][::-1]
    shown = [{"t": e.get("t"), "at": _clock(e.get("t"), "%H:%M:%S"), "text": str(e.get("text", ""))} for e in events]
    page = VideoPage(
        job={"id": str(job.id), "name": job.name, "user": job.user, "state": job.state.value},
        sources=list(video.get("sources", [])),
        db=str(kind.db_path(video, web.pod.job_folder(job))),
        stats=stats,
        updated_s=None if age is None else round(age, 1),
        rules=list(video.get("rules", [])),
        webhook=bool(video.get("webhook")),
        events=shown,
        refresh_s=None if job.state in FINAL else REFRESH_S,
    )
    if page.rules:
        try:
            page.alerts = alerts(web, job)
        except DeskpodError as e:
            page.alerts_error = str(e)
    return page


# ----------------------------------------------------------------------------------------- as the job's account
def run_as_job(web: Web, job: JobRecord, argv: Callable[[Path, Path], list[str]], files: dict[str, bytes],
               timeout: float, what: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``deskpod video ...`` as the job's OS account (on a root pod; the dashboard's own elsewhere), in its jobs'
    walls (`Isolation.tool_argv`), shown only the database's folder (as the account may open it) and a new folder
    of the account's holding ``files``. ``argv(database, folder)`` makes the command line from where the two are
    shown; ``what`` names it in messages. `DataError` when there is no database folder yet; `RunError` past
    ``timeout`` seconds."""
    account = job_account(web, job)
    isolation = web.pod.isolation
    db = kind.db_path(job.spec.video or {}, web.pod.job_folder(job))
    owner = (account.uid, account.gid) if account is not None else None
    folder = Path(tempfile.mkdtemp(prefix="deskpod-video-"))  # 0700, the dashboard's: given to the account
    fds: list[int] = []
    try:
        if owner is not None:
            os.chown(folder, *owner)
        for name, data in files.items():
            write_no_follow(folder / name, data, mode=0o600, owner=owner)
        try:  # the database's folder as the account may open it: what the command is shown
            who = account or current_account()
            message = _NO_DB.format(job=job.id, path="{path}")
            if isolation is not None:
                fds.append(isolation.open_folder(who, db.parent, message))
            else:
                fds.append(open_as(who, db.parent, message))
        except ConflictError as e:
            raise DataError(str(e)) from None
        fds.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        where = [Path(os.readlink(f"/proc/self/fd/{fd}")) for fd in fds]
        line = argv(where[0] / db.name, where[1])
        extra: dict[str, Any] = {}
        if isolation is not None:
            line, extra = isolation.tool_argv(account, line, [(fds[0], where[0], True), (fds[1], where[1], True)])
        env = {**box_environment(os.environ), "PYTHONPATH": _DESKPOD_ROOT}  # the dashboard's own deskpod
        if account is not None:
            env.update(HOME=str(folder), USER=account.name, LOGNAME=account.name)
        try:
            done = subprocess.run(line, env=env, cwd=folder, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, **extra)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RunError(f"the {what} took over {timeout:.0f} s; try again when the box is less busy") from None
        for name in files:  # the folder is gone when the user reads the message
            done.stderr = done.stderr.replace(str(where[1] / name), f"the {name}")
        return done
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)


def _answer(done: subprocess.CompletedProcess[str], what: str) -> list[Any]:
    """The command's JSON list; else its own last line: `DataError` for bad input (exit status 2), `RunError`
    otherwise."""
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        line = lines[-1] if lines else f"the {what} failed (exit status {done.returncode})"
        line = line.removeprefix("deskpod: ")
        raise DataError(line) if done.returncode == 2 else RunError(line)
    try:
        found = json.loads(done.stdout)
    except ValueError:
        raise RunError(f"the {what} answered something that is not JSON; see the pod service's log") from None
    return found if isinstance(found, list) else []


# ----------------------------------------------------------------------------------------- search
def search(web: Web, job: JobRecord, photo: bytes, top: int = TOP) -> list[dict[str, Any]]:
    """``deskpod video search --face PHOTO --db DB --json`` as the job's account (`run_as_job`); the matches, best
    first, each with its thumbnail's URL. `DataError` with the command's own line (no face in the photo, two
    faces, not an image, no database yet); `RunError` when it could not run."""
    done = run_as_job(
        web, job, lambda db, folder: [sys.executable, "-m", "deskpod", "video", "search", "--face",
                                      str(folder / "photo"), "--db", str(db), "--top", str(top), "--json"],
        {"photo": photo}, SEARCH_TIMEOUT_S, "search",
    )  # fmt: skip
    found = _answer(done, "search")
    base = f"{ROOT}/jobs/{job.id}/video/thumbs"
    out = []
    db = kind.db_path(job.spec.video or {}, web.pod.job_folder(job))
    for m in found:
        found_at = Path(str(m.get("thumbnail") or ""))
        # a shard's thumbnail (a Slurm job's, beside <stem>.shardK.db) is not served here: no URL rather than another's
        thumb = found_at.name if found_at.parent.name == db.name + ".thumbs" else ""
        out.append({"track": m.get("track"), "stream": m.get("stream"), "start": m.get("start"), "end": m.get("end"),
                    "similarity": m.get("similarity"),
                    "thumbnail_url": f"{base}/{thumb}" if _THUMB.match(thumb) else None})  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------- alerts
_alerts_cache: dict[tuple[int, str], tuple[float, list[dict[str, Any]]]] = {}
"""By job and state: a job that has just ended is read afresh (its watcher's last alerts and deliveries)."""
_alerts_locks: dict[int, threading.Lock] = {}
_locks_lock = threading.Lock()


def alerts(web: Web, job: JobRecord) -> list[dict[str, Any]]:
    """The job's newest alerts (`deskpod.video.alerts`), newest first, each with its thumbnail's URL; none before
    the job has a database or a watcher has written to it.

    Read by ``deskpod video alerts --json`` as the job's account in its walls (`run_as_job`), as the search is,
    and not by opening the database here: the database is a file of the account's, and SQLite run by the pod
    service (root) would parse whatever the account put there, and follow its ``-wal``/``-shm`` names. Opening
    it through a checked descriptor (``file:/proc/self/fd/N?mode=ro``) would not help: SQLite finds the WAL by
    the file's name, so a reader of that name misses the alerts still in the WAL, which are the newest. The
    answer is kept `ALERTS_TTL_S` seconds per job: a page polled by several viewers starts one process."""
    with _locks_lock:
        if len(_alerts_locks) > 256:  # jobs long gone from view; a lock in use stays referenced by its holder
            _alerts_locks.clear()
            _alerts_cache.clear()
        lock = _alerts_locks.setdefault(job.id, threading.Lock())
    with lock:  # one process per job at a time, whoever asks
        now = time.monotonic()
        hit = _alerts_cache.get((job.id, job.state.value))
        if hit is not None and now - hit[0] < ALERTS_TTL_S:
            return hit[1]
        try:
            done = run_as_job(web, job, lambda db, _folder: [sys.executable, "-m", "deskpod", "video", "alerts",
                                                              "--db", str(db), "--limit", str(ALERTS), "--json"],
                              {}, ALERTS_TIMEOUT_S, "alerts listing")  # fmt: skip
        except DataError:  # no database folder yet
            done = None
        if done is None or (done.returncode == 2 and "no such index database" in done.stderr):
            found: list[Any] = []
        else:
            found = _answer(done, "alerts listing")
        base = f"{ROOT}/jobs/{job.id}/video/thumbs"
        out = []
        for a in found:
            if not isinstance(a, dict):
                continue
            thumb = Path(str(a.get("thumbnail") or "")).name
            detail = a["detail"] if isinstance(a.get("detail"), dict) else {}
            out.append({**{k: a.get(k) for k in ALERT_FIELDS}, "raised": _clock(a.get("created"), "%Y-%m-%d %H:%M:%S"),
                        "detail": ", ".join(f"{k} {v}" for k, v in detail.items()),
                        "thumbnail_url": f"{base}/{thumb}" if _THUMB.match(thumb) else None})  # fmt: skip
        _alerts_cache[(job.id, job.state.value)] = (time.monotonic(), out)
        return out


# ----------------------------------------------------------------------------------------- new job
def jobs_data(web: Web, who: Viewer, form: dict[str, str] | None = None,
              errors: dict[str, str] | None = None) -> VideoJobs:  # fmt: skip
    jobs = [{"id": str(j.id), "name": j.name, "user": j.user, "state": j.state.value,
             "sources": len((j.spec.video or {}).get("sources", []))}
            for j in web.store.jobs(user=who.owner_filter(), kind="video", limit=LISTED)]  # fmt: skip
    values = {"sources": "", "db": "", "fps": "5", "detect": " ".join(kind.DEFAULT_DETECT),
              "batch": str(kind.BATCH[0]), "devices": "1", "name": ""}  # fmt: skip
    values.update({k: v for k, v in (form or {}).items() if k in values})
    return VideoJobs(jobs, list(kind.DETECTORS), web.pod.device_count, values, errors or {},
                     error=next(iter(errors.values())) if errors else None)  # fmt: skip


def form_spec(fields: dict[str, str]) -> dict[str, Any]:
    """The job spec the New video job form describes (the kind checks it, with its own messages)."""
    video: dict[str, Any] = {"sources": [s.strip() for s in fields.get("sources", "").splitlines() if s.strip()]}
    if fields.get("db", "").strip():
        video["db"] = fields["db"].strip()
    for key, cast in (("fps", float), ("batch", int)):
        text = fields.get(key, "").strip()
        if text:
            try:
                video[key] = cast(text)
            except ValueError:
                raise ConfigError(f"job spec: video.{key} = {text!r} is not a number") from None
    if fields.get("detect", "").strip():
        video["detect"] = fields["detect"].replace(",", " ").split()
    text = fields.get("devices", "1").strip() or "1"
    spec: dict[str, Any] = {"devices": int(text) if text.isascii() and text.isdigit() else text, "video": video}
    if fields.get("name", "").strip():
        spec["name"] = fields["name"].strip()
    return spec


def _clock(t: object, form: str) -> str:
    """A Unix time as the pod's local time (what the job's log shows), or "" for none."""
    if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < 1e11:
        return ""
    return time.strftime(form, time.localtime(t))


def _field_of(message: str) -> str:
    found = re.search(r"\b(?:video\.)?(sources|db|fps|detect|batch|devices|name)\b", message)
    return found.group(1) if found else "sources"


# ----------------------------------------------------------------------------------------- routes
def _page(request: Request, who: Viewer, data: VideoPage, status: int = 200) -> Response:
    return render.page(request, "video.html", data, who, title=f"Video · job {data.job['id']}", status=status)


async def _photo(request: Request) -> bytes:
    form = await request.form()
    upload = form.get("photo")
    if not isinstance(upload, UploadFile) or not upload.filename:
        raise ConfigError("choose a photo of one face to search for")
    data = await upload.read(MAX_PHOTO_BYTES + 1)
    if len(data) > MAX_PHOTO_BYTES:
        raise TooLargeError(f"the photo is over the limit of {MAX_PHOTO_BYTES >> 20} MiB; choose a smaller one")
    if not data:
        raise ConfigError(f"{upload.filename}: the file is empty; choose a photo of one face")
    return data


def register(app: FastAPI, web: Web) -> None:
    @app.get("/video.json")
    @app.get("/video")
    def video_jobs(request: Request, who: Signed) -> Response:
        return render.page(request, "video_jobs.html", jobs_data(web, who), who, title="Video")

    @app.post("/video/new")
    async def new_video_job(request: Request, who: Signed) -> Response:
        fields = await form_csrf(request, who)
        try:
            job = await run_in_threadpool(web.pod.submit, who.user, form_spec(fields))
        except DeskpodError as e:
            data = jobs_data(web, who, fields, {_field_of(str(e)): str(e)})
            return render.page(request, "video_jobs.html", data, who, title="Video", status=400)
        if render.wants_json(request):
            return JSONResponse(job.to_json(), status_code=201)
        return RedirectResponse(f"{ROOT}/jobs/{job.id}/video", status_code=303)

    @app.get("/jobs/{job_id}/video.json")
    @app.get("/jobs/{job_id}/video")
    def video_page(request: Request, job_id: str, who: Signed) -> Response:
        job = video_job(web, who, job_id)
        return _page(request, who, page_data(web, job))

    @app.get("/jobs/{job_id}/video/thumbs/{name}")
    def video_thumbnail(job_id: str, name: str, who: Signed) -> Response:
        job = video_job(web, who, job_id)
        return Response(thumbnail(web, job, name), media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=60", "X-Content-Type-Options": "nosniff"})  # fmt: skip

    @app.post("/jobs/{job_id}/video/search")
    async def video_search(request: Request, job_id: str, who: Signed) -> Response:
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > MAX_PHOTO_BYTES + (64 << 10):
            raise TooLargeError(f"the upload is over the limit of {MAX_PHOTO_BYTES >> 20} MiB; choose a smaller photo")
        await form_csrf(request, who)
        job = video_job(web, who, job_id)
        data = await run_in_threadpool(page_data, web, job)
        form = await request.form()
        upload = form.get("photo")
        data.photo = str(upload.filename) if isinstance(upload, UploadFile) else None
        try:
            photo = await _photo(request)
            data.results = await run_in_threadpool(search, web, job, photo)
        except DeskpodError as e:
            if render.wants_json(request):
                raise
            data.error = str(e)
            return _page(request, who, data, status=status_of(e))
        if render.wants_json(request):
            return JSONResponse({"job": data.job["id"], "photo": data.photo, "results": data.results})
        return _page(request, who, data)
