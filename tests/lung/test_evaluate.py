"""The LUNA16 evaluation: each hit rule on a case it decides, the FROC reading, the bootstrap, files and bad input."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from deskpod.cli import main
from deskpod.errors import ConfigError
from deskpod.lung.evaluate import (
    FP_RATES,
    MAX_MARKS,
    Candidates,
    Findings,
    Matching,
    bootstrap,
    evaluate,
    libm_square,
    make_candidates,
    make_findings,
    match,
    read_seriesuids,
    resample_scans,
)

Row = tuple[str, float, float, float, float]
FAR = (200.0, 200.0, 200.0)  # far from every finding below


def _match(
    series: Sequence[str], nodules: Sequence[Row], cands: Sequence[Row], excluded: Sequence[Row] = ()
) -> Matching:
    return match(series, make_findings(nodules), make_findings(excluded), make_candidates(cands))


def _write(path: Path, header: str, rows: Sequence[Sequence[object]]) -> Path:
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- the hit rules
def test_on_the_radius_is_a_miss_just_inside_is_a_hit() -> None:
    # Nodule of diameter 10 at the origin: (3, 4, 0) is exactly 5 mm away, (3, 3.999, 0) just inside.
    m = _match(["s"], [("s", 0, 0, 0, 10)], [("s", 3, 4, 0, 0.9), ("s", 3, 3.999, 0, 0.5)])
    assert (m.detected, m.false_positives) == (1, 1)
    assert m.entry_probability[m.entry_is_nodule].tolist() == [0.5]  # the hit, not the more probable miss
    assert m.entry_probability[~m.entry_is_nodule].tolist() == [0.9]
    only_boundary = _match(["s"], [("s", 0, 0, 0, 10)], [("s", 3, 4, 0, 0.9)])
    assert (only_boundary.detected, only_boundary.false_positives) == (0, 1)


def _boundary_cases(n: int) -> list[tuple[float, float, float, bool]]:
    """Candidates (a, b, 0) a nodule of radius r at the origin judges differently by the script's arithmetic (the C
    library's ``pow(v, 2.)``, summed) and by products (``a * a + b * b < r * r``): within one ULP of the sphere,
    where glibc's pow and the correctly rounded product differ in the last bit. Each with the script's verdict."""
    rng = np.random.default_rng(0)
    out: list[tuple[float, float, float, bool]] = []
    while len(out) < n:
        a, b = (float(v) for v in rng.uniform(-10, 10, 2))
        r0 = math.sqrt(a * a + b * b)
        for r in (float(np.nextafter(r0, 0)), r0, float(np.nextafter(r0, 100))):
            script = pow(a - 0.0, 2.0) + pow(b - 0.0, 2.0) + pow(0.0, 2.0) < pow(2 * r / 2.0, 2.0)  # its own form
            if script != (a * a + b * b < r * r):
                out.append((a, b, r, script))
                break
    return out


def test_a_point_within_one_ulp_of_the_sphere_is_judged_as_the_script_judges_it() -> None:
    cases = _boundary_cases(6)
    assert {script for *_, script in cases} == {True, False}  # both kinds of disagreement are among them
    for a, b, r, script in cases:
        m = _match(["s"], [("s", 0, 0, 0, 2 * r)], [("s", a, b, 0, 0.9)])
        assert (m.detected == 1) == script, (a, b, r)
    x = next(v for case in cases for v in case[:3] if math.pow(v, 2.0) != v * v)
    assert libm_square(np.array([x]))[0] == math.pow(x, 2.0) != float(np.square(x))


def test_hits_on_excluded_findings_are_ignored_and_minus_one_means_10_mm() -> None:
    nodule = [("s", 0, 0, 0, 6)]
    excluded = [("s", 50, 0, 0, -1), ("s", 0, 80, 0, 4)]
    cands = [
        ("s", 54, 0, 0, 0.8),  # 4 mm from a -1 finding: inside its default 10 mm diameter -> ignored
        ("s", 55, 0, 0, 0.7),  # 5 mm: on that radius -> a false positive
        ("s", 0, 81.9, 0, 0.6),  # inside the 4 mm finding -> ignored
        ("s", 0, 82, 0, 0.5),  # on its radius -> false positive
        ("s", 1, 0, 0, 0.4),  # the nodule
    ]
    m = _match(["s"], nodule, cands, excluded)
    assert (m.detected, m.false_positives, m.ignored_on_excluded) == (1, 2, 2)
    assert sorted(m.entry_probability[~m.entry_is_nodule].tolist()) == [0.5, 0.7]
    assert m.nodules == 1  # excluded findings are not nodules: they never count as missed


def test_a_candidate_on_a_nodule_and_an_excluded_finding_is_a_hit() -> None:
    m = _match(["s"], [("s", 0, 0, 0, 10)], [("s", 2, 0, 0, 0.3)], [("s", 3, 0, 0, 10)])
    assert (m.detected, m.false_positives, m.ignored_on_excluded) == (1, 0, 0)


def test_several_candidates_on_one_nodule_count_once_at_the_highest_probability() -> None:
    cands = [("s", 1, 0, 0, 0.3), ("s", 0, 1, 0, 0.8), ("s", 0, 0, 1, 0.6), ("s", *FAR, 0.2)]
    m = _match(["s"], [("s", 0, 0, 0, 10)], cands)
    assert (m.detected, m.false_positives, m.double_detections) == (1, 1, 2)
    assert m.entry_probability[m.entry_is_nodule].tolist() == [0.8]


def test_a_candidate_between_two_nodules_detects_both() -> None:
    # As the LUNA16 script: the mark is a match of each nodule it lies in, and no false positive.
    m = _match(["s"], [("s", 0, 0, 0, 10), ("s", 4, 0, 0, 10)], [("s", 2, 0, 0, 0.7)])
    assert (m.detected, m.false_positives, m.multi_nodule_candidates) == (2, 0, 1)
    assert m.entry_probability.tolist() == [0.7, 0.7]


def test_candidates_of_a_scan_without_nodules_are_false_positives() -> None:
    cands = [("a", 0, 0, 0, 0.9), ("b", 0, 0, 0, 0.8), ("b", 1, 0, 0, 0.1)]
    m = _match(["a", "b"], [("a", 0, 0, 0, 10)], cands)
    assert (m.detected, m.false_positives) == (1, 2)
    assert m.entry_scan[~m.entry_is_nodule].tolist() == [1, 1]
    assert m.lesions_per_scan.tolist() == [1, 0]


def test_annotations_of_scans_not_listed_are_left_out() -> None:
    m = _match(["a"], [("a", 0, 0, 0, 10), ("other-fold", 0, 0, 0, 10)], [("a", 0, 0, 0, 0.9)])
    assert (m.nodules, m.detected) == (1, 1)


def test_more_than_100_candidates_keep_those_above_the_101st_probability() -> None:
    probs = [1.0 - i / 1000 for i in range(MAX_MARKS + 5)]
    cands = [("s", *FAR, p) for p in probs]
    m = _match(["s"], [("s", 0, 0, 0, 10)], cands)
    assert (m.false_positives, m.over_limit) == (MAX_MARKS, 5)
    # Ties at the 101st value all go (the script keeps probabilities strictly above it).
    tied = [("s", *FAR, 0.9)] * (MAX_MARKS + 1) + [("s", *FAR, 0.95)]
    m2 = _match(["s"], [("s", 0, 0, 0, 10)], tied)
    assert (m2.false_positives, m2.over_limit) == (1, MAX_MARKS + 1)
    unlimited = match(
        ["s"], make_findings([("s", 0, 0, 0, 10)]), make_findings([]), make_candidates(cands), max_marks=None
    )
    assert unlimited.false_positives == MAX_MARKS + 5


# ---------------------------------------------------------------- the FROC curve and its reading
def _known_case() -> tuple[list[str], list[Row], list[Row]]:
    """16 scans, 5 nodules (one never hit), false positives placed so the curve is known point by point.

    Thresholds, falling: TP (0, 1); TP + 3 FP tied (3, 2); FP (4, 2); TP (4, 3); 4 FP (8, 3);
    TP (8, 4); 12 FP (20, 4) -- (false positives, nodules detected).
    """
    series = [f"s{i}" for i in range(16)]
    nodules = [(f"s{i}", 0.0, 0.0, 0.0, 10.0) for i in range(5)]
    fp_probs = [0.8, 0.8, 0.8, 0.7, 0.5, 0.45, 0.42, 0.41] + [0.2 - i / 100 for i in range(12)]
    cands = [("s0", 0.0, 0.0, 0.0, 0.9), ("s1", 0.0, 0.0, 0.0, 0.8), ("s2", 0.0, 0.0, 0.0, 0.6), ("s3", 0, 0, 0, 0.3)]
    cands += [(series[5 + i % 11], *FAR, p) for i, p in enumerate(fp_probs)]
    return series, nodules, cands


def test_froc_points_and_the_reading_at_each_rate() -> None:
    series, nodules, cands = _known_case()
    ev = evaluate(series, make_findings(nodules), make_findings([]), make_candidates(cands), samples=0)
    fp = [0, 0, 3, 4, 4, 5, 6, 7, 8, 8, *range(9, 21)]
    tp = [0, 1, 2, 2, 3, 3, 3, 3, 3, 4, *[4] * 12]
    np.testing.assert_allclose(ev.curve.fp_per_scan, np.array(fp) / 16, rtol=1e-15)
    np.testing.assert_allclose(ev.curve.sensitivity, np.array(tp) / 5, rtol=1e-15)
    # 1/8 per scan = 2 FPs: on the tied segment (0,1)-(3,2) -> 5/3 nodules; 1/4 = 4 FPs: a vertical
    # step, read at its top (np.interp's last point there) -> 3; 1/2 = 8 FPs: the same -> 4; then flat.
    expected = [5 / 3 / 5, 3 / 5, 4 / 5, 4 / 5, 4 / 5, 4 / 5, 4 / 5]
    np.testing.assert_allclose(ev.sensitivity, expected, rtol=1e-12)
    assert ev.cpm == pytest.approx(sum(expected) / 7, rel=1e-12)
    assert ev.bootstrap is None


def test_no_candidates_at_all_is_sensitivity_0_and_cpm_0() -> None:
    nodules = [("a", 0, 0, 0, 10), ("b", 5, 5, 5, 8)]
    ev = evaluate(["a", "b"], make_findings(nodules), make_findings([]), make_candidates([]), samples=20)
    assert ev.sensitivity.tolist() == [0.0] * 7 and ev.cpm == 0.0
    assert ev.bootstrap is not None and ev.bootstrap.cpm_interval() == (0.0, 0.0)


def test_no_false_positives_is_the_fraction_detected_at_every_rate() -> None:
    nodules = [("a", 0, 0, 0, 10), ("b", 0, 0, 0, 10), ("b", 50, 0, 0, 10)]
    ev = evaluate(
        ["a", "b"], make_findings(nodules), make_findings([]), make_candidates([("a", 0, 0, 0, 0.4)]), samples=0
    )
    np.testing.assert_allclose(ev.sensitivity, [1 / 3] * 7)


# ---------------------------------------------------------------- the bootstrap
def _random_case(scans: int, seed: int) -> tuple[list[str], Findings, Findings, Candidates]:
    rng = np.random.default_rng(seed)
    series = [f"1.3.6.{i}" for i in range(scans)]
    nodules: list[Row] = []
    cands: list[Row] = []
    for uid in series:
        for _ in range(int(rng.integers(1, 3))):
            c = rng.uniform(-100, 100, 3)
            nodules.append((uid, *c, float(rng.uniform(4, 20))))
            if rng.random() < 0.8:
                cands.append((uid, *(c + rng.normal(0, 1.0, 3)), float(rng.beta(4, 2))))
        for _ in range(int(rng.integers(5, 15))):
            cands.append((uid, *rng.uniform(-150, 150, 3), float(rng.beta(2, 4))))
    return series, make_findings(nodules), make_findings([]), make_candidates(cands)


def test_bootstrap_intervals_hold_the_estimate_and_repeat_with_the_seed() -> None:
    case = _random_case(40, seed=1)
    a = evaluate(*case, samples=200, seed=7)
    b = evaluate(*case, samples=200, seed=7)
    c = evaluate(*case, samples=200, seed=8)
    assert a.bootstrap is not None and b.bootstrap is not None and c.bootstrap is not None
    lo, hi = a.bootstrap.sensitivity_interval()
    assert np.all(lo <= a.sensitivity) and np.all(a.sensitivity <= hi) and np.all(lo < hi)
    cpm_lo, cpm_hi = a.bootstrap.cpm_interval()
    assert cpm_lo < a.cpm < cpm_hi
    assert a.bootstrap.cpm_interval() == b.bootstrap.cpm_interval()
    np.testing.assert_array_equal(a.bootstrap.sensitivity, b.bootstrap.sensitivity)
    assert a.bootstrap.cpm_interval() != c.bootstrap.cpm_interval()


def test_each_bootstrap_draw_is_the_evaluation_of_the_drawn_scans() -> None:
    # The official script concatenates the drawn scans' entries; evaluating the drawn scans as a new
    # data set (a scan drawn twice appears twice) must give each draw's sensitivity exactly.
    series, nodules, excluded, cands = _random_case(12, seed=2)
    ev = evaluate(series, nodules, excluded, cands, samples=5, seed=3)
    assert ev.bootstrap is not None and ev.bootstrap.without_nodules == 0
    for k, draw in enumerate(resample_scans(len(series), 5, 3)):
        new_series = [f"{series[i]}#{j}" for j, i in enumerate(draw)]
        copies = {series[i]: [s for s, d in zip(new_series, draw, strict=True) if d == i] for i in set(draw)}
        rows_n = [(new, *nodules.xyz[r], nodules.diameter_mm[r]) for r, uid in enumerate(nodules.seriesuid)
                  for new in copies.get(uid, [])]  # fmt: skip
        rows_c = [(new, *cands.xyz[r], cands.probability[r]) for r, uid in enumerate(cands.seriesuid)
                  for new in copies.get(uid, [])]  # fmt: skip
        one = evaluate(new_series, make_findings(rows_n), make_findings([]), make_candidates(rows_c), samples=0)
        np.testing.assert_array_equal(ev.bootstrap.sensitivity[k], one.sensitivity)


def test_both_bootstrap_paths_give_the_same_draws() -> None:
    m = match(*_random_case(30, seed=4))
    fast = bootstrap(m, samples=40, seed=1)
    slow = bootstrap(m, samples=40, seed=1, by_scan_limit=0, chunk_elements=5_000)
    np.testing.assert_array_equal(fast.sensitivity, slow.sensitivity)
    np.testing.assert_array_equal(fast.curve, slow.curve)


# ---------------------------------------------------------------- files and the command
def _files(tmp_path: Path) -> dict[str, Path]:
    series, nodules, cands = _known_case()
    head = "seriesuid,coordX,coordY,coordZ,"
    return {
        "annotations": _write(tmp_path / "annotations.csv", head + "diameter_mm", nodules),
        "excluded": _write(tmp_path / "annotations_excluded.csv", head + "diameter_mm", [("s9", 9, 9, 9, -1)]),
        "candidates": _write(tmp_path / "results.csv", head + "probability", cands),
        "seriesuids": _write(tmp_path / "seriesuids.csv", "", [(s,) for s in series]),
    }


def _argv(files: dict[str, Path], **over: str) -> list[str]:
    args = {k: str(v) for k, v in files.items()} | over
    return ["lung", "evaluate", *[x for k, v in args.items() for x in (f"--{k}", v)]]


def test_the_command_prints_the_table_and_writes_the_plot_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _files(tmp_path)
    out = tmp_path / "out"
    assert main([*_argv(files, bootstrap="50", out=str(out))]) == 0
    text = capsys.readouterr().out
    assert "16 scans, 5 nodules (4 hit by a candidate)" in text
    assert "CPM" in text and "not a medical device" in text and "50 bootstraps over scans, seed 0" in text
    assert (out / "froc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "evaluation.json").read_text())
    assert [p["fp_per_scan"] for p in data["points"]] == list(FP_RATES)
    assert data["points"][0]["sensitivity"] == pytest.approx(1 / 3)
    assert data["bootstrap"]["samples"] == 50 and "not a medical device" in data["note"]
    assert data["points"][2]["ci_low"] <= data["points"][2]["sensitivity"] <= data["points"][2]["ci_high"]
    assert main([*_argv(files, bootstrap="50", out=str(out)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == data


def test_series_lists_one_per_line_or_with_a_header(tmp_path: Path) -> None:
    plain = tmp_path / "a.csv"
    plain.write_text("1.2.3\n\n1.2.4\n")
    header = _write(tmp_path / "b.csv", "subset,seriesuid", [(0, "1.2.3"), (1, "1.2.4")])
    assert read_seriesuids(plain) == read_seriesuids(header) == ("1.2.3", "1.2.4")


A = "seriesuid,coordX,coordY,coordZ,diameter_mm\n"
C = "seriesuid,coordX,coordY,coordZ,probability\n"
BAD = [
    ("annotations", "seriesuid,coordX,coordY,coordZ\ns0,1,2,3\n", "line 1: no column 'diameter_mm'"),
    ("annotations", A + "s0,1,abc,3,5\n", "line 2: coordY 'abc' is not a number"),
    ("annotations", A + "s0,1,2,3,nan\n", "line 2: diameter_mm 'nan' is not a finite"),
    ("annotations", A + "s0,1,2,3,-1\n", "line 2: diameter_mm '-1' must be positive"),
    ("annotations", A + "s0,1,2,3\n", "line 2: 4 fields where the header has 5"),
    ("annotations", A + "elsewhere,1,2,3,5\n", "has no nodule in the 16 listed"),
    ("annotations", "", "is empty"),
    ("excluded", A + "\ns0,1,2,x,-1\n", "line 3: coordZ 'x' is not a number"),
    ("candidates", "seriesuid,coordX,coordY,coordZ,class\ns0,1,2,3,1\n", "no column 'probability'"),
    ("candidates", C + "s0,1,2,3,0.5\nzz,1,2,3,0.5\n", "line 3: seriesuid 'zz' is not one of the 16 listed scans"),
    ("candidates", C + ",1,2,3,0.5\n", "line 2: empty seriesuid"),
    ("candidates", C + "s0,1,2,3,high\n", "line 2: probability 'high' is not a number"),
    ("candidates", "\n\n", "is empty"),
    ("seriesuids", "", "is empty"),
    ("seriesuids", "s0\ns1\ns0\n", "line 3: seriesuid 's0' is listed twice (first on line 1)"),
    ("seriesuids", "s0\ns1,0\n", "line 2: 's1,0' is not one seriesuid"),
]  # fmt: skip


@pytest.mark.parametrize(("which", "content", "message"), BAD)
def test_bad_files_name_the_file_line_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str, content: str, message: str
) -> None:
    files = _files(tmp_path)
    files[which].write_text(content)
    assert main(_argv(files, bootstrap="0", out=str(tmp_path / "out"))) == 2
    err = capsys.readouterr().err
    assert message in err and str(files[which]) in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"bootstrap": "-1"}, "--bootstrap -1"),
        ({"max-marks": "-3"}, "--max-marks -3"),
        (
            {"annotations": "/nonexistent/annotations.csv"},
            "annotations file '/nonexistent/annotations.csv': no such file",
        ),
    ],
)
def test_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: dict[str, str], message: str) -> None:
    assert main(_argv(_files(tmp_path), out=str(tmp_path / "out"), **flags)) == 2
    assert message in capsys.readouterr().err


def test_the_library_refuses_an_empty_series_list() -> None:
    with pytest.raises(ConfigError, match="series list is empty"):
        _match([], [("a", 0, 0, 0, 10)], [])


def test_the_cli_default_limit_is_the_library_one() -> None:
    import argparse

    from deskpod.cli.lung import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["lung", "evaluate", "--annotations", "a", "--excluded", "e", "--candidates", "c",
                              "--seriesuids", "s"])  # fmt: skip
    assert args.max_marks == MAX_MARKS and args.bootstrap == 1000 and args.seed == 0


def test_a_candidates_file_with_no_rows_is_evaluated_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _files(tmp_path)
    files["candidates"] = _write(tmp_path / "empty.csv", "seriesuid,coordX,coordY,coordZ,probability", [])
    assert main([*_argv(files, bootstrap="0", out=str(tmp_path / "out"))]) == 0
    got = capsys.readouterr()
    assert "holds no candidate (a header and no rows)" in got.err and "WARNING" in got.out
    data = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert data["cpm"]["value"] == 0.0 and "every nodule counts as missed" in data["warnings"][0]
