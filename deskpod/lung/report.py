"""The report of ``deskpod lung analyze``: ``report.json``, PNG pictures and ``summary.txt``, from an analyze `Report`.

Files written into the output folder (`write_report`):

- ``report.json``, schema `SCHEMA`: the disclaimer, the phantom label, the scan (source, size, spacing, origin,
  direction, lung volume), each nodule (id; position in LPS world mm and voxel index (x, y, z); long, short axis
  and Lung-RADS mean diameter to 0.1 mm; volume in mm³; type, with the solid part of a part-solid nodule; the
  Brock estimate with every input and its source; radiomics features; Lung-RADS category, the rule that decided
  it and its follow-up; with a prior: the matched prior nodule, growth and volume doubling time, or "new"), the
  resolved prior nodules, the registration, the exam category, the candidates dropped and why, and the time of
  every stage (a stage that did not run says why and has no time). Numbers that are not finite (a VDT of a
  nodule that did not change is infinite) are written as null with a word saying why, so the file is strict JSON;
- ``nodule-<id>.png``: an axial slice through each nodule's centre (lung window, level -600 HU, width 1500 HU),
  `NODULE_FIELD_MM` wide, with the segmentation's contour and a 10 mm scale bar, `NODULE_PX` pixels square;
- ``overview-mip.png``: the axial maximum-intensity projection of the lung region (the lung mask; outside it
  -1000 HU), every nodule circled and numbered, `OVERVIEW_PX` pixels square;
- ``summary.txt``: the disclaimer first, then the phantom label, the exam category and follow-up, one line per
  nodule, the resolved nodules and the stages that did not run.

Plain text and JSON only: nothing is escaped, and odd values (NaN, infinities, missing stages) never crash it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from deskpod import __version__
from deskpod.lung import brock, growth, lungrads
from deskpod.lung.images import Scan, window
from deskpod.lung.lungmask import LungMask
from deskpod.lung.measure import Axes

SCHEMA = "deskpod.lung.analyze/1"
DISCLAIMER = "deskpod lung analyze: decision support, not a medical device. A radiologist decides."
PHANTOM_LABEL = "PHANTOM DATA: synthetic scan, not a clinical result"
LUNG_WINDOW = (-600.0, 1500.0)
NODULE_FIELD_MM = 60.0
NODULE_PX = 512
OVERVIEW_PX = 768
MAX_DROPPED = 200
"""Dropped candidates listed in the JSON (their total is always given)."""
_DPI = 100


StageStatus = Literal["ran", "not run"]


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of the pipeline: whether it ran, how long it took, and a note (why it did not run)."""

    name: str
    status: StageStatus
    seconds: float | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class ScanInfo:
    """Where a scan came from and its geometry (spacing and origin in mm, (x, y, z); shape (z, y, x))."""

    source: str
    shape_zyx: tuple[int, int, int]
    spacing: tuple[float, float, float]
    origin: tuple[float, float, float]
    direction: tuple[tuple[float, float, float], ...]
    lung_ml: float | None
    lung_z_mm: tuple[float, float] | None
    """The lung mask's cranio-caudal extent in world z (inferior, superior)."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """A candidate that did not become a nodule, and why."""

    world_xyz: tuple[float, float, float]
    probability: float
    reason: str


@dataclass(frozen=True, slots=True, eq=False)  # holds an array: compared by identity
class Lesion:
    """A segmented, measured nodule of one scan (the mask cropped to its box, ``offset_zyx`` its corner)."""

    id: str
    probability: float
    source: str
    seed_world: tuple[float, float, float]
    axes: Axes
    lungrads_mean_mm: float
    volume_mm3: float
    kind: str
    solid_part: Axes | None
    solid_lungrads_mean_mm: float | None
    mean_hu: float
    centre_voxel: tuple[float, float, float]
    centre_world: tuple[float, float, float]
    mask: npt.NDArray[np.bool_]
    offset_zyx: tuple[int, int, int]

    def lungrads_nodule(self) -> lungrads.Nodule:
        """The nodule as Lung-RADS sees it (mean diameters to 0.1 mm, type)."""
        solid = self.solid_lungrads_mean_mm if self.kind == "part-solid" else None
        if solid is not None:
            solid = min(solid, self.lungrads_mean_mm)
        return lungrads.Nodule(self.lungrads_mean_mm, self.kind, solid)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Growth:
    """A current nodule against its matched prior nodule."""

    prior_id: str
    distance_mm: float
    """Between the current centre and the prior centre mapped into the current scan."""
    interval_days: float
    diameter: growth.DiameterChange
    solid: growth.DiameterChange | None
    """The solid component's change (part-solid nodules, or a type change), Lung-RADS' growth measure for them."""
    prior_volume_mm3: float
    volume_doubling_days: float
    """VDT; ``inf`` when the volume did not change, negative when it shrank (its halving time)."""


@dataclass(frozen=True, slots=True, eq=False)
class Finding:
    """A nodule of the current scan with everything the report says about it (None: that stage did not run)."""

    lesion: Lesion
    upper_lobe: bool
    risk: brock.Risk | None
    radiomics: dict[str, float] | None
    radiomics_note: str
    lungrads: lungrads.Assessment
    status: Literal["baseline", "matched", "new"]
    growth: Growth | None


@dataclass(frozen=True, slots=True, eq=False)
class PriorFinding:
    """A nodule of the prior scan, its centre mapped into the current scan, and whether it resolved."""

    lesion: Lesion
    centre_in_current: tuple[float, float, float] | None
    matched_id: str | None


@dataclass(frozen=True, slots=True)
class Patient:
    """The Brock inputs a scan does not give (None: the model's stated default)."""

    age: float | None = None
    sex: Literal["female", "male"] | None = None
    family_history: bool | None = None
    emphysema: bool | None = None


@dataclass(frozen=True, slots=True, eq=False)  # holds the scan and masks for the pictures
class Report:
    """Everything ``deskpod lung analyze`` found; `deskpod.lung.report` writes it as JSON, PNGs and text."""

    scan: ScanInfo
    findings: tuple[Finding, ...]
    exam: lungrads.Assessment
    stages: tuple[Stage, ...]
    dropped: tuple[Dropped, ...]
    detection: str
    patient: Patient
    phantom: bool
    phantom_reason: str
    prior: ScanInfo | None = None
    prior_findings: tuple[PriorFinding, ...] = ()
    prior_dropped: tuple[Dropped, ...] = ()
    interval_days: float | None = None
    registration: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    upper_lobe_rule: str = ""
    image: Scan | None = field(default=None, repr=False)
    lungs: LungMask | None = field(default=None, repr=False)

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def resolved(self) -> tuple[PriorFinding, ...]:
        """Prior nodules no current nodule matched."""
        return tuple(p for p in self.prior_findings if p.matched_id is None)


@dataclass(frozen=True, slots=True)
class Written:
    """The files `write_report` wrote."""

    json: Path
    summary: Path
    overview: Path | None
    nodules: tuple[Path, ...]


def write_report(report: Report, out: Path) -> Written:
    """Write ``report.json``, the PNGs and ``summary.txt`` into ``out`` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("nodule-*.png"), out / "overview-mip.png"]:  # a previous report's pictures: never stale
        old.unlink(missing_ok=True)
    t0 = time.perf_counter()
    pictures: list[Path] = []
    overview: Path | None = None
    if report.image is not None:
        for f in report.findings:
            pictures.append(draw_nodule(report, f, out / f"nodule-{f.lesion.id}.png"))
        if report.lungs is not None:
            overview = draw_overview(report, out / "overview-mip.png")
    seconds = time.perf_counter() - t0
    data = to_json(report, pictures_s=seconds, overview=overview)
    json_path = out / "report.json"
    json_path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    summary_path = out / "summary.txt"
    summary_path.write_text(summary(report))
    return Written(json_path, summary_path, overview, tuple(pictures))


# ---------------------------------------------------------------- JSON
def _num(value: float | None, digits: int | None = None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits) if digits is not None else float(value)


def _axes(axes: Axes | None) -> dict[str, Any] | None:
    if axes is None:
        return None
    return {
        "long_axis_mm": round(axes.long_mm, 1),
        "short_axis_mm": round(axes.short_mm, 1),
        "mean_diameter_mm": axes.mean_mm,
        "axial_slice_z": axes.slice_z,
    }


def _vdt_text(days: float) -> str:
    if math.isinf(days):
        return "never doubles (volume unchanged)"
    if days < 0:
        return f"{-days:.0f} days halving time (shrinking)"
    return f"{days:.0f} days"


def _nodule_json(report: Report, f: Finding) -> dict[str, Any]:
    les = f.lesion
    vx = [round(v) for v in les.centre_voxel]
    risk = None
    if f.risk is not None:
        risk = {
            "model": f.risk.model,
            "probability": _num(f.risk.probability),
            "logit": _num(f.risk.logit),
            "inputs": [
                {"name": i.name, "value": i.value, "source": i.source, "logit_term": _num(i.term)}
                for i in f.risk.inputs
            ],
            "upper_lobe_rule": report.upper_lobe_rule or None,
            "spiculation": "not estimated from the scan: the model's default (not spiculated)",
            "notes": list(f.risk.notes),
        }
    growth = None
    if f.growth is not None:
        g = f.growth
        growth = {
            "prior_id": g.prior_id,
            "distance_mm": round(g.distance_mm, 1),
            "interval_days": g.interval_days,
            "mean_diameter": _change_json(g.diameter),
            "solid_component": None if g.solid is None else _change_json(g.solid),
            "prior_volume_mm3": round(g.prior_volume_mm3, 1),
            "volume_doubling_time_days": _num(g.volume_doubling_days, 1),
            "volume_doubling_time": _vdt_text(g.volume_doubling_days),
        }
    return {
        "id": les.id,
        "status": f.status,
        "detection": {
            "source": les.source,
            "probability": _num(les.probability),
            "seed_world_mm": [round(v, 2) for v in les.seed_world],
        },
        "position": {
            "world_mm_lps": [round(v, 1) for v in les.centre_world],
            "voxel_xyz": vx,
            "voxel_xyz_continuous": [round(v, 2) for v in les.centre_voxel],
        },
        "long_axis_mm": round(les.axes.long_mm, 1),
        "short_axis_mm": round(les.axes.short_mm, 1),
        "mean_diameter_mm": les.lungrads_mean_mm,
        "axial_slice_z": les.axes.slice_z,
        "volume_mm3": round(les.volume_mm3, 1),
        "type": les.kind,
        "solid_part": _solid_json(les),
        "mean_hu": round(les.mean_hu, 1),
        "upper_lobe": f.upper_lobe,
        "malignancy": risk,
        "radiomics": None if f.radiomics is None else {k: _num(v) for k, v in f.radiomics.items()},
        "radiomics_note": f.radiomics_note or None,
        "lung_rads": asdict(f.lungrads) | {"version": lungrads.VERSION},
        "growth": growth,
        "picture": f"nodule-{les.id}.png" if report.image is not None else None,
    }


def _change_json(c: growth.DiameterChange) -> dict[str, Any]:
    return {"prior_mm": c.prior_mm, "current_mm": c.current_mm, "change_mm": c.increase_mm, "status": c.status,
            "reason": c.reason}  # fmt: skip


def _solid_json(les: Any) -> dict[str, Any] | None:
    part = _axes(les.solid_part) if les.kind == "part-solid" else None
    if part is None:
        return None
    return part | {"lungrads_mean_diameter_mm": les.solid_lungrads_mean_mm}


def _scan_json(info: Any) -> dict[str, Any]:
    z, y, x = info.shape_zyx
    return {
        "source": info.source,
        "size_xyz": [x, y, z],
        "spacing_mm_xyz": [round(s, 4) for s in info.spacing],
        "origin_mm_lps": [round(o, 3) for o in info.origin],
        "direction": [list(r) for r in info.direction],
        "lung_volume_ml": _num(info.lung_ml, 1),
        "lung_z_extent_mm": None if info.lung_z_mm is None else [round(v, 1) for v in info.lung_z_mm],
    }


def to_json(report: Report, *, pictures_s: float | None = None, overview: Path | None = None) -> dict[str, Any]:
    """The report as a JSON-able dict (strict JSON: non-finite numbers become null)."""
    stages: list[dict[str, Any]] = [
        {"name": s.name, "status": s.status, "seconds": _num(s.seconds, 3), "note": s.note or None}
        for s in report.stages
    ]
    if pictures_s is not None:
        stages.append({"name": "pictures", "status": "ran", "seconds": round(pictures_s, 3), "note": None})
    total = sum(s["seconds"] or 0.0 for s in stages)
    prior = None
    if report.prior is not None:
        prior = {
            "scan": _scan_json(report.prior),
            "interval_days": report.interval_days,
            "registration": None
            if report.registration is None
            else {k: (_num(v) if isinstance(v, float) else v) for k, v in report.registration.items()},
            "nodules": [
                {
                    "id": p.lesion.id,
                    "world_mm_lps_prior": [round(v, 1) for v in p.lesion.centre_world],
                    "world_mm_lps_in_current": None
                    if p.centre_in_current is None
                    else [round(v, 1) for v in p.centre_in_current],
                    "voxel_xyz_prior": [round(v) for v in p.lesion.centre_voxel],
                    "long_axis_mm": round(p.lesion.axes.long_mm, 1),
                    "short_axis_mm": round(p.lesion.axes.short_mm, 1),
                    "mean_diameter_mm": p.lesion.lungrads_mean_mm,
                    "volume_mm3": round(p.lesion.volume_mm3, 1),
                    "type": p.lesion.kind,
                    "matched_id": p.matched_id,
                    "resolved": p.matched_id is None and report.registration is not None,
                }
                for p in report.prior_findings
            ],
            "resolved": [p.lesion.id for p in report.resolved] if report.registration is not None else None,
            "dropped_candidates": len(report.prior_dropped),
        }
    return {
        "schema": SCHEMA,
        "disclaimer": "decision support, not a medical device",
        "phantom": report.phantom,
        "phantom_label": f"{PHANTOM_LABEL} ({report.phantom_reason})" if report.phantom else None,
        "deskpod_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scan": _scan_json(report.scan),
        "detection": report.detection,
        "patient": asdict(report.patient) | {"note": "null: not given; the Brock model's stated default is used"},
        "exam": asdict(report.exam),
        "nodules": [_nodule_json(report, f) for f in report.findings],
        "prior": prior,
        "dropped_candidates": {
            "count": len(report.dropped),
            "listed": [
                {
                    "world_mm_lps": [round(v, 1) for v in d.world_xyz],
                    "probability": _num(d.probability),
                    "reason": d.reason,
                }
                for d in report.dropped[:MAX_DROPPED]
            ],
        },
        "stages": stages,
        "total_seconds": round(total, 3),
        "pictures": {
            "overview": overview.name if overview is not None else None,
            "nodules": [f"nodule-{f.lesion.id}.png" for f in report.findings] if report.image is not None else [],
        },
        "notes": list(report.notes),
    }


# ---------------------------------------------------------------- text
def _line(f: Finding) -> str:
    les = f.lesion
    x, y, z = les.centre_world
    vx, vy, vz = (round(v) for v in les.centre_voxel)
    kind = les.kind
    if les.kind == "part-solid" and les.solid_lungrads_mean_mm is not None:
        kind = f"part-solid (solid part {les.solid_lungrads_mean_mm:.1f} mm)"
    text = (
        f"{les.id}: {kind}, {les.axes.long_mm:.1f} x {les.axes.short_mm:.1f} mm (mean {les.lungrads_mean_mm:.1f} "
        f"mm), {les.volume_mm3:.0f} mm3, at ({x:.1f}, {y:.1f}, {z:.1f}) mm LPS, voxel ({vx}, {vy}, {vz})"
    )
    if f.risk is not None and math.isfinite(f.risk.probability):
        text += f"; Brock {100 * f.risk.probability:.1f}%"
    if f.growth is not None:
        g = f.growth
        text += f"; prior {g.prior_id}: {g.diameter.increase_mm:+.1f} mm, {g.diameter.status}, VDT {_vdt_text(g.volume_doubling_days)}"
    elif f.status == "new":
        text += "; new (no prior nodule matched)"
    text += f"; Lung-RADS {f.lungrads.category}"
    return text


def summary(report: Report) -> str:
    """The short human summary: the disclaimer first, the exam, one line per nodule."""
    lines = [DISCLAIMER]
    if report.phantom:
        lines.append(f"{PHANTOM_LABEL} ({report.phantom_reason}).")
    z, y, x = report.scan.shape_zyx
    sx, sy, sz = report.scan.spacing
    lines.append(f"Scan: {report.scan.source} ({x}x{y}x{z} voxels, {sx:.2f} x {sy:.2f} x {sz:.2f} mm)")
    if report.prior is not None:
        lines.append(f"Prior: {report.prior.source}, {report.interval_days:g} days earlier")
    lines.append(f"Exam: Lung-RADS {report.exam.category}. Follow-up: {report.exam.follow_up}")
    if report.findings:
        lines.append(f"Nodules ({len(report.findings)}):")
        lines += [f"  {_line(f)}" for f in report.findings]
    else:
        lines.append("Nodules: none found" if not _not_run(report, "detect") else "Nodules: detection did not run")
    if report.prior is not None and report.registration is not None:
        gone = [p.lesion.id for p in report.resolved]
        lines.append(f"Resolved (in the prior, not found now): {', '.join(gone) if gone else 'none'}")
    for s in report.stages:
        if s.status == "not run" and s.note not in ("no nodules", "no detection"):
            lines.append(f"Not run: {s.name}: {s.note}")
    total = sum(s.seconds or 0.0 for s in report.stages)
    lines.append(f"Analysis took {total:.1f} s.")
    return "\n".join(lines) + "\n"


def _not_run(report: Report, name: str) -> bool:
    return any(s.name == name and s.status == "not run" for s in report.stages)


# ---------------------------------------------------------------- pictures
def _figure(px: int) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(px / _DPI, px / _DPI), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def draw_nodule(report: Report, f: Finding, path: Path) -> Path:
    """An axial slice through the nodule's centre, lung window, with its contour and a 10 mm scale bar."""
    assert report.image is not None
    scan = report.image
    les = f.lesion
    sx, sy = scan.spacing[0], scan.spacing[1]
    nz, ny, nx = scan.shape
    cz = int(np.clip(round(les.centre_voxel[2]), 0, nz - 1))
    cx, cy = les.centre_voxel[0], les.centre_voxel[1]
    hx, hy = math.ceil(NODULE_FIELD_MM / 2 / sx), math.ceil(NODULE_FIELD_MM / 2 / sy)
    x0, x1 = max(0, int(cx) - hx), min(nx, int(cx) + hx + 1)
    y0, y1 = max(0, int(cy) - hy), min(ny, int(cy) + hy + 1)
    plane = window(scan.hu[cz, y0:y1, x0:x1], *LUNG_WINDOW)
    ph, pw = int(plane.shape[0]), int(plane.shape[1])
    mask = np.zeros((ph, pw), dtype=bool)
    oz, oy, ox = les.offset_zyx
    if oz <= cz < oz + les.mask.shape[0]:
        part = les.mask[cz - oz]
        ys, xs = slice(max(oy, y0), min(oy + part.shape[0], y1)), slice(max(ox, x0), min(ox + part.shape[1], x1))
        mask[ys.start - y0 : ys.stop - y0, xs.start - x0 : xs.stop - x0] = part[
            ys.start - oy : ys.stop - oy, xs.start - ox : xs.stop - ox
        ]
    fig = _figure(NODULE_PX)
    ax = fig.add_axes((0.0, 0.0, 1.0, 0.92))
    extent = (0.0, pw * sx, ph * sy, 0.0)  # mm, y down as the image
    ax.imshow(plane, cmap="gray", vmin=0, vmax=255, extent=extent, interpolation="nearest")
    if mask.any() and ph > 1 and pw > 1:
        gy = (np.arange(ph) + 0.5) * sy
        gx = (np.arange(pw) + 0.5) * sx
        ax.contour(gx, gy, mask.astype(float), levels=[0.5], colors=["#ff3b30"], linewidths=1.2)
    w, h = extent[1], extent[2]
    bar_x, bar_y = 0.05 * w, 0.93 * h
    ax.plot([bar_x, bar_x + 10.0], [bar_y, bar_y], color="#ffd60a", linewidth=3)
    ax.text(bar_x + 5.0, bar_y - 0.02 * h, "10 mm", color="#ffd60a", ha="center", va="bottom", fontsize=9)
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_axis_off()
    title = (
        f"{les.id}: {les.kind}, mean {les.lungrads_mean_mm:.1f} mm, {les.volume_mm3:.0f} mm3, "
        f"Lung-RADS {f.lungrads.category}  (slice z={cz})"
    )
    fig.text(0.5, 0.965, title, ha="center", va="center", fontsize=9)
    foot = "decision support, not a medical device" + ("  -  PHANTOM DATA" if report.phantom else "")
    ax.text(0.98 * w, 0.02 * h, foot, color="white", ha="right", va="top", fontsize=7)
    fig.savefig(path, dpi=_DPI)
    return path


def draw_overview(report: Report, path: Path) -> Path:
    """The axial maximum-intensity projection of the lung region with every nodule circled and numbered."""
    assert report.image is not None and report.lungs is not None
    scan, lungs = report.image, report.lungs
    mip = np.full(scan.shape[1:], -1000.0, dtype=np.float32)
    step = 16
    for z0 in range(0, scan.shape[0], step):  # in slabs: no full-size temporary
        slab = np.where(lungs.mask[z0 : z0 + step], scan.hu[z0 : z0 + step], np.float32(-1000.0))
        np.maximum(mip, slab.max(axis=0), out=mip)
    for f in report.findings:  # the nodules themselves, which may lie on the mask's edge
        (oz, oy, ox), (dz, dy, dx) = f.lesion.offset_zyx, f.lesion.mask.shape[:3]
        inside = np.where(f.lesion.mask, scan.hu[oz : oz + dz, oy : oy + dy, ox : ox + dx], np.float32(-1000.0))
        region = mip[oy : oy + dy, ox : ox + dx]
        np.maximum(region, inside.max(axis=0), out=region)
    sx, sy = scan.spacing[0], scan.spacing[1]
    fig = _figure(OVERVIEW_PX)
    ax = fig.add_axes((0.0, 0.0, 1.0, 0.94))
    w, h = mip.shape[1] * sx, mip.shape[0] * sy
    ax.imshow(window(mip, *LUNG_WINDOW), cmap="gray", vmin=0, vmax=255, extent=(0.0, w, h, 0.0))
    from matplotlib.patches import Circle

    for number, f in enumerate(report.findings, start=1):
        x, y = (f.lesion.centre_voxel[0] + 0.5) * sx, (f.lesion.centre_voxel[1] + 0.5) * sy
        r = max(6.0, f.lesion.axes.long_mm / 2 + 4.0)
        ax.add_patch(Circle((x, y), r, fill=False, edgecolor="#ff3b30", linewidth=1.5))
        ax.text(x + r * 0.75, y - r * 0.75, str(number), color="#ffd60a", fontsize=11, weight="bold")
    ax.plot([0.05 * w, 0.05 * w + 50.0], [0.95 * h, 0.95 * h], color="#ffd60a", linewidth=3)
    ax.text(0.05 * w + 25.0, 0.94 * h, "50 mm", color="#ffd60a", ha="center", va="bottom", fontsize=9)
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_axis_off()
    numbers = ", ".join(f"{i}={f.lesion.id}" for i, f in enumerate(report.findings, start=1)) or "no nodules"
    head = f"Axial MIP of the lung region; {numbers}; Lung-RADS {report.exam.category}"
    fig.text(0.5, 0.975, head, ha="center", va="center", fontsize=9)
    foot = "decision support, not a medical device" + ("  -  PHANTOM DATA" if report.phantom else "")
    ax.text(0.98 * w, 0.02 * h, foot, color="white", ha="right", va="top", fontsize=8)
    fig.savefig(path, dpi=_DPI)
    return path
