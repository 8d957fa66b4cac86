"""The pod's side of job limits: a cgroup per attempt, what happened in it, the disk watch, a restart's clean-up."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskpod.envs.cgroups import PodCgroups, detect
from deskpod.envs.limits import Box, LimitSettings
from deskpod.jobs.confinement import DISK_CHECK_S, Confinement
from deskpod.jobs.supervisor import SHIM

BOX = Box(kind="cpu", devices=2, cores=tuple(sorted(os.sched_getaffinity(0))), memory_bytes=8 << 30)


@pytest.fixture
def cgroups() -> Iterator[PodCgroups]:
    found = detect(f"test-{secrets.token_hex(4)}")
    if found.cgroups is None:
        pytest.skip(f"no cgroups here: {found.reason}")
    yield found.cgroups
    for job_id in found.cgroups.job_ids():
        group = found.cgroups.group(job_id)
        group.kill()
        group.remove()
    found.cgroups.remove()


def _shim(tmp_path: Path, options: list[str], code: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``code`` under the real shim with ``options`` (as the supervisor would, plan on stdin)."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"env": {"PATH": "/usr/bin:/bin"}}')
    with open(plan, "rb") as stdin:
        return subprocess.run(
            [sys.executable, "-I", "-S", str(SHIM),
             str(tmp_path / "exit"), str(tmp_path / "pid"), *options, "--", sys.executable, "-c", code],
            stdin=stdin, capture_output=True, timeout=120,
        )  # fmt: skip


def test_a_job_attempt_runs_in_its_cgroup_and_its_problems_are_told(cgroups: PodCgroups, tmp_path: Path) -> None:
    c = Confinement(LimitSettings(job_memory=64 << 20, job_tasks=64), BOX, cgroups, None)
    limits = c.limits([1])
    assert limits is not None and limits.memory_bytes == 64 << 20 and limits.tasks == 64
    options, notes = c.start(7, limits)
    assert options[0] == "--cgroup" and notes == [f"limits: {limits.describe()}"]
    hog = "b = bytearray(256 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]"
    done = _shim(tmp_path, options, hog)
    assert (tmp_path / "exit").read_text() == "137", done.stderr  # SIGKILLed by the OOM killer
    assert c.finish(7) == ["killed: out of memory (limit 64.0 MiB)"]
    assert cgroups.find(7) is None  # removed with the job
    assert c.finish(7) == []  # nothing left to tell the second time


def test_a_shim_that_cannot_join_its_cgroup_runs_nothing(tmp_path: Path) -> None:
    done = _shim(tmp_path, ["--cgroup", str(tmp_path / "gone" / "cgroup.procs")], "open('ran', 'w')")
    assert (tmp_path / "exit").read_text() == "126"
    assert b"cannot enter the job's cgroup" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_the_disk_watch_looks_now_and_then_and_names_the_sizes(tmp_path: Path) -> None:
    c = Confinement(LimitSettings(), BOX, None, 4 << 20)
    options, notes = c.start(3, None)
    assert options == ["--fsize", str(4 << 20)] and notes == ["disk: 4.0 MiB in its folder, and per file"]
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "a.bin").write_bytes(os.urandom(3 << 20))
    assert c.over_disk(3, folder, now=1000.0) is None
    (folder / "b.bin").write_bytes(os.urandom(3 << 20))
    assert c.over_disk(3, folder, now=1000.0 + DISK_CHECK_S / 2) is None  # not looked at again so soon
    why = c.over_disk(3, folder, now=1000.0 + DISK_CHECK_S)
    assert why == "its folder holds 6.0 MiB, over the pod's job disk limit of 4.0 MiB"
    assert Confinement(LimitSettings(), BOX, None, None).over_disk(3, folder, now=5000.0) is None


def test_a_restarted_daemon_keeps_the_active_jobs_cgroups_and_removes_the_rest(cgroups: PodCgroups) -> None:
    c = Confinement(LimitSettings(), BOX, cgroups, None)
    for job_id in (1, 2, 3):
        c.start(job_id, c.limits([0]))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        group = cgroups.find(2)
        assert group is not None
        group.join(sleeper.pid)  # a job still running from before the restart
        c.recover(active={2})
        assert cgroups.job_ids() == (2,) and sleeper.poll() is None
        c.recover(active=set())
        assert cgroups.job_ids() == () and sleeper.wait(30) == -9  # what was left of it went with its cgroup
    finally:
        sleeper.kill()
        sleeper.wait()
