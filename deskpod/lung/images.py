"""CT scans in one convention: read DICOM series, mhd/raw, nrrd and NIfTI into a `Scan` in LPS world millimetres.

Every reader returns the same thing: the volume in Hounsfield units as a numpy array indexed ``(z, y, x)``,
and the geometry as ITK, DICOM and LUNA16 state it: ``spacing`` and ``origin`` in ``(x, y, z)`` order, in mm, and
``direction`` the 3×3 matrix of direction cosines (its columns are the world directions of the voxel axes x, y, z).
World coordinates are LPS (x grows to the patient's Left, y to Posterior, z to Superior). NIfTI stores RAS on disk;
SimpleITK's NIfTI reader already flips the first two axes into LPS (its origin and direction come back negated in
x and y), so a NIfTI written from a scan and read back gives the same world point for the same voxel — the tests
check this round trip on every format.

The world↔voxel map is ``world = origin + direction · (spacing ⊙ index)`` with a continuous ``index`` in ``(x, y, z)``
order; `world_to_voxel` inverts it. Bad input (a folder with no CT series, missing slices, mixed spacing or sizes,
a non-CT modality, an unreadable file, an unknown extension) is a `ConfigError` of one line naming the problem.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

FloatArray = npt.NDArray[np.float64]

# A relative difference between slice gaps or pixel spacings above this is a broken series (0.1 %+0.01 mm).
_GAP_TOLERANCE_MM = 0.01
_GAP_TOLERANCE_REL = 1e-3

SUFFIXES = (".mhd", ".nrrd", ".nii", ".nii.gz")


@dataclass(frozen=True, slots=True, eq=False)  # holds arrays: compared by identity
class Scan:
    """A CT volume in HU, ``(z, y, x)``, with its LPS geometry (spacing, origin in mm, (x, y, z) order)."""

    hu: npt.NDArray[np.float32]
    spacing: tuple[float, float, float]
    origin: tuple[float, float, float]
    direction: tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, float, float]]
    source: str = ""

    @property
    def shape(self) -> tuple[int, int, int]:
        """The array shape ``(z, y, x)``."""
        z, y, x = self.hu.shape
        return int(z), int(y), int(x)

    @property
    def voxel_volume_mm3(self) -> float:
        """The volume of one voxel in mm³."""
        return float(np.prod(self.spacing))

    def to_image(self) -> Any:
        """The scan as a SimpleITK image with the same geometry."""
        return to_image(self.hu, self)


def to_image(array: npt.NDArray[Any], like: Scan) -> Any:
    """A SimpleITK image of ``array`` (``(z, y, x)``) with the geometry of ``like``."""
    image = sitk.GetImageFromArray(array)
    image.SetSpacing(like.spacing)
    image.SetOrigin(like.origin)
    image.SetDirection(tuple(float(v) for row in like.direction for v in row))
    return image


def scan_from_image(image: Any, source: str = "") -> Scan:
    """A `Scan` from a 3-D SimpleITK image (its pixel values taken as HU)."""
    if image.GetDimension() != 3:
        raise ConfigError(f"{source or 'image'}: a CT scan must be 3-D, this one has {image.GetDimension()} dimensions")
    if image.GetNumberOfComponentsPerPixel() != 1:
        raise ConfigError(f"{source or 'image'}: a CT scan has one value per voxel, this one has several (colour?)")
    hu = sitk.GetArrayFromImage(image).astype(np.float32)
    d = [float(v) for v in image.GetDirection()]
    direction = ((d[0], d[1], d[2]), (d[3], d[4], d[5]), (d[6], d[7], d[8]))
    sx, sy, sz = (float(v) for v in image.GetSpacing())
    ox, oy, oz = (float(v) for v in image.GetOrigin())
    return Scan(hu=hu, spacing=(sx, sy, sz), origin=(ox, oy, oz), direction=direction, source=source)


def _matrix(scan: Scan) -> FloatArray:
    return np.array(scan.direction, dtype=np.float64) * np.array(scan.spacing, dtype=np.float64)[None, :]


def voxel_to_world(scan: Scan, index_xyz: npt.ArrayLike) -> FloatArray:
    """LPS world mm of a continuous voxel index in ``(x, y, z)`` order (one point ``(3,)`` or many ``(n, 3)``)."""
    index = np.asarray(index_xyz, dtype=np.float64)
    world: FloatArray = index @ _matrix(scan).T + np.array(scan.origin, dtype=np.float64)
    return world


def world_to_voxel(scan: Scan, world_xyz: npt.ArrayLike) -> FloatArray:
    """Continuous voxel index ``(x, y, z)`` of an LPS world point in mm (one ``(3,)`` or many ``(n, 3)``)."""
    world = np.asarray(world_xyz, dtype=np.float64) - np.array(scan.origin, dtype=np.float64)
    index: FloatArray = world @ np.linalg.inv(_matrix(scan)).T
    return index


def crop(scan: Scan, lo_zyx: Sequence[int], hi_zyx: Sequence[int]) -> Scan:
    """The voxels ``lo_zyx`` to ``hi_zyx`` (exclusive) of ``scan``, its geometry kept: the origin moves to ``lo_zyx``."""
    hu = np.ascontiguousarray(scan.hu[lo_zyx[0] : hi_zyx[0], lo_zyx[1] : hi_zyx[1], lo_zyx[2] : hi_zyx[2]])
    x, y, z = (float(v) for v in voxel_to_world(scan, [lo_zyx[2], lo_zyx[1], lo_zyx[0]]))
    return Scan(hu=hu, spacing=scan.spacing, origin=(x, y, z), direction=scan.direction, source=scan.source)


def resample(scan: Scan, spacing: tuple[float, float, float], default_hu: float = -1024.0) -> Scan:
    """The scan resampled (linear) to ``spacing`` (mm, (x, y, z)) over the same world extent and direction."""
    if any(s <= 0 for s in spacing):
        raise ConfigError(f"resample spacing {spacing}: every spacing must be a positive number of mm")
    image = scan.to_image()
    old_size = np.array(image.GetSize(), dtype=np.float64)
    size = [max(1, round(float(n))) for n in old_size * np.array(scan.spacing) / np.array(spacing)]
    out = sitk.Resample(
        image,
        size,
        sitk.Transform(),
        sitk.sitkLinear,
        scan.origin,
        tuple(float(s) for s in spacing),
        image.GetDirection(),
        default_hu,
        sitk.sitkFloat32,
    )
    return scan_from_image(out, scan.source)


def window(hu: npt.NDArray[Any], level: float, width: float) -> npt.NDArray[np.uint8]:
    """HU mapped to 0–255 for display: ``level ± width/2`` spans the grey scale (lung window: -600, 1500)."""
    if width <= 0:
        raise ConfigError(f"window width {width}: must be a positive number of HU")
    low = level - width / 2.0
    scaled = (np.asarray(hu, dtype=np.float64) - low) / width * 255.0
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def read_scan(path: str | Path) -> Scan:
    """Read a CT scan: a DICOM series folder, ``.mhd`` (with its ``.raw``), ``.nrrd``, ``.nii`` or ``.nii.gz``."""
    p = Path(path)
    if p.is_dir():
        return _read_dicom_folder(p)
    if not p.exists():
        raise ConfigError(f"scan {p}: no such file or folder")
    name = p.name.lower()
    if not any(name.endswith(s) for s in SUFFIXES):
        raise ConfigError(f"scan {p}: unknown extension; use a DICOM folder, .mhd, .nrrd, .nii or .nii.gz")
    try:
        image = sitk.ReadImage(str(p))
    except RuntimeError as err:
        first = str(err).strip().splitlines()[-1] if str(err).strip() else "unreadable"
        raise ConfigError(f"scan {p}: unreadable ({first})") from None
    return scan_from_image(sitk.Cast(image, sitk.sitkFloat32), str(p))


def _read_dicom_folder(folder: Path) -> Scan:
    import pydicom

    slices: dict[str, list[Any]] = {}
    modalities: set[str] = set()
    for file in sorted(folder.iterdir()):
        if not file.is_file():
            continue
        try:
            ds = pydicom.dcmread(str(file), stop_before_pixels=False)
        except Exception:
            continue
        if "PixelData" not in ds:
            continue
        modalities.add(str(getattr(ds, "Modality", "?")))
        if getattr(ds, "Modality", None) != "CT":
            continue
        slices.setdefault(str(getattr(ds, "SeriesInstanceUID", "?")), []).append(ds)
    if not slices:
        if modalities:
            raise ConfigError(
                f"{folder}: no CT series (modality {', '.join(sorted(modalities))}); deskpod reads CT only"
            )
        raise ConfigError(f"{folder}: no CT series in this folder (no DICOM image files)")
    if len(slices) > 1:
        names = ", ".join(f"{uid} ({len(v)} slices)" for uid, v in sorted(slices.items()))
        raise ConfigError(f"{folder}: several CT series in one folder, pick one: {names}")
    (series,) = slices.values()
    return _stack(folder, series)


def _stack(folder: Path, series: list[Any]) -> Scan:
    first = series[0]
    try:
        row_cos = np.array([float(v) for v in first.ImageOrientationPatient[:3]])
        col_cos = np.array([float(v) for v in first.ImageOrientationPatient[3:]])
    except AttributeError:
        raise ConfigError(f"{folder}: a slice without ImageOrientationPatient; cannot place the series") from None
    normal = np.cross(row_cos, col_cos)
    sizes = {(int(ds.Rows), int(ds.Columns)) for ds in series}
    if len(sizes) > 1:
        raise ConfigError(f"{folder}: mixed slice sizes {sorted(sizes)} in one series")
    pixel = {(round(float(ds.PixelSpacing[0]), 4), round(float(ds.PixelSpacing[1]), 4)) for ds in series}
    if len(pixel) > 1:
        raise ConfigError(f"{folder}: mixed pixel spacing {sorted(pixel)} mm in one series")
    series = sorted(series, key=lambda ds: float(np.dot(normal, [float(v) for v in ds.ImagePositionPatient])))
    positions = np.array([np.dot(normal, [float(v) for v in ds.ImagePositionPatient]) for ds in series])
    gaps = np.diff(positions)
    if len(series) > 1:
        if np.any(gaps < _GAP_TOLERANCE_MM):
            raise ConfigError(f"{folder}: two slices at the same position ({positions[np.argmin(gaps)]:.2f} mm)")
        step = float(np.median(gaps))
        bad = np.abs(gaps - step) > _GAP_TOLERANCE_MM + _GAP_TOLERANCE_REL * step
        if np.any(bad):
            at = int(np.argmax(bad))
            kind = "missing slices" if gaps[at] > step else "mixed slice spacing"
            raise ConfigError(
                f"{folder}: {kind}: a gap of {gaps[at]:.2f} mm between slices at "
                f"{positions[at]:.2f} and {positions[at + 1]:.2f} mm where the series steps {step:.2f} mm"
            )
    else:
        step = float(getattr(first, "SliceThickness", 1.0) or 1.0)
    planes = []
    for ds in series:
        slope = float(getattr(ds, "RescaleSlope", 1.0))
        intercept = float(getattr(ds, "RescaleIntercept", 0.0))
        planes.append(ds.pixel_array.astype(np.float32) * slope + intercept)
    hu = np.stack(planes).astype(np.float32)
    row_spacing, col_spacing = (float(v) for v in first.PixelSpacing)
    origin = tuple(float(v) for v in series[0].ImagePositionPatient)
    # direction columns: x (along a row: row cosines), y (down the columns), z (the slice normal)
    cols = np.stack([row_cos, col_cos, normal], axis=1)
    direction = tuple(tuple(float(v) for v in r) for r in cols)
    return Scan(
        hu=hu,
        spacing=(col_spacing, row_spacing, step),
        origin=(origin[0], origin[1], origin[2]),
        direction=direction,  # type: ignore[arg-type]
        source=str(folder),
    )
