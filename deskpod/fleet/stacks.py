"""A fleet's stacks: named, versioned environments, the same on every member — the managed image.

A stack is an environment definition (`deskpod.envs.definition`: a uv lock with its pyproject, or a requirements
file, or a pyproject, with a Python version) under a name. Publishing adds a version::

    deskpod fleet stack publish pytorch-2.14 uv.lock --python 3.11     -> pytorch-2.14 v1
    deskpod fleet stack publish pytorch-2.14 uv.lock                   -> "unchanged: v1 has these contents"
    (edit the lock)  ... publish again                                 -> v2, the current version
    (the v1 files)   ... publish again                                 -> v3, with v1's contents: a rollback

Each version is content-addressed: its hash is `deskpod.envs.definition.content_hash`, what the environments cache
keys on (with the interpreter a member resolves the Python to), so a member builds each distinct content once,
and a rollback to contents a member built before builds nothing. A publish is refused (one line, nothing stored)
unless the definition parses and resolves against the fleet's package sources (`deskpod.envs.resolution`).

A job names a stack (``stack = "pytorch-2.14"``); the fleet pins it at submission (`StackStore.resolve`) to the
current version, ``pytorch-2.14@v2`` with v2's environment, and stores that: a queued or running job keeps the
version it was given, whatever is published or rolled out after. `deskpod.fleet.rollout` builds a version on the
members one at a time and records here what each member built and passed.

The store is its own SQLite file in the fleet's home (``stacks.db``, WAL, 0600): each publish and each record one
transaction, so a fleet killed at any instant has a version whole or not at all.
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from deskpod.envs.definition import EnvDefinition, content_hash, parse_environment
from deskpod.envs.resolution import resolve
from deskpod.errors import ConfigError, NotFoundError
from deskpod.jobs.spec import STACK_RE, JobSpec
from deskpod.jobs.store import private, transaction

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A stack's name: what ``stack = "..."`` names (`deskpod.jobs.spec.STACK_RE` less its ``@vN``)."""
KINDS = ("lock", "requirements", "pyproject", "packages")
"""What a stack may be defined by: an environment that is built (not a container image)."""
OUTCOMES = ("passed", "failed")
"""What a member's smoke job of a version ended as (`MemberBuild.outcome`)."""
SCHEMA = """
CREATE TABLE IF NOT EXISTS versions(
    name TEXT NOT NULL, version INTEGER NOT NULL, hash TEXT NOT NULL, definition TEXT NOT NULL,
    resolved TEXT NOT NULL, published_at REAL NOT NULL, published_by TEXT NOT NULL, PRIMARY KEY(name, version));
CREATE TABLE IF NOT EXISTS builds(
    name TEXT NOT NULL, version INTEGER NOT NULL, hash TEXT NOT NULL, member TEXT NOT NULL, outcome TEXT NOT NULL,
    step TEXT NOT NULL, reason TEXT NOT NULL, log_tail TEXT NOT NULL, job TEXT, seconds REAL NOT NULL,
    at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS builds_stack ON builds(name, member);
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class StackVersion:
    """One published version of a stack."""

    name: str
    version: int
    """1, 2, ...: the order of publishing; the highest is the current version."""
    hash: str
    """`content_hash` of the definition: equal hashes build the same environment."""
    definition: EnvDefinition
    """What the environment is, its Python version always set."""
    resolved: tuple[str, ...]
    """``name==version`` of every package it resolved to when published (`deskpod.envs.resolution`)."""
    published_at: float
    published_by: str

    @property
    def ref(self) -> str:
        """``NAME@vN``: how a job spec names this version once the fleet pinned it."""
        return f"{self.name}@v{self.version}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "ref": self.ref, "hash": self.hash,
                "summary": self.definition.summary(), "python": self.definition.python,
                "definition": self.definition.to_json(), "resolved": list(self.resolved),
                "published_at": self.published_at, "published_by": self.published_by}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberBuild:
    """What a member made of a version of a stack: its smoke job's outcome (`deskpod.fleet.rollout`)."""

    name: str
    version: int
    hash: str
    member: str
    outcome: str
    """``passed`` (built, and every smoke step passed) or ``failed``."""
    step: str
    """The step that failed (``build``, ``start``, ``import``, ``matmul``, ``allreduce``, ``wait``), or ``""``."""
    reason: str
    """Why, in one line; for a pass, what it measured (``torch 2.13.0, all-reduce over 2 CPU slots (gloo)``)."""
    log_tail: str
    """The end of the smoke job's log."""
    job: str | None
    """The smoke job's id on the member."""
    seconds: float
    """From the smoke job's submission to its end."""
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "hash": self.hash, "member": self.member,
                "outcome": self.outcome, "step": self.step, "reason": self.reason, "log_tail": self.log_tail,
                "job": self.job, "seconds": round(self.seconds, 3), "at": self.at}  # fmt: skip


def check_name(name: object) -> str:
    """A stack's name, or `ConfigError` showing a valid one."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise ConfigError(f"stack name {shown} is not valid; use 1-64 letters, digits, '.', '_' or '-', starting with"
                          " a letter or digit, e.g. pytorch-2.14")  # fmt: skip
    return name


def stack_definition(table: object, python: str | None) -> EnvDefinition:
    """A stack's environment from its ``[environment]``-shaped table (files as ``{"file", "text"}``), its Python set:
    ``python`` (``3.11``) where given, else the table's, else this process's X.Y (the fleet's own). `ConfigError` for
    a table that does not parse or a container image."""
    defn = parse_environment(table)
    if defn.kind not in KINDS:
        raise ConfigError(f"a stack is an environment the members build (a uv lock or a requirements file); a {defn.kind}"
                          " is not one")  # fmt: skip
    if python is not None:
        defn = parse_environment({**defn.to_json(), "python": python})
    elif defn.python is None:
        defn = replace(defn, python=f"{sys.version_info.major}.{sys.version_info.minor}")
    return defn


class StackStore:
    """The stacks of one fleet, in ``<home>/stacks.db`` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        private(path)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, transaction(self._db) as db:
            yield db

    # versions -----------------------------------------------------------------------------------------------
    def publish(self, name: str, defn: EnvDefinition, *, by: str, cache_dir: Path) -> tuple[StackVersion, bool]:
        """Add ``defn`` as the next version of stack ``name`` once it resolves (uv's cache in ``cache_dir``); returns
        (the version, True) — or (the current version, False) when it already has these contents, adding nothing.
        `ConfigError` when it does not resolve: nothing is stored."""
        check_name(name)
        digest = content_hash(defn)
        current = self.current(name, missing_ok=True)
        if current is not None and current.hash == digest:
            return current, False
        assert defn.python is not None  # `stack_definition` sets it
        resolution = resolve(defn, python=defn.python, cache_dir=cache_dir)
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT MAX(version) FROM versions WHERE name = ?", (name,)).fetchone()
            latest = self._row(db.execute("SELECT * FROM versions WHERE name = ? AND version = ?",
                                          (name, row[0])).fetchone()) if row[0] else None  # fmt: skip
            if latest is not None and latest.hash == digest:  # published meanwhile by another caller
                return latest, False
            version = StackVersion(name=name, version=(row[0] or 0) + 1, hash=digest, definition=defn,
                                   resolved=resolution.packages, published_at=now, published_by=by)  # fmt: skip
            db.execute(
                "INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?)",
                (name, version.version, digest, json.dumps(defn.to_json()), json.dumps(list(resolution.packages)),
                 now, by),
            )  # fmt: skip
        return version, True

    def names(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT DISTINCT name FROM versions ORDER BY name")]

    def versions(self, name: str) -> list[StackVersion]:
        """Every version of ``name``, oldest first; `NotFoundError` for a stack never published."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM versions WHERE name = ? ORDER BY version", (name,)).fetchall()
        if not rows:
            raise NotFoundError(self._unknown(name))
        return [self._row(r) for r in rows]

    def current(self, name: str, *, missing_ok: bool = False) -> StackVersion | None:
        """The newest version of ``name``; None (``missing_ok``) or `NotFoundError` when it has none."""
        with self._lock:
            row = self._db.execute("SELECT * FROM versions WHERE name = ? ORDER BY version DESC LIMIT 1",
                                   (name,)).fetchone()  # fmt: skip
        if row is None:
            if missing_ok:
                return None
            raise NotFoundError(self._unknown(name))
        return self._row(row)

    def version(self, name: str, number: int) -> StackVersion:
        with self._lock:
            row = self._db.execute("SELECT * FROM versions WHERE name = ? AND version = ?", (name, number)).fetchone()
        if row is None:
            known = ", ".join(f"v{v.version}" for v in self.versions(name))  # NotFoundError for an unknown stack
            raise NotFoundError(f"stack {name!r} has no version v{number}; it has {known}")
        return self._row(row)

    def _unknown(self, name: str) -> str:
        with self._lock:
            known = [r[0] for r in self._db.execute("SELECT DISTINCT name FROM versions ORDER BY name")]
        shown = ", ".join(known) if known else "none yet (deskpod fleet stack publish NAME FILE)"
        return f"no stack {name!r:.80} at this fleet; its stacks: {shown}"

    @staticmethod
    def _row(r: sqlite3.Row) -> StackVersion:
        return StackVersion(name=r["name"], version=r["version"], hash=r["hash"],
                            definition=parse_environment(json.loads(r["definition"])),
                            resolved=tuple(json.loads(r["resolved"])), published_at=r["published_at"],
                            published_by=r["published_by"])  # fmt: skip

    # jobs ---------------------------------------------------------------------------------------------------
    def resolve(self, spec: JobSpec) -> JobSpec:
        """`deskpod.jobs.pod.StackResolver`: ``stack = NAME`` pinned to the current version (``NAME@vN``, with its
        environment); ``NAME@vN`` to that version. An environment sent with a pinned stack must be that version's
        (a stored spec submitted again); `ConfigError` for an unknown stack or version."""
        assert spec.stack is not None and STACK_RE.match(spec.stack)
        name, _, pinned = spec.stack.partition("@v")
        try:
            version = self.version(name, int(pinned)) if pinned else self.current(name)
        except NotFoundError as e:
            raise ConfigError(f"job spec: stack = {spec.stack!r}: {e}") from None
        assert version is not None
        if spec.environment is not None and content_hash(spec.environment) != version.hash:
            raise ConfigError(f"job spec: stack = {spec.stack!r} comes with an [environment] that is not {version.ref}'s;"
                              " give the stack alone")  # fmt: skip
        return replace(spec, stack=version.ref, environment=version.definition)

    # what members have --------------------------------------------------------------------------------------
    def record(self, build: MemberBuild) -> None:
        """Keep what a member made of a version (`deskpod.fleet.rollout`)."""
        if build.outcome not in OUTCOMES:
            raise ValueError(f"outcome {build.outcome!r}: expected one of {', '.join(OUTCOMES)}")
        with self._tx() as db:
            db.execute(
                "INSERT INTO builds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (build.name, build.version, build.hash, build.member, build.outcome, build.step, build.reason,
                 build.log_tail, build.job, build.seconds, build.at),
            )  # fmt: skip

    def builds(self, name: str, member: str | None = None) -> list[MemberBuild]:
        """What members made of ``name``'s versions (one member's with ``member``), oldest first."""
        query, args = "SELECT * FROM builds WHERE name = ?", [name]
        if member is not None:
            query, args = query + " AND member = ?", [*args, member]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY at, rowid", args).fetchall()
        return [MemberBuild(**dict(zip(r.keys(), tuple(r), strict=True))) for r in rows]

    def status(self, members: Sequence[str]) -> list[dict[str, Any]]:
        """Each stack: its current version and, per member (those given, then any other that built one), the
        versions it built and passed, the versions that failed there, and which version it has: the newest whose
        contents passed there (a rollback to contents it passed before needs no rollout to count)."""
        out = []
        for name in self.names():
            versions = self.versions(name)
            current = versions[-1]
            by_member: dict[str, list[MemberBuild]] = {m: [] for m in members}
            for b in self.builds(name):
                by_member.setdefault(b.member, []).append(b)
            rows = []
            for member, builds in by_member.items():
                has = _has(versions, builds)
                last = builds[-1] if builds else None
                rows.append({
                    "member": member,
                    "passed": sorted({b.version for b in builds if b.outcome == "passed"}),
                    "failed": sorted({b.version for b in builds if b.outcome == "failed"}),
                    "has": None if has is None else has.version,
                    "current": has is not None and has.hash == current.hash,
                    "last": None if last is None else last.to_json(),
                })  # fmt: skip
            out.append({"name": name, "current": current.to_json(), "versions": len(versions), "members": rows})
        return out

    def built(self) -> dict[str, list[str]]:
        """Each member that has a stack: the versions it has (``NAME@vN``, as `status` says), by stack name."""
        out: dict[str, list[str]] = {}
        for name in self.names():
            versions = self.versions(name)
            by_member: dict[str, list[MemberBuild]] = {}
            for b in self.builds(name):
                by_member.setdefault(b.member, []).append(b)
            for member, builds in by_member.items():
                has = _has(versions, builds)
                if has is not None:
                    out.setdefault(member, []).append(has.ref)
        return out


def _has(versions: Sequence[StackVersion], builds: Sequence[MemberBuild]) -> StackVersion | None:
    """The version a member has: the newest whose contents passed there (a rollback to contents it passed before
    needs no rollout to count)."""
    passed = {b.hash for b in builds if b.outcome == "passed"}
    return next((v for v in reversed(versions) if v.hash in passed), None)


def member_spec(spec: JobSpec) -> dict[str, Any]:
    """A job spec the fleet pinned (`StackStore.resolve`), as a member takes it: the version's ``[environment]``,
    without ``stack`` (a member is a plain pod, which refuses it), the version named in ``DESKPOD_STACK``."""
    out = spec.to_json()
    ref = out.pop("stack", None)
    if ref is not None:
        out["env"] = {**out["env"], "DESKPOD_STACK": ref}
    return out
