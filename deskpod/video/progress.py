"""The indexer's figures as a small JSON file, rewritten (atomically) every few seconds: what the dashboard's page
of a video job shows, and what anyone can ``cat`` while ``deskpod video index --stats FILE`` runs for days::

    {"updated": 1718000000.5, "started": 1717990000.1, "db": "/abs/video.db", "pid": 4242, "running": true,
     "streams": [{"name": "vtest.avi", "state": "indexing", "error": "", "frames": 812, "fps": 5.1,
                  "mean_fps": 4.9, "lag": 0.0, "max_lag": 0.0, "tracks": 37}, ...],
     "tracks": 37, "latest": [{"id": 37, "stream": "vtest.avi", "label": "person", "start": 161.2,
                               "end": 163.0, "thumbnail": "37.jpg"}, ...],
     "events": [{"t": 1717990001.2, "text": "gate: stream dropped (...)"}, ...]}

``fps`` is the rate over the last interval (what the stream holds now), ``mean_fps`` over its whole run; ``lag`` is
the last frame's lag behind live (0 for a file); ``tracks`` are the tracks it started in this run, and the top-level
``tracks`` every track in the database. ``latest`` holds the newest tracks (the page shows their thumbnails,
read from ``DB.thumbs/`` beside the database). ``events`` are the run's last lines of note, oldest first: each
stream's resume, end or error, a live stream's drops and reconnects, the watcher's delivery failures (`event`; the
same lines as the log).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deskpod.environment.files import write_json
from deskpod.video.indexer import StreamStats
from deskpod.video.store import Store

EVERY_S = 2.0
"""Least time between two rewrites (a stream's end and the run's end are written at once)."""
LATEST = 12
"""Newest tracks listed."""
EVENTS = 50
"""Last events kept."""
MAX_EVENT = 500
"""Characters kept of an event's line."""


class ProgressFile:
    """The ``--stats`` file of one run: pass `write` as `indexer.index`'s ``on_progress``."""

    def __init__(self, path: Path, db: Path, *, every_s: float = EVERY_S, latest: int = LATEST) -> None:
        self.path = path
        self.db = db
        self.every_s = every_s
        self.latest = latest
        self.started = time.time()
        self._last_write = 0.0
        self._frames: dict[str, tuple[int, float]] = {}
        """Each stream's frames at the last write, and when: its recent fps."""
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=EVENTS)
        self._last: dict[str, Any] | None = None
        """The last document written (an event rewrites it with the new event)."""
        self._lock = threading.Lock()
        """`event` comes from the decoding threads too; `write` from the indexer's."""

    def write(self, streams: Sequence[StreamStats], store: Store, now: bool) -> None:
        """Rewrite the file if `every_s` has passed since the last time (or ``now``)."""
        t = time.monotonic()
        if not now and t - self._last_write < self.every_s:
            return
        self._last_write = t
        doc = self.document(streams, store, t)
        with self._lock:
            doc["events"] = list(self._events)
            self._last = doc
            write_json(self.path, doc, indent=1)

    def event(self, line: str) -> None:
        """Note ``line`` (a stream's end, error, drop or reconnect) and rewrite the file at once: a live stream
        that is down writes no batches, and its reconnects are what the page must show."""
        with self._lock:
            self._events.append({"t": round(time.time(), 3), "text": line[:MAX_EVENT]})
            if self._last is None:  # nothing analysed yet (a stream that will not connect): the events alone
                self._last = {"updated": 0.0, "started": round(self.started, 3), "db": str(self.db),
                              "pid": os.getpid(), "running": True, "streams": [], "tracks": 0, "latest": []}  # fmt: skip
            self._last.update(updated=round(time.time(), 3), events=list(self._events))
            write_json(self.path, self._last, indent=1)

    def document(self, streams: Sequence[StreamStats], store: Store, t: float) -> dict[str, Any]:
        rows = []
        for st in streams:
            before, at = self._frames.get(st.name, (0, t - st.seconds))
            recent = (st.frames - before) / (t - at) if t - at > 0.5 else st.fps
            if st.state != "indexing":
                recent = 0.0
            self._frames[st.name] = (st.frames, t)
            rows.append({
                "name": st.name, "state": st.state, "error": st.error, "frames": st.frames,
                "fps": round(recent, 2), "mean_fps": round(st.fps, 2), "lag": round(st.lag, 3),
                "max_lag": round(st.max_lag, 3), "tracks": st.tracks,
            })  # fmt: skip
        total = store.db.execute("SELECT COUNT(*) FROM tracks").fetchone()[0]
        latest = store.db.execute(
            "SELECT id, stream, label, start, end, thumbnail FROM tracks ORDER BY id DESC LIMIT ?", (self.latest,)
        ).fetchall()
        return {
            "updated": round(time.time(), 3),
            "started": round(self.started, 3),
            "db": str(self.db),
            "pid": os.getpid(),
            "running": any(st.state == "indexing" for st in streams),
            "streams": rows,
            "tracks": int(total),
            "latest": [_track(r) for r in latest],
        }


def _track(r: tuple[Any, ...]) -> dict[str, Any]:
    return {"id": int(r[0]), "stream": r[1], "label": r[2], "start": round(float(r[3]), 3),
            "end": round(float(r[4]), 3), "thumbnail": r[5]}  # fmt: skip
