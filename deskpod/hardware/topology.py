"""The topology model: devices, NICs, and the link between every pair of devices.

A link is what ``nvidia-smi topo -m`` prints for a pair, turned into a per-direction bandwidth:

* ``NV#`` between two GPUs wired directly (DGX-1, DGX Station): ``#`` NVLinks bonded between that
  pair, so the pair gets ``# x per-link rate``.
* ``NV#`` on an NVSwitch machine (DGX-2, DGX A100, DGX H100/H200): ``#`` is each GPU's link count
  *to the switch fabric*, repeated for every peer. Every pair then gets the GPU's whole fabric
  bandwidth ``# x per-link rate`` — never a sum over peers. Such a topology carries a `Fabric`.
* ``PIX``/``PXB``/``PHB``/``NODE``/``SYS``: a PCIe path, modelled at the x16 rate of the PCIe
  generation. We have no sourced per-class figures, so the class does not scale the bandwidth; it
  *ranks* paths (PIX best, SYS worst) so that placement prefers the shorter one.
* ``SHM``: two CPU worker slots of one box, talking through shared memory.

Bandwidths are GB/s per direction. Per-generation figures and their sources are in `GPU_LINK_MODELS`
(from ``docs/reference/hardware.md``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from deskpod.errors import UsageError

LinkKind = Literal["self", "nvlink", "nvswitch", "pcie", "shm"]
DeviceKind = Literal["cuda", "cpu"]

PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""nvidia-smi's PCIe path classes, nearest first."""

PATH_RANK = {"X": 0, "NV": 0, "SHM": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
"""Lower is closer. NVLink and shared memory rank with the self entry; ``SOC`` is read as ``SYS``."""

MAX_NVLINKS_PER_GPU = 18
"""The most NVLinks any GPU has had so far (H100/H200: 18, docs/reference/hardware.md#nvlink). A GPU whose ``NV#``
entries add up to more than this cannot be wired pair by pair: it hangs off an NVSwitch fabric."""

CPU_SHM_GBPS = 10.0
"""Nominal shared-memory figure between CPU worker slots. Not a measurement: every slot shares one
memory system, so only equality between pairs matters to placement; `deskpod doctor` measures the
real copy bandwidth of this box."""


@dataclass(frozen=True, slots=True)
class LinkModel:
    """Per-direction link rates for one GPU generation."""

    gpu: str
    nvlink_gbps: float
    """One NVLink, one direction, GB/s."""
    nvlinks_per_gpu: int
    pcie_gen: int
    pcie_gbps: float
    """PCIe x16, one direction, GB/s."""
    source: str


# docs/reference/hardware.md#nvlink and #pcie (PCIe x16 per direction: Gen3 15.7, Gen4 31.5, Gen5 63.0 GB/s,
# hpc-notes.pages.dev/reference/pcie).
GPU_LINK_MODELS: dict[str, LinkModel] = {
    "P100": LinkModel(
        "P100", 20.0, 4, 3, 15.7, "NVLink 1: 20 GB/s each way per link, 4 links (datascienceassn DGX-1 page); PCIe Gen3"
    ),
    "V100": LinkModel(
        "V100",
        25.0,
        6,
        3,
        15.7,
        "NVLink 2: 25 GB/s each direction per link, 6 links (DGX-1V whitepaper, iitr.ac.in/dgx); Gen3 8 GT/s x16 (NCCL #671)",
    ),
    "A100": LinkModel(
        "A100",
        25.0,
        12,
        4,
        31.5,
        "NVLink 3: 25 GB/s per link (nvidia-smi nvlink -s), 12 links; Gen4 16 GT/s x16 (NCCL #1505)",
    ),
    "H100": LinkModel(
        "H100",
        25.0,
        18,
        5,
        63.0,
        "NVLink 4: 450 GB/s line rate per direction (nccl-tests #212) / 18 links = 25 GB/s (derived); Gen5",
    ),
    "H200": LinkModel("H200", 25.0, 18, 5, 63.0, "as H100; pcie.link.gen.max = 5 (docs/reference/hardware.md#pcie)"),
}


def link_model_for(gpu: str) -> LinkModel:
    """The link model of a GPU name such as ``V100``, ``Tesla V100-SXM2-32GB`` or ``NVIDIA H200``."""
    text = gpu.upper()
    for key, model in GPU_LINK_MODELS.items():
        if key in text:
            return model
    valid = ", ".join(GPU_LINK_MODELS)
    raise UsageError(f"unknown GPU {gpu!r} for link bandwidths; valid: {valid}")


def infer_link_model(max_links_per_gpu: int, fabric: bool, has_nvlink: bool) -> LinkModel:
    """Guess the GPU generation from a matrix alone (no GPU names in ``nvidia-smi topo -m``).

    The most NVLinks a GPU shows tells the generation apart: 4 is P100, up to 6 V100, up to 12
    A100, more H100. Without NVLink we assume PCIe Gen3 (V100-era); pass the GPU to be exact.
    """
    if not has_nvlink:
        return GPU_LINK_MODELS["V100"]
    if fabric:
        # NVSwitch generations: DGX-2 V100 NV6, DGX A100 NV12, DGX H100 NV18.
        if max_links_per_gpu <= 6:
            return GPU_LINK_MODELS["V100"]
        return GPU_LINK_MODELS["A100"] if max_links_per_gpu <= 12 else GPU_LINK_MODELS["H100"]
    if max_links_per_gpu <= 4:
        return GPU_LINK_MODELS["P100"]
    if max_links_per_gpu <= 6:
        return GPU_LINK_MODELS["V100"]
    return GPU_LINK_MODELS["A100"] if max_links_per_gpu <= 12 else GPU_LINK_MODELS["H100"]


@dataclass(frozen=True, slots=True)
class Link:
    """The connection between two devices."""

    kind: LinkKind
    token: str
    """What nvidia-smi prints for it: ``X``, ``NV2``, ``NV12``, ``PIX`` … ``SYS``; ``SHM`` for CPU slots."""
    links: int
    """NVLinks: bonded between the pair (``nvlink``) or from each GPU to the fabric (``nvswitch``)."""
    bandwidth: float
    """GB/s per direction."""

    @property
    def rank(self) -> int:
        """Path rank, lower is closer (NVLink 0, PIX 1 … SYS 5)."""
        return PATH_RANK["NV"] if self.kind in ("nvlink", "nvswitch") else PATH_RANK[self.token]

    @property
    def fast(self) -> bool:
        """True for NVLink, NVSwitch and shared memory: the tier a collective wants to stay on."""
        return self.kind in ("nvlink", "nvswitch", "shm")


SELF = Link("self", "X", 0, 0.0)


def parse_link_token(token: str, model: LinkModel, *, fabric: bool) -> Link:
    """Turn one matrix entry into a `Link` (``SOC`` is the old name of ``SYS``)."""
    t = token.strip().upper()
    if t == "X":
        return SELF
    if t == "SOC":
        t = "SYS"
    if t in PCIE_PATHS:
        return Link("pcie", t, 0, model.pcie_gbps)
    if t == "SHM":
        return Link("shm", "SHM", 0, CPU_SHM_GBPS)
    m = re.fullmatch(r"NV(\d+)", t)
    if m and int(m.group(1)) > 0:
        n = int(m.group(1))
        return Link("nvswitch" if fabric else "nvlink", t, n, round(n * model.nvlink_gbps, 3))
    raise UsageError(f"unknown link token {token!r}; valid: X, NV# (e.g. NV2), {', '.join(PCIE_PATHS)}, SOC")


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU (or CPU worker slot) as the topology knows it; unknown facts stay empty."""

    index: int
    label: str
    """``GPU0`` … or ``cpu:0`` …"""
    model: str = ""
    memory_gb: float = 0.0
    compute_capability: str = ""
    numa_node: int | None = None
    cpu_affinity: str = ""


@dataclass(frozen=True, slots=True)
class Nic:
    """A network adapter and its PCIe path class to each device."""

    name: str
    paths: tuple[str, ...]
    """Path token (``PIX`` … ``SYS``) to device 0, 1, …"""
    gbps: float = 0.0
    """Line rate in Gb/s when known (e.g. 100 for EDR InfiniBand)."""
    nic_paths: tuple[str, ...] = ()
    """Path token to each NIC of the topology (``X`` to itself), when the source gave them."""

    def rank_to(self, device: int) -> int:
        return PATH_RANK.get(self.paths[device], 9)


@dataclass(frozen=True, slots=True)
class Fabric:
    """An NVSwitch fabric: every GPU attaches with ``links_per_gpu`` NVLinks."""

    links_per_gpu: int
    link_gbps: float
    switches: int = 0
    """Number of NVSwitch chips, when known (0 = unknown, e.g. read from a matrix)."""

    @property
    def gpu_bandwidth(self) -> float:
        """What one GPU can send into the fabric, GB/s per direction."""
        return round(self.links_per_gpu * self.link_gbps, 3)


@dataclass(frozen=True)
class Topology:
    """A machine's devices and the link between every pair of them."""

    name: str
    devices: tuple[DeviceInfo, ...]
    links: tuple[tuple[Link, ...], ...]
    """``links[a][b]``: square, symmetric, `SELF` on the diagonal."""
    kind: DeviceKind = "cuda"
    link_model: LinkModel | None = None
    nics: tuple[Nic, ...] = ()
    fabric: Fabric | None = None
    partitions: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = ()
    """Named ways to split the machine, e.g. ``("halves", ((0, 1, 2, 3), (4, 5, 6, 7)))``."""
    source: str = ""
    """Where it came from: ``catalog:dgx1-v100``, ``file:topo.txt``, ``nvml``, ``cpu``."""
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.devices)
        if n < 1:
            raise UsageError(f"topology {self.name!r} has no devices")
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise UsageError(f"topology {self.name!r}: the link matrix is not {n}x{n}")
        for a in range(n):
            if self.links[a][a].kind != "self":
                raise UsageError(f"topology {self.name!r}: device {a} is not linked to itself as X")
            for b in range(a + 1, n):
                if self.links[a][b] != self.links[b][a]:
                    raise UsageError(
                        f"topology {self.name!r}: asymmetric link {a}-{b}: "
                        f"{self.links[a][b].token} one way, {self.links[b][a].token} the other"
                    )
                if self.links[a][b].kind == "self":
                    raise UsageError(f"topology {self.name!r}: X between different devices {a} and {b}")
        for nic in self.nics:
            if len(nic.paths) != n:
                raise UsageError(f"topology {self.name!r}: NIC {nic.name} has {len(nic.paths)} paths, expected {n}")
        for pname, blocks in self.partitions:
            seen = [d for block in blocks for d in block]
            if len(set(seen)) != len(seen) or any(not 0 <= d < n for d in seen):
                raise UsageError(f"topology {self.name!r}: partition {pname!r} has a bad or repeated device")

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def link(self, a: int, b: int) -> Link:
        return self.links[a][b]

    def link_bandwidth(self, a: int, b: int) -> float:
        """GB/s per direction between devices ``a`` and ``b`` (0.0 for a device with itself)."""
        return self.links[a][b].bandwidth

    def partition(self, name: str) -> tuple[tuple[int, ...], ...]:
        """The blocks of a named partition; `UsageError` listing the valid names otherwise."""
        for pname, blocks in self.all_partitions():
            if pname == name:
                return blocks
        valid = ", ".join(p for p, _ in self.all_partitions()) or "none"
        raise UsageError(f"machine {self.name!r} has no partition {name!r}; valid: {valid}")

    def all_partitions(self) -> tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]:
        """Declared partitions, plus ``halves`` (when even) and ``numa`` (when affinity is known)."""
        out = list(self.partitions)
        names = {p for p, _ in out}
        n = self.device_count
        if "halves" not in names and n >= 2 and n % 2 == 0:
            out.append(("halves", (tuple(range(n // 2)), tuple(range(n // 2, n)))))
        if "numa" not in names:
            groups: dict[str, list[int]] = {}
            for d in self.devices:
                key = str(d.numa_node) if d.numa_node is not None else d.cpu_affinity
                if key:
                    groups.setdefault(key, []).append(d.index)
            if len(groups) > 1 and sum(len(g) for g in groups.values()) == n:
                out.append(("numa", tuple(tuple(g) for g in groups.values())))
        return tuple(out)

    def nearest_nics(self, device: int) -> tuple[str, ...]:
        """The NICs with the closest PCIe path to ``device`` (ties all returned), or ()."""
        if not self.nics:
            return ()
        best = min(nic.rank_to(device) for nic in self.nics)
        return tuple(nic.name for nic in self.nics if nic.rank_to(device) == best)

    def nvlink_degree(self, device: int) -> int:
        """NVLinks of one GPU: summed over pairs when wired directly, the fabric count on NVSwitch."""
        if self.fabric is not None:
            return self.fabric.links_per_gpu
        return sum(lk.links for lk in self.links[device] if lk.kind == "nvlink")

    @property
    def has_nvlink(self) -> bool:
        return any(lk.kind in ("nvlink", "nvswitch") for row in self.links for lk in row)


def build_links(
    tokens: Sequence[Sequence[str]], model: LinkModel, *, fabric: bool | None = None
) -> tuple[tuple[tuple[Link, ...], ...], Fabric | None]:
    """Turn a square matrix of nvidia-smi tokens into links, deciding whether NV# means a fabric.

    ``fabric=None`` decides from the numbers: a GPU whose ``NV#`` entries add up to more than
    `MAX_NVLINKS_PER_GPU` cannot be wired pair by pair, so its ``NV#`` is a fabric link count.
    """
    n = len(tokens)
    if fabric is None:
        per_gpu = [sum(parse_link_token(t, model, fabric=False).links for t in row) for row in tokens]
        fabric = any(total > MAX_NVLINKS_PER_GPU for total in per_gpu)
    links = tuple(tuple(parse_link_token(tokens[a][b], model, fabric=fabric) for b in range(n)) for a in range(n))
    fab = None
    if fabric:
        counts = {lk.links for row in links for lk in row if lk.kind == "nvswitch"}
        if counts:
            fab = Fabric(max(counts), model.nvlink_gbps)
    return links, fab


def cpu_topology(slots: int, *, name: str = "cpu", memory_gb: float = 0.0, cpu_affinity: str = "") -> Topology:
    """A CPU-only box: ``slots`` worker slots, every pair linked through shared memory."""
    if slots < 1:
        raise UsageError(f"a CPU topology needs at least 1 slot, got {slots}")
    shm = Link("shm", "SHM", 0, CPU_SHM_GBPS)
    links = tuple(tuple(SELF if a == b else shm for b in range(slots)) for a in range(slots))
    devices = tuple(
        DeviceInfo(i, f"cpu:{i}", model="cpu", memory_gb=memory_gb, cpu_affinity=cpu_affinity) for i in range(slots)
    )
    return Topology(name, devices, links, kind="cpu", source="cpu")
