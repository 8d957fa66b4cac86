"""The pod service's state in SQLite (WAL mode): users, token hashes, jobs and their state history.

Why SQLite: one file under ``DESKPOD_HOME``, transactions that survive a SIGKILL of the daemon at any
instant (a committed row is in the WAL before the HTTP answer goes out), and no server to run.
``synchronous=NORMAL`` keeps commits fast; in WAL mode it loses nothing when a *process* dies, only
possibly the last commits on a power cut.

One connection, one lock: the API threads and the daemon's loop take turns, which keeps every
read-check-write (a state transition, a submission) atomic without SQLite's busy retries.
``version`` counts committed writes, and `touched` says at which version each job was last written,
so a reader in the same process (the dashboard's live pages) can tell that nothing changed, or that
nothing changed *for one job*, without taking the lock.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.jobs.spec import KINDS, JobSpec, stored_spec
from deskpod.jobs.states import FINAL, JobState, check

SCHEMA = """
CREATE TABLE IF NOT EXISTS users(
    name TEXT PRIMARY KEY, admin INTEGER NOT NULL, created REAL NOT NULL, os_user TEXT);
CREATE TABLE IF NOT EXISTS tokens(
    hash TEXT PRIMARY KEY, user TEXT NOT NULL REFERENCES users(name), created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
    priority INTEGER NOT NULL, devices INTEGER NOT NULL, placement TEXT NOT NULL,
    max_runtime REAL, retries INTEGER NOT NULL,
    state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0,
    assigned TEXT NOT NULL DEFAULT '', port INTEGER, pid INTEGER, pid_start INTEGER,
    exit_code INTEGER, stop_reason TEXT, stop_deadline REAL,
    submitted_at REAL NOT NULL, started_at REAL, finished_at REAL, external TEXT, lease_holder TEXT, lease_until REAL,
    lease_confirmed INTEGER NOT NULL DEFAULT 0, released TEXT NOT NULL DEFAULT '', released_at REAL,
    released_s REAL NOT NULL DEFAULT 0, wanted_at REAL, busy_s REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_user ON jobs(user);
CREATE TABLE IF NOT EXISTS events(
    job INTEGER NOT NULL, at REAL NOT NULL, old TEXT, new TEXT NOT NULL, note TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events(job);
CREATE TABLE IF NOT EXISTS forward_keys(
    holder TEXT NOT NULL, key TEXT NOT NULL, job INTEGER, at REAL NOT NULL, PRIMARY KEY (holder, key));
CREATE TABLE IF NOT EXISTS sessions(
    hash TEXT PRIMARY KEY, user TEXT NOT NULL REFERENCES users(name), csrf TEXT NOT NULL,
    created REAL NOT NULL, expires REAL NOT NULL);
"""

MUTABLE = frozenset(
    {"reason", "attempt", "failures", "assigned", "port", "pid", "pid_start", "exit_code", "stop_reason",
     "stop_deadline", "started_at", "finished_at", "external", "max_runtime", "released", "released_at", "released_s",
     "wanted_at", "busy_s"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class User:
    name: str
    admin: bool
    os_user: str | None = None
    """The OS account the user's jobs run as on a pod started by root (None: see `deskpod.jobs.accounts`)."""
    fleet: str | None = None
    """The fleet whose assertion this request came with (`deskpod.jobs.trust`); None: a token or the socket."""


def _user(r: sqlite3.Row) -> User:
    return User(r["name"], bool(r["admin"]), r["os_user"])


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One row of ``jobs``, typed."""

    id: int
    user: str
    name: str
    spec: JobSpec
    priority: int
    devices: int
    placement: str
    max_runtime: float | None
    retries: int
    state: JobState
    reason: str
    attempt: int
    failures: int
    assigned: tuple[int, ...]
    port: int | None
    pid: int | None
    pid_start: int | None
    exit_code: int | None
    stop_reason: str | None
    stop_deadline: float | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    external: str | None = None
    """The job's id in the executor that runs it, when that is not this box (a Slurm job id)."""
    lease_holder: str | None = None
    """The fleet that forwarded the job here and holds it by a lease (`deskpod.jobs.trust`); None: no lease."""
    lease_until: float | None = None
    """Until when the job may start here: the fleet renews it while it holds the job; once it runs out the job is
    cancelled unstarted (`deskpod.jobs.pod.Pod.expire_leases`), and the fleet may send it elsewhere."""
    lease_confirmed: bool = False
    """Whether it may start: a job forwarded with an idempotency key may at once (`Store.forwarded`: a fleet that
    lost the answer looks the key up, `Store.lookup`); one forwarded without a key only once its fleet renewed the
    lease (a forward whose answer the fleet never got is never confirmed, so it never runs beside the copy the fleet
    sends elsewhere)."""
    released: tuple[int, ...] = ()
    """A running session's devices while it gave them back, idle (`deskpod.jobs.culler`): ``assigned`` is empty
    then, and these are the only devices it may take again (its sandbox was made for them)."""
    released_at: float | None = None
    """When it gave them back (None while it holds its devices)."""
    released_s: float = 0.0
    """Seconds of this attempt it spent released, before ``released_at``."""
    wanted_at: float | None = None
    """When a released session asked for its devices again (a kernel starting); None: it does not want them."""
    busy_s: float = 0.0
    """Device-seconds its devices were seen at work (sampled by `deskpod.jobs.culler`; sessions only)."""

    def held_s(self, now: float) -> float:
        """Device-seconds this attempt held its devices: from its start to its end (or now), less its released
        time."""
        if self.started_at is None or self.state in (JobState.QUEUED, JobState.STARTING):
            return 0.0
        end = self.finished_at if self.finished_at is not None else now
        off = self.released_s + (max(0.0, end - self.released_at) if self.released_at is not None else 0.0)
        return max(0.0, end - self.started_at - off) * self.devices

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "user": self.user,
            "name": self.name,
            "kind": self.spec.kind,
            "state": self.state.value,
            "reason": self.reason,
            "priority": self.priority,
            "devices": self.devices,
            "assigned": list(self.assigned),
            "placement": self.placement,
            "attempt": self.attempt,
            "failures": self.failures,
            "retries": self.retries,
            "exit_code": self.exit_code,
            "pid": self.pid,
            "port": self.port,
            "stopping": self.stop_reason,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "external": self.external,
            "lease": None
            if self.lease_holder is None
            else {"fleet": self.lease_holder, "until": self.lease_until, "confirmed": self.lease_confirmed},
            "spec": self.spec.to_json(),
            "max_runtime": self.max_runtime,
            "released": list(self.released),
            "wanted_at": self.wanted_at,
            "device_hours": {"held": round(self.held_s(time.time()) / 3600, 4), "used": round(self.busy_s / 3600, 4)},
        }


def _record(row: sqlite3.Row) -> JobRecord:
    """A ``jobs`` row as a `JobRecord`: each field from its column, the spec, state and devices decoded."""
    values = {name: row[name] for name in JobRecord.__dataclass_fields__}
    values.update(spec=stored_spec(json.loads(row["spec"])), state=JobState(row["state"]),
                  assigned=tuple(int(x) for x in row["assigned"].split(",") if x),
                  released=tuple(int(x) for x in row["released"].split(",") if x),
                  lease_confirmed=bool(row["lease_confirmed"]))  # fmt: skip
    return JobRecord(**values)


MAX_ID_DIGITS = 18
"""A job id has at most this many digits (SQLite's INTEGER is 64-bit; 10**18 is below 2**63)."""


def job_number(text: str) -> int | None:
    """The job id a user wrote (a URL, a form, a CLI argument), or None when it is none.

    Only ASCII digits: ``str.isdigit`` also accepts ``"¹"`` (which ``int`` refuses) and ``"٣"`` (which ``int`` reads
    as 3), and the pod writes its ids as plain decimal numbers; a caller answers None with "no such job"."""
    if 0 < len(text) <= MAX_ID_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


QueueRow = tuple[int, int, int, str, float | None, str]
"""A queued job for the scheduler: (id, priority, devices, placement, max_runtime, reason)."""
QUEUE_COLUMNS = "id, priority, devices, placement, max_runtime, reason"
STARTABLE = "(lease_holder IS NULL OR lease_confirmed = 1)"
"""A queued job the scheduler may start: one held by a fleet's lease only once the fleet confirmed it."""


def private(path: Path) -> None:
    """Make ``path`` a file only its owner may read and write (0600), creating it empty if missing. The pod's
    database holds every job's ``env``, which are secrets (a user's API keys): no other local user may read it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on ``db`` (opened with ``isolation_level=None``): committed when the block ends, rolled
    back when it raises. The caller holds whatever lock serialises its connection."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class Store:
    """All reads and writes of the pod's state; every method is one transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        private(path)  # before SQLite opens it: its journal files take the database's mode
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        for journal in ("-wal", "-shm"):  # a database an older pod left readable to all
            private(path.with_name(path.name + journal))
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)")}
        if "external" not in columns:  # a store written before cluster backends
            self._db.execute("ALTER TABLE jobs ADD COLUMN external TEXT")
        if "lease_until" not in columns:  # before fleets
            self._db.execute("ALTER TABLE jobs ADD COLUMN lease_holder TEXT")
            self._db.execute("ALTER TABLE jobs ADD COLUMN lease_until REAL")
            self._db.execute("ALTER TABLE jobs ADD COLUMN lease_confirmed INTEGER NOT NULL DEFAULT 0")
        if "released" not in columns:  # before sessions gave their devices back when idle
            for column in ("released TEXT NOT NULL DEFAULT ''", "released_at REAL", "released_s REAL NOT NULL DEFAULT 0",
                           "wanted_at REAL", "busy_s REAL NOT NULL DEFAULT 0"):  # fmt: skip
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column}")
        if "os_user" not in {r[1] for r in self._db.execute("PRAGMA table_info(users)")}:  # before OS accounts
            self._db.execute("ALTER TABLE users ADD COLUMN os_user TEXT")
        self.version = 0
        """Committed write transactions so far (in this process)."""
        self.revocations = 0
        """Revocations so far in this process: calls of `revoke` and `end_session`. A long-lived answer (the
        dashboard's live stream) compares it with the count when its caller was checked, and checks again only
        when it moved. Every revocation goes through the daemon's API, so this process sees them all."""
        self._touched: dict[int, int] = {}
        self._written = threading.Condition(self._lock)
        """Notified after every committed write (`wait_written`)."""
        self._queued: dict[int, QueueRow] | None = None
        """The queued jobs as `queue` gives them, kept in step with this process's writes (see `queue`)."""
        self._data_version = -1
        self._queue_changed: set[int] | None = None
        """Jobs whose scheduler fields (all but the reason) changed since `queue_delta` was last called; None:
        the whole queue was read again."""

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self, *jobs: int, refresh: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction; ``jobs`` are the jobs it may change (for `touched`, and the queue view, which
        reads their rows again unless ``refresh`` is false: the caller then keeps the view itself)."""
        with self._lock:
            with transaction(self._db) as db:
                yield db
            self.version += 1
            if len(self._touched) > 100_000:
                self._touched.clear()  # readers then see version 0 != theirs and read once more
            for j in jobs:
                self._touched[j] = self.version
            if refresh and jobs and self._queued is not None:
                self._refresh_queued(jobs)
            self._written.notify_all()

    def wait_written(self, job_ids: Iterable[int], since: int, timeout: float) -> bool:
        """Wait until one of these jobs is written after store version ``since`` (by this process), at most
        ``timeout`` seconds; whether one was."""
        ids = list(job_ids)
        with self._written:
            return self._written.wait_for(lambda: any(self._touched.get(j, 0) > since for j in ids), timeout)

    def _refresh_queued(self, jobs: Iterable[int]) -> None:
        assert self._queued is not None
        ids = list(jobs)
        marks = ",".join("?" * len(ids))
        cur = self._db.execute(f"SELECT {QUEUE_COLUMNS}, state, {STARTABLE} FROM jobs WHERE id IN ({marks})", ids)
        cur.row_factory = None
        found = {r[0]: r for r in cur.fetchall()}
        for j in ids:
            row = found.get(j)
            before = self._queued.get(j)
            if row is not None and row[6] == JobState.QUEUED.value and row[7]:
                if before is None and self._queued and j < next(reversed(self._queued)):
                    self._queued = dict(sorted({**self._queued, j: row[:6]}.items()))  # a requeue: keep id order
                else:
                    self._queued[j] = row[:6]
                if before is None or before[:5] != row[:5]:
                    self._note_changed(j)
            elif self._queued.pop(j, None) is not None:
                self._note_changed(j)

    def _note_changed(self, job_id: int) -> None:
        if self._queue_changed is not None:
            self._queue_changed.add(job_id)

    def touched(self, job_id: int) -> int:
        """The store version of the last write to this job in this process (0: none seen)."""
        return self._touched.get(job_id, 0)

    # users and tokens --------------------------------------------------------------------------
    def add_user(self, name: str, admin: bool, os_user: str | None = None) -> bool:
        """Create a user; False when the name is taken."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO users (name, admin, created, os_user) VALUES (?, ?, ?, ?)",
                (name, int(admin), time.time(), os_user),
            )
            return cur.rowcount == 1

    def users(self) -> list[User]:
        with self._lock:
            rows = self._db.execute("SELECT name, admin, os_user FROM users ORDER BY name").fetchall()
        return [_user(r) for r in rows]

    def user(self, name: str) -> User | None:
        return self._one_user("SELECT name, admin, os_user FROM users WHERE name = ?", name)

    def user_by_os_user(self, os_user: str) -> User | None:
        """The deskpod user an OS account maps to (its ``os_user``), for callers the kernel identified."""
        return self._one_user(
            "SELECT name, admin, os_user FROM users WHERE os_user = ? ORDER BY admin DESC, name LIMIT 1", os_user
        )

    def _one_user(self, sql: str, key: str) -> User | None:
        with self._lock:
            r = self._db.execute(sql, (key,)).fetchone()
        return None if r is None else _user(r)

    def set_os_user(self, user: str, os_user: str | None) -> None:
        with self._tx() as db:
            db.execute("UPDATE users SET os_user = ? WHERE name = ?", (os_user, user))

    def revoke(self, user: str) -> int:
        """Delete every token and browser session of ``user``; returns how many tokens there were."""
        with self._lock:  # counted after the commit: a reader that sees the new count finds the rows gone
            with self._tx() as db:
                n = db.execute("DELETE FROM tokens WHERE user = ?", (user,)).rowcount
                db.execute("DELETE FROM sessions WHERE user = ?", (user,))
            self.revocations += 1
        return int(n)

    def add_token_hash(self, user: str, token_hash: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO tokens VALUES (?, ?, ?)", (token_hash, user, time.time()))

    def user_by_token_hash(self, token_hash: str) -> User | None:
        return self._one_user(
            "SELECT u.name, u.admin, u.os_user FROM tokens t JOIN users u ON u.name = t.user WHERE t.hash = ?",
            token_hash,
        )

    # browser sessions (the dashboard) ----------------------------------------------------------
    def add_session(self, session_hash: str, user: str, csrf: str, now: float, expires: float) -> None:
        """Record a signed-in browser; expired sessions are swept on the way."""
        with self._tx() as db:
            db.execute("DELETE FROM sessions WHERE expires <= ?", (now,))
            db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)", (session_hash, user, csrf, now, expires))

    def session(self, session_hash: str, now: float) -> tuple[User, str, float] | None:
        """(user, CSRF token, expiry) of a live session, or None when unknown or expired."""
        with self._lock:
            r = self._db.execute(
                "SELECT u.name, u.admin, u.os_user, s.csrf, s.expires FROM sessions s JOIN users u ON u.name = s.user"
                " WHERE s.hash = ? AND s.expires > ?",
                (session_hash, now),
            ).fetchone()
        return None if r is None else (_user(r), str(r["csrf"]), float(r["expires"]))

    def end_session(self, session_hash: str) -> None:
        with self._lock:
            with self._tx() as db:
                db.execute("DELETE FROM sessions WHERE hash = ?", (session_hash,))
            self.revocations += 1

    # jobs --------------------------------------------------------------------------------------
    def submit(
        self, user: str, spec: JobSpec, devices: int, now: float, lease: tuple[str, float] | None = None
    ) -> JobRecord:
        """Record a new queued job (held by ``lease``: its fleet, and until when); committed before this returns."""
        holder, until = lease or (None, None)
        with self._tx() as db:
            row = self._insert(db, user, spec, devices, now, holder, until, False)
        return self._inserted(row)

    def forwarded(
        self, user: str, spec: JobSpec, devices: int, now: float, lease: tuple[str, float], key: str
    ) -> tuple[JobRecord, bool] | None:
        """Record a job a fleet forwarded with the idempotency key ``key``, its lease granted (it may start at once),
        unless that fleet forwarded one with this key already: (the job, whether it is new). None: the fleet looked
        the key up before this forward arrived (`lookup`), found nothing and may have sent the job elsewhere, so it
        is not taken."""
        holder, until = lease
        with self._tx() as db:
            had = db.execute("SELECT job FROM forward_keys WHERE holder = ? AND key = ?", (holder, key)).fetchone()
            if had is not None:
                if had["job"] is None:
                    return None
                return _record(db.execute("SELECT * FROM jobs WHERE id = ?", (had["job"],)).fetchone()), False
            row = self._insert(db, user, spec, devices, now, holder, until, True)
            db.execute("INSERT INTO forward_keys VALUES (?, ?, ?, ?)", (holder, key, row["id"], now))
        return self._inserted(row), True

    def lookup(self, holder: str, keys: Iterable[str], now: float) -> dict[str, JobRecord]:
        """The jobs ``holder`` forwarded with these keys, by key. A key no forward brought yet is closed (one
        transaction with the look-up): a forward with it that arrives later is refused (`forwarded`), so a fleet
        told "not here" may send the job elsewhere at once."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        with self._tx() as db:
            rows = db.execute(f"SELECT key, job FROM forward_keys WHERE holder = ? AND key IN ({marks})",
                              [holder, *wanted]).fetchall()  # fmt: skip
            known = {r["key"]: r["job"] for r in rows}
            db.executemany("INSERT INTO forward_keys VALUES (?, ?, NULL, ?)",
                           [(holder, k, now) for k in wanted if k not in known])  # fmt: skip
            found = {k: _record(db.execute("SELECT * FROM jobs WHERE id = ?", (j,)).fetchone())
                     for k, j in known.items() if j is not None}  # fmt: skip
        return found

    @staticmethod
    def _insert(
        db: sqlite3.Connection, user: str, spec: JobSpec, devices: int, now: float, holder: str | None,
        until: float | None, confirmed: bool,
    ) -> sqlite3.Row:  # fmt: skip
        cur = db.execute(
            "INSERT INTO jobs (user, name, spec, priority, devices, placement, max_runtime, retries, state,"
            " submitted_at, lease_holder, lease_until, lease_confirmed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (user, spec.name, json.dumps(spec.to_json()), spec.priority, devices, spec.placement,
             spec.max_runtime, spec.retries, JobState.QUEUED.value, now, holder, until, int(confirmed)),
        )  # fmt: skip
        job_id = int(cur.lastrowid or 0)
        db.execute("INSERT INTO events VALUES (?, ?, NULL, ?, ?)", (job_id, now, "queued", f"submitted by {user}"))
        row: sqlite3.Row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row

    def _inserted(self, row: sqlite3.Row) -> JobRecord:
        """A job just inserted, as a record; the queue view and `touched` learn of it."""
        job_id = int(row["id"])
        with self._lock:
            self._touched[job_id] = self.version
            if self._queued is not None:
                self._refresh_queued([job_id])
        return _record(row)

    def job(self, job_id: int) -> JobRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _record(row)

    def jobs(
        self,
        *,
        user: str | None = None,
        states: Iterable[JobState] | None = None,
        name: str | None = None,
        kind: str | None = None,
        before: int | None = None,
        limit: int = 1000,
    ) -> list[JobRecord]:
        """Jobs, newest first, optionally of one user, in some states, with ``name`` in their name, of one
        ``kind`` (``train``, ``serve`` or ``command``: `JobSpec.kind`), and older than job ``before`` (keyset
        paging: the next page starts below the last id shown)."""
        where, args = self._filter(user, states, name, kind)
        if before is not None:
            where += " AND id < ?"
            args.append(before)
        args.append(limit)
        with self._lock:
            rows = self._db.execute(f"SELECT * FROM jobs WHERE {where} ORDER BY id DESC LIMIT ?", args).fetchall()
        return [_record(r) for r in rows]

    def count(
        self,
        *,
        user: str | None = None,
        states: Iterable[JobState] | None = None,
        name: str | None = None,
        kind: str | None = None,
    ) -> int:
        """How many jobs `jobs` would list with these filters and no limit."""
        where, args = self._filter(user, states, name, kind)
        with self._lock:
            return int(self._db.execute(f"SELECT COUNT(*) FROM jobs WHERE {where}", args).fetchone()[0])

    @staticmethod
    def _filter(
        user: str | None, states: Iterable[JobState] | None, name: str | None, kind: str | None = None
    ) -> tuple[str, list[Any]]:
        where, args = "1=1", []
        # A job's kind is the field its stored spec has (`JobSpec.to_json`): no column to keep in step with it.
        if kind == "command":
            where += "".join(f" AND json_type(spec, '$.{k}') IS NULL" for k in KINDS if k != "command")
        elif kind is not None:
            if kind not in KINDS:
                raise ValueError(f"job kind {kind!r}: expected one of {', '.join(KINDS)}")
            where += f" AND json_type(spec, '$.{kind}') IS NOT NULL"
        if user is not None:
            where += " AND user = ?"
            args.append(user)
        if states is not None:
            wanted = [s.value for s in states]
            where += f" AND state IN ({','.join('?' * len(wanted))})"
            args.extend(wanted)
        if name:
            escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where += " AND name LIKE ? ESCAPE '\\'"
            args.append(f"%{escaped}%")
        return where, args

    def expired_leases(self, now: float) -> list[JobRecord]:
        """Queued jobs whose lease ran out before ``now``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM jobs WHERE state = 'queued' AND lease_until IS NOT NULL AND lease_until < ?", (now,)
            ).fetchall()
        return [_record(r) for r in rows]

    def renew(self, holder: str, ids: Iterable[int], until: float) -> list[JobRecord]:
        """Extend to ``until`` (and confirm) the leases ``holder`` has on the jobs among ``ids`` (a running one's too:
        a retry queues it again); returns every job of ``ids`` it holds, in whatever state (those it never held, or
        that are gone, are left out)."""
        wanted = list(ids)
        if not wanted:
            return []
        marks = ",".join("?" * len(wanted))
        with self._tx(*wanted) as db:
            db.execute(f"UPDATE jobs SET lease_until = ?, lease_confirmed = 1 WHERE lease_holder = ? AND id IN ({marks})",
                       [until, holder, *wanted])  # fmt: skip
            rows = db.execute(f"SELECT * FROM jobs WHERE lease_holder = ? AND id IN ({marks})", [holder, *wanted])
            return [_record(r) for r in rows.fetchall()]

    def held(self, holder: str, ids: Iterable[int]) -> list[JobRecord]:
        """The jobs among ``ids`` that ``holder`` holds a lease on, as they are (nothing is renewed)."""
        wanted = list(ids)
        if not wanted:
            return []
        marks = ",".join("?" * len(wanted))
        with self._lock:
            rows = self._db.execute(f"SELECT * FROM jobs WHERE lease_holder = ? AND id IN ({marks})", [holder, *wanted])
            return [_record(r) for r in rows.fetchall()]

    def transition(
        self, job_id: int, new: JobState, note: str, *, expect: Iterable[JobState] | None = None, **fields: Any
    ) -> bool:
        """Move a job to ``new`` (checked against the state table) and set ``fields``, atomically.

        Returns False, changing nothing, when the job's current state is not in ``expect`` — the
        caller lost a race (a cancel against a start) and must re-read.
        """
        bad = set(fields) - MUTABLE
        if bad:
            raise ValueError(f"not a mutable job field: {sorted(bad)}")
        with self._tx(job_id) as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return False
            old = JobState(row["state"])
            if expect is not None and old not in set(expect):
                return False
            check(old, new)
            sets = ", ".join(["state = ?", *(f"{k} = ?" for k in fields)])
            db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (new.value, *fields.values(), job_id))
            db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", (job_id, time.time(), old.value, new.value, note))
        return True

    def update(self, job_id: int, *, expect: Iterable[JobState] | None = None, **fields: Any) -> bool:
        """Set fields without a state change (a stop request, a wait reason); only in ``expect`` states if given."""
        bad = set(fields) - MUTABLE
        if bad:
            raise ValueError(f"not a mutable job field: {sorted(bad)}")
        if not fields:
            return False
        sql, args = f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?", [*fields.values(), job_id]
        if expect is not None:
            wanted = [s.value for s in expect]
            sql += f" AND state IN ({','.join('?' * len(wanted))})"
            args.extend(wanted)
        with self._tx(job_id) as db:
            return db.execute(sql, args).rowcount == 1

    def queue(self) -> list[QueueRow]:
        """Queued jobs that may start (`STARTABLE`) as (id, priority, devices, placement, max_runtime, reason), by id: the scheduler's light view.

        Read from SQLite once, then kept in memory: this process's writes update it as they commit (the rows they
        touch are read again), and a commit by any other connection (``PRAGMA data_version`` moves) makes the
        next call read the whole queue again. So a pass at 10,000 queued jobs reads only what changed.
        """
        with self._lock:
            return list(self._current_queue().values())

    def queue_delta(self) -> tuple[dict[int, QueueRow], set[int] | None]:
        """The queue view by id, and the jobs whose scheduler fields changed since the last call (None: everything
        may have; start again). For one consumer, the pod's scheduling loop (`deskpod.jobs.scheduler.WaitingCache`);
        the view is the store's own: read it, never change it."""
        with self._lock:
            view = self._current_queue()
            changed, self._queue_changed = self._queue_changed, set()
            return view, changed

    def _current_queue(self) -> dict[int, QueueRow]:
        version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
        if self._queued is None or version != self._data_version:
            cur = self._db.execute(
                f"SELECT {QUEUE_COLUMNS} FROM jobs WHERE state = 'queued' AND {STARTABLE} ORDER BY id"
            )
            cur.row_factory = None  # plain tuples: a third of the time of sqlite3.Row for 10,000 rows
            self._queued = {r[0]: r for r in cur.fetchall()}
            self._data_version = version
            self._queue_changed = None
        return self._queued

    def note(self, job_id: int, text: str) -> None:
        """Add a history line without a state change (a re-adoption, a preemption request)."""
        with self._tx(job_id) as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is not None:
                db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", (job_id, time.time(), row[0], row[0], text))

    def set_reasons(self, reasons: dict[int, str]) -> None:
        """Write wait reasons of queued jobs (the caller passes only those that changed)."""
        if not reasons:
            return
        with self._tx(*reasons, refresh=False) as db:
            db.executemany(
                "UPDATE jobs SET reason = ? WHERE id = ? AND state = 'queued'", [(r, i) for i, r in reasons.items()]
            )
            if self._queued is not None:
                for i, r in reasons.items():
                    row = self._queued.get(i)
                    if row is not None:
                        self._queued[i] = (*row[:5], r)

    def events(self, job_id: int) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT at, old, new, note FROM events WHERE job = ? ORDER BY rowid", (job_id,)
            ).fetchall()
        return [{"at": r["at"], "from": r["old"], "to": r["new"], "note": r["note"]} for r in rows]

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state").fetchall()
        return {r["state"]: int(r["n"]) for r in rows}

    def durations(self) -> list[float]:
        """Run times (seconds) of jobs that ended, for the metrics histogram."""
        final = [s.value for s in FINAL]
        with self._lock:
            rows = self._db.execute(
                f"SELECT finished_at - started_at AS d FROM jobs WHERE state IN ({','.join('?' * len(final))})"
                " AND started_at IS NOT NULL AND finished_at IS NOT NULL",
                final,
            ).fetchall()
        return [float(r["d"]) for r in rows]
