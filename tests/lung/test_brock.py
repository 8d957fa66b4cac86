"""The Brock (PanCan) model: worked values from its published formula, its shape, its inputs, bad input."""

from __future__ import annotations

import itertools
import math

import pytest

from deskpod.errors import ConfigError
from deskpod.lung import brock
from deskpod.lung.brock import malignancy


def test_reference_nodule_with_every_default() -> None:
    # 4 mm solid, not upper lobe, 4 nodules, no spiculation: size and count are at their centres (term 0).
    # Defaults: age 62 (term 0), sex unknown (0.5 * 0.6011 = 0.30055), no family history, no emphysema.
    # logit = -6.7892 + 0.30055 = -6.48865; p = 1 / (1 + e^6.48865) = 1 / (1 + 657.64) = 0.0015183
    risk = malignancy(long_axis_mm=4, kind="solid", nodule_count=4)
    assert risk.logit == pytest.approx(-6.48865, abs=1e-6)
    assert risk.probability == pytest.approx(0.0015183, rel=1e-4)


def test_worked_value_with_every_risk_factor() -> None:
    # 10 mm part-solid, upper lobe, 1 nodule, spiculated; 65-year-old woman, family history, emphysema.
    # size: (10/10)^-0.5 - 1.58113883 = -0.58113883; * -5.3854 = +3.129665
    # logit = -6.7892 + 0.0287*3 + 0.6011 + 0.2961 + 0.2953 + 3.129665 + 0.377 + 0.6581 + (-0.0824)*(1-4) + 0.7729
    #       = -6.7892 + 0.0861 + 0.6011 + 0.2961 + 0.2953 + 3.129665 + 0.377 + 0.6581 + 0.2472 + 0.7729 = -0.325735
    # p = 1 / (1 + e^0.325735) = 1 / (1 + 1.385066) = 0.41927
    risk = malignancy(
        long_axis_mm=10,
        kind="part-solid",
        nodule_count=1,
        upper_lobe=True,
        spiculation=True,
        age=65,
        sex="female",
        family_history=True,
        emphysema=True,
    )
    assert risk.logit == pytest.approx(-0.325735, abs=1e-5)
    assert risk.probability == pytest.approx(0.41927, abs=1e-4)


def test_worked_value_large_solid_nodule_in_a_man() -> None:
    # 25 mm solid, upper lobe, 2 nodules, 70-year-old man, no spiculation estimate (default no).
    # size: (25/10)^-0.5 = 0.6324555; 0.6324555 - 1.58113883 = -0.9486833; * -5.3854 = +5.109039
    # logit = -6.7892 + 5.109039 + 0.6581 + (-0.0824)*(2-4) + 0.0287*8 = -6.7892 + 5.109039 + 0.6581 + 0.1648 + 0.2296
    #       = -0.627661; p = 1 / (1 + e^0.627661) = 1 / (1 + 1.873233) = 0.34804
    risk = malignancy(long_axis_mm=25, kind="solid", nodule_count=2, upper_lobe=True, age=70, sex="male")
    assert risk.logit == pytest.approx(-0.627661, abs=1e-5)
    assert risk.probability == pytest.approx(0.34804, abs=1e-4)


def test_ground_glass_is_a_little_less_likely_than_solid_and_part_solid_more() -> None:
    kinds = ("solid", "part-solid", "ground-glass")
    p = {kind: malignancy(long_axis_mm=12.0, kind=kind, nodule_count=1, upper_lobe=True).logit for kind in kinds}
    assert p["part-solid"] - p["solid"] == pytest.approx(0.377)
    assert p["ground-glass"] - p["solid"] == pytest.approx(-0.1276)


def test_bigger_nodule_means_higher_risk() -> None:
    sizes = [1, 2, 3, 4, 6, 8, 10, 15, 20, 30, 50]
    risks = [malignancy(long_axis_mm=s, kind="solid", nodule_count=1).probability for s in sizes]
    assert all(a < b for a, b in itertools.pairwise(risks))
    assert risks[0] > 0 and risks[-1] < 1


def test_more_nodules_lower_the_risk_of_each_and_spiculation_raises_it() -> None:
    one = malignancy(long_axis_mm=9, kind="solid", nodule_count=1).probability
    five = malignancy(long_axis_mm=9, kind="solid", nodule_count=5).probability
    spiculated = malignancy(long_axis_mm=9, kind="solid", nodule_count=1, spiculation=True).probability
    assert five < one < spiculated


def test_every_input_is_reported_with_its_source_and_term() -> None:
    risk = malignancy(long_axis_mm=8, kind="solid", nodule_count=3, upper_lobe=True, age=70)
    sources = {item.name: item.source for item in risk.inputs}
    assert sources == {
        "nodule size (longest diameter, mm)": "scan",
        "nodule type": "scan",
        "nodule count": "scan",
        "upper lobe": "scan",
        "spiculation": "default",
        "age (years)": "given",
        "sex": "default",
        "family history of lung cancer": "default",
        "emphysema": "default",
    }
    assert risk.input("sex").value == "unknown"
    assert risk.input("sex").term == pytest.approx(brock.FEMALE / 2)
    assert risk.input("age (years)").term == pytest.approx(0.0287 * 8)
    # The terms are the logit, less the intercept: the report can show how each input moved it.
    assert math.fsum(i.term for i in risk.inputs) + brock.INTERCEPT == pytest.approx(risk.logit)
    assert any("spiculation" in n and "sex" in n for n in risk.notes)


def test_defaults_are_the_papers_centre_and_reference_levels() -> None:
    default = malignancy(long_axis_mm=7, kind="solid", nodule_count=2)
    explicit = malignancy(
        long_axis_mm=7, kind="solid", nodule_count=2, age=62, family_history=False, emphysema=False, spiculation=False
    )
    assert default.logit == pytest.approx(explicit.logit)
    male = malignancy(long_axis_mm=7, kind="solid", nodule_count=2, sex="male").logit
    female = malignancy(long_axis_mm=7, kind="solid", nodule_count=2, sex="female").logit
    assert male < default.logit < female
    assert default.logit == pytest.approx((male + female) / 2)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"long_axis_mm": 0}, "0"),
        ({"long_axis_mm": -3}, "-3"),
        ({"long_axis_mm": math.nan}, "nan"),
        ({"kind": "mixed"}, "'mixed'"),
        ({"nodule_count": 0}, "0"),
        ({"nodule_count": 2.5}, "2.5"),
        ({"age": -1}, "-1"),
        ({"age": 250}, "250"),
        ({"sex": "f"}, "'f'"),
        ({"upper_lobe": "yes"}, "'yes'"),
    ],
)
def test_bad_input_is_refused_naming_the_value(arguments: dict[str, object], named: str) -> None:
    call: dict[str, object] = {"long_axis_mm": 8.0, "kind": "solid", "nodule_count": 1} | arguments
    with pytest.raises(ConfigError, match=named):
        malignancy(**call)  # type: ignore[arg-type]
