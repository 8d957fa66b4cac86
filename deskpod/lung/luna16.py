"""LUNA16 data for the detector: the layout, a resampled cache of the scans, and training patches.

The layout is the challenge's: ``subset0`` … ``subset9`` folders of ``<seriesuid>.mhd``/``.raw`` scans,
``annotations.csv`` (seriesuid, coordX, coordY, coordZ, diameter_mm; world mm, LPS) and ``candidates.csv``
or ``candidates_V2.csv`` (seriesuid, coordX, coordY, coordZ, class). The subsets are the folds: one is held
out for validation (``fold``), the others train.

Scans are resampled once to the training spacing and kept as ``int16`` arrays ``(x, y, z)`` — MONAI's
layout, so a box's coordinates follow the tensor's axes — in a cache folder (``.npy`` memory-mapped by the
loaders, written atomically; each rank prepares its share, the others wait for it). Patches follow
MONAI's LUNA16 detection app: HU clipped to [-1024, 300] and scaled to [0, 1]; positives are crops that
hold a whole nodule at a random offset, negatives are crops centred on the challenge's class-0 candidates
(the hard negatives), and every nodule inside a crop is one of its boxes (``StandardMode``: x1, y1, z1, x2,
y2, z2 in voxels of the crop). Which crop a sample index gives in an epoch depends on (seed, epoch, index)
only, so sharding and resuming are the trainer's, as for any dataset.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from deskpod.environment.files import replacing, write_json
from deskpod.errors import ConfigError, DataError
from deskpod.lung.images import Scan, read_scan, resample, world_to_voxel
from deskpod.train.data import Batch

HU_MIN, HU_MAX = -1024.0, 300.0
"""The intensity window of MONAI's LUNA16 detection app (ScaleIntensityRanged a_min, a_max)."""
CANDIDATE_FILES = ("candidates_V2.csv", "candidates.csv")
WAIT_S = 3600.0
"""How long a rank waits for the others to prepare their share of the cache."""


@dataclass(frozen=True, slots=True)
class Nodule:
    uid: str
    xyz: tuple[float, float, float]
    diameter_mm: float


@dataclass(frozen=True, slots=True)
class Layout:
    """A LUNA16 folder: its scans by subset, the nodules and the negative candidates of each scan."""

    root: Path
    scans: dict[str, Path]
    """seriesuid -> .mhd"""
    subset_of: dict[str, int]
    nodules: dict[str, tuple[Nodule, ...]]
    negatives: dict[str, tuple[tuple[float, float, float], ...]]

    @property
    def subsets(self) -> list[int]:
        return sorted(set(self.subset_of.values()))

    def uids(self, subsets: Sequence[int]) -> list[str]:
        want = set(subsets)
        return sorted(uid for uid, s in self.subset_of.items() if s in want)


def read_layout(root: str | Path) -> Layout:
    """Check and read a LUNA16 folder; a missing part is a `DataError` naming it and the layout expected."""
    from deskpod.lung.evaluate import read_annotations

    base = Path(root).expanduser()
    expect = "subset*/<seriesuid>.mhd (+ .raw), annotations.csv, candidates.csv or candidates_V2.csv"
    if not base.is_dir():
        raise DataError(f"luna16:{root}: no such folder; give the LUNA16 folder ({expect})")
    scans: dict[str, Path] = {}
    subset_of: dict[str, int] = {}
    for folder in sorted(base.glob("subset*")):
        number = folder.name.removeprefix("subset")
        if not folder.is_dir() or not (number.isascii() and number.isdigit()):
            continue
        for mhd in sorted(folder.glob("*.mhd")):
            scans[mhd.stem] = mhd
            subset_of[mhd.stem] = int(number)
    if not scans:
        raise DataError(f"luna16:{root}: no subset*/*.mhd scans; the LUNA16 layout is {expect}")
    if not (base / "annotations.csv").is_file():
        raise DataError(f"luna16:{root}: no annotations.csv; the LUNA16 layout is {expect}")
    found = read_annotations(base / "annotations.csv")
    nodules: dict[str, list[Nodule]] = {uid: [] for uid in scans}
    for uid, xyz, d in zip(found.seriesuid, found.xyz, found.diameter_mm, strict=True):
        if uid in nodules:
            nodules[uid].append(Nodule(uid, (float(xyz[0]), float(xyz[1]), float(xyz[2])), float(d)))
    cand_file = next((base / name for name in CANDIDATE_FILES if (base / name).is_file()), None)
    if cand_file is None:
        raise DataError(f"luna16:{root}: no candidates.csv or candidates_V2.csv; the LUNA16 layout is {expect}")
    negatives: dict[str, list[tuple[float, float, float]]] = {uid: [] for uid in scans}
    with cand_file.open(newline="") as f:
        reader = csv.DictReader(f)
        need = {"seriesuid", "coordX", "coordY", "coordZ", "class"}
        if not need <= set(reader.fieldnames or ()):
            raise DataError(f"{cand_file}: needs the columns {', '.join(sorted(need))}; it has {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            try:
                point = (float(row["coordX"]), float(row["coordY"]), float(row["coordZ"]))
                cls = int(row["class"])
            except (TypeError, ValueError):
                raise DataError(f"{cand_file}, line {line}: coordX/Y/Z must be numbers and class 0 or 1") from None
            if cls == 0 and row["seriesuid"] in negatives:
                negatives[row["seriesuid"]].append(point)
    if not any(nodules.values()):
        raise DataError(f"luna16:{root}: annotations.csv has no nodule in any of the {len(scans)} scans found")
    return Layout(base, scans, subset_of, {k: tuple(v) for k, v in nodules.items()},
                  {k: tuple(v) for k, v in negatives.items()})  # fmt: skip


def split(layout: Layout, fold: int) -> tuple[list[str], list[str]]:
    """(training scans, validation scans): subset ``fold`` is held out (-1: the last subset)."""
    subsets = layout.subsets
    if len(subsets) < 2:
        raise DataError(
            f"luna16:{layout.root}: one subset ({subsets[0]}) only; validation holds out a whole subset, so the "
            "layout needs at least two (subset0, subset1, ...)"
        )
    held = subsets[-1] if fold < 0 else fold
    if held not in subsets:
        raise ConfigError(f"fold {fold}: not a subset of {layout.root}; valid: {', '.join(map(str, subsets))}")
    return layout.uids([s for s in subsets if s != held]), layout.uids([held])


# --------------------------------------------------------------------------- the cache
@dataclass(frozen=True, slots=True)
class Volume:
    """A cached scan: HU ``int16`` ``(x, y, z)`` at the training spacing and its geometry."""

    hu: npt.NDArray[np.int16]
    spacing: tuple[float, float, float]
    origin: tuple[float, float, float]
    direction: tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, float, float]]

    def geometry(self) -> Scan:
        """A `Scan` with this geometry (for world/voxel conversions; its array is a placeholder)."""
        return Scan(np.zeros((1, 1, 1), np.float32), self.spacing, self.origin, self.direction)

    def voxel(self, world_xyz: Sequence[float]) -> npt.NDArray[np.float64]:
        return world_to_voxel(self.geometry(), world_xyz)


def cache_folder(root: Path, spacing: tuple[float, float, float], cache: str = "") -> Path:
    """Where the resampled scans of ``root`` at ``spacing`` live: ``cache`` or ``~/.cache/deskpod/luna16/<key>``."""
    key = hashlib.sha256(f"{root.resolve()}|{spacing}".encode()).hexdigest()[:16]
    base = Path(cache).expanduser() if cache else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return (base if cache else base / "deskpod" / "luna16") / key


def prepare_volume(mhd: Path, spacing: tuple[float, float, float], out: Path) -> None:
    """Resample one scan and write it (``<uid>.npy`` + ``<uid>.json``) atomically into ``out``."""
    vol = volume_of(read_scan(mhd), spacing)
    out.mkdir(parents=True, exist_ok=True)
    uid = mhd.stem
    write_json(out / f"{uid}.json", {"spacing": vol.spacing, "origin": vol.origin, "direction": vol.direction})
    with replacing(out / f"{uid}.npy") as f:  # the .npy last: its presence means the scan is ready
        np.save(f, vol.hu)


def ensure_cache(layout: Layout, uids: Sequence[str], spacing: tuple[float, float, float], folder: Path,
                 rank: int = 0, world: int = 1) -> None:  # fmt: skip
    """Prepare this rank's share of the scans (``uids[rank::world]``), then wait for the others' shares."""
    mine = list(uids)[rank::world]
    for uid in mine:
        if not (folder / f"{uid}.npy").is_file():
            prepare_volume(layout.scans[uid], spacing, folder)
    deadline = time.monotonic() + WAIT_S
    while missing := [u for u in uids if not (folder / f"{u}.npy").is_file()]:
        if time.monotonic() > deadline:
            raise DataError(
                f"{folder}: {len(missing)} scans were not prepared within {WAIT_S:.0f} s (e.g. {missing[0]})"
            )
        time.sleep(0.5)


def load_volume(folder: Path, uid: str) -> Volume:
    meta = json.loads((folder / f"{uid}.json").read_text())
    hu = np.load(folder / f"{uid}.npy", mmap_mode="r")
    d = meta["direction"]
    return Volume(hu, tuple(meta["spacing"]), tuple(meta["origin"]), (tuple(d[0]), tuple(d[1]), tuple(d[2])))  # type: ignore[arg-type]


def volume_of(scan: Scan, spacing: tuple[float, float, float]) -> Volume:
    """A scan as a `Volume` at ``spacing`` (for inference, and what the cache holds)."""
    s = resample(scan, spacing)
    hu = np.clip(np.rint(s.hu), -32768, 32767).astype(np.int16).transpose(2, 1, 0)  # (z,y,x) -> (x,y,z)
    return Volume(np.ascontiguousarray(hu), s.spacing, s.origin, s.direction)


def normalise(hu: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """HU to MONAI's [0, 1] input range (clipped at -1024 and 300 HU)."""
    out: npt.NDArray[np.float32] = (np.clip(hu.astype(np.float32), HU_MIN, HU_MAX) - HU_MIN) / (HU_MAX - HU_MIN)
    return out


# --------------------------------------------------------------------------- patches
@dataclass(frozen=True, slots=True)
class Sample:
    """One crop: its scan and the world point it is built around; positives keep their nodule inside."""

    uid: str
    xyz: tuple[float, float, float]
    radius_mm: float
    """> 0 for a positive (the nodule's radius), 0 for a negative."""


def samples_of(layout: Layout, uids: Sequence[str], negatives_per_positive: int, repeats: int = 1) -> list[Sample]:
    """Every nodule of ``uids`` ``repeats`` times (each a crop at its own random offset), and after them
    ``negatives_per_positive`` negatives per nodule crop, in turn over the scans' class-0 candidates (random
    points of the scan when it has none)."""
    positives = [Sample(n.uid, n.xyz, n.diameter_mm / 2) for uid in uids for n in layout.nodules[uid]] * repeats
    pool = [(uid, p) for uid in uids for p in layout.negatives[uid]]
    if not pool:  # no class-0 candidates: a negative is centred on a nodule-free scan point chosen per epoch
        pool = [(uid, (float("nan"),) * 3) for uid in uids]
    count = negatives_per_positive * len(positives)
    step = max(1, len(pool) // max(1, count))
    negatives = [Sample(pool[(i * step) % len(pool)][0], pool[(i * step) % len(pool)][1], 0.0) for i in range(count)]
    return positives + negatives  # type: ignore[arg-type]


class PatchSource:
    """Crops of the cached scans, for the trainer's sampler (a `deskpod.train.data.Source`)."""

    def __init__(self, layout: Layout, samples: list[Sample], folder: Path, patch: tuple[int, int, int],
                 seed: int, *, augment: bool) -> None:  # fmt: skip
        self.layout, self.samples, self.folder, self.patch = layout, samples, folder, patch
        self.seed, self.augment = seed, augment
        self._volumes: dict[str, Volume] = {}

    def __len__(self) -> int:
        return len(self.samples)

    def volume(self, uid: str) -> Volume:
        if uid not in self._volumes:
            self._volumes[uid] = load_volume(self.folder, uid)
        return self._volumes[uid]

    def crop(self, index: int, epoch: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """The crop of sample ``index`` in ``epoch``: the image ``(1, x, y, z)`` in [0, 1] and its boxes ``(n, 6)``."""
        s = self.samples[index]
        vol = self.volume(s.uid)
        rng = np.random.default_rng([self.seed, epoch if self.augment else 0, index])
        size = np.array(self.patch, dtype=np.float64)
        shape = np.array(vol.hu.shape, dtype=np.float64)
        if np.isnan(s.xyz[0]):
            centre = rng.uniform(size / 2, np.maximum(size / 2, shape - size / 2))
        else:
            centre = vol.voxel(s.xyz)
        if s.radius_mm > 0:  # a random offset that keeps the whole nodule inside the crop
            radius_vox = s.radius_mm / np.array(vol.spacing)
            room = np.maximum(0.0, size / 2 - radius_vox - 1)
            centre = centre + (rng.uniform(-room, room) if self.augment else 0.0)
        elif self.augment:
            centre = centre + rng.uniform(-size / 4, size / 4)
        start = np.floor(centre - size / 2).astype(np.int64)
        image = np.full(self.patch, HU_MIN, dtype=np.float32)
        lo = np.maximum(start, 0)
        hi = np.minimum(start + np.array(self.patch), np.array(vol.hu.shape))
        if bool(np.all(hi > lo)):
            src = vol.hu[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
            d0 = lo - start
            image[d0[0] : d0[0] + src.shape[0], d0[1] : d0[1] + src.shape[1], d0[2] : d0[2] + src.shape[2]] = src
        boxes = []
        for n in self.layout.nodules[s.uid]:
            c = vol.voxel(n.xyz) - start
            r = n.diameter_mm / 2 / np.array(vol.spacing)
            if bool(np.all(c >= 0)) and bool(np.all(c < size)):
                boxes.append(np.concatenate([np.maximum(c - r, 0), np.minimum(c + r, size)]))
        return normalise(image)[None], np.array(boxes, dtype=np.float32).reshape(-1, 6)

    def batches(self, index_batches: Iterator[Sequence[int]], epoch: int) -> Iterator[Batch]:
        for idx in index_batches:
            crops = [self.crop(i, epoch) for i in idx]
            images = torch.from_numpy(np.stack([c[0] for c in crops]))
            targets = [{"boxes": torch.from_numpy(c[1]), "labels": torch.zeros(len(c[1]), dtype=torch.long)}
                       for c in crops]  # fmt: skip
            labels = torch.tensor([int(len(c[1]) > 0) for c in crops])
            yield Batch(images, labels, targets=targets)
