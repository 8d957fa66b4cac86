"""What a job plants in its own folder, and what a user does to the pod's home, against a root pod with its default
sandbox: the root daemon and its dashboard must never be tricked by a job's files,
never block on them, and keep the pod's own state to themselves.

Each test plays real local users (`tests.unix_users`) against one pod whose home lies where they can reach it,
as ``/var/lib/deskpod`` would, so that the modes of its files are what keeps them out: jobs submitted over the
Unix socket (the kernel says who), their logs read through the API, the dashboard's job page, its live stream
and its log search with a token of the user's own.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.envs.accounts import Account
from tests.jobs.pods import Pod, Pods, as_user, on_socket, wait_for, wait_state
from tests.unix_users import make_users, shared_folder
from tests.web.browser import csrf_of, sign_in

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacks play local users against a pod run by root")

GUS_SECRET = "gus's private words"
GUS_LOSS = 424242.5
"""A loss only gus's run has: a chart showing it read gus's file."""
WAIT_S = 180


@pytest.fixture(scope="module")
def box() -> Iterator[Path]:
    """A folder every account can reach."""
    with shared_folder("deskpod-walls-files-") as base:
        yield base


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Account, Account]]:
    with make_users("fay", "gus") as (fay, gus):
        yield fay, gus


@pytest.fixture(scope="module")
def pod(box: Path, users: tuple[Account, Account]) -> Iterator[Pod]:
    (box / "pods").mkdir(mode=0o755)
    pods = Pods(box / "pods")
    try:
        yield pods(sandbox=True)  # its home, socket and lock under a folder users can enter
    finally:
        pods.stop_all()


@pytest.fixture(scope="module")
def gus_job(pod: Pod, users: tuple[Account, Account]) -> str:
    """A finished job of gus's whose log holds `GUS_SECRET`, with a metrics file of his beside it."""
    _, gus = users
    code = (f"print({GUS_SECRET!r}, flush=True); "
            f"open('gus-metrics.jsonl', 'w').write('{{\"kind\": \"train\", \"step\": 1, \"loss\": {GUS_LOSS}}}\\n')")  # fmt: skip
    job = submit(pod, gus, {"command": [sys.executable, "-c", code]})
    assert finished(pod, job)["state"] == "succeeded"
    return job


def submit(pod: Pod, who: Account, spec: dict[str, Any]) -> str:
    """Submit as ``who`` over the Unix socket; the job's id."""
    return str(as_user(who, on_socket(pod, lambda c: c.submit(spec)))["id"])


def token_of(pod: Pod, who: Account) -> str:
    return str(as_user(who, on_socket(pod, lambda c: c.new_token(who.name))))


def finished(pod: Pod, job: str) -> dict[str, Any]:
    return wait_state(pod.client(), job, "succeeded", "failed", "cancelled", timeout=WAIT_S)


def folder(pod: Pod, job: str) -> Path:
    return pod.home / "jobs" / job


def events(client: httpx.Client, path: str, until: bytes) -> str:
    """The start of a job's live stream, up to the first event containing ``until`` (or its end)."""
    got = b""
    with client.stream("GET", path, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for chunk in r.iter_bytes():
            got += chunk
            if until in got or b"event: end" in got or len(got) > 1 << 20:
                break
    return got.decode(errors="replace")


def everywhere(pod: Pod, token: str, job: str) -> dict[str, str]:
    """What the job's user reads of its log and run through every door: the API, the job page and its JSON, the
    live stream, the log search."""
    out: dict[str, str] = {}
    with httpx.Client(base_url=pod.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as api:
        r = api.get(f"/v1/jobs/{job}/log")
        assert r.status_code == 200, r.text
        out["the API's log"] = r.text
    page = sign_in(pod, token)
    try:
        for where, path in (("the job page", f"/ui/jobs/{job}"), ("its JSON", f"/ui/jobs/{job}.json")):
            r = page.get(path, timeout=60)
            assert r.status_code == 200, r.text
            out[where] = r.text
        for q in ("root", "gus", pod.token[:8], "dp_"):
            r = page.get(f"/ui/jobs/{job}/search.json", params={"q": q}, timeout=60)
            assert r.status_code == 200, r.text
            out[f"the log search for {q!r}"] = r.text
        out["the live stream"] = events(page, f"/ui/jobs/{job}/events", b"event: end")
    finally:
        page.close()
    return out


LINK = """
import os, sys
target, also = sys.argv[1], sys.argv[2:]
os.remove("output.log")
os.symlink(target, "output.log")
if also:  # a run folder whose worker log and metrics are links too
    run = "runs/linked"
    os.makedirs(run + "/logs")
    open(run + "/run.json", "w").write("{}")
    os.symlink(target, run + "/logs/agent.log")
    os.symlink(also[0], run + "/metrics.jsonl")
"""


def test_a_log_linked_elsewhere_shows_nothing_of_its_target(
    pod: Pod, users: tuple[Account, Account], gus_job: str
) -> None:
    """Item 3: a job made its output.log a link (to the admin's token, /etc/shadow, another user's log); the root
    daemon read the target back to the job's user through the API, the dashboard, the live stream and search."""
    fay, _ = users
    token = token_of(pod, fay)
    gus_log = folder(pod, gus_job) / "output.log"
    targets: dict[str, tuple[Path, str, list[str]]] = {
        "the admin token": (pod.home / "token", pod.token, []),
        "/etc/shadow": (Path("/etc/shadow"), "root:", []),
        "gus's log and metrics": (gus_log, GUS_SECRET, [str(folder(pod, gus_job) / "gus-metrics.jsonl")]),
    }
    for what, (target, secret, also) in targets.items():
        assert secret in target.read_text()  # what a follower of the link would show
        job = submit(pod, fay, {"name": "linked", "command": [sys.executable, "-c", LINK, str(target), *also]})
        assert finished(pod, job)["state"] == "succeeded"
        assert (folder(pod, job) / "output.log").is_symlink()
        seen = everywhere(pod, token, job)
        for where, text in seen.items():
            assert secret not in text, f"{what} came back through {where}"
            assert str(GUS_LOSS) not in text, f"gus's metrics came back through {where}"
        assert "output.log is a symbolic link; not shown" in seen["the job page"]
        assert "output.log is a symbolic link; not shown" in seen["the live stream"]
        if also:  # a run it did show: the worker log left out of the search, no point charted
            page = json.loads(seen["its JSON"])
            assert page["run"] is not None and page["log_files"] == []
            assert all(not line["points"] for chart in page["charts"] for line in chart["series"])


STALL_FILES = ("metrics.jsonl", "summary.json", "config.toml", "launch.json", "logs/rank0.attempt0.stderr",
               "workers/rank0.pid", "checkpoints/step-00000001.pt")  # fmt: skip
FIFOS = f"""
import os, time
os.remove("output.log")
os.mkfifo("output.log")
run = "runs/stalled"
for sub in ("logs", "workers", "checkpoints"):
    os.makedirs(run + "/" + sub)
open(run + "/run.json", "w").write("{{}}")
for name in {STALL_FILES!r}:
    os.mkfifo(run + "/" + name)
time.sleep(600)
"""


def test_fifos_in_a_jobs_folder_hang_no_request(pod: Pod, users: tuple[Account, Account]) -> None:
    """Item 7: a job made its output.log (and its run's files) FIFOs, then its page was viewed: every API thread
    hung, /health too. Each door must answer, and the pod must go on answering and scheduling."""
    fay, gus = users
    job = submit(pod, fay, {"name": "stalled", "command": [sys.executable, "-c", FIFOS]})
    token = token_of(pod, fay)
    auth = {"Authorization": f"Bearer {token}"}
    run = folder(pod, job) / "runs" / "stalled"
    wait_for(lambda: (run / STALL_FILES[-1]).is_fifo(), WAIT_S, "the FIFOs to be planted")
    assert (folder(pod, job) / "output.log").is_fifo()
    page = sign_in(pod, token)
    csrf = csrf_of(page)
    doors: dict[str, Callable[[], object]] = {
        "the job page": lambda: page.get(f"/ui/jobs/{job}", timeout=60),
        "its JSON": lambda: page.get(f"/ui/jobs/{job}.json", timeout=60),
        "the jobs list": lambda: page.get("/ui/jobs.json", timeout=60),
        "its live stream": lambda: events(page, f"/ui/jobs/{job}/events", b"event: log"),
        "the log search": lambda: page.get(f"/ui/jobs/{job}/search.json", params={"q": "x"}, timeout=60),
        "its stacks": lambda: page.post(
            f"/ui/jobs/{job}/stacks", data={"csrf": csrf}, headers={"Accept": "application/json"}, timeout=120
        ),
        "the API's log": lambda: httpx.get(f"{pod.url}/v1/jobs/{job}/log", headers=auth, timeout=60),
    }
    answered: dict[str, object] = {}
    threads = [threading.Thread(target=_call, args=(fn, name, answered), daemon=True) for name, fn in doors.items()]
    try:
        for t in threads:
            t.start()
        health = httpx.get(f"{pod.url}/health", timeout=60)  # while the doors are asked
        for t in threads:
            t.join(180)
        hung = {name: answered.get(name, "no answer") for name in doors if not _answer_ok(answered.get(name))}
        assert not hung, f"doors that did not answer: {hung}"
        assert health.status_code == 200
        assert "output.log is a FIFO, not a regular file; not shown" in str(answered["its live stream"])
        api_log = answered["the API's log"]
        assert isinstance(api_log, httpx.Response) and api_log.content == b""
    finally:
        page.close()
    admin = pod.client()
    admin.cancel(job)
    assert finished(pod, job)["state"] == "cancelled"
    # started again, its log is still a FIFO: the start fails saying so, and the pod goes on
    admin.requeue(job)
    again = finished(pod, job)
    assert again["state"] == "failed" and "output.log is not a regular file" in again["reason"], again["reason"]
    after = submit(pod, gus, {"command": ["true"]})
    assert finished(pod, after)["state"] == "succeeded"


def _call(fn: Callable[[], object], name: str, answered: dict[str, object]) -> None:
    try:
        answered[name] = fn()
    except Exception as e:  # a timeout: the door hung
        answered[name] = e


def _answer_ok(got: object) -> bool:
    return isinstance(got, str) or (isinstance(got, httpx.Response) and got.status_code == 200)


PHASE = """
import os, sys
for name in ("phase.1", "pid.1"):
    if os.path.lexists(name):
        os.remove(name)
    os.mkfifo(name)
sys.exit(3)
"""


def test_a_fifo_for_the_phase_file_stops_no_scheduling(pod: Pod, users: tuple[Account, Account]) -> None:
    """Item 7: a job replaced its phase file with a FIFO; the scheduler loop, reading it when the job ended,
    blocked for good."""
    fay, gus = users
    job = submit(pod, fay, {"command": [sys.executable, "-c", PHASE]})
    ended = finished(pod, job)
    assert (folder(pod, job) / "phase.1").is_fifo()
    assert ended["state"] == "failed" and ended["exit_code"] == 3, ended
    after = submit(pod, gus, {"command": ["true"]})
    assert finished(pod, after)["state"] == "succeeded"


def test_the_pods_own_files_are_closed_to_users(pod: Pod, users: tuple[Account, Account], gus_job: str) -> None:
    """Items 4 and 7: pod.db and its WAL were 0644 (every job's env, other users' API keys, read by anyone), and
    a user's ``flock -x`` on daemon.lock kept the pod from starting again."""
    fay, gus = users
    secret = "gus's-api-key"
    job = submit(pod, gus, {"command": ["true"], "env": {"API_KEY": secret}})
    assert finished(pod, job)["state"] == "succeeded"
    home = pod.home
    for name in ("pod.db", "pod.db-wal", "pod.db-shm", "daemon.lock", "token"):
        assert (home / name).stat().st_mode & 0o777 == 0o600, name

    def lock() -> str:
        try:
            fd = os.open(home / "daemon.lock", os.O_RDONLY)
        except PermissionError:
            return "refused"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return "locked"
        except OSError:
            return "opened"
        finally:
            os.close(fd)

    assert as_user(fay, lock) == "refused"

    names = sorted(os.listdir(home))

    def openable() -> list[str]:
        """What fay can open of what lies in the pod's home."""
        out = []
        for name in names:
            try:
                os.close(os.open(home / name, os.O_RDONLY | os.O_NONBLOCK))
                out.append(name)
            except OSError:
                continue
        return out

    assert {"pod.db", "pod.db-wal", "pod.db-shm", "daemon.lock", "token", "pod.sock", "daemon.json"} <= set(names)
    harness = {"daemon.out"}  # the tests' own capture of the daemon's output (tests/jobs/pods.py)
    intended = {"daemon.json", "envs"}  # how the CLI finds the pod; the environments every job's account runs
    assert set(as_user(fay, openable)) - harness <= intended
    # a job's env is shown to its owner and admins only
    gus_view = as_user(gus, on_socket(pod, lambda c: c.job(job)))
    assert gus_view["spec"]["env"] == {"API_KEY": secret}  # the check below could fail
    fay_token = token_of(pod, fay)
    with httpx.Client(base_url=pod.url, headers={"Authorization": f"Bearer {fay_token}"}, timeout=60) as api:
        assert api.get(f"/v1/jobs/{job}").status_code == 404
        assert secret not in api.get("/v1/jobs").text
        assert api.get("/v1/jobs", params={"user": gus.name}).status_code == 403
    page = sign_in(pod, fay_token)
    try:
        assert page.get(f"/ui/jobs/{job}.json").status_code == 404
        assert secret not in page.get("/ui/jobs.json").text
    finally:
        page.close()
