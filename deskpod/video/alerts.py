"""Alerts: one row per (rule, track) in the index database, and their delivery to a webhook.

Tables (beside `store`'s, in the same SQLite database):

- ``alerts``: one row per alert: the rule (its name) and kind, the track, its stream and label, ``t`` (the stream
  time at which the rule fired), ``created`` (Unix time), ``detail`` (JSON: what made it fire), the track's
  thumbnail, and its delivery: ``state`` (below), ``attempts``, the last ``error``, ``delivered`` (Unix time).
  ``UNIQUE(rule, track)``: a rule alerts on a track once, however often the track is judged.
- ``watch_cursors``: each rule's position in the tracks table (`watch`): the highest track id it has seen and the
  ids of those it saw still open (the indexer may extend them). Written in the transaction that writes the
  alerts, so a restarted watcher goes on from there: no alert twice, none lost.

Delivery states::

    none      raised with no webhook to send it to (final)
    pending   to be POSTed; a watcher started with a webhook sends the pending ones left by an earlier run
    sent      the webhook answered 2xx (final)
    failed    every attempt failed, or the webhook refused it (4xx); the last error is kept (final)

A webhook gets each alert as a JSON POST (`Alert.to_json`); ``id`` identifies it. Delivery is at least once: a
watcher killed between the webhook's answer and the ``sent`` mark sends that alert again when restarted.

`recent_alerts` is what the dashboard reads; it needs neither OpenCV nor dlib.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deskpod.errors import ConfigError, DataError

SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    rule TEXT NOT NULL,
    kind TEXT NOT NULL,
    track INTEGER NOT NULL REFERENCES tracks(id),
    stream TEXT NOT NULL,
    label TEXT NOT NULL,
    t REAL NOT NULL,
    created REAL NOT NULL,
    detail TEXT NOT NULL,
    thumbnail TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    delivered REAL,
    UNIQUE(rule, track)
);
CREATE TABLE IF NOT EXISTS watch_cursors (
    rule TEXT PRIMARY KEY,
    last_track INTEGER NOT NULL,
    open_tracks TEXT NOT NULL
);
"""
STATES = ("none", "pending", "sent", "failed")
COLUMNS = "id, rule, kind, track, stream, label, t, created, detail, thumbnail, state, attempts, error, delivered"


@dataclasses.dataclass(slots=True)
class Alert:
    """One alert as stored."""

    id: int
    """Its id in the alerts table (increasing: a reader asks for those after the last it has)."""
    rule: str
    """The rule's name."""
    kind: str
    """face, enter or loiter."""
    track: int
    """The track's id in the index (``deskpod video search`` shows the same ids)."""
    stream: str
    label: str
    t: float
    """Stream time at which the rule fired (seconds into a file; Unix time for a live stream)."""
    created: float
    """When the alert was raised (Unix time)."""
    detail: dict[str, Any]
    """What made it fire: face: ``photo``, ``similarity``; enter: ``x``, ``y``; loiter: ``entered``, ``seconds``."""
    thumbnail: Path | None
    """The track's best crop, beside the database (None when it has none)."""
    state: str = "none"
    """Delivery: none, pending, sent or failed (the module docstring)."""
    attempts: int = 0
    error: str = ""
    """Why the last delivery attempt failed ("" when none did)."""
    delivered: float | None = None
    """When the webhook took it (Unix time)."""

    def to_json(self) -> dict[str, Any]:
        """What the webhook receives and the dashboard shows."""
        out = dataclasses.asdict(self)
        out["thumbnail"] = str(self.thumbnail) if self.thumbnail else None
        return out

    def line(self) -> str:
        """One line for a terminal."""
        what = ", ".join(f"{k} {v}" for k, v in self.detail.items())
        return f"alert {self.id}: {self.rule} ({self.kind}) {self.stream} track {self.track} at {self.t:.2f} s: {what}"


def connect(db: Path) -> sqlite3.Connection:
    """A connection to an existing database, with the alerts tables made when missing."""
    if not Path(db).is_file():
        raise DataError(f"{db}: no such index database (make one with: deskpod video index SOURCE --db DB)")
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    return conn


def read_alerts(conn: sqlite3.Connection, db: Path, where: str = "", args: tuple[object, ...] = ()) -> list[Alert]:
    thumbs = db.with_name(db.name + ".thumbs")
    rows = conn.execute(f"SELECT {COLUMNS} FROM alerts {where}", args).fetchall()
    return [Alert(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], json.loads(r[8]), thumbs / r[9] if r[9] else None,
                  r[10], r[11], r[12], r[13]) for r in rows]  # fmt: skip


def recent_alerts(db: Path, since_id: int = 0, limit: int = 50) -> list[Alert]:
    """The newest ``limit`` alerts of ``db`` with an id above ``since_id``, newest first (a dashboard polls with
    the highest id it has). A database no watcher has written to has none."""
    if limit < 1:
        raise ConfigError(f"limit {limit}: give a positive number of alerts, e.g. 50")
    db = Path(db)
    if not db.is_file():
        raise DataError(f"{db}: no such index database (make one with: deskpod video index SOURCE --db DB)")
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='alerts'").fetchone():
            return []
        return read_alerts(conn, db, "WHERE id > ? ORDER BY id DESC LIMIT ?", (since_id, limit))
    finally:
        conn.close()


# --- delivery


@dataclasses.dataclass(frozen=True, slots=True)
class Webhook:
    """Where alerts are POSTed, and how hard to try."""

    url: str
    """An http:// or https:// URL."""
    timeout_s: float = 5.0
    """Per attempt: connecting and the answer."""
    attempts: int = 3
    """Tries per alert before it is marked failed."""
    backoff_s: float = 0.5
    """Wait before the second try; doubled before each next one."""

    def __post_init__(self) -> None:
        u = urllib.parse.urlsplit(self.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ConfigError(f"--webhook {self.url}: give an http:// or https:// URL, e.g. "
                              "http://127.0.0.1:9000/alerts")  # fmt: skip
        if self.attempts < 1 or self.timeout_s <= 0 or self.backoff_s < 0:
            raise ConfigError(f"webhook attempts {self.attempts}, timeout {self.timeout_s} s, backoff "
                              f"{self.backoff_s} s: give at least 1 attempt and a positive timeout")  # fmt: skip

    def post(self, alert: Alert) -> tuple[bool, int, str]:
        """Send one alert: (delivered, attempts made, last error)."""
        body = json.dumps(alert.to_json()).encode()
        error = ""
        for attempt in range(1, self.attempts + 1):
            request = urllib.request.Request(
                self.url, data=body, method="POST",
                headers={"Content-Type": "application/json", "User-Agent": "deskpod-video-watch"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                    answer.read()
                return True, attempt, ""
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code} {e.reason}"
                if 400 <= e.code < 500 and e.code not in (408, 429):  # it refuses this alert: trying again won't help
                    return False, attempt, error
            except (urllib.error.URLError, OSError) as e:
                reason = e.reason if isinstance(e, urllib.error.URLError) else e
                error = str(getattr(reason, "strerror", None) or reason)
            if attempt < self.attempts:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
        return False, self.attempts, error


class Courier:
    """Delivers alerts to a webhook on a thread of its own (a slow or dead webhook never holds up the watcher),
    in the order they were raised, recording each outcome in the alerts table."""

    def __init__(self, db: Path, webhook: Webhook, on_event: Callable[[str], None]) -> None:
        self.db = db
        self.webhook = webhook
        self.say = on_event
        self.sent = 0
        self.failed = 0
        self._queue: queue.Queue[Alert | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="deskpod-watch-webhook", daemon=True)
        self._thread.start()

    def send(self, alert: Alert) -> None:
        self._queue.put(alert)

    def close(self) -> None:
        """Deliver what is queued, then stop."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        try:
            while (alert := self._queue.get()) is not None:
                ok, attempts, error = self.webhook.post(alert)
                try:
                    conn.execute(
                        "UPDATE alerts SET state=?, attempts=attempts+?, error=?, delivered=? WHERE id=?",
                        ("sent" if ok else "failed", attempts, error, time.time() if ok else None, alert.id),
                    )
                except sqlite3.Error as e:  # it stays pending: the next watcher sends it again
                    self.say(f"{self.db}: cannot record the delivery of alert {alert.id} ({e}); it stays pending")
                if ok:
                    self.sent += 1
                else:
                    self.failed += 1
                    self.say(f"webhook {self.webhook.url}: alert {alert.id} not delivered after {attempts} "
                             f"attempt{'s' if attempts > 1 else ''} ({error}); kept in {self.db} as failed")  # fmt: skip
        finally:
            conn.close()
