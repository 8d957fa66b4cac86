"""Each job of a pod in a cgroup of its own: the cores, memory and processes it may use, and what happened.

What is limited
---------------
A pod started by root puts every job in a control group (cgroup) with three limits (`deskpod.envs.limits`):

* **cores**: the job runs only on the cores of its devices — on a CPU box the cores of its CPU slots, on a
  GPU box an even share of the cores near its GPUs (the NUMA node in ``nvidia-smi topo -m``'s CPU Affinity);
* **memory**: its processes together hold at most its share of the box's memory by devices held (1 of 8 GPUs:
  an eighth of ``MemTotal``), with no swap beyond it;
* **tasks**: processes and threads at once, ``max(1024, 256 × its cores)`` (at most its share of the kernel's
  own limit), so a fork bomb stops at a fixed size instead of filling the box's process table.

Everything the job starts is inside, also what leaves its process group with ``setsid``: when the job ends or
is cancelled the pod kills every process of the cgroup, and none survives the job.

Defaults and how to change them: ``deskpod up`` takes ``--job-memory share|SIZE|none`` (``16G``: every job
16 GiB), ``--job-tasks default|N|none`` and ``--no-pin-cpus`` (jobs run on every core). The settings are the
pod's; a job cannot raise them.

What a user sees when a limit is hit
------------------------------------
* memory: the kernel's OOM killer ends the job's largest process (SIGKILL, exit code 137); the job fails and
  its log and record say ``killed: out of memory (limit 2.0 GiB)``;
* tasks: ``fork`` and thread creation fail with EAGAIN (Python: ``BlockingIOError: [Errno 11] Resource
  temporarily unavailable``; PyTorch: ``pthread_create failed``), and the pod adds ``task limit reached: N
  process or thread starts refused (limit 1024)``;
* cores: nothing fails; the job sees only its cores (``os.sched_getaffinity``, ``nproc``), and ``deskpod
  train`` sizes its workers and threads to them. Inside a pinned job, CPU slots are numbered from 0
  (``DESKPOD_CPU_SLOTS=0``), as GPUs are in the sandbox (``CUDA_VISIBLE_DEVICES=0``).

When it works, and when it does not
-----------------------------------
`detect` finds the box's cgroup set-up, creates the pod's part of it, and says in one line what it uses or
why it cannot; then the pod runs its jobs without limits and says so when it starts (as for a missing
bubblewrap). It needs root (or a cgroup delegated to the daemon) and a writable cgroup file system with the
``cpuset``, ``memory`` and ``pids`` controllers.

* **cgroup v2** (``/sys/fs/cgroup`` is one unified hierarchy: Debian 11+, Ubuntu 21.10+, RHEL 9). The pod's
  tree goes under the daemon's own cgroup, ``<own>/deskpod-<pod>/job-<id>``. v2 lets only leaves hold
  processes, so when the daemon sits in the cgroup it must enable controllers in, it first moves itself into
  a leaf of its own, ``<own>/deskpod-daemon``, as systemd's delegation rules expect of a delegated service.
  Under systemd the daemon must run in a unit that delegates its cgroup, else systemd owns the tree and
  `detect` declines to touch it (systemd marks a delegated cgroup with the ``trusted.delegate`` attribute):
  ``systemd-run --scope -p Delegate=yes deskpod up ...`` to try it, or a service with ``Delegate=yes``. A scope
  is new at every start, so a restarted daemon finds its running jobs' groups only in a service, whose cgroup
  keeps its name. For jobs that outlive a daemon restart (re-adopted, as without systemd) the service also needs
  ``KillMode=process`` and ``DelegateSubgroup=deskpod-daemon`` (systemd 254 or later: it then starts the daemon
  in that leaf). An older systemd cannot start the daemon again in a cgroup whose controllers are enabled while
  jobs live there: keep its default ``KillMode=control-group``, and a restart ends the jobs.
* **cgroup v1** (separate hierarchies ``/sys/fs/cgroup/cpuset``, ``memory``, ``pids``; older distributions and
  many containers). The pod's tree goes under the daemon's own cgroup in each hierarchy (which may differ:
  ``memory:/process_api/<hash>``, ``pids:/``). v1's cpuset needs ``cpuset.cpus`` and ``cpuset.mems`` set before
  a process may join; the pod copies its parent's, and a job's ``cpuset.mems`` are the memory nodes of its
  cores. Memory and swap are limited together where the kernel accounts swap (``memory.memsw.*``); where it
  does not, ``memory.swappiness`` 0 keeps the job's memory out of swap.
* **Swap.** A job gets no swap beyond its memory limit (v2 ``memory.swap.max`` 0; v1 ``memsw`` equal to the
  limit), as Slurm does when it limits swap (``ConstrainSwapSpace=yes``, whose ``AllowedSwapSpace`` defaults to
  0): a job swapping past its share would slow every job on the box to the disk's speed, the very thing the
  limit is there to prevent, and fail later anyway.
* **Containers.** A read-only ``/sys/fs/cgroup`` (a container without its own cgroup) is reported, not worked
  around.

How a process joins its group
-----------------------------
`JobGroup.procs_files` lists one ``cgroup.procs`` file per hierarchy (one on v2); the job's shim writes its own
pid into each (``--cgroup PATH`` arguments) before it starts anything, so the environment build, bubblewrap
and the job are all inside. A group is named by job id and found again by a restarted daemon (`PodCgroups.find`);
`JobGroup.kill` ends every process in it (v2: ``cgroup.kill``; v1: SIGKILL each pid until none is left),
`JobGroup.remove` removes it, and `JobGroup.usage` reads what happened (peak memory, OOM kills, refused forks).

The OOM killer ends one process, the group's largest, not the whole group (``memory.oom.group`` stays 0): the
shim, small, survives to record the job's exit code, and the pod then kills what is left.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from deskpod.environment.sizes import format_bytes
from deskpod.envs.limits import Limits
from deskpod.errors import ConfigError, ConflictError, RunError
from deskpod.hardware.affinity import NODE_DIR, format_cpu_list, parse_cpu_list

CONTROLLERS = ("cpuset", "memory", "pids")
"""The controllers a pod's job groups use."""
DAEMON_LEAF = "deskpod-daemon"
"""Where the daemon moves itself on cgroup v2 when it must enable controllers in the cgroup it is in."""
SYSTEMD_RUNNING = Path("/run/systemd/system")
"""Exists when systemd is the init system (``sd_booted``)."""
KILL_TIMEOUT_S = 10.0
"""How long `JobGroup.kill` waits for its processes to go (one in uninterruptible sleep may take a while)."""

_POD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", re.ASCII)
_JOB_DIR = re.compile(r"^job-(\d+)$", re.ASCII)
_V1_UNLIMITED = 2**62
"""v1 reports "no limit" as a page-aligned LONG_MAX (9223372036854771712); anything this large is none."""


class _Unusable(Exception):
    """Why the pod cannot manage cgroups here: one line for the user."""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """One mounted cgroup hierarchy holding some of `CONTROLLERS`, and where in it the pod's tree goes."""

    version: Literal[1, 2]
    controllers: tuple[str, ...]
    """The controllers of `CONTROLLERS` (or those asked of `detect`) this hierarchy holds."""
    mount: Path
    """Where the hierarchy is mounted (``/sys/fs/cgroup``, ``/sys/fs/cgroup/memory``)."""
    base: Path
    """The cgroup the pod's tree goes under: the daemon's own (v1), or the delegated one holding it (v2)."""


@dataclass(frozen=True, slots=True)
class Detection:
    """What `detect` found: the pod's cgroups, or None and why."""

    cgroups: PodCgroups | None
    reason: str
    """One line: what the pod uses (``cgroup v1: cpuset, memory, pids under ...``), or why it cannot."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What happened in a job's group, read from the kernel's counters (None where this kernel has none)."""

    limits: Limits
    """The limits the group has (read back from its files)."""
    memory_current: int | None
    memory_peak: int | None
    """The most memory the group held at once (v2 ``memory.peak``, Linux 5.19+; v1 ``memory.max_usage_in_bytes``)."""
    memory_limit_hits: int
    """How often the group reached its memory limit (v2 ``memory.events`` max; v1 ``memory.failcnt``)."""
    oom_kills: int
    """Processes of the group the OOM killer ended (``oom_kill`` of v2 ``memory.events`` / v1 ``memory.oom_control``)."""
    tasks_current: int | None
    tasks_peak: int | None
    tasks_refused: int
    """Process and thread starts refused at ``pids.max`` (``pids.events`` max)."""

    def problems(self) -> tuple[str, ...]:
        """Lines for the job's log and record: ``killed: out of memory (limit 2.0 GiB)`` and the like."""
        out = []
        if self.oom_kills:
            limit = f"limit {format_bytes(self.limits.memory_bytes)}" if self.limits.memory_bytes else "no job limit"
            more = f"; {self.oom_kills} processes killed" if self.oom_kills > 1 else ""
            out.append(f"killed: out of memory ({limit}{more})")
        if self.tasks_refused:
            limit = f"limit {self.limits.tasks}" if self.limits.tasks is not None else "a parent's limit"
            out.append(f"task limit reached: {self.tasks_refused} process or thread starts refused ({limit})")
        return tuple(out)


def _write(path: Path, text: str) -> None:
    # One write(2) per value: a cgroup file takes one value per write.
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _keyed(text: str) -> dict[str, int]:
    """``key value`` lines (``memory.events``, ``pids.events``, ``memory.oom_control``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are written as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(mountinfo: str) -> list[tuple[int, tuple[str, ...], str, Path]]:
    """The cgroup mounts of a ``/proc/self/mountinfo``: (version, controllers, mount root, mount point)."""
    out: list[tuple[int, tuple[str, ...], str, Path]] = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if tail[0] == "cgroup2":
            out.append((2, (), root, point))
        elif tail[0] == "cgroup":
            out.append((1, tuple(tail[2].split(",")), root, point))
    return out


def _own_paths(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller -> path; ``""`` holds the v2 path (the ``0::`` line)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            out[""] = parts[2]
        for c in parts[1].split(","):
            if c:
                out[c] = parts[2]
    return out


def _under(point: Path, root: str, own: str) -> Path:
    """The directory of cgroup ``own`` in a hierarchy whose ``root`` is mounted at ``point``."""
    if root != "/" and own != root and not own.startswith(root.rstrip("/") + "/"):
        raise _Unusable(f"this process's cgroup {own} is outside what is mounted at {point} (cgroup {root})")
    rel = own[len(root) :] if root != "/" else own
    return point / rel.lstrip("/")


def find_hierarchies(mountinfo: str, own: str, controllers: Sequence[str] = CONTROLLERS) -> tuple[Hierarchy, ...]:
    """Which mounted hierarchy holds each of ``controllers`` and this process's cgroup in it (``mountinfo``:
    ``/proc/self/mountinfo``; ``own``: ``/proc/self/cgroup``). A v1 hierarchy wins over v2 for a controller it
    holds (a hybrid box mounts an empty v2 beside them). The v2 base is this process's cgroup, to be adjusted
    for delegation by `detect`. `_Unusable` names what is missing."""
    mounts, paths = _mounts(mountinfo), _own_paths(own)
    found: dict[tuple[int, Path], tuple[Path, list[str]]] = {}
    v2 = next(((root, point) for version, _, root, point in mounts if version == 2), None)
    v2_controllers: set[str] = set()
    if v2 is not None and "" in paths:
        with contextlib.suppress(OSError):
            v2_controllers = set((v2[1] / "cgroup.controllers").read_text().split())
    for c in controllers:
        v1 = next(((root, point) for version, cs, root, point in mounts if version == 1 and c in cs), None)
        if v1 is not None and c in paths:
            key, own_path, root, point = (1, v1[1]), paths[c], *v1
        elif v2 is not None and "" in paths and c in v2_controllers:
            key, own_path, root, point = (2, v2[1]), paths[""], *v2
        else:
            where = f"the cgroup v2 root {v2[1]} offers {' '.join(sorted(v2_controllers)) or 'none'}" if v2 else (
                "no cgroup file system is mounted")  # fmt: skip
            raise _Unusable(f"no cgroup hierarchy here has the {c} controller ({where})")
        if key not in found:
            found[key] = (_under(point, root, own_path), [])
        found[key][1].append(c)
    return tuple(
        Hierarchy(version=2 if version == 2 else 1, controllers=tuple(cs), mount=point, base=base)
        for (version, point), (base, cs) in found.items()
    )


def _delegated(path: Path) -> bool:
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, name).strip() == b"1":
                return True
    return False


def _v2_base(h: Hierarchy, systemd: bool) -> Hierarchy:
    """The cgroup v2 base the pod may manage: the daemon's own cgroup, or its parent when that is the delegated
    one (systemd's ``DelegateSubgroup=`` starts the daemon in a leaf of its unit's cgroup)."""
    own = h.base
    if _delegated(own):
        return h
    if own != h.mount and _delegated(own.parent):
        return Hierarchy(version=2, controllers=h.controllers, mount=h.mount, base=own.parent)
    if systemd and own != h.mount:
        raise _Unusable(
            f"systemd manages this daemon's cgroup {own} and has not delegated it: run the daemon in a unit with "
            "Delegate=yes (systemd-run --scope -p Delegate=yes deskpod up ..., or a service with Delegate=yes)"
        )
    return h


def _explain(e: OSError, what: str) -> _Unusable:
    if e.errno == errno.EROFS:
        return _Unusable(f"cannot {what}: the cgroup file system is read-only here (a container without its own "
                         "writable cgroup)")  # fmt: skip
    if e.errno in (errno.EACCES, errno.EPERM):
        return _Unusable(f"cannot {what}: {e.strerror} (the pod manages cgroups only as root, or in a cgroup "
                         "delegated to it)")  # fmt: skip
    return _Unusable(f"cannot {what}: {e.strerror or e}")


def detect(pod: str, *, controllers: Sequence[str] = CONTROLLERS, proc_self: Path = Path("/proc/self"),
           systemd: bool | None = None) -> Detection:  # fmt: skip
    """Find this box's cgroups and make the pod's part of them, ``<base>/deskpod-<pod>`` in each hierarchy; on
    cgroup v2 the daemon may move itself into ``<base>/deskpod-daemon`` first (module docstring). ``pod`` names
    the pod's tree (two pods under one cgroup need two names). Nothing usable: ``Detection(None, why)``.

    ``controllers``, ``proc_self`` and ``systemd`` are for tests (a hierarchy with other controllers, another
    process's view, systemd or not); ``systemd`` None looks for it."""
    _check_pod(pod)
    if systemd is None:
        systemd = SYSTEMD_RUNNING.is_dir()
    try:
        mountinfo, own = (proc_self / "mountinfo").read_text(), (proc_self / "cgroup").read_text()
    except OSError as e:
        return Detection(None, f"cannot read this process's cgroups: {e.strerror or e}")
    try:
        found = find_hierarchies(mountinfo, own, controllers)
        found = tuple(_v2_base(h, systemd) if h.version == 2 else h for h in found)
        cgroups = PodCgroups(pod, found)
        cgroups._prepare()
    except _Unusable as e:
        return Detection(None, str(e))
    return Detection(cgroups, cgroups.describe())


def _check_pod(pod: str) -> None:
    if not isinstance(pod, str) or not _POD_NAME.match(pod):
        raise ConfigError(f"pod name {pod!r} for cgroups: use 1-64 letters, digits, '.', '_' or '-'")


def _check_job(job_id: int) -> None:
    if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 0:
        raise ConfigError(f"job id {job_id!r}: expected a whole number of 0 or more")


class PodCgroups:
    """A pod's tree of job groups, ``<base>/deskpod-<pod>/job-<id>`` in each hierarchy (`detect` builds one)."""

    def __init__(self, pod: str, hierarchies: Sequence[Hierarchy]) -> None:
        _check_pod(pod)
        if not hierarchies:
            raise ConfigError("PodCgroups: no hierarchy given")
        self.pod = pod
        self.hierarchies = tuple(hierarchies)

    def folder(self, h: Hierarchy) -> Path:
        """The pod's own cgroup in hierarchy ``h``."""
        return h.base / f"deskpod-{self.pod}"

    def describe(self) -> str:
        versions = sorted({h.version for h in self.hierarchies})
        parts = [f"{'/'.join(h.controllers) or 'no controller'} under {self.folder(h)}" for h in self.hierarchies]
        return f"cgroup v{'+v'.join(map(str, versions))}: {'; '.join(parts)}"

    def _prepare(self) -> None:
        """Create the pod's cgroups (idempotent); `_Unusable` when this process may not."""
        for h in self.hierarchies:
            try:
                if h.version == 2:
                    self._prepare_v2(h)
                else:
                    self._prepare_v1(h)
            except OSError as e:
                raise _explain(e, f"prepare the pod's cgroup under {h.base}") from None

    def _prepare_v1(self, h: Hierarchy) -> None:
        folder = self.folder(h)
        try:
            folder.mkdir(exist_ok=True)
        except OSError as e:
            raise _explain(e, f"create {folder}") from None
        if "cpuset" in h.controllers:
            # A v1 cpuset starts empty, and a process cannot join an empty one: take the parent's.
            for name in ("cpuset.cpus", "cpuset.mems"):
                if not (folder / name).read_text().strip():
                    try:
                        _write(folder / name, (h.base / name).read_text().strip())
                    except OSError as e:
                        raise _explain(e, f"set {folder / name}") from None

    def _prepare_v2(self, h: Hierarchy) -> None:
        base, folder = h.base, self.folder(h)
        offered = set((base / "cgroup.controllers").read_text().split())
        missing = [c for c in h.controllers if c not in offered]
        if missing:
            raise _Unusable(
                f"{base} does not offer the {', '.join(missing)} controller: its parent has not delegated it "
                "(under systemd: a unit with Delegate=yes)"
            )
        self._enable(base)
        try:
            folder.mkdir(exist_ok=True)
        except OSError as e:
            raise _explain(e, f"create {folder}") from None
        self._enable(folder, move=False)

    def _enable(self, cgroup: Path, *, move: bool = True) -> None:
        """Enable the pod's v2 controllers for ``cgroup``'s children; when the daemon is inside (v2 lets only
        leaves hold processes) move it into ``cgroup/deskpod-daemon`` first."""
        wanted = next(h.controllers for h in self.hierarchies if h.version == 2)
        if set(wanted) <= set((cgroup / "cgroup.subtree_control").read_text().split()):
            return
        text = " ".join(f"+{c}" for c in wanted)
        try:
            _write(cgroup / "cgroup.subtree_control", text)
            return
        except OSError as e:
            if e.errno != errno.EBUSY or not move:
                raise _explain(e, f"enable {', '.join(wanted)} in {cgroup}") from None
        leaf = cgroup / DAEMON_LEAF
        try:
            leaf.mkdir(exist_ok=True)
            _write(leaf / "cgroup.procs", str(os.getpid()))
            _write(cgroup / "cgroup.subtree_control", text)
        except OSError as e:
            others = sorted(_pids_in(cgroup, deep=False) - {os.getpid()})
            if e.errno == errno.EBUSY and others:
                raise _Unusable(
                    f"cannot enable {', '.join(wanted)} in {cgroup}: it holds other processes ({_list(others)}) "
                    "and cgroup v2 lets only leaves hold processes; start the daemon in a cgroup of its own"
                ) from None
            raise _explain(e, f"enable {', '.join(wanted)} in {cgroup}") from None

    def group(self, job_id: int) -> JobGroup:
        """Job ``job_id``'s group, whether or not it exists (see `find`, `create`)."""
        _check_job(job_id)
        return JobGroup(job_id, tuple((h, self.folder(h) / f"job-{job_id}") for h in self.hierarchies))

    def find(self, job_id: int) -> JobGroup | None:
        """Job ``job_id``'s group when it exists (in any hierarchy): what a restarted daemon asks."""
        group = self.group(job_id)
        return group if group.exists() else None

    def job_ids(self) -> tuple[int, ...]:
        """The jobs that have a group, in any hierarchy."""
        ids: set[int] = set()
        for h in self.hierarchies:
            with contextlib.suppress(OSError):
                for entry in os.scandir(self.folder(h)):
                    m = _JOB_DIR.match(entry.name)
                    if m and entry.is_dir(follow_symlinks=False):
                        ids.add(int(m.group(1)))
        return tuple(sorted(ids))

    def create(self, job_id: int, limits: Limits) -> JobGroup:
        """A new group for job ``job_id`` with ``limits``. A group left from an earlier attempt is removed first
        when empty; one with processes is a `ConflictError` naming them."""
        group = self.group(job_id)
        if group.exists():
            group.remove()
        made: list[Path] = []
        try:
            self._check_cpus(limits)
            for h, folder in group.folders:
                folder.mkdir()
                made.append(folder)
                _configure(h, folder, limits)
        except BaseException as e:
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            if isinstance(e, OSError):  # the pod's tree went away, or the kernel refused a value
                raise RunError(f"cannot create job {job_id}'s cgroup: {e.strerror or e} ({e.filename})") from None
            raise
        return group

    def _check_cpus(self, limits: Limits) -> None:
        if limits.cpus is None:
            return
        for h in self.hierarchies:
            if "cpuset" not in h.controllers:
                continue
            name = "cpuset.cpus" if h.version == 1 else "cpuset.cpus.effective"
            allowed = _cpus((self.folder(h) / name).read_text())
            outside = [c for c in limits.cpus if c not in allowed]
            if outside:
                raise ConfigError(
                    f"limits: cores {format_cpu_list(outside)} are not among the pod's cores "
                    f"{format_cpu_list(sorted(allowed)) or 'none'} ({self.folder(h) / name})"
                )

    def remove(self) -> None:
        """Remove the pod's cgroups (`ConflictError` while a job group is left)."""
        left = self.job_ids()
        if left:
            raise ConflictError(f"the pod's cgroups still hold the groups of jobs {_list(left)}; remove those first")
        for h in self.hierarchies:
            with contextlib.suppress(FileNotFoundError):
                self.folder(h).rmdir()


def _cpus(text: str) -> set[int]:
    return set(parse_cpu_list(text)) if text.strip() else set()


def _nodes_of(cpus: Iterable[int], node_dir: Path = NODE_DIR) -> set[int]:
    """The NUMA nodes whose cores include any of ``cpus`` (empty where the kernel lists none)."""
    wanted, out = set(cpus), set()
    with contextlib.suppress(OSError):
        for entry in os.scandir(node_dir):
            m = re.fullmatch(r"node(\d+)", entry.name)
            if m:
                with contextlib.suppress(OSError, ValueError):
                    if _cpus((Path(entry.path) / "cpulist").read_text()) & wanted:
                        out.add(int(m.group(1)))
    return out


def _set(folder: Path, name: str, value: str) -> None:
    try:
        _write(folder / name, value)
    except OSError as e:
        raise RunError(f"cannot set {folder / name} to {value!r}: {e.strerror or e}") from None


def _configure(h: Hierarchy, folder: Path, limits: Limits) -> None:
    """Write ``limits`` into a new group's files for the controllers of hierarchy ``h``."""
    parent = folder.parent
    if "cpuset" in h.controllers:
        if h.version == 1:
            parent_mems = _cpus((parent / "cpuset.mems").read_text())
            cpus = limits.cpus if limits.cpus is not None else sorted(_cpus((parent / "cpuset.cpus").read_text()))
            mems = (_nodes_of(cpus) & parent_mems) or parent_mems
            _set(folder, "cpuset.cpus", format_cpu_list(cpus))
            _set(folder, "cpuset.mems", format_cpu_list(mems))
        elif limits.cpus is not None:  # v2: an empty cpuset means the parent's
            _set(folder, "cpuset.cpus", format_cpu_list(limits.cpus))
            mems = _nodes_of(limits.cpus) & _cpus((parent / "cpuset.mems.effective").read_text())
            if mems:
                _set(folder, "cpuset.mems", format_cpu_list(mems))
    if "memory" in h.controllers and limits.memory_bytes is not None:
        size = str(limits.memory_bytes)
        if h.version == 2:
            _set(folder, "memory.max", size)
            if (folder / "memory.swap.max").exists():
                _set(folder, "memory.swap.max", "0")
        else:
            _set(folder, "memory.limit_in_bytes", size)
            if (folder / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swap beyond the limit
                _set(folder, "memory.memsw.limit_in_bytes", size)
            with contextlib.suppress(OSError):  # 0: limit reclaim never swaps (gone in some kernels)
                _write(folder / "memory.swappiness", "0")
    if "pids" in h.controllers and limits.tasks is not None:
        _set(folder, "pids.max", str(limits.tasks))


def _pids_in(folder: Path, *, deep: bool = True) -> set[int]:
    """The processes in ``folder`` (and, ``deep``, its descendants), from ``cgroup.procs``."""
    out: set[int] = set()
    folders: Iterator[Path] = (Path(d) for d, _, _ in os.walk(folder)) if deep else iter([folder])
    for d in folders:
        with contextlib.suppress(FileNotFoundError):
            out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
    return out


def _list(items: Iterable[int]) -> str:
    items = list(items)
    shown = ", ".join(map(str, items[:10]))
    return shown + (f" and {len(items) - 10} more" if len(items) > 10 else "")


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return None if value >= _V1_UNLIMITED else value


@dataclass(frozen=True, slots=True)
class JobGroup:
    """One job's cgroup: a folder per hierarchy (one on cgroup v2)."""

    job_id: int
    folders: tuple[tuple[Hierarchy, Path], ...]

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """The ``cgroup.procs`` files a process writes its pid into to join the group (all of them)."""
        return tuple(folder / "cgroup.procs" for _, folder in self.folders)

    def shim_args(self) -> list[str]:
        """``--cgroup PATH`` for each of `procs_files`: the job's shim joins before it starts anything."""
        return [arg for path in self.procs_files for arg in ("--cgroup", str(path))]

    def exists(self) -> bool:
        return any(folder.is_dir() for _, folder in self.folders)

    def join(self, pid: int = 0) -> None:
        """Move process ``pid`` (0: this one) into the group, as the shim does for itself."""
        for path in self.procs_files:
            _set(path.parent, path.name, str(pid or os.getpid()))

    def pids(self) -> set[int]:
        """The live processes in the group (zombies are not listed), in any hierarchy."""
        return set().union(*(_pids_in(folder) for _, folder in self.folders))

    def kill(self, timeout: float = KILL_TIMEOUT_S) -> None:
        """End every process in the group with SIGKILL, also those that left the job's process group; return
        when none is left. v2 writes ``cgroup.kill`` (Linux 5.14+), which the kernel applies to new children
        too; else each pid is killed, again, until the group is empty (a fork between the reading and the
        kill is caught by the next round). `RunError` if processes remain after ``timeout`` seconds."""
        for h, folder in self.folders:
            if h.version == 2 and (folder / "cgroup.kill").exists():
                with contextlib.suppress(FileNotFoundError):
                    _write(folder / "cgroup.kill", "1")
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            left = self.pids()
            if not left:
                return
            if time.monotonic() > deadline:
                raise RunError(f"job {self.job_id}: processes {_list(sorted(left))} are still in its cgroup "
                               f"{timeout:g} s after SIGKILL")  # fmt: skip
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(delay)
            delay = min(0.05, delay * 2)

    def remove(self) -> None:
        """Remove the group's folders (those a root job made inside too); `ConflictError` while processes are
        in it (`kill` first). Removing a group that is gone does nothing."""
        left = self.pids()
        if left:
            raise ConflictError(
                f"job {self.job_id}'s cgroup still holds processes {_list(sorted(left))}; kill them first"
            )
        for _, folder in self.folders:
            if not folder.is_dir():
                continue
            for d, _, _ in sorted(os.walk(folder), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise RunError(f"cannot remove {d}: {e.strerror or e}") from None

    def limits(self) -> Limits:
        """The limits the group has, read back from its files (what a restarted daemon reports)."""
        cpus: tuple[int, ...] | None = None
        memory: int | None = None
        tasks: int | None = None
        for h, folder in self.folders:
            if "cpuset" in h.controllers:
                with contextlib.suppress(OSError):
                    found = _cpus((folder / "cpuset.cpus").read_text())
                    cpus = tuple(sorted(found)) if found else None
            if "memory" in h.controllers:
                memory = _number(folder / ("memory.max" if h.version == 2 else "memory.limit_in_bytes"))
            if "pids" in h.controllers:
                tasks = _number(folder / "pids.max")
        return Limits(cpus=cpus, memory_bytes=memory, tasks=tasks)

    def usage(self) -> Usage:
        """What happened in the group so far: memory, OOM kills, tasks, refused forks (see `Usage`)."""
        current = peak = tasks_now = tasks_peak = None
        hits = kills = refused = 0
        for h, folder in self.folders:
            if "memory" in h.controllers:
                with contextlib.suppress(OSError):
                    if h.version == 2:
                        current, peak = _number(folder / "memory.current"), _number(folder / "memory.peak")
                        events = _keyed((folder / "memory.events").read_text())
                        hits, kills = events.get("max", 0), events.get("oom_kill", 0)
                    else:
                        current = _number(folder / "memory.usage_in_bytes")
                        peak = _number(folder / "memory.max_usage_in_bytes")
                        hits = _number(folder / "memory.failcnt") or 0
                        kills = _keyed((folder / "memory.oom_control").read_text()).get("oom_kill", 0)
            if "pids" in h.controllers:
                tasks_now, tasks_peak = _number(folder / "pids.current"), _number(folder / "pids.peak")
                with contextlib.suppress(OSError):
                    refused = _keyed((folder / "pids.events").read_text()).get("max", 0)
        return Usage(limits=self.limits(), memory_current=current, memory_peak=peak, memory_limit_hits=hits,
                     oom_kills=kills, tasks_current=tasks_now, tasks_peak=tasks_peak, tasks_refused=refused)  # fmt: skip
