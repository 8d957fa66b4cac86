"""Sessions' time and idleness on a real pod (root, default sandbox, real users ann and ben), with short settings:
``--idle-timeout 8s --session-max-time 2m --session-time 90s``.

An idle notebook is warned, its kernels stopped and its devices given to the next queued job; starting a kernel again
waits for the same devices and gets them once that job ends. A session's time: the pod's default, refused beyond the
pod's longest, extended (never past it), warned before the end, then stopped.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.envs.accounts import Account
from deskpod.errors import ConflictError
from tests.jobs.pods import Pod, Pods, python_job, wait_for, wait_state
from tests.web import session_pods
from tests.web.test_sessions import bearer, start_kernel

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(os.geteuid() != 0, reason="sessions run as their users only on a pod started by root"),
]
box, users, tokens = session_pods.box, session_pods.users, session_pods.tokens
IDLE_S = 8.0


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, box: Path) -> Any:
    pods = Pods(tmp_path_factory.mktemp("session-time"))
    try:
        yield pods("--socket", str(box / "pod.sock"), "--idle-timeout", f"{IDLE_S:g}s", "--session-max-time", "2m",
                   "--session-time", "90s", sandbox=True)  # fmt: skip
    finally:
        pods.stop_all()


def notes(job: dict[str, Any]) -> list[str]:
    return [e["note"] for e in job["events"]]


def start_notebook(pod: Pod, token: str, account: Account, box: Path, **spec: Any) -> str:
    files = box / f"{account.name}-{len(list(box.iterdir()))}"
    files.mkdir()
    os.chown(files, account.uid, account.gid)
    c = pod.client(token)
    job = str(c.submit({"notebook": {}, "workdir": str(files), **spec})["id"])
    wait_state(c, job, "running", timeout=60)
    wait_for(lambda: c.probe(f"/sessions/{job}/api/status") == 200, 60, "the notebook to answer through the pod")
    return job


def test_an_idle_notebook_gives_its_devices_to_the_next_job_and_gets_them_back(
    pod: Pod, users: tuple[Account, Account], tokens: dict[str, str], box: Path
) -> None:
    ann, ben = users
    everything = len(pod.client().status()["devices"])
    notebook = start_notebook(pod, tokens[ann.name], ann, box, devices=everything, max_runtime=120)
    mine = pod.client(tokens[ann.name])
    held = mine.job(notebook)["assigned"]
    assert len(held) == everything
    with httpx.Client(base_url=pod.url, trust_env=False, timeout=60) as http:
        start_kernel(http, notebook, bearer(tokens[ann.name]))
        theirs = pod.client(tokens[ben.name])
        queued = str(theirs.submit({"command": python_job("import time; time.sleep(14)"), "devices": everything})["id"])
        assert theirs.job(queued)["state"] == "queued"

        # Idle for IDLE_S: warned, kernels stopped, devices to ben's job.
        started = wait_state(theirs, queued, "running", timeout=IDLE_S + 30)
        assert started["assigned"] == held
        after = mine.job(notebook)
        assert after["state"] == "running" and after["assigned"] == [] and after["released"] == held
        said = notes(after)
        assert any(n.startswith("idle for") and "go back to the queue" in n for n in said), said
        assert any("released to the queue after 1 kernel stopped" in n for n in said), said
        kernels = http.get(f"/sessions/{notebook}/api/kernels", headers=bearer(tokens[ann.name]))
        assert kernels.status_code == 200 and kernels.json() == []  # the server stays; its kernel is gone

        # A kernel asks for the devices again: it waits (503 naming ben's job), then gets them when it ends.
        xsrf = http.cookies["_xsrf"]
        headers = {**bearer(tokens[ann.name]), "X-XSRFToken": xsrf}
        t0 = time.monotonic()
        busy = http.post(f"/sessions/{notebook}/api/kernels", headers=headers, json={})
        assert busy.status_code == 503, busy.text
        assert f"job {queued} ({ben.name}) holds them now" in busy.json()["error"]
        assert theirs.job(queued)["state"] == "running"  # waiting did not take them from ben
        got = wait_for(lambda: (r := http.post(f"/sessions/{notebook}/api/kernels", headers=headers, json={}))
                       .status_code == 201 and r, 40, "the kernel to start on the devices given back")  # fmt: skip
        assert isinstance(got, httpx.Response)
        assert time.monotonic() - t0 < 40
        assert wait_state(theirs, queued, "succeeded")["assigned"] == []
        back = mine.job(notebook)
        assert back["assigned"] == held and back["released"] == [] and back["wanted_at"] is None
        assert any("given back after" in n for n in notes(back))
        hours = back["device_hours"]
        assert 0 < hours["held"] < everything * (time.time() - back["started_at"]) / 3600
        jobs = pod.cli("jobs", token_file=None)
        assert "device-hours" in jobs.stdout and "total" in jobs.stdout, jobs.stdout
    mine.cancel(notebook)
    wait_state(mine, notebook, "cancelled", timeout=30)


def test_a_session_is_warned_then_stopped_at_its_time_and_extended_never_past_the_pods_longest(
    pod: Pod, users: tuple[Account, Account], tokens: dict[str, str], box: Path
) -> None:
    ann, _ = users
    c = pod.client(tokens[ann.name])
    with pytest.raises(ConflictError, match=r"max_runtime = 1h is beyond this pod's longest session, 2m"):
        c.submit({"notebook": {}, "max_runtime": 3600})
    default = str(c.submit({"notebook": {}, "devices": 1})["id"])
    assert c.job(default)["max_runtime"] == 90  # the pod's --session-time
    c.cancel(default)

    notebook = start_notebook(pod, tokens[ann.name], ann, box, devices=1, max_runtime=20)
    assert c.extend(notebook, 10)["max_runtime"] == 30
    with pytest.raises(ConflictError, match=r"it would run 1h30s in all, beyond this pod's longest session, 2m"):
        c.extend(notebook, 3600)
    with pytest.raises(ConflictError, match=r"only sessions are extended"):
        c.extend(str(c.submit({"command": ["true"], "devices": 1})["id"]), 60)
    from tests.web.browser import csrf_of, sign_in

    page = sign_in(pod, tokens[ann.name])
    try:  # the job page's button
        csrf = csrf_of(page, f"/ui/jobs/{notebook}")
        assert "Extend 1h" in page.get(f"/ui/jobs/{notebook}").text
        r = page.post(f"/ui/jobs/{notebook}/extend", data={"csrf": csrf, "time": "5s"},
                      headers={"Accept": "application/json"})  # fmt: skip
        assert r.status_code == 200 and r.json()["max_runtime"] == 35, r.text
    finally:
        page.close()
    cli = pod.cli("extend", notebook, "--time", "1h", token_file=None)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "beyond this pod's longest session" in cli.stderr
    ended = wait_state(c, notebook, "failed", "succeeded", timeout=60)
    events = c.job(notebook)["events"]
    warned = [e for e in events if e["note"].startswith("time: the session stops in")]
    stopped = [e for e in events if "exceeded max_runtime 35 s" in e["note"]]
    assert warned and stopped, [e["note"] for e in events]
    assert stopped[0]["at"] - warned[0]["at"] >= 3  # warned before the end (a fifth of 35 s: 7 s)
    assert f"extended by 10s by {ann.name}" in " ".join(notes(c.job(notebook)))
    assert ended["started_at"] + 35 <= ended["finished_at"] < ended["started_at"] + 35 + 15
