"""Live use of this box: per-GPU utilization and memory from NVML, and what the OS says about the host.

On a GPU box NVML (``nvidia-ml-py``, module ``pynvml``) gives each GPU's utilization — the percent of
the last sample period in which a kernel ran — and its memory used and total. Every box, GPU or
not, also gets the host view the kernel keeps: per-core utilization from ``/proc/stat``, host memory
from ``/proc/meminfo`` (used = ``MemTotal - MemAvailable``), and the load average.

``/proc/stat`` counts CPU time since boot, so a utilization needs two samples: `UsageSampler` keeps
the previous one and reports the busy share of the time between them. It also keeps its last answer
for ``max_age_s``, so many readers (50 open dashboards polling every 2 s) cost one read of ``/proc``
and NVML per period, not one each.

Seams: `GpuUsageQuery` is what the sampler asks about GPUs (`NvmlUsage` is the real one, over a
``pynvml``-shaped module); ``read`` (path -> text) and ``clock`` stand in for ``/proc`` and time.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from deskpod.environment import Environment
from deskpod.hardware.devices import nvml_text, visible_gpus

MAX_AGE_S = 1.0
"""How long one sample answers every reader."""


# ------------------------------------------------------------------------------------------------ CPU
@dataclass(frozen=True, slots=True)
class CpuTimes:
    """One ``cpu`` line of ``/proc/stat``, in clock ticks since boot."""

    busy: int
    """user + nice + system + irq + softirq + steal (guest time is already inside user and nice)."""
    total: int
    """busy + idle + iowait."""


def parse_proc_stat(text: str) -> dict[str, CpuTimes]:
    """The ``cpu`` (all cores) and ``cpuN`` lines of ``/proc/stat``, by name."""
    out: dict[str, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *fields = line.split()
        try:
            v = [int(x) for x in fields[:8]] + [0] * (8 - len(fields[:8]))
        except ValueError:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = v
        busy = user + nice + system + irq + softirq + steal
        out[name] = CpuTimes(busy, busy + idle + iowait)
    return out


def busy_percent(before: CpuTimes, after: CpuTimes) -> float | None:
    """Percent of the ticks between two samples that a core was busy; None when no tick passed."""
    total = after.total - before.total
    if total <= 0:
        return None
    busy = max(0, after.busy - before.busy)  # some counters (iowait) may step back; never below 0
    return round(min(100.0, 100.0 * busy / total), 1)


def _core_order(name: str) -> int:
    return int(name[3:]) if name[3:].isdigit() else -1


def parse_meminfo(text: str) -> tuple[int, int] | None:
    """Host memory ``(used, total)`` in bytes from ``/proc/meminfo``; used excludes reclaimable cache."""
    kb: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[key.strip()] = int(parts[0])
    total = kb.get("MemTotal")
    if not total:
        return None
    available = kb.get("MemAvailable")
    if available is None:  # kernels before 3.14
        available = kb.get("MemFree", 0) + kb.get("Buffers", 0) + kb.get("Cached", 0)
    return (total - min(available, total)) * 1024, total * 1024


def parse_loadavg(text: str) -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages from ``/proc/loadavg``."""
    parts = text.split()
    try:
        return float(parts[0]), float(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------ GPUs
@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU's live figures; a figure NVML would not give stays None."""

    index: int
    """The device index as this process sees it (its ``CUDA_VISIBLE_DEVICES`` order)."""
    name: str
    utilization: float | None
    """Percent of the last sample period in which a kernel ran (``nvmlDeviceGetUtilizationRates().gpu``)."""
    memory_used: int | None
    memory_total: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class GpuUsageQuery(Protocol):
    """What the sampler asks about GPUs: their live figures, in device order."""

    def gpus(self) -> tuple[GpuUse, ...]: ...


class NvmlUsage:
    """`GpuUsageQuery` over NVML: ``nvml`` is the ``pynvml`` module (or one shaped like it, in tests)."""

    def __init__(self, nvml: Any = None, visible: Sequence[str] | None = None) -> None:
        if nvml is None:
            import pynvml  # optional dependency: ImportError when absent

            nvml = pynvml
        nvml.nvmlInit()  # pynvml.NVMLError without a driver
        self._nvml = nvml
        self._error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [nvml_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        cvd = None if visible is None else tuple(visible)
        self._handles = [handles[p] for p in visible_gpus(count, uuids, cvd)]
        self._names = [nvml_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]

    def gpus(self) -> tuple[GpuUse, ...]:
        out = []
        for k, h in enumerate(self._handles):
            util: float | None = None
            used: int | None = None
            total: int | None = None
            # NVML_ERROR_NOT_SUPPORTED on some boards, a GPU fallen off the bus: no figure, not a crash.
            with contextlib.suppress(self._error):
                util = float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            with contextlib.suppress(self._error):
                mem = self._nvml.nvmlDeviceGetMemoryInfo(h)
                used, total = int(mem.used), int(mem.total)
            out.append(GpuUse(k, self._names[k], util, used, total))
        return tuple(out)


def open_nvml() -> GpuUsageQuery | None:
    """The real NVML for this process's visible GPUs, or None where it is not usable (no package, driver or GPU)."""
    try:
        query = NvmlUsage(visible=Environment.read().cuda_visible_devices)
    except Exception:  # ImportError, NVMLError, a driver library missing: all mean "the CPU view only"
        return None
    return query if query.gpus() else None


# ------------------------------------------------------------------------------------------------ sampler
@dataclass(frozen=True, slots=True)
class Usage:
    """One sample of the box's use."""

    source: str
    """``nvml`` when GPU figures came from NVML, else ``proc`` (the OS view only)."""
    gpus: tuple[GpuUse, ...]
    cpu: float | None
    """All cores together, percent busy over ``interval_s``."""
    cores: tuple[float | None, ...]
    """Each core (``cpu0``, ``cpu1``, … of ``/proc/stat``), percent busy over ``interval_s``."""
    interval_s: float | None
    """Seconds between the two ``/proc/stat`` samples; None when the figures are averages since boot."""
    memory_used: int | None
    memory_total: int | None
    load: tuple[float, float, float] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "gpus": [g.to_json() for g in self.gpus],
            "cpu": {"total": self.cpu, "cores": list(self.cores), "interval_s": self.interval_s},
            "memory": {"used": self.memory_used, "total": self.memory_total},
            "load": None if self.load is None else list(self.load),
        }


def read_text(path: str) -> str:
    return Path(path).read_text()


class UsageSampler:
    """Samples the box, keeping the previous ``/proc/stat`` so CPU figures are deltas between samples.

    ``gpus`` opens the GPU query on first use (None: no GPUs to ask); ``read`` reads a ``/proc`` file;
    ``clock`` is monotonic seconds. Thread-safe: concurrent readers wait for one sample and share it.
    """

    def __init__(
        self,
        *,
        gpus: Callable[[], GpuUsageQuery | None] = open_nvml,
        read: Callable[[str], str] = read_text,
        clock: Callable[[], float] = time.monotonic,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self._open_gpus, self._read, self._clock, self.max_age_s = gpus, read, clock, max_age_s
        self._gpus: GpuUsageQuery | None = None
        self._opened = False
        self._lock = threading.Lock()
        self._last: Usage | None = None
        self._last_at = 0.0
        self.samples = 0
        """How many times ``/proc`` (and NVML) were actually read."""
        self._prev: dict[str, CpuTimes] = self._stat()  # the baseline: the first sample is then a real delta
        self._prev_at = self._clock()

    def latest(self) -> Usage:
        """The last sample while it is younger than ``max_age_s``, else a new one."""
        with self._lock:
            now = self._clock()
            if self._last is None or now - self._last_at >= self.max_age_s:
                self._last = self._sample(now)
                self._last_at = now
            return self._last

    def _stat(self) -> dict[str, CpuTimes]:
        try:
            return parse_proc_stat(self._read("/proc/stat"))
        except OSError:
            return {}

    def _sample(self, now: float) -> Usage:
        self.samples += 1
        if not self._opened:
            self._opened = True
            self._gpus = self._open_gpus()
        gpus: tuple[GpuUse, ...] = ()
        if self._gpus is not None:
            try:
                gpus = self._gpus.gpus()
            except Exception:  # a driver that went away mid-run: the OS view carries on
                gpus = ()
        cur = self._stat()
        prev = self._prev
        interval: float | None = round(now - self._prev_at, 3)
        whole = cur.get("cpu")
        if whole is None or prev.get("cpu") is None or whole.total <= prev["cpu"].total:
            prev, interval = {}, None  # nothing to subtract (first read failed, no tick passed): since boot
        zero = CpuTimes(0, 0)
        names = sorted((n for n in cur if n != "cpu"), key=_core_order)
        cores = tuple(busy_percent(prev.get(n, zero), cur[n]) for n in names)
        cpu = None if whole is None else busy_percent(prev.get("cpu", zero), whole)
        if interval is not None:
            self._prev, self._prev_at = cur, now
        memory = self._try(parse_meminfo, "/proc/meminfo")
        load: tuple[float, float, float] | None = self._try(parse_loadavg, "/proc/loadavg")
        if load is None and hasattr(os, "getloadavg"):
            load = os.getloadavg()
        return Usage(
            source="nvml" if gpus else "proc",
            gpus=gpus,
            cpu=cpu,
            cores=cores,
            interval_s=interval,
            memory_used=None if memory is None else memory[0],
            memory_total=None if memory is None else memory[1],
            load=load,
        )

    def _try(self, parse: Callable[[str], Any], path: str) -> Any:
        try:
            return parse(self._read(path))
        except OSError:
            return None
