"""The store's listing filters and keyset pages, its browser sessions, and its change counter."""

from __future__ import annotations

from pathlib import Path

from deskpod.jobs import auth
from deskpod.jobs.spec import parse_spec
from deskpod.jobs.states import JobState
from deskpod.jobs.store import Store, User


def _store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "pod.db")
    store.add_user("alice", False)
    store.add_user("bob", False)
    return store


def test_filters_and_keyset_pages(tmp_path: Path) -> None:
    store = _store(tmp_path)
    names = ["sweep_1", "sweep-2", "a.100", "sweepx3", "other"]
    ids = [store.submit("alice" if i % 2 == 0 else "bob", parse_spec({"name": n, "command": ["x"]}), 1, 1.0 + i).id
           for i, n in enumerate(names)]  # fmt: skip
    store.transition(ids[1], JobState.CANCELLED, "test", expect=[JobState.QUEUED])
    assert [j.name for j in store.jobs()] == names[::-1]
    assert [j.name for j in store.jobs(user="alice")] == ["other", "a.100", "sweep_1"]
    assert [j.name for j in store.jobs(states=[JobState.CANCELLED])] == ["sweep-2"]
    # ``name`` is a plain substring: '_' and '%' are not wildcards
    assert [j.name for j in store.jobs(name="sweep_")] == ["sweep_1"]
    assert store.jobs(name="%") == [] and store.jobs(name="\\") == []
    assert [j.name for j in store.jobs(name="SWEEP")] == ["sweepx3", "sweep-2", "sweep_1"]
    assert store.count(name="sweep") == 3 and store.count(user="bob") == 2 and store.count() == 5
    first = store.jobs(limit=2)
    second = store.jobs(limit=2, before=first[-1].id)
    third = store.jobs(limit=2, before=second[-1].id)
    assert [j.id for j in first + second + third] == ids[::-1]


def test_sessions_expire_and_end(tmp_path: Path) -> None:
    store = _store(tmp_path)
    alice = User("alice", False)
    session, csrf = auth.new_session(store, alice, now=100.0, hours=1.0)
    assert auth.session_user(store, session, 100.0 + 3599) == (alice, csrf, 100.0 + 3600)
    assert auth.session_user(store, session, 100.0 + 3600) is None  # expired
    assert auth.session_user(store, "not-a-session", 100.0) is None
    assert auth.session_user(store, None, 100.0) is None
    other, _ = auth.new_session(store, alice, now=200.0)
    auth.end_session(store, other)
    assert auth.session_user(store, other, 200.0) is None
    # only the hash is stored, never the cookie's value
    con = store._db
    assert session not in str(con.execute("SELECT * FROM sessions").fetchall())


def test_version_counts_committed_writes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    v = store.version
    job = store.submit("alice", parse_spec({"command": ["x"]}), 1, 1.0)
    assert store.version == v + 1
    store.jobs()
    store.job(job.id)
    assert store.version == v + 1  # reads change nothing
    assert not store.transition(job.id, JobState.RUNNING, "no", expect=[JobState.RUNNING])
    store.transition(job.id, JobState.STARTING, "yes", expect=[JobState.QUEUED])
    assert store.version > v + 1
