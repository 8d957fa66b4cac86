"""`deskpod lung analyze` end to end on small synthetic chests: nodules found and measured, growth, the report's files.

The chest is drawn analytically (body, spine, heart, two lungs, spherical nodules) on a 128×112×48 grid of
2×2×3 mm, so every test runs the real pipeline — lung mask, classical candidates, region growing, Brock,
pyradiomics, Lung-RADS, and with a prior the rigid registration — in seconds. The prior is the same chest
moved and turned a little, with the nodules' truth known in both frames.
"""

from __future__ import annotations

import importlib
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deskpod.cli import main
from deskpod.errors import ConfigError
from deskpod.lung import lungrads
from deskpod.lung.analyze import analyze
from deskpod.lung.images import Scan
from deskpod.lung.report import DISCLAIMER, NODULE_PX, OVERVIEW_PX, SCHEMA, Report
from tests.lung.test_images import write_dicom_series

sitk: Any = importlib.import_module("SimpleITK")  # untyped: its calls are Any under mypy strict

SHAPE = (48, 112, 128)  # (z, y, x)
SPACING = (2.0, 2.0, 3.0)  # (x, y, z) mm
IDENTITY = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
Nodule = tuple[tuple[float, float, float], float, str]  # centre (patient mm), diameter mm, "solid" / "ground-glass"

# Baseline: a solid 12 mm nodule high in the right lung (LPS: right is -x), a solid 9 mm one low in the left
# lung, a ground-glass 12 mm one in the left lung.
BASELINE: list[Nodule] = [
    ((-55.0, 5.0, 30.0), 12.0, "solid"),
    ((55.0, -15.0, -30.0), 9.0, "solid"),
    ((60.0, 15.0, 15.0), 12.0, "ground-glass"),
]


def _rotation_z(degrees: float) -> np.ndarray:
    a = math.radians(degrees)
    return np.array([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0], [0.0, 0.0, 1.0]])


def chest(
    nodules: list[Nodule], *, shift: tuple[float, float, float] = (0.0, 0.0, 0.0), turn_deg: float = 0.0, seed: int = 0
) -> tuple[Scan, list[tuple[float, float, float]]]:
    """A synthetic chest whose patient sits at world = R·p + shift; returns the scan and the nodules' world centres."""
    nz, ny, nx = SHAPE
    origin = tuple(-n * s / 2 for n, s in zip((nx, ny, nz), SPACING, strict=True))
    rot = _rotation_z(turn_deg)
    wz, wy, wx = np.meshgrid(*[origin[i] + np.arange(n) * SPACING[i] for i, n in ((2, nz), (1, ny), (0, nx))],
                             indexing="ij")  # fmt: skip
    world = np.stack([wx - shift[0], wy - shift[1], wz - shift[2]], axis=-1)
    x, y, z = np.moveaxis(world @ rot, -1, 0)  # patient coordinates: R^T (w - shift)
    hu = np.full(SHAPE, -1000.0, dtype=np.float32)
    body = (x / 120) ** 2 + (y / 90) ** 2 <= 1
    hu[body] = -100.0  # fat
    muscle = (x / 112) ** 2 + (y / 82) ** 2 <= 1
    hu[muscle] = 40.0 + 40.0 * np.sin(x[muscle] / 20.0) * np.sin(y[muscle] / 15.0 + z[muscle] / 30.0)
    for cx in (-55.0, 55.0):
        hu[((x - cx) / 45) ** 2 + (y / 60) ** 2 + (z / 62) ** 2 <= 1] = -850.0
    hu[((x - 5) / 30) ** 2 + ((y + 25) / 28) ** 2 + ((z + 25) / 35) ** 2 <= 1] = 60.0  # heart
    hu[(x**2 + (y - 68) ** 2) <= 15**2] = 350.0  # spine
    centres = []
    for (cx, cy, cz), d, kind in nodules:
        inside = (x - cx) ** 2 + (y - cy) ** 2 + (z - cz) ** 2 <= (d / 2) ** 2
        hu[inside] = 40.0 if kind == "solid" else -550.0
        w = rot @ np.array([cx, cy, cz]) + np.array(shift)
        centres.append((float(w[0]), float(w[1]), float(w[2])))
    image = sitk.GetImageFromArray(hu)
    image.SetSpacing(SPACING)
    hu = sitk.GetArrayFromImage(sitk.SmoothingRecursiveGaussian(image, 1.0))  # the scanner's blur (mm), as on CT
    hu += np.random.default_rng(seed).normal(0.0, 8.0, SHAPE).astype(np.float32)
    hu = np.clip(hu, -1024.0, 3000.0)
    scan = Scan(hu=hu, spacing=SPACING, origin=origin, direction=IDENTITY, source="synthetic chest")  # type: ignore[arg-type]
    return scan, centres


def write_mhd(scan: Scan, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(sitk.Cast(scan.to_image(), sitk.sitkInt16), str(path))
    return path


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def nearest(report: Report, world: tuple[float, float, float]) -> Any:
    found = min(report.findings, key=lambda f: math.dist(f.lesion.centre_world, world))
    assert math.dist(found.lesion.centre_world, world) < 3.0, f"no nodule found near {world}"
    return found


# ---------------------------------------------------------------- baseline
@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path, list[tuple[float, float, float]]]:
    folder = tmp_path_factory.mktemp("baseline")
    scan, centres = chest(BASELINE)
    report = analyze(write_mhd(scan, folder / "chest.mhd"), out=folder / "out", patient=None)
    return report, folder / "out", centres


def test_every_nodule_is_found_measured_and_typed(
    baseline: tuple[Report, Path, list[tuple[float, float, float]]],
) -> None:
    report, _, centres = baseline
    assert len(report.findings) == len(BASELINE)
    for (_, diameter, kind), centre in zip(BASELINE, centres, strict=True):
        les = nearest(report, centre).lesion
        assert les.kind == kind
        assert abs(les.lungrads_mean_mm - diameter) <= SPACING[0], (les.axes, diameter)
        assert les.volume_mm3 == pytest.approx(math.pi / 6 * diameter**3, rel=0.35)
        assert les.lungrads_mean_mm == lungrads.mean_diameter(les.axes.long_mm, les.axes.short_mm)


def test_grades_follow_the_measured_size_and_type(
    baseline: tuple[Report, Path, list[tuple[float, float, float]]],
) -> None:
    report, _, centres = baseline
    big, small, ggo = (nearest(report, c) for c in centres)
    assert (big.lungrads.category, small.lungrads.category, ggo.lungrads.category) == ("4A", "4A", "2")
    assert report.exam.category == "4A" and "most suspicious of 3" in report.exam.reason
    # Brock: the scan gives size (the long axis), type, count and upper lobe (upper half of the lungs' extent)
    assert big.upper_lobe and not small.upper_lobe and ggo.upper_lobe
    assert big.risk is not None and small.risk is not None
    assert big.risk.input("nodule count").value == 3
    assert big.risk.input("nodule size (longest diameter, mm)").value == big.lesion.axes.long_mm
    assert big.risk.input("upper lobe").source == "scan" and big.risk.input("age (years)").source == "default"
    assert big.risk.probability > small.risk.probability
    assert big.radiomics is not None and big.radiomics["original_shape_VoxelVolume"] > 0
    assert {s.name for s in report.stages if s.status == "ran"} >= {
        "read", "lung mask", "detect", "segment + measure", "malignancy", "radiomics", "Lung-RADS"}  # fmt: skip


def test_the_report_files_exist_and_parse(baseline: tuple[Report, Path, list[tuple[float, float, float]]]) -> None:
    report, out, _ = baseline
    data = json.loads((out / "report.json").read_text())
    assert data["schema"] == SCHEMA and data["disclaimer"] == "decision support, not a medical device"
    assert data["phantom"] is False and data["prior"] is None
    assert data["scan"]["size_xyz"] == [128, 112, 48] and data["scan"]["spacing_mm_xyz"] == [2.0, 2.0, 3.0]
    assert data["exam"]["category"] == report.exam.category
    assert [n["id"] for n in data["nodules"]] == [f.lesion.id for f in report.findings]
    first = data["nodules"][0]
    assert first["mean_diameter_mm"] == round(first["mean_diameter_mm"], 1)
    assert len(first["position"]["world_mm_lps"]) == 3 and all(
        isinstance(v, int) for v in first["position"]["voxel_xyz"]
    )
    assert {i["source"] for i in first["malignancy"]["inputs"]} == {"scan", "default"}
    assert first["lung_rads"]["version"] == "Lung-RADS v2022" and first["lung_rads"]["follow_up"]
    assert all(s["seconds"] is not None for s in data["stages"] if s["status"] == "ran")
    for n in data["nodules"]:
        assert png_size(out / n["picture"]) == (NODULE_PX, NODULE_PX)
    assert png_size(out / data["pictures"]["overview"]) == (OVERVIEW_PX, OVERVIEW_PX)
    lines = (out / "summary.txt").read_text().splitlines()
    assert lines[0] == DISCLAIMER
    assert sum(line.startswith("  N") for line in lines) == len(report.findings)
    assert any(line.startswith("Exam: Lung-RADS 4A. Follow-up: 3-month LDCT") for line in lines)


# ---------------------------------------------------------------- follow-up
# The prior, 240 days earlier: the big nodule was 8 mm (it grew), the small one the same, the ground-glass one
# absent (it is new), and a 9 mm solid nodule that has since resolved. The patient lay 6 mm further left, 4 mm
# lower, 9 mm along the table and turned by 3 degrees.
PRIOR: list[Nodule] = [
    ((-55.0, 5.0, 30.0), 8.0, "solid"),
    ((55.0, -15.0, -30.0), 9.0, "solid"),
    ((-50.0, -25.0, -20.0), 9.0, "solid"),
]
DAYS = 240.0


@pytest.fixture(scope="module")
def followup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    folder = tmp_path_factory.mktemp("followup")
    current, _ = chest(BASELINE)
    prior, _ = chest(PRIOR, shift=(6.0, 4.0, -9.0), turn_deg=3.0, seed=1)
    report = analyze(write_mhd(current, folder / "current.mhd"), prior_path=write_mhd(prior, folder / "prior.mhd"),
                     interval_days=DAYS, out=folder / "out")  # fmt: skip
    return report, folder / "out"


def test_followup_matches_grows_and_finds_new_and_resolved(followup: tuple[Report, Path]) -> None:
    report, out = followup
    _, centres = chest(BASELINE)
    big, small, ggo = (nearest(report, c) for c in centres)
    assert big.status == small.status == "matched" and ggo.status == "new"
    assert big.growth is not None and small.growth is not None and ggo.growth is None
    assert big.growth.diameter.status == "growing" and small.growth.diameter.status == "stable"
    truth_vdt = DAYS * math.log(2) / math.log((12.0 / 8.0) ** 3)
    assert big.growth.volume_doubling_days == pytest.approx(truth_vdt, rel=0.3)
    assert big.growth.distance_mm < 3.0  # the registration put the prior nodule back on the current one
    assert big.lungrads.category == "4B"  # solid, growing, >= 8 mm
    assert small.lungrads.category == "3"  # stable: followed as 4A (its prior size at baseline), steps down to 3
    assert ggo.lungrads.category == "2"  # new ground-glass < 30 mm
    (resolved,) = report.resolved
    assert resolved.lesion.kind == "solid" and abs(resolved.lesion.lungrads_mean_mm - 9.0) <= SPACING[0]
    assert report.exam.category == "4B"
    data = json.loads((out / "report.json").read_text())
    assert data["prior"]["resolved"] == [resolved.lesion.id] and data["prior"]["interval_days"] == DAYS
    node = next(n for n in data["nodules"] if n["id"] == big.lesion.id)
    assert node["growth"]["prior_id"] == big.growth.prior_id and node["growth"]["volume_doubling_time_days"] > 0
    assert data["prior"]["registration"]["translation_mm"] is not None
    summary = (out / "summary.txt").read_text()
    assert f"Resolved (in the prior, not found now): {resolved.lesion.id}" in summary and "new (no prior" in summary


# ---------------------------------------------------------------- stages that cannot run
def test_a_missing_radiomics_stage_is_reported_as_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deskpod.lung.radiomics", None)  # as if the module were not installed
    scan, _ = chest(BASELINE[:1])
    report = analyze(write_mhd(scan, tmp_path / "chest.mhd"), out=tmp_path / "out")
    stage = report.stage("radiomics")
    assert stage.status == "not run" and stage.seconds is None and "deskpod.lung.radiomics is missing" in stage.note
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["nodules"][0]["radiomics"] is None and "not run" in data["nodules"][0]["radiomics_note"]
    assert "Not run: radiomics" in (tmp_path / "out" / "summary.txt").read_text()
    assert data["exam"]["category"] == "4A"  # everything else still ran


def test_without_detection_the_exam_is_incomplete_not_negative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deskpod.lung.candidates", None)
    scan, _ = chest(BASELINE[:1])
    report = analyze(write_mhd(scan, tmp_path / "chest.mhd"), out=tmp_path / "out")
    assert report.findings == () and report.stage("detect").status == "not run"
    assert report.exam.category == "0" and "nodule detection did not run" in report.exam.reason
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "Nodules: detection did not run" in summary and "none found" not in summary


def test_a_scan_under_a_phantom_folder_is_labelled(tmp_path: Path) -> None:
    scan, _ = chest([])
    report = analyze(write_mhd(scan, tmp_path / "PHANTOM-set" / "chest.mhd"), out=tmp_path / "out")
    assert report.phantom and report.findings == () and report.exam.category == "1"
    assert json.loads((tmp_path / "out" / "report.json").read_text())["phantom_label"].startswith("PHANTOM DATA")
    lines = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert lines[0] == DISCLAIMER and lines[1].startswith("PHANTOM DATA")


# ---------------------------------------------------------------- the command
def test_the_command_prints_the_summary_or_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scan, _ = chest(BASELINE[:1])
    path = write_mhd(scan, tmp_path / "chest.mhd")
    assert main(["lung", "analyze", str(path), "--out", str(tmp_path / "a"), "--age", "70", "--sex", "female"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(DISCLAIMER) and "N1: solid" in text
    assert main(["lung", "analyze", str(path), "--out", str(tmp_path / "b"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads((tmp_path / "b" / "report.json").read_text())
    first = json.loads((tmp_path / "a" / "report.json").read_text())["nodules"][0]["malignancy"]
    sources = {i["name"]: (i["value"], i["source"]) for i in first["inputs"]}
    assert sources["age (years)"] == (70.0, "given") and sources["sex"] == ("female", "given")
    assert first["probability"] > data["nodules"][0]["malignancy"]["probability"]  # older, female: higher risk


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    scan, _ = chest([])
    (tmp / "empty").mkdir()
    (tmp / "empty" / "notes.txt").write_text("not dicom")
    water = Scan(hu=np.where(scan.hu > -900, 0.0, -1000.0).astype(np.float32), spacing=scan.spacing,
                 origin=scan.origin, direction=scan.direction)  # fmt: skip
    water.hu[:, 10:-10, 10:-10] = 0.0  # a body with no air inside
    current = write_mhd(scan, tmp / "current.mhd")
    # A prior of noise with one air-filled box (its "lungs"): it has lungs to mask but nothing to register onto.
    shuffled = np.random.default_rng(0).uniform(-300.0, 1500.0, scan.hu.shape).astype(np.float32)
    z, y, x = (n // 4 for n in scan.hu.shape)
    shuffled[z : 3 * z, y : 3 * y, x : 3 * x] = -900.0
    noise = Scan(hu=shuffled, spacing=scan.spacing, origin=scan.origin, direction=scan.direction)
    return [
        ([str(tmp / "empty")], "no CT series in this folder"),
        ([str(write_dicom_series(scan, tmp / "gap", skip=20))], "missing slices"),
        ([str(write_dicom_series(scan, tmp / "mixed", spacing_of={5: 0.7}))], "mixed pixel spacing"),
        ([str(write_dicom_series(scan, tmp / "mr", modality="MR"))], "no CT series (modality MR)"),
        ([str(write_mhd(water, tmp / "water.mhd"))], "no lungs found in this scan"),
        ([str(current), "--prior", str(write_mhd(noise, tmp / "noise.mhd")), "--interval-days", "90"],
         "registration of"),
        ([str(current), "--prior", str(current)], "give the interval between the scans"),
        ([str(current), "--interval-days", "90"], "needs a prior scan"),
        ([str(current), "--max-nodules", "0"], "max_nodules 0 is not valid"),
        ([str(current), "--detector", str(tmp / "no-run")], "no such run folder"),
        ([str(tmp / "missing.mhd")], "no such file or folder"),
    ]  # fmt: skip


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in _bad_inputs(tmp_path):
        out = tmp_path / "out"
        assert main(["lung", "analyze", *argv, "--out", str(out)]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.startswith("deskpod: ") and err.count("\n") == 1, (argv, err)
        assert not out.exists(), argv  # no report with measurements it could not make


def test_the_library_refuses_bad_intervals(tmp_path: Path) -> None:
    from datetime import date

    from deskpod.lung.analyze import interval_between

    assert interval_between(None, date(2025, 1, 1), date(2025, 7, 1)) == 181.0
    with pytest.raises(ConfigError, match="is not before"):
        interval_between(None, date(2025, 7, 1), date(2025, 1, 1))
    with pytest.raises(ConfigError, match="go together"):
        interval_between(None, date(2025, 7, 1), None)
    with pytest.raises(ConfigError, match="-5 days is not valid"):
        interval_between(-5, None, None)


# ---------------------------------------------------------------- helper A's phantom follow-up pair
@pytest.fixture(scope="module")
def phantom_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, dict[str, Any]]:
    from deskpod.lung.phantom import write_followup

    folder = write_followup(tmp_path_factory.mktemp("pair") / "pair", seed=0, days=365, shape=(48, 160, 160))
    truth = json.loads((folder / "truth.json").read_text())
    report = analyze(folder / "current.mhd", prior_path=folder / "prior.mhd", interval_days=truth["days"])
    return report, truth


def test_the_phantom_followup_pair_is_found_measured_and_followed(
    phantom_pair: tuple[Report, dict[str, Any]],
) -> None:
    report, truth = phantom_pair
    assert report.phantom and "PHANTOM.txt" in report.phantom_reason
    nodules = {n["name"]: n for n in truth["nodules"]}
    found = {name: nearest(report, tuple(n["current"]["world_xyz"])) for name, n in nodules.items() if n["current"]}
    for name, f in found.items():
        assert abs(f.lesion.lungrads_mean_mm - nodules[name]["current"]["diameter_mm"]) <= 1.5, (name, f.lesion.axes)
        assert f.lesion.kind == nodules[name]["kind"], name
    grew, stable, new = found["growing"], found["stable"], found["new"]
    assert grew.growth is not None and grew.growth.diameter.status == "growing"
    assert grew.growth.volume_doubling_days == pytest.approx(nodules["growing"]["vdt_days"], rel=0.3)
    assert stable.growth is not None and stable.growth.diameter.status == "stable"
    assert stable.lesion.solid_lungrads_mean_mm is not None
    assert abs(stable.lesion.solid_lungrads_mean_mm - nodules["stable"]["solid_mm"]) <= 1.5
    assert new.status == "new" and new.growth is None
    gone = nodules["resolved"]["prior"]["world_xyz"]
    assert any(math.dist(p.lesion.centre_world, gone) < 3.0 for p in report.resolved)
    assert grew.lungrads.category == "4B" and report.exam.category == "4B"


def test_odd_values_become_null_with_a_word_never_a_crash(followup: tuple[Report, Path]) -> None:
    from dataclasses import replace

    from deskpod.lung.report import summary, to_json

    report, _ = followup
    i, f = next((i, f) for i, f in enumerate(report.findings) if f.growth is not None)
    assert f.growth is not None and f.risk is not None
    odd = replace(
        f, growth=replace(f.growth, volume_doubling_days=math.inf), risk=replace(f.risk, probability=math.nan)
    )
    findings = (*report.findings[:i], odd, *report.findings[i + 1 :])
    odd_report = replace(report, findings=findings, registration=report.registration | {"metric": math.nan})  # type: ignore[operator]
    data = json.loads(json.dumps(to_json(odd_report), allow_nan=False))
    node = data["nodules"][i]
    assert node["growth"]["volume_doubling_time_days"] is None
    assert node["growth"]["volume_doubling_time"] == "never doubles (volume unchanged)"
    assert node["malignancy"]["probability"] is None and data["prior"]["registration"]["metric"] is None
    text = summary(odd_report)
    assert "VDT never doubles" in text and "Brock nan" not in text
