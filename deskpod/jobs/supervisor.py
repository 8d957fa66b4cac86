"""Job processes: start, watch, stop and re-adopt them, by pid *and* process start time.

Each job runs as ``shim.py`` (see there) in its own session and process group, with its output
appended to the job's log file. A process is identified by (pid, start time in clock ticks since
boot, from ``/proc/<pid>/stat``): after a daemon restart a pid that now belongs to another process
has another start time, so it is never mistaken for the job — and never signalled.

Stopping is SIGTERM to the whole group, a grace period, then SIGKILL to the group; the daemon's
loop drives the timing (`Supervisor` holds no timers), so a stop survives a daemon restart too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

SHIM = Path(__file__).with_name("shim.py")


@dataclass(frozen=True, slots=True)
class Attempt:
    """The files of one run of a job."""

    folder: Path

    def exit_file(self, attempt: int) -> Path:
        return self.folder / f"exit.{attempt}"

    def pid_file(self, attempt: int) -> Path:
        return self.folder / f"pid.{attempt}"

    def phase_file(self, attempt: int) -> Path:
        """What the job's shim is doing: ``building`` its environment, ``running`` the job, ``build-failed``."""
        return self.folder / f"phase.{attempt}"

    def phase(self, attempt: int) -> str | None:
        try:
            return self.phase_file(attempt).read_text().strip() or None
        except OSError:
            return None

    @property
    def log(self) -> Path:
        return self.folder / "output.log"


def start_time(pid: int, *, zombies: bool = False) -> int | None:
    """The process's start time in clock ticks since boot, or None if no such live process.

    A zombie has finished (only its exit status is left), so it counts as gone unless ``zombies``.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X") and not zombies:
        return None
    return int(fields[19])


def alive(pid: int, started: int | None) -> bool:
    """Whether the process we started as ``pid`` at ``started`` still runs (not a reused pid)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def read_exit(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def signal_group(pid: int, started: int | None, sig: int) -> bool:
    """Send ``sig`` to the job's process group, only if ``pid`` is still the job; True if sent."""
    if not alive(pid, started):
        return False
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


class Supervisor:
    """Starts job processes and reaps the ones this daemon started; adopted ones are polled by pid."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        files: Attempt,
        attempt: int,
        options: Sequence[str] = (),
        owner: tuple[int, int] | None = None,
    ) -> tuple[int, int | None]:
        """Start ``argv`` under the shim; returns (pid, start time). Raises OSError if it cannot start.

        ``options`` are the shim's (``--phase``, ``--build``, ``--hold``, ``--as``); ``owner`` (uid, gid)
        gets the log, which is opened without following a link the job's user may have planted.
        """
        files.folder.mkdir(parents=True, exist_ok=True)
        for stale in (files.exit_file(attempt), files.pid_file(attempt), files.phase_file(attempt)):
            stale.unlink(missing_ok=True)
        with open_log(files.log, owner) as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    str(SHIM),
                    str(files.exit_file(attempt)),
                    str(files.pid_file(attempt)),
                    *options,
                    "--",
                    *argv,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(cwd),
                env=dict(env),
                start_new_session=True,
                close_fds=True,
            )
        self._children[proc.pid] = proc
        return proc.pid, start_time(proc.pid, zombies=True)  # unreaped child: its pid cannot be reused yet

    def finished(self, pid: int, started: int | None, exit_file: Path) -> tuple[bool, int | None]:
        """(done, exit code) for a job process; the code is None when nothing recorded it."""
        proc = self._children.get(pid)
        if proc is not None:
            rc = proc.poll()
            if rc is None:
                return False, None
            del self._children[pid]
            code = read_exit(exit_file)
            if code is None:
                code = rc if rc >= 0 else 128 - rc
            return True, code
        if alive(pid, started):
            return False, None
        return True, read_exit(exit_file)

    def owns(self, pid: int) -> bool:
        return pid in self._children

    def release(self) -> None:
        """Forget the children without waiting: they keep running and a later daemon adopts them."""
        self._children.clear()


def open_log(path: Path, owner: tuple[int, int] | None = None) -> IO[bytes]:
    """A job's log, opened for appending without following a symbolic link; owned by ``owner`` when given."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    if owner is not None:
        os.fchown(fd, *owner)
    return os.fdopen(fd, "ab")


def kill_leftovers(pid: int, started: int | None) -> None:
    """SIGKILL what is left of an ended job's process group (background children, an orphan whose shim died).

    The group's id is the shim's pid, and Linux reuses no pid while a group of that id has members.
    So when no process has that pid (or only the job's own unreaped shim has it), every member of the
    group belongs to the job; when another process has taken the pid, the group is long gone.
    """
    now = start_time(pid, zombies=True)
    if now is not None and now != started:
        return
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
