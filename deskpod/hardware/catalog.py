"""The catalog of reference machines: one TOML file per machine in ``machines/``, every number sourced.

A machine file gives the GPU (or CPU) and its peak figures, the links, NICs, CPUs and system facts,
each number as ``{ value = …, source = "…" }`` — a number without a source is refused when the file
is loaded. Its link layout is an ``nvidia-smi topo -m`` text in ``machines/topo/`` (recorded where
one was available, constructed and marked so otherwise), read by the same parser as ``--from FILE``.

The catalog lets placement, the planner and ``deskpod doctor`` reason about machines that are not
this one: the DGX-1 this project imitates, what came after it, and the CPU server it was compared
with.
"""

from __future__ import annotations

import difflib
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deskpod.errors import ConfigError, UsageError
from deskpod.hardware.topology import GPU_LINK_MODELS, LinkModel, Topology, cpu_topology

MACHINES_DIR = Path(__file__).with_name("machines")

_SECTIONS: dict[str, tuple[str, ...]] = {
    "device": ("model", "count", "memory_gb", "memory_bandwidth_gbs", "power_w", "peak_tflops"),
    "peak_tflops": ("fp64", "fp32", "tf32", "fp16", "bf16", "fp16_tensor", "fp16_tensor_sparse", "fp8"),
    "links": ("nvlink_gbps", "nvlinks_per_gpu", "pcie_gen", "pcie_gbps"),
    "nics": ("model", "count", "gbps"),
    "cpus": ("model", "count"),
    "system": ("power_w", "list_price_usd", "peak_fp16_tflops"),
}
_TABLES = ("device", "links", "nics", "cpus", "system")
"""The tables of sourced numbers a machine file may have (``peak_tflops`` lies inside ``device``)."""
_TOP = ("name", "title", "aliases", "kind", "gpu", "topology", "topology_source", "nvswitches", "partitions", *_TABLES)


@dataclass(frozen=True, slots=True)
class Spec:
    """One sourced number."""

    value: float
    source: str


@dataclass(frozen=True, slots=True)
class Machine:
    """A reference machine as its catalog file describes it."""

    name: str
    title: str
    aliases: tuple[str, ...]
    kind: str
    """``cuda`` or ``cpu``."""
    gpu: str
    """Link-model key (``V100`` …), or empty."""
    topology_file: str
    topology_source: str
    device_model: str
    specs: dict[str, dict[str, Spec]]
    """Sections ``device``, ``peak_tflops``, ``links``, ``nics``, ``cpus``, ``system``, ``machine``."""
    texts: dict[str, str]
    """Free text fields such as ``nics.model`` and ``cpus.model``."""
    partitions: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]

    def spec(self, section: str, key: str) -> Spec | None:
        return self.specs.get(section, {}).get(key)

    def peak_tflops(self, precision: str) -> Spec | None:
        """Per-device peak for ``fp32``, ``bf16`` … (``bf16`` falls back to FP16 tensor where no BF16 exists)."""
        return self.spec("peak_tflops", precision)

    @property
    def device_count(self) -> int:
        count = self.spec("device", "count")
        return int(count.value) if count else 0

    def link_model(self) -> LinkModel:
        base = GPU_LINK_MODELS.get(self.gpu)
        links = self.specs.get("links", {})

        def pick(key: str, fallback: float) -> float:
            s = links.get(key)
            return s.value if s else fallback

        return LinkModel(
            gpu=self.gpu or self.device_model,
            nvlink_gbps=pick("nvlink_gbps", base.nvlink_gbps if base else 0.0),
            nvlinks_per_gpu=int(pick("nvlinks_per_gpu", base.nvlinks_per_gpu if base else 0)),
            pcie_gen=int(pick("pcie_gen", base.pcie_gen if base else 3)),
            pcie_gbps=pick("pcie_gbps", base.pcie_gbps if base else 15.7),
            source=f"catalog {self.name}: " + "; ".join(s.source for s in links.values()),
        )

    def topology(self) -> Topology:
        return _topology(self.name)


def _spec(where: str, raw: Any) -> Spec:
    if not isinstance(raw, dict) or set(raw) != {"value", "source"}:
        raise ConfigError(f'{where}: a number must be written {{ value = …, source = "…" }}, got {raw!r}')
    value, source = raw["value"], raw["source"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: value must be a number, got {value!r}")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{where}: every number needs a source; {where} has none")
    return Spec(float(value), source)


def _check_keys(where: str, table: dict[str, Any], valid: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(valid))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; valid: {', '.join(valid)}")


def parse_machine(data: dict[str, Any], where: str) -> Machine:
    """Validate one machine file's table."""
    _check_keys(where, data, _TOP)
    for key in ("name", "title", "kind"):
        if not isinstance(data.get(key), str):
            raise ConfigError(f"{where}: {key} must be a string")
    if data["kind"] not in ("cuda", "cpu"):
        raise ConfigError(f"{where}: kind must be 'cuda' or 'cpu', got {data['kind']!r}")
    specs: dict[str, dict[str, Spec]] = {}
    texts: dict[str, str] = {}
    for section in _TABLES:
        table = data.get(section, {})
        _check_keys(f"{where} [{section}]", table, _SECTIONS[section])
        specs[section] = {}
        for key, raw in table.items():
            if key == "model":
                texts[f"{section}.model"] = str(raw)
            elif key == "peak_tflops":
                _check_keys(f"{where} [device.peak_tflops]", raw, _SECTIONS["peak_tflops"])
                specs["peak_tflops"] = {p: _spec(f"{where} device.peak_tflops.{p}", v) for p, v in raw.items()}
            else:
                specs[section][key] = _spec(f"{where} {section}.{key}", raw)
    if "nvswitches" in data:
        specs["machine"] = {"nvswitches": _spec(f"{where} nvswitches", data["nvswitches"])}
    if "count" not in specs["device"]:
        raise ConfigError(f"{where}: [device] needs a sourced count")
    partitions = tuple(
        (pname, tuple(tuple(int(d) for d in block) for block in blocks))
        for pname, blocks in data.get("partitions", {}).items()
    )
    if data["kind"] == "cuda" and not data.get("topology"):
        raise ConfigError(f"{where}: a GPU machine needs a topology file")
    return Machine(
        name=data["name"],
        title=data["title"],
        aliases=tuple(data.get("aliases", ())),
        kind=data["kind"],
        gpu=str(data.get("gpu", "")),
        topology_file=str(data.get("topology", "")),
        topology_source=str(data.get("topology_source", "")),
        device_model=texts.get("device.model", ""),
        specs=specs,
        texts=texts,
        partitions=partitions,
    )


@functools.cache
def machines() -> tuple[Machine, ...]:
    """Every machine in the catalog, in file-name order."""
    out = []
    for path in sorted(MACHINES_DIR.glob("*.toml")):
        with path.open("rb") as f:
            data = tomllib.load(f)
        out.append(parse_machine(data, path.name))
    return tuple(out)


def machine_names() -> tuple[str, ...]:
    return tuple(m.name for m in machines())


def find_machine(name: str) -> Machine:
    """The machine called ``name`` (or one of its aliases); `UsageError` suggesting the closest otherwise."""
    wanted = name.strip().lower()
    for m in machines():
        if wanted == m.name or wanted in m.aliases:
            return m
    known: dict[str, str] = {}
    for m in machines():
        known[m.name] = m.name
        for a in m.aliases:
            known[a] = m.name
    close = difflib.get_close_matches(wanted, list(known), n=1, cutoff=0.5)
    hint = f"did you mean {known[close[0]]!r}? " if close else ""
    raise UsageError(f"unknown machine {name!r}; {hint}known: {', '.join(machine_names())} (see deskpod topo --list)")


@functools.cache
def _topology(name: str) -> Topology:
    from deskpod.hardware.topo_matrix import matrix_to_topology, read_topo_matrix

    m = find_machine(name)
    if m.kind == "cpu":
        topo = cpu_topology(m.device_count, name=m.name)
        return Topology(
            topo.name, topo.devices, topo.links, kind="cpu", partitions=m.partitions, source=f"catalog:{m.name}"
        )
    matrix = read_topo_matrix(MACHINES_DIR / m.topology_file)
    switches = m.spec("machine", "nvswitches")
    memory = m.spec("device", "memory_gb")
    nic_gbps = m.spec("nics", "gbps")
    topo = matrix_to_topology(
        matrix,
        m.name,
        model=m.link_model(),
        source=f"catalog:{m.name}",
        device_model=m.device_model,
        memory_gb=memory.value if memory else 0.0,
        partitions=m.partitions,
        switches=int(switches.value) if switches else 0,
        nic_gbps=nic_gbps.value if nic_gbps else 0.0,
    )
    if topo.device_count != m.device_count:
        raise ConfigError(
            f"catalog {m.name}: [device] count {m.device_count} but its topology has {topo.device_count} GPUs"
        )
    return topo


def machine(name: str) -> Topology:
    """A catalog machine's topology (cached: placement keeps its precomputed tables on it)."""
    return find_machine(name).topology()
