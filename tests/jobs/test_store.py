"""The store's listing filters and keyset pages, its browser sessions, and its change counter."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_jobs_of_one_kind(tmp_path: Path) -> None:
    """``kind`` selects in the store, so a page of one kind is never hidden behind newer jobs of others."""
    store = _store(tmp_path)
    specs = [{"train": {"model": "mlp"}}, {"command": ["x"]}, {"serve": {"run": "/r/runs/a"}}, {"command": ["y"]}]
    ids = [store.submit("alice", parse_spec(s), 1, 1.0).id for s in specs]
    assert [j.id for j in store.jobs(kind="train")] == [ids[0]] and store.count(kind="train") == 1
    assert [j.id for j in store.jobs(kind="serve", user="alice")] == [ids[2]] and store.jobs(
        kind="serve", user="bob"
    ) == []
    assert [j.id for j in store.jobs(kind="command", limit=1)] == [ids[3]] and store.count(kind="command") == 2
    assert [j.id for j in store.jobs(kind="command", before=ids[3])] == [ids[1]]
    with pytest.raises(ValueError, match="job kind 'jupyter'"):
        store.jobs(kind="jupyter")


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


def _queue_from_sql(store: Store) -> list[tuple[object, ...]]:
    cur = store._db.execute(
        "SELECT id, priority, devices, placement, max_runtime, reason FROM jobs WHERE state = 'queued' ORDER BY id"
    )
    return [tuple(r) for r in cur.fetchall()]


def test_the_queue_view_follows_every_write_and_other_connections(tmp_path: Path) -> None:
    import sqlite3

    store = _store(tmp_path)
    ids = [
        store.submit("alice", parse_spec({"command": ["x"], "priority": i % 3}), 1 + i % 2, 1.0).id for i in range(6)
    ]
    assert store.queue() == _queue_from_sql(store)  # read once
    store.set_reasons({ids[0]: "waits for 2 GPUs", ids[5]: "behind job 1"})
    store.transition(ids[1], JobState.STARTING, "start", expect=[JobState.QUEUED], assigned="0")
    store.transition(ids[2], JobState.CANCELLED, "cancel", expect=[JobState.QUEUED])
    store.update(ids[3], reason="needs 2 NVLink-connected GPUs")
    late = store.submit("bob", parse_spec({"command": ["y"]}), 1, 2.0).id
    store.transition(ids[1], JobState.QUEUED, "requeued", expect=[JobState.STARTING], assigned="")  # back, mid-queue
    view = store.queue()
    assert view == _queue_from_sql(store)
    assert [r[0] for r in view] == [ids[0], ids[1], ids[3], ids[4], ids[5], late]  # by id, as SQL gives it
    assert view[0][5] == "waits for 2 GPUs" and view[2][5] == "needs 2 NVLink-connected GPUs"
    # Another connection (another process) writes: the next read sees it.
    other = sqlite3.connect(str(tmp_path / "pod.db"), isolation_level=None)
    other.execute("UPDATE jobs SET state = 'cancelled' WHERE id = ?", (ids[4],))
    other.close()
    assert store.queue() == _queue_from_sql(store) and ids[4] not in [r[0] for r in store.queue()]


def test_queue_delta_names_the_jobs_whose_scheduler_fields_changed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    a, b, c = (store.submit("alice", parse_spec({"command": ["x"]}), 1, 1.0).id for _ in range(3))
    view, changed = store.queue_delta()
    assert changed is None and list(view) == [a, b, c]  # the first read: start from the whole queue
    store.set_reasons({a: "behind job 9"})
    store.update(b, reason="needs 2 GPUs")
    assert store.queue_delta()[1] == set()  # reasons are not the scheduler's input
    store.transition(a, JobState.CANCELLED, "cancel", expect=[JobState.QUEUED])
    d = store.submit("bob", parse_spec({"command": ["y"]}), 2, 2.0).id
    view, changed = store.queue_delta()
    assert changed == {a, d} and list(view) == [b, c, d] and view[b][5] == "needs 2 GPUs"
    assert store.queue_delta()[1] == set()


def test_a_stored_spec_that_todays_rules_refuse_is_listed_and_never_runs(tmp_path: Path) -> None:
    """A job stored before the loader's variables and local environment sources were refused still lists, without
    them, saying why; the pod fails it at start instead of running it."""
    import json
    import sqlite3

    from deskpod.hardware.placement import Unplaceable
    from deskpod.jobs.local import LocalExecutor
    from deskpod.jobs.pod import Pod, PodConfig

    store = _store(tmp_path)
    job = store.submit("alice", parse_spec({"name": "old", "command": ["true"], "env": {"SEED": "1"}}), 1, 1.0)
    old = {"name": "old", "command": ["true"], "env": {"LD_PRELOAD": "/home/alice/evil.so", "SEED": "1"}}
    with sqlite3.connect(tmp_path / "pod.db") as db:  # what an older pod accepted
        db.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(old), job.id))
    got = store.job(job.id)
    assert got is not None and got.spec.refused is not None and "LD_PRELOAD" in got.spec.refused
    assert got.spec.env == {} and [j.id for j in store.jobs()] == [job.id]
    never = Unplaceable("the test starts the job itself", ever=False)
    config = PodConfig(home=tmp_path / "home")
    local = LocalExecutor(config, device_count=1, device_kind="cpu", place=lambda *_: never)
    local.launch(Pod(config, store, local, device_count=1, device_kind="cpu", place=local.place), job.id, (0,), "test")
    ended = store.job(job.id)
    assert ended is not None and ended.state is JobState.FAILED
    assert "its spec is no longer accepted" in ended.reason and "LD_PRELOAD" in ended.reason
    assert not (tmp_path / "home" / "jobs" / str(job.id) / "output.log").exists()  # nothing ran


def test_a_waiter_wakes_when_one_of_its_jobs_is_written_and_reads_what_a_fleet_holds(tmp_path: Path) -> None:
    import threading
    import time

    store = _store(tmp_path)
    spec = parse_spec({"command": ["x"]})
    held = store.submit("alice", spec, 1, time.time(), lease=("fleet-1", time.time() + 60)).id
    other = store.submit("alice", spec, 1, time.time()).id
    assert [j.id for j in store.held("fleet-1", [held, other])] == [held]  # the other is no fleet's
    assert store.held("fleet-2", [held]) == []
    assert not store.held("fleet-1", [held])[0].lease_confirmed  # reading renews and confirms nothing

    since = store.version
    t0 = time.monotonic()
    assert not store.wait_written([held], since, 0.2)  # nothing written: the whole timeout
    assert time.monotonic() - t0 >= 0.2
    store.transition(other, JobState.CANCELLED, "test", expect=[JobState.QUEUED])
    assert not store.wait_written([held], since, 0.05)  # another job's write does not count
    writer = threading.Timer(0.1, lambda: store.transition(held, JobState.STARTING, "test"))
    writer.start()
    t0 = time.monotonic()
    assert store.wait_written([held], store.version, 10)
    assert time.monotonic() - t0 < 5 and store.job(held).state is JobState.STARTING  # type: ignore[union-attr]
    writer.join()


def test_a_keyed_forward_is_made_once_may_start_at_once_and_a_key_looked_up_first_is_refused(tmp_path: Path) -> None:
    import time

    store = _store(tmp_path)
    spec = parse_spec({"command": ["x"]})
    now = time.time()
    first = store.forwarded("alice", spec, 1, now, ("fleet-1", now + 60), "7.1.ab")
    assert first is not None and first[1] and first[0].lease_confirmed  # startable at once
    assert [q[0] for q in store.queue()] == [first[0].id]
    again = store.forwarded("alice", spec, 1, now + 1, ("fleet-1", now + 61), "7.1.ab")
    assert again is not None and again == (first[0], False)  # the same job, not another
    other_fleet = store.forwarded("alice", spec, 1, now, ("fleet-2", now + 60), "7.1.ab")
    assert other_fleet is not None and other_fleet[1] and other_fleet[0].id != first[0].id  # keys are per fleet
    assert len(store.jobs()) == 2

    found = store.lookup("fleet-1", ["7.1.ab", "7.2.cd"], now + 2)
    assert list(found) == ["7.1.ab"] and found["7.1.ab"].id == first[0].id
    assert store.forwarded("alice", spec, 1, now + 3, ("fleet-1", now + 63), "7.2.cd") is None  # closed by the look-up
    assert store.lookup("fleet-1", ["7.2.cd"], now + 4) == {}  # and stays not found
    assert store.lookup("fleet-2", ["7.2.cd"], now + 4) == {}
    assert len(store.jobs()) == 2
    unkeyed = store.submit("alice", spec, 1, now, lease=("fleet-1", now + 60))
    assert not unkeyed.lease_confirmed and unkeyed.id not in [q[0] for q in store.queue()]  # waits for a renewal
