"""``deskpod lung analyze``: one chest CT (and, optionally, its prior) through the whole pipeline, into a `Report`.

The stages, each timed (`Stage`), in order::

    read            images.read_scan
    lung mask       lungmask.lung_mask                        (no lungs: ConfigError)
    detect          candidates.find_candidates, or a trained detector (detect.load_detector(RUN).detect)
    segment+measure measure.segment_nodule from each candidate's point, most probable first; the type
                    (solid / part-solid / ground-glass) comes with the measurement
    malignancy      brock.malignancy per nodule
    radiomics       radiomics.extract on each nodule's mask (pyradiomics, the package's parameter file)
    Lung-RADS       lungrads.category per nodule, lungrads.exam_category for the exam
    with a prior:   read, lung mask, detect and segment+measure on the prior too; register.register_rigid
                    (current, prior); the prior nodules' centres mapped into the current scan; growth.match;
                    per matched pair growth.diameter_change and growth.volume_doubling_time; new and resolved
                    nodules; the Lung-RADS category against the matched prior nodule

Rules this module adds (the others are the stage modules'):

- a candidate is *dropped*, with the reason kept in the report, when its segmentation fails (the seed is below
  the nodule threshold), when its seed lies inside a nodule already kept (two candidates on one nodule), or when
  the segmented nodule's mean diameter is under `MIN_MM` or its long axis over `MAX_MM` (it leaked into a vessel,
  the chest wall or the mediastinum); at most ``max_nodules`` are kept;
- the region growing (`measure.segment_nodule`) starts from the candidate's point. From a solid voxel it grows at
  the solid threshold (`measure.SOLID_HU`, -300 HU) and again at the ground-glass one (`measure.GGO_HU`, -750 HU):
  when the second adds a ground-glass halo (beyond a one-voxel partial-volume rim, at least `HALO_FRACTION` of the
  solid volume) that stays under `MAX_MM`, the nodule is the whole (part-solid, its solid part measured by
  `measure`); otherwise it is the solid region. From a ground-glass voxel it grows at -750 HU, and a result that
  comes out solid is dropped (a seed on the partial-volume edge of a vessel or the wall);
- a segmentation whose short axis is under `ELONGATION` × its long axis, or whose volume is outside `FILL` times
  that of the sphere of its mean diameter, is dropped as a vessel (or vessel tree), and a ground-glass halo of that
  shape is not taken;
- the region growing is bounded by a sphere of `SEGMENT_RADIUS_MM` (1.1 × the radius of the largest nodule the
  candidates look for, `MAX_MM`), so a nodule fused to the wall cannot grow further than that;
- **upper lobe** (a Brock input): the lobes are not segmented; a nodule counts as upper-lobe when its centre lies
  in the upper half of the lung mask's cranio-caudal extent (world z, LPS: +z is superior). The oblique fissures
  run from about the level of T4 behind to the diaphragm in front, so this is a proxy, and is marked so;
- spiculation is not estimated: Brock's default (not spiculated) is used and shown as a default;
- the Lung-RADS mean diameter is `lungrads.mean_diameter` of the two axes (each to 0.1 mm, then their mean);
- with a prior, nodules are matched within `MATCH_MM` of each other after registration, and the interval between
  the scans is required (``interval_days``, or ``prior_date`` and ``current_date``);
- a stage that cannot run (a module or library missing) is reported as not run, with why, and shows no values:
  without detection the exam is Lung-RADS 0 (incomplete), never "no nodules"; without radiomics each nodule's
  radiomics is absent; without registration the follow-up comparison is incomplete (category 0).

Decision support, not a medical device; a scan marked as a phantom (the ``phantom`` argument, or "phantom" in
its path) is labelled so in everything the report says.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError, DeskpodError, UsageError
from deskpod.lung import brock, growth, lungrads, phantom_reason
from deskpod.lung.images import Scan, crop, read_scan, voxel_to_world, world_to_voxel
from deskpod.lung.lungmask import LungMask, lung_mask
from deskpod.lung.measure import GGO_HU, SOLID_HU, Measurement, segment_nodule
from deskpod.lung.report import (
    Dropped,
    Finding,
    Growth,
    Lesion,
    Patient,
    PriorFinding,
    Report,
    ScanInfo,
    Stage,
    write_report,
)

__all__ = ["MATCH_MM", "MAX_NODULES", "Patient", "Report", "analyze", "interval_between", "phantom_reason"]

MIN_MM = 3.0
"""Nodules under 3 mm mean diameter are dropped (the candidates' own lower bound; LUNA16's smallest is 3 mm)."""
MAX_MM = 35.0
"""A long axis over 35 mm is a segmentation that leaked (or a mass, not a nodule: Lung-RADS nodules are < 30 mm)."""
SEGMENT_RADIUS_MM = 1.1 * MAX_MM / 2
ELONGATION = 0.4
"""A segmentation whose short axis is under 0.4 × its long axis is a vessel (nodules are round to ovoid)."""
FILL = (0.35, 2.5)
"""A nodule's volume is 0.35–2.5 × that of the sphere of its mean diameter (a sphere: 1; ovoid nodules and partial
volume stay well within); outside, the segmentation is a vessel running along z (above) or a vessel tree (below)."""
HALO_FRACTION = 0.5
"""A solid seed's nodule is taken with its ground-glass halo (part-solid) when growing at -750 HU adds, beyond a
one-voxel partial-volume rim, at least half the solid part's volume again."""
MATCH_MM = 10.0
"""Prior and current nodules pair when their registered centres are within 10 mm."""
MAX_NODULES = 10
RADIOMICS_MARGIN = 24
"""Voxels around a nodule's box handed to `deskpod.lung.radiomics.extract`, which cuts the scan to the mask's box
plus what its 1 mm resampling needs (11 voxels at 0.57 mm); with at least that much around the box the features
are those of the whole scan."""
UPPER_LOBE_RULE = (
    "upper lobe when the nodule's centre is in the upper half of the lung mask's cranio-caudal (world z) extent; "
    "lobes are not segmented, so this is a proxy"
)


class CandidateLike(Protocol):
    """What detection gives: a point in LPS world mm, a probability, and who found it."""

    @property
    def world_xyz(self) -> tuple[float, float, float]: ...
    @property
    def probability(self) -> float: ...
    @property
    def source(self) -> str: ...


class _Stages:
    """Times the stages and remembers which did not run."""

    def __init__(self) -> None:
        self.done: list[Stage] = []

    @contextmanager
    def run(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.done.append(Stage(name, "ran", time.perf_counter() - t0))

    def skip(self, name: str, why: str) -> None:
        self.done.append(Stage(name, "not run", None, why))


class _Missing(Exception):
    """A stage's module or library is not installed: the stage does not run."""


def _module(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        missing = err.name or "?"
        if missing == name:
            raise _Missing(f"{what} is not available in this deskpod ({name} is missing)") from None
        raise _Missing(f"{what} needs the Python package {missing!r}, which is not installed") from None


def interval_between(interval_days: float | None, prior_date: date | None, current_date: date | None) -> float | None:
    """Days between the prior and the current scan, from ``interval_days`` or from the two dates."""
    if interval_days is not None and (prior_date is not None or current_date is not None):
        raise ConfigError("give the interval between the scans once: interval_days, or prior_date and current_date")
    if (prior_date is None) != (current_date is None):
        raise ConfigError("prior_date and current_date go together: give both dates, or interval_days")
    if prior_date is not None and current_date is not None:
        interval_days = float((current_date - prior_date).days)
        if interval_days <= 0:
            raise ConfigError(f"prior date {prior_date} is not before the current date {current_date}")
    if interval_days is None:
        return None
    if isinstance(interval_days, bool) or not math.isfinite(interval_days) or interval_days <= 0:
        raise ConfigError(f"interval {interval_days!r} days is not valid: the prior scan must be earlier, e.g. 365")
    return float(interval_days)


def analyze(
    scan_path: str | Path,
    *,
    prior_path: str | Path | None = None,
    out: str | Path | None = None,
    detector: str | Path | None = None,
    max_nodules: int = MAX_NODULES,
    patient: Patient | None = None,
    interval_days: float | None = None,
    prior_date: date | None = None,
    current_date: date | None = None,
    phantom: bool | None = None,
    match_mm: float = MATCH_MM,
) -> Report:
    """Analyze ``scan_path`` (and ``prior_path``) as the module docstring says; write the report into ``out``.

    ``detector``: the run folder of ``deskpod lung train`` (default: the classical candidates). ``phantom``:
    label the report as phantom data (None: from the path). Bad input is a `ConfigError` of one line.
    """
    if isinstance(max_nodules, bool) or not isinstance(max_nodules, int) or max_nodules < 1:
        raise ConfigError(f"max_nodules {max_nodules!r} is not valid: give a number of nodules, 1 or more")
    days = interval_between(interval_days, prior_date, current_date)
    if prior_path is None and days is not None:
        raise ConfigError("an interval between scans needs a prior scan (--prior)")
    if prior_path is not None and days is None:
        raise ConfigError(
            f"prior {prior_path}: give the interval between the scans (--interval-days N, or both dates), "
            "so growth and doubling time can be computed"
        )
    patient = patient or Patient()
    detect = _detector(detector)  # a bad run folder is refused before any work
    stages = _Stages()
    notes: list[str] = []
    why = phantom_reason(Path(scan_path)) if phantom is None else ("given" if phantom else "")
    is_phantom = bool(why) if phantom is None else phantom

    scan, lungs, lesions, dropped, detected = _examine(scan_path, detect, max_nodules, "N", stages, "")
    low, high = _lung_z_extent(scan, lungs)
    count = len(lesions)
    uppers = [les.centre_world[2] > (low + high) / 2.0 for les in lesions]

    risks: list[brock.Risk | None] = [None] * count
    if lesions:
        with stages.run("malignancy"):
            risks = [
                brock.malignancy(
                    long_axis_mm=les.axes.long_mm,
                    kind=les.kind,
                    nodule_count=count,
                    upper_lobe=up,
                    spiculation=None,
                    age=patient.age,
                    sex=patient.sex,
                    family_history=patient.family_history,
                    emphysema=patient.emphysema,
                )
                for les, up in zip(lesions, uppers, strict=True)
            ]
    else:
        stages.skip("malignancy", "no nodules")
    radiomics, radiomics_notes = _radiomics(scan, lesions, stages)

    prior_info: ScanInfo | None = None
    prior_findings: list[PriorFinding] = []
    prior_dropped: list[Dropped] = []
    registration: dict[str, Any] | None = None
    matched: dict[int, Growth] = {}
    compared = False
    compare_note = ""
    if prior_path is not None:
        assert days is not None
        prior, prior_lungs, prior_lesions, prior_dropped, _ = _examine(
            prior_path, detect, max_nodules, "P", stages, "prior: "
        )
        prior_info = _info(prior, prior_lungs)
        mapped: npt.NDArray[np.float64] | None = None
        try:
            reg = _module("deskpod.lung.register", "registration")
        except _Missing as err:
            stages.skip("register", str(err))
            stages.skip("match + growth", "needs the registration")
            compare_note = f"the prior could not be compared: {err}"
        else:
            with stages.run("register"):
                try:
                    result = reg.register_rigid(scan, prior)
                except UsageError:
                    raise
                except DeskpodError as err:  # a registration that fails is bad input: not one chest, or no overlap
                    raise ConfigError(str(err)) from None
                registration = _registration_json(result)
            with stages.run("match + growth"):
                centres = np.array([p.centre_world for p in prior_lesions], dtype=np.float64).reshape(-1, 3)
                mapped = np.asarray(result.prior_to_current(centres), dtype=np.float64).reshape(-1, 3)
                pairing = growth.match([les.centre_world for les in lesions], mapped.tolist(), match_mm)
                for pair in pairing.pairs:
                    matched[pair.current] = _growth(lesions[pair.current], prior_lesions[pair.prior],
                                                    pair.distance_mm, days)  # fmt: skip
            compared = True
        by_prior = {g.prior_id: lesions[i].id for i, g in matched.items()}
        for j, les in enumerate(prior_lesions):
            where = None if mapped is None else (float(mapped[j][0]), float(mapped[j][1]), float(mapped[j][2]))
            prior_findings.append(PriorFinding(les, where, by_prior.get(les.id)))

    assessments = _categories(lesions, matched, prior_path is not None, compared, compare_note, days,
                              {p.lesion.id: p.lesion for p in prior_findings}, stages)  # fmt: skip
    findings = tuple(
        Finding(
            lesion=les,
            upper_lobe=uppers[i],
            risk=risks[i],
            radiomics=radiomics[i],
            radiomics_note=radiomics_notes[i],
            lungrads=assessments[i],
            status="baseline" if prior_path is None else ("matched" if i in matched else "new"),
            growth=matched.get(i),
        )
        for i, les in enumerate(lesions)
    )
    if not detected:
        why_not = next(s.note for s in stages.done if s.name == "detect")
        exam = lungrads.incomplete(f"nodule detection did not run ({why_not})")
    elif prior_path is not None and not compared:
        exam = lungrads.incomplete(compare_note)
    else:
        exam = lungrads.exam_category(f.lungrads for f in findings)
    if is_phantom:
        notes.append(f"PHANTOM data ({why}): synthetic, not a clinical result")
    report = Report(
        scan=_info(scan, lungs),
        findings=findings,
        exam=exam,
        stages=tuple(stages.done),
        dropped=tuple(dropped),
        detection="classical candidates (deskpod.lung.candidates)" if detector is None else f"detector {detector}",
        patient=patient,
        phantom=is_phantom,
        phantom_reason=why,
        prior=prior_info,
        prior_findings=tuple(prior_findings),
        prior_dropped=tuple(prior_dropped),
        interval_days=days,
        registration=registration,
        notes=tuple(notes),
        upper_lobe_rule=UPPER_LOBE_RULE,
        image=scan,
        lungs=lungs,
    )
    if out is not None:
        write_report(report, Path(out))
    return report


def _detector(detector: str | Path | None) -> Callable[[Scan, LungMask], list[CandidateLike]] | None:
    """The detection function; None when the classical candidates are not installed (detection does not run)."""
    if detector is None:
        try:
            cands = _module("deskpod.lung.candidates", "the classical candidate detector")
        except _Missing:
            return None
        return lambda scan, lungs: list(cands.find_candidates(scan, lungs))
    run = Path(detector)
    if not run.is_dir():
        raise ConfigError(f"detector {run}: no such run folder; give the run folder of `deskpod lung train`")
    try:
        det = _module("deskpod.lung.detect", "the trained detector")
    except _Missing as err:
        raise ConfigError(f"detector {run}: {err}; run without --detector for the classical candidates") from None
    model = det.load_detector(run)
    return lambda scan, lungs: list(model.detect(scan))


def _examine(
    path: str | Path,
    detect: Callable[[Scan, LungMask], list[CandidateLike]] | None,
    max_nodules: int,
    prefix: str,
    stages: _Stages,
    label: str,
) -> tuple[Scan, LungMask, list[Lesion], list[Dropped], bool]:
    """One scan read, its lungs masked and its nodules found (the stages named with ``label`` first)."""
    with stages.run(f"{label}read"):
        scan = read_scan(path)
    with stages.run(f"{label}lung mask"):
        lungs = lung_mask(scan)
    return (scan, lungs, *_nodules(scan, lungs, detect, max_nodules, prefix, stages, label))


def _nodules(
    scan: Scan,
    lungs: LungMask,
    detect: Callable[[Scan, LungMask], list[CandidateLike]] | None,
    max_nodules: int,
    prefix: str,
    stages: _Stages,
    label: str,
) -> tuple[list[Lesion], list[Dropped], bool]:
    """Detect, then segment and measure; (the nodules, the dropped candidates, whether detection ran)."""
    if detect is None:
        why = "the classical candidate detector is not available in this deskpod (deskpod.lung.candidates missing)"
        stages.skip(f"{label}detect", why)
        stages.skip(f"{label}segment + measure", "no detection")
        return [], [], False
    with stages.run(f"{label}detect"):
        candidates = sorted(detect(scan, lungs), key=lambda c: -float(c.probability))
    lesions: list[Lesion] = []
    dropped: list[Dropped] = []
    with stages.run(f"{label}segment + measure"):
        for cand in candidates:
            seed = (float(cand.world_xyz[0]), float(cand.world_xyz[1]), float(cand.world_xyz[2]))
            found = _nodule_at(scan, seed, lesions, max_nodules)
            if isinstance(found, str):
                dropped.append(Dropped(seed, float(cand.probability), found))
            else:
                lesions.append(_lesion(f"{prefix}{len(lesions) + 1}", cand, seed, *found))
    return lesions, dropped, True


def _nodule_at(
    scan: Scan, seed: tuple[float, float, float], lesions: Sequence[Lesion], max_nodules: int
) -> tuple[Measurement, tuple[int, int, int]] | str:
    """The nodule a candidate's seed grows into and its box's corner (z, y, x), or why the candidate is dropped."""
    if len(lesions) >= max_nodules:
        return f"beyond the {max_nodules} most probable nodules kept"
    inside = _containing(lesions, scan, seed)
    if inside is not None:
        return f"inside nodule {inside.id} (a second candidate on it)"
    box, corner = _box_around(scan, seed, SEGMENT_RADIUS_MM + 2 * max(scan.spacing))
    try:
        m = _segment(box, seed)
    except ConfigError as err:
        return f"segmentation failed: {err}"
    if m.axes.long_mm > MAX_MM:
        return f"segmentation leaked: long axis {m.axes.long_mm:.1f} mm is over {MAX_MM:g} mm"
    if m.axes.mean_mm < MIN_MM:
        return f"segmented nodule {m.axes.mean_mm:.1f} mm is under {MIN_MM:g} mm mean diameter"
    return _shape_problem(m) or (m, corner)


def _segment(scan: Scan, seed: tuple[float, float, float]) -> Measurement:
    """Grow the nodule at ``seed`` as the module docstring says: solid, with its ground-glass halo, or ground-glass."""
    x, y, z = (round(float(v)) for v in world_to_voxel(scan, seed))
    nz, ny, nx = scan.shape
    inside = 0 <= x < nx and 0 <= y < ny and 0 <= z < nz
    if inside and GGO_HU <= scan.hu[z, y, x] < SOLID_HU:
        m = segment_nodule(scan, seed, radius_mm=SEGMENT_RADIUS_MM, threshold_hu=GGO_HU)
        if m.kind == "solid":
            raise ConfigError("grown from a ground-glass voxel into solid tissue: the edge of a vessel or the wall")
        return m
    solid = segment_nodule(scan, seed, radius_mm=SEGMENT_RADIUS_MM, threshold_hu=SOLID_HU)
    try:
        wide = segment_nodule(scan, seed, radius_mm=SEGMENT_RADIUS_MM, threshold_hu=GGO_HU)
    except ConfigError:
        return solid
    if wide.axes.long_mm > MAX_MM or _shape_problem(wide):
        return solid
    halo = int(np.count_nonzero(wide.mask)) - int(np.count_nonzero(_dilated(solid.mask)))
    return wide if halo >= HALO_FRACTION * int(np.count_nonzero(solid.mask)) else solid


def _shape_problem(m: Measurement) -> str:
    """Why a segmentation is not nodule-shaped ("" when it is): elongated in the plane, or not compact in 3-D."""
    if m.axes.short_mm < ELONGATION * m.axes.long_mm:
        return f"elongated ({m.axes.long_mm:.1f} x {m.axes.short_mm:.1f} mm): a vessel, not a nodule"
    fill = m.volume_mm3 / (math.pi / 6 * m.axes.mean_mm**3)
    if not FILL[0] <= fill <= FILL[1]:
        what = "long along z: a vessel" if fill > FILL[1] else "sparse: a vessel tree"
        return (f"not nodule-shaped: {m.volume_mm3:.0f} mm3 is {fill:.2f} x the sphere of its {m.axes.mean_mm:.1f} mm "
                f"mean diameter ({what})")  # fmt: skip
    return ""


def _dilated(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """``mask`` grown by one voxel (6-connected), computed in its bounding box."""
    zs, ys, xs = np.nonzero(mask)
    lo = [max(0, int(a.min()) - 1) for a in (zs, ys, xs)]
    hi = [min(n, int(a.max()) + 2) for a, n in zip((zs, ys, xs), mask.shape, strict=True)]
    box = mask[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
    grown = box.copy()
    for axis in range(3):
        grown |= np.roll(box, 1, axis) | np.roll(box, -1, axis)  # the box has a free voxel on each side
    out = np.zeros(mask.shape, dtype=bool)
    out[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]] = grown
    return out


def _containing(lesions: Sequence[Lesion], scan: Scan, seed: tuple[float, float, float]) -> Lesion | None:
    x, y, z = (round(float(v)) for v in world_to_voxel(scan, seed))
    for les in lesions:
        oz, oy, ox = les.offset_zyx
        dz, dy, dx = les.mask.shape
        if oz <= z < oz + dz and oy <= y < oy + dy and ox <= x < ox + dx and les.mask[z - oz, y - oy, x - ox]:
            return les
    return None


def _box_around(scan: Scan, seed: tuple[float, float, float], radius_mm: float) -> tuple[Scan, tuple[int, int, int]]:
    """The part of the scan within ``radius_mm`` of ``seed`` (per axis; the geometry kept), and its corner (z, y, x).

    Segmenting in this box rather than in the whole scan gives the same nodule (the growing is bounded by a smaller
    sphere) and keeps every array the size of a nodule's neighbourhood, not of the scan.
    """
    centre = world_to_voxel(scan, seed)
    lo_xyz, hi_xyz = [], []
    for axis, n in zip(range(3), (scan.shape[2], scan.shape[1], scan.shape[0]), strict=True):
        r = math.ceil(radius_mm / scan.spacing[axis])
        c = int(np.clip(round(float(centre[axis])), 0, n - 1))
        lo_xyz.append(max(0, c - r))
        hi_xyz.append(min(n, c + r + 1))
    return crop(scan, lo_xyz[::-1], hi_xyz[::-1]), (lo_xyz[2], lo_xyz[1], lo_xyz[0])


def _lesion(
    lesion_id: str, cand: CandidateLike, seed: tuple[float, float, float], m: Measurement, corner: tuple[int, int, int]
) -> Lesion:
    """The lesion of a measurement made in a box whose corner (z, y, x) lies at ``corner`` in the scan."""
    zs, ys, xs = np.nonzero(m.mask)
    lo = (int(zs.min()), int(ys.min()), int(xs.min()))
    crop = m.mask[lo[0] : int(zs.max()) + 1, lo[1] : int(ys.max()) + 1, lo[2] : int(xs.max()) + 1].copy()
    cz, cy, cx = corner
    solid = m.solid_part
    if solid is not None:
        solid = replace(solid, slice_z=solid.slice_z + cz)
    vx, vy, vz = m.centre_voxel
    return Lesion(
        id=lesion_id,
        probability=float(cand.probability),
        source=str(cand.source),
        seed_world=seed,
        axes=replace(m.axes, slice_z=m.axes.slice_z + cz),
        lungrads_mean_mm=lungrads.mean_diameter(m.axes.long_mm, m.axes.short_mm),
        volume_mm3=m.volume_mm3,
        kind=m.kind,
        solid_part=solid,
        solid_lungrads_mean_mm=None if solid is None else lungrads.mean_diameter(solid.long_mm, solid.short_mm),
        mean_hu=m.mean_hu,
        centre_voxel=(vx + cx, vy + cy, vz + cz),
        centre_world=m.centre_world,
        mask=crop,
        offset_zyx=(lo[0] + cz, lo[1] + cy, lo[2] + cx),
    )


def _lung_z_extent(scan: Scan, lungs: LungMask) -> tuple[float, float]:
    """World z (inferior, superior) of the lung mask's first and last slice, at the mask's centroid in x, y."""
    zs = np.flatnonzero(lungs.mask.reshape(lungs.mask.shape[0], -1).any(axis=1))
    plane = lungs.mask[int(zs[len(zs) // 2])]
    ys, xs = np.nonzero(plane)
    cx, cy = float(xs.mean()), float(ys.mean())
    ends = voxel_to_world(scan, [[cx, cy, float(zs[0])], [cx, cy, float(zs[-1])]])[:, 2]
    return float(ends.min()), float(ends.max())


def _info(scan: Scan, lungs: LungMask | None) -> ScanInfo:
    return ScanInfo(
        source=scan.source,
        shape_zyx=scan.shape,
        spacing=scan.spacing,
        origin=scan.origin,
        direction=scan.direction,
        lung_ml=None if lungs is None else lungs.volume_ml,
        lung_z_mm=None if lungs is None else _lung_z_extent(scan, lungs),
    )


def _radiomics(
    scan: Scan, lesions: Sequence[Lesion], stages: _Stages
) -> tuple[list[dict[str, float] | None], list[str]]:
    values: list[dict[str, float] | None] = [None] * len(lesions)
    notes = [""] * len(lesions)
    if not lesions:
        stages.skip("radiomics", "no nodules")
        return values, notes
    try:
        rad = _module("deskpod.lung.radiomics", "radiomics")
        if importlib.util.find_spec("radiomics") is None:
            raise _Missing(
                "radiomics needs pyradiomics, which is not installed (the lung extra: pip install 'deskpod[lung]')"
            )
    except _Missing as err:
        stages.skip("radiomics", str(err))
        return values, [f"not run: {err}"] * len(lesions)
    with stages.run("radiomics"):
        for i, les in enumerate(lesions):
            crop, mask = _crop(scan, les, RADIOMICS_MARGIN)
            try:
                values[i] = {str(k): float(v) for k, v in rad.extract(crop, mask).items()}
            except DeskpodError as err:
                notes[i] = f"not computed: {err}"
    return values, notes


def _crop(scan: Scan, les: Lesion, margin: int) -> tuple[Scan, npt.NDArray[np.bool_]]:
    """The scan around a nodule (its geometry kept: the origin moves to the crop's corner) and its mask there."""
    lo = [max(0, o - margin) for o in les.offset_zyx]
    hi = [min(n, o + d + margin) for o, d, n in zip(les.offset_zyx, les.mask.shape, scan.shape, strict=True)]
    around = crop(scan, lo, hi)
    mask = np.zeros(around.hu.shape, dtype=bool)
    z, y, x = (o - a for o, a in zip(les.offset_zyx, lo, strict=True))
    dz, dy, dx = les.mask.shape
    mask[z : z + dz, y : y + dy, x : x + dx] = les.mask
    return around, mask


def _registration_json(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("metric", "iterations", "translation_mm", "rotation_deg", "correlation", "overlap", "stop_condition"):
        value = getattr(result, name, None)
        if value is not None:
            out[name] = list(value) if isinstance(value, tuple | list) else value
    return out


def _growth(current: Lesion, prior: Lesion, distance: float, days: float) -> Growth:
    months = growth.months_from_days(days)
    change = growth.diameter_change(prior.lungrads_mean_mm, current.lungrads_mean_mm, months)
    solid = None
    if current.kind != "solid" or prior.kind != "solid":
        now, then = current.lungrads_nodule().solid_tenths / 10, prior.lungrads_nodule().solid_tenths / 10
        solid = growth.diameter_change(then, now, months)
    vdt = growth.volume_doubling_time(prior.volume_mm3, current.volume_mm3, days)
    return Growth(prior.id, float(distance), days, change, solid, prior.volume_mm3, vdt)


def _categories(
    lesions: Sequence[Lesion],
    matched: dict[int, Growth],
    followup: bool,
    compared: bool,
    compare_note: str,
    days: float | None,
    priors: dict[str, Lesion],
    stages: _Stages,
) -> list[lungrads.Assessment]:
    if followup and not compared:
        stages.skip("Lung-RADS", compare_note)
        return [lungrads.incomplete(compare_note) for _ in lesions]
    with stages.run("Lung-RADS"):
        out = []
        for i, les in enumerate(lesions):
            nodule = les.lungrads_nodule()
            if not followup:
                out.append(lungrads.category(nodule, baseline=True))
            elif i in matched:
                assert days is not None
                prior = priors[matched[i].prior_id].lungrads_nodule()
                months = growth.months_from_days(days)
                out.append(lungrads.category(nodule, prior=prior, months_since_prior=months, baseline=False))
            else:
                out.append(lungrads.category(nodule, baseline=False))
    return out
