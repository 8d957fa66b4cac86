"""The root daemon's and the dashboard's reads and writes of a job's folder, against what the job's user puts
there: links (to the admin's token, to another user's run), FIFOs, another account's
file by a hard link; and the pod's own database and lock.

The first tests call the readers and writers directly. The others play real local users (`tests.unix_users`)
against one root pod with its default sandbox, whose home lies where they can reach it (as ``/var/lib/deskpod``
would), and look through every door the pod has onto a job's run: the API's log, the job page and its JSON, its
live stream, the log search, the Jobs list, Compare and Models; each door is first shown reading the user's own
plain files, so that seeing nothing later means the wall held, not that the door looks elsewhere.
(`tests/jobs/test_walls_files.py` plays FIFOs through the same doors, the phase file, and the home's modes.)

A FIFO blocks an unguarded reader for ever, so each direct read runs in a thread that must come back
(`returns`), and each door is asked from a thread with a timeout: a reader that blocks fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.envs.accounts import Account
from deskpod.envs.userfiles import RefusedFile
from deskpod.jobs import supervisor as sv
from deskpod.jobs.daemon import _lock
from deskpod.jobs.joblog import read_log
from deskpod.jobs.pod import build_error
from deskpod.jobs.store import Store
from deskpod.web import logs
from deskpod.web.runinfo import checkpoint_files, has_checkpoint
from tests.jobs.pods import Pod, Pods, as_user, on_socket, wait_state
from tests.unix_users import make_users, shared_folder
from tests.web.browser import sign_in

ROOT = os.geteuid() == 0
NOBODY = 65534
"""An account that is neither the test's nor the job folder's: a file given to it is someone else's."""


def returns(fn: Callable[[], Any]) -> Any:
    """``fn()``'s value (or its exception, raised here), from a thread that must come back: a read that blocks on
    a FIFO fails the test."""
    out: list[tuple[bool, Any]] = []

    def call() -> None:
        try:
            out.append((True, fn()))
        except Exception as e:
            out.append((False, e))

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(60)
    assert out, "the call never returned (it blocked)"
    ok, got = out[0]
    if not ok:
        raise got
    return got


# -- the readers, called directly -----------------------------------------------------------------------------
@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A job folder in a folder of the pod's own, as ``<home>/jobs/<id>`` is (the job's account's on a root pod)."""
    folder = tmp_path / "jobs" / "7"
    folder.mkdir(parents=True)
    if ROOT:
        os.chown(folder, NOBODY, NOBODY)
    return folder


def test_a_fifo_blocks_no_reader_and_no_writer_of_the_loop(job: Path) -> None:
    """Item 7: the loop reads the phase, exit and pid files when a job ends, and appends to its log (the pod's own
    lines when a limit stopped it, the header when it starts again): a FIFO there blocked it for good."""
    for name in ("output.log", "phase.1", "exit.1", "pid.1"):
        os.mkfifo(job / name)
    attempt = sv.Attempt(job)
    assert returns(lambda: attempt.phase(1)) is None
    assert returns(lambda: sv.read_exit(attempt.exit_file(1))) is None
    assert returns(lambda: sv.shim_of(attempt.pid_file(1), attempt.exit_file(1))) is None
    assert returns(lambda: build_error(attempt.log)) == "see env-build.log in the job's folder"
    assert returns(lambda: read_log(job, 0, 1 << 20)) == b""
    with pytest.raises(RefusedFile, match=r"output\.log is not a regular file"):
        returns(lambda: sv.open_log(attempt.log))
    reader = os.open(attempt.log, os.O_RDONLY | os.O_NONBLOCK)  # with a reader, opening for writing would not fail
    try:
        with pytest.raises(RefusedFile, match=r"output\.log is not a regular file"):
            returns(lambda: sv.open_log(attempt.log))
    finally:
        os.close(reader)
    assert returns(lambda: logs.tail(attempt.log)) == ("deskpod: output.log is a FIFO, not a regular file; not shown\n",
                                                       0, False)  # fmt: skip


def test_a_link_for_the_log_is_neither_read_nor_written_through(job: Path, tmp_path: Path) -> None:
    """Item 3: a job made its output.log a link to the admin's token; the root daemon read it back (and would
    append to it, starting the job again)."""
    token = tmp_path / "token"
    token.write_text("dp_admin_secret\n")
    (job / "output.log").symlink_to(token)
    (job / "phase.1").symlink_to(token)
    assert read_log(job, 0, 1 << 20) == b""
    assert sv.Attempt(job).phase(1) is None
    assert logs.tail(job / "output.log")[0] == "deskpod: output.log is a symbolic link; not shown\n"
    with pytest.raises(RefusedFile, match="is a symbolic link"):
        sv.open_log(job / "output.log")
    assert token.read_text() == "dp_admin_secret\n"


@pytest.mark.skipif(not ROOT, reason="files of another account are made by root")
def test_the_log_is_written_only_when_it_is_the_accounts_or_the_pods_own(job: Path, tmp_path: Path) -> None:
    """A hard link in the log's place to a file of someone else's (a user may link a file they can write, under
    the kernel's protected_hardlinks): the root daemon appended to it and gave it to the job's account."""
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("someone else's\n")
    os.chown(theirs, 1, 1)
    os.link(theirs, job / "output.log")
    with pytest.raises(RefusedFile, match="belongs to uid 1, not to the folder's account"):
        sv.open_log(job / "output.log", (NOBODY, NOBODY))
    token = tmp_path / "token"  # the pod's own file, but with a second link: the admin's token itself
    token.write_text("dp_admin_secret\n")
    (job / "output.log").unlink()
    os.link(token, job / "output.log")
    with pytest.raises(RefusedFile, match="has 2 hard links"):
        sv.open_log(job / "output.log", (NOBODY, NOBODY))
    assert (theirs.stat().st_uid, theirs.read_text()) == (1, "someone else's\n")
    assert (token.stat().st_uid, token.read_text()) == (0, "dp_admin_secret\n")
    (job / "output.log").unlink()
    with sv.open_log(job / "output.log", (NOBODY, NOBODY)) as log:  # a new log: made by the pod, given away
        log.write(b"header\n")
    with sv.open_log(job / "output.log") as log:  # the account's own now: the pod adds its lines
        log.write(b"deskpod: killed\n")
    assert (job / "output.log").stat().st_uid == NOBODY
    assert (job / "output.log").read_text() == "header\ndeskpod: killed\n"


def test_checkpoints_are_listed_without_following_a_link(job: Path, tmp_path: Path) -> None:
    """The Models page offers a run to deploy when it has a checkpoint: a link to another run's checkpoints (or a
    checkpoint that is a link) is none."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "step-00000005.pt").write_bytes(b"x")
    run = job / "runs" / "r"
    run.mkdir(parents=True)
    (run / "checkpoints").symlink_to(elsewhere)
    assert not has_checkpoint(run)
    (run / "checkpoints").unlink()
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step-00000003.pt").symlink_to(elsewhere / "step-00000005.pt")
    os.mkfifo(run / "checkpoints" / "step-00000004.pt")
    assert not has_checkpoint(run)
    (run / "checkpoints" / "step-00000002.pt").write_bytes(b"x")
    if ROOT:  # what the job's user made is theirs
        for p in (run.parent, run, run / "checkpoints", run / "checkpoints" / "step-00000002.pt"):
            os.chown(p, NOBODY, NOBODY)
    assert checkpoint_files(run) == [(2, "step-00000002.pt")]


def test_the_database_and_the_lock_are_the_pods_alone(tmp_path: Path) -> None:
    """Item 4 and 7: pod.db and its WAL were 0644 (every job's env, read by any local user), and a user could
    open daemon.lock and hold its flock. A new pod's are 0600 from the start, an older pod's are closed."""
    path = tmp_path / "pod.db"
    old = os.umask(0o022)
    try:  # an older pod's: made by SQLite under the umask, with its WAL files beside it, still open
        older = sqlite3.connect(str(path), isolation_level=None)
        older.execute("PRAGMA journal_mode=WAL")
        older.execute("CREATE TABLE t(x)")
        older.execute("INSERT INTO t VALUES (1)")
        (tmp_path / "daemon.lock").write_text("")
    finally:
        os.umask(old)
    files = [path, tmp_path / "pod.db-wal", tmp_path / "pod.db-shm", tmp_path / "daemon.lock"]
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o644"}
    store = Store(path)
    lock = _lock(tmp_path)
    older.close()
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: "0o600" for p in files}
    store.close()
    lock.close()
    fresh = tmp_path / "new"
    fresh.mkdir()
    store = Store(fresh / "pod.db")  # made 0600 before SQLite opens it: its journals take its mode
    lock = _lock(fresh)
    store.add_user("someone", admin=False)
    made = sorted(fresh.iterdir())
    assert {p.name for p in made} == {"pod.db", "pod.db-wal", "pod.db-shm", "daemon.lock"}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in made} == {p.name: "0o600" for p in made}
    store.close()
    lock.close()


# -- a root pod with its sandbox, and its users --------------------------------------------------------------
pod_only = pytest.mark.skipif(not ROOT, reason="local users played against a pod run by root")
WAIT_S = 180
BOB = {"log": "bob private words", "stderr": "bob worker said", "loss": 4242.25, "summary": 0.8642,
       "config": 0.012345, "steps": 987654}  # fmt: skip
ALICE = {"log": "alice own words", "stderr": "alice worker said", "loss": 1717.75, "summary": 0.5151,
         "config": 0.054321, "steps": 123456}  # fmt: skip
FAILS = {"model": "mlp", "data": "imagefolder:/nowhere"}
"""A train job that fails at once: its run folder is then its user's to fill."""


@pytest.fixture(scope="module")
def box() -> Iterator[Path]:
    """A folder every account can reach."""
    with shared_folder("deskpod-jobfiles-") as base:
        yield base


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Account, Account]]:
    with make_users("alice", "bob") as pair:
        yield pair


@pytest.fixture(scope="module")
def pod(box: Path, users: tuple[Account, Account]) -> Iterator[Pod]:
    (box / "pods").mkdir(mode=0o755)
    pods = Pods(box / "pods")
    try:
        yield pods(sandbox=True)
    finally:
        pods.stop_all()


def submit(pod: Pod, who: Account, spec: dict[str, Any]) -> str:
    """Submit as ``who`` over the Unix socket (the kernel says who); the job's id."""
    return str(as_user(who, on_socket(pod, lambda c: c.submit(spec)))["id"])


def finished(pod: Pod, job: str) -> dict[str, Any]:
    return wait_state(pod.client(), job, "succeeded", "failed", "cancelled", timeout=WAIT_S)


def token_of(pod: Pod, who: Account) -> str:
    return str(as_user(who, on_socket(pod, lambda c: c.new_token(who.name))))


def failed_run(pod: Pod, who: Account, name: str) -> Path:
    """A train job of ``who``'s that failed; its job folder (``runs/<name>/`` in it is the run folder)."""
    job = submit(pod, who, {"name": name, "train": FAILS})
    assert finished(pod, job)["state"] == "failed"
    return pod.home / "jobs" / job


def fill(folder: Path, name: str, values: dict[str, Any]) -> None:
    """Write a run's files (as the folder's user: call through `as_user`), with ``values`` in each."""
    run = folder / "runs" / name
    shutil.rmtree(run, ignore_errors=True)
    for sub in ("checkpoints", "logs", "workers"):
        (run / sub).mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": values["loss"]}) + "\n")
    (run / "summary.json").write_text(json.dumps({"test_accuracy": values["summary"]}))
    (run / "config.toml").write_text(f"lr = {values['config']}\n")
    (run / "launch.json").write_text(json.dumps({"total_steps": values["steps"]}))
    (run / "logs" / "rank0.stderr").write_text(values["stderr"] + "\n")
    (run / "checkpoints" / "step-00000001.pt").write_bytes(b"not really")
    with open(folder / "output.log", "a") as f:
        f.write(values["log"] + "\n")


def stream_of(client: httpx.Client, path: str) -> str:
    """A finished job's live stream, to its end (one that never ends times out: a hang)."""
    got = b""
    with client.stream("GET", path, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for chunk in r.iter_bytes():
            got += chunk
            if b"event: end" in got or len(got) > 4 << 20:
                break
    return got.decode(errors="replace")


def doors(pod: Pod, token: str, job: str) -> dict[str, Callable[[], str]]:
    """Every way a user reads what the pod read of their job's folder, each answering the text it got."""

    def api() -> str:
        r = httpx.get(f"{pod.url}/v1/jobs/{job}/log", headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert r.status_code == 200, r.text
        return r.text

    def ui(path: str, **params: str) -> Callable[[], str]:
        def get() -> str:
            page = sign_in(pod, token)
            try:
                r = page.get(path, params=params, timeout=60)
            finally:
                page.close()
            assert r.status_code == 200, r.text
            return r.text

        return get

    def events() -> str:
        page = sign_in(pod, token)
        try:
            return stream_of(page, f"/ui/jobs/{job}/events")
        finally:
            page.close()

    return {
        "the API's log": api,
        "the job page": ui(f"/ui/jobs/{job}"),
        "the job's JSON": ui(f"/ui/jobs/{job}.json"),
        "the live stream": events,
        "the log search": ui(f"/ui/jobs/{job}/search.json", q="said"),
        "the log search (all words)": ui(f"/ui/jobs/{job}/search.json", q="words"),
        "the Jobs list": ui("/ui/jobs.json"),
        "Compare": ui("/ui/compare.json", jobs=job),
        "Models": ui("/ui/models.json"),
    }


def through_every_door(pod: Pod, token: str, job: str) -> dict[str, str]:
    """What each door answered, all asked at once; a door that does not answer in time fails the test."""
    answered: dict[str, Any] = {}
    asks = doors(pod, token, job)

    def ask(name: str, fn: Callable[[], str]) -> None:
        try:
            answered[name] = fn()
        except Exception as e:  # a timeout too: the door hung
            answered[name] = e

    threads = [threading.Thread(target=ask, args=item, daemon=True) for item in asks.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    bad = {name: repr(answered.get(name, "no answer")) for name in asks if not isinstance(answered.get(name), str)}
    assert not bad, f"doors that did not answer: {bad}"
    assert httpx.get(f"{pod.url}/health", timeout=30).status_code == 200
    return answered


@pod_only
def test_links_in_a_jobs_folder_show_nothing_of_what_they_reach(pod: Pod, users: tuple[Account, Account]) -> None:
    """Item 3, through every door: alice links her log to the admin's token and her run's files (metrics, summary,
    config, launch.json, worker logs, checkpoints) to bob's; the root daemon read them back to her."""
    alice, bob = users
    theirs = failed_run(pod, bob, "bob-run")
    as_user(bob, lambda: fill(theirs, "bob-run", BOB))
    mine = failed_run(pod, alice, "alice-run")
    token = token_of(pod, alice)
    as_user(alice, lambda: fill(mine, "alice-run", ALICE))
    seen = through_every_door(pod, token, mine.name)  # each door reads her own plain files
    shows = {  # where each of her values appears: the same places must not show bob's below
        "log": ("the API's log", "the job page", "the job's JSON", "the live stream", "the log search (all words)"),
        "stderr": ("the log search",),
        "loss": ("the job's JSON", "Compare"),
        "summary": ("the job's JSON", "Compare"),
        "config": ("the job's JSON", "Compare"),
        "steps": ("the job's JSON",),
    }
    for key, where in shows.items():
        for door in where:
            assert str(ALICE[key]) in seen[door], f"{door} did not show alice's own {key}: the check proves nothing"
    assert str(mine / "runs" / "alice-run") in seen["Models"]  # her run, deployable: it has a checkpoint

    def link() -> None:
        os.remove(mine / "output.log")
        os.symlink(pod.home / "token", mine / "output.log")
        run, bobs = mine / "runs" / "alice-run", theirs / "runs" / "bob-run"
        for name in ("metrics.jsonl", "summary.json", "config.toml", "launch.json", "logs", "checkpoints"):
            path = run / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            path.symlink_to(bobs / name)

    as_user(alice, link)
    seen = through_every_door(pod, token, mine.name)
    for door, text in seen.items():
        assert pod.token not in text, f"the admin's token came back through {door}"
        for key, value in BOB.items():
            assert str(value) not in text, f"bob's {key} came back through {door}"
    assert "output.log is a symbolic link; not shown" in seen["the job page"]
    assert "output.log is a symbolic link; not shown" in seen["the live stream"]
    assert str(mine / "runs" / "alice-run") not in seen["Models"]  # no checkpoint of hers to deploy


@pod_only
def test_the_pod_gives_away_no_file_of_anothers_by_a_hard_link(
    pod: Pod, users: tuple[Account, Account], box: Path
) -> None:
    """A hard link in alice's log's place to a file of bob's she may write (the kernel's protected_hardlinks lets
    her link it): started again, the root daemon appended to bob's file and gave it to alice."""
    alice, bob = users
    shared = box / "bobs-notes.txt"
    shared.write_text("bob's notes\n")
    os.chown(shared, bob.uid, bob.gid)
    shared.chmod(0o666)
    job = submit(pod, alice, {"command": [sys.executable, "-c", "raise SystemExit(1)"]})
    assert finished(pod, job)["state"] == "failed"
    log = pod.home / "jobs" / job / "output.log"

    def link() -> None:
        log.unlink()
        os.link(shared, log)

    as_user(alice, link)
    as_user(alice, on_socket(pod, lambda c: c.requeue(job)))
    again = finished(pod, job)
    assert again["state"] == "failed" and f"belongs to uid {bob.uid}" in again["reason"], again["reason"]
    assert (shared.stat().st_uid, shared.read_text()) == (bob.uid, "bob's notes\n")
