"""A picture of a topology's link graph, as PNG (``deskpod topo --png FILE``).

GPUs sit on a circle. NVLink pairs are solid lines as thick as their link count, labelled ``NV#``;
an NVSwitch fabric is a box in the middle with one spoke per GPU; PCIe paths inside a switch tree
(PIX, PXB) are thin dashed lines (farther classes are left out: every pair has one). Each NIC is a
square beside the GPUs it is nearest to. Drawn with matplotlib's object API (no pyplot state).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from deskpod.errors import UsageError
from deskpod.hardware.topology import Nic, Topology


def _positions(n: int, radius: float = 1.0) -> list[tuple[float, float]]:
    # Start at the top-left and go clockwise, so GPU0..3 form the top row of an 8-GPU box.
    return [
        (radius * math.cos(math.pi * (0.75 - 2 * i / n)), radius * math.sin(math.pi * (0.75 - 2 * i / n)))
        for i in range(n)
    ]


def render_png(topology: Topology, path: str | Path) -> Path:
    """Draw ``topology`` and write it to ``path`` as PNG; returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(path)
    if out.parent and not out.parent.exists():
        raise UsageError(f"--png {str(out)!r}: folder {str(out.parent)!r} does not exist")
    n = topology.device_count
    fig = Figure(figsize=(7, 7), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_aspect("equal")
    ax.axis("off")
    pos = _positions(n)
    word = "GPU" if topology.kind == "cuda" else "CPU"
    title = f"{topology.name}: {n} {word}{'s' if n != 1 else ''}"
    if topology.fabric is not None:
        title += f", NVSwitch fabric ({topology.fabric.gpu_bandwidth:g} GB/s per GPU per direction)"
        ax.add_patch(_box(fig, (0.0, 0.0), 0.5, 0.22, "#ffe7a3"))
        ax.text(0, 0, "NVSwitch", ha="center", va="center", fontsize=10, zorder=5)
        for i, (x, y) in enumerate(pos):
            ax.plot(
                [0, x * 0.85], [0, y * 0.85], color="#76b900", linewidth=1 + topology.fabric.links_per_gpu / 6, zorder=1
            )
            ax.text(x * 0.5, y * 0.5, f"NV{topology.fabric.links_per_gpu}", fontsize=7, ha="center", color="#3a5c00")
            del i
    for a in range(n):
        for b in range(a + 1, n):
            lk = topology.links[a][b]
            (xa, ya), (xb, yb) = pos[a], pos[b]
            if lk.kind == "nvlink":
                ax.plot([xa, xb], [ya, yb], color="#76b900", linewidth=1.5 * lk.links + 0.5, zorder=1)
                ax.text(
                    (xa + xb) / 2,
                    (ya + yb) / 2,
                    lk.token,
                    fontsize=8,
                    ha="center",
                    va="center",
                    color="#2d4700",
                    zorder=4,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
                )
            elif lk.kind == "pcie" and lk.token in ("PIX", "PXB"):
                ax.plot([xa, xb], [ya, yb], color="#888888", linewidth=0.8, linestyle="--", zorder=0)
                ax.text((xa + xb) / 2, (ya + yb) / 2, lk.token, fontsize=6, ha="center", va="center", color="#666666")
            elif lk.kind == "shm" and n <= 16:
                ax.plot([xa, xb], [ya, yb], color="#9ab", linewidth=0.6, zorder=0)
    for i, (x, y) in enumerate(pos):
        ax.add_patch(_circle(fig, (x, y), 0.13))
        ax.text(x, y, f"{word}{i}", ha="center", va="center", fontsize=9, zorder=6)
    groups: dict[tuple[int, ...], list[str]] = {}
    far: list[str] = []
    for nic in topology.nics:
        near = tuple(_near(topology, nic))
        if nic.rank_to(near[0]) >= 5 or len(near) == n > 2:
            far.append(nic.name)  # near no GPU in particular (e.g. a storage NIC): listed, not wired
        else:
            groups.setdefault(near, []).append(nic.name)
    for near, names in groups.items():
        cx = sum(pos[i][0] for i in near) / len(near)
        cy = sum(pos[i][1] for i in near) / len(near)
        norm = math.hypot(cx, cy) or 1.0
        ux, uy = cx / norm, cy / norm
        for k, name in enumerate(names):
            shift = (k - (len(names) - 1) / 2) * 0.38
            nx, ny = ux * 1.45 - uy * shift, uy * 1.45 + ux * shift
            ax.add_patch(_box(fig, (nx, ny), 0.34, 0.12, "#cfe3ff"))
            ax.text(nx, ny, name, ha="center", va="center", fontsize=6, zorder=6)
            for i in near:
                ax.plot([nx, pos[i][0]], [ny, pos[i][1]], color="#5b8fd9", linewidth=0.6, linestyle=":", zorder=0)
    if far:
        ax.text(0, -1.75, "NICs near no GPU: " + ", ".join(far), ha="center", fontsize=7, color="#335")
    ax.text(
        0,
        1.72,
        "solid: NVLink (width = links)   dashed: PCIe inside a switch tree (PIX, PXB)   dotted: nearest NIC",
        ha="center",
        fontsize=7,
        color="#555555",
    )
    ax.set_xlim(-1.8, 1.8)
    ax.set_ylim(-1.8, 1.8)
    ax.set_title(title, fontsize=10)
    fig.savefig(out, format="png")
    return out


def _near(topology: Topology, nic: Nic) -> list[int]:
    n = topology.device_count
    best = min(nic.rank_to(j) for j in range(n))
    return [i for i in range(n) if nic.rank_to(i) == best]


def _circle(fig: object, xy: tuple[float, float], r: float) -> Any:
    from matplotlib.patches import Circle

    return Circle(xy, r, facecolor="#f2f2f2", edgecolor="#333333", zorder=5)


def _box(fig: object, center: tuple[float, float], w: float, h: float, color: str) -> Any:
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch(
        (center[0] - w / 2, center[1] - h / 2),
        w,
        h,
        boxstyle="round,pad=0.02",
        facecolor=color,
        edgecolor="#333333",
        zorder=5,
    )
