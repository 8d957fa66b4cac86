"""What the fleet knows of each member at one moment: a `MemberSnapshot`, made from its ``GET /v1/status``.

`Survey` asks every member at once (a thread each) and keeps the answers `Survey.ttl` seconds, so that the
members view, the routing of a burst of jobs and the dashboard cost one round of requests, not one per use. Routing
(`deskpod.fleet.routing`) and ``deskpod fleet members`` read only snapshots: a new check of a member (a doctor run,
stacks built) is a new field here, filled from its answer or, for what the fleet itself knows of the member (its
health checks, the stacks it built), by the fleet when it reads the snapshots (`deskpod.fleet.executor`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from deskpod.errors import DeskpodError
from deskpod.fleet.health import HealthCheck
from deskpod.hardware.topology import Topology, cpu_topology


@dataclass(frozen=True, slots=True)
class Holder:
    """One device of a member and who holds it."""

    index: int
    job: str | None
    user: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberSnapshot:
    """One member as its last answer showed it."""

    name: str
    url: str
    asked_at: float
    """When the fleet asked (its clock); ``free`` counts from here."""
    reachable: bool
    error: str = ""
    """Why it did not answer (when not ``reachable``)."""
    draining: bool = False
    kind: str = ""
    """Its devices' kind: ``cuda`` (GPUs) or ``cpu`` (CPU worker slots); empty for a cluster."""
    devices: tuple[Holder, ...] = ()
    topology: Topology | None = None
    """Its devices and links (from its ``nvidia-smi topo -m`` text); None for a cluster or an unreachable member."""
    free: tuple[tuple[float, int], ...] = ()
    """(seconds after ``asked_at``, devices free from then on) once its queue has been played forward by its own
    forecast; empty when it cannot tell (a long queue, a cluster's scheduler)."""
    queued: int = 0
    running: int = 0
    backend: str = "local"
    """``local`` (one box) or ``slurm`` (a cluster behind its login node)."""
    partitions: tuple[tuple[str, int, int], ...] = ()
    """A cluster's partitions: (name, nodes, GPUs per node)."""
    scratch: str = ""
    """A cluster's default scratch folder for staged datasets; empty for a box."""
    staged: tuple[str, ...] = ()
    """The datasets (source paths, as the member resolved them) staged in its scratch already
    (`deskpod.cluster.staging.StagedSources`); a box stages nothing."""
    software: Mapping[str, str | None] = field(default_factory=dict)
    """``deskpod``, ``torch``, ``cuda``, ``driver`` versions (None: not there)."""
    usage: Mapping[str, float | None] = field(default_factory=dict)
    """Its use when asked (`deskpod.jobs.pod.Pod.usage`): ``gpu`` and ``gpu_memory`` (mean percents, None without
    NVML), ``cpu`` and ``memory`` (percents), ``load`` (1-minute load average)."""
    stacks: tuple[str, ...] = ()
    """The fleet's stacks it has, ``NAME@vN`` each: the newest version whose smoke job passed there (the fleet's own
    records, `deskpod.fleet.stacks.StackStore.built`)."""
    health: HealthCheck | None = None
    """Its last health check (`deskpod.fleet.health`); None: not checked yet."""

    @property
    def held(self) -> float | None:
        """Percent of its devices held by jobs (None: it shows none)."""
        return (
            round(100 * sum(d.job is not None for d in self.devices) / len(self.devices), 1) if self.devices else None
        )

    @property
    def free_now(self) -> list[int]:
        return [d.index for d in self.devices if d.job is None]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "url": self.url, "reachable": self.reachable, "error": self.error,
            "draining": self.draining, "backend": self.backend, "kind": self.kind,
            "devices": [{"index": d.index, "job": d.job, "user": d.user} for d in self.devices],
            "machine": self.topology.name if self.topology is not None else None,
            "queued": self.queued, "running": self.running, "software": dict(self.software),
            "usage": {**self.usage, "held": self.held}, "stacks": list(self.stacks),
            "health": None if self.health is None else self.health.to_json(),
            "partitions": [{"name": n, "nodes": k, "gpus_per_node": g} for n, k, g in self.partitions],
            "scratch": self.scratch, "staged": list(self.staged),
            "asked_at": self.asked_at,
        }  # fmt: skip


def from_status(name: str, url: str, status: Mapping[str, Any], asked_at: float, draining: bool) -> MemberSnapshot:
    """A snapshot from a member's ``GET /v1/status`` answer."""
    devices = tuple(Holder(int(d["index"]), d.get("job"), d.get("user")) for d in status.get("devices", []))
    backend = status.get("backend") or {}
    topo = status.get("topology")
    kind = str(status["devices"][0]["kind"]) if devices else ""
    return MemberSnapshot(
        name=name, url=url, asked_at=asked_at, reachable=True, draining=draining, kind=kind, devices=devices,
        topology=_topology(topo) if topo and devices else None,
        free=tuple((float(t), int(k)) for t, k in status.get("free", [])),
        queued=int(status.get("queued", 0)), running=int(status.get("running", 0)),
        backend=str(backend.get("name", "local")),
        partitions=tuple((str(p["name"]), int(p["nodes"]), int(p["gpus_per_node"]))
                         for p in backend.get("partitions", [])),
        scratch=str(backend.get("scratch", "")), staged=tuple(str(p) for p in backend.get("staged", [])),
        software=dict(status.get("software") or {}), usage=dict(status.get("usage") or {}),
    )  # fmt: skip


def _topology(t: Mapping[str, Any]) -> Topology:
    """A member's topology from its status: its matrix text, or (uniform CPU slots) only their number."""
    parts = tuple((str(p), tuple(tuple(int(d) for d in b) for b in blocks)) for p, blocks in t.get("partitions", []))
    if t.get("matrix") is None:
        return replace(cpu_topology(int(t["devices"]), name=str(t["name"])), partitions=parts)
    from deskpod.hardware.topo_matrix import matrix_to_topology, parse_topo_matrix

    return matrix_to_topology(parse_topo_matrix(str(t["matrix"]), source="member"), str(t["name"]), partitions=parts)


def unreachable(name: str, url: str, error: str, asked_at: float, draining: bool) -> MemberSnapshot:
    return MemberSnapshot(name=name, url=url, asked_at=asked_at, reachable=False, error=error, draining=draining)


Ask = Callable[[str], MemberSnapshot]
"""Ask one member (by name) for its snapshot now."""


class Survey:
    """Every member's snapshot, asked concurrently and kept `ttl` seconds."""

    def __init__(self, ask: Ask, *, ttl: float = 2.0, workers: int = 32) -> None:
        self.ask, self.ttl = ask, ttl
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="deskpod-survey")
        self._cache: dict[str, MemberSnapshot] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def snapshots(self, names: Sequence[str], *, fresh: bool = False) -> list[MemberSnapshot]:
        """The members' snapshots in the order of ``names``: cached ones younger than `ttl` (unless ``fresh``),
        the others asked now, all at once."""
        now = time.time()
        with self._lock:
            have = {n: s for n, s in self._cache.items() if not fresh and now - s.asked_at < self.ttl}
        missing = [n for n in names if n not in have]
        for n, got in zip(missing, self._pool.map(self._ask, missing), strict=True):
            have[n] = got
        with self._lock:
            self._cache.update({n: have[n] for n in missing})
            for gone in set(self._cache) - set(names):
                del self._cache[gone]
        return [have[n] for n in names]

    def _ask(self, name: str) -> MemberSnapshot:
        try:
            return self.ask(name)
        except DeskpodError as e:  # the asker turns a refusal or a silence into an unreachable snapshot itself
            return unreachable(name, "", str(e), time.time(), False)

    def keep(self, name: str, snap: MemberSnapshot) -> None:
        """Keep ``snap`` as this member's answer until the one it was made from ages out (a job was sent to it, and
        ``snap`` is its answer with that job taken off, `deskpod.fleet.routing.after`): the next routing, and the
        next submit's check, need not ask it again."""
        with self._lock:
            if name in self._cache:
                self._cache[name] = snap

    def forget(self, name: str) -> None:
        """Ask this member again next time (its state changed: a job was sent to it)."""
        with self._lock:
            self._cache.pop(name, None)
