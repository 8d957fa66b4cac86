"""Placement: which k of the free devices a job should get.

The pod service calls `place` for every job. The choice, in order of what matters:

1. **Ring bandwidth** — the bottleneck link of the best ring through the set (a ring all-reduce runs
   at its slowest hop). Links compare by bandwidth, then by path class (PIX before SYS), so on a
   PCIe-only box a pair behind one switch beats a pair across sockets.
2. **Internal bandwidth** — the sum over all pairs in the set: a fully connected quad beats a
   4-ring with the same bottleneck (trees and all-to-all use every pair).
3. **What is left** — the largest NVLink clique among the devices that stay free, then the least
   NVLink bandwidth cut between the set and them, then the least bandwidth of any kind, then the fewest close paths cut: a 1-GPU job goes where
   it breaks no two-link pair (or no PCIe pair behind one switch), a 2-GPU job takes a pair whose
   partners stay paired.
4. The lowest device indices.

Policies: ``best`` also insists on an NVLink ring when the machine could ever give one for k
devices (else it says why not: "needs 4 NVLink-connected GPUs; the largest free clique has 2");
``pack`` takes the best k free devices whatever links them; ``partition:<name>`` keeps the set
inside one block of a named partition (``halves``, ``numa`` or one the catalog declares), preferring
the block with the fewest free devices so whole blocks stay free.

Speed: per topology, once, tables over every subset of devices (best ring level by a bitmask
Hamiltonian-cycle DP, internal bandwidth, largest NVLink clique) for machines of up to 12 devices;
uniform machines (NVSwitch fabrics, CPU slots) need no search. A decision is then a scan of at most
C(n, k) subsets. Bigger machines with mixed links are searched set by set (exhaustively up to
`SEARCH_LIMIT` sets, greedily beyond; PCIe-only rings are read off the PCIe tree).
`benchmarks/bench_placement.py` checks the choices against a brute-force search and times both.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from deskpod.errors import UsageError
from deskpod.hardware.catalog import machine
from deskpod.hardware.topology import Topology

__all__ = ["POLICIES", "Placement", "Unplaceable", "local_topology", "machine", "place", "ring_order"]

POLICIES = ("best", "pack", "partition:<name>")
TABLE_LIMIT = 12
"""Largest non-uniform machine that gets precomputed subset tables (2^n entries)."""
SEARCH_LIMIT = 2000
"""Beyond the tables: the most k-subsets searched exhaustively; more than that, a greedy search."""

_PATH_WORDS = {
    "PIX": "behind one switch",
    "PXB": "across switches",
    "PHB": "through a PCIe host bridge",
    "NODE": "across host bridges of one NUMA node",
    "SYS": "across NUMA nodes",
}
_SIZE_WORDS = {2: "pair", 3: "trio", 4: "quad"}


@dataclass(frozen=True, slots=True)
class Placement:
    """Devices chosen for a job."""

    devices: tuple[int, ...]
    """Chosen device indices, sorted ascending."""
    ring_bandwidth: float
    """GB/s per direction: bottleneck of the best ring through them (0.0 for one device)."""
    reason: str


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """Why a request cannot be met now (``ever=True``) or on this machine at all (``ever=False``)."""

    reason: str
    ever: bool


def local_topology() -> Topology:
    """This box: its GPUs through NVML, else its CPU worker slots (see `nvml_topology`)."""
    from deskpod.hardware.nvml_topology import local_topology as _local

    return _local()


class _Tables:
    """What `place` precomputes for one topology."""

    def __init__(self, topo: Topology) -> None:
        n = topo.device_count
        self.n = n
        pairs = {(lk.bandwidth, -lk.rank) for a in range(n) for b in range(n) if a != b for lk in (topo.links[a][b],)}
        self.levels: list[tuple[float, int]] = sorted(pairs)  # ascending: index = quality
        index = {key: i for i, key in enumerate(self.levels)}
        self.level = [
            [-1 if a == b else index[(topo.links[a][b].bandwidth, -topo.links[a][b].rank)] for b in range(n)]
            for a in range(n)
        ]
        self.bw = [[topo.links[a][b].bandwidth for b in range(n)] for a in range(n)]
        self.rank = [[topo.links[a][b].rank for b in range(n)] for a in range(n)]
        self.fast = [[a != b and topo.links[a][b].fast for b in range(n)] for a in range(n)]
        self.nvlink = [[a != b and topo.links[a][b].kind in ("nvlink", "nvswitch") for b in range(n)] for a in range(n)]
        # Closeness weight of a path class: one closer path outweighs up to 15 farther ones.
        self.close = [[0 if a == b else 16 ** (5 - self.rank[a][b]) for b in range(n)] for a in range(n)]
        self.nvlink_mask = [sum(1 << b for b in range(n) if self.nvlink[a][b]) for a in range(n)]
        self.uniform = len(self.levels) <= 1
        nvlink_levels = [self.level[a][b] for a in range(n) for b in range(n) if self.nvlink[a][b]]
        self.nvlink_min = min(nvlink_levels) if nvlink_levels else None
        self.ring: list[int] | None = None
        self.internal: list[float] | None = None
        self.internal_rank: list[int] | None = None
        self.by_size: dict[int, list[int]] = {}
        self.clique: list[int] | None = None
        """Largest NVLink clique inside each subset (tables only)."""
        self.best_ring_of_size: dict[int, int] = {}
        if not self.uniform and n <= TABLE_LIMIT:
            self._build_tables()

    def _build_tables(self) -> None:
        n = self.n
        size = 1 << n
        ring = [-1] * size
        for lvl in range(len(self.levels) - 1, -1, -1):
            adj = [sum(1 << b for b in range(n) if b != a and self.level[a][b] >= lvl) for a in range(n)]
            reach = [0] * size
            for s_mask in range(1, size):
                low = s_mask & -s_mask
                if s_mask == low:
                    reach[s_mask] = low
                    continue
                r = 0
                rest = s_mask ^ low
                while rest:
                    vbit = rest & -rest
                    rest ^= vbit
                    v = vbit.bit_length() - 1
                    if reach[s_mask ^ vbit] & adj[v]:
                        r |= vbit
                reach[s_mask] = r
                if ring[s_mask] < 0:
                    s = low.bit_length() - 1
                    count = s_mask.bit_count()
                    closes = r & adj[s] if count >= 3 else r  # a pair is its own ring
                    if closes:
                        ring[s_mask] = lvl
        internal = [0.0] * size
        internal_rank = [0] * size
        for s_mask in range(1, size):
            low = s_mask & -s_mask
            rest = s_mask ^ low
            v = low.bit_length() - 1
            add, add_rank = 0.0, 0
            m = rest
            while m:
                ubit = m & -m
                m ^= ubit
                u = ubit.bit_length() - 1
                add += self.bw[v][u]
                add_rank += self.rank[v][u]
            internal[s_mask] = internal[rest] + add
            internal_rank[s_mask] = internal_rank[rest] + add_rank
        self.ring, self.internal, self.internal_rank = ring, internal, internal_rank
        clique = [0] * size
        for s_mask in range(1, size):
            low = s_mask & -s_mask
            v = low.bit_length() - 1
            # Either v is left out, or it is in and the rest comes from its NVLink neighbours.
            clique[s_mask] = max(clique[s_mask ^ low], 1 + clique[s_mask & self.nvlink_mask[v]])
        self.clique = clique
        for k in range(1, n + 1):
            masks = [sum(1 << d for d in c) for c in itertools.combinations(range(n), k)]
            self.by_size[k] = masks
            self.best_ring_of_size[k] = max(ring[m] for m in masks)

    # Fallbacks for machines too big for the tables: the same quantities, computed per set.
    def ring_level(self, mask: int) -> int:
        if self.ring is not None:
            return self.ring[mask]
        devices = _bits(mask)
        if len(devices) < 2:
            return -1
        if self.uniform:
            return 0
        if self.nvlink_min is None:
            # PCIe only: path classes come from one PCIe tree, so a ring can visit each subtree in
            # turn and its worst hop is the worst pair of the set (the set's diameter in the tree).
            return min(self.level[a][b] for a, b in itertools.combinations(devices, 2))
        return _ring_level_dp(devices, self.level)

    def largest_clique(self, mask: int) -> int:
        """Size of the largest set inside ``mask`` with NVLink between every pair (1 without NVLink)."""
        if self.clique is not None:
            return self.clique[mask]
        if self.nvlink_min is None:
            return min(mask.bit_count(), 1)
        if self.uniform:
            return mask.bit_count()
        return _largest_clique(self, mask)

    def internal_of(self, mask: int) -> tuple[float, int]:
        if self.internal is not None and self.internal_rank is not None:
            return self.internal[mask], self.internal_rank[mask]
        devices = _bits(mask)
        pairs = list(itertools.combinations(devices, 2))
        return sum(self.bw[a][b] for a, b in pairs), sum(self.rank[a][b] for a, b in pairs)

    def can_ever_ring_on_nvlink(self, k: int) -> bool:
        if self.nvlink_min is None or k < 2:
            return False
        if self.uniform:
            return True
        if self.best_ring_of_size:
            return self.best_ring_of_size[k] >= self.nvlink_min
        return any(
            self.ring_level(sum(1 << d for d in c)) >= self.nvlink_min for c in itertools.combinations(range(self.n), k)
        )


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        b = mask & -mask
        out.append(b.bit_length() - 1)
        mask ^= b
    return out


def _ring_level_dp(devices: Sequence[int], level: list[list[int]]) -> int:
    """Best bottleneck level of a Hamiltonian cycle through ``devices`` (bitmask DP, no tables)."""
    k = len(devices)
    if k == 2:
        return level[devices[0]][devices[1]]
    full = (1 << k) - 1
    # best[mask][v]: best bottleneck of a path from devices[0] through mask ending at v.
    best: dict[tuple[int, int], int] = {(1, 0): 1 << 30}
    for mask in range(1, full + 1, 2):
        for v in range(k):
            cur = best.get((mask, v))
            if cur is None:
                continue
            for u in range(1, k):
                if mask & (1 << u):
                    continue
                val = min(cur, level[devices[v]][devices[u]])
                key = (mask | (1 << u), u)
                if val > best.get(key, -1):
                    best[key] = val
    return max(min(best[(full, v)], level[devices[v]][devices[0]]) for v in range(1, k) if (full, v) in best)


def ring_order(topology: Topology, devices: Sequence[int]) -> tuple[int, ...]:
    """An order of ``devices`` whose ring has the best bottleneck (for building rings in `comm`).

    Exhaustive over ring orders, so up to 9 devices; beyond that the index order is returned.
    """
    devs = sorted(devices)
    if len(devs) <= 3:
        return tuple(devs)
    first, rest = devs[0], devs[1:]
    best: tuple[tuple[float, int], tuple[int, ...]] | None = None
    if len(devs) > 9:
        return tuple(devs)  # factorial search too slow
    for perm in itertools.permutations(rest):
        if perm[0] > perm[-1]:
            continue  # each ring once per direction
        order = (first, *perm)
        hops = [topology.links[order[i]][order[(i + 1) % len(order)]] for i in range(len(order))]
        key = min((h.bandwidth, -h.rank) for h in hops)
        if best is None or key > best[0]:
            best = (key, order)
    assert best is not None
    return best[1]


def _tables(topology: Topology) -> _Tables:
    cache: dict[str, _Tables] = topology._cache
    if "placement" not in cache:
        cache["placement"] = _Tables(topology)
    return cache["placement"]


def _noun(topology: Topology, k: int) -> str:
    word = "GPU" if topology.kind == "cuda" else "CPU slot"
    return word if k == 1 else word + "s"


def _parse_policy(topology: Topology, policy: str) -> tuple[str, tuple[tuple[int, ...], ...]]:
    if policy in ("best", "pack"):
        return policy, ()
    if policy.startswith("partition:") and policy != "partition:":
        name = policy.split(":", 1)[1]
        return "partition", topology.partition(name)
    names = ", ".join(f"partition:{p}" for p, _ in topology.all_partitions()) or "none on this machine"
    raise UsageError(f"unknown placement policy {policy!r}; valid: best, pack, partition:<name> (here: {names})")


def place(topology: Topology, free: Collection[int], k: int, *, policy: str = "best") -> Placement | Unplaceable:
    """Choose ``k`` of the ``free`` devices; see the module docstring for the order of concerns."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UsageError(f"a placement request needs at least 1 device, got k={k!r}")
    n = topology.device_count
    mode, blocks = _parse_policy(topology, policy)
    free_set = set(free)
    bad = sorted(d for d in free_set if not isinstance(d, int) or not 0 <= d < n)
    if bad:
        raise UsageError(f"free device {bad[0]!r} does not exist; {topology.name} has devices 0-{n - 1}")
    noun = _noun(topology, k)
    if k > n:
        return Unplaceable(f"needs {k} {noun}; {topology.name} has {n}", ever=False)
    if len(free_set) < k:
        listed = ", ".join(map(str, sorted(free_set))) or "none"
        return Unplaceable(f"needs {k} {noun}; only {len(free_set)} free ({listed})", ever=True)
    t = _tables(topology)
    free_mask = sum(1 << d for d in free_set)

    if mode == "partition":
        largest = max(len(b) for b in blocks)
        pname = policy.split(":", 1)[1]
        shown = "; ".join(_span(b) for b in blocks)
        if k > largest:
            return Unplaceable(
                f"needs {k} {noun} inside one {pname!r} block ({shown}); blocks hold at most {largest}", ever=False
            )
        fits = [b for b in blocks if sum(1 for d in b if d in free_set) >= k]
        if not fits:
            most = max(sum(1 for d in b if d in free_set) for b in blocks)
            return Unplaceable(
                f"needs {k} {noun} inside one {pname!r} block ({shown}); the most free in one block is {most}",
                ever=True,
            )
        best_choice: tuple[tuple[Any, ...], int] | None = None
        for b in fits:
            bmask = sum(1 << d for d in b if d in free_set)
            cand = _choose(t, bmask, free_mask, k, required=None, extra=-bmask.bit_count())
            if cand is not None and (best_choice is None or cand[0] > best_choice[0]):
                best_choice = cand
        assert best_choice is not None
        chosen = best_choice[1]
        block = next(b for b in fits if _mask(b) & chosen == chosen)
        return _placement(topology, t, chosen, free_mask, f"inside {pname!r} block {_span(block)}: ")

    required = None
    if mode == "best" and t.can_ever_ring_on_nvlink(k):
        required = t.nvlink_min
    cand = _choose(t, free_mask, free_mask, k, required=required)
    if cand is None:
        clique = _largest_clique(t, free_mask)
        return Unplaceable(f"needs {k} NVLink-connected {noun}; the largest free clique has {clique}", ever=True)
    return _placement(topology, t, cand[1], free_mask, "")


def _mask(devices: Sequence[int]) -> int:
    return sum(1 << d for d in devices)


def _span(block: Sequence[int]) -> str:
    b = sorted(block)
    if b == list(range(b[0], b[-1] + 1)) and len(b) > 2:
        return f"{{{b[0]}-{b[-1]}}}"
    return "{" + ",".join(map(str, b)) + "}"


def _choose(
    t: _Tables, pool: int, free_mask: int, k: int, *, required: int | None, extra: int = 0
) -> tuple[tuple[Any, ...], int] | None:
    """The best k-subset of ``pool`` by the documented key, or None when none meets ``required``."""
    pool_devices = _bits(pool)
    if t.uniform:
        chosen = _mask(pool_devices[:k])
        return ((0, extra), chosen)
    free_devices = _bits(free_mask)
    deg = [0.0] * t.n
    deg_fast = [0.0] * t.n
    deg_close = [0] * t.n
    for v in free_devices:
        for u in free_devices:
            if u != v:
                deg[v] += t.bw[v][u]
                deg_close[v] += t.close[v][u]
                if t.fast[v][u]:
                    deg_fast[v] += t.bw[v][u]
    if t.by_size:
        candidates: Sequence[int] = [m for m in t.by_size[k] if m & pool == m]
    elif math.comb(len(pool_devices), k) <= SEARCH_LIMIT:
        candidates = [_mask(c) for c in itertools.combinations(pool_devices, k)]
    else:
        candidates = _greedy_candidates(t, pool_devices, k)
    best: tuple[tuple[Any, ...], int] | None = None
    for m in candidates:
        ring = t.ring_level(m) if k >= 2 else -1
        if required is not None and ring < required:
            continue
        internal, internal_rank = t.internal_of(m)
        members = _bits(m)
        cut = sum(deg[v] for v in members) - 2 * internal
        inner_fast, inner_close = 0.0, 0
        for a, b in itertools.combinations(members, 2):
            inner_close += t.close[a][b]
            if t.fast[a][b]:
                inner_fast += t.bw[a][b]
        cut_fast = sum(deg_fast[v] for v in members) - 2 * inner_fast
        cut_close = sum(deg_close[v] for v in members) - 2 * inner_close
        left = t.largest_clique(free_mask & ~m) if t.nvlink_min is not None else 0
        key = (ring, extra, round(internal, 6), -internal_rank, left, -round(cut_fast, 6), -round(cut, 6), -cut_close)
        if best is None or key > best[0]:
            best = (key, m)
    return best


def _greedy_candidates(t: _Tables, pool: Sequence[int], k: int) -> list[int]:
    """One set per seed device, grown by the device with the best worst link to the set so far.

    Only for machines with more than `TABLE_LIMIT` devices of mixed links and a request with more
    than `SEARCH_LIMIT` possible sets: good sets, not a proof of the best one.
    """
    out = []
    for seed in pool:
        chosen = [seed]
        rest = [d for d in pool if d != seed]
        while len(chosen) < k:
            d = max(rest, key=lambda u: (min(t.level[u][c] for c in chosen), sum(t.bw[u][c] for c in chosen), -u))
            chosen.append(d)
            rest.remove(d)
        out.append(_mask(chosen))
    return sorted(set(out), key=lambda m: _bits(m))


def _largest_clique(t: _Tables, free_mask: int) -> int:
    """Size of the largest set of free devices with NVLink between every pair."""
    best = 0

    def grow(size: int, candidates: int) -> None:
        nonlocal best
        if size + candidates.bit_count() <= best:
            return
        if not candidates:
            best = max(best, size)
            return
        while candidates:
            if size + candidates.bit_count() <= best:
                return
            vbit = candidates & -candidates
            candidates ^= vbit
            v = vbit.bit_length() - 1
            grow(size + 1, candidates & t.nvlink_mask[v])
        best = max(best, size)

    grow(0, free_mask)
    return best


def _placement(topology: Topology, t: _Tables, chosen: int, free_mask: int, prefix: str) -> Placement:
    devices = tuple(_bits(chosen))
    k = len(devices)
    if k == 1:
        return Placement(devices, 0.0, prefix + _single_reason(topology, t, devices[0], free_mask))
    level = t.ring_level(chosen)
    bw, neg_rank = t.levels[level]
    return Placement(devices, float(bw), prefix + _set_reason(topology, t, devices, bw, -neg_rank))


def _single_reason(topology: Topology, t: _Tables, d: int, free_mask: int) -> str:
    noun = _noun(topology, 1)
    free = _bits(free_mask)
    if t.uniform:
        return f"one {noun} ({d}); every free {noun} is equally placed"
    pairs = [(a, b) for a, b in itertools.combinations(free, 2)]
    if not pairs:
        return f"one {noun} ({d}); the only free {noun}"
    top = max(t.level[a][b] for a, b in pairs)
    a0, b0 = next((a, b) for a, b in pairs if t.level[a][b] == top)
    token = topology.links[a0][b0].token
    broken = sum(1 for a, b in pairs if t.level[a][b] == top and d in (a, b))
    if not broken:
        return f"one {noun} ({d}); leaves the free {token} pairs whole"
    plural = "s" if broken != 1 else ""
    return f"one {noun} ({d}); breaks {broken} free {token} pair{plural} (chosen to lose the least link bandwidth)"


def _set_reason(topology: Topology, t: _Tables, devices: Sequence[int], bw: float, rank: int) -> str:
    k = len(devices)
    links = [topology.links[a][b] for a, b in itertools.combinations(devices, 2)]
    size_word = _SIZE_WORDS.get(k, f"set of {k}")
    per_dir = f"{bw:g} GB/s per direction"
    if topology.kind == "cpu":
        return f"{k} CPU slots sharing host memory (nominal {per_dir}; every slot is equally linked)"
    if topology.fabric is not None and all(lk.kind == "nvswitch" for lk in links):
        return f"NVSwitch fabric: any {k} GPUs ring at {per_dir} ({topology.fabric.links_per_gpu} NVLinks per GPU)"
    if all(lk.kind == "nvlink" for lk in links):
        if k == 2:
            lk = links[0]
            count = {1: "one-link", 2: "two-link"}.get(lk.links, f"{lk.links}-link")
            return f"{count} NVLink pair ({lk.token}, {per_dir})"
        tokens = "/".join(sorted({lk.token for lk in links}))
        return f"fully NVLink-connected {size_word} ({tokens}); ring bottleneck {per_dir}"
    if rank == 0 and topology.has_nvlink:
        return f"NVLink ring of {k} (not every pair linked); ring bottleneck {per_dir}"
    worst = max(links, key=lambda lk: lk.rank)
    best = min(links, key=lambda lk: lk.rank)
    if k == 2:
        return f"PCIe pair {_PATH_WORDS.get(worst.token, worst.token)} ({worst.token}, {per_dir})"
    path = worst.token if worst.token == best.token else f"{best.token} to {worst.token}"
    return f"{k} GPUs over PCIe ({path}); ring bottleneck {per_dir}"
