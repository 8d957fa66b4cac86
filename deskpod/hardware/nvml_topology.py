"""This box's topology, live: NVML (through ``nvidia-ml-py``) on a GPU box, CPU slots otherwise.

NVML gives, per GPU, its NVLinks (state, and the PCI id at the far end of each link), the PCIe
common ancestor of any two GPUs, its CPU affinity and NUMA node. From those we build the same
tokens ``nvidia-smi topo -m`` prints and hand them to the same model:

* links whose far end is another GPU are counted per pair: ``NV#`` direct links;
* links whose far end is not a GPU end in an NVSwitch: the GPU's count of those is its ``NV#`` to the
  fabric, and two fabric GPUs reach each other at that rate;
* GPUs without NVLink between them get the PCIe class of their common ancestor.

`TopologyQuery` is the seam: tests replay a recorded-shaped fake; `NvmlTopologyQuery` is the real one.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from deskpod.hardware.affinity import format_cpu_list
from deskpod.hardware.devices import GpuQuery, NvmlQuery, nvml_text
from deskpod.hardware.topology import (
    GPU_LINK_MODELS,
    DeviceInfo,
    Topology,
    build_links,
    cpu_topology,
    infer_link_model,
    link_model_for,
)

# NVML_TOPOLOGY_* common-ancestor levels -> nvidia-smi path class.
ANCESTOR_PATH = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


class TopologyQuery(GpuQuery, Protocol):
    """The NVML facts a topology needs: `GpuQuery`'s, and the links between the GPUs."""

    def bus_id(self, i: int) -> str: ...
    def compute_capability(self, i: int) -> str: ...
    def nvlink_remotes(self, i: int) -> list[str]:
        """PCI bus id at the far end of each *active* NVLink of GPU ``i`` (one entry per link)."""
        ...

    def common_ancestor(self, i: int, j: int) -> int:
        """NVML_TOPOLOGY_* level of the closest common PCIe ancestor (0 internal … 50 system)."""
        ...

    def cpu_affinity(self, i: int) -> str: ...
    def numa_node(self, i: int) -> int | None: ...


def _norm_bus(bus: str) -> str:
    """``00000000:06:00.0`` and ``0000:06:00.0`` name the same device."""
    b = bus.strip().lower()
    return b[-12:] if len(b) >= 12 else b


class NvmlTopologyQuery(NvmlQuery):
    """`TopologyQuery` over the real NVML."""

    def bus_id(self, i: int) -> str:
        return nvml_text(self._nvml.nvmlDeviceGetPciInfo(self._handle(i)).busId)

    def compute_capability(self, i: int) -> str:
        major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(self._handle(i))
        return f"{major}.{minor}"

    def nvlink_remotes(self, i: int) -> list[str]:
        out = []
        for link in range(self._nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if self._nvml.nvmlDeviceGetNvLinkState(self._handle(i), link) != self._nvml.NVML_FEATURE_ENABLED:
                    continue
                out.append(nvml_text(self._nvml.nvmlDeviceGetNvLinkRemotePciInfo(self._handle(i), link).busId))
            except self._nvml.NVMLError:
                continue  # link absent or not supported on this GPU
        return out

    def common_ancestor(self, i: int, j: int) -> int:
        return int(self._nvml.nvmlDeviceGetTopologyCommonAncestor(self._handle(i), self._handle(j)))

    def cpu_affinity(self, i: int) -> str:
        import os

        words = (os.cpu_count() or 64) // 64 + 1
        try:
            mask = self._nvml.nvmlDeviceGetCpuAffinity(self._handle(i), words)
        except self._nvml.NVMLError:
            return ""
        cpus = [w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]
        return format_cpu_list(cpus)

    def numa_node(self, i: int) -> int | None:
        path = Path("/sys/bus/pci/devices") / self.bus_id(i).lower()[-12:] / "numa_node"
        with contextlib.suppress(OSError, ValueError):
            node = int(path.read_text().strip())
            return node if node >= 0 else None
        return None


def topology_from_query(query: TopologyQuery, name: str = "local", visible: Sequence[int] | None = None) -> Topology:
    """Build a `Topology` from NVML facts (or a fake that answers the same questions).

    ``visible`` lists the physical GPUs this process sees (``CUDA_VISIBLE_DEVICES`` order); device
    ``k`` of the topology is ``visible[k]``, matching `deskpod.hardware.devices.discover`.
    """
    physical = list(range(query.count())) if visible is None else list(visible)
    n = len(physical)
    buses = [_norm_bus(query.bus_id(p)) for p in physical]
    all_buses = {_norm_bus(query.bus_id(p)) for p in range(query.count())}
    gpu_of = {b: i for i, b in enumerate(buses)}
    pair_links = [[0] * n for _ in range(n)]
    fabric_links = [0] * n
    for i, p in enumerate(physical):
        for remote, count in Counter(_norm_bus(r) for r in query.nvlink_remotes(p)).items():
            j = gpu_of.get(remote)
            if j is not None and j != i:
                pair_links[i][j] += count
            elif remote not in all_buses:
                fabric_links[i] += count  # the far end is not a GPU: an NVSwitch
    tokens = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            if fabric_links[i] and fabric_links[j]:
                tokens[i][j] = f"NV{min(fabric_links[i], fabric_links[j])}"
            elif pair_links[i][j]:
                tokens[i][j] = f"NV{min(pair_links[i][j], pair_links[j][i]) or pair_links[i][j]}"
            else:
                level = query.common_ancestor(physical[min(i, j)], physical[max(i, j)])
                tokens[i][j] = ANCESTOR_PATH.get(level, "SYS")
    names = [query.name(p) for p in physical]
    try:
        model = link_model_for(names[0])
    except Exception:
        most = max(max(fabric_links), max(sum(row) for row in pair_links))
        model = infer_link_model(most, any(fabric_links), most > 0)
    links, fabric = build_links(tokens, model, fabric=any(fabric_links))
    devices = tuple(
        DeviceInfo(
            i,
            f"GPU{i}",
            model=names[i],
            memory_gb=round(query.memory_bytes(p) / 1e9, 1),
            compute_capability=query.compute_capability(p),
            numa_node=query.numa_node(p),
            cpu_affinity=query.cpu_affinity(p),
        )
        for i, p in enumerate(physical)
    )
    return Topology(name, devices, links, kind="cuda", link_model=model, fabric=fabric, source="nvml")


def _open_query() -> TopologyQuery | None:
    try:
        query = NvmlTopologyQuery()
    except Exception:  # no nvidia-ml-py, no driver, no GPU
        return None
    return query if query.count() > 0 else None


def local_topology(query: TopologyQuery | None = None) -> Topology:
    """This box: live via NVML when GPUs are present, else its CPU worker slots (all pairs shared memory)."""
    from deskpod.environment import Environment
    from deskpod.hardware.devices import discover, visible_gpus

    query = query or _open_query()
    if query is not None:
        uuids = [query.uuid(p) for p in range(query.count())]
        visible = visible_gpus(query.count(), uuids, Environment.read().cuda_visible_devices)
        if visible:
            return topology_from_query(query, visible=visible)
    inventory = discover(use_nvml=False)
    if inventory.kind == "cuda":
        # GPUs seen by torch without NVML: links unknown, assume PCIe through the host bridge.
        n = len(inventory.devices)
        tokens = [["X" if a == b else "PHB" for b in range(n)] for a in range(n)]
        model = GPU_LINK_MODELS["V100"]
        links, _ = build_links(tokens, model, fabric=False)
        devices = tuple(
            DeviceInfo(d.index, f"GPU{d.index}", model=d.name, memory_gb=round(d.memory_bytes / 1e9, 1))
            for d in inventory.devices
        )
        return Topology("local", devices, links, kind="cuda", link_model=model, source="torch (links unknown)")
    slots = len(inventory.devices)
    memory = inventory.devices[0].memory_bytes / 1e9 if inventory.devices else 0.0
    return cpu_topology(slots, name="local", memory_gb=round(memory, 1))
