"""CT readers: every format round-trips the HU values and the LPS world↔voxel map; broken DICOM series are refused."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from deskpod.errors import ConfigError
from deskpod.lung.images import Scan, read_scan, resample, voxel_to_world, window, world_to_voxel
from tests.lung.realdata import lung_data

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

SLICES = 8  # a slab of lung1 keeps every write fast


@pytest.fixture(scope="module")
def slab() -> Scan:
    scan = read_scan(lung_data() / "lung1_image.nrrd")
    image = scan.to_image()[:, :, 20 : 20 + SLICES]
    return Scan(
        hu=sitk.GetArrayFromImage(image).astype(np.float32),
        spacing=scan.spacing,
        origin=tuple(float(v) for v in image.GetOrigin()),  # type: ignore[arg-type]
        direction=scan.direction,
        source="lung1 slab",
    )


def write_dicom_series(
    scan: Scan,
    folder: Path,
    *,
    modality: str = "CT",
    skip: int | None = None,
    spacing_of: dict[int, float] | None = None,
) -> Path:
    """Write ``scan`` as a CT series, one file per slice, stored as uint16 with intercept -1024 (slope 1)."""
    folder.mkdir(parents=True, exist_ok=True)
    series = generate_uid()
    study = generate_uid()
    rx, ry, _ = (np.array(scan.direction)[:, k] for k in range(3))
    order = np.random.default_rng(0).permutation(scan.shape[0])  # files on disk out of order
    for z in order:
        if z == skip:
            continue
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = FileDataset(str(folder / f"s{z:03d}.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID = CTImageStorage
        ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
        ds.SeriesInstanceUID = series
        ds.StudyInstanceUID = study
        ds.Modality = modality
        ds.InstanceNumber = int(z) + 1
        world = voxel_to_world(scan, [0.0, 0.0, float(z)])
        ds.ImagePositionPatient = [f"{v:.4f}" for v in world]
        ds.ImageOrientationPatient = [f"{v:.6f}" for v in (*rx, *ry)]
        sx, sy = scan.spacing[0], scan.spacing[1]
        if spacing_of and z in spacing_of:
            sx = sy = spacing_of[z]
        ds.PixelSpacing = [f"{sy:.7f}", f"{sx:.7f}"]
        ds.SliceThickness = f"{scan.spacing[2]:.3f}"
        ds.Rows, ds.Columns = scan.shape[1], scan.shape[2]
        ds.SamplesPerPixel = 1
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.BitsAllocated = 16
        ds.BitsStored = 16
        ds.HighBit = 15
        ds.PixelRepresentation = 0
        ds.RescaleIntercept = "-1024"
        ds.RescaleSlope = "1"
        ds.PixelData = (np.rint(scan.hu[z]) + 1024).astype(np.uint16).tobytes()
        ds.save_as(str(folder / f"s{z:03d}.dcm"), enforce_file_format=True)
    return folder


def write_format(scan: Scan, tmp: Path, fmt: str) -> Path:
    if fmt == "dicom":
        return write_dicom_series(scan, tmp / "dicom")
    path = tmp / f"scan.{fmt}"
    sitk.WriteImage(sitk.Cast(scan.to_image(), sitk.sitkInt16), str(path))
    return path


@pytest.mark.parametrize("fmt", ["mhd", "nrrd", "nii.gz", "dicom"])
def test_every_format_round_trips_values_and_world_coordinates(slab: Scan, tmp_path: Path, fmt: str) -> None:
    back = read_scan(write_format(slab, tmp_path, fmt))
    assert back.shape == slab.shape
    np.testing.assert_array_equal(back.hu, np.rint(slab.hu))
    np.testing.assert_allclose(back.spacing, slab.spacing, atol=1e-4)
    np.testing.assert_allclose(back.origin, slab.origin, atol=1e-3)
    np.testing.assert_allclose(back.direction, slab.direction, atol=1e-6)
    # a chosen point: the voxel (x=300, y=200, z=5) → world → the same voxel on every path
    voxel = np.array([300.0, 200.0, 5.0])
    world = voxel_to_world(slab, voxel)
    np.testing.assert_allclose(voxel_to_world(back, voxel), world, atol=1e-3)
    np.testing.assert_allclose(world_to_voxel(back, world), voxel, atol=1e-4)
    # LPS: the same as ITK's own physical-point map of the file as read
    if fmt != "dicom":
        itk = sitk.ReadImage(str(tmp_path / f"scan.{fmt}"))
        np.testing.assert_allclose(itk.TransformContinuousIndexToPhysicalPoint(voxel.tolist()), world, atol=1e-3)
    assert back.hu[5, 200, 300] == np.rint(slab.hu[5, 200, 300])


def test_nifti_is_read_in_lps_even_with_an_oblique_direction(tmp_path: Path) -> None:
    angle = np.deg2rad(20.0)
    rot = np.array([[np.cos(angle), -np.sin(angle), 0.0], [np.sin(angle), np.cos(angle), 0.0], [0.0, 0.0, 1.0]])
    hu = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6) - 1000.0
    scan = Scan(
        hu=hu,
        spacing=(0.7, 0.8, 2.5),
        origin=(-10.0, 20.0, -300.0),
        direction=tuple(tuple(float(v) for v in row) for row in rot),  # type: ignore[arg-type]
    )
    path = tmp_path / "oblique.nii.gz"
    sitk.WriteImage(scan.to_image(), str(path))
    header_says = nib_header_srow(path)  # RAS on disk: x and y negated relative to LPS
    lps = voxel_to_world(scan, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(header_says[:2], -lps[:2], atol=1e-3)
    np.testing.assert_allclose(header_says[2], lps[2], atol=1e-3)
    back = read_scan(path)
    np.testing.assert_allclose(voxel_to_world(back, [1.0, 2.0, 3.0]), lps, atol=1e-3)
    np.testing.assert_array_equal(back.hu, hu)


def nib_header_srow(path: Path) -> np.ndarray:
    """World (RAS, as stored) of voxel (1, 2, 3), from the NIfTI header's sform rows read with numpy."""
    import gzip

    raw = gzip.decompress(path.read_bytes())[:348]
    srow = np.frombuffer(raw[280:328], dtype="<f4").reshape(3, 4).astype(np.float64)
    return np.asarray(srow @ np.array([1.0, 2.0, 3.0, 1.0]))


def test_resample_keeps_world_positions(slab: Scan) -> None:
    iso = resample(slab, (1.0, 1.0, 1.0))
    assert iso.spacing == (1.0, 1.0, 1.0)
    assert iso.origin == slab.origin
    assert iso.shape == (round(SLICES * 5.0), round(512 * slab.spacing[1]), round(512 * slab.spacing[0]))
    # the HU at a world point agrees within interpolation error (soft tissue region, smooth)
    world = voxel_to_world(slab, [256.0, 256.0, 4.0])
    i = np.rint(world_to_voxel(iso, world)).astype(int)
    assert abs(float(iso.hu[i[2], i[1], i[0]]) - float(slab.hu[4, 256, 256])) < 150.0
    with pytest.raises(ConfigError, match="positive"):
        resample(slab, (0.0, 1.0, 1.0))


def test_window_maps_level_and_width_to_grey() -> None:
    grey = window(np.array([-1350.0, -600.0, 150.0, 3000.0]), level=-600.0, width=1500.0)
    assert grey.tolist() == [0, 128, 255, 255]
    with pytest.raises(ConfigError, match="width"):
        window(np.zeros(2), 0.0, 0.0)


def test_a_series_with_a_missing_slice_is_refused(slab: Scan, tmp_path: Path) -> None:
    folder = write_dicom_series(slab, tmp_path / "gap", skip=3)
    with pytest.raises(ConfigError, match=r"missing slices: a gap of 10\.00 mm"):
        read_scan(folder)


def test_a_series_with_mixed_pixel_spacing_is_refused(slab: Scan, tmp_path: Path) -> None:
    folder = write_dicom_series(slab, tmp_path / "mixed", spacing_of={2: 0.7})
    with pytest.raises(ConfigError, match="mixed pixel spacing"):
        read_scan(folder)


def test_an_mr_series_is_not_a_ct(slab: Scan, tmp_path: Path) -> None:
    folder = write_dicom_series(slab, tmp_path / "mr", modality="MR")
    with pytest.raises(ConfigError, match="no CT series \\(modality MR\\)"):
        read_scan(folder)


def test_two_series_in_one_folder_name_both(slab: Scan, tmp_path: Path) -> None:
    write_dicom_series(slab, tmp_path / "two")
    second = write_dicom_series(slab, tmp_path / "other")
    for f in second.iterdir():
        ds = pydicom.dcmread(str(f))
        f.rename(tmp_path / "two" / ("b" + f.name))
    with pytest.raises(ConfigError, match=r"several CT series in one folder, pick one: .*8 slices.*8 slices"):
        read_scan(tmp_path / "two")
    assert ds.Modality == "CT"


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not dicom")
    with pytest.raises(ConfigError, match="no CT series in this folder"):
        read_scan(tmp_path / "empty")
    (tmp_path / "scan.png").write_bytes(b"x")
    with pytest.raises(ConfigError, match="unknown extension"):
        read_scan(tmp_path / "scan.png")
    (tmp_path / "broken.nrrd").write_bytes(b"NRRD0004\ngarbage\n")
    with pytest.raises(ConfigError, match="unreadable") as err:
        read_scan(tmp_path / "broken.nrrd")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="no such file"):
        read_scan(tmp_path / "absent.mhd")
