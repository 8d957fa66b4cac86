"""Nodules over time: diameter growth as Lung-RADS v2022 defines it, volume doubling time, and matching.

Three questions a follow-up scan asks of a nodule, each answered here from measurements the
caller already has (this module reads no images):

- **Did it grow?** `diameter_change`: Lung-RADS v2022 calls a nodule growing at "an increase in
  mean diameter size of > 1.5 mm (> 2 mm3) within a 12-month interval". Diameters are compared
  as Lung-RADS reports them, rounded to 0.1 mm (`round_diameter`), in whole tenths of a
  millimetre so that 7.6 - 6.1 is exactly 1.5 and not growth. Over more than 12 months deskpod
  reads "within a 12-month interval" as a steady rate: growth when the increase exceeds 1.5 mm
  per 12 months; a larger-than-1.5-mm increase at a slower rate is *slow growth*, which v2022
  treats separately ("slow growing solid or part solid nodule that demonstrates growth over
  multiple screening exams", category 4B). A decrease of more than 1.5 mm is reported as
  decreased; anything within +-1.5 mm is stable (v2022 manages "stable or decreased" alike).
- **How fast?** `volume_doubling_time`: VDT = t * ln 2 / ln(V2 / V1), t in days, from the two
  volumes (mm3). Equal volumes give ``math.inf`` (no growth: it never doubles); a shrinking
  nodule gives a *negative* VDT whose magnitude is its halving time, the usual convention in
  the nodule literature, so a report can print "-400 days (shrinking)" rather than lose the
  fact. Zero, negative or non-finite volumes and intervals are refused.
- **Which is which?** `match`: after the caller has registered the prior scan onto the current
  one (rigid registration, so centres are in one world frame, mm), pairs each current nodule
  with at most one prior nodule whose centre lies within ``max_distance_mm``. With SciPy
  installed the pairing is the optimal assignment (`scipy.optimize.linear_sum_assignment`:
  the most pairs, then the least total distance); without it, greedy nearest pairs (closest
  pair first). Unpaired current nodules are new; unpaired prior nodules are resolved.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

import numpy as np

from deskpod.errors import ConfigError

GROWTH_MM = 1.5
"""Lung-RADS v2022: growth is "an increase in mean diameter size of > 1.5 mm ... within a 12-month interval"."""
GROWTH_WINDOW_MONTHS = 12.0
DAYS_PER_MONTH = 365.25 / 12
"""A mean Gregorian month, to turn the days between two scan dates into months."""

GrowthStatus = Literal["growing", "slow-growing", "stable", "decreased"]
MatchMethod = Literal["auto", "optimal", "greedy"]


def round_diameter(mm: float) -> float:
    """A diameter to 0.1 mm, halves rounded up, as Lung-RADS v2022 asks ("to one decimal point").

    Decimal rounding of the shortest repr, so 2.65 becomes 2.7 (binary ``round`` gives 2.6).
    """
    return tenths_of_mm(mm, "diameter") / 10


def tenths_of_mm(mm: float, what: str = "diameter") -> int:
    """A diameter in whole tenths of a millimetre (0.1 mm, halves up); ``what`` names it in errors."""
    if not isinstance(mm, int | float) or isinstance(mm, bool) or not math.isfinite(mm) or mm < 0:
        raise ConfigError(f"{what} {mm!r} mm is not valid: give a finite size of 0 mm or more, e.g. 6.4")
    return int(Decimal(repr(float(mm))).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP) * 10)


def months_from_days(days: float) -> float:
    """Days between two scans as months (365.25 / 12 days each)."""
    _check_interval(days, "days")
    return days / DAYS_PER_MONTH


def _check_interval(value: float, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"interval {value!r} {unit} is not valid: the prior scan must be earlier, e.g. 180 {unit}")


@dataclass(frozen=True, slots=True)
class DiameterChange:
    """How a mean diameter changed between two scans, judged by the Lung-RADS v2022 growth rule."""

    prior_mm: float
    """The prior diameter, rounded to 0.1 mm."""
    current_mm: float
    """The current diameter, rounded to 0.1 mm."""
    months: float
    increase_mm: float
    """Current minus prior, exact to 0.1 mm (negative when it shrank)."""
    status: GrowthStatus
    reason: str


def diameter_change(prior_mm: float, current_mm: float, months: float) -> DiameterChange:
    """Classify the change of one diameter (mean, or a solid component's) over ``months``.

    ``growing``: more than 1.5 mm, at more than 1.5 mm per 12 months; ``slow-growing``: more than
    1.5 mm but slower than that, over more than 12 months; ``decreased``: smaller by more than
    1.5 mm; ``stable``: everything else.
    """
    prior_t = tenths_of_mm(prior_mm, "prior diameter")
    current_t = tenths_of_mm(current_mm, "current diameter")
    _check_interval(months, "months")
    change_t = current_t - prior_t
    limit_t = round(GROWTH_MM * 10)
    prior, current, change = prior_t / 10, current_t / 10, change_t / 10
    what = f"{prior:.1f} -> {current:.1f} mm ({change:+.1f} mm) in {months:g} months"
    status: GrowthStatus
    if change_t > limit_t:
        # Within 12 months any increase > 1.5 mm is growth; beyond, the increase must outpace
        # 1.5 mm per 12 months (compared in integers: change * 12 > 15 tenths * months).
        if months <= GROWTH_WINDOW_MONTHS or change_t * GROWTH_WINDOW_MONTHS > limit_t * months:
            status = "growing"
            reason = f"{what}: more than {GROWTH_MM} mm within 12 months, growth by Lung-RADS v2022"
        else:
            status = "slow-growing"
            reason = (
                f"{what}: more than {GROWTH_MM} mm, but not within 12 months; slow growth "
                "(Lung-RADS v2022: growth over multiple screening exams)"
            )
    elif change_t < -limit_t:
        status = "decreased"
        reason = f"{what}: smaller by more than {GROWTH_MM} mm, decreased"
    else:
        status = "stable"
        reason = f"{what}: within +-{GROWTH_MM} mm, stable"
    return DiameterChange(prior, current, float(months), change, status, reason)


def volume_doubling_time(prior_mm3: float, current_mm3: float, days: float) -> float:
    """VDT = t * ln 2 / ln(V2 / V1) in days; ``inf`` when unchanged, negative when shrinking."""
    for name, volume in (("prior volume", prior_mm3), ("current volume", current_mm3)):
        if isinstance(volume, bool) or not isinstance(volume, int | float) or not math.isfinite(volume) or volume <= 0:
            raise ConfigError(f"{name} {volume!r} mm3 is not valid: give a volume above 0 mm3, e.g. 113")
    _check_interval(days, "days")
    ratio = math.log(current_mm3 / prior_mm3)
    if ratio == 0:
        return math.inf
    return days * math.log(2) / ratio


@dataclass(frozen=True, slots=True)
class Match:
    """A current nodule and the prior nodule it was paired with (indices into the caller's lists)."""

    current: int
    prior: int
    distance_mm: float


@dataclass(frozen=True, slots=True)
class Matching:
    """Every current and every prior nodule, accounted for once."""

    pairs: tuple[Match, ...]
    """Sorted by current index."""
    new: tuple[int, ...]
    """Current nodules with no prior nodule within the distance."""
    resolved: tuple[int, ...]
    """Prior nodules with no current nodule within the distance."""
    method: Literal["optimal", "greedy"]


def scipy_available() -> bool:
    """Whether `match` can use SciPy's optimal assignment."""
    return importlib.util.find_spec("scipy") is not None


def match(
    current: Sequence[Sequence[float]],
    prior: Sequence[Sequence[float]],
    max_distance_mm: float,
    *,
    method: MatchMethod = "auto",
) -> Matching:
    """Pair nodule centres (x, y, z in mm, one registered world frame) of the current and prior scans.

    ``method``: ``"optimal"`` (SciPy's assignment; refused when SciPy is missing), ``"greedy"``
    (closest pair first), or ``"auto"`` (optimal when SciPy is installed, else greedy).
    """
    if isinstance(max_distance_mm, bool) or not isinstance(max_distance_mm, int | float) or not max_distance_mm > 0:
        raise ConfigError(f"max_distance_mm {max_distance_mm!r} is not valid: give a distance above 0 mm, e.g. 10")
    if not math.isfinite(max_distance_mm):
        raise ConfigError(f"max_distance_mm {max_distance_mm!r} is not valid: give a finite distance, e.g. 10")
    if method not in ("auto", "optimal", "greedy"):
        raise ConfigError(f"match method {method!r} is not valid: use auto, optimal or greedy")
    a = _centres(current, "current")
    b = _centres(prior, "prior")
    if method == "auto":
        method = "optimal" if scipy_available() else "greedy"
    if method == "optimal" and not scipy_available():
        raise ConfigError("match method 'optimal' needs SciPy, which is not installed: use method='greedy'")
    distances = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2))
    chosen: list[tuple[int, int]] = []
    if distances.size:
        chosen = _optimal(distances, max_distance_mm) if method == "optimal" else _greedy(distances, max_distance_mm)
    pairs = tuple(sorted((Match(i, j, float(distances[i, j])) for i, j in chosen), key=lambda m: m.current))
    used_current = {m.current for m in pairs}
    used_prior = {m.prior for m in pairs}
    return Matching(
        pairs=pairs,
        new=tuple(i for i in range(len(a)) if i not in used_current),
        resolved=tuple(j for j in range(len(b)) if j not in used_prior),
        method=method,
    )


def _centres(points: Sequence[Sequence[float]], which: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    try:
        array = np.asarray(points, dtype=np.float64).reshape(len(points), -1) if len(points) else np.zeros((0, 3))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{which} nodule centres {points!r} are not valid: give (x, y, z) in mm per nodule") from exc
    if array.shape[1] != 3 or not np.isfinite(array).all():
        raise ConfigError(f"{which} nodule centres {points!r} are not valid: give finite (x, y, z) in mm per nodule")
    return array


def _greedy(distances: np.ndarray[Any, np.dtype[np.float64]], limit: float) -> list[tuple[int, int]]:
    """Closest pair first; ties broken by current then prior index, so the answer is reproducible."""
    rows, cols = np.nonzero(distances <= limit)
    candidates = sorted((float(distances[i, j]), int(i), int(j)) for i, j in zip(rows, cols, strict=True))
    used_i: set[int] = set()
    used_j: set[int] = set()
    chosen: list[tuple[int, int]] = []
    for _, i, j in candidates:
        if i not in used_i and j not in used_j:
            used_i.add(i)
            used_j.add(j)
            chosen.append((i, j))
    return chosen


def _optimal(distances: np.ndarray[Any, np.dtype[np.float64]], limit: float) -> list[tuple[int, int]]:
    """SciPy's assignment with pairs beyond the limit priced so that any valid pair is preferred.

    A forbidden pair costs more than every valid pair together, so the assignment first
    maximizes the number of valid pairs, then minimizes their total distance; forbidden pairs it
    still had to make (rectangular problems) are dropped.
    """
    linear_sum_assignment = importlib.import_module("scipy.optimize").linear_sum_assignment
    forbidden = limit * (min(distances.shape) + 1) + 1.0
    cost = np.where(distances <= limit, distances, forbidden)
    rows, cols = linear_sum_assignment(cost)
    return [(int(i), int(j)) for i, j in zip(rows, cols, strict=True) if distances[i, j] <= limit]
