"""The local accelerators: CUDA GPUs, or CPU worker slots on a box without one.

On a GPU box a device is a GPU; names and memory come from NVML (``nvidia-ml-py``) when it is
installed, else from torch. On a CPU-only box a device is a CPU *slot*: one worker process with
its share of the cores as intra-op threads, so that N workers never oversubscribe the machine.
There is one slot per core and at least two: the pod service hands CPU jobs slots, and
``--devices 2`` runs the distributed code paths (Gloo, DDP, sharding) on any machine, CI included.

``--devices`` picks among them: ``all``, a count ``N`` (the first N), or indices ``0,2,3``. On
CPUs ``all`` is not one worker per slot but `cpu_layout`'s: one worker per NUMA node, with that
node's cores as its threads — what CPU training guides advise, since intra-op threads inside one
memory domain beat processes that all-reduce gradients between them (on this project's 2-core box,
1 worker of 2 threads ran ResNet-18 1.05x as fast as 2 workers of 1, the demo's convnet as fast;
docs/benchmarks.md, "Throughput").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from deskpod.environment import Environment
from deskpod.errors import DeviceError

DeviceKind = Literal["cuda", "cpu"]


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator, or one CPU worker slot."""

    kind: DeviceKind
    index: int
    """Index among this process's visible devices of this kind (what ``--devices`` names)."""
    name: str
    memory_bytes: int
    """Device memory for a GPU; the slot's share of host memory for a CPU slot."""
    uuid: str = ""
    threads: int = 1
    """Intra-op threads a worker on this device uses (CPU slots; 0 means torch's default)."""

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index}"


@dataclass(frozen=True, slots=True)
class Inventory:
    """All local devices of one kind, as found on this machine."""

    kind: DeviceKind
    devices: tuple[Device, ...]
    cores: int
    source: str
    """Where the facts came from: ``nvml``, ``torch`` or ``cpu``."""

    def select(self, spec: str | int | Sequence[int] = "all") -> tuple[Device, ...]:
        """Choose devices by a ``--devices`` value; see `parse_device_spec`."""
        indices = parse_device_spec(spec, len(self.devices), self.kind)
        chosen = [self.devices[i] for i in indices]
        if self.kind == "cpu":
            # The chosen slots share all the cores between them.
            per = max(1, self.cores // len(chosen))
            chosen = [replace(d, threads=per) for d in chosen]
        return tuple(chosen)


class GpuQuery(Protocol):
    """The few NVML facts deskpod needs; a seam so tests can replay a recorded answer."""

    def count(self) -> int: ...
    def name(self, i: int) -> str: ...
    def memory_bytes(self, i: int) -> int: ...
    def uuid(self, i: int) -> str: ...


class NvmlQuery:
    """`GpuQuery` over the real NVML, through ``nvidia-ml-py`` (module ``pynvml``)."""

    def __init__(self) -> None:
        import pynvml  # optional dependency: raises ImportError when absent

        pynvml.nvmlInit()  # raises pynvml.NVMLError without a driver
        self._nvml = pynvml

    def count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def _handle(self, i: int) -> object:
        return self._nvml.nvmlDeviceGetHandleByIndex(i)

    def name(self, i: int) -> str:
        return nvml_text(self._nvml.nvmlDeviceGetName(self._handle(i)))

    def memory_bytes(self, i: int) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle(i)).total)

    def uuid(self, i: int) -> str:
        return nvml_text(self._nvml.nvmlDeviceGetUUID(self._handle(i)))


def nvml_text(raw: object) -> str:
    """An NVML string: bytes from older ``nvidia-ml-py`` releases, str from newer ones."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _open_nvml() -> GpuQuery | None:
    try:
        return NvmlQuery()
    except Exception:  # no nvidia-ml-py, no driver, no GPU: all mean "ask torch instead"
        return None


def visible_gpus(all_count: int, uuids: Sequence[str], cvd: tuple[str, ...] | None) -> list[int]:
    """Physical GPU indices that ``CUDA_VISIBLE_DEVICES`` leaves visible, in its order.

    Like CUDA, the list stops at the first entry that names no device.
    """
    if cvd is None:
        return list(range(all_count))
    out: list[int] = []
    for entry in cvd:
        if entry.lstrip("-").isdigit():
            i = int(entry)
            if not 0 <= i < all_count:
                break
            out.append(i)
            continue
        match = [i for i, u in enumerate(uuids) if u.startswith(entry) or u.startswith("GPU-" + entry)]
        if len(match) != 1:
            break
        out.append(match[0])
    return out


def discover_gpus(query: GpuQuery | None, env: Environment) -> tuple[Device, ...]:
    """The GPUs this process can see, via NVML when given, else via torch."""
    if query is not None:
        n = query.count()
        uuids = [query.uuid(i) for i in range(n)]
        physical = visible_gpus(n, uuids, env.cuda_visible_devices)
        return tuple(Device("cuda", k, query.name(p), query.memory_bytes(p), uuids[p]) for k, p in enumerate(physical))
    import torch

    if not torch.cuda.is_available():
        return ()
    devices = []
    for k in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(k)
        devices.append(Device("cuda", k, props.name, int(props.total_memory), str(getattr(props, "uuid", ""))))
    return tuple(devices)


def cpu_slots(env: Environment, count: int | None = None) -> tuple[Device, ...]:
    """CPU worker slots: one per core and at least two, unless ``count`` says otherwise."""
    n = count if count is not None else max(2, env.cpu_count)
    memory = host_memory_bytes()
    return tuple(Device("cpu", i, "cpu", memory // n, threads=max(1, env.cpu_count // n)) for i in range(n))


@dataclass(frozen=True, slots=True)
class CpuLayout:
    """How ``--devices all`` lays workers over a CPU box's cores (`cpu_layout`)."""

    devices: tuple[Device, ...]
    cores: tuple[tuple[int, ...], ...]
    """Per worker, the cores to pin it to; empty when the workers run unpinned (one node, or cores the
    pod service shares out without naming them)."""
    reason: str


def cpu_layout(inv: Inventory, numa: Sequence[Sequence[int]], *, pin: bool = True) -> CpuLayout:
    """One worker per NUMA node of ``numa`` (this process's cores by node: `affinity.numa_nodes`),
    each with the node's cores as threads — at most one per slot of ``inv``.

    ``pin`` pins each worker to its node's cores; the launcher turns it off when the pod service gave
    the job only some of the box's slots, whose cores it does not name.
    """
    if inv.kind != "cpu":
        raise DeviceError(f"cpu_layout: the inventory holds {inv.kind} devices, not CPU slots")
    nodes = [tuple(n) for n in numa if n] or [tuple(range(inv.cores))]
    workers = max(1, min(len(nodes), len(inv.devices)))
    per = max(1, inv.cores // workers)
    total = sum(d.memory_bytes for d in inv.devices)
    devices = tuple(Device("cpu", i, "cpu", total // workers, threads=per) for i in range(workers))
    pinned = pin and workers > 1 and workers == len(nodes)
    where = f"{len(nodes)} NUMA node{'s' if len(nodes) != 1 else ''}"
    reason = (f"{workers} worker{'s' if workers != 1 else ''} of {per} thread{'s' if per != 1 else ''} "
              f"({inv.cores} cores, {where}{', each worker pinned to its node' if pinned else ''})")  # fmt: skip
    return CpuLayout(devices, tuple(nodes[:workers]) if pinned else (), reason)


def host_memory_bytes() -> int:
    """The box's memory (``MemTotal`` of ``/proc/meminfo``) in bytes; 0 when unknown."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def discover(env: Environment | None = None, *, query: GpuQuery | None = None, use_nvml: bool = True) -> Inventory:
    """Find this machine's accelerators: GPUs if any, else CPU slots."""
    env = env or Environment.read()
    if query is None and use_nvml:
        query = _open_nvml()
    gpus = discover_gpus(query, env)
    if gpus:
        return Inventory("cuda", gpus, env.cpu_count, "nvml" if query is not None else "torch")
    return cpu_inventory(env)


def cpu_inventory(env: Environment) -> Inventory:
    """This box's CPU slots, or those the pod service gave this job (``DESKPOD_CPU_SLOTS``) with their cores."""
    slots = cpu_slots(env)
    if env.cpu_slots is not None:
        # The pod service gave this job some of the box's CPU slots (DESKPOD_CPU_SLOTS): only those are
        # ours, with the cores they stand for. A pod that pins its jobs (a cpuset: this process's affinity is
        # the job's cores) numbers them from 0 among the job's own, as CUDA numbers a sandboxed job's GPUs:
        # the affinity then holds as many slots as the job has, one core each.
        bad = [i for i in env.cpu_slots if not 0 <= i < len(slots)]
        if bad or not env.cpu_slots:
            raise DeviceError(
                f"DESKPOD_CPU_SLOTS names slot {bad[0] if bad else 'none'}; this process may run on "
                f"{env.cpu_count} core{'s' if env.cpu_count != 1 else ''}, slots 0-{len(slots) - 1} (in a job pinned "
                "to its cores the slots are numbered from 0)"
            )
        mine = tuple(replace(slots[i], index=k) for k, i in enumerate(env.cpu_slots))
        return Inventory("cpu", mine, sum(s.threads for s in mine), "cpu")
    return Inventory("cpu", slots, env.cpu_count, "cpu")


def _decimal(text: str) -> bool:
    """ASCII digits, few enough for a device count or index: ``str.isdigit`` also takes ``"¹"`` (which ``int``
    refuses) and ``"٣"`` (which it reads as 3), and ``int`` refuses more than 4,300 digits."""
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


def parse_device_spec(spec: str | int | Sequence[int], available: int, kind: str = "cuda") -> list[int]:
    """Turn ``all``, ``N`` or ``0,2,3`` into device indices, or raise `DeviceError` naming what is valid."""
    what = "GPU" if kind == "cuda" else "CPU worker slot"
    have = f"this machine has {available} {what}{'s' if available != 1 else ''}"
    if isinstance(spec, int):
        spec = str(spec)
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text in ("all", ""):
            return list(range(available))
        if "," not in text and _decimal(text):
            n = int(text)
            if n < 1:
                raise DeviceError(
                    f"--devices {spec!r}: asks for no device; use 'all', a count from 1 to {available}, or indices like 0,1"
                )
            if n > available:
                raise DeviceError(f"--devices {spec!r}: asks for {n} devices but {have} (indices 0-{available - 1})")
            return list(range(n))
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or not all(_decimal(p) for p in parts):
            raise DeviceError(
                f"--devices {spec!r}: not a device list; use 'all', a count like 2, or indices like 0,2,3"
            )
        indices = [int(p) for p in parts]
    else:
        indices = [int(i) for i in spec]
    bad = [i for i in indices if not 0 <= i < available]
    if bad:
        raise DeviceError(f"--devices {spec!r}: no device {bad[0]}; {have} (indices 0-{available - 1})")
    if len(set(indices)) != len(indices):
        raise DeviceError(f"--devices {spec!r}: a device is named twice")
    return indices


def iter_describe(devices: Sequence[Device]) -> Iterator[str]:
    """One line per device for summaries: ``cuda:0  NVIDIA H200  139.6 GiB``."""
    for d in devices:
        mem = f"{d.memory_bytes / 2**30:.1f} GiB"
        extra = f"  {d.threads} thread{'s' if d.threads != 1 else ''}" if d.kind == "cpu" else ""
        yield f"{d.label:<7} {d.name}  {mem}{extra}"


def driver_version() -> str | None:
    """The NVIDIA driver's version (NVML), or None on a box without one."""
    query = _open_nvml()
    if not isinstance(query, NvmlQuery):
        return None
    try:
        return nvml_text(query._nvml.nvmlSystemGetDriverVersion())
    except Exception:  # an NVML too old to say: unknown, like no driver
        return None
