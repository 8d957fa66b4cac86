"""A classical lung mask from a chest CT: threshold, connected components, morphology (no learned model).

The steps (all SimpleITK filters):

1. air: voxels below ``-400 HU`` (lung parenchyma is about -900 to -500 HU, soft tissue -100 to +100);
2. the air outside the body and in the table is every air component touching the in-plane (x/y) border of the
   volume; it is removed (the lungs may touch the top and bottom slices, so the z faces do not count);
3. the lungs are the largest remaining air components: the largest one, and the second when it holds at least
   a tenth of the first's volume (both lungs joined at the front are one component: then left/right is None);
   components under 50 ml are bowel gas, the trachea or noise and are dropped — none left is
   "no lungs found in this scan";
4. vessels and juxtapleural nodules are brought in by filling holes slice by slice and a closing with a 5 mm
   (in-plane) ball, so a nodule on the pleura lies inside the mask.

The trachea and main bronchi are not removed (they join a lung only above the carina and add a few ml).
Left and right are by centroid in LPS world x: the component with the larger x is the patient's left lung.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError
from deskpod.lung.images import Scan, to_image, voxel_to_world

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

AIR_HU = -400.0
MIN_LUNG_ML = 50.0
SECOND_LUNG_FRACTION = 0.1
CLOSING_MM = 5.0


@dataclass(frozen=True, slots=True, eq=False)  # holds arrays: compared by identity
class LungMask:
    """The lung mask ``(z, y, x)`` of a scan, its volume in ml, and the two lungs when they are separable."""

    mask: npt.NDArray[np.bool_]
    volume_ml: float
    left: npt.NDArray[np.bool_] | None
    right: npt.NDArray[np.bool_] | None

    @property
    def left_ml(self) -> float | None:
        """The left lung's volume in ml, when the lungs are separable."""
        return None if self.left is None else float(self.left.sum()) * self._voxel_ml

    @property
    def right_ml(self) -> float | None:
        """The right lung's volume in ml, when the lungs are separable."""
        return None if self.right is None else float(self.right.sum()) * self._voxel_ml

    @property
    def _voxel_ml(self) -> float:
        return self.volume_ml / max(1, int(self.mask.sum()))


def lung_mask(scan: Scan) -> LungMask:
    """The lungs of ``scan`` (see the module docstring for the method); `ConfigError` when there are none."""
    voxel_ml = scan.voxel_volume_mm3 / 1000.0
    air = scan.hu < AIR_HU
    labels_img = sitk.ConnectedComponent(to_image(air.astype(np.uint8), scan), True)
    labels = sitk.GetArrayViewFromImage(labels_img)
    border = np.unique(
        np.concatenate(
            [labels[:, 0, :].ravel(), labels[:, -1, :].ravel(), labels[:, :, 0].ravel(), labels[:, :, -1].ravel()]
        )
    )
    counts = np.bincount(labels.ravel())
    counts[0] = 0
    counts[border] = 0
    order = [int(i) for i in np.argsort(counts)[::-1] if counts[i] * voxel_ml >= MIN_LUNG_ML]
    if not order:
        raise ConfigError(
            f"{scan.source or 'scan'}: no lungs found in this scan (no air region of {MIN_LUNG_ML:.0f} ml "
            f"or more below {AIR_HU:.0f} HU inside the body)"
        )
    keep = order[:1]
    if len(order) > 1 and counts[order[1]] >= SECOND_LUNG_FRACTION * counts[order[0]]:
        keep.append(order[1])
    parts = [_close(labels == k, scan) for k in keep]
    mask = np.logical_or.reduce(parts) if len(parts) > 1 else parts[0]
    left = right = None
    if len(parts) == 2:
        xs = [float(voxel_to_world(scan, _centroid_xyz(p))[0]) for p in parts]
        left, right = (parts[0], parts[1]) if xs[0] > xs[1] else (parts[1], parts[0])
    return LungMask(mask=mask, volume_ml=float(mask.sum()) * voxel_ml, left=left, right=right)


def _centroid_xyz(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    z, y, x = np.nonzero(mask)
    return np.array([x.mean(), y.mean(), z.mean()], dtype=np.float64)


def _close(part: npt.NDArray[np.bool_], scan: Scan) -> npt.NDArray[np.bool_]:
    """Close with a ball of `CLOSING_MM` (in voxels per axis), fill holes in 3-D, then slice by slice.

    The work is done on the part's bounding box grown by the ball's radius and a voxel: the part is empty
    outside it, so the closing cannot reach past it and the background ring left around it joins the outside
    exactly as the whole volume's background would — the same mask, at a fraction of the cost.
    """
    radius = [max(1, round(CLOSING_MM / s)) for s in scan.spacing[:2]] + [max(0, round(CLOSING_MM / scan.spacing[2]))]
    pad_zyx = [int(radius[2]) + 1, int(radius[1]) + 1, int(radius[0]) + 1]
    lo, hi = [], []
    for axis, margin in enumerate(pad_zyx):
        other = tuple(a for a in range(3) if a != axis)
        present = np.flatnonzero(part.any(axis=other))
        lo.append(max(0, int(present[0]) - margin))
        hi.append(min(part.shape[axis], int(present[-1]) + 1 + margin))
    box = (slice(lo[0], hi[0]), slice(lo[1], hi[1]), slice(lo[2], hi[2]))
    image = sitk.GetImageFromArray(part[box].astype(np.uint8))
    image.SetSpacing(scan.spacing)
    pad = [int(r) + 1 for r in radius]
    padded = sitk.ConstantPad(image, pad, pad, 0)
    dilated = sitk.BinaryDilate(padded, radius, sitk.sitkBall, backgroundValue=0, foregroundValue=1)
    closed = sitk.BinaryErode(dilated, radius, sitk.sitkBall, backgroundValue=0, foregroundValue=1)
    closed = sitk.Crop(closed, pad, pad)
    filled = sitk.GetArrayFromImage(sitk.BinaryFillhole(closed, False, 1)).astype(bool)
    for z in range(filled.shape[0]):
        plane = sitk.GetImageFromArray(filled[z].astype(np.uint8))
        filled[z] = sitk.GetArrayFromImage(sitk.BinaryFillhole(plane, False, 1)).astype(bool)
    closed_mask = part.copy()
    closed_mask[box] |= filled
    return closed_mask
