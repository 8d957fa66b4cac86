"""Job processes: start, watch, stop and re-adopt them, by pid *and* process start time.

Each job runs as ``shim.py`` (see there) in its own session and process group, with its output
appended to the job's log file. A process is identified by (pid, start time; `deskpod.processes.alive`):
after a daemon restart a pid that now belongs to another process has another start time, so it is never
mistaken for the job — and never signalled.

Stopping is SIGTERM to the whole group, a grace period, then SIGKILL to the group; the daemon's
loop drives the timing (`Supervisor` holds no timers), so a stop survives a daemon restart too.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from deskpod.envs.userfiles import RefusedFile, check_owned, read_path
from deskpod.processes import alive, start_time

SHIM = Path(__file__).with_name("shim.py")
SHIM_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
"""The environment of everything that runs before the job step, as root on a root pod (the shim, bubblewrap,
setpriv): fixed, so that no variable a user or the admin's shell chose acts there."""


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
        """The phase file's word (read as `deskpod.envs.userfiles.open_path` does: the job's user may have put a
        link or a FIFO there); None when it is missing or refused."""
        try:
            return read_path(self.phase_file(attempt), limit=64).decode(errors="replace").strip() or None
        except OSError:
            return None

    @property
    def log(self) -> Path:
        return self.folder / "output.log"


def shim_of(pid_file: Path, exit_file: Path) -> int | None:
    """The pid in a job's pid file, only if that process is the daemon's own shim for this attempt (its command
    line names the shim and ``exit_file``, and it runs as this process's user). The file lies in the job's folder,
    which its user may write: a pid they put there must never be taken for the job (and signalled)."""
    pid = read_exit(pid_file)
    if pid is None or pid <= 0:
        return None
    try:
        p = psutil.Process(pid)
        argv, owner = p.cmdline(), p.uids().effective
    except psutil.Error:
        return None
    if owner != os.geteuid() or str(SHIM) not in argv or str(exit_file) not in argv:
        return None
    return pid


def read_exit(path: Path) -> int | None:
    """The number in an exit or pid file of a job's folder (read as `deskpod.envs.userfiles.open_path` does);
    None when it is missing, refused or not a number."""
    try:
        return int(read_path(path, limit=64).decode(errors="replace").strip())
    except (OSError, ValueError):
        return None


def signal_group(pid: int, started: int | None, sig: int) -> bool:
    """Send ``sig`` to the job's process group, only if ``pid`` is still the job; True if sent."""
    if not alive(pid, started):
        return False
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
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
        plan: Mapping[str, Any],
        files: Attempt,
        attempt: int,
        options: Sequence[str] = (),
        owner: tuple[int, int] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> tuple[int, int | None]:
        """Start ``argv`` under the shim; returns (pid, start time). Raises OSError if it cannot start.

        ``plan`` is the job step's (its environment variables, working directory, build; `deskpod.jobs.shim`): it
        reaches the shim on its stdin, in a memory file, so no other local user can read it, and only the job
        step, running as the job's account, applies it. The shim itself starts with `SHIM_ENV` in the job's folder and
        ``options`` (``--cgroup``, ``--fsize``, ``--as``, ``--sandboxed``); ``pass_fds`` reach the shim (and from
        it the sandbox). ``owner`` (uid, gid) gets the log, which is opened without following a link the job's
        user may have planted.
        """
        files.folder.mkdir(parents=True, exist_ok=True)
        for stale in (files.exit_file(attempt), files.pid_file(attempt), files.phase_file(attempt)):
            stale.unlink(missing_ok=True)
        stdin = os.memfd_create("deskpod-job-plan", os.MFD_CLOEXEC)
        try:
            data = json.dumps(dict(plan)).encode()
            while data:
                data = data[os.write(stdin, data) :]
            with open_log(files.log, owner) as log:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(SHIM), str(files.exit_file(attempt)),
                     str(files.pid_file(attempt)), *options, "--", *argv],
                    stdin=stdin,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=files.folder,  # the job's own folder (its user cannot replace it: the folder above is root's)
                    env=SHIM_ENV,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=tuple(pass_fds),
                )  # fmt: skip
        finally:
            os.close(stdin)
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

    def release(self) -> None:
        """Forget the children without waiting: they keep running and a later daemon adopts them."""
        self._children.clear()


def open_log(path: Path, owner: tuple[int, int] | None = None) -> IO[bytes]:
    """A job's log, opened for appending without following a symbolic link and without waiting (the job's user may
    have made it a FIFO); owned by ``owner`` when given. What is there must be a regular file of ``owner``'s or
    this process's own, single-linked (`deskpod.envs.userfiles.check_owned`); `RefusedFile` otherwise."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o640)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO nobody reads
            why = "is a symbolic link" if e.errno == errno.ELOOP else "is not a regular file"
            raise RefusedFile(str(path), why) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedFile(str(path), "is not a regular file")
        check_owned(st, str(path), owner[0] if owner is not None else None)
        if owner is not None:
            os.fchown(fd, *owner)
    except BaseException:
        os.close(fd)
        raise
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
