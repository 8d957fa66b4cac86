"""FROC and CPM of a nodule detector by the LUNA16 rules, with bootstrap intervals and the FROC plot.

    deskpod lung evaluate --annotations annotations.csv --excluded annotations_excluded.csv \\
        --candidates results.csv --seriesuids seriesuids.csv [--bootstrap 1000] [--seed 0] [--out DIR]

The rules are those of the challenge's evaluation script (``noduleCADEvaluationLUNA16.py``, Setio et al.
2017, Medical Image Analysis 42:1-13), here vectorized with numpy:

- Only the listed scans count; annotations of other scans are ignored (folds), a candidate of another
  scan is bad input. A scan with more than 100 candidates keeps those whose probability is above its
  101st highest (the script's ``maxNumberOfCADMarks=100``; ties at that value are all dropped).
- A candidate *hits* a finding when its squared distance to the finding's centre is less than the
  squared radius (``diameter_mm / 2``): on the boundary is a miss. Each square is the C library's ``pow(v, 2.0)``,
  summed x, y, z in that order, as the script computes it (`libm_square`). An excluded finding with a negative
  diameter (``-1`` in the real annotations_excluded.csv) gets the script's default of 10 mm.
- A nodule hit by several candidates is detected once, with the highest of their probabilities; a
  candidate that hits two nodules counts for both. A candidate that hits an excluded finding and no
  nodule is ignored (neither true nor false positive). Every other candidate is a false positive.
- The FROC curve is the script's ROC-derived one: the entries are the detected nodules (their highest
  probability) and the false positives, thresholded at every distinct probability; a point is
  (false positives / scans, detected nodules / all nodules), the float arithmetic done in the
  script's order. Sensitivity at 1/8, 1/4, 1/2, 1, 2, 4 and 8 false positives per scan is
  ``np.interp`` on that curve (on a vertical step, the top of the step, as ``np.interp`` gives);
  the CPM is their mean. With no detected nodule every sensitivity is 0 (the script gives NaN);
  with no false positive every sensitivity is the fraction detected (the script's border case).
- Bootstrap: resample the listed scans with replacement (seeded), recompute the curve with each drawn
  scan's entries and nodules, interpolate it the same way; the interval is the script's order statistic
  (sorted values, ``v[floor(0.025 n)]`` and ``v[floor(0.975 n)]``), for each point and for the CPM. A
  draw that holds no nodule has no sensitivity and is left out (counted in the result).

It is decision support, not a medical device: the figures measure a detector against reference
annotations, they are not a clinical result.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from deskpod.errors import ConfigError
from deskpod.lung import phantom_reason

FP_RATES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""False positives per scan at which LUNA16 reads the FROC curve; the CPM is the mean sensitivity there."""
MAX_MARKS = 100
"""Candidates per scan the LUNA16 script keeps (``maxNumberOfCADMarks`` in its ``noduleCADEvaluation``)."""
EXCLUDED_DEFAULT_DIAMETER_MM = 10.0
"""Diameter the script gives a finding whose diameter is negative (-1 in annotations_excluded.csv)."""
CONFIDENCE = 0.95
GRID = 2.0 ** np.linspace(-3.0, 3.0, 385)
"""Where the plotted curve and its band are sampled: 1/8 .. 8 false positives per scan, 64 points an octave."""
PHANTOM_LABEL = "PHANTOM DATA: synthetic scans, not a clinical result"
DISCLAIMER = (
    "decision support, not a medical device: these figures measure a detector against reference "
    "annotations; they are not a clinical result"
)
ANNOTATION_COLUMNS = ("seriesuid", "coordX", "coordY", "coordZ", "diameter_mm")
CANDIDATE_COLUMNS = ("seriesuid", "coordX", "coordY", "coordZ", "probability")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


# ---------------------------------------------------------------- inputs
@dataclass(frozen=True, slots=True)
class Findings:
    """Rows of annotations.csv or annotations_excluded.csv: a centre in world mm and a diameter."""

    seriesuid: tuple[str, ...]
    xyz: FloatArray
    """(n, 3): coordX, coordY, coordZ in mm."""
    diameter_mm: FloatArray
    source: str = ""
    """The file the rows came from, for messages."""


@dataclass(frozen=True, slots=True)
class Candidates:
    """Rows of a results (candidates) CSV: a centre in world mm and the detector's probability."""

    seriesuid: tuple[str, ...]
    xyz: FloatArray
    probability: FloatArray
    source: str = ""
    line: IntArray | None = None
    """The line of each row in ``source`` (1 is the header), for messages."""


def make_findings(rows: Sequence[tuple[str, float, float, float, float]], source: str = "") -> Findings:
    """Findings from ``(seriesuid, x, y, z, diameter_mm)`` tuples."""
    xyz = np.array([r[1:4] for r in rows], dtype=np.float64).reshape(-1, 3)
    return Findings(tuple(r[0] for r in rows), xyz, np.array([r[4] for r in rows], dtype=np.float64), source)


def make_candidates(rows: Sequence[tuple[str, float, float, float, float]], source: str = "") -> Candidates:
    """Candidates from ``(seriesuid, x, y, z, probability)`` tuples."""
    xyz = np.array([r[1:4] for r in rows], dtype=np.float64).reshape(-1, 3)
    return Candidates(tuple(r[0] for r in rows), xyz, np.array([r[4] for r in rows], dtype=np.float64), source)


def _read_text(path: str | Path, name: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{name} cannot be read: {e}") from None


def _read_table(path: str | Path, what: str, columns: Sequence[str]) -> tuple[list[int], dict[str, list[str]]]:
    """The named columns of a CSV file with a header line, as strings, and each row's line number."""
    name = f"{what} {str(path)!r}"
    reader = csv.reader(io.StringIO(_read_text(path, name)))
    try:
        header = next((row for row in reader if any(f.strip() for f in row)), None)
        if header is None:
            raise ConfigError(f"{name} is empty: expected a header line {','.join(columns)} and one row per line")
        header = [f.strip() for f in header]
        missing = [c for c in columns if c not in header]
        if missing:
            raise ConfigError(
                f"{name} line {reader.line_num}: no column {', '.join(map(repr, missing))} "
                f"(the header has {','.join(header)}; expected {','.join(columns)})"
            )
        where = [header.index(c) for c in columns]
        lines: list[int] = []
        values: list[list[str]] = [[] for _ in columns]
        for row in reader:
            if not any(f.strip() for f in row):
                continue
            if len(row) != len(header):
                raise ConfigError(
                    f"{name} line {reader.line_num}: {len(row)} fields where the header has {len(header)}: "
                    f"{','.join(row)!r}"
                )
            lines.append(reader.line_num)
            for out, i in zip(values, where, strict=True):
                out.append(row[i].strip())
    except csv.Error as e:
        raise ConfigError(f"{name} line {reader.line_num}: not CSV ({e})") from None
    return lines, dict(zip(columns, values, strict=True))


def _numbers(values: list[str], lines: list[int], what: str, path: str | Path, column: str) -> FloatArray:
    try:
        out = np.fromiter(map(float, values), dtype=np.float64, count=len(values))
    except ValueError:
        out = np.zeros(0)  # find the bad row below
    finite = np.isfinite(out)
    if len(out) == len(values) and finite.all():
        return out
    for v, line in zip(values, lines, strict=True):
        try:
            x = float(v)
        except ValueError:
            raise ConfigError(f"{what} {str(path)!r} line {line}: {column} {v!r} is not a number") from None
        if not math.isfinite(x):
            raise ConfigError(f"{what} {str(path)!r} line {line}: {column} {v!r} is not a finite number")
    raise AssertionError("unreachable")


def _uids(values: list[str], lines: list[int], what: str, path: str | Path) -> tuple[str, ...]:
    for v, line in zip(values, lines, strict=True):
        if not v:
            raise ConfigError(f"{what} {str(path)!r} line {line}: empty seriesuid")
    return tuple(values)


def _read_findings(path: str | Path, what: str, *, excluded: bool) -> Findings:
    lines, col = _read_table(path, what, ANNOTATION_COLUMNS)
    uids = _uids(col["seriesuid"], lines, what, path)
    xyz = np.stack([_numbers(col[c], lines, what, path, c) for c in ANNOTATION_COLUMNS[1:4]], axis=1)
    diameter = _numbers(col["diameter_mm"], lines, what, path, "diameter_mm")
    if not excluded:
        bad = np.flatnonzero(diameter <= 0)
        if len(bad):
            i = int(bad[0])
            raise ConfigError(
                f"{what} {str(path)!r} line {lines[i]}: diameter_mm {col['diameter_mm'][i]!r} must be positive "
                "(a diameter of -1 belongs in annotations_excluded.csv)"
            )
    return Findings(uids, xyz.reshape(-1, 3), diameter, str(path))


def read_annotations(path: str | Path) -> Findings:
    """The nodules of annotations.csv (seriesuid,coordX,coordY,coordZ,diameter_mm; diameters > 0)."""
    return _read_findings(path, "annotations file", excluded=False)


def read_excluded(path: str | Path) -> Findings:
    """The excluded findings of annotations_excluded.csv (same columns; a negative diameter means 10 mm)."""
    return _read_findings(path, "excluded-findings file", excluded=True)


def libm_square(a: FloatArray) -> FloatArray:
    """``pow(v, 2.0)`` of each element as the C library computes it, which is what the script does (Python's
    ``pow`` on floats calls it). It is not ``v * v``: glibc's ``pow`` differs from the correctly rounded product in
    the last bit for about 0.08% of values, and NumPy's ``power(a, 2.0)`` multiplies; a point within one ULP of a
    sphere is a hit by one and a miss by the other."""
    flat = a.ravel().tolist()
    return np.fromiter((math.pow(v, 2.0) for v in flat), dtype=np.float64, count=len(flat)).reshape(a.shape)


def read_candidates(path: str | Path) -> Candidates:
    """A results (candidates) CSV: seriesuid,coordX,coordY,coordZ,probability (more columns are ignored)."""
    what = "candidates file"
    lines, col = _read_table(path, what, CANDIDATE_COLUMNS)
    uids = _uids(col["seriesuid"], lines, what, path)
    xyz = np.stack([_numbers(col[c], lines, what, path, c) for c in CANDIDATE_COLUMNS[1:4]], axis=1)
    prob = _numbers(col["probability"], lines, what, path, "probability")
    return Candidates(uids, xyz.reshape(-1, 3), prob, str(path), np.array(lines, dtype=np.int64))


def read_seriesuids(path: str | Path) -> tuple[str, ...]:
    """The scans to evaluate: one seriesuid a line (the official seriesuids.csv), or a CSV with a seriesuid column."""
    what = "series list"
    name = f"{what} {str(path)!r}"
    numbered = [(i, line.strip()) for i, line in enumerate(_read_text(path, name).splitlines(), 1) if line.strip()]
    if numbered and "seriesuid" in [f.strip() for f in numbered[0][1].split(",")]:
        lines, col = _read_table(path, what, ("seriesuid",))
        uids = _uids(col["seriesuid"], lines, what, path)
        pairs = list(zip(lines, uids, strict=True))
    else:
        for line, uid in numbered:
            if "," in uid:
                raise ConfigError(
                    f"{name} line {line}: {uid!r} is not one seriesuid; write one seriesuid a line, "
                    "or a CSV whose header names a seriesuid column"
                )
        pairs = numbered
    if not pairs:
        raise ConfigError(f"{name} is empty: expected one seriesuid a line")
    seen: dict[str, int] = {}
    for line, uid in pairs:
        if uid in seen:
            raise ConfigError(f"{name} line {line}: seriesuid {uid!r} is listed twice (first on line {seen[uid]})")
        seen[uid] = line
    return tuple(uid for _, uid in pairs)


# ---------------------------------------------------------------- the hit rules
@dataclass(frozen=True, slots=True)
class Matching:
    """Candidates against findings by the LUNA16 rules: the FROC entries and what became of every candidate."""

    scans: int
    lesions_per_scan: IntArray
    """Nodules (annotations.csv) in each listed scan."""
    entry_scan: IntArray
    """Scan index of each FROC entry: the detected nodules first, then the false positives."""
    entry_probability: FloatArray
    entry_is_nodule: BoolArray
    candidates: int
    """Candidates of the listed scans in the results file."""
    over_limit: int
    """Candidates dropped by the limit per scan (`max_marks`)."""
    nodules: int
    detected: int
    false_positives: int
    ignored_on_excluded: int
    """Candidates that hit an excluded finding and no nodule."""
    double_detections: int
    """Hits on a nodule beyond its first (the extra candidates, which are not false positives)."""
    multi_nodule_candidates: int
    """Candidates that hit two or more nodules (each of which they detect)."""
    max_marks: int | None = MAX_MARKS
    """The limit of candidates per scan that was applied (None: none)."""


def _scan_index(uids: Sequence[str], index: dict[str, int]) -> IntArray:
    return np.fromiter((index.get(u, -1) for u in uids), dtype=np.int64, count=len(uids))


def match(
    series: Sequence[str],
    annotations: Findings,
    excluded: Findings,
    candidates: Candidates,
    *,
    max_marks: int | None = MAX_MARKS,
) -> Matching:
    """Apply the LUNA16 hit rules (see the module docstring) to the candidates of the listed scans."""
    if not series:
        raise ConfigError("no scans to evaluate: the series list is empty")
    index = {uid: i for i, uid in enumerate(series)}
    if len(index) != len(series):
        raise ConfigError("the series list names a scan twice")
    if max_marks is not None and max_marks < 1:
        raise ConfigError(f"max marks per scan {max_marks} must be at least 1 (or no limit)")
    n = len(series)
    cs = _scan_index(candidates.seriesuid, index)
    unknown = np.flatnonzero(cs < 0)
    if len(unknown):
        i = int(unknown[0])
        at = f" line {int(candidates.line[i])}" if candidates.line is not None else f" row {i + 1}"
        raise ConfigError(
            f"candidates file {candidates.source!r}{at}: seriesuid {candidates.seriesuid[i]!r} is not one of the "
            f"{n} listed scans (results must be for listed scans only; check --seriesuids)"
        )
    prob = candidates.probability
    keep = np.ones(len(cs), dtype=bool)
    counts = np.bincount(cs, minlength=n)
    if max_marks is not None and (counts > max_marks).any():
        over = counts > max_marks
        by_scan = np.lexsort((-prob, cs))  # scan by scan, most probable first
        starts = np.cumsum(counts) - counts
        threshold = np.full(n, -np.inf)
        threshold[over] = prob[by_scan][starts[over] + max_marks]  # the (max_marks + 1)-th highest
        keep = prob > threshold[cs]
    cs_k, xyz_k, p_k = cs[keep], candidates.xyz[keep], prob[keep]

    inc_scan = _scan_index(annotations.seriesuid, index)
    exc_scan = _scan_index(excluded.seriesuid, index)
    inc, exc = inc_scan >= 0, exc_scan >= 0
    n_inc = int(inc.sum())
    if n_inc == 0:
        raise ConfigError(
            f"annotations file {annotations.source!r} has no nodule in the {n} listed scans: sensitivity is undefined"
        )
    a_scan = np.concatenate([inc_scan[inc], exc_scan[exc]])
    a_xyz = np.concatenate([annotations.xyz[inc], excluded.xyz[exc]]).reshape(-1, 3)
    diameter = np.concatenate([annotations.diameter_mm[inc], excluded.diameter_mm[exc]])
    diameter = np.where(diameter < 0.0, EXCLUDED_DEFAULT_DIAMETER_MM, diameter)
    a_r2 = libm_square(diameter / 2.0)
    a_inc = np.arange(len(a_scan)) < n_inc

    # Every (finding, candidate of the same scan) pair.
    c_order = np.argsort(cs_k, kind="stable")
    c_counts = np.bincount(cs_k, minlength=n)
    c_starts = np.cumsum(c_counts) - c_counts
    per = c_counts[a_scan]
    ann = np.repeat(np.arange(len(a_scan)), per)
    offset = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
    cand = c_order[np.repeat(c_starts[a_scan], per) + offset]
    d2 = libm_square(a_xyz[ann] - xyz_k[cand])  # as the script does: pow(x - x2, 2.) + pow(y - y2, 2.) + ...
    hit = d2[:, 0] + d2[:, 1] + d2[:, 2] < a_r2[ann]
    inc_hit, exc_hit = hit & a_inc[ann], hit & ~a_inc[ann]

    hits_per_nodule = np.bincount(ann[inc_hit], minlength=n_inc)[:n_inc]
    best = np.full(n_inc, -np.inf)
    np.maximum.at(best, ann[inc_hit], p_k[cand[inc_hit]])
    detected = hits_per_nodule > 0
    on_nodules = np.bincount(cand[inc_hit], minlength=len(cs_k))
    on_excluded = np.bincount(cand[exc_hit], minlength=len(cs_k)) > 0
    fp = (on_nodules == 0) & ~on_excluded
    n_det, n_fp = int(detected.sum()), int(fp.sum())
    return Matching(
        scans=n,
        lesions_per_scan=np.bincount(a_scan[:n_inc], minlength=n).astype(np.int64),
        entry_scan=np.concatenate([a_scan[:n_inc][detected], cs_k[fp]]).astype(np.int64),
        entry_probability=np.concatenate([best[detected], p_k[fp]]),
        entry_is_nodule=np.concatenate([np.ones(n_det, dtype=bool), np.zeros(n_fp, dtype=bool)]),
        candidates=len(cs),
        over_limit=int((~keep).sum()),
        nodules=n_inc,
        detected=n_det,
        false_positives=n_fp,
        ignored_on_excluded=int(((on_nodules == 0) & on_excluded).sum()),
        double_detections=int((hits_per_nodule[detected] - 1).sum()),
        multi_nodule_candidates=int((on_nodules >= 2).sum()),
        max_marks=max_marks,
    )


# ---------------------------------------------------------------- the FROC curve
@dataclass(frozen=True, slots=True)
class FrocCurve:
    """Points of the FROC curve, most probable threshold first, from (0, 0)."""

    fp_per_scan: FloatArray
    sensitivity: FloatArray

    def at(self, fp_rates: Sequence[float] | FloatArray = FP_RATES) -> FloatArray:
        """Sensitivity at these false-positive rates (``np.interp`` on the points, as the LUNA16 script)."""
        return np.interp(np.asarray(fp_rates, dtype=np.float64), self.fp_per_scan, self.sensitivity)


def _points(tp: FloatArray, fp: FloatArray, lesions: FloatArray, scans: int) -> tuple[FloatArray, FloatArray]:
    """Curve points from cumulative counts (rows of ``tp``/``fp``, starting at 0), in the script's float order."""
    n_det, n_fp = tp[..., -1:], fp[..., -1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        fps = np.where(n_fp > 0, fp / n_fp * n_fp / scans, 0.0)
        sens = np.where(n_det > 0, tp / n_det * n_det / lesions, 0.0)
    return fps, sens


class _Ranked:
    """The FROC entries sorted by falling probability, and where each run of equal probabilities ends."""

    def __init__(self, m: Matching) -> None:
        order = np.argsort(-m.entry_probability, kind="stable")
        p = m.entry_probability[order]
        self.scan = m.entry_scan[order]
        self.is_nodule = m.entry_is_nodule[order]
        new = np.append(True, p[1:] != p[:-1]) if len(p) else np.zeros(0, dtype=bool)
        self.group = np.cumsum(new)
        """Curve point (1..) that each entry's threshold ends at; point 0 is (0, 0)."""
        self.ends = np.append(np.flatnonzero(new[1:]), len(p) - 1) if len(p) else np.zeros(0, np.int64)

    def cumulative(self, weight: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Cumulative (nodules, false positives) at every point, for rows of ``weight`` (one per entry)."""
        tp_w = weight * self.is_nodule
        total = np.cumsum(weight, axis=-1)[..., self.ends]
        tp = np.cumsum(tp_w, axis=-1)[..., self.ends]
        zero = np.zeros((*weight.shape[:-1], 1))
        return np.concatenate([zero, tp], axis=-1), np.concatenate([zero, total - tp], axis=-1)

    def corners(self) -> IntArray:
        """The points ``np.interp`` needs: the first, the last, and both ends of every segment that gains a nodule.

        Between two of them the curve is flat in every draw (no nodule's threshold lies there), so
        interpolating on these points alone gives the same value, bit for bit, at every rate.
        """
        last = len(self.ends)
        gains = np.zeros(last + 1, dtype=bool)
        gains[self.group[self.is_nodule]] = True
        keep = gains.copy()
        keep[:-1] |= gains[1:]
        keep[0] = keep[last] = True
        return np.flatnonzero(keep)

    def counts_by_scan(self, scans: int, weights: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Cumulative (nodules, false positives) at `corners` for rows of per-scan ``weights``: (rows, corners)."""
        corners = self.corners()
        k = len(corners)
        span = np.searchsorted(corners, self.group)  # the corner that closes each entry's span
        fp = ~self.is_nodule
        per_scan = np.bincount(self.scan[fp] * k + span[fp], minlength=scans * k).reshape(scans, k)
        fp_cum = np.cumsum(weights @ per_scan.astype(np.float64), axis=1)  # integer-valued: exact in any order
        tp_upto = np.searchsorted(self.group[self.is_nodule], corners, side="right")
        tp_w = weights[:, self.scan[self.is_nodule]]
        tp_cum = np.concatenate([np.zeros((len(weights), 1)), np.cumsum(tp_w, axis=1)], axis=1)[:, tp_upto]
        return tp_cum, fp_cum


def froc_curve(m: Matching) -> FrocCurve:
    """The FROC curve of all listed scans."""
    ranked = _Ranked(m)
    tp, fp = ranked.cumulative(np.ones(len(ranked.scan)))
    fps, sens = _points(tp, fp, np.asarray(float(m.nodules)), m.scans)
    return FrocCurve(fps, sens)


def resample_scans(scans: int, samples: int, seed: int) -> IntArray:
    """``samples`` draws of ``scans`` scan indices with replacement, reproducible from ``seed``: (samples, scans)."""
    return np.random.default_rng(seed).integers(0, scans, size=(samples, scans), dtype=np.int64)


def interval(values: FloatArray, confidence: float = CONFIDENCE) -> tuple[FloatArray, FloatArray]:
    """The LUNA16 script's interval along axis 0: sorted values at ``floor(pz n)`` and ``floor((1 - pz) n)``."""
    v = np.sort(values, axis=0)
    n = v.shape[0]
    pz = (1.0 - confidence) / 2.0
    return v[math.floor(pz * n)], v[math.floor((1.0 - pz) * n)]


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Sensitivity and CPM over scans resampled with replacement."""

    samples: int
    seed: int
    confidence: float
    without_nodules: int
    """Draws that held no nodule (no sensitivity; left out of the intervals)."""
    sensitivity: FloatArray
    """(valid draws, len(FP_RATES))."""
    cpm: FloatArray
    curve: FloatArray
    """(valid draws, len(GRID)): each draw's curve on `GRID`, for the plot's band."""

    def sensitivity_interval(self) -> tuple[FloatArray, FloatArray]:
        return interval(self.sensitivity, self.confidence)

    def cpm_interval(self) -> tuple[float, float]:
        lo, hi = interval(self.cpm, self.confidence)
        return float(lo), float(hi)


def bootstrap(
    m: Matching,
    *,
    samples: int = 1000,
    seed: int = 0,
    confidence: float = CONFIDENCE,
    chunk_elements: int = 2_000_000,
    by_scan_limit: int = 8_000_000,
) -> Bootstrap:
    """Resample the scans ``samples`` times (seeded) and read each draw's FROC curve as the point estimate is read.

    ``chunk_elements`` bounds the draws handled at once; ``by_scan_limit`` the scans x corners table of
    the fast path (64 MB at the default; LUNA16 needs about 2.1 million).
    """
    if samples < 1:
        raise ConfigError(f"bootstrap samples {samples} must be at least 1")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence {confidence} must be between 0 and 1")
    draws = resample_scans(m.scans, samples, seed)
    flat = draws + (np.arange(samples, dtype=np.int64) * m.scans)[:, None]
    times = np.bincount(flat.ravel(), minlength=samples * m.scans).reshape(samples, m.scans).astype(np.float64)
    lesions = times @ m.lesions_per_scan.astype(np.float64)
    ranked = _Ranked(m)
    sens = np.empty((samples, len(FP_RATES)))
    curve = np.empty((samples, len(GRID)))
    by_scan = m.scans * len(ranked.corners()) <= by_scan_limit
    # By scan: each draw's counts at the corners are its scan weights times per-scan counts (one matrix
    # product); else, for very many scans and nodules, every entry weighted (memory bounded, slower).
    width = len(ranked.corners()) if by_scan else max(1, len(ranked.scan))
    rows = max(1, chunk_elements // width)
    for start in range(0, samples, rows):
        stop = min(samples, start + rows)
        if by_scan:
            tp, fp = ranked.counts_by_scan(m.scans, times[start:stop])
        else:
            tp, fp = ranked.cumulative(times[start:stop][:, ranked.scan])
        fps, points = _points(tp, fp, lesions[start:stop, None], m.scans)
        for i in range(stop - start):
            sens[start + i] = np.interp(FP_RATES, fps[i], points[i])
            curve[start + i] = np.interp(GRID, fps[i], points[i])
    valid = lesions > 0
    return Bootstrap(
        samples=samples,
        seed=seed,
        confidence=confidence,
        without_nodules=int((~valid).sum()),
        sensitivity=sens[valid],
        cpm=sens[valid].mean(axis=1),
        curve=curve[valid],
    )


# ---------------------------------------------------------------- the whole evaluation
@dataclass(frozen=True, slots=True)
class Evaluation:
    """The LUNA16 evaluation of one results file: counts, FROC points, CPM and their intervals."""

    matching: Matching
    curve: FrocCurve
    sensitivity: FloatArray
    """At `FP_RATES`."""
    cpm: float
    bootstrap: Bootstrap | None
    inputs: dict[str, str]
    phantom: str = ""
    """Why the annotations are taken to be phantom data (`deskpod.lung.phantom_reason`); "" when they are not."""

    @property
    def warnings(self) -> list[str]:
        """What a reader must know before trusting the figures: a candidates file with no candidate at all."""
        if self.matching.candidates == 0:
            source = self.inputs.get("candidates")
            where = f"the candidates file {source!r}" if source else "the candidates"
            return [f"{where} holds no candidate (a header and no rows): every nodule counts as missed, so every "
                    "sensitivity and the CPM are 0; check that it is the detector's output"]  # fmt: skip
        return []

    @property
    def intervals(self) -> Bootstrap | None:
        """The bootstrap when some of its draws held a nodule (there are intervals to give), else None."""
        b = self.bootstrap
        return b if b is not None and len(b.cpm) else None

    def to_json(self) -> dict[str, Any]:
        m, b, ci = self.matching, self.bootstrap, self.intervals
        points: list[dict[str, Any]] = [{"fp_per_scan": rate, "sensitivity": float(s)}
                                        for rate, s in zip(FP_RATES, self.sensitivity, strict=True)]  # fmt: skip
        cpm: dict[str, Any] = {"value": self.cpm}
        band: dict[str, Any] = {}
        if ci is not None:
            lo, hi = ci.sensitivity_interval()
            for i, point in enumerate(points):
                point |= {"ci_low": float(lo[i]), "ci_high": float(hi[i]),
                          "bootstrap_mean": float(ci.sensitivity[:, i].mean())}  # fmt: skip
            cpm_lo, cpm_hi = ci.cpm_interval()
            cpm |= {"ci_low": cpm_lo, "ci_high": cpm_hi, "bootstrap_mean": float(ci.cpm.mean())}
            band_lo, band_hi = interval(ci.curve, ci.confidence)
            band = {"ci_low": band_lo.tolist(), "ci_high": band_hi.tolist()}
        out: dict[str, Any] = {
            "what": "FROC and CPM by the LUNA16 rules (deskpod lung evaluate)",
            "note": DISCLAIMER,
            "phantom": f"{PHANTOM_LABEL} ({self.phantom})" if self.phantom else None,
            "warnings": self.warnings,
            "inputs": self.inputs,
            "rules": {
                "source": "LUNA16 noduleCADEvaluationLUNA16.py (Setio et al. 2017), see deskpod.lung.evaluate",
                "hit": "pow(dx, 2.) + pow(dy, 2.) + pow(dz, 2.) < pow(diameter_mm / 2, 2.) (the C library's pow)",
                "excluded_negative_diameter_mm": EXCLUDED_DEFAULT_DIAMETER_MM,
                "max_marks_per_scan": m.max_marks,
                "fp_rates": list(FP_RATES),
                "reading": "np.interp on the FROC points; CPM = mean of the 7 sensitivities",
                "interval": "bootstrap over scans; sorted draws at floor(pz n) and floor((1 - pz) n)",
            },
            "scans": m.scans,
            "nodules": m.nodules,
            "detected": m.detected,
            "candidates": m.candidates,
            "candidates_over_limit": m.over_limit,
            "false_positives": m.false_positives,
            "ignored_on_excluded": m.ignored_on_excluded,
            "double_detections": m.double_detections,
            "multi_nodule_candidates": m.multi_nodule_candidates,
            "points": points,
            "cpm": cpm,
            "curve": {"fp_per_scan": GRID.tolist(), "sensitivity": self.curve.at(GRID).tolist()} | band,
        }
        if b is not None:
            out["bootstrap"] = {"samples": b.samples, "seed": b.seed, "confidence": b.confidence,
                                "draws_without_nodules": b.without_nodules, "unit": "scan"}  # fmt: skip
        return out


def evaluate(
    series: Sequence[str],
    annotations: Findings,
    excluded: Findings,
    candidates: Candidates,
    *,
    samples: int = 1000,
    seed: int = 0,
    max_marks: int | None = MAX_MARKS,
    inputs: dict[str, str] | None = None,
) -> Evaluation:
    """Match, build the FROC curve, read it at `FP_RATES`, and bootstrap it ``samples`` times (0: no intervals)."""
    if samples < 0:
        raise ConfigError(f"--bootstrap {samples}: give a number of resamplings, 0 or more (1000 is LUNA16's)")
    m = match(series, annotations, excluded, candidates, max_marks=max_marks)
    curve = froc_curve(m)
    sens = curve.at(FP_RATES)
    boot = bootstrap(m, samples=samples, seed=seed) if samples else None
    return Evaluation(m, curve, sens, float(sens.mean()), boot, dict(inputs or {}))


def evaluate_files(
    annotations: str | Path,
    excluded: str | Path,
    candidates: str | Path,
    seriesuids: str | Path,
    *,
    samples: int = 1000,
    seed: int = 0,
    max_marks: int | None = MAX_MARKS,
) -> Evaluation:
    """`evaluate` on the four LUNA16 files."""
    inputs = {"annotations": str(annotations), "excluded": str(excluded), "candidates": str(candidates),
              "seriesuids": str(seriesuids)}  # fmt: skip
    ev = evaluate(read_seriesuids(seriesuids), read_annotations(annotations), read_excluded(excluded),
                  read_candidates(candidates), samples=samples, seed=seed, max_marks=max_marks,
                  inputs=inputs)  # fmt: skip
    return replace(ev, phantom=phantom_reason(Path(annotations)))


# ---------------------------------------------------------------- outputs
RATE_LABELS = ("1/8", "1/4", "1/2", "1", "2", "4", "8")


def plot_froc(ev: Evaluation, path: str | Path) -> Path:
    """The FROC curve on a log axis, its bootstrap band and the seven LUNA16 points, as PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(7.5, 5.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    b = ev.intervals
    if b is not None:
        lo, hi = interval(b.curve, b.confidence)
        cpm_lo, cpm_hi = b.cpm_interval()
        ax.fill_between(GRID, lo, hi, color="#1f77b4", alpha=0.2, linewidth=0,
                        label=f"{b.confidence:.0%} interval ({b.samples} bootstraps over scans)")  # fmt: skip
        label = f"FROC, CPM {ev.cpm:.3f} [{cpm_lo:.3f}, {cpm_hi:.3f}]"
    else:
        label = f"FROC, CPM {ev.cpm:.3f}"
    ax.plot(GRID, ev.curve.at(GRID), color="#1f77b4", linewidth=2, label=label)
    ax.plot(FP_RATES, ev.sensitivity, "o", color="#1f77b4", markersize=5)
    ax.set_xscale("log", base=2)
    ax.set_xlim(FP_RATES[0], FP_RATES[-1])
    ax.set_xticks(FP_RATES)
    ax.set_xticklabels(RATE_LABELS)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(0.0, 1.0)
    ax.set_yticks(np.arange(0.0, 1.01, 0.1))
    ax.grid(True, which="major", alpha=0.4)
    ax.set_xlabel("average number of false positives per scan")
    ax.set_ylabel("sensitivity")
    m = ev.matching
    ax.set_title(f"FROC (LUNA16 rules): {m.scans} scans, {m.nodules} nodules, {m.candidates} candidates"
                 + ("\n" + PHANTOM_LABEL if ev.phantom else ""))  # fmt: skip
    ax.legend(loc="lower right")
    fig.text(0.01, 0.01, DISCLAIMER, fontsize=6.5, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out = Path(path)
    fig.savefig(out)
    return out


def write_outputs(ev: Evaluation, out_dir: str | Path) -> tuple[Path, Path]:
    """froc.png and evaluation.json in ``out_dir`` (created); returns their paths."""
    folder = Path(out_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {str(folder)!r}: cannot create the folder ({e.strerror})") from None
    data = folder / "evaluation.json"
    data.write_text(json.dumps(ev.to_json(), indent=2) + "\n")
    return plot_froc(ev, folder / "froc.png"), data


def format_table(ev: Evaluation) -> str:
    """What ``deskpod lung evaluate`` prints: the counts, sensitivity at each rate with its interval, the CPM."""
    m, b, ci = ev.matching, ev.bootstrap, ev.intervals
    lines = [
        f"LUNA16 evaluation: {m.scans} scans, {m.nodules} nodules ({m.detected} hit by a candidate), "
        f"{m.candidates} candidates",
        f"  {m.false_positives} false positives, {m.ignored_on_excluded} ignored on excluded findings, "
        f"{m.double_detections} extra hits on a nodule already hit"
        + (f", {m.over_limit} over the limit of {m.max_marks} per scan" if m.over_limit else ""),
    ]
    if b is not None:
        head = f"{b.confidence:.0%} interval ({b.samples} bootstraps over scans, seed {b.seed})"
        if b.without_nodules:
            head += f"; {b.without_nodules} draws without a nodule left out"
    else:
        head = ""
    lines.append(f"{'FP/scan':>8}  {'sensitivity':>11}  {head}")
    lo, hi = ci.sensitivity_interval() if ci is not None else (None, None)
    for i, label in enumerate(RATE_LABELS):
        band = f"[{lo[i]:.3f}, {hi[i]:.3f}]" if lo is not None and hi is not None else ""
        lines.append(f"{label:>8}  {ev.sensitivity[i]:>11.3f}  {band}")
    cpm_ci = "[{:.3f}, {:.3f}]".format(*ci.cpm_interval()) if ci is not None else ""
    lines.append(f"{'CPM':>8}  {ev.cpm:>11.3f}  {cpm_ci}")
    lines.append(f"note: {DISCLAIMER}")
    if ev.phantom:
        lines.insert(0, f"{PHANTOM_LABEL} ({ev.phantom})")
    lines[:0] = [f"WARNING: {w}" for w in ev.warnings]
    return "\n".join(lines)
