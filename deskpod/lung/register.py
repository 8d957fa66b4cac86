"""Rigid registration of a prior CT to the current one, so that nodules of the two exams can be matched in mm.

`register_rigid` finds the rigid (rotation + translation) map between two chest CTs of one patient with SimpleITK's
registration framework, the textbook set-up of its notebooks and of ITK's software guide:

- transform: `Euler3DTransform` (three angles about x, y, z and a translation), started by
  `CenteredTransformInitializer` in GEOMETRY mode (the two volumes' centres put on each other, so two exams whose
  table positions, and so world origins, differ still start close), about the centre of the current scan;
- metric: Mattes mutual information (50 histogram bins) on a fixed number of random samples per level
  (`SAMPLES`, seeded: the same scans give the same answer), which is robust to the HU offsets between scanners
  and kernels;
- optimizer: regular-step gradient descent whose parameter scales come from the physical shift of a voxel
  (`SetOptimizerScalesFromPhysicalShift`: one step moves any point by at most about ``STEP_MM``), linear
  interpolation;
- a three-level pyramid: shrunk 4×, 2×, 1× with Gaussian smoothing of 2, 1, 0 mm; along any axis finer than
  ``WORKING_MM`` the volumes are first averaged in bins of whole voxels (0.7 mm → 1.4 mm, 0.57 mm → 1.7 mm): the
  answer is still found to a fraction of a millimetre and the time stays bounded. Measured on 2 cores shared
  with other work, pairs moved by about 6 mm and 2°: phantoms of 256×256×150 (1.4×1.4×2 mm) 5.4 s of CPU, 5.0 s
  wall, and of 512×512×300 (0.7×0.7×1 mm) 6.5 s of CPU, 10.5 s wall; lung1 (512×512×48) 1.7 s of CPU, 2.4 s wall.

ITK's convention: with the current scan fixed and the prior moving, the transform found maps points of the FIXED
(current) space to the MOVING (prior) space. `Registration.current_to_prior` is that map and
`Registration.prior_to_current` its inverse; `translation_mm` and `rotation_deg` are the Euler3D parameters of
``current_to_prior`` (angles about x, y, z in degrees, applied about ``centre_mm``).

A registration that fails is refused, never returned: `RunError` when a scan is uniform (HU span under
``MIN_RANGE_HU``), when ITK itself gives up (no samples overlap), or when the result does not look like one
patient: after registration less than ``MIN_OVERLAP`` of the current body (voxels above -500 HU) falls inside the
prior volume, or the HU correlation between the current scan and the registered prior over the body is below
``MIN_CORRELATION`` (measured: lung1 against a moved copy, and phantom pairs, 0.82; write_followup's
prior/current pairs 0.70-0.74; lung2, another patient, registered onto lung1 -0.28; a CT against noise 0.00).
The correlation and overlap are kept in the result so a caller can judge borderline cases. No body or lung mask
restricts the metric's samples: on these CTs the whole field of view registered to well under a millimetre.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError, RunError
from deskpod.lung.images import Scan

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

FloatArray = npt.NDArray[np.float64]

SHRINK = (4, 2, 1)
SMOOTHING_MM = (2.0, 1.0, 0.0)
SAMPLES = 20_000  # random metric samples per level: enough for a stable MI estimate, few enough to be fast
BINS = 50
WORKING_MM = 2.0  # volumes finer than this are resampled to it first (in-plane 0.6–0.8 mm CTs: about 2× fewer)
STEP_MM = 2.0  # first optimizer step, as a physical shift in mm
MIN_STEP = 1e-3
MAX_ITERATIONS = 100  # per level (a good start converges in 10–30; noise would use them all)
BODY_HU = -500.0  # above: the body (soft tissue, bone, vessels); below: air and lung
MIN_OVERLAP = 0.5
MIN_CORRELATION = 0.3  # between one patient's pairs (0.70-0.82 measured) and another patient's (-0.28)
MIN_RANGE_HU = 100.0  # a scan spanning less than this (air, water) has no structure to register on
_OUTSIDE = -4096.0  # resampled value outside the prior: below any HU


@dataclass(frozen=True, slots=True, eq=False)  # holds arrays: compared by identity
class Registration:
    """The rigid map between a prior and the current scan, and how well it fits."""

    metric: float  # Mattes mutual information at the end (ITK's sign: more negative is better)
    iterations: int  # optimizer iterations, all pyramid levels together
    translation_mm: tuple[float, float, float]  # of current→prior (ITK's fixed→moving), x, y, z in mm
    rotation_deg: tuple[float, float, float]  # of current→prior: Euler angles about x, y, z in degrees
    centre_mm: tuple[float, float, float]  # the centre of rotation, LPS mm in the current scan
    stop_condition: str  # the optimizer's own words for why it stopped (last level)
    correlation: float  # HU correlation of the current scan and the registered prior over the body
    overlap: float  # fraction of the current body inside the prior volume after registration
    matrix: FloatArray  # 4×4 homogeneous map current→prior (LPS mm)

    def current_to_prior(self, points_xyz: npt.ArrayLike) -> FloatArray:
        """World mm points of the current scan (``(3,)`` or ``(n, 3)``) in world mm of the prior."""
        return _apply(self.matrix, points_xyz)

    def prior_to_current(self, points_xyz: npt.ArrayLike) -> FloatArray:
        """World mm points of the prior (``(3,)`` or ``(n, 3)``) in world mm of the current scan."""
        inverse: FloatArray = np.linalg.inv(self.matrix).astype(np.float64)
        return _apply(inverse, points_xyz)


def _apply(matrix: FloatArray, points_xyz: npt.ArrayLike) -> FloatArray:
    p = np.asarray(points_xyz, dtype=np.float64)
    if p.shape[-1:] != (3,) or p.ndim > 2:
        raise ConfigError(f"points of shape {p.shape}: give one (x, y, z) point in mm, shape (3,), or many, (n, 3)")
    out: FloatArray = p @ matrix[:3, :3].T + matrix[:3, 3]
    return out


def register_rigid(current: Scan, prior: Scan, *, seed: int = 1) -> Registration:
    """Register ``prior`` (moving) to ``current`` (fixed), rigidly; see the module docstring for the method.

    ``seed`` seeds the metric's random samples; it must not be 0, which SimpleITK reads as "seed from the
    wall clock" (``sitkWallClock``): the same scans would then give a different answer run after run."""
    if seed == sitk.sitkWallClock:
        raise ValueError(f"seed {seed} is SimpleITK's wall-clock seed; give a fixed seed from 1 up")
    names = f"{prior.source or 'prior'} onto {current.source or 'current'}"
    for which, scan in (("current", current), ("prior", prior)):
        if scan.hu.size == 0 or float(scan.hu.max()) - float(scan.hu.min()) < MIN_RANGE_HU:
            raise RunError(
                f"registration of {names} failed: the {which} scan is uniform "
                f"(its HU span less than {MIN_RANGE_HU:.0f}): there is nothing to register"
            )
    fixed = _working_image(current)
    moving = _working_image(prior)
    initial = sitk.CenteredTransformInitializer(
        fixed, moving, sitk.Euler3DTransform(), sitk.CenteredTransformInitializerFilter.GEOMETRY
    )
    method = sitk.ImageRegistrationMethod()
    method.SetMetricAsMattesMutualInformation(numberOfHistogramBins=BINS)
    method.SetMetricSamplingStrategy(method.RANDOM)
    # image gradients by central differences at the samples, not a gradient image of every voxel per level:
    # the same answer, a third of the time (512×512×300: 12 s → 4 s of CPU)
    method.SetMetricUseFixedImageGradientFilter(False)
    method.SetMetricUseMovingImageGradientFilter(False)
    voxels = float(np.prod(fixed.GetSize()))
    method.SetMetricSamplingPercentagePerLevel([min(1.0, SAMPLES * s**3 / voxels) for s in SHRINK], seed)
    method.SetInterpolator(sitk.sitkLinear)
    method.SetOptimizerAsRegularStepGradientDescent(
        learningRate=STEP_MM,
        minStep=MIN_STEP,
        numberOfIterations=MAX_ITERATIONS,
        relaxationFactor=0.5,
        gradientMagnitudeTolerance=1e-8,
    )
    method.SetOptimizerScalesFromPhysicalShift()
    method.SetShrinkFactorsPerLevel(list(SHRINK))
    method.SetSmoothingSigmasPerLevel(list(SMOOTHING_MM))
    method.SmoothingSigmasAreSpecifiedInPhysicalUnitsOn()
    method.SetInitialTransform(initial, inPlace=False)
    count = [0]

    def on_iteration() -> None:
        count[0] += 1

    method.AddCommand(sitk.sitkIterationEvent, on_iteration)
    try:
        found = method.Execute(fixed, moving)
    except RuntimeError as err:
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        why = lines[-1].strip() if lines else "no reason given"
        raise RunError(f"registration of {names} failed: {why}") from None
    euler = sitk.Euler3DTransform(found.GetNthTransform(0) if found.GetName() == "CompositeTransform" else found)
    matrix = np.eye(4)
    matrix[:3, :3] = np.array(euler.GetMatrix(), dtype=np.float64).reshape(3, 3)
    centre = np.array(euler.GetCenter(), dtype=np.float64)
    translation = np.array(euler.GetTranslation(), dtype=np.float64)
    matrix[:3, 3] = centre + translation - matrix[:3, :3] @ centre  # ITK: T(p) = R(p − c) + c + t
    correlation, overlap = _fit(fixed, moving, euler)
    angles = tuple(math.degrees(a) for a in euler.GetParameters()[:3])
    result = Registration(
        metric=float(method.GetMetricValue()),
        iterations=count[0],
        translation_mm=(float(translation[0]), float(translation[1]), float(translation[2])),
        rotation_deg=(float(angles[0]), float(angles[1]), float(angles[2])),
        centre_mm=(float(centre[0]), float(centre[1]), float(centre[2])),
        stop_condition=str(method.GetOptimizerStopConditionDescription()),
        correlation=correlation,
        overlap=overlap,
        matrix=matrix,
    )
    if overlap < MIN_OVERLAP:
        raise RunError(
            f"registration of {names} failed: only {overlap:.0%} of the current body lies inside the registered "
            f"prior (at least {MIN_OVERLAP:.0%} needed); are they scans of the same chest?"
        )
    if not correlation >= MIN_CORRELATION:  # also NaN: a flat image
        raise RunError(
            f"registration of {names} failed: the registered prior correlates {correlation:.2f} with the current "
            f"scan over the body (at least {MIN_CORRELATION} for two CTs of one chest); are they the same patient?"
        )
    return result


def _working_image(scan: Scan) -> Any:
    """The scan as a float image, averaged in bins of whole voxels along any axis finer than `WORKING_MM`."""
    image = sitk.Cast(scan.to_image(), sitk.sitkFloat32)
    factors = [max(1, math.floor(WORKING_MM / float(s))) for s in scan.spacing]
    # a bin average is a box filter before subsampling: no aliasing worth the name, and fast (one pass)
    return sitk.BinShrink(image, factors) if max(factors) > 1 else image


def _fit(fixed: Any, moving: Any, transform: Any) -> tuple[float, float]:
    """HU correlation over the current body and the fraction of that body inside the prior, after registration."""
    coarse = sitk.Shrink(fixed, [2, 2, 1])
    warped = sitk.Resample(moving, coarse, transform, sitk.sitkLinear, _OUTSIDE, sitk.sitkFloat32)
    f = sitk.GetArrayViewFromImage(coarse).ravel()
    m = sitk.GetArrayViewFromImage(warped).ravel()
    body = f > BODY_HU
    inside = (body | (m > BODY_HU)) & (m > _OUTSIDE / 2)
    if not body.any():
        return float("nan"), 0.0
    overlap = float((body & (m > _OUTSIDE / 2)).sum()) / float(body.sum())
    if inside.sum() < 100:
        return float("nan"), overlap
    a = f[inside].astype(np.float64)
    b = m[inside].astype(np.float64)
    if a.std() == 0 or b.std() == 0:
        return float("nan"), overlap
    return float(np.corrcoef(a, b)[0, 1]), overlap
