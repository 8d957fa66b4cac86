"""Live alerts: follow an index database while an indexer writes it, judge each new or grown track by the rules,
and raise an alert (stored, printed, POSTed to a webhook) the first time a rule fires on a track.

The follower polls the database (SQLite in WAL mode: its reads never block the indexer's writes, nor the writes
its reads). The store's tracks only ever grow while ``open`` (the indexer extends them, then closes them; a
restarted indexer closes those it left open), and ids rise in commit order (the indexer's transactions are
serialised by SQLite's write lock). So each rule's position is two things: the highest track id it has seen, and
the ids it saw still open. A poll reads, in one read transaction, the tracks above that id and those open ones,
judges those that are new or whose last box moved, and writes the alerts and the new positions in one
transaction (`alerts.SCHEMA`). A restart goes on from the stored positions; a track judged again (one open at
the restart) cannot alert twice, by the alerts table's ``UNIQUE(rule, track)``.

A rule seen for the first time starts at the tracks open then and those to come (live alerts, not an audit of
the past); ``history=True`` has it judge the tracks already in the database too.

    deskpod video watch --db DB --rules rules.toml [--webhook URL]
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from deskpod.errors import RunError
from deskpod.video.alerts import SCHEMA, Alert, Courier, Webhook, read_alerts, recent_alerts
from deskpod.video.rules import Hit, Rule
from deskpod.video.store import Store, TrackRow

__all__ = ["Alert", "WatchReport", "WatchThread", "Watcher", "recent_alerts", "watch"]

CHUNK = 500
"""Tracks read per query (keeps each read transaction and each ``IN (...)`` list short)."""


@dataclasses.dataclass(slots=True)
class _Position:
    last: int
    """Highest track id seen."""
    open: set[int]
    """Ids seen while open."""


@dataclasses.dataclass(slots=True)
class WatchReport:
    polls: int = 0
    tracks_judged: int = 0
    """Track versions judged (a track judged again after it grew counts again)."""
    alerts: int = 0
    """Alerts raised in this run."""
    sent: int = 0
    failed: int = 0


class Watcher:
    """The rules over one database: `poll` once, or `run` until stopped."""

    def __init__(
        self,
        db: Path,
        rules: Sequence[Rule],
        *,
        webhook: Webhook | None = None,
        history: bool = False,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.rules = list(rules)
        self.say = on_event or (lambda _line: None)
        self.store = Store(Path(db))
        self.store.db.executescript(SCHEMA)
        self.report = WatchReport()
        self._ends: dict[int, float] = {}
        """End of each open track when last judged (one that has not moved is not judged again)."""
        self._positions = self._load_positions(history)
        self._fired: set[tuple[str, int]] = set()
        opened = sorted({i for p in self._positions.values() for i in p.open})
        for chunk in _chunks(opened):
            marks = ",".join("?" * len(chunk))
            self._fired |= set(self.store.db.execute(f"SELECT rule, track FROM alerts WHERE track IN ({marks})", chunk))
        self.courier = Courier(self.store.path, webhook, self.say) if webhook else None
        if self.courier:
            for alert in read_alerts(self.store.db, self.store.path, "WHERE state='pending' ORDER BY id"):
                self.courier.send(alert)

    def _load_positions(self, history: bool) -> dict[str, _Position]:
        db = self.store.db
        stored = {r[0]: _Position(int(r[1]), set(json.loads(r[2])))
                  for r in db.execute("SELECT rule, last_track, open_tracks FROM watch_cursors")}  # fmt: skip
        new = [r.name for r in self.rules if r.name not in stored]
        if new:
            if history:
                start = _Position(0, set())
            else:
                db.execute("BEGIN")
                top = db.execute("SELECT COALESCE(MAX(id), 0) FROM tracks").fetchone()[0]
                start = _Position(int(top), {int(r[0]) for r in db.execute("SELECT id FROM tracks WHERE open=1")})
                db.execute("COMMIT")
            with self.store.transaction():
                for name in new:
                    stored[name] = _Position(start.last, set(start.open))
                    self._save(name, stored[name])
            self.say(f"new rule{'s' if len(new) > 1 else ''} {', '.join(new)}: from "
                     + ("the first track" if history else f"track {start.last + 1} and the {len(start.open)} open"))  # fmt: skip
        return {r.name: stored[r.name] for r in self.rules}

    def _save(self, rule: str, p: _Position) -> None:
        self.store.db.execute(
            "INSERT INTO watch_cursors(rule, last_track, open_tracks) VALUES (?,?,?) ON CONFLICT(rule) DO UPDATE "
            "SET last_track=excluded.last_track, open_tracks=excluded.open_tracks",
            (rule, p.last, json.dumps(sorted(p.open))),
        )

    def poll(self) -> list[Alert]:
        """Judge the tracks that are new or grew since the last poll; store, print and send the alerts."""
        self.report.polls += 1
        raised: list[Alert] = []
        while True:
            batch, full = self._poll_chunk()
            raised += batch
            if not full:
                return raised

    def _poll_chunk(self) -> tuple[list[Alert], bool]:
        db = self.store.db
        low = min((p.last for p in self._positions.values()), default=0)
        opened = sorted({i for p in self._positions.values() for i in p.open})
        db.execute("BEGIN")  # one read transaction: one consistent snapshot of the tracks
        try:
            meta = db.execute(
                "SELECT id, end, open FROM tracks WHERE id > ? ORDER BY id LIMIT ?", (low, CHUNK)
            ).fetchall()
            full = len(meta) == CHUNK  # there may be more: the caller polls again at once
            for c in _chunks(opened):
                meta += db.execute(
                    f"SELECT id, end, open FROM tracks WHERE id IN ({','.join('?' * len(c))})", c
                ).fetchall()
            state = {int(i): (float(end), bool(op)) for i, end, op in meta}
            moved = sorted(i for i, (end, op) in state.items() if self._ends.get(i) != end or not op)
            rows = [r for c in _chunks(moved) for r in self.store.tracks(ids=c)]
        finally:
            db.execute("COMMIT")
        hits: list[tuple[Rule, TrackRow, Hit]] = []
        for row in rows:
            self.report.tracks_judged += 1
            for rule in self.rules:
                p = self._positions[rule.name]
                if (row.id <= p.last and row.id not in p.open) or (rule.name, row.id) in self._fired:
                    continue
                if (hit := rule.judge(row)) is not None:
                    hits.append((rule, row, hit))
        for i, (end, op) in state.items():
            if op:
                self._ends[i] = end
            else:
                self._ends.pop(i, None)
        top = max((i for i in state if i > low), default=low)
        changed = []
        for rule in self.rules:
            p = self._positions[rule.name]
            before = (p.last, set(p.open))
            p.open = {i for i in p.open if state.get(i, (0.0, False))[1]}  # closed (or gone) ones leave
            p.open |= {i for i, (_end, op) in state.items() if op and i > p.last}
            p.last = max(p.last, top)
            if (p.last, p.open) != before:
                changed.append(rule.name)
        return self._write(hits, changed), full

    def _write(self, hits: list[tuple[Rule, TrackRow, Hit]], changed: list[str]) -> list[Alert]:
        if not hits and not changed:
            return []
        state = "pending" if self.courier else "none"
        now = time.time()
        ids = []
        with self.store.transaction():
            for rule, row, hit in hits:
                cur = self.store.db.execute(
                    "INSERT OR IGNORE INTO alerts(rule, kind, track, stream, label, t, created, detail, thumbnail,"
                    " state) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (rule.name, rule.kind, row.id, row.stream, row.label, hit.t, now, json.dumps(hit.detail),
                     row.thumbnail, state),
                )  # fmt: skip
                self._fired.add((rule.name, row.id))
                if cur.rowcount == 1 and cur.lastrowid is not None:
                    ids.append(cur.lastrowid)
            for name in changed:
                self._save(name, self._positions[name])
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        alerts = read_alerts(self.store.db, self.store.path, f"WHERE id IN ({marks}) ORDER BY id", tuple(ids))
        self.report.alerts += len(alerts)
        for a in alerts:
            if self.courier:
                self.courier.send(a)
        return alerts

    def run(self, stop: threading.Event, *, poll_s: float = 1.0, on_alert: Callable[[Alert], None] | None = None,
            once: bool = False, final: bool = False) -> WatchReport:  # fmt: skip
        """Poll every ``poll_s`` until ``stop`` is set (or once), then deliver what is queued. ``final``: poll once
        more when ``stop`` comes (a writer that has just ended closed its last tracks)."""
        try:
            while True:
                started = time.monotonic()
                for a in self.poll():
                    if on_alert:
                        on_alert(a)
                if once or stop.wait(max(0.0, poll_s - (time.monotonic() - started))):
                    if final and not once:
                        for a in self.poll():
                            if on_alert:
                                on_alert(a)
                    break
        finally:
            self.close()
        return self.report

    def close(self) -> None:
        if self.courier:
            self.courier.close()
            self.report.sent, self.report.failed = self.courier.sent, self.courier.failed
            self.courier = None
        self.store.close()


def watch(
    db: Path,
    rules: Sequence[Rule],
    *,
    webhook: Webhook | None = None,
    poll_s: float = 1.0,
    history: bool = False,
    once: bool = False,
    stop: threading.Event | None = None,
    on_alert: Callable[[Alert], None] | None = None,
    on_event: Callable[[str], None] | None = None,
) -> WatchReport:
    """Follow ``db`` with ``rules`` until ``stop`` is set (or for one poll with ``once``)."""
    watcher = Watcher(db, rules, webhook=webhook, history=history, on_event=on_event)
    return watcher.run(stop or threading.Event(), poll_s=poll_s, on_alert=on_alert, once=once)


class WatchThread:
    """The watcher on a thread of the indexing process (``deskpod video index --rules``, a video job with rules):
    one process, one log and one exit status for the job, and no second process to supervise. `start` sets the
    new rules' positions before the indexer writes a track (so none is missed); `finish`, once the indexer has
    returned, judges the tracks it closed at its end, delivers what is queued, and returns the report."""

    def __init__(self, db: Path, rules: Sequence[Rule], *, webhook: Webhook | None = None, poll_s: float = 1.0,
                 on_alert: Callable[[Alert], None] | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.db, self.rules, self.webhook, self.poll_s = Path(db), list(rules), webhook, poll_s
        self.on_alert, self.say = on_alert, on_event or (lambda _line: None)
        self.error = ""
        """Why the watcher stopped before `finish` ("" when it did not)."""
        self.report = WatchReport()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deskpod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self.error:
            raise RunError(self.error)

    def finish(self) -> WatchReport:
        self._stop.set()
        self._thread.join()
        return self.report

    def _run(self) -> None:
        try:  # SQLite's connections stay on the thread that made them: the watcher is made here
            watcher = Watcher(self.db, self.rules, webhook=self.webhook, on_event=self.say)
        except Exception as e:
            self.error = f"watch: cannot start: {e}"
            return
        finally:
            self._ready.set()
        try:
            self.report = watcher.run(self._stop, poll_s=self.poll_s, on_alert=self.on_alert, final=True)
        except Exception as e:  # alerts stop; the indexer goes on and the run's exit status says so
            self.error = f"watch: stopped: {type(e).__name__}: {e}"
            self.report = watcher.report
            self.say(self.error)


def _chunks(ids: Sequence[int]) -> list[list[int]]:
    return [list(ids[i : i + CHUNK]) for i in range(0, len(ids), CHUNK)]
