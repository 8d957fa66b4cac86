"""The Brock University (PanCan) probability that a lung nodule is cancer, with every input shown.

McWilliams A, Tammemagi MC, Mayo JR, et al. "Probability of cancer in pulmonary nodules detected
on first screening CT". N Engl J Med 2013;369(10):910-919, doi:10.1056/NEJMoa1214726 — the full
model with spiculation (model 2b), the one the British Thoracic Society's 2015 nodule guideline
uses. Logistic regression::

    logit = -6.7892
            + 0.0287 * (age - 62)
            + 0.6011 * female
            + 0.2961 * family history of lung cancer
            + 0.2953 * emphysema
            - 5.3854 * ((size_mm / 10) ** -0.5 - 1.58113883)
            + 0.3770 * part-solid  or  -0.1276 * non-solid (ground-glass)   [solid: 0]
            + 0.6581 * upper lobe
            - 0.0824 * (nodule count - 4)
            + 0.7729 * spiculation
    probability = 1 / (1 + exp(-logit))

The coefficients are those of the paper (tabulated with the Brock/"BU" column of Table 2 in
Eur Radiol 2019;29:5367-5377, PMC6717521, whose uncentred offset 0.2761 equals
-6.7892 - 0.0287 * 62 + 5.3854 * 1.58113883 + 0.0824 * 4); the model centres age at 62, size at
4 mm (1.58113883 = (4 / 10) ** -0.5) and the count at 4. Size is the nodule's longest diameter
in mm (calculators built on the paper ask for the maximum diameter), not the Lung-RADS mean.
The model was fitted on nodules found on the *first* screening CT; on a follow-up scan growth
says more than it does.

What the scan gives (source "scan"): size, type, upper lobe, the number of nodules, a
spiculation estimate (default: not spiculated). What it does not (source "given" when passed,
"default" otherwise), with the defaults and why:

- age: 62, the paper's centring value, so an unknown age adds nothing to the logit;
- sex: unknown adds half the female effect (0.30055): neither sex assumed, and the odds are then
  within a factor of 1.35 of either true value (male would understate a woman's risk by 1.82x);
- family history of lung cancer: absent; emphysema: absent (the model's reference levels; if
  present the odds are 1.34x higher each, so a default can understate risk — the report shows
  which inputs were defaults).

Decision support, not a medical device: a probability from a population model, not a diagnosis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from deskpod.errors import ConfigError
from deskpod.lung.lungrads import KINDS

MODEL = (
    "Brock University / PanCan full model with spiculation (McWilliams et al., "
    "N Engl J Med 2013;369:910-919, doi:10.1056/NEJMoa1214726)"
)

INTERCEPT = -6.7892
AGE_PER_YEAR = 0.0287
AGE_CENTRE = 62.0
FEMALE = 0.6011
FAMILY_HISTORY = 0.2961
EMPHYSEMA = 0.2953
SIZE = -5.3854
"""Times ``(size_mm / 10) ** -0.5 - SIZE_CENTRE``: risk rises with size, steeply below ~10 mm."""
SIZE_CENTRE = 1.58113883
"""(4 mm / 10) ** -0.5, as printed in the paper."""
TYPE = {"solid": 0.0, "part-solid": 0.377, "ground-glass": -0.1276}
"""Nodule type; the paper's "nonsolid" is Lung-RADS' ground-glass."""
UPPER_LOBE = 0.6581
COUNT_PER_NODULE = -0.0824
COUNT_CENTRE = 4
SPICULATION = 0.7729

DEFAULT_AGE = AGE_CENTRE
UNKNOWN_SEX_FRACTION = 0.5
"""An unknown sex counts as half female (see the module docstring)."""

Source = Literal["scan", "given", "default"]


@dataclass(frozen=True, slots=True)
class Input:
    """One input of the model: its value, where it came from, and what it added to the logit."""

    name: str
    value: str | float | int | bool
    source: Source
    term: float


@dataclass(frozen=True, slots=True)
class Risk:
    """The probability of cancer, the logit it came from, and every input used."""

    probability: float
    logit: float
    inputs: tuple[Input, ...]
    model: str = MODEL
    notes: tuple[str, ...] = ()

    def input(self, name: str) -> Input:
        for item in self.inputs:
            if item.name == name:
                return item
        raise KeyError(name)


def malignancy(
    *,
    long_axis_mm: float,
    kind: str,
    nodule_count: int,
    upper_lobe: bool | None = None,
    spiculation: bool | None = None,
    age: float | None = None,
    sex: Literal["female", "male"] | None = None,
    family_history: bool | None = None,
    emphysema: bool | None = None,
) -> Risk:
    """The PanCan probability that this nodule is (or will be found to be) lung cancer.

    ``long_axis_mm``: the nodule's longest diameter; ``kind``: solid, part-solid or ground-glass;
    ``nodule_count``: nodules on the scan, this one included; ``upper_lobe``, ``spiculation``: the
    scan's estimates (None: unknown, taken as no). Patient inputs default as the module says.
    """
    _check_positive(long_axis_mm, "nodule long axis", "mm, e.g. 9.5")
    if kind not in KINDS:
        raise ConfigError(f"nodule kind {kind!r} is not valid: use one of {', '.join(KINDS)}")
    if isinstance(nodule_count, bool) or not isinstance(nodule_count, int) or nodule_count < 1:
        raise ConfigError(f"nodule count {nodule_count!r} is not valid: give the number of nodules (1 or more)")
    for name, flag in (
        ("upper_lobe", upper_lobe),
        ("spiculation", spiculation),
        ("family_history", family_history),
        ("emphysema", emphysema),
    ):
        if flag is not None and not isinstance(flag, bool):
            raise ConfigError(f"{name} {flag!r} is not valid: give True, False or None (unknown)")
    if sex not in (None, "female", "male"):
        raise ConfigError(f"sex {sex!r} is not valid: give 'female', 'male' or None (unknown)")
    if age is not None:
        _check_positive(age, "age", "years, e.g. 64")
        if age > 120:
            raise ConfigError(f"age {age!r} years is not valid: give an age in years, e.g. 64")

    size_term = SIZE * ((long_axis_mm / 10) ** -0.5 - SIZE_CENTRE)
    years = DEFAULT_AGE if age is None else age
    inputs = [
        Input("nodule size (longest diameter, mm)", float(long_axis_mm), "scan", size_term),
        Input("nodule type", kind, "scan", TYPE[kind]),
        Input("nodule count", nodule_count, "scan", COUNT_PER_NODULE * (nodule_count - COUNT_CENTRE)),
        _flag("upper lobe", upper_lobe, UPPER_LOBE, "scan"),
        _flag("spiculation", spiculation, SPICULATION, "scan"),
        Input("age (years)", float(years), "default" if age is None else "given", AGE_PER_YEAR * (years - AGE_CENTRE)),
        Input(
            "sex",
            "unknown" if sex is None else sex,
            "default" if sex is None else "given",
            FEMALE * (UNKNOWN_SEX_FRACTION if sex is None else float(sex == "female")),
        ),
        _flag("family history of lung cancer", family_history, FAMILY_HISTORY, "given"),
        _flag("emphysema", emphysema, EMPHYSEMA, "given"),
    ]
    logit = INTERCEPT + math.fsum(item.term for item in inputs)
    notes = ["fitted on nodules found on the first screening CT (PanCan); decision support, not a diagnosis"]
    defaults = [item.name for item in inputs if item.source == "default"]
    if defaults:
        notes.append(f"defaults used for: {', '.join(defaults)}")
    return Risk(probability=_logistic(logit), logit=logit, inputs=tuple(inputs), notes=tuple(notes))


def _flag(name: str, value: bool | None, coefficient: float, source: Source) -> Input:
    if value is None:
        return Input(name, False, "default", 0.0)
    return Input(name, value, source, coefficient if value else 0.0)


def _check_positive(value: float, name: str, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} {value!r} is not valid: give a number above 0 {unit}")


def _logistic(x: float) -> float:
    # The two branches keep exp() from overflowing for extreme logits.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)
