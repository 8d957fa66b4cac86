"""Which NIC and which CPU cores each local rank of a node should use, from the topology model.

The launcher gives every local rank all the node's GPUs and rank ``r`` uses GPU ``r`` (or
``devices[r]`` when the job got an explicit device list): NCCL fails when each rank sees only its
own GPU, so binding happens through the environment, not through ``CUDA_VISIBLE_DEVICES``.

For that GPU, `rank_affinity` picks:

* **the NIC** with the shortest PCIe path to it (`Topology.nearest_nics`). When several NICs are
  equally near (a DGX A100 has two beside each GPU pair), ranks are spread over them: each rank
  takes the least-loaded NIC of its tie set, counting the lower local ranks already placed, ties
  broken in the topology's NIC order. For ranks sharing one tie set that is ``tie[k % len(tie)]``
  for the k-th of them, so two GPUs never pile on one NIC while an equally near one is idle. On a
  DGX-1 this gives GPUs 0-1 mlx5_0, 2-3 mlx5_1, 4-5 mlx5_2, 6-7 mlx5_3 (each pair's PIX NIC);
* **the environment** that pins the rank's traffic to that NIC: ``NCCL_IB_HCA`` and
  ``UCX_NET_DEVICES`` (see `nic_env`);
* **the CPU cores** local to the GPU (``CPU Affinity`` of ``nvidia-smi topo -m``), as a list the
  launcher hands to ``os.sched_setaffinity``; there is no standard variable for it.

A topology without NICs (CPU boxes, workstations) gets no NIC variables: a NIC is never invented.
Neither does one whose NICs are only ``NIC0``-style placeholders (a matrix printed without its NIC
Legend): those are not device names NCCL or UCX could match.

``OMP_NUM_THREADS`` is deliberately not set: the cores listed belong to a NUMA node that several
ranks share (four per socket on a DGX-1), and how many threads a rank runs is the trainer's choice
(deskpod's launcher already sets it for CPU workers); a value here would silently override it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deskpod.errors import DeviceError, UsageError
from deskpod.hardware.topology import Topology

IB_PORT = 1
"""The port named in ``UCX_NET_DEVICES``. InfiniBand ports count from 1, and mlx5 exposes every
physical port as its own device (a dual-port ConnectX is mlx5_0 and mlx5_1), each with port 1."""

_PLACEHOLDER_NIC = re.compile(r"^NIC\d+$", re.IGNORECASE)
_CPU_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$", re.ASCII)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The cores of a Linux CPU list such as ``0-19,40-59``, sorted and without repeats.

    `UsageError` naming the text and the bad item otherwise (empty text, ``N/A``, ``5-3``, ``0-``).
    """
    items = [item.strip() for item in text.strip().split(",")]
    if not text.strip():
        raise UsageError(f"CPU list {text!r} is empty; expected cores like 0-19,40-59")
    cores: set[int] = set()
    for item in items:
        m = _CPU_ITEM.match(item)
        if not m:
            raise UsageError(f"CPU list {text!r}: {item!r} is not a core or a range; expected cores like 0-19,40-59")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise UsageError(f"CPU list {text!r}: range {item!r} runs backwards; write it {last}-{first}")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


NODE_DIR = Path("/sys/devices/system/node")
"""Where Linux lists the NUMA nodes (``node<N>/cpulist``)."""


def numa_nodes(allowed: Iterable[int], node_dir: Path | None = None) -> tuple[tuple[int, ...], ...]:
    """The cores of ``allowed`` grouped by NUMA node, in node order; nodes without one of them are left out.

    Where the kernel lists no nodes (not Linux, some containers) every allowed core is one node, and a
    core no node lists joins the first group: nothing allowed is dropped.
    """
    cores = set(allowed)
    nodes: list[tuple[int, tuple[int, ...]]] = []
    with contextlib.suppress(OSError):
        for entry in (node_dir or NODE_DIR).iterdir():
            m = re.fullmatch(r"node(\d+)", entry.name)
            if not m:
                continue
            try:
                text = (entry / "cpulist").read_text().strip()
            except OSError:
                continue
            mine = tuple(c for c in parse_cpu_list(text) if c in cores) if text else ()
            if mine:
                nodes.append((int(m.group(1)), mine))
    groups = [g for _, g in sorted(nodes)]
    listed = {c for g in groups for c in g}
    rest = tuple(sorted(cores - listed))
    if not groups:
        return (rest,) if rest else ()
    if rest:
        groups[0] = tuple(sorted((*groups[0], *rest)))
    return tuple(groups)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of `parse_cpu_list`: ``(0, 1, 2, 5)`` -> ``0-2,5``."""
    parts: list[str] = []
    for _, run in itertools.groupby(enumerate(sorted(set(cpus))), key=lambda ic: ic[1] - ic[0]):  # runs of +1
        cores = [c for _, c in run]
        parts.append(str(cores[0]) if len(cores) == 1 else f"{cores[0]}-{cores[-1]}")
    return ",".join(parts)


def nic_env(nic: str) -> dict[str, str]:
    """The variables that keep one rank's inter-node traffic on ``nic``.

    ``NCCL_IB_HCA`` takes a list of HCA-name *prefixes* unless it starts with ``=`` (NCCL's
    environment-variable docs; the modifier came with NVIDIA/nccl PR #236). A bare ``mlx5_1`` also
    matches ``mlx5_10`` and ``mlx5_11`` on a 12-HCA DGX A100, so the exact form ``=mlx5_1`` is
    used. No ``:port`` is given to NCCL: the topology knows devices, not ports, and NCCL only uses
    the active ports of the HCAs it is allowed. ``UCX_NET_DEVICES`` names UCX resources, which
    are ``device:port`` (``mlx5_1:1``), so the port is required there (see `IB_PORT`).
    """
    return {"NCCL_IB_HCA": f"={nic}", "UCX_NET_DEVICES": f"{nic}:{IB_PORT}"}


@dataclass(frozen=True, slots=True)
class RankAffinity:
    """What one local rank gets: its device, its NIC, its cores and the environment to set."""

    local_rank: int
    device: int
    """Index of the rank's device in the topology (GPU ``device``)."""
    label: str
    """The device's name: ``GPU3``, or ``cpu:0`` on a CPU box."""
    nic: str | None
    """The NIC chosen for this rank; None when the topology has no usable NIC."""
    nearest_nics: tuple[str, ...]
    """Every NIC as near to the device as the chosen one (the tie set), in the topology's order."""
    nic_path: str
    """The PCIe path class from the device to the chosen NIC (``PIX`` … ``SYS``), or empty."""
    cpus: tuple[int, ...]
    """Cores local to the device; empty when the topology does not know its CPU affinity."""
    numa_node: int | None
    env: dict[str, str] = field(default_factory=dict)
    """Variables to export for this rank (``NCCL_IB_HCA``, ``UCX_NET_DEVICES``), empty without a NIC."""
    reason: str = ""
    """One line saying what was chosen and why."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able form: every field, plus ``cpu_list`` (the cores as ``0-19,40-59``)."""
        return {
            "local_rank": self.local_rank,
            "device": self.device,
            "label": self.label,
            "nic": self.nic,
            "nearest_nics": list(self.nearest_nics),
            "nic_path": self.nic_path,
            "cpus": list(self.cpus),
            "cpu_list": format_cpu_list(self.cpus),
            "numa_node": self.numa_node,
            "env": dict(self.env),
            "reason": self.reason,
        }


def rank_devices(topology: Topology, devices: Sequence[int] | None = None) -> tuple[int, ...]:
    """The device of each local rank: ``devices`` checked against the topology, or all of them in order."""
    n = topology.device_count
    if devices is None:
        return tuple(range(n))
    chosen = tuple(devices)
    if not chosen:
        raise DeviceError(f"empty device list for {topology.name!r}; give indices in 0-{n - 1}, e.g. 0,1")
    seen: set[int] = set()
    for d in chosen:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < n:
            raise DeviceError(f"device {d!r} is not on {topology.name!r}: it has {n} devices, valid 0-{n - 1}")
        if d in seen:
            raise DeviceError(f"device {d} appears twice in the device list {list(chosen)}; each rank needs its own")
        seen.add(d)
    return chosen


def node_affinity(topology: Topology, devices: Sequence[int] | None = None) -> tuple[RankAffinity, ...]:
    """`RankAffinity` of every local rank of a node, rank 0 first."""
    chosen = rank_devices(topology, devices)
    usable = bool(topology.nics) and not any(_PLACEHOLDER_NIC.match(nic.name) for nic in topology.nics)
    load = {nic.name: 0 for nic in topology.nics}
    out: list[RankAffinity] = []
    for rank, device in enumerate(chosen):
        tie = topology.nearest_nics(device)
        nic: str | None = None
        if usable and tie:
            nic = min(tie, key=lambda name: (load[name], tie.index(name)))
            load[nic] += 1
        out.append(_rank(topology, rank, device, nic, tie if usable else (), usable))
    return tuple(out)


def rank_affinity(topology: Topology, local_rank: int, devices: Sequence[int] | None = None) -> RankAffinity:
    """What local rank ``local_rank`` of a node with this topology gets (see the module docstring).

    `DeviceError` for a local rank outside the ranks the device list gives, or a bad device list.
    """
    chosen = rank_devices(topology, devices)
    if isinstance(local_rank, bool) or not isinstance(local_rank, int) or not 0 <= local_rank < len(chosen):
        where = f"the device list {list(chosen)} gives" if devices is not None else f"its {len(chosen)} devices give"
        raise DeviceError(
            f"local rank {local_rank!r} is out of range on {topology.name!r}: {where} local ranks 0-{len(chosen) - 1}"
        )
    # The NIC of a rank depends on the lower ranks that share its tie set, so place them all.
    return node_affinity(topology, chosen)[local_rank]


def _rank(
    topology: Topology, rank: int, device: int, nic: str | None, tie: tuple[str, ...], usable: bool
) -> RankAffinity:
    info = topology.devices[device]
    cpus = parse_cpu_list(info.cpu_affinity) if info.cpu_affinity else ()
    path = ""
    if nic is not None:
        path = next(n for n in topology.nics if n.name == nic).paths[device]
        others = [name for name in tie if name != nic]
        tied = f", as near as {', '.join(others)}: spread by local rank" if others else ""
        nic_text = f"nearest NIC {nic} ({path}{tied})"
    elif not topology.nics:
        nic_text = f"no NIC in the topology of {topology.name!r}, so no NIC variables"
    elif not usable:
        names = ", ".join(n.name for n in topology.nics)
        nic_text = f"NICs named only {names} (the matrix has no NIC Legend), so no NIC variables"
    else:  # pragma: no cover - every NIC has a path to every device, so a tie set is never empty
        nic_text = "no NIC reachable"
    cpu_text = f"CPUs {info.cpu_affinity.strip()}" if cpus else "CPUs unknown (no CPU affinity in the topology)"
    numa_text = f", NUMA node {info.numa_node}" if info.numa_node is not None else ""
    return RankAffinity(
        local_rank=rank,
        device=device,
        label=info.label,
        nic=nic,
        nearest_nics=tie,
        nic_path=path,
        cpus=cpus,
        numa_node=info.numa_node,
        env=nic_env(nic) if nic is not None else {},
        reason=f"local rank {rank}: {info.label}, {nic_text}, {cpu_text}{numa_text}",
    )


def pin_rank(affinity: Mapping[str, Any] | None) -> None:
    """Apply one local rank's entry of the launcher's affinity map to this process, before NCCL starts: its
    NIC's variables (``NCCL_IB_HCA``, ``UCX_NET_DEVICES``; a variable the user set already wins) and its CPU
    cores (those this process may not use are left out)."""
    if not affinity:
        return
    for key, value in dict(affinity.get("env") or {}).items():
        os.environ.setdefault(str(key), str(value))
    allowed = os.sched_getaffinity(0)
    cpus = {int(c) for c in affinity.get("cpus") or ()} & allowed
    if cpus:
        os.sched_setaffinity(0, cpus)
