"""Requeue (API and CLI), filtered and paged listings, against a real pod service."""

from __future__ import annotations

import pytest

from deskpod.errors import AccessError, ConflictError, NotFoundError
from tests.jobs.pods import SLEEPER, Pod, python_job, wait_for, wait_state


def test_requeue_a_cancelled_a_failed_and_a_running_job(shared_pod: Pod) -> None:
    c = shared_pod.client()
    # a queued job that is cancelled, then requeued: it runs
    blocker = c.submit({"name": "blocker", "command": ["sleep", "60"], "devices": "all", "priority": 10})
    wait_state(c, blocker["id"], "running")
    waiting = c.submit({"name": "waits", "command": ["true"]})
    c.cancel(waiting["id"])
    assert c.job(waiting["id"])["state"] == "cancelled"
    again = c.requeue(waiting["id"])
    assert again["state"] == "queued" and "requeued by admin" in again["reason"]
    c.cancel(blocker["id"])
    done = wait_state(c, waiting["id"], "succeeded")
    assert [e["to"] for e in done["events"]][:4] == ["queued", "cancelled", "queued", "starting"]

    # a failed job gets its retries counted afresh
    failing = c.submit({"command": python_job("import sys; sys.exit(4)")})
    wait_state(c, failing["id"], "failed")
    r = shared_pod.cli("requeue", failing["id"])
    assert r.returncode == 0 and "queued" in r.stdout, r.stderr
    done = wait_for(lambda: (j := c.job(failing["id"]))["attempt"] == 2 and j["state"] == "failed" and j, 30, "rerun")
    assert done["failures"] == 1  # type: ignore[index]

    # a running job is stopped (SIGTERM) and runs again as attempt 2
    sleeper = c.submit({"command": python_job(SLEEPER)})
    wait_state(c, sleeper["id"], "running")
    wait_for(lambda: b"started" in c.log(sleeper["id"])[0], 20, "the sleeper to start")
    c.requeue(sleeper["id"])
    wait_for(lambda: c.job(sleeper["id"])["attempt"] == 2, 30, "the second attempt")
    job = wait_state(c, sleeper["id"], "running")
    notes = [(e["to"], e["note"]) for e in job["events"]]
    assert ("preempted", "stopped to be requeued (exit code 143)") in notes
    assert b"got SIGTERM" in c.log(sleeper["id"])[0]
    c.cancel(sleeper["id"])
    wait_state(c, sleeper["id"], "cancelled")

    # a job that succeeded is not run again
    with pytest.raises(ConflictError, match="succeeded"):
        c.requeue(waiting["id"])
    r = shared_pod.cli("requeue", waiting["id"])
    assert r.returncode == 2 and "submit its spec as a new job" in r.stderr
    with pytest.raises(NotFoundError):
        c.requeue("424242")


def test_listing_filters_and_pages(shared_pod: Pod) -> None:
    admin = shared_pod.client()
    carol = shared_pod.client(admin.add_user("carol")["token"])
    ids = [carol.submit({"name": f"sweep-{i}", "command": ["true"]})["id"] for i in range(5)]
    mine = carol.jobs(name="sweep-")
    assert [j["id"] for j in mine] == ids[::-1]
    assert [j["user"] for j in admin.jobs(user="carol")] == ["carol"] * 5
    with pytest.raises(AccessError, match="only their own"):
        carol.jobs(user="admin")
    page = carol.request("GET", "/v1/jobs", params={"limit": 2, "name": "sweep-"}).json()
    assert [j["id"] for j in page["jobs"]] == ids[:2:-1] and page["next"] == ids[3]
    rest = carol.request("GET", "/v1/jobs", params={"limit": 10, "name": "sweep-", "before": page["next"]}).json()
    assert [j["id"] for j in rest["jobs"]] == ids[2::-1] and rest["next"] is None
    r = shared_pod.cli("jobs", "--user", "carol", "--name", "sweep-3")
    assert r.returncode == 0 and "sweep-3" in r.stdout and "sweep-2" not in r.stdout
