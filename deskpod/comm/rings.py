"""Rings and trees through the devices of a `Topology`, built the way NCCL builds them.

**Rings.** A ring all-reduce runs at the bandwidth of its slowest hop, and several rings run side by
side when the links allow (NCCL's "channels"). So, as NCCL's topology search does:

* Direct NVLink (DGX-1, DGX Station): find as many *link-disjoint* Hamiltonian cycles through the
  devices as the NVLinks allow — a pair with ``NV2`` may carry two cycles — each visiting every
  device once over NVLink only. Each cycle is driven in both directions (NVLink is full duplex),
  so one cycle gives two rings, each at one link's rate. The search is exact (every Hamiltonian
  cycle of the NVLink graph, then the largest packing) for up to `EXACT_LIMIT` devices.
* NVSwitch fabric: any order is a ring; what bounds it is what a GPU can push into the fabric
  (`Fabric.gpu_bandwidth`), shared by all rings. One ring stands for them, at that rate.
* No NVLink ring (PCIe boxes, or a device set the NVLink mesh cannot close): one ring in the order
  with the best bottleneck (`placement.ring_order`). Every ring would cross each GPU's one PCIe
  port, so more rings add nothing: the total is the bottleneck hop's rate.
* CPU worker slots: one ring over shared memory.

**Trees.** Across nodes NCCL uses a *double binary tree* (NCCL 2.4, "Massively Scale Your Deep
Learning Training with NCCL 2.4", NVIDIA developer blog): two binary trees over the nodes in which
every node is a leaf in at least one, so both halves of the data flow at full bandwidth while the
latency grows with log2(nodes) rather than with the node count. `double_binary_tree` builds them;
the cost model uses their depth.

Bandwidths are GB/s per direction, as in `Topology`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from deskpod.errors import UsageError
from deskpod.hardware.topology import Topology

RingKind = Literal["none", "nvlink", "fabric", "pcie", "mixed", "shm"]
EXACT_LIMIT = 10
"""Most devices for the exact cycle enumeration (an 8-GPU NVLink mesh has a few hundred cycles)."""


@dataclass(frozen=True, slots=True)
class RingSet:
    """The rings a collective over ``devices`` would use, and what each carries."""

    devices: tuple[int, ...]
    rings: tuple[tuple[int, ...], ...]
    """Each ring as a device order; data flows from each entry to the next, the last back to the first."""
    bandwidths: tuple[float, ...]
    """GB/s per direction that each ring can carry."""
    kind: RingKind
    link_rate: float = 0.0
    """GB/s of one hop's link (one NVLink, the fabric port, the PCIe port)."""

    @property
    def bandwidth(self) -> float:
        """All rings together: the bus bandwidth a large all-reduce can reach (before efficiency)."""
        return round(sum(self.bandwidths), 6)

    @property
    def hop_kind(self) -> Literal["nvlink", "pci"]:
        """Latency class of a hop (NCCL's NVLink vs PCI figures): NVLink/NVSwitch vs PCIe/shared memory."""
        return "nvlink" if self.kind in ("nvlink", "fabric") else "pci"

    def describe(self, topology: Topology) -> list[str]:
        """One line per ring, devices by label."""
        if not self.rings:
            return [f"{len(self.devices)} device: no ring needed"]
        out = [f"{len(self.rings)} ring(s), {self.kind}, {self.bandwidth:g} GB/s per direction in total"]
        for ring, bw in zip(self.rings, self.bandwidths, strict=True):
            labels = " -> ".join(topology.devices[d].label for d in ring)
            out.append(f"  {labels} -> {topology.devices[ring[0]].label}  ({bw:g} GB/s)")
        return out


def _check_devices(topology: Topology, devices: Sequence[int] | None) -> tuple[int, ...]:
    n = topology.device_count
    devs = tuple(range(n)) if devices is None else tuple(devices)
    if not devs:
        raise UsageError("a ring needs at least one device")
    bad = [d for d in devs if not 0 <= d < n]
    if bad or len(set(devs)) != len(devs):
        raise UsageError(f"bad or repeated device in {list(devs)}; {topology.name} has devices 0..{n - 1}")
    return tuple(sorted(devs))


def hamiltonian_cycles(devices: Sequence[int], capacity: dict[tuple[int, int], int]) -> list[tuple[int, ...]]:
    """Every Hamiltonian cycle (once, not per direction or rotation) over pairs with capacity >= 1."""
    devs = list(devices)
    n = len(devs)
    adj = {d: [e for e in devs if e != d and capacity.get((min(d, e), max(d, e)), 0) > 0] for d in devs}
    start = devs[0]
    out: list[tuple[int, ...]] = []
    path = [start]
    seen = {start}

    def extend() -> None:
        last = path[-1]
        if len(path) == n:
            if start in adj[last] and path[1] < path[-1]:
                out.append(tuple(path))
            return
        for nxt in adj[last]:
            if nxt not in seen:
                seen.add(nxt)
                path.append(nxt)
                extend()
                path.pop()
                seen.discard(nxt)

    extend()
    return out


def _edges(cycle: Sequence[int]) -> list[tuple[int, int]]:
    return [(min(a, b), max(a, b)) for a, b in zip(cycle, (*cycle[1:], cycle[0]), strict=True)]


def pack_cycles(cycles: list[tuple[int, ...]], capacity: dict[tuple[int, int], int], devices: Sequence[int]) -> list[tuple[int, ...]]:  # fmt: skip
    """The largest multiset of cycles whose use of each pair stays within its link count (exact search)."""
    # Upper bound: every cycle takes 2 link ends at every device.
    degree = {d: 0 for d in devices}
    for (a, b), c in capacity.items():
        if a in degree and b in degree:
            degree[a] += c
            degree[b] += c
    bound = min(degree.values()) // 2
    left = dict(capacity)
    best: list[tuple[int, ...]] = []
    chosen: list[tuple[int, ...]] = []

    def fits(cycle: tuple[int, ...]) -> bool:
        return all(left.get(e, 0) > 0 for e in _edges(cycle))

    def search(i: int) -> bool:
        nonlocal best
        if len(chosen) > len(best):
            best = list(chosen)
            if len(best) == bound:
                return True
        if len(chosen) + (len(cycles) - i) * bound <= len(best):
            return False
        for j in range(i, len(cycles)):
            if fits(cycles[j]):
                for e in _edges(cycles[j]):
                    left[e] -= 1
                chosen.append(cycles[j])
                done = search(j)  # j again: an NV2 pair may carry the same cycle twice
                chosen.pop()
                for e in _edges(cycles[j]):
                    left[e] += 1
                if done:
                    return True
        return False

    search(0)
    return best


def build_rings(topology: Topology, devices: Sequence[int] | None = None) -> RingSet:
    """The rings NCCL would build through ``devices`` (default: all), maximizing total bandwidth.

    Cached per topology and device set (the search is exact, so a PCIe box takes milliseconds).
    """
    return _build_rings(topology, _check_devices(topology, devices))


@functools.lru_cache(maxsize=512)
def _build_rings(topology: Topology, devs: tuple[int, ...]) -> RingSet:
    n = len(devs)
    if n == 1:
        return RingSet(devs, (), (), "none")
    pairs = [topology.link(a, b) for a in devs for b in devs if a != b]
    if topology.kind == "cpu" or all(lk.kind == "shm" for lk in pairs):
        bw = min(lk.bandwidth for lk in pairs)
        return RingSet(devs, (devs,), (bw,), "shm", bw)
    if topology.fabric is not None and all(lk.kind == "nvswitch" for lk in pairs):
        bw = topology.fabric.gpu_bandwidth
        return RingSet(devs, (devs,), (bw,), "fabric", bw)
    nv = {
        (a, b): topology.link(a, b).links
        for i, a in enumerate(devs)
        for b in devs[i + 1 :]
        if topology.link(a, b).kind == "nvlink"
    }
    rate = topology.link_model.nvlink_gbps if topology.link_model else 0.0
    if n == 2 and nv:
        (pair, count) = next(iter(nv.items()))
        rate = rate or topology.link(*pair).bandwidth / count
        # A 2-device ring already uses both directions of a link: one ring per bonded NVLink.
        rings = tuple((devs[0], devs[1]) for _ in range(count))
        return RingSet(devs, rings, tuple(rate for _ in rings), "nvlink", rate)
    if nv and n <= EXACT_LIMIT:
        cycles = pack_cycles(hamiltonian_cycles(devs, nv), nv, devs)
        if cycles:
            rate = rate or min(topology.link(a, b).bandwidth / c for (a, b), c in nv.items())
            both_ways = tuple(r for c in cycles for r in (c, (c[0], *reversed(c[1:]))))
            return RingSet(devs, both_ways, tuple(rate for _ in both_ways), "nvlink", rate)
    from deskpod.hardware.placement import ring_order

    order = ring_order(topology, devs)
    hops = [topology.link(order[i], order[(i + 1) % n]) for i in range(n)]
    bw = min(h.bandwidth for h in hops)
    kind: RingKind = "pcie" if all(h.kind == "pcie" for h in hops) else "mixed"
    return RingSet(devs, (order,), (bw,), kind, bw)


@dataclass(frozen=True, slots=True)
class Tree:
    """A binary tree over ranks 0..n-1: ``parent[r]`` (-1 at the root) and each rank's children."""

    parent: tuple[int, ...]

    @property
    def root(self) -> int:
        return self.parent.index(-1)

    def children(self, rank: int) -> tuple[int, ...]:
        return tuple(r for r, p in enumerate(self.parent) if p == rank)

    @property
    def depth(self) -> int:
        """Hops from the deepest leaf to the root."""
        best = 0
        for r in range(len(self.parent)):
            d, p = 0, self.parent[r]
            while p != -1:
                d, p = d + 1, self.parent[p]
            best = max(best, d)
        return best


def _bit_tree(n: int) -> tuple[int, ...]:
    """NCCL's binary tree (``ncclGetBtree``): rank 0 at the top, odd ranks are the leaves.

    A rank's parent clears its lowest set bit and sets the next one up, falling back to just
    clearing it past the last rank; so interior nodes are even and every subtree is a block.
    """
    parent = [-1] * n
    for r in range(1, n):
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        parent[r] = up if up < n else r ^ bit
    return tuple(parent)


def double_binary_tree(n: int) -> tuple[Tree, Tree]:
    """Two complementary binary trees over ``n`` nodes (NCCL 2.4's double binary tree).

    The first is `_bit_tree`; the second is it mirrored (rank r plays n-1-r) for even ``n``, shifted
    by one for odd ``n`` (as NCCL does), so a rank interior in one tree is a leaf in the other.
    """
    if n < 1:
        raise UsageError(f"a tree needs at least 1 node, got {n}")
    first = _bit_tree(n)
    mapping = [n - 1 - r for r in range(n)] if n % 2 == 0 else [(r + 1) % n for r in range(n)]
    second = [-1] * n
    for r in range(n):
        p = first[r]
        second[mapping[r]] = -1 if p == -1 else mapping[p]
    return Tree(first), Tree(tuple(second))


def tree_depth(n: int) -> int:
    """Hops from the deepest leaf to the root of `_bit_tree` over ``n`` nodes: ceil(log2 n), 0 for one node.

    (Closed form of `Tree.depth`, which walks every rank; ``tests/comm/test_rings.py`` checks they agree.)
    """
    return 0 if n <= 1 else (n - 1).bit_length()
