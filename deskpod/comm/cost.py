"""The alpha-beta cost model: how long a collective takes on a machine model, within and across nodes.

``time = latency + bytes on the bottleneck / bandwidth``, the model NCCL's own tuner uses to pick an
algorithm and protocol (NVIDIA/nccl ``src/graph/tuning.cc``), with its published constants:

* latency (alpha), microseconds: a base per algorithm and protocol, plus a per-hop figure for
  NVLink, PCIe and the network, times the hops a step sequence crosses. The constants below are
  NCCL 2.4-era ``baseLat`` and ``hwLat`` from ``tuning.cc``.
* bandwidth (beta): the rings' total bandwidth within a node (`deskpod.comm.rings`); across nodes
  the bottleneck of that and the node's network bandwidth, which counts only the NICs nearest the
  GPUs in use (GPU-NIC affinity: two GPUs behind one PCIe switch reach one NIC, all eight of a
  DGX-1 reach four). Each protocol carries a fraction of the wire: LL sends a flag with every
  8 bytes (1/2), LL128 one per 128-byte line (120/128), Simple all of it.
* an ``efficiency`` (default 1.0: the link-rate bound) scales the bandwidth; the planner fits its own.

Ring steps per collective (nccl-tests / NCCL): all-reduce 2(n-1) of S/n, all-gather and
reduce-scatter n-1 of S/n, broadcast a pipelined chain; so the time is ``factor x S / busbw`` with
nccl-tests' bus factor, which makes predicted and measured busbw directly comparable. All-reduce
across nodes may instead use the double binary tree (latency grows with log2 of the node count;
NCCL's tuner gives the tree half the bus bandwidth as algbw), and the faster of the two wins, as in
NCCL. All-to-all is point-to-point: each rank sends S/n to every peer, over each pair's own link
(NVLink) or sharing its one PCIe port, and across nodes through the node's NICs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from deskpod.comm.collectives import COLLECTIVES, CollectiveName, bus_factor
from deskpod.comm.rings import RingSet, build_rings, tree_depth
from deskpod.errors import UsageError
from deskpod.hardware.topology import Topology

Protocol = Literal["LL", "LL128", "Simple"]
Hop = Literal["nvlink", "pci", "net"]
PROTOCOL_SHARE: dict[Protocol, float] = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
"""Payload fraction of each NCCL protocol (LL: 8-byte flag per 8 bytes of data; LL128: per 128-byte line)."""
# NVIDIA/nccl src/graph/tuning.cc (2.4-era): baseLat and hwLat, microseconds.
RING_BASE_US: dict[Protocol, float] = {"LL": 3.6, "LL128": 3.6, "Simple": 8.4}
TREE_BASE_US: dict[Protocol, float] = {"LL": 4.4, "LL128": 4.4, "Simple": 0.0}
RING_HOP_US: dict[Hop, dict[Protocol, float]] = {
    "nvlink": {"LL": 0.4, "LL128": 2.5, "Simple": 5.7},
    "pci": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
    "net": {"LL": 0.9, "LL128": 2.5, "Simple": 6.6},
}
TREE_HOP_US: dict[Hop, dict[Protocol, float]] = {
    "nvlink": {"LL": 0.5, "LL128": 1.9, "Simple": 28.0},
    "pci": {"LL": 1.0, "LL128": 1.9, "Simple": 28.0},
    "net": {"LL": 5.0, "LL128": 7.5, "Simple": 50.0},
}
MAX_NODES = 100_000
"""Bound on node counts, so that a typo is an error and not an hour of arithmetic."""


@dataclass(frozen=True, slots=True)
class Network:
    """A node's network as the collectives see it."""

    nics: int
    """NICs the job's GPUs can use (the nearest ones: GPU-NIC affinity)."""
    nic_gbps: float
    """Line rate of each, Gb/s (EDR InfiniBand: 100)."""

    def __post_init__(self) -> None:
        if self.nics < 1 or self.nic_gbps <= 0:
            raise UsageError(f"a network needs at least 1 NIC of positive rate, got {self.nics} x {self.nic_gbps} Gb/s")

    @property
    def bandwidth(self) -> float:
        """GB/s per direction for the whole node."""
        return self.nics * self.nic_gbps / 8


def parse_network(text: str) -> Network:
    """``4x100`` (4 NICs of 100 Gb/s) → `Network`."""
    try:
        count, rate = text.lower().split("x")
        return Network(int(count), float(rate))
    except ValueError:
        raise UsageError(f"bad network {text!r}; write NICSxGBPS, e.g. 4x100 for four EDR InfiniBand NICs") from None


def node_network(topology: Topology, devices: Sequence[int]) -> Network | None:
    """The NICs nearest to ``devices`` (their PCIe affinity), or None when the topology has none."""
    names = {name for d in devices for name in topology.nearest_nics(d)}
    nics = [n for n in topology.nics if n.name in names and n.gbps > 0]
    if not nics:
        return None
    return Network(len(nics), min(n.gbps for n in nics))


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the model expects of one collective call."""

    collective: CollectiveName
    size: int
    ranks: int
    nodes: int
    time_s: float
    algorithm: str
    """``ring``, ``tree``, ``p2p`` (all-to-all) or ``none`` (one rank)."""
    protocol: str
    bandwidth: float
    """GB/s: the bus bandwidth bound used (rings within a node, the NICs across nodes), after efficiency."""

    @property
    def algbw(self) -> float:
        return self.size / self.time_s / 1e9 if self.time_s > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.collective, self.ranks)


def _protocols(hop: Hop) -> tuple[Protocol, ...]:
    # NCCL enables LL128 by default on NVLink only.
    return ("LL", "LL128", "Simple") if hop == "nvlink" else ("LL", "Simple")


def _a2a_unit(topology: Topology, rings: RingSet) -> float:
    """Seconds-per-GB for a rank to send one chunk to each local peer (the slowest rank)."""
    devs = rings.devices
    if rings.kind in ("fabric", "shm"):
        return (len(devs) - 1) / rings.bandwidth
    worst = 0.0
    for d in devs:
        nv = [topology.link_bandwidth(d, p) for p in devs if p != d and topology.link(d, p).kind == "nvlink"]
        pcie = [topology.link_bandwidth(d, p) for p in devs if p != d and topology.link(d, p).kind != "nvlink"]
        t = max((1 / b for b in nv), default=0.0)
        if pcie:
            t = max(t, len(pcie) / min(pcie))  # one PCIe port carries every non-NVLink peer's chunk
        worst = max(worst, t)
    return worst


def predict(
    topology: Topology,
    collective: CollectiveName,
    size: int,
    *,
    devices: Sequence[int] | None = None,
    nodes: int = 1,
    network: Network | None = None,
    efficiency: float = 1.0,
) -> Prediction:
    """Predict one ``collective`` of ``size`` bytes (nccl-tests' size) over ``devices`` of each of ``nodes`` nodes."""
    if collective not in COLLECTIVES:
        raise UsageError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if size < 1:
        raise UsageError(f"message size must be at least 1 byte, got {size}")
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"nodes must be 1..{MAX_NODES}, got {nodes}")
    if not 0 < efficiency <= 1:
        raise UsageError(f"efficiency must be in (0, 1], got {efficiency}")
    rings = build_rings(topology, devices)
    g = len(rings.devices)
    ranks = g * nodes
    if ranks == 1:
        return Prediction(collective, size, 1, 1, 0.0, "none", "-", 0.0)
    intra: Hop = rings.hop_kind
    bw = rings.bandwidth if g > 1 else float("inf")
    if nodes > 1:
        net = network or node_network(topology, rings.devices)
        if net is None:
            raise UsageError(f"{topology.name} has no NICs in its model; give the network, e.g. 4x100 (NICs x Gb/s)")
        bw = min(bw, net.bandwidth)
    bw *= efficiency
    best: Prediction | None = None

    def consider(p: Prediction) -> None:
        nonlocal best
        if best is None or p.time_s < best.time_s:
            best = p

    if collective == "all_to_all":
        unit = _a2a_unit(topology, rings) if g > 1 else 0.0
        chunk = size / ranks / 1e9
        t_intra = chunk * unit / efficiency
        t_net = 0.0
        if nodes > 1:
            t_net = g * (size / 1e9) * (ranks - g) / ranks / bw  # every byte for other nodes leaves through the NICs
        hop: Hop = "net" if nodes > 1 else intra
        lat = (RING_BASE_US["Simple"] + RING_HOP_US[hop]["Simple"]) * 1e-6
        t = lat + max(t_intra, t_net)
        return Prediction(collective, size, ranks, nodes, t, "p2p", "Simple", bw)
    steps = 2 * (ranks - 1) if collective == "all_reduce" else ranks - 1
    inter = (2 if collective == "all_reduce" else 1) * (nodes - 1)
    factor = bus_factor(collective, ranks)
    for proto in _protocols(intra):
        lat = RING_BASE_US[proto] + (steps - inter) * RING_HOP_US[intra][proto] + inter * RING_HOP_US["net"][proto]
        t = lat * 1e-6 + factor * size / 1e9 / (bw * PROTOCOL_SHARE[proto])
        consider(Prediction(collective, size, ranks, nodes, t, "ring", proto, bw))
        if collective == "all_reduce" and nodes > 1:
            tlat = TREE_BASE_US[proto] + 2 * (
                (g - 1) * TREE_HOP_US[intra][proto] + tree_depth(nodes) * TREE_HOP_US["net"][proto]
            )
            tt = tlat * 1e-6 + 2 * size / 1e9 / (bw * PROTOCOL_SHARE[proto])
            consider(Prediction(collective, size, ranks, nodes, tt, "tree", proto, bw))
    assert best is not None
    return best
