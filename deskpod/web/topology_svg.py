"""The Pod page's topology picture: a `Topology` drawn as inline SVG on the server.

What `deskpod.hardware.diagram` draws as a PNG, for a page: GPUs on a circle (GPU0..3 along the top
of an 8-GPU box); each pair's link drawn by its class — NVLink solid and as wide as its link count,
an NVSwitch fabric as a box in the middle with one spoke per GPU, PCIe paths dashed, paths through
one CPU socket or across sockets dotted and faint; NVLink cliques of three or more as a shaded area;
each NIC as a box beside the GPUs it is nearest to. CPU worker slots sit in a row above the host
memory they share. A legend names each class with how many pairs have it.

Colours are the dashboard's CSS variables (with fallbacks), so the picture follows light and dark;
every name is escaped. The markup has a ``<title>`` and a ``<desc>`` listing what it shows, and each
device and NIC a ``<title>`` of its own (a tooltip). ``held`` marks the devices a job holds; the page's
script updates those marks in place (``data-device`` on each device's group).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from deskpod.hardware.summary import nvlink_cliques
from deskpod.hardware.topology import Link, Nic, Topology

LINK_CLASSES: dict[str, tuple[str, str]] = {
    "nvlink": ("NVLink", "NVLinks wired between the pair (the wider the line, the more links)"),
    "nvswitch": ("NVSwitch", "every GPU into an NVSwitch fabric, which reaches any peer at the GPU's NVLink rate"),
    "pcie": ("PCIe", "through PCIe switches or one host bridge (PIX, PXB, PHB)"),
    "socket": ("same CPU socket", "through the CPU, across host bridges of one NUMA node (NODE)"),
    "sockets": ("across sockets", "through the link between CPU sockets (SYS)"),
    "shm": ("shared memory", "CPU worker slots of one box, talking through its memory"),
}
"""Link classes, fastest first: key -> (name, what it means)."""

NODE_W, NODE_H = 68.0, 38.0
NIC_H = 24.0
FONT = 'system-ui, -apple-system, "Segoe UI", sans-serif'

STYLE = f"""
.tp-svg {{ font-family: {FONT}; }}
.tp-svg text {{ fill: var(--fg, #1b1f24); font-size: 12px; }}
.tp-svg .tp-small {{ fill: var(--muted, #5b636e); font-size: 10px; }}
.tp-svg .tp-node rect {{ fill: var(--panel, #f5f7fa); stroke: var(--fg, #1b1f24); stroke-width: 1.2; }}
.tp-svg .tp-node.held rect {{ stroke: var(--accent, #1f5fcc); stroke-width: 3; }}
.tp-svg .tp-node.held .tp-state {{ fill: var(--accent, #1f5fcc); font-weight: 600; }}
.tp-svg .tp-hub rect {{ fill: var(--panel, #f5f7fa); stroke: var(--s3, #2b8a3e); stroke-width: 2; }}
.tp-svg .tp-shmhub rect {{ fill: var(--panel, #f5f7fa); stroke: var(--s4, #862e9c); stroke-width: 1.5; }}
.tp-svg .tp-nic rect {{ fill: var(--bg, #ffffff); stroke: var(--s2, #d9480f); stroke-width: 1.5; }}
.tp-svg line {{ fill: none; stroke-linecap: round; }}
.tp-svg .tp-nvlink {{ stroke: var(--s3, #2b8a3e); }}
.tp-svg .tp-nvswitch {{ stroke: var(--s3, #2b8a3e); }}
.tp-svg .tp-pcie {{ stroke: var(--s1, #1f5fcc); stroke-width: 1.4; stroke-dasharray: 6 4; }}
.tp-svg .tp-socket {{ stroke: var(--s5, #0b7285); stroke-width: 1.2; stroke-dasharray: 2 4; opacity: 0.8; }}
.tp-svg .tp-sockets {{ stroke: var(--muted, #5b636e); stroke-width: 1; stroke-dasharray: 1 5; opacity: 0.7; }}
.tp-svg .tp-shm {{ stroke: var(--s4, #862e9c); stroke-width: 1.5; }}
.tp-svg .tp-niclink {{ stroke: var(--s2, #d9480f); stroke-width: 1.2; stroke-dasharray: 3 3; }}
.tp-svg .tp-clique {{ fill: var(--s3, #2b8a3e); fill-opacity: 0.08; stroke: var(--s3, #2b8a3e); stroke-opacity: 0.35; }}
.tp-svg .tp-clique-band {{ fill: none; stroke: var(--s3, #2b8a3e); stroke-width: 7; stroke-opacity: 0.3; stroke-linecap: round; }}
.tp-svg .tp-tag {{ fill: var(--bg, #ffffff); }}
"""


def link_class(link: Link) -> str | None:
    """The `LINK_CLASSES` key of a link (None for a device with itself)."""
    if link.kind == "self":
        return None
    if link.kind in ("nvlink", "nvswitch", "shm"):
        return link.kind
    return {"NODE": "socket", "SYS": "sockets"}.get(link.token, "pcie")


def _pairs(topology: Topology) -> list[tuple[int, int, Link]]:
    """Each pair of devices once (``a < b``), with its link."""
    n = topology.device_count
    return [(a, b, topology.links[a][b]) for a in range(n) for b in range(a + 1, n)]


def link_counts(topology: Topology) -> dict[str, int]:
    """How many device pairs have each class of link, fastest class first (classes with none left out)."""
    counts = Counter(link_class(lk) for _, _, lk in _pairs(topology))
    return {k: counts[k] for k in LINK_CLASSES if counts[k]}


def nvlink_total(topology: Topology) -> int:
    """NVLinks wired between pairs, summed over the pairs (0 on an NVSwitch machine)."""
    return sum(lk.links for _, _, lk in _pairs(topology) if lk.kind == "nvlink")


def nearest_devices(topology: Topology, nic: Nic) -> list[int]:
    """The devices with the closest PCIe path to ``nic``."""
    best = min(nic.rank_to(j) for j in range(topology.device_count))
    return [i for i in range(topology.device_count) if nic.rank_to(i) == best]


def nic_groups(topology: Topology) -> tuple[list[tuple[tuple[int, ...], list[Nic]]], list[Nic]]:
    """NICs grouped by the devices they are nearest to, and the NICs near no device in particular.

    A NIC only reached across sockets (SYS), or equally near every device of a box of more than two,
    is a storage or management port rather than one GPUs send through: it is listed, not wired.
    """
    groups: dict[tuple[int, ...], list[Nic]] = {}
    far: list[Nic] = []
    n = topology.device_count
    for nic in topology.nics:
        near = tuple(nearest_devices(topology, nic))
        if nic.rank_to(near[0]) >= 5 or len(near) == n > 2:
            far.append(nic)
        else:
            groups.setdefault(near, []).append(nic)
    return list(groups.items()), far


def _e(text: object) -> str:
    return str(escape(str(text)))


def _f(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if abs(x) >= 0.05 else "0"


@dataclass
class _Canvas:
    """SVG elements in drawing order, and the box they cover."""

    parts: list[str] = field(default_factory=list)
    x0: float = 0.0
    y0: float = 0.0
    x1: float = 0.0
    y1: float = 0.0

    def cover(self, x: float, y: float, w: float = 0.0, h: float = 0.0) -> None:
        self.x0, self.y0 = min(self.x0, x - w / 2), min(self.y0, y - h / 2)
        self.x1, self.y1 = max(self.x1, x + w / 2), max(self.y1, y + h / 2)

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def line(self, a: tuple[float, float], b: tuple[float, float], cls: str, width: float | None = None,
             title: str = "") -> None:  # fmt: skip
        style = f' style="stroke-width:{_f(width)}"' if width is not None else ""
        tip = f"<title>{_e(title)}</title>" if title else ""
        self.add(
            f'<line class="{cls}" x1="{_f(a[0])}" y1="{_f(a[1])}" x2="{_f(b[0])}" y2="{_f(b[1])}"{style}>{tip}</line>'
        )

    def box(self, x: float, y: float, w: float, h: float, radius: float = 5.0) -> str:
        return f'<rect x="{_f(x - w / 2)}" y="{_f(y - h / 2)}" width="{_f(w)}" height="{_f(h)}" rx="{_f(radius)}"/>'

    def text(self, x: float, y: float, text: str, cls: str = "", anchor: str = "middle") -> str:
        c = f' class="{cls}"' if cls else ""
        return f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" dominant-baseline="central"{c}>{_e(text)}</text>'

    def tag(self, x: float, y: float, text: str) -> None:
        """A small label on a line, on a background so it stays readable where lines cross."""
        w = 6.5 * len(text) + 6
        self.add(f'<rect class="tp-tag" x="{_f(x - w / 2)}" y="{_f(y - 7)}" width="{_f(w)}" height="14" rx="3"/>')
        self.add(self.text(x, y, text, "tp-small"))


def _pcie_tokens(topology: Topology) -> list[tuple[str, int]]:
    """The PCIe path classes (PIX, PXB, PHB) among the device pairs and how many pairs have each, most first."""
    found = Counter(lk.token for _, _, lk in _pairs(topology) if link_class(lk) == "pcie")
    return sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))


def _circle(n: int, radius: float) -> list[tuple[float, float]]:
    """Device centres on a circle, clockwise from the top left (GPU0..3 along the top of 8); y grows down."""
    if n == 1:
        return [(0.0, 0.0)]
    return [
        (radius * math.cos(math.pi * (0.75 - 2 * i / n)), -radius * math.sin(math.pi * (0.75 - 2 * i / n)))
        for i in range(n)
    ]


def _device_word(topology: Topology) -> str:
    return "GPU" if topology.kind == "cuda" else "CPU slot"


def _node(c: _Canvas, topology: Topology, i: int, x: float, y: float, held: Mapping[int, str]) -> None:
    d = topology.devices[i]
    job = held.get(i)
    what = f"{d.label}" + (f" · {d.model}" if d.model and d.model != "cpu" else "")
    if d.memory_gb:
        what += f" · {d.memory_gb:g} GB"
    near = topology.nearest_nics(i)
    if near:
        what += f" · nearest NIC {'/'.join(near)}"
    state = f"job {job}" if job is not None else "free"
    c.add(
        f'<g class="tp-node{" held" if job is not None else ""}" data-device="{i}">'
        f"<title>{_e(what)} · {_e('held by ' + state if job is not None else 'free')}</title>"
        f"{c.box(x, y, NODE_W, NODE_H)}{c.text(x, y - 8, d.label)}{c.text(x, y + 9, state, 'tp-small tp-state')}</g>"
    )
    c.cover(x, y, NODE_W, NODE_H)


def _gpu_graph(c: _Canvas, topology: Topology, held: Mapping[int, str]) -> float:
    """Draw a GPU box; returns the radius its devices sit on."""
    n = topology.device_count
    radius = max(150.0, n * 100.0 / (2 * math.pi))
    pos = _circle(n, radius)
    if topology.fabric is None:
        _cliques(c, topology, pos, radius)
    order = ("sockets", "socket", "pcie", "nvlink")
    edges = _pairs(topology)
    tags: list[tuple[float, float, str]] = []
    tokens = _pcie_tokens(topology)
    plain = tokens[0][0] if tokens else ""  # the commonest PCIe class goes unlabelled; the legend names it
    for cls in order:
        for a, b, lk in edges:
            if link_class(lk) != cls:
                continue
            (xa, ya), (xb, yb) = pos[a], pos[b]
            words = f"{topology.devices[a].label} – {topology.devices[b].label}: {lk.token}"
            words += f" ({LINK_CLASSES[cls][0]}), {lk.bandwidth:g} GB/s per direction"
            width = 1.5 * lk.links + 0.5 if cls == "nvlink" else None
            c.line((xa, ya), (xb, yb), f"tp-{cls}", width, words)
            if cls == "nvlink" or (cls == "pcie" and lk.token != plain):
                t = 0.5
                if math.hypot((xa + xb) / 2, (ya + yb) / 2) < 0.2 * radius:
                    t = 0.28  # diameters all cross the centre: move their labels apart
                tags.append((xa + (xb - xa) * t, ya + (yb - ya) * t, lk.token))
    fab = topology.fabric
    if fab is not None:
        for i, (x, y) in enumerate(pos):
            words = f"{topology.devices[i].label} – NVSwitch: NV{fab.links_per_gpu}, {fab.gpu_bandwidth:g} GB/s per direction"
            c.line((0.0, 0.0), (x, y), "tp-nvswitch", 1 + fab.links_per_gpu / 4, words)
        switches = f"{fab.switches} NVSwitches" if fab.switches else "NVSwitch fabric"
        c.add(
            f'<g class="tp-hub"><title>{_e(switches)}: every GPU attaches with NV{fab.links_per_gpu} = '
            f"{fab.gpu_bandwidth:g} GB/s per direction to any peer</title>{c.box(0, 0, 150, 44, 8)}"
            f"{c.text(0, -9, switches)}{c.text(0, 9, f'NV{fab.links_per_gpu} · {fab.gpu_bandwidth:g} GB/s per GPU', 'tp-small')}</g>"
        )
    for x, y, text in tags:
        c.tag(x, y, text)
    under = len(c.parts)  # NIC lines go below the devices, drawn next
    for i, (x, y) in enumerate(pos):
        _node(c, topology, i, x, y, held)
    _nics(c, topology, pos, radius, under)
    return radius


def _cliques(c: _Canvas, topology: Topology, pos: list[tuple[float, float]], radius: float) -> None:
    """NVLink cliques of three or more: a band outside the ring along their devices (a shaded hull if apart)."""
    n = topology.device_count
    r = radius + 46
    for clique in nvlink_cliques(topology):
        if len(clique) < 3:
            continue
        label = "{" + ",".join(map(str, clique)) + "}"
        tip = f"<title>NVLink clique {label}: NVLink between every pair</title>"
        members = set(clique)
        starts = [i for i in clique if (i - 1) % n not in members]
        if len(clique) == n:
            c.add(f'<circle class="tp-clique-band" cx="0" cy="0" r="{_f(r)}">{tip}</circle>')
            c.cover(0, 0, 2 * r + 10, 2 * r + 10)
        elif len(starts) == 1:  # consecutive on the ring (wrapping): an arc from the first to the last
            first = starts[0]
            step = 2 * math.pi / n
            a0 = math.pi * (0.75 - 2 * first / n) + step * 0.35
            a1 = a0 - step * (len(clique) - 1 + 0.7)
            x0, y0 = r * math.cos(a0), -r * math.sin(a0)
            x1, y1 = r * math.cos(a1), -r * math.sin(a1)
            large = 1 if (a0 - a1) > math.pi else 0
            c.add(
                f'<path class="tp-clique-band" d="M {_f(x0)} {_f(y0)} A {_f(r)} {_f(r)} 0 {large} 1 {_f(x1)} {_f(y1)}">{tip}</path>'
            )
            mid = (a0 + a1) / 2
            c.tag((r + 14) * math.cos(mid), -(r + 14) * math.sin(mid), label)
        else:
            pts = sorted((pos[i] for i in clique), key=lambda p: math.atan2(p[1], p[0]))
            scaled = " ".join(f"{_f(x * 1.15)},{_f(y * 1.15)}" for x, y in pts)
            c.add(f'<polygon class="tp-clique" points="{scaled}">{tip}</polygon>')


def _nics(c: _Canvas, topology: Topology, pos: list[tuple[float, float]], radius: float, under: int) -> None:
    """Each NIC beside the devices it is nearest to; its lines to them go in at ``under`` (below the devices)."""
    groups, far = nic_groups(topology)
    lines = _Canvas()
    for near, nics in groups:
        cx = sum(pos[i][0] for i in near) / len(near)
        cy = sum(pos[i][1] for i in near) / len(near)
        norm = math.hypot(cx, cy)
        ux, uy = (cx / norm, cy / norm) if norm > 1e-6 else (0.0, -1.0)
        widths = [max(70.0, 7.0 * len(nic.name) + 16) for nic in nics]
        span = sum(widths) + 8 * (len(nics) - 1)
        offset = -span / 2
        for nic, w in zip(nics, widths, strict=True):
            shift = offset + w / 2
            offset += w + 8
            nx, ny = ux * (radius + 95) - uy * shift, uy * (radius + 95) + ux * shift
            path = nic.paths[near[0]]
            for i in near:
                lines.line((nx, ny), pos[i], "tp-niclink")
            rate = f", {nic.gbps:g} Gb/s" if nic.gbps else ""
            devices = ", ".join(topology.devices[i].label for i in near)
            c.add(
                f'<g class="tp-nic" data-nic="{_e(nic.name)}"><title>NIC {_e(nic.name)}{_e(rate)}: nearest '
                f"{_e(devices)} ({_e(path)})</title>{c.box(nx, ny, w, NIC_H, 4)}{c.text(nx, ny, nic.name, 'tp-small')}</g>"
            )
            c.cover(nx, ny, w, NIC_H)
    c.parts[under:under] = lines.parts
    if far:
        y = c.y1 + 22
        c.add(c.text(0, y, "NICs near no GPU in particular: " + ", ".join(nic.name for nic in far), "tp-small"))
        c.cover(0, y, 9 * 40, 14)


def _cpu_graph(c: _Canvas, topology: Topology, held: Mapping[int, str]) -> None:
    """CPU worker slots in rows above the host memory they share."""
    n = topology.device_count
    cols = min(n, 8)
    rows = math.ceil(n / cols)
    pitch_x, pitch_y = NODE_W + 24, NODE_H + 26
    width = (cols - 1) * pitch_x
    pos = [(-width / 2 + (i % cols) * pitch_x, (i // cols) * pitch_y) for i in range(n)]
    hub_y = (rows - 1) * pitch_y + NODE_H / 2 + (48 if rows == 1 else 22)
    hub_w = max(width + NODE_W, 220.0)
    shm = [lk for _, _, lk in _pairs(topology) if lk.kind == "shm"]
    rate = f", {shm[0].bandwidth:g} GB/s nominal" if shm else ""
    title = f"<title>host memory, shared by every slot{_e(rate)}</title>"
    if rows == 1:
        for i, (x, y) in enumerate(pos):
            c.line(
                (x, y + NODE_H / 2), (x, hub_y - 15), "tp-shm", None, f"{topology.devices[i].label} – host memory{rate}"
            )
        c.add(f'<g class="tp-shmhub">{title}{c.box(0, hub_y, hub_w, 30, 6)}'
              f"{c.text(0, hub_y, 'host memory (shared by every slot)', 'tp-small')}</g>")  # fmt: skip
        c.cover(0, hub_y, hub_w, 30)
    else:  # rows of slots: one box of host memory around them all, rather than spokes through the rows
        top, bottom = -NODE_H / 2 - 14, hub_y + 6
        c.add(f'<g class="tp-shmhub">{title}{c.box(0, (top + bottom) / 2, hub_w + 28, bottom - top, 8)}'
              f"{c.text(0, bottom - 14, 'host memory (shared by every slot)', 'tp-small')}</g>")  # fmt: skip
        c.cover(0, (top + bottom) / 2, hub_w + 28, bottom - top)
    for i, (x, y) in enumerate(pos):
        _node(c, topology, i, x, y, held)


def _legend(c: _Canvas, topology: Topology) -> None:
    counts = link_counts(topology)
    entries: list[tuple[str, str]] = []  # (swatch markup, text)
    for cls, pairs in counts.items():
        name = LINK_CLASSES[cls][0]
        text = f"{name} · {pairs} pair{'s' if pairs != 1 else ''}"
        if cls == "nvlink":
            text += f", {nvlink_total(topology)} links"
        if cls == "pcie":
            tokens = _pcie_tokens(topology)
            text += f" ({tokens[0][0]} unless labelled)" if len(tokens) > 1 else f" ({tokens[0][0]})"
        if cls == "nvswitch" and topology.fabric is not None:
            text = f"{name} · {topology.device_count} GPUs × NV{topology.fabric.links_per_gpu}"
        width = "3" if cls in ("nvlink", "nvswitch") else None
        entries.append((f'<line class="tp-{cls}" x1="0" y1="0" x2="26" y2="0"'
                        + (f' style="stroke-width:{width}"' if width else "") + "/>", text))  # fmt: skip
    big = [cl for cl in nvlink_cliques(topology) if len(cl) >= 3] if topology.fabric is None else []
    if big:
        entries.append(('<line class="tp-clique-band" x1="0" y1="0" x2="26" y2="0"/>',
                        f"NVLink clique (3+ GPUs, every pair linked) · {len(big)}"))  # fmt: skip
    groups, _ = nic_groups(topology)
    wired = sum(len(nics) for _, nics in groups)
    if wired:
        entries.append(('<line class="tp-niclink" x1="0" y1="0" x2="26" y2="0"/>',
                        f"NIC to its nearest {_device_word(topology)}s · {wired} NIC{'s' if wired != 1 else ''}"))  # fmt: skip
    if not entries:
        return
    columns = 2 if len(entries) > 3 else 1
    col_w = max(6.6 * len(text) for _, text in entries) + 56
    left = -col_w * columns / 2 + 10
    top = c.y1 + 26
    for k, (swatch, text) in enumerate(entries):
        x = left + (k % columns) * col_w
        y = top + (k // columns) * 20
        c.add(f'<g transform="translate({_f(x)},{_f(y)})">{swatch}{c.text(34, 0, text, "", "start")}</g>')
    c.cover(0, top + ((len(entries) - 1) // columns) * 20, col_w * columns, 20)


def description(topology: Topology) -> str:
    """What the picture shows, in words (its ``<desc>``): devices, links by class, cliques, NICs."""
    n = topology.device_count
    word = _device_word(topology)
    models = sorted({d.model for d in topology.devices if d.model and d.model != "cpu"})
    parts = [
        f"{topology.name}: {n} {word}{'s' if n != 1 else ''}" + (f" ({', '.join(models)})" if models else "") + "."
    ]
    counts = link_counts(topology)
    if topology.fabric is not None:
        f = topology.fabric
        parts.append(
            f"Every GPU attaches to an NVSwitch fabric with NV{f.links_per_gpu} ({f.gpu_bandwidth:g} GB/s per direction)."
        )
    devices = topology.devices
    nv = [f"{devices[a].label}–{devices[b].label} {lk.token}" for a, b, lk in _pairs(topology) if lk.kind == "nvlink"]
    if nv:
        parts.append("NVLink: " + ", ".join(nv) + ".")
    for cls, pairs in counts.items():
        if cls not in ("nvlink", "nvswitch"):
            parts.append(f"{LINK_CLASSES[cls][0]}: {pairs} pair{'s' if pairs != 1 else ''}.")
    cliques = [cl for cl in nvlink_cliques(topology) if len(cl) >= 3]
    if cliques:
        parts.append("NVLink cliques: " + " ".join("{" + ",".join(map(str, cl)) + "}" for cl in cliques) + ".")
    groups, far = nic_groups(topology)
    if groups:
        parts.append(
            "Nearest NICs: "
            + "; ".join(
                f"{', '.join(nic.name for nic in nics)} to {', '.join(topology.devices[i].label for i in near)}"
                for near, nics in groups
            )
            + "."
        )
    if far:
        parts.append("NICs near no GPU in particular: " + ", ".join(nic.name for nic in far) + ".")
    return " ".join(parts)


def render_svg(topology: Topology, *, held: Mapping[int, str] | None = None, id_prefix: str = "topo") -> Markup:
    """``topology`` as an inline ``<svg>`` element; ``held`` maps a device index to the job holding it."""
    c = _Canvas()
    held = held or {}
    if topology.kind == "cpu":
        _cpu_graph(c, topology, held)
    else:
        _gpu_graph(c, topology, held)
    _legend(c, topology)
    pad = 12.0
    x0, y0 = c.x0 - pad, c.y0 - pad
    w, h = c.x1 - c.x0 + 2 * pad, c.y1 - c.y0 + 2 * pad
    n = topology.device_count
    title = f"Topology of {topology.name}: {n} {_device_word(topology)}{'s' if n != 1 else ''}"
    pid = _e(id_prefix)
    return Markup(
        f'<svg class="tp-svg" xmlns="http://www.w3.org/2000/svg" viewBox="{_f(x0)} {_f(y0)} {_f(w)} {_f(h)}" '
        f'width="{_f(w)}" role="img" aria-labelledby="{pid}-title {pid}-desc">'
        f'<title id="{pid}-title">{_e(title)}</title><desc id="{pid}-desc">{_e(description(topology))}</desc>'
        f"<style>{STYLE}</style>" + "".join(c.parts) + "</svg>"
    )
