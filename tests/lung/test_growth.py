"""Growth between scans: the Lung-RADS diameter rule, volume doubling time, and nodule matching."""

from __future__ import annotations

import math

import pytest

from deskpod.errors import ConfigError
from deskpod.lung.growth import (
    diameter_change,
    match,
    months_from_days,
    round_diameter,
    scipy_available,
    volume_doubling_time,
)


def test_diameters_round_to_a_tenth_half_up() -> None:
    assert round_diameter(2.65) == 2.7  # binary round() gives 2.6
    assert round_diameter(5.95) == 6.0
    assert round_diameter(5.94) == 5.9
    assert round_diameter(0) == 0.0


@pytest.mark.parametrize(
    ("prior", "current", "months", "status"),
    [
        (6.1, 7.6, 12, "stable"),  # +1.5 exactly: not "> 1.5 mm" (7.6 - 6.1 is 1.4999... in floats)
        (6.1, 7.7, 12, "growing"),  # +1.6 within 12 months
        (6.0, 7.5, 3, "stable"),
        (6.0, 7.6, 3, "growing"),
        (5.0, 7.0, 24, "slow-growing"),  # +2.0 in 24 months: 1.0 mm per 12 months
        (5.0, 8.0, 24, "slow-growing"),  # +3.0 in 24 months: exactly 1.5 per 12, not more
        (5.0, 8.1, 24, "growing"),  # +3.1 in 24 months: more than 1.5 per 12
        (5.0, 7.0, 13, "growing"),  # +2.0 in 13 months: 1.85 per 12
        (8.0, 6.5, 6, "stable"),  # -1.5: within the measurement band
        (8.0, 6.4, 6, "decreased"),
    ],
)
def test_diameter_change_follows_the_lung_rads_growth_rule(
    prior: float, current: float, months: float, status: str
) -> None:
    change = diameter_change(prior, current, months)
    assert change.status == status
    assert change.increase_mm == pytest.approx(current - prior)


def test_diameter_change_compares_rounded_values() -> None:
    # 6.04 reports as 6.0 and 7.56 as 7.6: +1.6 mm, growth, although the raw difference is 1.52.
    assert diameter_change(6.04, 7.56, 12).status == "growing"
    assert diameter_change(6.05, 7.54, 12).status == "stable"  # 6.1 -> 7.5


@pytest.mark.parametrize(
    ("prior", "current", "months"),
    [(-1.0, 5.0, 6), (5.0, math.inf, 6), (5.0, 6.0, 0), (5.0, 6.0, -3), (5.0, 6.0, math.nan)],
)
def test_diameter_change_refuses_bad_input(prior: float, current: float, months: float) -> None:
    with pytest.raises(ConfigError, match="not valid"):
        diameter_change(prior, current, months)


def test_doubling_in_100_days() -> None:
    assert volume_doubling_time(100.0, 200.0, 100) == pytest.approx(100.0)
    # Eightfold in 300 days is three doublings: 100 days each.
    assert volume_doubling_time(50.0, 400.0, 300) == pytest.approx(100.0)
    # t ln2 / ln(V2/V1) = 365 * 0.693147 / ln(1.25) = 252.999 / 0.223144 = 1133.8 days
    assert volume_doubling_time(268.0, 335.0, 365) == pytest.approx(1133.8, abs=0.1)


def test_unchanged_volume_never_doubles_and_shrinking_is_negative() -> None:
    assert volume_doubling_time(113.0, 113.0, 90) == math.inf
    # Halving in 100 days: VDT -100 (its magnitude is the halving time).
    assert volume_doubling_time(200.0, 100.0, 100) == pytest.approx(-100.0)


@pytest.mark.parametrize(
    ("v1", "v2", "days", "named"),
    [(0.0, 10.0, 30, "prior volume 0.0"), (10.0, -5.0, 30, "current volume -5.0"), (10.0, 20.0, 0, "interval 0")],
)
def test_volume_doubling_time_refuses_bad_input(v1: float, v2: float, days: float, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        volume_doubling_time(v1, v2, days)


def test_months_from_days() -> None:
    assert months_from_days(365.25) == pytest.approx(12.0)
    with pytest.raises(ConfigError, match="interval 0"):
        months_from_days(0)


def test_match_pairs_nearby_nodules_and_reports_new_and_resolved() -> None:
    current = [(10.0, 0.0, 0.0), (50.0, 50.0, 50.0), (-30.0, 5.0, 2.0)]
    prior = [(-31.0, 5.0, 2.0), (11.0, 1.0, 0.0), (200.0, 0.0, 0.0)]
    result = match(current, prior, 5.0)
    assert [(m.current, m.prior) for m in result.pairs] == [(0, 1), (2, 0)]
    assert result.pairs[0].distance_mm == pytest.approx(math.sqrt(2))
    assert result.new == (1,)
    assert result.resolved == (2,)


def test_match_distance_is_a_hard_limit() -> None:
    assert match([(0.0, 0.0, 0.0)], [(0.0, 0.0, 5.0)], 5.0).pairs[0].distance_mm == 5.0
    beyond = match([(0.0, 0.0, 0.0)], [(0.0, 0.0, 5.01)], 5.0)
    assert beyond.pairs == () and beyond.new == (0,) and beyond.resolved == (0,)


def test_match_with_no_nodules_on_one_side() -> None:
    assert match([], [(1.0, 2.0, 3.0)], 10).resolved == (0,)
    assert match([(1.0, 2.0, 3.0)], [], 10).new == (0,)
    empty = match([], [], 10)
    assert (empty.pairs, empty.new, empty.resolved) == ((), (), ())


def test_greedy_takes_the_closest_pair_first() -> None:
    # Current 0 is 1 mm from prior 0 and 4 mm from prior 1; current 1 is 2 mm from prior 0 only.
    # Greedy pairs (0, 0) first, leaving current 1 new; the optimal assignment pairs both.
    current = [(0.0, 0.0, 0.0), (3.0, 0.0, 0.0)]
    prior = [(1.0, 0.0, 0.0), (-4.0, 0.0, 0.0)]
    greedy = match(current, prior, 4.5, method="greedy")
    assert [(m.current, m.prior) for m in greedy.pairs] == [(0, 0)]
    assert greedy.new == (1,) and greedy.resolved == (1,) and greedy.method == "greedy"


def test_optimal_assignment_pairs_the_most_nodules() -> None:
    pytest.importorskip("scipy")
    current = [(0.0, 0.0, 0.0), (3.0, 0.0, 0.0)]
    prior = [(1.0, 0.0, 0.0), (-4.0, 0.0, 0.0)]
    optimal = match(current, prior, 4.5, method="optimal")
    assert [(m.current, m.prior) for m in optimal.pairs] == [(0, 1), (1, 0)]
    assert match(current, prior, 4.5).method == "optimal"


def test_auto_uses_what_is_installed() -> None:
    result = match([(0.0, 0.0, 0.0)], [(0.0, 1.0, 0.0)], 2.0)
    assert result.method == ("optimal" if scipy_available() else "greedy")
    if not scipy_available():
        with pytest.raises(ConfigError, match="SciPy"):
            match([(0.0, 0.0, 0.0)], [(0.0, 1.0, 0.0)], 2.0, method="optimal")


@pytest.mark.parametrize(
    ("current", "limit", "named"),
    [
        ([(0.0, 0.0)], 5.0, "current nodule centres"),
        ([(0.0, math.nan, 1.0)], 5.0, "current nodule centres"),
        ([(0.0, 0.0, 0.0)], 0.0, "max_distance_mm 0.0"),
        ([(0.0, 0.0, 0.0)], -2.0, "max_distance_mm -2.0"),
    ],
)
def test_match_refuses_bad_input(current: list[tuple[float, ...]], limit: float, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        match(current, [(0.0, 0.0, 0.0)], limit)
