"""The classical lung mask on the two real CTs, and its refusal of a scan without lungs."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from deskpod.errors import ConfigError
from deskpod.lung.images import Scan, read_scan, to_image
from deskpod.lung.lungmask import lung_mask
from tests.lung.realdata import lung_data

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

# Adult total lung capacity is about 4–8 L and a CT at breath-hold holds 3–7 L; a partial cover or an
# expiratory scan less. 1.5–8 L rejects a mask that lost a lung or swallowed the body.
PLAUSIBLE_ML = (1500.0, 8000.0)


def dilated(mask: np.ndarray, scan: Scan, mm: float) -> np.ndarray:
    radius = [max(1, round(mm / s)) for s in scan.spacing]
    image = sitk.BinaryDilate(to_image(mask.astype(np.uint8), scan), radius, sitk.sitkBall, 0, 1)
    out: np.ndarray = sitk.GetArrayFromImage(image).astype(bool)
    return out


def test_lung1_mask_holds_the_lesion() -> None:
    scan = read_scan(lung_data() / "lung1_image.nrrd")
    lesion = read_scan(lung_data() / "lung1_label.nrrd").hu > 0
    lungs = lung_mask(scan)
    assert PLAUSIBLE_ML[0] < lungs.volume_ml < PLAUSIBLE_ML[1]  # measured: 2916 ml
    # the 14 mm nodule lies in the parenchyma: all of it inside the closed mask (measured: 100 %)
    assert (lungs.mask & lesion).sum() / lesion.sum() >= 0.95
    assert lungs.mask.dtype == np.bool_ and lungs.mask.shape == scan.shape


def test_lung2_mask_borders_the_mass() -> None:
    scan = read_scan(lung_data() / "lung2_image.nrrd")
    lesion = read_scan(lung_data() / "lung2_label.nrrd").hu > 0
    lungs = lung_mask(scan)
    assert PLAUSIBLE_ML[0] < lungs.volume_ml < PLAUSIBLE_ML[1]  # measured: 4026 ml
    # the 45 mm mass is solid tissue fused to the chest wall: a threshold mask holds only its lung side
    # (measured: 20 % inside, 63 % within 5 mm, 89 % within 10 mm of the mask) — it lies on the border
    inside = (lungs.mask & lesion).sum() / lesion.sum()
    assert inside >= 0.15
    assert (dilated(lungs.mask, scan, 10.0) & lesion).sum() / lesion.sum() >= 0.85


def test_lungs_split_left_right_by_world_x() -> None:
    # two box "lungs" of air in a water body: the one at larger LPS x is the left lung
    hu = np.zeros((20, 80, 80), dtype=np.float32)
    hu[:, :, :3] = hu[:, :, -3:] = hu[:, :3, :] = hu[:, -3:, :] = -1000.0  # air outside the body
    hu[4:16, 20:60, 10:35] = -850.0
    hu[4:16, 20:60, 45:75] = -850.0
    scan = Scan(
        hu=hu,
        spacing=(2.0, 2.0, 2.0),
        origin=(0.0, 0.0, 0.0),
        direction=((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    )
    lungs = lung_mask(scan)
    assert lungs.left is not None and lungs.right is not None
    assert lungs.left[10, 40, 60] and lungs.right[10, 40, 20]
    assert lungs.left_ml == pytest.approx(12 * 40 * 30 * 8 / 1000.0)
    assert lungs.right_ml == pytest.approx(12 * 40 * 25 * 8 / 1000.0)


def test_a_water_phantom_has_no_lungs() -> None:
    hu = np.full((10, 64, 64), -1000.0, dtype=np.float32)
    hu[:, 8:56, 8:56] = 0.0
    scan = Scan(
        hu=hu,
        spacing=(1.0, 1.0, 2.0),
        origin=(0.0, 0.0, 0.0),
        direction=((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
        source="water.nrrd",
    )
    with pytest.raises(ConfigError, match=r"water\.nrrd: no lungs found in this scan"):
        lung_mask(scan)
