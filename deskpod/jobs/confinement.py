"""What a job may use, as the pod enforces it: its cgroup (cores, memory, tasks) and its disk.

The mechanism and the defaults are `deskpod.envs.cgroups` and `deskpod.envs.limits`; this is the pod's side of
them. At each start the job gets a cgroup of its own with `deskpod.envs.limits.job_limits`' limits, which its
shim joins before anything of the job runs (``--cgroup``), and a file-size limit (``--fsize``, ``RLIMIT_FSIZE``:
no file it writes, anywhere, grows past the pod's disk limit). While it runs, the pod looks at the size of the
job's folder now and then (`DISK_CHECK_S`) and stops a job whose folder holds more than the limit; its reason
says so. When it ends, whatever happened in its cgroup — an OOM kill, refused forks — goes into its record,
every process still in the cgroup is killed (also those that left the job's process group with ``setsid``) and
the cgroup is removed. A restarted daemon finds the cgroups of the jobs it re-adopts, and removes the others.

The disk limit (``deskpod up --job-disk SIZE|none``) defaults to a quarter of the file system holding the pod's
home: one job cannot fill the disk the others write their checkpoints to.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import traceback
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deskpod.environment.sizes import format_bytes
from deskpod.envs.cgroups import JobGroup, PodCgroups
from deskpod.envs.limits import Box, Limits, LimitSettings, job_limits
from deskpod.envs.userfiles import folder_bytes
from deskpod.errors import DeskpodError

DISK_CHECK_S = 15.0
"""How often a running job's folder is measured (a walk of its files, never following a link)."""
DISK_SHARE = 4
"""The default disk limit is 1/DISK_SHARE of the file system holding the pod's home."""


def pod_name(home: Path) -> str:
    """The name of a pod's cgroup tree: the same for every daemon of one home, so a restart finds its jobs'."""
    return hashlib.sha256(str(home).encode()).hexdigest()[:12]


def default_disk_limit(home: Path) -> int:
    """A quarter of the file system holding ``home`` (see `DISK_SHARE`)."""
    st = os.statvfs(home)
    return st.f_blocks * st.f_frsize // DISK_SHARE


@dataclass
class Confinement:
    """The pod's limits for its jobs (see the module docstring)."""

    settings: LimitSettings
    box: Box
    cgroups: PodCgroups | None
    """None: this box gave the pod no cgroups (the daemon said why when it started); jobs run without them."""
    disk_bytes: int | None
    """What one job's folder may hold, and the largest file a job may write; None: no limit."""
    _checked: dict[int, float] = field(default_factory=dict)

    def limits(self, devices: Sequence[int]) -> Limits | None:
        """The cgroup limits of a job holding ``devices``; None where the pod has no cgroups."""
        return job_limits(self.settings, self.box, devices) if self.cgroups is not None else None

    def start(self, job_id: int, limits: Limits | None) -> tuple[list[str], list[str]]:
        """The shim's options that put an attempt of the job into its limits, and a note for its history. A
        cgroup left from the job's previous attempt is emptied and made again."""
        options: list[str] = []
        notes: list[str] = []
        if self.cgroups is not None and limits is not None:
            self.release(job_id)
            group = self.cgroups.create(job_id, limits)
            options += group.shim_args()
            notes.append(f"limits: {limits.describe()}")
        if self.disk_bytes is not None:
            options += ["--fsize", str(self.disk_bytes)]
            notes.append(f"disk: {format_bytes(self.disk_bytes)} in its folder, and per file")
        return options, notes

    def over_disk(self, job_id: int, folder: Path, now: float) -> str | None:
        """Why the job must stop for what its folder holds, when it is time to look and it holds too much."""
        if self.disk_bytes is None or now - self._checked.get(job_id, 0.0) < DISK_CHECK_S:
            return None
        self._checked[job_id] = now
        used = folder_bytes(folder)
        if used <= self.disk_bytes:
            return None
        return (
            f"its folder holds {format_bytes(used)}, over the pod's job disk limit of {format_bytes(self.disk_bytes)}"
        )

    def finish(self, job_id: int) -> list[str]:
        """What happened in the ended job's cgroup (``killed: out of memory (limit 2.0 GiB)``); then nothing of
        it is left running and its cgroup is gone."""
        self._checked.pop(job_id, None)
        group = self._group(job_id)
        if group is None:
            return []
        try:
            problems = list(group.usage().problems())
        except OSError:
            problems = []
        self.release(job_id)
        return problems

    def release(self, job_id: int) -> None:
        """Kill what is left in the job's cgroup and remove it; a failure is logged, never raised (the job's
        state must still move on)."""
        group = self._group(job_id)
        if group is None:
            return
        try:
            group.kill()
            group.remove()
        except Exception:
            traceback.print_exc(file=sys.stderr)

    def recover(self, active: Collection[int]) -> None:
        """After a daemon restart: remove the cgroups of jobs that are no longer active (their processes with
        them); those of active jobs stay, with the processes the daemon re-adopts."""
        if self.cgroups is None:
            return
        for job_id in self.cgroups.job_ids():
            if job_id not in active:
                self.release(job_id)

    def close(self) -> None:
        """At the daemon's end: remove the pod's cgroups when no job's is left (running jobs keep theirs, for the
        next daemon to re-adopt)."""
        if self.cgroups is None or self.cgroups.job_ids():
            return
        with contextlib.suppress(DeskpodError, OSError):
            self.cgroups.remove()

    def _group(self, job_id: int) -> JobGroup | None:
        if self.cgroups is None:
            return None
        with contextlib.suppress(OSError):
            return self.cgroups.find(job_id)
        return None
