"""Classical nodule candidates: blobs of tissue in the lungs, scored by how round they are (no learned model).

`find_candidates` is the detector `deskpod lung analyze` uses when no trained detector is given, and the baseline a
trained one is compared with. The method (numpy box morphology on the lungs' bounding box, SimpleITK connected
components and label shape statistics: about a second for a 512×512×300 scan on 2 cores, see the tests' report):

1. the region: the lung mask dilated by a box of half-width ``DILATE_MM`` (the mask's own closing already brings
   in juxtapleural nodules; the dilation keeps their pleural rim), on the mask's bounding box;
2. two passes: solid tissue at or above ``SOLID_HU`` = -400 HU, and ground glass at or above ``GGO_HU`` = -750 HU
   (parenchyma is about -900 to -700 HU, ground-glass nodules -750 to -300 HU);
3. in each pass, a binary opening with a box of half-width ``OPENING_MM`` (at most ``min_mm / 3``; whole voxels,
   rounded down per axis, so on thick slices it is in-plane only) cuts the thin vessels a nodule sits on, then
   connected components (26-connected) are measured by ITK's label shape statistics;
4. a component is kept when its equivalent spherical diameter lies in ``[min_mm, max_mm]``; its score is a
   blobness from the principal axes of its second moments (its covariance, plus each voxel's own extent) —
   the shape features of classical nodule CAD, which tell round nodules from tubular vessels by elongation and
   compactness (e.g. Armato et al., "Computerized detection of pulmonary nodules on CT scans", RadioGraphics
   1999; Messay et al., "A new computationally efficient CAD system for pulmonary nodule detection in CT
   imagery", Medical Image Analysis 2010): ``(minor / major axis) × fill``, where ``fill`` is the volume over
   that of the ellipsoid with the same second moments (1 for a solid ellipsoid, low for a vessel tree). A sphere
   scores about 1, a cylinder (vessel) its width over its length; a component on a single slice keeps
   ``ONE_SLICE_WEIGHT`` of its score (on thick slices a vessel crossing the slice is a round blob there);
5. candidates of the two passes closer than the larger's radius are one candidate (the better score), in LPS world
   mm at the component's centroid, most probable first.

``probability`` is this heuristic score in [0, 1], not a calibrated probability of a nodule; ``source`` is
``"classical"``. Decision support, not a medical device.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError
from deskpod.lung.images import Scan, crop, to_image
from deskpod.lung.lungmask import LungMask

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

BoolArray = npt.NDArray[np.bool_]

SOLID_HU = -400.0
GGO_HU = -750.0
DILATE_MM = 2.0
OPENING_MM = 1.0
# On thick slices a vessel crossing one slice is a round blob there; a nodule of min_mm or more on slices thinner
# than it shows on two or more. One-slice components keep a third of their score (lung1, 5 mm slices: its 14 mm
# nodule ranks first, 0.50 against the next 0.19; without the weight third, behind two vessel cross-sections).
ONE_SLICE_WEIGHT = 1.0 / 3.0
SOURCE = "classical"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A place that may hold a nodule: its LPS world centre in mm, a score in [0, 1], and who proposed it."""

    world_xyz: tuple[float, float, float]
    probability: float
    source: str  # "classical" or "detector:<run>"


@dataclass(frozen=True, slots=True)
class _Blob:
    world: tuple[float, float, float]
    diameter_mm: float
    score: float


def find_candidates(scan: Scan, lungs: LungMask, *, min_mm: float = 3.0, max_mm: float = 35.0) -> list[Candidate]:
    """Nodule candidates of ``scan`` inside ``lungs`` (see the module docstring), most probable first."""
    if not 0 < min_mm < max_mm:
        raise ConfigError(f"candidate sizes [{min_mm}, {max_mm}] mm: need 0 < min_mm < max_mm, e.g. [3, 35]")
    if lungs.mask.shape != scan.hu.shape:
        raise ConfigError(f"lung mask of shape {lungs.mask.shape} does not match the scan's shape {scan.hu.shape}")
    if not lungs.mask.any():
        return []
    spacing = np.array(scan.spacing[::-1], dtype=np.float64)  # (z, y, x), as the arrays
    grow = np.floor(DILATE_MM / spacing).astype(int)
    opening = np.floor(min(OPENING_MM, min_mm / 3.0) / spacing).astype(int)  # never wider than the size asked
    box = []
    for axis in range(3):
        present = np.flatnonzero(lungs.mask.any(axis=tuple(a for a in range(3) if a != axis)))
        box.append(slice(max(0, int(present[0]) - grow[axis]), int(present[-1]) + grow[axis] + 1))
    region = _box_dilate(lungs.mask[tuple(box)], grow)
    part = crop(scan, [b.start for b in box], [b.stop for b in box])
    blobs: list[_Blob] = []
    for low in (SOLID_HU, GGO_HU):
        tissue = _box_dilate(_box_erode((part.hu >= low) & region, opening), opening)
        blobs.extend(_blobs(to_image(tissue.astype(np.uint8), part), min_mm, max_mm))
    kept: list[_Blob] = []
    for blob in sorted(blobs, key=lambda b: -b.score):
        if all(_distance(blob, k) >= max(blob.diameter_mm, k.diameter_mm) / 2 for k in kept):
            kept.append(blob)
    return [Candidate(world_xyz=b.world, probability=b.score, source=SOURCE) for b in kept]


def _distance(a: _Blob, b: _Blob) -> float:
    return math.dist(a.world, b.world)


def _shifted(mask: BoolArray, radius: npt.NDArray[np.int_], combine: Any) -> BoolArray:
    """``combine`` of ``mask`` shifted by -r..r along each axis: a separable box (cube) filter."""
    out = mask.copy()
    for axis, r in enumerate(int(v) for v in radius):
        for _ in range(r):  # r single steps: each widens the box by one voxel on both sides
            step = out.copy()
            lead = [slice(None)] * 3
            trail = [slice(None)] * 3
            lead[axis], trail[axis] = slice(1, None), slice(None, -1)
            combine(step[tuple(lead)], out[tuple(trail)], out=step[tuple(lead)])
            combine(step[tuple(trail)], out[tuple(lead)], out=step[tuple(trail)])
            out = step
    return out


def _box_erode(mask: BoolArray, radius: npt.NDArray[np.int_]) -> BoolArray:
    """Erosion by a box of half-width ``radius`` voxels per axis (outside the array counts as empty)."""
    out = _shifted(mask, radius, np.logical_and)
    for axis, r in enumerate(int(v) for v in radius):  # the border: outside is empty
        if r:
            edge = [slice(None)] * 3
            edge[axis] = slice(0, r)
            out[tuple(edge)] = False
            edge[axis] = slice(-r, None)
            out[tuple(edge)] = False
    return out


def _box_dilate(mask: BoolArray, radius: npt.NDArray[np.int_]) -> BoolArray:
    """Dilation by a box of half-width ``radius`` voxels per axis."""
    return _shifted(mask, radius, np.logical_or)


def _blobs(mask: Any, min_mm: float, max_mm: float) -> list[_Blob]:
    labels = sitk.ConnectedComponent(mask, True)
    stats = sitk.LabelShapeStatisticsImageFilter()
    stats.ComputeOrientedBoundingBoxOff()
    stats.Execute(labels)
    voxel_mm3 = float(np.prod(mask.GetSpacing()))
    smallest = math.pi / 6 * min_mm**3 / voxel_mm3  # voxels in a sphere of min_mm: cheaper than measuring all
    out = []
    for label in stats.GetLabels():
        n = stats.GetNumberOfPixels(label)
        if n < smallest * 0.5:
            continue
        diameter = 2.0 * float(stats.GetEquivalentSphericalRadius(label))
        if not min_mm <= diameter <= max_mm:
            continue
        slices = int(stats.GetBoundingBox(label)[5])
        x, y, z = (float(v) for v in stats.GetCentroid(label))  # LPS mm: ITK's map is images.voxel_to_world's
        out.append(
            _Blob(
                world=(x, y, z),
                diameter_mm=diameter,
                score=_blobness(stats, label, mask.GetSpacing()) * (ONE_SLICE_WEIGHT if slices == 1 else 1.0),
            )
        )
    return out


def _blobness(stats: Any, label: int, spacing_mm: tuple[float, ...]) -> float:
    """``(minor / major axis) × fill`` of a component (see the module docstring), in [0, 1]."""
    # the moments are of the voxel centres: add each voxel's own extent (a uniform box: s²/12 per axis), which
    # matters on thick slices (a 14 mm nodule on 5 mm slices is three slices thick)
    moments = np.array(stats.GetPrincipalMoments(label), dtype=np.float64)
    axes_dirs = np.array(stats.GetPrincipalAxes(label), dtype=np.float64).reshape(3, 3)
    spacing = np.array(spacing_mm, dtype=np.float64)
    covariance = axes_dirs.T @ np.diag(np.clip(moments, 0.0, None)) @ axes_dirs + np.diag(spacing**2 / 12.0)
    moments = np.clip(np.linalg.eigvalsh(covariance), 0.0, None)
    axes = np.sqrt(5.0 * moments)  # semi-axes of the solid ellipsoid with these second moments (variance a²/5)
    if axes.max() <= 0:
        return 0.0
    ellipsoid = 4.0 / 3.0 * math.pi * float(np.prod(np.maximum(axes, 1e-9)))
    fill = min(1.0, float(stats.GetPhysicalSize(label)) / ellipsoid)
    ratio = float(axes.min() / axes.max())
    return float(np.clip(ratio * fill, 0.0, 1.0))
