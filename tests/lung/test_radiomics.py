"""Radiomics on the two real lesions equal to pyradiomics' own baseline values, and the refusals of bad input.

The baseline is pyradiomics' ``data/baseline/baseline_<class>.csv`` (from the same sdist as the CTs): one column per
test case, its ``diagnostics_*`` rows holding the configuration (``diagnostics_Configuration_Settings`` and
``..._EnabledImageTypes``, read with ``ast.literal_eval`` as pyradiomics' tests/testUtils.py reads them) and the
image and mask hashes, the other rows the feature values. The comparison is pyradiomics' own: relative difference
under 3 %, and a baseline of exactly 0 must be met exactly. The cases used are the cheapest ones: ``lung1`` and
``lung2`` (original image, no resampling) for the 3-D classes, ``lung<n>_shape2D`` for shape2D.
"""

from __future__ import annotations

import ast
import csv
import functools
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from deskpod.errors import ConfigError
from deskpod.lung import radiomics
from deskpod.lung.images import Scan, read_scan, sitk, voxel_to_world
from tests.lung.realdata import lung_data

TOLERANCE = 0.03  # pyradiomics' tests/testUtils.py: checkResult asserts a relative difference < 3 %
CLASSES_3D = ("firstorder", "glcm", "glrlm", "glszm", "gldm", "ngtdm", "shape")
IDENTITY = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))


@functools.cache
def baseline(feature_class: str) -> dict[str, dict[str, str]]:
    """``{test case: {row name: cell}}`` of ``baseline_<feature_class>.csv``."""
    path = lung_data() / "baseline" / f"baseline_{feature_class}.csv"
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    cases = rows[0][1:]
    return {case: {row[0]: row[i] for row in rows[1:]} for i, case in enumerate(cases, start=1)}


@functools.cache
def lesion(name: str) -> tuple[Scan, npt.NDArray[np.bool_]]:
    scan = read_scan(lung_data() / f"{name}_image.nrrd")
    return scan, read_scan(lung_data() / f"{name}_label.nrrd").hu == 1


def configuration(column: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and image types of one baseline column."""
    settings = ast.literal_eval(column["diagnostics_Configuration_Settings"])
    image_types = ast.literal_eval(column["diagnostics_Configuration_EnabledImageTypes"])
    return settings, image_types


def differences(values: dict[str, float], column: dict[str, str]) -> tuple[int, list[str]]:
    """How many baseline features were compared, and those off by pyradiomics' tolerance (or missing)."""
    compared, off = 0, []
    for name, cell in column.items():
        if name.startswith("diagnostics_"):
            continue
        compared += 1
        expected = float(cell)
        got = values.get(name)
        if got is None or math.isnan(got):
            off.append(f"{name}: missing or NaN, baseline {expected}")
            continue
        diff = (0.0 if got == expected else 1.0) if expected == 0.0 else abs(1.0 - got / expected)
        if diff >= TOLERANCE:
            off.append(f"{name}: {got} vs baseline {expected} ({diff:.1%})")
    return compared, off


def hash_of(array: npt.NDArray[Any], dtype: type) -> str:
    """sitk.Hash of the pixels as the baseline's hashes were taken (the image as stored, the mask as UInt32)."""
    return str(sitk.Hash(sitk.GetImageFromArray(np.ascontiguousarray(array).astype(dtype))))


@pytest.mark.parametrize("name", ["lung1", "lung2"])
def test_features_equal_pyradiomics_baseline(name: str) -> None:
    scan, mask = lesion(name)
    columns = {cls: baseline(cls)[name] for cls in CLASSES_3D}
    settings, image_types = configuration(columns["firstorder"])
    for cls, column in columns.items():  # one configuration for all classes of this case: one extraction
        assert configuration(column) == (settings, image_types), cls
    assert settings == radiomics.BASELINE_SETTINGS
    # the inputs are the baseline's: same pixels (stored as int16), same mask
    assert hash_of(scan.hu, np.int16) == columns["firstorder"]["diagnostics_Image-original_Hash"]
    assert hash_of(mask, np.uint32) == columns["firstorder"]["diagnostics_Mask-original_Hash"]

    values = radiomics.extract(scan, mask, radiomics.baseline_params(CLASSES_3D, settings, image_types))

    assert {key.split("_")[1] for key in values} == set(CLASSES_3D)
    total = 0
    for cls, column in columns.items():
        compared, off = differences(values, column)
        assert compared > 0, cls
        assert not off, f"{name} {cls}: " + "; ".join(off)
        total += compared
    assert total == 107  # every non-deprecated feature of the 7 classes has a baseline value


@pytest.mark.parametrize("name", ["lung1", "lung2"])
def test_shape2d_equals_pyradiomics_baseline(name: str) -> None:
    scan, mask = lesion(name)
    column = baseline("shape2D")[f"{name}_shape2D"]
    settings, image_types = configuration(column)
    assert settings["force2D"] is True and settings["force2Ddimension"] == 0
    # its mask is the one axial slice of the lesion at the baseline's bounding box (x, y, z, sx, sy, sz)
    box = ast.literal_eval(column["diagnostics_Mask-corrected_BoundingBox"])
    z = box[2]
    assert box[5] == 1
    assert hash_of(mask[z : z + 1], np.uint32) == column["diagnostics_Mask-original_Hash"]
    one_slice = np.zeros_like(mask)
    one_slice[z] = mask[z]

    values = radiomics.extract(scan, one_slice, radiomics.baseline_params(["shape2D"], settings, image_types))

    compared, off = differences(values, column)
    assert compared == 9
    assert not off, f"{name} shape2D: " + "; ".join(off)


def test_the_params_file_gives_the_documented_features_on_lung1() -> None:
    assert radiomics.PARAMS.is_file() and radiomics.PARAMS.parent == Path(radiomics.__file__).parent
    scan, mask = lesion("lung1")
    values = radiomics.extract(scan, mask)
    assert {key.split("_")[0] for key in values} == {"original"}
    assert {key.split("_")[1] for key in values} == set(radiomics.FEATURE_CLASSES)
    assert "original_glcm_SumAverage" not in values and "original_glcm_JointAverage" in values
    assert all(math.isfinite(v) for v in values.values())
    # resampled to 1 mm isotropic voxels: the voxel volume is a whole number of mm³, near the mask's own volume
    volume = values["original_shape_VoxelVolume"]
    assert volume == round(volume)
    assert volume == pytest.approx(mask.sum() * scan.voxel_volume_mm3, rel=0.05)
    # the same values from any crop holding the box pyradiomics reads (resampling aligns to the image's first voxel)
    lo = np.maximum(np.argwhere(mask).min(axis=0) - 20, 0)
    hi = np.argwhere(mask).max(axis=0) + 21
    corner = voxel_to_world(scan, lo[::-1])
    crop = Scan(
        hu=np.ascontiguousarray(scan.hu[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]),
        spacing=scan.spacing,
        origin=(float(corner[0]), float(corner[1]), float(corner[2])),
        direction=scan.direction,
    )
    assert radiomics.extract(crop, mask[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]) == values
    # the same lesion under the baseline's settings (no resampling): a voxel volume of 0.57 × 0.57 × 5 mm voxels
    native = radiomics.extract(scan, mask, radiomics.baseline_params(["shape"]))
    assert native["original_shape_VoxelVolume"] == pytest.approx(mask.sum() * scan.voxel_volume_mm3)


def small_scan() -> Scan:
    hu = np.full((8, 16, 16), -850.0, dtype=np.float32)
    hu[2:6, 4:12, 4:12] = 40.0
    return Scan(hu=hu, spacing=(1.0, 1.0, 1.0), origin=(0.0, 0.0, 0.0), direction=IDENTITY)


def test_a_mask_of_another_shape_is_refused() -> None:
    scan = small_scan()
    with pytest.raises(ConfigError, match=r"\(8, 16, 15\).*\(8, 16, 16\)"):
        radiomics.extract(scan, np.ones((8, 16, 15), dtype=bool))


def test_an_empty_mask_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty"):
        radiomics.extract(small_scan(), np.zeros((8, 16, 16), dtype=bool))


def test_a_line_of_voxels_is_refused_by_the_params_file() -> None:
    line = np.zeros((8, 16, 16), dtype=bool)
    line[4, 8, 6:10] = True  # 1-D: the params file's minimumROIDimensions 2 refuses it, the baseline's 1 does not
    with pytest.raises(ConfigError, match="pyradiomics refused the mask"):
        radiomics.extract(small_scan(), line)
    values = radiomics.extract(small_scan(), line, radiomics.baseline_params(["firstorder"]))
    assert values["original_firstorder_Mean"] == pytest.approx(40.0)
    point = np.zeros((8, 16, 16), dtype=bool)
    point[4, 8, 8] = True
    with pytest.raises(ConfigError, match="single voxel"):
        radiomics.extract(small_scan(), point, radiomics.baseline_params(["firstorder"]))


def test_a_bad_params_file_is_refused(tmp_path: Path) -> None:
    scan = small_scan()
    mask = scan.hu > 0
    with pytest.raises(ConfigError, match="no such file"):
        radiomics.extract(scan, mask, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("setting:\n  binWidth: twenty-five\n")
    with pytest.raises(ConfigError, match=re.escape(f"radiomics {bad}: refused by pyradiomics") + ".*binWidth"):
        radiomics.extract(scan, mask, bad)


def test_the_mask_keeps_the_scan_geometry() -> None:
    # a mask on a tilted, offset grid: pyradiomics (correctMask false) refuses image and mask of different geometry,
    # so this passes only if extract builds the mask on the scan's own grid
    c, s = math.cos(0.3), math.sin(0.3)
    direction = ((c, -s, 0.0), (s, c, 0.0), (0.0, 0.0, 1.0))
    base = small_scan()
    scan = Scan(hu=base.hu, spacing=(0.7, 0.8, 2.5), origin=(-12.0, 30.0, -400.0), direction=direction)
    values = radiomics.extract(scan, scan.hu > 0, radiomics.baseline_params(["shape"]))
    assert values["original_shape_VoxelVolume"] == pytest.approx(4 * 8 * 8 * 0.7 * 0.8 * 2.5)
