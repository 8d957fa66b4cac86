"""What ``deskpod topo`` says about a topology: one JSON-able description and its text form.

The JSON (schema ``deskpod.topo/1``) is for scripts; every key is documented in `describe`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from deskpod.hardware.placement import Placement, place
from deskpod.hardware.topology import Topology

SCHEMA = "deskpod.topo/1"


def nvlink_cliques(topology: Topology) -> list[list[int]]:
    """Maximal sets of GPUs with NVLink (direct or through a switch) between every pair, largest first."""
    n = topology.device_count
    adj = [{b for b in range(n) if b != a and topology.links[a][b].kind in ("nvlink", "nvswitch")} for a in range(n)]
    found: list[list[int]] = []

    def expand(r: set[int], p: set[int], x: set[int]) -> None:  # Bron-Kerbosch with a pivot
        if not p and not x:
            if len(r) >= 2:
                found.append(sorted(r))
            return
        pivot = max(p | x, key=lambda v: len(adj[v] & p))
        for v in sorted(p - adj[pivot]):
            expand(r | {v}, p & adj[v], x & adj[v])
            p = p - {v}
            x = x | {v}

    expand(set(), set(range(n)), set())
    return sorted(found, key=lambda c: (-len(c), c))


def job_sizes(topology: Topology) -> list[int]:
    """The job sizes the summary shows: 2, 4 and 8 devices, and the whole machine."""
    n = topology.device_count
    sizes = [k for k in (2, 4, 8) if k <= n]
    if n not in sizes and n > 1:
        sizes.append(n)
    return sizes


def describe(topology: Topology) -> dict[str, Any]:
    """Everything ``deskpod topo --json`` prints.

    Keys: ``schema``; ``name``; ``source``; ``kind`` (``cuda``/``cpu``); ``device_count``;
    ``link_model`` (GPU generation and per-direction rates, or null); ``fabric`` (NVSwitch, or null);
    ``devices`` (index, label, model, memory_gb, compute_capability, numa_node, cpu_affinity,
    nvlinks, nearest_nics); ``nics`` (name, gbps, paths); ``matrix`` (nvidia-smi tokens);
    ``links`` (every pair a<b: kind, token, links, bandwidth_gbps); ``nvlink_cliques``;
    ``partitions``; ``placements`` (per job size on an empty machine: devices, ring_bandwidth_gbps
    and reason, or unplaceable and ever).
    """
    n = topology.device_count
    lm = topology.link_model
    fab = topology.fabric
    placements: list[dict[str, Any]] = []
    for k in job_sizes(topology):
        result = place(topology, range(n), k)
        if isinstance(result, Placement):
            placements.append(
                {
                    "k": k,
                    "devices": list(result.devices),
                    "ring_bandwidth_gbps": result.ring_bandwidth,
                    "reason": result.reason,
                }
            )
        else:
            placements.append({"k": k, "unplaceable": result.reason, "ever": result.ever})
    return {
        "schema": SCHEMA,
        "name": topology.name,
        "source": topology.source,
        "kind": topology.kind,
        "device_count": n,
        "link_model": None
        if lm is None
        else {
            "gpu": lm.gpu,
            "nvlink_gbps_per_link": lm.nvlink_gbps,
            "pcie_gen": lm.pcie_gen,
            "pcie_gbps": lm.pcie_gbps,
            "source": lm.source,
        },
        "fabric": None
        if fab is None
        else {
            "links_per_gpu": fab.links_per_gpu,
            "link_gbps": fab.link_gbps,
            "gpu_bandwidth_gbps": fab.gpu_bandwidth,
            "switches": fab.switches,
        },
        "devices": [
            {
                **asdict(d),
                "nvlinks": topology.nvlink_degree(d.index),
                "nearest_nics": list(topology.nearest_nics(d.index)),
            }
            for d in topology.devices
        ],
        "nics": [{"name": nic.name, "gbps": nic.gbps, "paths": list(nic.paths)} for nic in topology.nics],
        "matrix": [[topology.links[a][b].token for b in range(n)] for a in range(n)],
        "links": [
            {"a": a, "b": b, "kind": lk.kind, "token": lk.token, "links": lk.links, "bandwidth_gbps": lk.bandwidth}
            for a in range(n)
            for b in range(a + 1, n)
            for lk in (topology.links[a][b],)
        ],
        "nvlink_cliques": nvlink_cliques(topology),
        "partitions": {name: [list(b) for b in blocks] for name, blocks in topology.all_partitions()},
        "placements": placements,
    }


def format_summary(info: dict[str, Any]) -> str:
    """The text summary printed under the matrix."""
    word = "GPU" if info["kind"] == "cuda" else "CPU slot"
    lines = [f"{info['name']}: {info['device_count']} {word}s (from {info['source']})"]
    lm, fab = info["link_model"], info["fabric"]
    if lm is not None:
        nvlink = (
            f"{lm['gpu']} NVLink {lm['nvlink_gbps_per_link']:g} GB/s per link per direction; "
            if lm["nvlink_gbps_per_link"]
            else "no NVLink; "
        )
        lines.append(f"  links: {nvlink}PCIe Gen{lm['pcie_gen']} x16 {lm['pcie_gbps']:g} GB/s per direction")
    if fab is not None:
        switches = f", {fab['switches']} switches" if fab["switches"] else ""
        lines.append(
            f"  NVSwitch fabric: NV{fab['links_per_gpu']} per GPU = {fab['gpu_bandwidth_gbps']:g} GB/s per direction to any peer{switches}"
        )
    cliques = info["nvlink_cliques"]
    if cliques:
        lines.append("  NVLink cliques: " + " ".join("{" + ",".join(map(str, c)) + "}" for c in cliques))
    elif info["kind"] == "cuda":
        lines.append("  NVLink cliques: none (PCIe only)")
    if info["nics"]:
        parts = []
        for d in info["devices"]:
            near = d["nearest_nics"]
            path = next(nic["paths"][d["index"]] for nic in info["nics"] if nic["name"] == near[0])
            parts.append(f"{d['label']}->{'/'.join(near)} ({path})")
        lines.append("  nearest NIC: " + ", ".join(parts))
    if info["partitions"]:
        lines.append(
            "  partitions: "
            + "; ".join(
                f"{name} " + " ".join("{" + ",".join(map(str, b)) + "}" for b in blocks)
                for name, blocks in info["partitions"].items()
            )
        )
    if info["placements"]:
        lines.append("  jobs on the empty machine (policy best):")
        for p in info["placements"]:
            if "devices" in p:
                devs = ",".join(map(str, p["devices"]))
                lines.append(
                    f"    {p['k']:>2} {word}s -> {devs}: ring {p['ring_bandwidth_gbps']:g} GB/s per direction; {p['reason']}"
                )
            else:
                lines.append(f"    {p['k']:>2} {word}s -> cannot: {p['unplaceable']}")
    return "\n".join(lines) + "\n"
