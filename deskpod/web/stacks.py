"""Where is it now? Every rank's Python stack of a running job, by ``py-spy dump``.

For a job that seems stuck, the Job page's button asks for this. Which processes: for a train job,
the ranks named by the run's ``workers/rank<N>.pid`` files; for any other job (or a train job whose
ranks have not written their pid yet), the processes of the job's process group. A pid counts only
while it runs *and* belongs to the job: it is in the job's process group or session (the job's
``pid`` is its shim, leader of both; see `deskpod.jobs.supervisor`), or descends from the shim — torch's
elastic agent starts each rank in a session of its own. A stale pid file naming a reused pid is never
inspected. Each dump runs concurrently with a timeout; a process that is not Python, or a daemon
without ptrace rights, gets its error spelled out instead of a stack.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from deskpod.envs.userfiles import read_path, scandir_path
from deskpod.errors import ConflictError
from deskpod.jobs.store import JobRecord
from deskpod.processes import alive

DUMP_TIMEOUT_S = 10.0
MAX_TARGETS = 32
"""Processes dumped at most (a command job's group may hold many)."""
MAX_ANCESTRY = 64
RANK_FILE = re.compile(r"^rank(\d+)\.pid$")


@dataclass(frozen=True, slots=True)
class Target:
    pid: int
    rank: int | None
    command: str


def py_spy() -> str | None:
    """The py-spy binary: next to this Python (a virtual environment's ``bin/``), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, process group, session) of a live process; None if it is gone or a zombie."""
    try:
        p = psutil.Process(pid)
        if p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return None
        return p.ppid(), os.getpgid(pid), os.getsid(pid)
    except (psutil.Error, OSError, ValueError):  # gone, or not a pid (a rank file may say anything)
        return None


def belongs(pid: int, leader: int) -> bool:
    """Whether live process ``pid`` is part of the job whose shim is ``leader``."""
    st = _stat(pid)
    if st is None:
        return False
    if pid == leader or leader in (st[1], st[2]):
        return True
    parent = st[0]
    for _ in range(MAX_ANCESTRY):  # a rank in a session of its own still descends from the shim
        if parent == leader:
            return True
        if parent <= 1:
            return False
        up = _stat(parent)
        if up is None:
            return False
        parent = up[0]
    return False


def group_pids(leader: int) -> list[int]:
    """Live processes in the job's process group or session, the shim first."""
    found = []
    for pid in psutil.pids():
        st = _stat(pid)
        if st is not None and leader in (st[1], st[2]):
            found.append(pid)
    return sorted(found, key=lambda p: (p != leader, p))


def command_of(pid: int) -> str:
    try:
        argv = " ".join(psutil.Process(pid).cmdline()).encode(errors="surrogateescape")  # as the kernel has it
    except (psutil.Error, ValueError):
        return ""
    text = " ".join(argv.decode(errors="replace").split())
    return text if len(text) <= 160 else text[:157] + "..."


def rank_pids(run_dir: Path | None) -> list[tuple[int, int]]:
    """(rank, pid) from the run's ``workers/rank<N>.pid`` files, by rank."""
    if run_dir is None:
        return []
    out = []
    for entry in scandir_path(run_dir / "workers"):  # the job's user may have put links or FIFOs there
        m = RANK_FILE.match(entry.name)
        if not m:
            continue
        try:
            out.append((int(m.group(1)), int(read_path(run_dir / "workers" / entry.name, limit=64).strip())))
        except (OSError, ValueError):
            continue
    return sorted(out)


def targets(job: JobRecord, run_dir: Path | None) -> tuple[list[Target], list[str]]:
    """The processes to dump, and notes on pids left out (gone, or not the job's)."""
    leader = job.pid
    if leader is None or not job.state.active or not alive(leader, job.pid_start):
        raise ConflictError(f"job {job.id} is {job.state.value} and has no running process to look at")
    notes: list[str] = []
    found: list[Target] = []
    for rank, pid in rank_pids(run_dir):
        if _stat(pid) is None:
            notes.append(f"rank {rank}: pid {pid} is not running (it ended, or the rank restarted)")
        elif not belongs(pid, leader):
            notes.append(f"rank {rank}: pid {pid} is not a process of this job (a stale pid file); left alone")
        else:
            found.append(Target(pid, rank, command_of(pid)))
    if not found:
        found = [Target(pid, None, command_of(pid)) for pid in group_pids(leader)]
    if len(found) > MAX_TARGETS:
        notes.append(f"{len(found)} processes; showing the first {MAX_TARGETS}")
        found = found[:MAX_TARGETS]
    return found, notes


def explain(stderr: str) -> str:
    """py-spy's failure as one line a user can act on."""
    low = stderr.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return "permission denied: py-spy needs ptrace (root or CAP_SYS_PTRACE)"
    if "failed to find python version" in low or "not a python" in low or "failed to find python interpreter" in low:
        return "not a Python process"
    if "check that the process is running" in low or "no such process" in low:
        return "the process ended before py-spy could read it"
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.strip()[:1].isdigit()]
    lines = [ln for ln in lines if not ln.startswith("Stack backtrace")]
    return "py-spy failed: " + (" ".join(lines[:3]) or "no message")


async def dump(binary: str | None, target: Target, timeout: float = DUMP_TIMEOUT_S) -> dict[str, Any]:
    """One process's stack: ``{"pid", "rank", "command", "ok", "text" or "error"}``."""
    out: dict[str, Any] = {"pid": target.pid, "rank": target.rank, "command": target.command, "ok": False}
    if binary is None:
        out["error"] = "py-spy is not installed on the pod's machine (pip install py-spy)"
        return out
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        binary, "dump", "--pid", str(target.pid),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "RUST_BACKTRACE": "0"},
    )  # fmt: skip
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        out["error"] = f"py-spy did not answer within {timeout:g} s (the process may be in uninterruptible I/O)"
        return out
    out["seconds"] = round(time.monotonic() - started, 3)
    if proc.returncode == 0:
        out["ok"] = True
        out["text"] = stdout.decode("utf-8", "replace")
    else:
        out["error"] = explain(stderr.decode("utf-8", "replace") + stdout.decode("utf-8", "replace"))
    return out


async def stacks(job: JobRecord, run_dir: Path | None, *, timeout: float = DUMP_TIMEOUT_S) -> dict[str, Any]:
    """Every rank's (or group process's) stack, dumped concurrently."""
    found, notes = targets(job, run_dir)
    binary = py_spy()
    dumps = await asyncio.gather(*(dump(binary, t, timeout) for t in found))
    return {"job": str(job.id), "at": time.time(), "py_spy": binary, "targets": list(dumps), "notes": notes}
