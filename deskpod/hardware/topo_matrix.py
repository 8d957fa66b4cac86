"""Reading and writing the text of ``nvidia-smi topo -m``.

The format drifted across driver versions, and copies of it drift further. What this parser takes:

* ``SOC`` (drivers before ~384) as the old name of ``SYS``;
* a legend or none, a ``NIC Legend`` mapping ``NIC0`` to ``mlx5_0`` or none, NIC rows or none;
* ``CPU Affinity``, ``NUMA Affinity`` and ``GPU NUMA ID`` columns, present or not;
* tabs or spaces, terminal escape codes around the header (``[4mGPU0 … [0m``), a header row that is
  missing or does not match the rows (the rows decide: the matrix is square);
* any text before the matrix (a prompt, a comment) and after it.

What it rejects, with the line and token named: text with no matrix, a row with too few entries, a
token that is not ``X``/``NV#``/``PIX``/``PXB``/``PHB``/``NODE``/``SYS``/``SOC``, ``X`` off the
diagonal, an asymmetric matrix, NVLink to a NIC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from deskpod.errors import UsageError
from deskpod.hardware.topology import (
    PCIE_PATHS,
    DeviceInfo,
    LinkModel,
    Nic,
    Topology,
    build_links,
    infer_link_model,
    link_model_for,
)

_ANSI = re.compile(r"(?:\x1b)?\[[0-9;]*m")
_MULTIWORD = (
    (re.compile(r"cpu\s+affinity", re.I), "CPU_Affinity"),
    (re.compile(r"numa\s+affinity", re.I), "NUMA_Affinity"),
    (re.compile(r"gpu\s+numa\s+id", re.I), "GPU_NUMA_ID"),
)
_AFFINITY_COLUMNS = ("CPU_Affinity", "NUMA_Affinity", "GPU_NUMA_ID")
_LINK = re.compile(r"^(X|NV[1-9]\d*|PIX|PXB|PHB|NODE|SYS|SOC)$", re.I)
_GPU = re.compile(r"^GPU(\d+)$", re.I)
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", re.I)
_AFFINITY_VALUE = re.compile(r"^([\d,\-]+|N/A)$", re.I)
VALID_TOKENS = "X, NV# (e.g. NV2), " + ", ".join(PCIE_PATHS) + ", SOC"

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    """The parsed text: names and raw tokens, before any bandwidth is attached."""

    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    """NIC names, with ``NIC0``-style names resolved through the NIC legend when there is one."""
    cells: tuple[tuple[str, ...], ...]
    """Square over ``gpus + nics``; ``SOC`` already read as ``SYS``."""
    cpu_affinity: tuple[str, ...]
    numa_affinity: tuple[str, ...]
    has_legend: bool
    old_names: bool
    """True when the text used ``SOC`` (a pre-2017 driver)."""
    notes: tuple[str, ...] = ()
    """What the reading had to assume (NIC rows cut off the end of the output), for the user to see."""

    @property
    def gpu_cells(self) -> tuple[tuple[str, ...], ...]:
        g = len(self.gpus)
        return tuple(row[:g] for row in self.cells[:g])


def _clean(line: str) -> str:
    line = _ANSI.sub(" ", line).replace("\t", " ")
    for pattern, repl in _MULTIWORD:
        line = pattern.sub(repl, line)
    return line


def _is_header(tokens: list[str]) -> bool:
    return any(_GPU.match(t) for t in tokens) and not any(_LINK.match(t) for t in tokens)


def parse_topo_matrix(text: str, source: str = "<text>") -> TopoMatrix:
    """Parse the text of ``nvidia-smi topo -m``; `UsageError` naming the line and token if it is not one."""
    lines = text.splitlines()
    nic_legend: dict[str, str] = {}
    for raw in lines:
        m = _NIC_LEGEND.match(_clean(raw))
        if m:
            nic_legend[m.group(1).upper()] = m.group(2)
    has_legend = any(_clean(raw).strip().lower().startswith("legend") for raw in lines)

    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    in_block = False
    for number, raw in enumerate(lines, start=1):
        tokens = _clean(raw).split()
        if in_block:
            if not tokens or tokens[0].lower().startswith(("legend", "nic legend")):
                break
            rows.append((number, tokens))
            continue
        if not tokens:
            continue
        if _is_header(tokens) and _GPU.match(tokens[0]):
            header = tokens
            in_block = True
        elif _GPU.match(tokens[0]) and any(_LINK.match(t) for t in tokens[1:]):
            rows.append((number, tokens))
            in_block = True
    if not rows:
        raise UsageError(
            f"{source}: not an nvidia-smi topo -m matrix: found no row like 'GPU0  X  NV1 …' "
            f"(a device name followed by link entries: {VALID_TOKENS})"
        )

    names = [tokens[0] for _, tokens in rows]
    if len({x.upper() for x in names}) != len(names):
        raise UsageError(f"{source}: a device row is repeated in {names}")
    columns = [t for t in (header or []) if t not in _AFFINITY_COLUMNS]
    missing = _missing_rows(columns, names, source)
    notes: list[str] = []
    if missing:  # only NIC rows are missing (missing GPU rows are refused above): their links come from the columns
        notes.append(
            f"{source}: the header names {len(columns)} devices but the rows of {', '.join(missing)} are missing "
            "(the output was cut); their links to the GPUs are read from the GPU rows' columns"
            + (", and the links among them are unknown, taken as SYS" if len(missing) > 1 else "")
        )
        rows = _rows_for_missing_nics(rows, columns, missing)
        names = [tokens[0] for _, tokens in rows]
    n = len(rows)
    affinity_columns = [t for t in (header or []) if t in _AFFINITY_COLUMNS] or list(_AFFINITY_COLUMNS)
    cells: list[list[str]] = []
    extras: list[list[str]] = []
    for number, tokens in rows:
        name, rest = tokens[0], tokens[1:]
        row: list[str] = []
        for j in range(n):
            if j >= len(rest) or (_AFFINITY_VALUE.match(rest[j]) and not _LINK.match(rest[j])):
                raise UsageError(
                    f"{source} line {number}: row {name} has {j} link entries but the matrix has {n} devices "
                    f"({', '.join(names)})"
                )
            token = rest[j]
            if not _LINK.match(token):
                raise UsageError(
                    f"{source} line {number}: unknown link token {token!r} in row {name}, column {names[j]}; "
                    f"valid: {VALID_TOKENS}"
                )
            token = token.upper()
            row.append("SYS" if token == "SOC" else token)
        cells.append(row)
        extras.append(rest[n:])
    old_names = any(t.upper() == "SOC" for _, tokens in rows for t in tokens[1 : n + 1])

    for i, (number, _) in enumerate(rows):
        for j in range(n):
            if (cells[i][j] == "X") != (i == j):
                where = "on the diagonal" if i == j else f"between {names[i]} and {names[j]}"
                raise UsageError(f"{source} line {number}: entry {cells[i][j]!r} {where}; X marks a device with itself")
            if cells[i][j] != cells[j][i]:
                raise UsageError(
                    f"{source}: asymmetric matrix: {names[i]}->{names[j]} is {cells[i][j]} (line {number}) "
                    f"but {names[j]}->{names[i]} is {cells[j][i]} (line {rows[j][0]})"
                )

    gpu_rows = [i for i, x in enumerate(names) if _GPU.match(x)]
    nic_rows = [i for i, x in enumerate(names) if not _GPU.match(x)]
    if not gpu_rows:
        raise UsageError(f"{source}: the matrix has no GPU rows")
    for k, i in enumerate(gpu_rows):
        idx = int(_GPU.match(names[i]).group(1))  # type: ignore[union-attr]
        if idx != k:
            raise UsageError(
                f"{source} line {rows[i][0]}: GPU rows must be GPU0, GPU1, … in order; found {names[i]} where GPU{k} belongs"
            )
    for i in nic_rows:
        for j in range(n):
            if cells[i][j].startswith("NV"):
                raise UsageError(
                    f"{source} line {rows[i][0]}: {cells[i][j]} between {names[i]} and {names[j]}; NICs attach over PCIe only"
                )
    order = gpu_rows + nic_rows
    square = tuple(tuple(cells[i][j] for j in order) for i in order)

    def column(i: int, col: str) -> str:
        values = extras[i]
        if col in affinity_columns:
            k = affinity_columns.index(col)
            if k < len(values):
                return values[k]
        return ""

    return TopoMatrix(
        notes=tuple(notes),
        gpus=tuple(names[i].upper() for i in gpu_rows),
        nics=tuple(nic_legend.get(names[i].upper(), names[i]) for i in nic_rows),
        cells=square,
        cpu_affinity=tuple(column(i, "CPU_Affinity") for i in gpu_rows),
        numa_affinity=tuple(column(i, "NUMA_Affinity") for i in gpu_rows),
        has_legend=has_legend,
        old_names=old_names,
    )


def _missing_rows(columns: list[str], names: list[str], source: str) -> list[str]:
    """The devices the header names that have no row. A missing GPU row (a cut matrix) is a `UsageError`:
    read anyway, the box would shrink to the GPUs that are left and every plan built on it would be wrong."""
    have = {x.upper() for x in names}
    if not columns or len(columns) <= len(names):
        return []
    missing = [c for c in columns if c.upper() not in have]
    gpus = [c for c in missing if _GPU.match(c)]
    if gpus:
        shown = ", ".join(missing) if len(missing) <= 6 else f"{', '.join(missing[:3])}, …, {missing[-1]}"
        raise UsageError(
            f"{source}: the header names {len(columns)} devices but only {len(names)} rows follow; the rows of "
            f"{len(missing)} devices are missing ({shown}): the output was cut — give the whole "
            "`nvidia-smi topo -m` output"
        )
    return missing


def _rows_for_missing_nics(
    rows: list[tuple[int, list[str]]], columns: list[str], missing: list[str]
) -> list[tuple[int, list[str]]]:
    """The rows in header order, each missing NIC's row built from the column entries of the rows that are there."""
    by_name = {tokens[0].upper(): (number, tokens) for number, tokens in rows}
    k = len(columns)
    out: list[tuple[int, list[str]]] = []
    for i, col in enumerate(columns):
        if col.upper() in by_name:
            out.append(by_name[col.upper()])
            continue
        entries = []
        for j, other in enumerate(columns):
            if i == j:
                entries.append("X")
            elif other.upper() in by_name:
                row = by_name[other.upper()][1][1:]
                entries.append(row[i] if i < len(row) else "SYS")
            else:
                entries.append("SYS")  # two missing NICs: their link is not in the text
        out.append((0, [col, *entries[:k]]))
    return out


def read_topo_matrix(path: str | Path) -> TopoMatrix:
    """Parse a file holding ``nvidia-smi topo -m`` output."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read topology file {str(p)!r}: {e.strerror or e}") from e
    return parse_topo_matrix(text, source=str(p))


def matrix_to_topology(
    matrix: TopoMatrix,
    name: str,
    *,
    gpu: str | None = None,
    model: LinkModel | None = None,
    source: str = "",
    fabric: bool | None = None,
    nic_gbps: float = 0.0,
    device_model: str = "",
    memory_gb: float = 0.0,
    partitions: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = (),
    switches: int = 0,
) -> Topology:
    """Attach bandwidths to a parsed matrix: from ``model``, the ``gpu`` named, or a guess from the links."""
    g = len(matrix.gpus)
    tokens = matrix.gpu_cells
    if model is None and gpu:
        model = link_model_for(gpu)
    if model is None:
        # Build once with a placeholder to learn the shape (fabric or not, links per GPU), then guess.
        probe, fab = build_links(tokens, link_model_for("V100"), fabric=fabric)
        if fab is not None:
            most = fab.links_per_gpu
        else:
            most = max(sum(lk.links for lk in row if lk.kind == "nvlink") for row in probe)
        has_nv = any(lk.kind in ("nvlink", "nvswitch") for row in probe for lk in row)
        model = infer_link_model(most, fab is not None, has_nv)
    links, fab = build_links(tokens, model, fabric=fabric)
    if fab is not None and switches:
        fab = type(fab)(fab.links_per_gpu, fab.link_gbps, switches)
    devices = []
    for i in range(g):
        numa = matrix.numa_affinity[i]
        devices.append(
            DeviceInfo(
                i,
                f"GPU{i}",
                model=device_model,
                memory_gb=memory_gb,
                numa_node=int(numa) if numa.isdigit() else None,
                cpu_affinity=matrix.cpu_affinity[i] if matrix.cpu_affinity[i].upper() != "N/A" else "",
            )
        )
    nics = tuple(
        Nic(nic, tuple(matrix.cells[g + k][:g]), nic_gbps, tuple(matrix.cells[g + k][g:]))
        for k, nic in enumerate(matrix.nics)
    )
    return Topology(
        name,
        tuple(devices),
        links,
        kind="cuda",
        link_model=model,
        nics=nics,
        fabric=fab,
        partitions=partitions,
        source=source,
    )


def format_topo_matrix(topology: Topology, *, legend: bool = True) -> str:
    """Print a topology the way ``nvidia-smi topo -m`` does (tab-separated, NIC rows, legend)."""
    g = topology.device_count
    labels = [f"GPU{i}" if topology.kind == "cuda" else f"CPU{i}" for i in range(g)] + [n.name for n in topology.nics]
    has_cpu = any(d.cpu_affinity for d in topology.devices)
    has_numa = any(d.numa_node is not None for d in topology.devices)
    header = "\t" + "\t".join(labels)
    if has_cpu:
        header += "\tCPU Affinity"
    if has_numa:
        header += "\tNUMA Affinity"
    out = [header]
    for i in range(g):
        cells = [" X " if i == j else topology.links[i][j].token for j in range(g)]
        cells += [nic.paths[i] for nic in topology.nics]
        line = labels[i] + "\t" + "\t".join(cells)
        d = topology.devices[i]
        if has_cpu:
            line += "\t" + (d.cpu_affinity or "N/A")
        if has_numa:
            line += "\t" + (str(d.numa_node) if d.numa_node is not None else "N/A")
        out.append(line)
    for k, nic in enumerate(topology.nics):
        cells = list(nic.paths)
        for m, other in enumerate(topology.nics):
            if m == k:
                cells.append(" X ")
            else:
                cells.append(nic.nic_paths[m] if len(nic.nic_paths) == len(topology.nics) else _nic_to_nic(nic, other))
        out.append(nic.name + "\t" + "\t".join(cells))
    text = "\n".join(out) + "\n"
    if legend:
        text += "\n" + LEGEND + "\n"
    return text


def _nic_to_nic(a: Nic, b: Nic) -> str:
    """NIC-to-NIC path when only NIC-to-GPU paths are known: the worst of the two via a shared GPU."""
    order = ("PIX", "PXB", "PHB", "NODE", "SYS")
    best = "SYS"
    for pa, pb in zip(a.paths, b.paths, strict=True):
        worst = max(pa, pb, key=lambda t: order.index(t) if t in order else len(order))
        if worst in order and order.index(worst) < order.index(best):
            best = worst
    return best
