"""The fleet's members: which pods it hands jobs to, kept in its own table of the fleet pod's SQLite file.

A member is any pod service (``deskpod up``, or ``deskpod up --backend slurm`` on a cluster's login node) that
trusts this fleet's key. ``name`` is the fleet's name for it; ``audience`` the member's own name, which the fleet's
assertions for it carry (`deskpod.jobs.trust`). A member being removed is ``draining``: it gets no new jobs, and
goes once the fleet's jobs on it have ended (`deskpod.fleet.executor.FleetExecutor`).
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from deskpod.errors import ConfigError
from deskpod.jobs.store import private

SCHEMA = """
CREATE TABLE IF NOT EXISTS fleet_members(
    name TEXT PRIMARY KEY, url TEXT NOT NULL, audience TEXT NOT NULL, added REAL NOT NULL,
    draining INTEGER NOT NULL DEFAULT 0);
"""
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    """The fleet's name for it (``deskpod fleet add NAME URL``)."""
    url: str
    """Its pod service, e.g. ``http://box-b:8420``."""
    audience: str
    """The member's own name (its ``GET /health``), which the fleet's assertions for it carry."""
    added: float
    draining: bool = False
    """Being removed: no new jobs; gone once the fleet's jobs on it ended."""


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ConfigError(f"member name {name!r:.40}: use 1-32 lowercase letters, digits, '.', '_' or '-', e.g. box-b")
    return name


def check_url(url: str) -> str:
    if not re.match(r"^https?://[^\s/]+(:\d+)?/?$", url):
        raise ConfigError(
            f"member URL {url!r:.80}: expected http://HOST:PORT of its pod service, e.g. http://box-b:8420"
        )
    return url.rstrip("/")


def connect(path: Path, schema: str) -> sqlite3.Connection:
    """A connection of the fleet's own to the fleet pod's database (0600, WAL), its ``schema`` made: for one table
    of the fleet's, used under its owner's lock."""
    private(path)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(schema)
    return db


class Members:
    """The ``fleet_members`` table: its own connection to the fleet pod's database, one lock."""

    def __init__(self, path: Path) -> None:
        self._db = connect(path, SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def all(self) -> list[Member]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM fleet_members ORDER BY name").fetchall()
        return [Member(r["name"], r["url"], r["audience"], r["added"], bool(r["draining"])) for r in rows]

    def get(self, name: str) -> Member | None:
        return next((m for m in self.all() if m.name == name), None)

    def add(self, name: str, url: str, audience: str) -> bool:
        """Add a member; False when the name is taken."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO fleet_members (name, url, audience, added) VALUES (?, ?, ?, ?)",
                (name, url, audience, time.time()),
            )
            return cur.rowcount == 1

    def drain(self, name: str) -> None:
        with self._lock:
            self._db.execute("UPDATE fleet_members SET draining = 1 WHERE name = ?", (name,))

    def remove(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM fleet_members WHERE name = ?", (name,))
