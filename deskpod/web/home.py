"""The Pod page (``/ui/``, twin ``/ui/pod.json``): every device and who holds it, live use, topology, queue.

Each device is free or held by a job (its id and user for everyone, as ``/v1/status`` says; its name
and a link for its owner and admins). Live figures: per-GPU utilization and memory from NVML where
it answers, and on every box the host's per-core utilization, memory and load average
(`deskpod.hardware.usage`). The topology is drawn on the server (`deskpod.web.topology_svg`) beside a
table of its facts: link rates, NVLink cliques, which NIC is nearest which devices, partitions and
the best placement of 2, 4 and 8 devices on the empty box.

``static/home.js`` polls ``/ui/pod/usage.json`` every 2 s and updates the page in place. That stays
cheap however many dashboards are open: one `UsageSampler` per daemon reads ``/proc`` and NVML at
most once a second for all of them, and the devices' holders are re-read from the store only when
it changed (``store.version``), so polling never queues behind the scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from deskpod.hardware.summary import describe
from deskpod.hardware.topology import Topology
from deskpod.hardware.usage import Usage, UsageSampler
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.session import ROOT, Signed, Viewer
from deskpod.web.topology_svg import link_counts, nearest_devices, nic_groups, nvlink_total, render_svg

POLL_MS = 2000
"""How often the page asks for new figures."""
SAMPLER = "home.sampler"
STATUS = "home.status"
SUMMARY = "home.topology"
ANSWERS = "home.usage_answers"


def sampler(web: Web) -> UsageSampler:
    """The daemon's one usage sampler (made on first use, shared by every page and poll)."""
    got = web.cache.get(SAMPLER)
    if got is None:
        got = web.cache.setdefault(SAMPLER, UsageSampler())
    return got  # type: ignore[no-any-return]


STATUS_MAX_AGE_S = 1.0
"""While the store keeps changing (a busy queue), the holders are re-read at most this often."""


def pod_status(web: Web, max_age_s: float = 0.0) -> dict[str, Any]:
    """`Pod.status` (holders and counts): reused while the store is unchanged, and for up to ``max_age_s``
    while it changes — the polls pass `STATUS_MAX_AGE_S`, so any number of open pages costs at most one
    read a second; a page load passes 0 and sees the store as it is."""
    version, now = web.store.version, time.monotonic()
    hit = web.cache.get(STATUS)
    if hit is not None and (hit[0] == version or now - hit[2] < max_age_s):
        return hit[1]  # type: ignore[no-any-return]
    got: dict[str, Any] = web.pod.status()
    web.cache[STATUS] = (version, got, now)
    return got


def simulated(topology: Topology | None) -> bool:
    """True when the pod schedules as a catalog machine (``deskpod up --machine``) rather than this box."""
    return topology is not None and topology.source.startswith("catalog:")


@dataclass
class DeviceRow:
    """One device: who holds it, and its live figures where NVML gives them."""

    index: int
    kind: str
    label: str
    name: str
    job: str | None
    user: str | None
    job_name: str | None
    """Only for the job's owner and admins."""
    can_open: bool
    utilization: float | None
    memory_used: int | None
    memory_total: int | None


@dataclass
class Counts:
    queued: int
    running: int
    devices: int
    free: int


def device_rows(web: Web, who: Viewer, status: dict[str, Any], usage: Usage) -> list[DeviceRow]:
    topo: Topology | None = web.pod.topology
    kind = topo.kind if topo is not None else web.pod.device_kind
    # NVML's GPUs are this box's: they are the pod's devices only when the pod schedules this box's GPUs.
    live = {g.index: g for g in usage.gpus} if kind == "cuda" and not simulated(topo) else {}
    rows = []
    for d in status["devices"]:
        i = int(d["index"])
        info = topo.devices[i] if topo is not None and i < topo.device_count else None
        mine = d["job"] is not None and (who.user.admin or d["user"] == who.user.name)
        g = live.get(i)
        model = info.model if info is not None and info.model != "cpu" else ""
        rows.append(
            DeviceRow(
                index=i,
                kind=kind,
                label=info.label if info is not None else f"{kind}:{i}",
                name=(g.name if g is not None else model) or ("CPU worker slot" if kind == "cpu" else "GPU"),
                job=d["job"],
                user=d["user"],
                job_name=d["name"] if mine else None,
                can_open=mine,
                utilization=None if g is None else g.utilization,
                memory_used=None if g is None else g.memory_used,
                memory_total=None if g is None else g.memory_total,
            )
        )
    return rows


def counts(status: dict[str, Any], devices: list[DeviceRow]) -> Counts:
    free = sum(1 for d in devices if d.job is None)
    return Counts(status["queued"], status["running"], len(devices), free)


FACTS = ("name", "source", "kind", "device_count", "link_model", "fabric", "nvlink_cliques", "partitions", "placements")
"""What the facts table shows of `describe` as it is."""
DEVICE_KEYS = ("index", "label", "model", "memory_gb", "numa_node", "cpu_affinity", "nvlinks", "nearest_nics")
"""What the facts table shows of each device (`describe`'s rows without the pair matrix)."""


def topology_summary(web: Web, topology: Topology) -> dict[str, Any]:
    """The facts table's data (``describe`` without the pair matrix), computed once per topology."""
    hit = web.cache.get(SUMMARY)
    if hit is not None and hit[0] is topology:
        return hit[1]  # type: ignore[no-any-return]
    info = describe(topology)
    groups, far = nic_groups(topology)
    wired = {nic.name for _, nics in groups for nic in nics}
    nics = []
    for nic in topology.nics:
        near = nearest_devices(topology, nic)
        nics.append(
            {
                "name": nic.name,
                "gbps": nic.gbps,
                "nearest": near,
                "nearest_labels": [topology.devices[i].label for i in near],
                "path": nic.paths[near[0]],
                "near_gpus": nic.name in wired,
            }
        )
    summary = {
        **{k: info[k] for k in FACTS},
        "simulated": simulated(topology),
        "models": sorted({d.model for d in topology.devices if d.model and d.model != "cpu"}),
        "memory_gb": max((d.memory_gb for d in topology.devices), default=0.0),
        "link_counts": link_counts(topology),
        "nvlinks": nvlink_total(topology),
        "nics": nics,
        "far_nics": [nic.name for nic in far],
        "devices": [{k: d[k] for k in DEVICE_KEYS} for d in info["devices"]],
    }
    web.cache[SUMMARY] = (topology, summary)
    return summary


@dataclass
class PodUsage:
    """What the page's script polls (``/ui/pod/usage.json``): live figures, the devices' holders, the queue counts."""

    usage: dict[str, Any]
    """`Usage.to_json`."""
    devices: list[DeviceRow]
    counts: Counts


@dataclass
class PodPage(PodUsage):
    """The Pod page's data (and its twin ``/ui/pod.json``): the polled part, and the topology's facts."""

    topology: dict[str, Any] | None
    """`topology_summary`; None when the pod knows no topology."""
    runs_on: str
    """The kind of device jobs run on (``cuda``, ``cpu``), which a catalog machine's topology does not say."""


def usage_data(web: Web, who: Viewer, max_age_s: float = 0.0) -> PodUsage:
    usage = sampler(web).latest()
    status = pod_status(web, max_age_s)
    devices = device_rows(web, who, status, usage)
    return PodUsage(usage.to_json(), devices, counts(status, devices))


def pod_data(web: Web, who: Viewer) -> PodPage:
    now = usage_data(web, who)
    topo: Topology | None = web.pod.topology
    summary = None if topo is None else topology_summary(web, topo)
    return PodPage(now.usage, now.devices, now.counts, topology=summary, runs_on=web.pod.device_kind)


def register(app: FastAPI, web: Web) -> None:
    sampler(web)  # its first /proc/stat sample now, so the first page shows a real delta

    @app.get("/pod.json")
    @app.get("/")
    def home_page(request: Request, who: Signed) -> Response:
        data = pod_data(web, who)
        extra: dict[str, Any] = {"config": {"usage_url": f"{ROOT}/pod/usage.json", "interval_ms": POLL_MS}}
        topo: Topology | None = web.pod.topology
        if topo is not None and not render.wants_json(request):
            held = {d.index: str(d.job) for d in data.devices if d.job is not None}
            extra["picture"] = render_svg(topo, held=held)
        return render.page(request, "home.html", data, who, title="Pod", extra=extra)

    @app.get("/pod/usage.json")
    async def usage(who: Signed) -> Response:
        """The poll of every open Pod page: one answer per user and second, served from memory to the rest."""
        key, now = (who.user.name, who.user.admin), time.monotonic()
        answers: dict[tuple[str, bool], tuple[float, bytes]] = web.cache.setdefault(ANSWERS, {})
        hit = answers.get(key)
        if hit is None or now - hit[0] >= STATUS_MAX_AGE_S:
            data = await run_in_threadpool(usage_data, web, who, STATUS_MAX_AGE_S)
            hit = answers[key] = (now, render.json_text(data, separators=(",", ":")).encode())
        return Response(hit[1], media_type="application/json", headers={"Cache-Control": "no-store"})
