"""No lost work: preemption with SIGTERM/grace/SIGKILL and requeue, SIGKILL of the daemon and re-adoption,
and many concurrent submissions — each on its own real daemon."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from deskpod.jobs.client import PodClient
from tests.jobs.pods import Pods, wait_for, wait_state

# Stands for a training job: on SIGTERM it "checkpoints" (a file in its folder) and exits 143;
# started again with a checkpoint present, it "resumes" and finishes.
POLITE = """
import os, signal, sys, time
if os.path.exists("ckpt"):
    print("resumed from ckpt", flush=True)
    sys.exit(0)
def stop(*_):
    open("ckpt", "w").write("step 7")
    print("checkpointed", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
time.sleep(600)
"""

# Ignores SIGTERM, so only the SIGKILL after the grace period stops it; its second run finishes.
STUBBORN = """
import os, signal, sys, time
if os.path.exists("ran"):
    sys.exit(0)
open("ran", "w").close()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("started", flush=True)
time.sleep(600)
"""

# Records each start in a shared file, then waits for a "go" file (or, with a marker, ends at once).
RECORDER = """
import os, sys, time
name, book, go = sys.argv[1], sys.argv[2], sys.argv[3]
with open(book, "a") as f:
    f.write(f"{name} {os.getpid()}\\n")
if go == "-":
    sys.exit(0)
if os.path.exists(go + ".marker"):
    sys.exit(0)
open(go + ".marker", "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
"""


def script(folder: Path, name: str, text: str) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    return [sys.executable, str(path)]


def steps(job: dict[str, Any]) -> list[tuple[str | None, str]]:
    return [(e["from"], e["to"]) for e in job["events"]]


def test_preemption_sigterm_grace_sigkill_then_requeue_and_resume(pod_factory: Pods, tmp_path: Path) -> None:
    pod = pod_factory("--grace", "1")
    c = pod.client()
    n = len(c.status()["devices"])
    if n < 2:
        pytest.skip("needs 2 devices (CPU slots or GPUs)")
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    polite = c.submit({"name": "polite", "command": script(a_dir, "polite", POLITE), "workdir": str(a_dir)})
    stubborn = c.submit(
        {"name": "stubborn", "command": script(b_dir, "stubborn", STUBBORN), "workdir": str(b_dir), "devices": n - 1}
    )
    for job in (polite, stubborn):
        wait_state(c, job["id"], "running")
        wait_for(lambda j=job: b"started" in c.log(j["id"])[0], 30, f"{job['name']} to start")
    urgent = c.submit(
        {"name": "urgent", "command": [sys.executable, "-c", "print('urgent')"], "devices": n, "priority": 10}
    )
    assert wait_state(c, urgent["id"], "succeeded", "failed")["state"] == "succeeded"

    a = wait_state(c, polite["id"], "succeeded", "failed")
    assert a["state"] == "succeeded" and a["attempt"] == 2 and a["failures"] == 0
    assert ("running", "preempted") in steps(a) and ("preempted", "queued") in steps(a)
    preempted = next(e for e in a["events"] if e["to"] == "preempted")
    assert "exit code 143" in preempted["note"]
    log = c.log(polite["id"])[0].decode()
    assert "checkpointed" in log and "resumed from ckpt" in log

    b = wait_state(c, stubborn["id"], "succeeded", "failed")
    assert b["state"] == "succeeded" and b["attempt"] == 2
    asked = next(e for e in b["events"] if "preemption requested" in e["note"])
    killed = next(e for e in b["events"] if e["to"] == "preempted")
    assert "exit code 137" in killed["note"]  # SIGKILL
    assert killed["at"] - asked["at"] >= 1.0  # not before the grace period
    # The urgent job started only after both had stopped.
    u = c.job(urgent["id"])
    started = next(e["at"] for e in u["events"] if e["to"] == "starting")
    assert started >= killed["at"] and started >= preempted["at"]


def test_daemon_sigkill_restart_readopts_and_loses_nothing(pod_factory: Pods, tmp_path: Path) -> None:
    pod = pod_factory()
    c = pod.client()
    n = len(c.status()["devices"])
    if n < 2:
        pytest.skip("needs 2 devices (CPU slots or GPUs)")
    book, go1, go2 = tmp_path / "book", tmp_path / "go1", tmp_path / "go2"
    rec = script(tmp_path, "recorder", RECORDER)
    long = c.submit({"name": "long", "command": [*rec, "long", str(book), str(go1)]})
    victim = c.submit({"name": "victim", "command": [*rec, "victim", str(book), str(go2)], "retries": 1})
    later = c.submit({"name": "later", "command": [*rec, "later", str(book), "-"], "devices": n})
    for job in (long, victim):
        wait_state(c, job["id"], "running")
    wait_for(lambda: book.exists() and len(book.read_text().splitlines()) == 2, 30, "two jobs to record their start")
    long_pid = c.job(long["id"])["pid"]
    victim_pid = c.job(victim["id"])["pid"]

    pod.kill()  # SIGKILL the daemon while two jobs run and one waits
    os.killpg(victim_pid, signal.SIGKILL)  # one job dies while no daemon watches it
    pod.start()
    c = pod.client()

    j = c.job(long["id"])
    assert j["state"] == "running" and j["pid"] == long_pid and j["attempt"] == 1
    assert any("re-adopted" in e["note"] for e in j["events"])
    v = wait_state(c, victim["id"], "running", "succeeded")
    assert ("running", "lost") in steps(v) and ("lost", "queued") in steps(v)
    v = wait_state(c, victim["id"], "succeeded")  # its retry finds its marker and ends
    assert v["attempt"] == 2
    assert c.job(later["id"])["state"] == "queued"

    # Kill the daemon again; the adopted job ends while no daemon runs; its exit code still counts.
    pod.kill()
    go1.touch()
    wait_for(lambda: not _alive(long_pid), 30, "the long job to end")
    pod.start()
    c = pod.client()
    j = wait_state(c, long["id"], "succeeded", "failed", "lost")
    assert j["state"] == "succeeded" and j["exit_code"] == 0 and j["attempt"] == 1
    wait_state(c, later["id"], "succeeded")

    starts = Counter(line.split()[0] for line in book.read_text().splitlines())
    assert starts == {"long": 1, "victim": 2, "later": 1}  # nothing lost, nothing run twice at once
    r = pod.cli("down", "--stop-jobs")
    assert r.returncode == 0, r.stderr
    assert pod.proc is not None and pod.proc.wait(timeout=30) == 0


def _alive(pid: int) -> bool:
    from deskpod.processes import start_time

    return start_time(pid) is not None


def test_1000_submissions_from_20_concurrent_clients_are_all_recorded_once(pod_factory: Pods) -> None:
    pod = pod_factory("--no-preemption")
    c = pod.client()
    n = len(c.status()["devices"])
    blocker = c.submit({"name": "blocker", "command": ["sleep", "600"], "devices": n, "priority": 1000})
    wait_state(c, blocker["id"], "running")

    def client_run(w: int) -> list[str]:
        with PodClient(pod.url, pod.token) as cl:
            return [cl.submit({"name": f"c{w}-{i}", "command": ["true"]})["id"] for i in range(50)]

    with ThreadPoolExecutor(20) as pool:
        ids = [i for batch in pool.map(client_run, range(20)) for i in batch]
    assert len(ids) == 1000 and len(set(ids)) == 1000
    jobs = [j for j in c.jobs(limit=5000) if j["name"] != "blocker"]
    names = Counter(j["name"] for j in jobs)
    assert len(jobs) == 1000 and set(names.values()) == {1}
    assert names.keys() == {f"c{w}-{i}" for w in range(20) for i in range(50)}
    assert {j["state"] for j in jobs} == {"queued"}
    assert {j["id"] for j in jobs} == set(ids)


def test_a_real_train_job_is_preempted_checkpoints_and_resumes(pod_factory: Pods) -> None:
    """A 2-worker `deskpod train` job: preempted by SIGTERM, checkpoints, requeued, resumes, completes."""
    pod = pod_factory("--grace", "30")
    c = pod.client()
    if len(c.status()["devices"]) != 2:
        pytest.skip("written for a box with 2 devices (this CPU box's 2 slots)")
    train = {"model": "mlp", "data": "synthetic:1x28x28", "num_classes": 10, "synthetic_samples": 4096,
             "steps": 1200, "batch_size": 16, "log_every_steps": 10, "loader_workers": 0}  # fmt: skip
    job = c.submit({"name": "tiny", "train": train, "devices": "all"})
    metrics = pod.home / "jobs" / job["id"] / "runs" / "tiny" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and '"step"' in metrics.read_text(), 120, "training steps")
    urgent = c.submit(
        {"name": "urgent", "command": [sys.executable, "-c", "print('urgent')"], "devices": 2, "priority": 5}
    )
    assert wait_state(c, urgent["id"], "succeeded", "failed", timeout=120)["state"] == "succeeded"
    done = wait_state(c, job["id"], "succeeded", "failed", timeout=180)
    assert done["state"] == "succeeded", c.log(job["id"])[0].decode()[-2000:]
    preempted = next(e for e in done["events"] if e["to"] == "preempted")
    assert "exit code 143" in preempted["note"]
    assert done["attempt"] == 2
    summary = json.loads((metrics.parent / "summary.json").read_text())
    assert summary["state"] == "completed" and summary["steps"] == 1200
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"step"' in line]
    assert steps[-1] >= 1190 and steps.count(10) == 1  # continued from the checkpoint, not from step 0
