"""Segment a nodule around a seed point by region growing, and measure it as Lung-RADS and Fleischner ask.

Segmentation (`segment_nodule`) is classical region growing, not a learned model: voxels at or above
``threshold_hu`` (default -300 HU, the solid cut point below; -400 leaks into partial-volume vessels on 5 mm
slices) connected (face-connected, 3-D) to the seed, inside a sphere of ``radius_mm``
(default 30 mm) around it, then opened with a ball of at most ``opening_mm`` (default 1.5 mm; its radius in voxels is
rounded down per axis, so on slices thicker than it the opening is in-plane only) to cut vessels attached to the nodule, keeping the component that holds the seed
(or the largest one, if the opening removed the seed voxel). A seed below the threshold is not in a nodule:
`ConfigError` "no nodule at ...". A nodule fused to the chest wall or mediastinum grows into it up to the sphere;
the sphere bounds that error, so size ``radius_mm`` from the detection (about 1.1× its radius) where one exists.

Measurement (`measure_mask`, also for a given mask): on the axial slice of largest area, the long axis is the
largest Feret diameter (between pixel centres, plus one pixel: calipers go edge to edge) and the short axis the longest chord
perpendicular to it; the mean diameter is their mean, rounded to 0.1 mm (half up) as Lung-RADS v2022 asks; the
volume is the voxel count times the voxel volume; the centre of mass is given in voxels ``(x, y, z)`` and LPS mm.

Type from HU: a voxel is solid at or above ``SOLID_HU`` = -300 HU, ground-glass between ``GGO_HU`` = -750 and
-300 HU. These are the cut points commonly used in subsolid-nodule CT volumetry (ground-glass opacity about -750 to
-300 HU, solid component above -300 HU; e.g. Kamiya et al., "Computer-aided volumetry of part-solid lung
cancers by using CT", Eur Radiol 2014); Lung-RADS and Fleischner define the types visually, not by HU. A nodule is
solid when at least 80 % of its volume is solid, ground-glass when its solid part's mean diameter is under
1 mm (or nothing is solid), part-solid otherwise, with the solid part (its largest component) measured the same way.
This is decision support, not a medical device.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError
from deskpod.lung.growth import round_diameter
from deskpod.lung.images import Scan, to_image, voxel_to_world, world_to_voxel

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

SOLID_HU = -300.0
GGO_HU = -750.0
SOLID_FRACTION = 0.8
MIN_SOLID_PART_MM = 1.0


@dataclass(frozen=True, slots=True)
class Axes:
    """Long and short axis (mm) on the axial slice of largest area, and their mean rounded to 0.1 mm."""

    long_mm: float
    short_mm: float
    mean_mm: float
    slice_z: int


@dataclass(frozen=True, slots=True, eq=False)  # holds arrays: compared by identity
class Measurement:
    """What a nodule mask measures: axes, volume, type, and centre of mass (voxel (x, y, z) and LPS mm)."""

    axes: Axes
    volume_mm3: float
    kind: str  # "solid", "part-solid" or "ground-glass"
    solid_part: Axes | None
    mean_hu: float
    centre_voxel: tuple[float, float, float]
    centre_world: tuple[float, float, float]
    mask: npt.NDArray[np.bool_]


def measure_mask(scan: Scan, mask: npt.NDArray[Any]) -> Measurement:
    """Measure a given nodule mask (``(z, y, x)``, same shape as the scan) as `segment_nodule`'s are measured."""
    m = np.asarray(mask).astype(bool)
    if m.shape != scan.hu.shape:
        raise ConfigError(f"nodule mask of shape {m.shape} does not match the scan's shape {scan.hu.shape} (z, y, x)")
    if not m.any():
        raise ConfigError("nodule mask is empty: nothing to measure")
    axes = axial_axes(m, scan.spacing)
    values = scan.hu[m]
    solid = m & (scan.hu >= SOLID_HU)
    solid_fraction = float(solid.sum()) / float(m.sum())
    solid_part: Axes | None = None
    if solid_fraction >= SOLID_FRACTION:
        kind = "solid"
    else:
        part = _largest_component(solid, scan) if solid.any() else None
        solid_part = axial_axes(part, scan.spacing) if part is not None else None
        if solid_part is None or solid_part.mean_mm < MIN_SOLID_PART_MM:
            kind, solid_part = "ground-glass", None
        else:
            kind = "part-solid"
    z, y, x = np.nonzero(m)
    centre = np.array([x.mean(), y.mean(), z.mean()], dtype=np.float64)
    world = voxel_to_world(scan, centre)
    return Measurement(
        axes=axes,
        volume_mm3=float(m.sum()) * scan.voxel_volume_mm3,
        kind=kind,
        solid_part=solid_part,
        mean_hu=float(values.mean()),
        centre_voxel=(float(centre[0]), float(centre[1]), float(centre[2])),
        centre_world=(float(world[0]), float(world[1]), float(world[2])),
        mask=m,
    )


def axial_axes(mask: npt.NDArray[np.bool_], spacing: tuple[float, float, float]) -> Axes:
    """Long axis (max Feret, edge to edge) and the longest perpendicular chord, on the largest axial slice."""
    areas = mask.reshape(mask.shape[0], -1).sum(axis=1)
    z = int(np.argmax(areas))
    sx, sy = spacing[0], spacing[1]
    ys, xs = np.nonzero(mask[z])
    # boundary pixel centres (only they matter for the Feret diameter); one pixel is added to each diameter
    # below so that a run of n pixels measures n pixels, edge to edge, as calipers do
    plane = mask[z]
    padded = np.pad(plane, 1)
    inner = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    ey, ex = np.nonzero(plane & ~inner)
    corners = np.stack([ex * sx, ey * sy], axis=1).astype(np.float64)
    step = min(sx, sy)
    diff = corners[:, None, :] - corners[None, :, :]
    dist2 = (diff**2).sum(axis=2)
    i, j = np.unravel_index(int(np.argmax(dist2)), dist2.shape)
    span = float(np.sqrt(dist2[i, j]))
    long_mm = span + step
    if span == 0.0:
        return Axes(long_mm=step, short_mm=step, mean_mm=round_diameter(step), slice_z=z)
    u = (corners[j] - corners[i]) / span
    v = np.array([-u[1], u[0]])
    # the longest chord along v: bin pixel centres by their position along u, take the extent across v
    centres = np.stack([xs * sx, ys * sy], axis=1)
    along = np.rint(centres @ u / step).astype(np.int64)
    across = centres @ v
    short_mm = 0.0
    order = np.argsort(along)
    along, across = along[order], across[order]
    splits = np.flatnonzero(np.diff(along)) + 1
    for chunk in np.split(across, splits):
        short_mm = max(short_mm, float(chunk.max() - chunk.min()) + step)
    short_mm = min(short_mm, long_mm)
    return Axes(long_mm=long_mm, short_mm=short_mm, mean_mm=round_diameter((long_mm + short_mm) / 2.0), slice_z=z)


def segment_nodule(
    scan: Scan,
    seed_world: tuple[float, float, float],
    *,
    radius_mm: float = 30.0,
    threshold_hu: float = -300.0,
    opening_mm: float = 1.5,
) -> Measurement:
    """Grow a nodule from ``seed_world`` (LPS mm) as the module docstring says, and measure it."""
    index = world_to_voxel(scan, seed_world)
    ix, iy, iz = (round(float(v)) for v in index)
    nz, ny, nx = scan.hu.shape
    where = f"no nodule at ({seed_world[0]:.1f}, {seed_world[1]:.1f}, {seed_world[2]:.1f}) mm"
    if not (0 <= ix < nx and 0 <= iy < ny and 0 <= iz < nz):
        raise ConfigError(f"{where}: the point lies outside the scan")
    if scan.hu[iz, iy, ix] < threshold_hu:
        raise ConfigError(f"{where}: the seed voxel is {scan.hu[iz, iy, ix]:.0f} HU, below {threshold_hu:.0f} HU")
    r = [int(np.ceil(radius_mm / s)) for s in scan.spacing]
    lo = [max(0, c - rr) for c, rr in zip((ix, iy, iz), r, strict=True)]
    hi = [min(n, c + rr + 1) for c, rr, n in zip((ix, iy, iz), r, (nx, ny, nz), strict=True)]
    box = scan.hu[lo[2] : hi[2], lo[1] : hi[1], lo[0] : hi[0]]
    zz, yy, xx = np.meshgrid(
        (np.arange(lo[2], hi[2]) - iz) * scan.spacing[2],
        (np.arange(lo[1], hi[1]) - iy) * scan.spacing[1],
        (np.arange(lo[0], hi[0]) - ix) * scan.spacing[0],
        indexing="ij",
    )
    inside = (zz**2 + yy**2 + xx**2) <= radius_mm**2
    candidate = (box >= threshold_hu) & inside
    seed_local = (ix - lo[0], iy - lo[1], iz - lo[2])
    image = sitk.GetImageFromArray(candidate.astype(np.uint8))
    image.SetSpacing(scan.spacing)
    grown = sitk.ConnectedThreshold(image, seedList=[seed_local], lower=1, upper=1)
    radius = [int(opening_mm / s + 1e-9) for s in scan.spacing]  # never larger than opening_mm
    if any(radius):
        eroded = sitk.BinaryErode(grown, radius, sitk.sitkBall, backgroundValue=0, foregroundValue=1)
        opened = sitk.BinaryDilate(eroded, radius, sitk.sitkBall, backgroundValue=0, foregroundValue=1)
        opened = sitk.And(opened, grown)
        labels = sitk.GetArrayFromImage(sitk.ConnectedComponent(opened, False))
        at_seed = int(labels[seed_local[2], seed_local[1], seed_local[0]])
        if at_seed == 0:
            counts = np.bincount(labels.ravel())
            counts[0] = 0
            at_seed = int(np.argmax(counts))
        local = labels == at_seed if at_seed else sitk.GetArrayFromImage(grown).astype(bool)
    else:
        local = sitk.GetArrayFromImage(grown).astype(bool)
    full = np.zeros(scan.hu.shape, dtype=bool)
    full[lo[2] : hi[2], lo[1] : hi[1], lo[0] : hi[0]] = local
    return measure_mask(scan, full)


def _largest_component(mask: npt.NDArray[np.bool_], scan: Scan) -> npt.NDArray[np.bool_]:
    labels = sitk.GetArrayFromImage(sitk.ConnectedComponent(to_image(mask.astype(np.uint8), scan), False))
    counts = np.bincount(labels.ravel())
    counts[0] = 0
    largest: npt.NDArray[np.bool_] = labels == int(np.argmax(counts))
    return largest
