"""The fleet's forwards under way, written ahead: before a job is sent to a member, the fleet records "job J is being
forwarded to member M with key K" in its own table of the fleet pod's SQLite file; the record goes once the forward
is settled (the member's answer came and the job's ``external`` says ``M:id``, or the fleet learned that it never
arrived). A record still there — the answer was lost, or the fleet died meanwhile — is resolved by asking M for K
(`deskpod.fleet.client.MemberClient.lookup`), never by assuming anything (`deskpod.fleet.executor.FleetExecutor`).

A key is the job's id, the forward's attempt and random hex (``12.3.9f2c61d04a7e``): unique per attempt, and not
reused by a fleet whose database was started afresh, since a member keeps every key a fleet sent it.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from deskpod.fleet.members import connect
from deskpod.jobs.store import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS fleet_forwards(
    job INTEGER PRIMARY KEY, member TEXT NOT NULL, key TEXT NOT NULL, attempt INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS fleet_forward_attempts(job INTEGER PRIMARY KEY, attempts INTEGER NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class Forward:
    """One forward under way: sent (or about to be), its answer not yet had."""

    job: int
    """The fleet's job."""
    member: str
    """The member it is being sent to."""
    key: str
    """Its idempotency key: the member keeps it with the job it makes, and answers a look-up by it."""
    attempt: int
    """How many forwards of this job the fleet began, this one included."""
    at: float
    """When the fleet recorded it (before sending)."""


class Forwards:
    """The ``fleet_forwards`` table (and each job's count of forwards begun): its own connection, one lock."""

    def __init__(self, path: Path) -> None:
        self._db = connect(path, SCHEMA)
        self._lock = threading.Lock()

    def begin(self, job: int, member: str, now: float) -> Forward:
        """Record, committed before this returns, that ``job`` is being forwarded to ``member`` with a new key.
        A job has at most one forward under way: the caller settles the last one first (`ValueError` otherwise)."""
        with self._lock, transaction(self._db) as db:
            if db.execute("SELECT 1 FROM fleet_forwards WHERE job = ?", (job,)).fetchone() is not None:
                raise ValueError(f"job {job}: a forward is under way already")
            row = db.execute("SELECT attempts FROM fleet_forward_attempts WHERE job = ?", (job,)).fetchone()
            attempt = (row["attempts"] if row else 0) + 1
            db.execute("INSERT OR REPLACE INTO fleet_forward_attempts VALUES (?, ?)", (job, attempt))
            f = Forward(job, member, f"{job}.{attempt}.{secrets.token_hex(6)}", attempt, now)
            db.execute("INSERT INTO fleet_forwards VALUES (?, ?, ?, ?, ?)", (job, member, f.key, attempt, now))
        return f

    def settle(self, job: int) -> None:
        """The job's forward is settled: its answer came (or it never arrived); nothing is under way."""
        with self._lock:
            self._db.execute("DELETE FROM fleet_forwards WHERE job = ?", (job,))

    def pending(self) -> list[Forward]:
        """Every forward under way, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM fleet_forwards ORDER BY at").fetchall()
        return [Forward(r["job"], r["member"], r["key"], r["attempt"], r["at"]) for r in rows]
