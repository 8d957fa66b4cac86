"""`deskpod.web.stacks`: which pids belong to a job, and py-spy's answers (real processes, real py-spy)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from deskpod.errors import ConflictError
from deskpod.jobs.spec import parse_spec
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord
from deskpod.processes import start_time
from deskpod.web import stacks

# A "job": a session leader (like the shim) with one child in the same group and one rank-like child in a
# session of its own (like torch's elastic agent starts ranks), both sleeping in a function py-spy can name.
LEADER = """
import subprocess, sys, time
code = "import time\\ndef rank_waits_here():\\n    time.sleep(60)\\nrank_waits_here()\\n"
same = subprocess.Popen([sys.executable, "-c", code])
own = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
print(same.pid, own.pid, flush=True)
try:
    time.sleep(60)
finally:
    own.kill()
"""


@pytest.fixture
def family() -> Iterator[tuple[int, int, int]]:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, start_new_session=True, text=True)
    assert leader.stdout is not None
    same, own = (int(x) for x in leader.stdout.readline().split())
    yield leader.pid, same, own
    for pid in (own, same):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    leader.kill()
    leader.wait()
    leader.stdout.close()


def record(pid: int | None, state: JobState = JobState.RUNNING, train: bool = True) -> JobRecord:
    spec = parse_spec({"name": "t", "train": {"model": "mlp"}} if train else {"name": "c", "command": ["x"]})
    return JobRecord(
        id=1, user="u", name=spec.name, spec=spec, priority=0, devices=1, placement="best", max_runtime=None,
        retries=0, state=state, reason="", attempt=1, failures=0, assigned=(0,), port=None, pid=pid,
        pid_start=None if pid is None else start_time(pid), exit_code=None, stop_reason=None, stop_deadline=None,
        submitted_at=0.0, started_at=0.0, finished_at=None,
    )  # fmt: skip


def test_membership_by_group_session_or_ancestry(family: tuple[int, int, int]) -> None:
    leader, same, own = family
    assert stacks.belongs(leader, leader)
    assert stacks.belongs(same, leader)  # same process group and session
    assert stacks.belongs(own, leader)  # its own session, but a descendant of the leader
    assert not stacks.belongs(os.getpid(), leader)  # the test runner is not part of the "job"
    assert not stacks.belongs(1, leader)
    assert stacks.group_pids(leader) == [leader, same]  # the rank in its own session is not in the group


def test_targets_from_rank_pid_files(tmp_path: Path, family: tuple[int, int, int]) -> None:
    leader, _, own = family
    workers = tmp_path / "run" / "workers"
    workers.mkdir(parents=True)
    (workers / "rank0.pid").write_text(str(own))
    (workers / "rank1.pid").write_text(str(os.getpid()))  # a stale file naming someone else's process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (workers / "rank2.pid").write_text(str(dead.pid))
    (workers / "junk.pid").write_text("x")
    found, notes = stacks.targets(record(leader), tmp_path / "run")
    assert [(t.rank, t.pid) for t in found] == [(0, own)]
    assert any("rank 1" in n and "not a process of this job" in n for n in notes)
    assert any("rank 2" in n and "not running" in n for n in notes)
    # Without rank files (a command job, or ranks not started): the job's process group.
    found, _ = stacks.targets(record(leader, train=False), None)
    assert [t.pid for t in found] == stacks.group_pids(leader)


def test_a_job_without_a_live_process_is_refused(family: tuple[int, int, int]) -> None:
    with pytest.raises(ConflictError, match="queued"):
        stacks.targets(record(None, JobState.QUEUED), None)
    leader = family[0]
    gone = replace(record(leader), pid_start=1)  # same pid, another start time: a reused pid
    with pytest.raises(ConflictError):
        stacks.targets(gone, None)


def test_py_spy_dumps_a_real_stack(family: tuple[int, int, int]) -> None:
    binary = stacks.py_spy()
    assert binary is not None, "py-spy is a dependency; it should be next to the interpreter"
    _, same, _ = family
    time.sleep(0.3)  # let the child reach its function
    got = asyncio.run(stacks.dump(binary, stacks.Target(same, None, "x")))
    assert got["ok"], got
    assert "rank_waits_here" in got["text"]
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        got = asyncio.run(stacks.dump(binary, stacks.Target(sleeper.pid, None, "sleep")))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not got["ok"] and got["error"] == "not a Python process"
    missing = asyncio.run(stacks.dump(None, stacks.Target(same, None, "x")))
    assert "not installed" in missing["error"]


def test_errors_in_words() -> None:
    assert stacks.explain("Error: Permission denied (os error 13)") == (
        "permission denied: py-spy needs ptrace (root or CAP_SYS_PTRACE)"
    )
    assert stacks.explain("Error: Operation not permitted (os error 1)").startswith("permission denied")
    assert stacks.explain("Error: Failed to find python version from target process") == "not a Python process"
    got = stacks.explain("Error: something new\n\nStack backtrace:\n   0: anyhow\n")
    assert got == "py-spy failed: Error: something new"
