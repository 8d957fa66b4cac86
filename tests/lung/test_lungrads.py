"""Lung-RADS v2022: every size threshold just below, at and above, baseline and follow-up, each nodule type.

Sizes are mean diameters in mm; the v2022 rows are quoted in `deskpod.lung.lungrads.RULES`.
"""

from __future__ import annotations

import math

import pytest

from deskpod.errors import ConfigError
from deskpod.lung import lungrads
from deskpod.lung.lungrads import (
    KINDS,
    RULES,
    Assessment,
    Nodule,
    category,
    exam_category,
    incomplete,
    mean_diameter,
)


def solid(mm: float, **flags: bool) -> Nodule:
    return Nodule(mm, "solid", **flags)


def part_solid(mm: float, solid_mm: float, **flags: bool) -> Nodule:
    return Nodule(mm, "part-solid", solid_mean_diameter_mm=solid_mm, **flags)


def ggn(mm: float) -> Nodule:
    return Nodule(mm, "ground-glass")


# Solid, baseline: 2 < 6; 3 6 to < 8; 4A 8 to < 15; 4B >= 15.
@pytest.mark.parametrize(
    ("mm", "expected"),
    [
        (5.9, "2"),
        (6.0, "3"),
        (6.1, "3"),
        (7.9, "3"),
        (8.0, "4A"),
        (8.1, "4A"),
        (14.9, "4A"),
        (15.0, "4B"),
        (15.1, "4B"),
    ],
)
def test_solid_baseline(mm: float, expected: str) -> None:
    assert category(solid(mm), baseline=True).category == expected


# Solid, new on a follow-up screen: 2 < 4; 3 4 to < 6; 4A 6 to < 8; 4B >= 8.
@pytest.mark.parametrize(
    ("mm", "expected"),
    [(3.9, "2"), (4.0, "3"), (4.1, "3"), (5.9, "3"), (6.0, "4A"), (6.1, "4A"), (7.9, "4A"), (8.0, "4B"), (8.1, "4B")],
)
def test_solid_new(mm: float, expected: str) -> None:
    assert category(solid(mm), baseline=False).category == expected


# Solid, growing (> 1.5 mm within 12 months): 4A < 8; 4B >= 8.
@pytest.mark.parametrize(("mm", "expected"), [(6.0, "4A"), (7.9, "4A"), (8.0, "4B"), (8.1, "4B"), (20.0, "4B")])
def test_solid_growing(mm: float, expected: str) -> None:
    assessed = category(solid(mm), prior=solid(mm - 1.6), months_since_prior=12, baseline=False)
    assert assessed.category == expected
    assert "growing" in assessed.reason


def test_growth_threshold_on_a_solid_nodule() -> None:
    # 6.1 -> 7.6 (+1.5): not growth, a stable 3 at 6 months steps down to 2; 6.1 -> 7.7 (+1.6): growing, 4A.
    stable = category(solid(7.6), prior=solid(6.1), months_since_prior=6, baseline=False)
    assert stable.category == "2"
    assert "Category 3 lesion that is stable" in stable.reason
    assert category(solid(7.7), prior=solid(6.1), months_since_prior=6, baseline=False).category == "4A"


# Part-solid, baseline: 2 < 6 total; 3 >= 6 with solid < 6; 4A solid 6 to < 8; 4B solid >= 8.
@pytest.mark.parametrize(
    ("mm", "solid_mm", "expected"),
    [
        (5.9, 3.0, "2"),
        (5.9, 5.9, "2"),
        (6.0, 3.0, "3"),
        (10.0, 5.9, "3"),
        (10.0, 6.0, "4A"),
        (10.0, 6.1, "4A"),
        (10.0, 7.9, "4A"),
        (10.0, 8.0, "4B"),
        (10.0, 8.1, "4B"),
    ],
)
def test_part_solid_baseline(mm: float, solid_mm: float, expected: str) -> None:
    assert category(part_solid(mm, solid_mm), baseline=True).category == expected


# Part-solid, new: 3 < 6 total; 4A solid < 4; 4B solid >= 4.
@pytest.mark.parametrize(
    ("mm", "solid_mm", "expected"),
    [(5.9, 2.0, "3"), (5.9, 4.5, "3"), (6.0, 3.9, "4A"), (6.0, 4.0, "4B"), (6.1, 4.1, "4B"), (12.0, 3.9, "4A")],
)
def test_part_solid_new(mm: float, solid_mm: float, expected: str) -> None:
    assert category(part_solid(mm, solid_mm), baseline=False).category == expected


# Part-solid, growing solid component: 4A solid < 4; 4B solid >= 4.
@pytest.mark.parametrize(("solid_mm", "expected"), [(3.9, "4A"), (4.0, "4B"), (4.1, "4B")])
def test_part_solid_growing_solid_component(solid_mm: float, expected: str) -> None:
    prior = part_solid(12.0, solid_mm - 1.6)
    assessed = category(part_solid(12.0, solid_mm), prior=prior, months_since_prior=12, baseline=False)
    assert assessed.category == expected
    assert "solid component" in assessed.reason


def test_part_solid_growth_is_measured_on_the_solid_component() -> None:
    # The whole grows 4 mm but the solid part is stable: not growing; a 3 (at baseline thresholds) steps to 2.
    assessed = category(part_solid(14.0, 3.0), prior=part_solid(10.0, 3.0), months_since_prior=6, baseline=False)
    assert assessed.category == "2"


def test_ground_glass_that_gains_a_solid_component() -> None:
    assessed = category(part_solid(10.0, 3.0), prior=ggn(10.0), months_since_prior=12, baseline=False)
    assert assessed.category == "4A"
    assert "new solid component" in assessed.reason
    assert category(part_solid(10.0, 4.0), prior=ggn(10.0), months_since_prior=12, baseline=False).category == "4B"


# Ground-glass: 2 < 30 at baseline, new or growing; 3 >= 30 at baseline or new; 2 >= 30 stable or slowly growing.
@pytest.mark.parametrize(("mm", "expected"), [(29.9, "2"), (30.0, "3"), (30.1, "3")])
@pytest.mark.parametrize("baseline", [True, False])
def test_ground_glass_baseline_and_new(mm: float, expected: str, baseline: bool) -> None:
    assert category(ggn(mm), baseline=baseline).category == expected


@pytest.mark.parametrize(
    ("prior_mm", "mm", "months", "expected"),
    [
        (25.0, 29.9, 12, "2"),  # growing < 30
        (30.0, 30.5, 12, "2"),  # stable >= 30
        (28.0, 30.0, 36, "2"),  # slowly growing >= 30 (+2 mm in 36 months)
        (25.0, 31.0, 12, "3"),  # deskpod: growing >= 30 within 12 months, kept at 3
    ],
)
def test_ground_glass_compared(prior_mm: float, mm: float, months: float, expected: str) -> None:
    assert category(ggn(mm), prior=ggn(prior_mm), months_since_prior=months, baseline=False).category == expected


# Stepped management of stable solid and part-solid nodules.
@pytest.mark.parametrize(
    ("mm", "prior_category", "expected"),
    [
        (10.0, None, "3"),  # inferred: 10 mm at baseline thresholds is 4A; stable -> 3
        (10.0, "4A", "3"),
        (7.0, "3", "2"),
        (7.0, None, "2"),
        (5.0, "2", "2"),
        (10.0, "3", "2"),
        (20.0, "4B", "4B"),
        (20.0, None, "4B"),
        (20.0, "4X", "4X"),
    ],
)
def test_stable_solid_nodules_step_down(mm: float, prior_category: str | None, expected: str) -> None:
    assessed = category(solid(mm), prior=solid(mm), months_since_prior=3, baseline=False, prior_category=prior_category)
    assert assessed.category == expected


def test_decreased_nodules_are_managed_as_stable() -> None:
    assert category(solid(9.0), prior=solid(12.0), months_since_prior=3, baseline=False).category == "3"


def test_a_stable_nodule_that_crosses_a_size_threshold_is_reclassified() -> None:
    # 14.5 -> 15.2 (+0.7, not growth) crosses the 15 mm baseline threshold: 4B.
    crossed = category(solid(15.2), prior=solid(14.5), months_since_prior=3, baseline=False, prior_category="4A")
    assert crossed.category == "4B"
    assert "crosses a new size threshold" in crossed.reason
    # 5.5 -> 6.2 (+0.7) crosses 6 mm: the step-down from 2 gives 2, the size gives 3.
    assert category(solid(6.2), prior=solid(5.5), months_since_prior=12, baseline=False).category == "3"


def test_slow_growth() -> None:
    # +2.0 mm over 24 months: never > 1.5 mm in 12 months, but growth over screens: 4B for solid.
    slow = category(solid(7.0), prior=solid(5.0), months_since_prior=24, baseline=False)
    assert slow.category == "4B"
    assert "Slow growing solid or part solid" in slow.reason
    # The caller's own slow-growth finding from several exams.
    given = category(solid(6.0), prior=solid(5.5), months_since_prior=12, baseline=False, slow_growth=True)
    assert given.category == "4B"
    assert category(ggn(12.0), prior=ggn(11.0), months_since_prior=12, baseline=False, slow_growth=True).category == "2"


def test_flags_benign_juxtapleural_and_suspicious() -> None:
    assert category(solid(12.0, benign=True), baseline=True).category == "1"
    # Juxtapleural < 10 mm at baseline or new is 2; at 10 mm the size rules apply again.
    assert category(solid(9.9, juxtapleural=True), baseline=True).category == "2"
    assert category(solid(9.9, juxtapleural=True), baseline=False).category == "2"
    assert category(solid(10.0, juxtapleural=True), baseline=True).category == "4A"
    # 4X: a 3 or 4 with suspicious features; a 2 stays 2.
    assert category(solid(7.0, suspicious=True), baseline=True).category == "4X"
    assert category(solid(16.0, suspicious=True), baseline=True).category == "4X"
    assert category(solid(5.0, suspicious=True), baseline=True).category == "2"


@pytest.mark.parametrize(
    ("nodule", "follow_up", "pet"),
    [
        (solid(5.0), "12-month screening LDCT", False),
        (solid(7.0), "6-month LDCT", False),
        (solid(8.0), "3-month LDCT", True),
        (part_solid(10.0, 7.0), "3-month LDCT", False),
        (solid(16.0), "Diagnostic chest CT", True),
        (part_solid(10.0, 8.0), "Diagnostic chest CT", True),
    ],
)
def test_follow_up_and_pet_clause(nodule: Nodule, follow_up: str, pet: bool) -> None:
    assessed = category(nodule, baseline=True)
    assert follow_up in assessed.follow_up
    assert ("PET/CT" in assessed.follow_up) is pet


def test_growing_part_solid_with_a_small_solid_part_gets_no_pet_clause() -> None:
    assessed = category(part_solid(9.0, 3.0), prior=part_solid(9.0, 1.0), months_since_prior=6, baseline=False)
    assert assessed.category == "4A"
    assert "PET/CT" not in assessed.follow_up


def test_every_size_meets_exactly_one_row() -> None:
    # The table is complete and its unflagged rows do not overlap, for each type and timepoint.
    for kind in KINDS:
        for when in ("baseline", "new", "growing", "slow-growing", "stable"):
            if when == "stable" and kind != "ground-glass":
                continue  # stable solid and part-solid nodules go by stepped management
            for total in range(1, 400, 3):
                solids = range(1, total + 1, 2) if kind == "part-solid" else [total if kind == "solid" else 0]
                for solid_t in solids:
                    rows = [r for r in RULES if r.flag is None and r.matches(kind, when, total, solid_t, frozenset())]
                    assert len(rows) == 1, (kind, when, total, solid_t, [r.category for r in rows])


def test_every_rule_names_its_source() -> None:
    assert all(rule.source for rule in RULES)
    assert all(source for _, source in lungrads.STEP_DOWN.values())


def test_mean_diameter_rounds_each_axis_then_the_mean() -> None:
    assert mean_diameter(6.0, 5.9) == 6.0  # 5.95 -> 6.0, a category 3 at baseline, not 2
    assert mean_diameter(7.44, 5.93) == 6.7  # 7.4 and 5.9: mean 6.65 -> 6.7
    assert mean_diameter(10.0, 10.0) == 10.0
    with pytest.raises(ConfigError, match="short axis 8"):
        mean_diameter(6.0, 8.0)
    with pytest.raises(ConfigError, match="-1"):
        mean_diameter(-1.0, 2.0)


def test_thresholds_use_the_reported_tenth() -> None:
    # 5.95 reports as 6.0: a category 3; 5.94 reports as 5.9: a category 2.
    assert category(solid(5.95), baseline=True).category == "3"
    assert category(solid(5.94), baseline=True).category == "2"


def test_exam_takes_the_most_suspicious() -> None:
    two = category(solid(4.0), baseline=True)
    four_a = category(solid(9.0), baseline=True)
    three = category(solid(7.0), baseline=True)
    exam = exam_category([two, four_a, three])
    assert exam.category == "4A"
    assert "most suspicious of 3" in exam.reason
    assert exam_category([]).category == "1"
    assert exam_category([two]).reason == two.reason
    # deskpod: incomplete (0) outranks 1 and 2, not 3 or 4.
    assert exam_category([two, incomplete("prior CT being located")]).category == "0"
    assert exam_category([four_a, incomplete("prior CT being located")]).category == "4A"
    with pytest.raises(ConfigError, match="'5'"):
        exam_category([Assessment("5", "", "")])


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Nodule(-2.0, "solid"), "-2.0"),
        (lambda: Nodule(0.0, "solid"), "0.0"),
        (lambda: Nodule(math.nan, "solid"), "nan"),
        (lambda: Nodule(6.0, "calcified"), "'calcified'"),  # type: ignore[arg-type]
        (lambda: Nodule(6.0, "part-solid"), "needs solid_mean_diameter_mm"),
        (lambda: Nodule(6.0, "part-solid", solid_mean_diameter_mm=7.0), "7.0 mm is larger than the whole"),
        (lambda: Nodule(6.0, "part-solid", solid_mean_diameter_mm=-1.0), "-1.0"),
        (lambda: Nodule(6.0, "solid", solid_mean_diameter_mm=3.0), "only for part-solid"),
    ],
)
def test_bad_nodules_are_refused_naming_the_value(make: object, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        make()  # type: ignore[operator]


def test_bad_calls_are_refused() -> None:
    with pytest.raises(ConfigError, match="baseline=True"):
        category(solid(6.0), prior=solid(5.0), months_since_prior=12, baseline=True)
    with pytest.raises(ConfigError, match="months_since_prior"):
        category(solid(6.0), prior=solid(5.0), baseline=False)
    with pytest.raises(ConfigError, match="months_since_prior -1"):
        category(solid(6.0), prior=solid(5.0), months_since_prior=-1, baseline=False)
    with pytest.raises(ConfigError, match="need a prior"):
        category(solid(6.0), months_since_prior=12, baseline=False)
    with pytest.raises(ConfigError, match="prior_category '5'"):
        category(solid(6.0), prior=solid(6.0), months_since_prior=6, baseline=False, prior_category="5")
