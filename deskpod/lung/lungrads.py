"""Lung-RADS v2022 categories for screening-CT nodules, and the follow-up each implies.

The American College of Radiology's Lung CT Screening Reporting and Data System, version 2022
(released November 2022; Christensen et al., "ACR Lung-RADS v2022: Assessment Categories and
Management Recommendations", CHEST 2024;165(3):738-753 and J Am Coll Radiol 2024;21:473-488).
The rules are one table, `RULES`, each row with the phrase of the v2022 table it encodes (the
wording of the ACR/RSNA common data element RDES267 "Lung-RADS categorization"); `category`
finds the row a nodule meets. Decision support, not a medical device: a radiologist assigns the
category; this proposes one and says which rule decided it.

Measurement conventions (v2022 notes): "To calculate nodule mean diameter, measure both the long
and short axis to one decimal point in mm, and report mean nodule diameter to one decimal
point" (`mean_diameter`); the thresholds are compared on those 0.1 mm values, in whole tenths.
Growth is "an increase in mean diameter size of > 1.5 mm (> 2 mm3) within a 12-month interval"
(`deskpod.lung.growth.diameter_change`); for a part-solid nodule deskpod measures growth on the
solid component, as the table's part-solid rows do ("new or growing ... solid component").
"Size thresholds apply to nodules at first detection and that enlarge, reaching a higher size
category": a stable nodule that crosses a baseline size threshold is reclassified by size.

Timepoints: *baseline* (the first screen, no prior), *new* (a follow-up screen, no prior nodule
matched), or compared with a matched prior: *growing*, *slow-growing* (growth over more than 12
months that never reaches 1.5 mm per 12 months, or the caller's ``slow_growth=True`` from
several exams), or *stable* (including decreased). Stable solid and part-solid nodules follow
v2022's stepped management: 4A stable at follow-up becomes 3, 3 becomes 2, 2 stays 2, and 4B
stays 4B (v2022 returns it to 2 only when "proven to be benign ... following appropriate
diagnostic workup", which a scan cannot show).

Not decided from a scan and left to the caller: category 0 (`incomplete`), category 1 for benign
calcification or fat (``Nodule.benign``), juxtapleural nodules (``Nodule.juxtapleural``: smooth,
oval/lentiform/triangular), 4X (``Nodule.suspicious``: "additional features or imaging findings
that increase suspicion for lung cancer"), airway nodules and atypical cysts (not modelled).
Deskpod's own readings, where v2022 is silent, are marked "deskpod:" in the table and reasons.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from deskpod.errors import ConfigError
from deskpod.lung.growth import GrowthStatus, diameter_change, tenths_of_mm

VERSION = "Lung-RADS v2022"
KINDS = ("solid", "part-solid", "ground-glass")
"""Nodule types: solid, part-solid (with a solid component), ground-glass (non-solid, GGN)."""
Kind = Literal["solid", "part-solid", "ground-glass"]
Timepoint = Literal["baseline", "new", "growing", "slow-growing", "stable"]
CATEGORIES = ("0", "1", "2", "3", "4A", "4B", "4X")

_RANK = {"1": 1, "2": 2, "0": 3, "3": 4, "4A": 5, "4B": 6, "4X": 7}
"""Exam order. v2022: the exam is coded "based on the nodule(s) with the highest degree of
suspicion". deskpod: 0 (incomplete) outranks 1 and 2, since an incomplete exam cannot be called
negative, but not 3 or 4, since a suspicious nodule is acted on whatever else is missing."""

_PET_MM = 8.0
FOLLOW_UP = {
    "0": "Comparison to prior chest CT and/or additional lung cancer screening CT imaging needed; "
    "1-3 month LDCT for findings suggesting an infectious or inflammatory process",
    "1": "Continue annual screening: 12-month screening LDCT",
    "2": "Continue annual screening: 12-month screening LDCT",
    "3": "6-month LDCT",
    "4A": "3-month LDCT",
    "4B": "Diagnostic chest CT with or without contrast; tissue sampling; and/or referral for further "
    "clinical evaluation. Management depends on clinical evaluation, patient preference, and "
    "probability of malignancy",
}
"""v2022 management per category (4X is managed as 4B). The PET/CT clause, "PET/CT may be
considered if there is a >= 8 mm (>= 268 mm3) solid nodule or solid component", is added for 4A,
4B and 4X when the nodule has one (`_follow_up`)."""
FOLLOW_UP["4X"] = FOLLOW_UP["4B"]
_PET = "PET/CT may be considered: there is a solid nodule or solid component of 8 mm or more"

_ANY = (0.0, math.inf)


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the v2022 table: a category for a kind of nodule at some timepoints and sizes.

    Sizes are half-open ranges ``[low, high)`` in mm on the total mean diameter and on the solid
    component (a solid nodule's solid component is the nodule). A rule with ``flag`` applies only
    to nodules the caller flagged so; flagged rules come first and win.
    """

    category: str
    kind: Kind
    when: frozenset[Timepoint]
    source: str
    total_mm: tuple[float, float] = _ANY
    solid_mm: tuple[float, float] = _ANY
    flag: Literal["juxtapleural"] | None = None

    def matches(self, kind: str, when: Timepoint, total_t: int, solid_t: int, flags: frozenset[str]) -> bool:
        return (
            self.kind == kind
            and when in self.when
            and (self.flag is None or self.flag in flags)
            and _within(total_t, self.total_mm)
            and _within(solid_t, self.solid_mm)
        )


def _within(tenths: int, bounds: tuple[float, float]) -> bool:
    low, high = bounds
    return low * 10 <= tenths < high * 10


def _at(*timepoints: Timepoint) -> frozenset[Timepoint]:
    return frozenset(timepoints)


_INF = math.inf
RULES: tuple[Rule, ...] = (
    # Category 2, juxtapleural (flag: the caller judged the shape and margins).
    Rule("2", "solid", _at("baseline", "new"), total_mm=(0, 10), flag="juxtapleural",
         source="Juxtapleural nodule(s): < 10 mm (524 mm3) mean diameter at baseline or new AND solid; "
         "smooth margins; and oval, lentiform, or triangular shape"),
    # Solid nodules.
    Rule("2", "solid", _at("baseline"), total_mm=(0, 6),
         source="Solid nodule(s): < 6 mm (< 113 mm3) at baseline"),
    Rule("2", "solid", _at("new"), total_mm=(0, 4),
         source="Solid nodule(s): ... OR new < 4 mm (< 34 mm3)"),
    Rule("3", "solid", _at("baseline"), total_mm=(6, 8),
         source="Solid nodule(s): >= 6 to < 8 mm (>= 113 to < 268 mm3) at baseline"),
    Rule("3", "solid", _at("new"), total_mm=(4, 6),
         source="Solid nodule(s): ... OR new 4 mm to < 6 mm (34 to < 113 mm3)"),
    Rule("4A", "solid", _at("baseline"), total_mm=(8, 15),
         source="Solid nodule(s): >= 8 to < 15 mm (>= 268 to < 1,767 mm3) at baseline"),
    Rule("4A", "solid", _at("growing"), total_mm=(0, 8),
         source="Solid nodule(s): ... OR growing < 8 mm (< 268 mm3)"),
    Rule("4A", "solid", _at("new"), total_mm=(6, 8),
         source="Solid nodule(s): ... OR new 6 to < 8 mm (113 to < 268 mm3)"),
    Rule("4B", "solid", _at("baseline"), total_mm=(15, _INF),
         source="Solid nodule(s): >= 15 mm (>= 1,767 mm3) at baseline"),
    Rule("4B", "solid", _at("new", "growing"), total_mm=(8, _INF),
         source="Solid nodule(s): ... OR new or growing >= 8 mm (>= 268 mm3)"),
    Rule("4B", "solid", _at("slow-growing"),
         source="Slow growing solid or part solid nodule that demonstrates growth over multiple screening exams"),
    # Part-solid nodules: total mean diameter and solid component.
    Rule("2", "part-solid", _at("baseline"), total_mm=(0, 6),
         source="Part solid nodule(s): < 6 mm total mean diameter (< 113 mm3) at baseline"),
    Rule("3", "part-solid", _at("baseline"), total_mm=(6, _INF), solid_mm=(0, 6),
         source="Part solid nodule(s): >= 6 mm total mean diameter (>= 113 mm3) with solid component "
         "< 6 mm (< 113 mm3) at baseline"),
    Rule("3", "part-solid", _at("new"), total_mm=(0, 6),
         source="Part solid nodule(s): ... OR new < 6 mm total mean diameter (< 113 mm3)"),
    Rule("4A", "part-solid", _at("baseline"), total_mm=(6, _INF), solid_mm=(6, 8),
         source="Part solid nodule(s): >= 6 mm total mean diameter (>= 113 mm3) with solid component "
         ">= 6 mm to < 8 mm (>= 113 to < 268 mm3) at baseline"),
    # A new part-solid nodule of 6 mm or more (smaller ones are 3, above) goes by its solid part.
    Rule("4A", "part-solid", _at("new"), total_mm=(6, _INF), solid_mm=(0, 4),
         source="Part solid nodule(s): ... OR new or growing < 4 mm (< 34 mm3) solid component"),
    Rule("4A", "part-solid", _at("growing"), solid_mm=(0, 4),
         source="Part solid nodule(s): ... OR new or growing < 4 mm (< 34 mm3) solid component"),
    Rule("4B", "part-solid", _at("baseline"), solid_mm=(8, _INF),
         source="Part solid nodule(s): solid component >= 8 mm (>= 268 mm3) at baseline"),
    Rule("4B", "part-solid", _at("new"), total_mm=(6, _INF), solid_mm=(4, _INF),
         source="Part solid nodule(s): ... OR new or growing >= 4 mm (>= 34 mm3) solid component"),
    Rule("4B", "part-solid", _at("growing"), solid_mm=(4, _INF),
         source="Part solid nodule(s): ... OR new or growing >= 4 mm (>= 34 mm3) solid component"),
    Rule("4B", "part-solid", _at("slow-growing"),
         source="Slow growing solid or part solid nodule that demonstrates growth over multiple screening exams"),
    # Ground-glass (non-solid) nodules.
    Rule("2", "ground-glass", _at("baseline", "new", "growing"), total_mm=(0, 30),
         source="Non-solid nodule(s) (GGN): < 30 mm (< 14,137 mm3) at baseline, new, or growing"),
    Rule("2", "ground-glass", _at("stable", "slow-growing"), total_mm=(0, 30),
         source="deskpod: a GGN < 30 mm that is stable or slowly growing, no more suspicious than a growing one: "
         "Non-solid nodule(s) (GGN): < 30 mm (< 14,137 mm3) at baseline, new, or growing"),
    Rule("2", "ground-glass", _at("stable", "slow-growing"), total_mm=(30, _INF),
         source="Non-solid nodule(s) (GGN): ... OR >= 30 mm (>= 14,137 mm3) stable or slowly growing"),
    Rule("3", "ground-glass", _at("baseline", "new"), total_mm=(30, _INF),
         source="Non-solid nodule(s) (GGN): >= 30 mm (>= 14,137 mm3) at baseline or new"),
    Rule("3", "ground-glass", _at("growing"), total_mm=(30, _INF),
         source="deskpod: v2022 has no row for a GGN >= 30 mm growing within 12 months; kept at 3 as "
         "'>= 30 mm (>= 14,137 mm3) at baseline or new'"),
)  # fmt: skip

STEP_DOWN: dict[str, tuple[str, str]] = {
    "4A": ("3", "Category 4A lesion that is stable or decreased in size at 3-month follow-up CT"),
    "3": ("2", "Category 3 lesion that is stable or decreased in size at 6-month follow-up CT"),
    "2": ("2", "deskpod: a category 2 nodule that stays stable stays 2 (benign based on indolent behavior)"),
    "4B": ("4B", "deskpod: stays 4B; v2022 makes a 4B lesion 2 only when 'proven to be benign in etiology "
           "following appropriate diagnostic workup'"),
    "4X": ("4X", "deskpod: stays 4X, managed as 4B, for the same reason as 4B"),
}  # fmt: skip
"""v2022 stepped management of a stable (or decreased) solid or part-solid nodule, by the
category it was being followed as."""

_SIZE_CROSSING = (
    "When a nodule crosses a new size threshold for other Lung-RADS categories, even if not meeting "
    "the definition of growth, the nodule should be reclassified based on size and managed accordingly"
)
_X = "Category 3 or 4 nodules with additional features or imaging findings that increase suspicion for lung cancer"
_BENIGN = (
    "Nodule(s) with benign features: complete, central, popcorn, concentric ring calcifications "
    "and fat-containing nodules"
)


@dataclass(frozen=True, slots=True)
class Nodule:
    """One nodule as Lung-RADS sees it: mean diameters in mm (`mean_diameter`), its type, and flags."""

    mean_diameter_mm: float
    """Mean of the long and short axis on one slice, to 0.1 mm."""
    kind: Kind
    solid_mean_diameter_mm: float | None = None
    """The solid component's mean diameter: required for part-solid, absent otherwise."""
    benign: bool = False
    """Benign calcification (complete, central, popcorn, concentric ring) or fat: category 1."""
    juxtapleural: bool = False
    """Juxtapleural with smooth margins and an oval, lentiform or triangular shape (the caller's judgement)."""
    suspicious: bool = False
    """Additional features or imaging findings that increase suspicion for lung cancer: 3 and 4 become 4X."""

    def __post_init__(self) -> None:
        size = self.mean_diameter_mm
        if isinstance(size, bool) or not isinstance(size, int | float) or not math.isfinite(size) or size <= 0:
            raise ConfigError(f"nodule mean diameter {size!r} mm is not valid: give a size above 0 mm, e.g. 6.4")
        if self.kind not in KINDS:
            raise ConfigError(f"nodule kind {self.kind!r} is not valid: use one of {', '.join(KINDS)}")
        solid = self.solid_mean_diameter_mm
        if self.kind == "part-solid":
            if solid is None or isinstance(solid, bool) or not isinstance(solid, int | float):
                raise ConfigError(
                    f"a part-solid nodule needs solid_mean_diameter_mm (got {solid!r}), e.g. 4.2 for a 9.0 mm nodule"
                )
            if not math.isfinite(solid) or solid <= 0:
                raise ConfigError(f"solid component {solid!r} mm is not valid: give a size above 0 mm, e.g. 4.2")
            if solid > size:
                raise ConfigError(
                    f"solid component {solid!r} mm is larger than the whole nodule ({size!r} mm): "
                    "it must be at most the total mean diameter"
                )
        elif solid is not None:
            raise ConfigError(
                f"solid_mean_diameter_mm {solid!r} is only for part-solid nodules; a {self.kind} nodule has none"
            )

    @property
    def total_tenths(self) -> int:
        return tenths_of_mm(self.mean_diameter_mm, "nodule mean diameter")

    @property
    def solid_tenths(self) -> int:
        """The solid part in tenths of a mm: the whole of a solid nodule, none of a ground-glass one."""
        if self.kind == "solid":
            return self.total_tenths
        if self.kind == "part-solid":
            assert self.solid_mean_diameter_mm is not None
            return tenths_of_mm(self.solid_mean_diameter_mm, "solid component")
        return 0


@dataclass(frozen=True, slots=True)
class Assessment:
    """A Lung-RADS category, the rule that decided it (in words, with the v2022 phrase), and the follow-up."""

    category: str
    reason: str
    follow_up: str


def mean_diameter(long_axis_mm: float, short_axis_mm: float) -> float:
    """Lung-RADS mean diameter: each axis to 0.1 mm, their mean to 0.1 mm (halves up)."""
    long_t = tenths_of_mm(long_axis_mm, "long axis")
    short_t = tenths_of_mm(short_axis_mm, "short axis")
    if long_t <= 0 or short_t <= 0:
        raise ConfigError(f"axes {long_axis_mm!r} x {short_axis_mm!r} mm are not valid: both must be above 0 mm")
    if short_t > long_t:
        raise ConfigError(f"short axis {short_axis_mm!r} mm is longer than the long axis {long_axis_mm!r} mm")
    return ((long_t + short_t + 1) // 2) / 10


def incomplete(why: str) -> Assessment:
    """Category 0: "prior chest CT examination(s) being located for comparison", "part or all of
    lungs cannot be evaluated", or "findings suggestive of an inflammatory or infectious process"."""
    return Assessment("0", f"incomplete: {why} ({VERSION} category 0)", FOLLOW_UP["0"])


def category(
    nodule: Nodule,
    *,
    prior: Nodule | None = None,
    months_since_prior: float | None = None,
    baseline: bool,
    prior_category: str | None = None,
    slow_growth: bool = False,
) -> Assessment:
    """The v2022 category of one nodule.

    ``baseline``: this is the first screen (no prior may be given). On a later screen, ``prior``
    is the matched nodule of the prior scan (None: the nodule is new) and ``months_since_prior``
    the interval. ``prior_category``: the category the nodule was being followed as, for stepped
    management (default: the prior nodule's own category at baseline thresholds). ``slow_growth``:
    the caller has seen growth over several exams that never reached 1.5 mm in 12 months.
    """
    _check_call(nodule, prior, months_since_prior, baseline, prior_category, slow_growth)
    size = _describe(nodule)
    if nodule.benign:
        return Assessment("1", f"{size} with benign features: '{_BENIGN}' ({VERSION} category 1)", FOLLOW_UP["1"])
    if prior is None:
        when: Timepoint = "baseline" if baseline else "new"
        found = _find(nodule, when, f"{size}, {'at baseline' if baseline else 'new on this follow-up screen'}")
    else:
        assert months_since_prior is not None
        found = _compared(nodule, prior, months_since_prior, prior_category, slow_growth, size)
    return _with_suspicion(nodule, found)


def exam_category(assessments: Iterable[Assessment]) -> Assessment:
    """The exam's category: its most suspicious nodule's (no nodules: category 1)."""
    items = list(assessments)
    if not items:
        return Assessment("1", f"no lung nodules ({VERSION} category 1)", FOLLOW_UP["1"])
    unknown = [a.category for a in items if a.category not in _RANK]
    if unknown:
        raise ConfigError(f"Lung-RADS category {unknown[0]!r} is not valid: use one of {', '.join(CATEGORIES)}")
    top = max(items, key=lambda a: _RANK[a.category])
    others = len(items) - 1
    tail = f"; the most suspicious of {len(items)} findings" if others else ""
    return Assessment(top.category, f"{top.reason}{tail}", top.follow_up)


def _check_call(
    nodule: Nodule,
    prior: Nodule | None,
    months: float | None,
    baseline: bool,
    prior_category: str | None,
    slow_growth: bool,
) -> None:
    if not isinstance(nodule, Nodule) or (prior is not None and not isinstance(prior, Nodule)):
        raise ConfigError("category() takes Nodule objects for the nodule and its prior")
    if baseline and prior is not None:
        raise ConfigError(
            "baseline=True means the first screen, with no prior nodule: pass baseline=False with a prior"
        )
    if prior is None and (months is not None or prior_category is not None or slow_growth):
        raise ConfigError("months_since_prior, prior_category and slow_growth need a prior nodule")
    if prior is not None:
        if months is None:
            raise ConfigError("a prior nodule needs months_since_prior, e.g. 12")
        if isinstance(months, bool) or not isinstance(months, int | float) or not math.isfinite(months) or months <= 0:
            raise ConfigError(f"months_since_prior {months!r} is not valid: the prior scan must be earlier, e.g. 12")
    if prior_category is not None and prior_category not in STEP_DOWN:
        raise ConfigError(f"prior_category {prior_category!r} is not valid: use one of {', '.join(STEP_DOWN)}")


def _describe(nodule: Nodule) -> str:
    text = f"{nodule.kind} nodule, mean diameter {nodule.total_tenths / 10:.1f} mm"
    if nodule.kind == "part-solid":
        text += f" with a {nodule.solid_tenths / 10:.1f} mm solid component"
    return text


def _rule(nodule: Nodule, when: Timepoint) -> Rule:
    flags = frozenset({"juxtapleural"} if nodule.juxtapleural else ())
    for rule in RULES:
        if rule.matches(nodule.kind, when, nodule.total_tenths, nodule.solid_tenths, flags):
            return rule
    raise AssertionError(f"no Lung-RADS rule for a {nodule.kind} nodule, {when}")  # the table covers every case


def _find(nodule: Nodule, when: Timepoint, what: str) -> Assessment:
    rule = _rule(nodule, when)
    return Assessment(
        rule.category,
        f"{what}: '{rule.source}' ({VERSION} category {rule.category})",
        _follow_up(rule.category, nodule),
    )


def _compared(
    nodule: Nodule, prior: Nodule, months: float, prior_category: str | None, slow_growth: bool, size: str
) -> Assessment:
    # A ground-glass nodule is measured whole; solid and part-solid by their solid part, so a
    # ground-glass nodule that gains a solid component has a new (growing) one.
    if nodule.kind == "ground-glass":
        change = diameter_change(prior.total_tenths / 10, nodule.total_tenths / 10, months)
        measured = "mean diameter"
    else:
        change = diameter_change(prior.solid_tenths / 10, nodule.solid_tenths / 10, months)
        measured = "mean diameter" if nodule.kind == "solid" and prior.kind == "solid" else "solid component"
    status: GrowthStatus = change.status
    how = f"{measured} {change.reason}"
    if nodule.kind != "ground-glass" and prior.solid_tenths == 0:
        status, how = "growing", f"new solid component in a nodule that was ground-glass ({how})"
    if slow_growth and status != "growing":
        status, how = "slow-growing", f"{how}; slow growth over several exams (given)"
    what = f"{size}, compared with the prior scan {months:g} months earlier: {how}"
    if status in ("growing", "slow-growing"):
        found = _find(nodule, status, what)
        if slow_growth and status == "growing":
            found = _higher(found, _find(nodule, "slow-growing", f"{what}; slow growth over several exams (given)"))
        return found
    if nodule.kind == "ground-glass":
        return _find(nodule, "stable", what)
    return _stable(nodule, prior, prior_category, what)


def _stable(nodule: Nodule, prior: Nodule, prior_category: str | None, what: str) -> Assessment:
    if prior_category is None:
        inferred = _rule(prior, "baseline").category
        followed = f"followed as {inferred} (the prior nodule's category at baseline thresholds)"
    else:
        inferred, followed = prior_category, f"followed as {prior_category} (given)"
    step, source = STEP_DOWN[inferred]
    found = Assessment(step, f"{what}; {followed}: '{source}' ({VERSION} category {step})", _follow_up(step, nodule))
    # The size bands at baseline thresholds: a stable nodule that enlarged into a higher band is
    # reclassified by its size.
    now, then = _rule(nodule, "baseline"), _rule(prior, "baseline")
    if nodule.kind == prior.kind and _RANK[now.category] > _RANK[then.category]:
        crossed = Assessment(
            now.category,
            f"{what}; crossed from a category {then.category} to a category {now.category} size at baseline "
            f"thresholds: '{_SIZE_CROSSING}'; '{now.source}' ({VERSION} category {now.category})",
            _follow_up(now.category, nodule),
        )
        found = _higher(found, crossed)
    return found


def _higher(a: Assessment, b: Assessment) -> Assessment:
    return b if _RANK[b.category] > _RANK[a.category] else a


def _with_suspicion(nodule: Nodule, found: Assessment) -> Assessment:
    if not nodule.suspicious or found.category not in ("3", "4A", "4B"):
        return found
    return Assessment(
        "4X",
        f"{found.reason}; with additional suspicious features (given): '{_X}' ({VERSION} category 4X)",
        _follow_up("4X", nodule),
    )


def _follow_up(cat: str, nodule: Nodule) -> str:
    text = FOLLOW_UP[cat]
    if cat in ("4A", "4B", "4X") and nodule.solid_tenths >= _PET_MM * 10:
        # 4A: after the LDCT; 4B and 4X: after the diagnostic CT, where v2022 puts it.
        text = f"{text}; {_PET}" if cat == "4A" else text.replace("contrast; ", f"contrast; {_PET}; ", 1)
    return text
