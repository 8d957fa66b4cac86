"""Radiomics of a nodule: pyradiomics' features of a CT scan inside a mask, with a stated parameter file.

`extract` runs pyradiomics' ``RadiomicsFeatureExtractor`` (the ``pyradiomics-bhklab`` 3.1.4 package; import name
``radiomics``) on the scan and a mask on the scan's own voxel grid, and returns the feature values only, as floats,
keyed as pyradiomics keys them (``original_shape_VoxelVolume``, ``original_glcm_Contrast``, ...); pyradiomics'
``diagnostics_*`` entries are not computed. The settings come from a pyradiomics parameter file: `PARAMS`
(``radiomics.yaml`` beside this module: original image, shape + first order + GLCM + GLRLM + GLSZM + GLDM + NGTDM,
1 mm isotropic resampling, bin width 25 HU; every setting is explained in the file), a file of the user's, or a
parameter mapping in pyradiomics' layout (``imageType`` / ``featureClass`` / ``setting``).

`baseline_params` gives the mapping that reproduces pyradiomics' own reference values (its source's
``data/baseline/baseline_<class>.csv``, lung1 and lung2 test cases: `BASELINE_SETTINGS`, no resampling, bin width
25); the tests check deskpod's extraction against those values with pyradiomics' tolerance (3 % relative).

pyradiomics is handed only the mask's bounding box plus the voxels it reads around it: ``padDistance`` voxels of
its output grid (1 mm after resampling) and 2 more for the B-spline, per axis, clipped to the scan. This makes the
features a function of the scan and the mask alone: pyradiomics aligns its resampling grid to the image's first
voxel, so without the cut the same nodule's features would move by a few percent (up to 40 % for some small-zone
emphases on a 14 mm nodule) with however much scan the caller passed around it. Pass the whole scan, or a crop with
at least that margin. It also spares pyradiomics' whole-image mask check (a second on 512 × 512 × 60). The scan is not
cut when pyradiomics reads beyond the box: with ``normalize`` (whole-image statistics) or a filtered image type (LoG,
wavelet, ...). Under the baseline's settings (no resampling) the cut changes no value.

Bad input is a `ConfigError` of one line: a mask of another shape than the scan, an empty mask, a parameter file
that is missing or that pyradiomics' schema refuses, or a mask pyradiomics cannot use (too small for the settings).
pyradiomics' own log goes to stderr at WARNING and above only (pykwalify's, at CRITICAL: its errors become the
`ConfigError`). Decision support, not a medical device.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError, RunError
from deskpod.lung.images import Scan, crop, to_image

PARAMS: Path = Path(__file__).with_name("radiomics.yaml")
"""deskpod's documented pyradiomics parameter file (shipped in the package)."""

FEATURE_CLASSES = ("shape", "firstorder", "glcm", "glrlm", "glszm", "gldm", "ngtdm")
"""The feature classes `PARAMS` enables (pyradiomics' 3-D classes; ``shape2D`` needs a single-slice mask)."""

BASELINE_SETTINGS: dict[str, Any] = {
    "distances": [1],
    "voxelArrayShift": 2000,
    "additionalInfo": True,
    "force2D": False,
    "interpolator": None,
    "resampledPixelSpacing": None,
    "gldm_a": 0,
    "weightingNorm": None,
    "normalizeScale": 1,
    "normalize": False,
    "force2Ddimension": 0,
    "removeOutliers": None,
    "minimumROISize": None,
    "binWidth": 25,
    "label": 1,
    "minimumROIDimensions": 1,
    "preCrop": False,
    "resegmentRange": None,
    "padDistance": 5,
}
"""The settings of pyradiomics' baseline test cases ``lung1`` and ``lung2`` (``diagnostics_Configuration_Settings`` in
every ``data/baseline/baseline_<class>.csv`` of the pyradiomics-bhklab 3.1.4 source), on the original image."""

_INSTALL = "pyradiomics-bhklab==3.1.4"
_SPLINE_VOXELS = 2  # a cubic B-spline reads 2 voxels either side of a point: resampling near the cut sees no edge


def baseline_params(
    feature_classes: Iterable[str] = FEATURE_CLASSES,
    settings: Mapping[str, Any] | None = None,
    image_types: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """pyradiomics parameters (its ``imageType``/``featureClass``/``setting`` layout) as its baseline was computed.

    ``settings`` defaults to `BASELINE_SETTINGS` and ``image_types`` to the original image; every feature of each of
    ``feature_classes`` is enabled (SumAverage included, which makes pyradiomics log a warning).
    """
    return {
        "imageType": dict(image_types) if image_types is not None else {"Original": {}},
        "featureClass": {name: [] for name in feature_classes},
        "setting": dict(settings) if settings is not None else dict(BASELINE_SETTINGS),
    }


def extract(scan: Scan, mask: npt.NDArray[Any], params: Path | Mapping[str, Any] | None = None) -> dict[str, float]:
    """pyradiomics' features of ``scan`` inside ``mask`` (``(z, y, x)``, the scan's shape; true in the nodule).

    ``params``: a pyradiomics parameter file (default `PARAMS`) or a parameter mapping (see `baseline_params`).
    """
    m = np.asarray(mask).astype(bool)
    if m.shape != scan.hu.shape:
        raise ConfigError(
            f"radiomics mask of shape {m.shape} does not match the scan's shape {scan.hu.shape} (z, y, x)"
        )
    if not m.any():
        raise ConfigError("radiomics mask is empty: no voxel to compute features on")
    extractor = _extractor(PARAMS if params is None else params)
    # The features only: pyradiomics' diagnostics (hashes, versions, whole-image statistics) cost a second per call.
    extractor.settings["additionalInfo"] = False
    scan, m = _around_mask(scan, m, extractor)
    label = int(extractor.settings.get("label", 1))
    image = scan.to_image()
    labels = to_image(np.where(m, label, 0).astype(np.uint32), scan)
    try:
        result = extractor.execute(image, labels)
    except ValueError as err:  # pyradiomics' word for a mask it cannot use (too small, out of the image, ...)
        raise ConfigError(f"radiomics: pyradiomics refused the mask ({_one_line(err)})") from None
    return {str(k): float(v) for k, v in result.items() if not str(k).startswith("diagnostics_")}


def _around_mask(scan: Scan, mask: npt.NDArray[np.bool_], extractor: Any) -> tuple[Scan, npt.NDArray[np.bool_]]:
    """The scan and mask cut to the mask's box plus what pyradiomics reads around it (see the module docstring).

    Uncut when pyradiomics reads beyond that box: normalisation (whole-image statistics) or a filtered image type.
    """
    settings = extractor.settings
    if settings.get("normalize") or set(extractor.enabledImagetypes) != {"Original"}:
        return scan, mask
    native = np.array(scan.spacing[::-1], dtype=np.float64)  # (z, y, x) like the array
    target = settings.get("resampledPixelSpacing")
    if target and len(target) != 3:
        raise ConfigError(
            f"radiomics resampledPixelSpacing {list(target)}: give 3 spacings in mm (x, y, z), e.g. [1, 1, 1]"
        )
    grid = native if not target else np.where(np.array(target[::-1], dtype=np.float64) == 0, native, target[::-1])
    pad = int(settings.get("padDistance", 5))
    margin = np.ceil(pad * np.maximum(grid, native) / native).astype(int) + _SPLINE_VOXELS
    where = np.argwhere(mask)
    lo = np.maximum(where.min(axis=0) - margin, 0).tolist()
    hi = np.minimum(where.max(axis=0) + 1 + margin, mask.shape).tolist()
    return crop(scan, lo, hi), np.ascontiguousarray(mask[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]])


def _extractor(params: Path | Mapping[str, Any]) -> Any:
    featureextractor = _pyradiomics()
    if isinstance(params, Path):
        if not params.is_file():
            raise ConfigError(f"radiomics parameter file {params}: no such file")
        source: Any = str(params)
        name = str(params)
    else:
        source = dict(params)
        name = "parameters"
    with warnings.catch_warnings():
        # pykwalify (pyradiomics' schema checker) loads its extension with importlib's deprecated load_module()
        warnings.filterwarnings(
            "ignore", message=r"the load_module\(\) method is deprecated", category=DeprecationWarning
        )
        try:
            return featureextractor.RadiomicsFeatureExtractor(source)
        except Exception as err:  # pykwalify's SchemaError, ruamel's YAML errors, pyradiomics' ValueError/KeyError
            raise ConfigError(f"radiomics {name}: refused by pyradiomics ({_one_line(err)})") from None


def _pyradiomics() -> Any:
    """pyradiomics' featureextractor module, its log quieted to warnings (imported here: it takes a second)."""
    try:
        featureextractor = importlib.import_module("radiomics.featureextractor")
    except ImportError as err:
        raise RunError(f"radiomics needs pyradiomics ({err}); install it: pip install {_INSTALL}") from None
    logging.getLogger("radiomics").setLevel(logging.WARNING)
    # pykwalify logs a refused parameter file at ERROR before raising; the ConfigError says the same in one line
    logging.getLogger("pykwalify").setLevel(logging.CRITICAL)
    return featureextractor


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__
