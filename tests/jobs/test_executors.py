"""The pod's two executors move jobs through the same states: one set of state-machine tests, run against a real
pod service with each — this box's (`deskpod.jobs.local.LocalExecutor`, sandboxed as users deploy it) and a real
Slurm's (`deskpod.cluster.backend.SlurmExecutor`, slurmctld and two slurmd on 127.0.0.1).

Every job here waits for a gate file in its work directory and then exits with the code it was given, so a test
sees each state it asserts before the job leaves it, whatever the box's speed. Every move a job made is checked
against `deskpod.jobs.states.TRANSITIONS`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deskpod.jobs.client import PodClient
from deskpod.jobs.states import TRANSITIONS, JobState
from tests.cluster.slurm import GPUS_PER_NODE, NODES
from tests.jobs.pods import Pods, wait_for, wait_state

GATE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\nsys.exit(int(sys.argv[2]))"
"""A job's command: wait for the file ``argv[1]`` (in its work directory), then exit with ``argv[2]``."""


@dataclass
class Executed:
    """A pod service and its executor, as the tests drive them."""

    client: PodClient
    gates: Path
    """Every job's work directory, where the test opens its gate."""
    fill: dict[str, Any]
    """Spec fields of a job that holds every device the executor has, so that the next one waits."""
    requeued: Callable[[str], None]
    """Called once a running job was asked to requeue (Slurm holds a requeued job back for two minutes)."""
    held: Callable[[str], str]
    """The state the executor's own scheduler gives a job's ``external`` id (Slurm's ``JobState``)."""

    def submit(self, name: str, code: int = 0, **extra: Any) -> str:
        spec = {"name": name, "command": [sys.executable, "-c", GATE, name, str(code)], "workdir": str(self.gates)}
        return str(self.client.submit({**spec, **extra})["id"])

    def open(self, name: str) -> None:
        (self.gates / name).write_text("go")

    def close(self, name: str) -> None:
        (self.gates / name).unlink()

    def moves(self, job_id: str) -> list[str]:
        """The job's states in order (its history without the notes); each move must be one the table allows."""
        events = [e for e in self.client.job(job_id)["events"] if e["from"] != e["to"]]
        for e in events[1:]:
            assert JobState(e["to"]) in TRANSITIONS[JobState(e["from"])], events
        return [e["to"] for e in events]


def _running_with(marker: str) -> bool:
    """Whether a process of this box has ``marker`` in its command line."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    return True
        except OSError:
            continue
    return False


def _no_external(external: str) -> str:
    raise AssertionError(f"a job this box runs has no other scheduler's id, yet external = {external!r}")


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slow)])
def executed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Executed]:
    gates = tmp_path / "gates"
    gates.mkdir()
    pods = Pods(tmp_path)
    try:
        if request.param == "slurm":
            slurm = request.getfixturevalue("slurm")  # tests/conftest.py: started once for the session

            def release(job_id: str) -> None:
                job = client.job(job_id)
                slurm.release_requeued(str(job["external"]), lambda: not _running_with(job["name"]))

            client = pods("--backend", "slurm").client()
            fill = {"nodes": len(NODES), "devices": GPUS_PER_NODE}
            yield Executed(client, gates, fill, release, lambda external: slurm.job(external)["JobState"])
        else:
            client = pods(sandbox=True).client()
            fill = {"devices": len(client.status()["devices"])}
            yield Executed(client, gates, fill, lambda job_id: None, _no_external)
    finally:
        pods.stop_all()


def test_a_job_runs_and_ends_by_its_exit_code(executed: Executed) -> None:
    ok = executed.submit("ok", 0)
    wait_state(executed.client, ok, "running", timeout=120)
    executed.open("ok")
    assert wait_state(executed.client, ok, "succeeded", timeout=120)["exit_code"] == 0
    assert executed.moves(ok) == ["queued", "starting", "running", "succeeded"]

    bad = executed.submit("bad", 3)
    wait_state(executed.client, bad, "running", timeout=120)
    executed.open("bad")
    failed = wait_state(executed.client, bad, "failed", "succeeded", timeout=120)
    assert failed["state"] == "failed" and failed["exit_code"] == 3, failed
    assert executed.moves(bad) == ["queued", "starting", "running", "failed"]


def test_a_job_is_cancelled_while_queued_and_while_running(executed: Executed) -> None:
    holder = executed.submit("holder", 0, **executed.fill)
    wait_state(executed.client, holder, "running", timeout=120)
    waiter = executed.submit("waiter", 0)
    # queued, with the executor's reason why (no free device here; Slurm's pending reason there)
    wait_for(lambda: executed.client.job(waiter)["reason"], 60, "the waiting job's reason")
    cancelled = executed.client.cancel(waiter)
    assert cancelled["state"] == "cancelled"
    assert executed.moves(waiter) == ["queued", "cancelled"]
    if cancelled["external"]:  # handed over already (Slurm: at once): withdrawn there too
        wait_for(lambda: executed.held(cancelled["external"]) == "CANCELLED", 60, "Slurm to cancel it")

    executed.client.cancel(holder)
    assert wait_state(executed.client, holder, "cancelled", "succeeded", "failed", timeout=120)["state"] == "cancelled"
    assert executed.moves(holder) == ["queued", "starting", "running", "cancelled"]


def test_a_requeued_job_runs_again(executed: Executed) -> None:
    c = executed.client
    again = executed.submit("again", 3)
    wait_state(c, again, "running", timeout=120)
    c.requeue(again)  # a running job: stopped, then back in the queue
    executed.requeued(again)
    wait_for(lambda: (j := c.job(again))["attempt"] == 2 and j["state"] == "running", 240, "the second attempt")
    executed.open("again")
    assert wait_state(c, again, "failed", timeout=120)["exit_code"] == 3
    assert executed.moves(again) == ["queued", "starting", "running", "preempted", "queued", "starting", "running",
                                     "failed"]  # fmt: skip

    executed.close("again")
    c.requeue(again)  # an ended one: back in the queue at once, and it runs again
    wait_for(lambda: executed.moves(again)[-1:] == ["running"], 120, "it to run again")
    executed.open("again")
    wait_for(lambda: len(executed.moves(again)) == 12, 120, "it to end again")
    assert executed.moves(again)[8:] == ["queued", "starting", "running", "failed"]
