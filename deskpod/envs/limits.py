"""What a job may use: its cores, its memory, its processes and threads — the policy behind `deskpod.envs.cgroups`.

`job_limits` turns the pod's settings (`LimitSettings`, from ``deskpod up`` flags) and the devices a job holds
into the job's `Limits`; `deskpod.envs.cgroups` applies them. The numbers, and why:

* **Cores** (``pin_cpus``, on by default). On a CPU box the pod hands out CPU *slots*: ``max(2, cores)`` of
  them (`deskpod.hardware.devices.cpu_slots`), slot ``i`` standing for ``cores // slots`` cores. Slot ``i``
  is pinned to cores ``i*per … i*per+per-1`` of the daemon's own affinity, in order (`slot_cores`); where
  there are more slots than cores (a 1-core box has 2) slot ``i`` gets core ``i*cores // slots``, so two
  slots share one core. On a GPU box a GPU gets an even share of the cores its NUMA node lists in the
  topology's ``CPU Affinity`` (`gpu_cores`): the four GPUs of a DGX-1 socket split ``0-19,40-59`` into
  ``0-4,40-44``, ``5-9,45-49``, ``10-14,50-54`` and ``15-19,55-59`` — each run of the list is split alike, so
  a GPU keeps both hyperthreads of its cores. A GPU whose affinity is unknown gets every core.
* **Memory** (``job_memory``, default ``share``): the job's share of the box by devices held, ``MemTotal ×
  held / devices`` (a 1-GPU job on an 8-GPU box with 512 GiB: 64 GiB), so that all jobs together fit. No
  swap beyond it (see `deskpod.envs.cgroups`). A size instead (``--job-memory 16G``) gives every job that
  much; ``none`` sets no limit.
* **Tasks** (``job_tasks``: processes *and* threads, the kernel's ``pids.max``; default `default_tasks`):
  ``max(1024, 256 × the job's cores)``, and never more than the job's device share of the kernel's own limit
  (``min(pid_max, threads-max)``). Why so many: a thread counts as a task, and a training job is threads on
  threads. A DDP rank on 10 cores runs ~10 intra-op and ~10 inter-op threads, ~20 of CUDA, NCCL, the pin-memory
  thread and Python; each DataLoader worker is a process whose OpenMP and BLAS pools again size themselves
  to the cores it may use. Eight workers per rank come to ~250 tasks per 10 cores; 256 per core leaves
  about ten times that for ``torch.compile``'s worker pool and libraries that start threads of their own.
  What the limit is for is a fork bomb: it ends at a fixed size instead of taking the box's process table
  (a 3,000-process fork on a 1-core slot stops at 1,024). For comparison, systemd gives every service
  ``TasksMax`` = 15% of the kernel's limit (4,915 with the default ``pid_max`` of 32,768); Slurm's
  ``task/cgroup`` limits cores, memory and devices but sets no task limit. ``--job-tasks N`` sets N for
  every job, ``none`` sets no limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeGuard

from deskpod.environment.sizes import format_bytes, parse_size
from deskpod.errors import ConfigError
from deskpod.hardware.affinity import format_cpu_list, parse_cpu_list
from deskpod.hardware.devices import DeviceKind
from deskpod.hardware.topology import Topology

MIN_MEMORY = 16 * 2**20
"""The smallest memory limit: the job's shim is a Python interpreter of about 10 MiB, so less kills it first."""
MIN_TASKS = 8
"""The smallest task limit: the shim, bubblewrap (two processes with its PID namespace) and the job itself."""
DEFAULT_MIN_TASKS = 1024
"""`default_tasks` never goes below this (a 1-core slot still runs a DataLoader and a compile pool)."""
TASKS_PER_CORE = 256
"""`default_tasks` per core the job holds (see the module docstring for the count behind it)."""

MemorySetting = int | Literal["share"] | None
TasksSetting = int | Literal["default"] | None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The limits of one job's cgroup; None in a field means no limit of that kind."""

    cpus: tuple[int, ...] | None = None
    """The cores the job may run on (``cpuset.cpus``), sorted; on cgroup v1 its ``cpuset.mems`` are the memory
    nodes of those cores (the parent's when unknown). None: the cores of the pod's own cgroup."""
    memory_bytes: int | None = None
    """Memory the job's processes may hold together (v2 ``memory.max``; v1 ``memory.limit_in_bytes``), with no
    swap beyond it; past it the kernel reclaims, then the OOM killer ends a process of the job."""
    tasks: int | None = None
    """Processes and threads the job may have at once (``pids.max``); past it ``fork`` and ``pthread_create``
    fail with EAGAIN ("Resource temporarily unavailable")."""

    def __post_init__(self) -> None:
        if self.cpus is not None:
            cpus = tuple(self.cpus)
            bad = [c for c in cpus if not _is_int(c) or c < 0]
            if bad or not cpus:
                what = f"core {bad[0]!r} is not a core number" if bad else "no core"
                raise ConfigError(f"limits: cpus {self.cpus!r}: {what}; give core numbers like (0, 1, 2)")
            if len(set(cpus)) != len(cpus):
                raise ConfigError(f"limits: cpus {self.cpus!r} names a core twice")
            object.__setattr__(self, "cpus", tuple(sorted(cpus)))
        if self.memory_bytes is not None and (not _is_int(self.memory_bytes) or self.memory_bytes < MIN_MEMORY):
            raise ConfigError(
                f"limits: memory_bytes {self.memory_bytes!r}: give a whole number of bytes, at least {MIN_MEMORY} "
                f"({format_bytes(MIN_MEMORY)}), or None for no limit"
            )
        if self.tasks is not None and (not _is_int(self.tasks) or self.tasks < MIN_TASKS):
            raise ConfigError(
                f"limits: tasks {self.tasks!r}: give a whole number of processes and threads, at least {MIN_TASKS}, "
                "or None for no limit"
            )

    def describe(self) -> str:
        """``cores 0-3, memory 12.0 GiB, 1024 tasks`` (``no limits`` when none is set)."""
        parts = []
        if self.cpus is not None:
            parts.append(f"cores {format_cpu_list(self.cpus)}")
        if self.memory_bytes is not None:
            parts.append(f"memory {format_bytes(self.memory_bytes)}")
        if self.tasks is not None:
            parts.append(f"{self.tasks} tasks")
        return ", ".join(parts) or "no limits"


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitSettings:
    """A pod's settings for its jobs' limits (``deskpod up --job-memory/--job-tasks/--no-pin-cpus``)."""

    job_memory: MemorySetting = "share"
    """``share``: the job's share of the box's memory by devices held; a number: that many bytes for every job;
    None: no memory limit."""
    job_tasks: TasksSetting = "default"
    """``default``: `default_tasks` of the job's cores; a number: that many processes and threads for every job;
    None: no task limit."""
    pin_cpus: bool = True
    """Pin each job to the cores of its devices (`slot_cores`, `gpu_cores`); False: jobs run on every core."""

    def __post_init__(self) -> None:
        m = self.job_memory
        if not (m is None or m == "share" or (_is_int(m) and m >= MIN_MEMORY)):
            raise ConfigError(
                f"job memory {m!r}: use 'share' (the job's share by devices), a size of at least "
                f"{format_bytes(MIN_MEMORY)} like 16G, or 'none'"
            )
        t = self.job_tasks
        if not (t is None or t == "default" or (_is_int(t) and t >= MIN_TASKS)):
            raise ConfigError(
                f"job tasks {t!r}: use 'default', a number of processes and threads of at least {MIN_TASKS}, or 'none'"
            )
        if not isinstance(self.pin_cpus, bool):
            raise ConfigError(f"pin_cpus {self.pin_cpus!r}: expected true or false")


def parse_job_memory(text: str) -> MemorySetting:
    """``share``, ``none``, or a size: ``16G``, ``512M``, ``1.5T``, ``17179869184`` (K/M/G/T are powers of 1024)."""
    word = text.strip().lower()
    if word in ("share", "none"):
        return "share" if word == "share" else None
    try:
        size = parse_size(word)
    except ConfigError:
        raise ConfigError(f"--job-memory {text!r}: use 'share', 'none' or a size like 16G or 512M") from None
    LimitSettings(job_memory=size)  # the one check of the value
    return size


def parse_job_tasks(text: str) -> TasksSetting:
    """``default``, ``none``, or a number of processes and threads like ``4096``."""
    word = text.strip().lower()
    if word in ("default", "none"):
        return "default" if word == "default" else None
    if not word.isascii() or not word.isdigit():
        raise ConfigError(f"--job-tasks {text!r}: use 'default', 'none' or a number like 4096")
    LimitSettings(job_tasks=int(word))
    return int(word)


@dataclass(frozen=True, slots=True, kw_only=True)
class Box:
    """The facts of the machine `job_limits` needs; `Box.read` takes them from this process and ``/proc``."""

    kind: DeviceKind
    """``cuda``: the pod's devices are GPUs; ``cpu``: CPU worker slots."""
    devices: int
    """How many devices the pod hands out (GPUs, or CPU slots)."""
    cores: tuple[int, ...]
    """The cores the daemon may run on (its affinity), sorted: what jobs' cores are taken from."""
    memory_bytes: int
    """The box's memory (``MemTotal``)."""
    kernel_tasks: int | None = None
    """The kernel's limit on tasks, ``min(pid_max, threads-max)``; None when unknown."""
    topology: Topology | None = None
    """GPU boxes: the topology whose devices' ``cpu_affinity`` says which cores are near each GPU."""

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "cpu"):
            raise ConfigError(f"box kind {self.kind!r}: expected 'cuda' or 'cpu'")
        if not _is_int(self.devices) or self.devices < 1:
            raise ConfigError(f"box devices {self.devices!r}: expected 1 or more")
        if not self.cores:
            raise ConfigError("box cores (): the daemon may run on no core")
        object.__setattr__(self, "cores", tuple(sorted(set(self.cores))))
        if not _is_int(self.memory_bytes) or self.memory_bytes <= 0:
            raise ConfigError(f"box memory_bytes {self.memory_bytes!r}: expected the box's memory in bytes")

    @classmethod
    def read(cls, kind: DeviceKind, devices: int, topology: Topology | None = None) -> Box:
        """This box, as the daemon sees it: its affinity, ``MemTotal`` and the kernel's task limit."""
        import os

        from deskpod.hardware.devices import host_memory_bytes

        return cls(kind=kind, devices=devices, cores=tuple(os.sched_getaffinity(0)), memory_bytes=host_memory_bytes(),
                   kernel_tasks=kernel_tasks(), topology=topology)  # fmt: skip


def kernel_tasks(proc_sys: Path = Path("/proc/sys/kernel")) -> int | None:
    """``min(pid_max, threads-max)``: how many tasks the whole box may have; None when unreadable."""
    values = []
    for name in ("pid_max", "threads-max"):
        with contextlib.suppress(OSError, ValueError):
            values.append(int((proc_sys / name).read_text().strip()))
    return min(values) if values else None


def slot_cores(slot: int, slots: int, cores: Sequence[int]) -> tuple[int, ...]:
    """The cores CPU slot ``slot`` of ``slots`` stands for, taken in order from ``cores`` (the daemon's affinity):
    ``len(cores) // slots`` of them, or one shared core when there are more slots than cores."""
    if not 0 <= slot < slots:
        raise ConfigError(f"CPU slot {slot!r}: this box has slots 0-{slots - 1}")
    ordered = sorted(set(cores))
    per = len(ordered) // slots
    if per == 0:
        return (ordered[slot * len(ordered) // slots],)
    return tuple(ordered[slot * per : (slot + 1) * per])


def _runs(cores: Sequence[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for c in cores:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


def split_cores(cores: Sequence[int], n: int) -> tuple[tuple[int, ...], ...]:
    """``cores`` in ``n`` even shares, for ``n`` GPUs of one NUMA node.

    When every run of consecutive cores splits evenly (``0-19,40-59`` by 4), share ``j`` takes the ``j``-th part of
    each run: Linux numbers a core's second hyperthread one run later, so a share keeps whole cores. Else the
    list is cut in ``n`` consecutive pieces; with fewer cores than shares, share ``j`` gets one core, shared.
    """
    ordered = sorted(set(cores))
    runs = _runs(ordered)
    if ordered and all(len(r) % n == 0 for r in runs):
        return tuple(tuple(c for r in runs for c in r[j * len(r) // n : (j + 1) * len(r) // n]) for j in range(n))
    k = len(ordered)
    if k >= n:
        return tuple(tuple(ordered[j * k // n : (j + 1) * k // n]) for j in range(n))
    return tuple((ordered[j * k // n],) for j in range(n))


def gpu_cores(topology: Topology | None, gpu: int, cores: Collection[int]) -> tuple[int, ...]:
    """The cores GPU ``gpu`` of ``topology`` gets: an even share (`split_cores`) of the cores of its ``CPU
    Affinity`` that ``cores`` (the daemon's affinity) holds, among every GPU with the same affinity. Every core
    of ``cores`` when the topology does not know the GPU's affinity, or shares none of it with the daemon."""
    allowed = set(cores)
    everything = tuple(sorted(allowed))
    if topology is None:
        return everything
    if not 0 <= gpu < topology.device_count:
        raise ConfigError(f"GPU {gpu!r} is not on {topology.name!r}: it has GPUs 0-{topology.device_count - 1}")

    def near(i: int) -> tuple[int, ...]:
        text = topology.devices[i].cpu_affinity.strip()
        return tuple(c for c in parse_cpu_list(text) if c in allowed) if text else ()

    mine = near(gpu)
    if not mine:
        return everything
    sharers = [i for i in range(topology.device_count) if near(i) == mine]
    return split_cores(mine, len(sharers))[sharers.index(gpu)]


def default_tasks(cores: int) -> int:
    """`LimitSettings.job_tasks` ``default`` for a job of ``cores`` cores: ``max(1024, 256 × cores)``."""
    return max(DEFAULT_MIN_TASKS, TASKS_PER_CORE * cores)


def job_limits(settings: LimitSettings, box: Box, devices: Iterable[int]) -> Limits:
    """The `Limits` of a job holding ``devices`` (the pod's device indices) on ``box`` (module docstring)."""
    held = tuple(devices)
    bad = [d for d in held if not _is_int(d) or not 0 <= d < box.devices]
    if bad or len(set(held)) != len(held):
        what = f"device {bad[0]!r} is not one" if bad else "a device named twice"
        raise ConfigError(f"job devices {list(held)!r}: {what}; this box has devices 0-{box.devices - 1}")
    if not held:  # a job that holds no devices (TensorBoard): one device's share of memory and tasks, not pinned
        return replace(job_limits(settings, box, [0]), cpus=None)
    mine: set[int] = set()
    for d in held:
        mine.update(
            slot_cores(d, box.devices, box.cores) if box.kind == "cpu" else gpu_cores(box.topology, d, box.cores)
        )
    memory: int | None
    if settings.job_memory == "share":
        memory = max(MIN_MEMORY, box.memory_bytes * len(held) // box.devices)
    else:
        memory = settings.job_memory
    tasks: int | None
    if settings.job_tasks == "default":
        tasks = default_tasks(len(mine))
        if box.kernel_tasks is not None:
            tasks = max(MIN_TASKS, min(tasks, box.kernel_tasks * len(held) // box.devices))
    else:
        tasks = settings.job_tasks
    return Limits(cpus=tuple(sorted(mine)) if settings.pin_cpus else None, memory_bytes=memory, tasks=tasks)
