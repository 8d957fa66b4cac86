"""Track crops: pictures of each track, cut from its source video, for a person to sort into classes.

This is the first step of finding specific objects the deskpod way: the indexer found *people* and *faces*; which
of them are the ones you want (a uniform, a delivery van's driver, one bird) is a classifier you train on your own
pictures. `write_crops` (``deskpod video crops DB --out DIR``) cuts ``per_track`` crops per track, at boxes spread
evenly along it, out of the frames of its source file (the same frames the indexer saw: a box's time is the frame's
presentation time, as `sources.read_file` computes it), and lays them out as an ``imagefolder``::

    DIR/unsorted/t000123-0.jpg ...   every crop, until someone sorts it (deskpod train skips ``unsorted/``)
    DIR/<class>/                     one empty folder per class of ``--classes a,b``: move crops here
    DIR/crops.json                   each crop's track, stream, track label, time and box, by file name

A crop's file name carries its track id, so it still names its track after it was moved. A rerun into the same DIR
adds only crops whose file is not already somewhere under it: sorting survives new tracks being cut. Then
``deskpod train --data imagefolder:DIR`` trains on the class folders, and `deskpod.video.classify` runs the trained
model over the tracks' crops, cut the same way (`track_crops`).

Each stream's file is decoded once for all its tracks, in order; a track's crops are handed on as soon as the
decoder passes its last wanted box, so memory holds only the tracks that overlap the current frame. A live stream's
past is gone: its tracks get their thumbnail (the indexer's best crop) as their one crop, and so does a track whose
file is no longer where it was indexed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from deskpod.environment.files import write_bytes, write_json
from deskpod.errors import UsageError
from deskpod.train.data import UNSORTED
from deskpod.video.sources import Source, decode, open_container, to_bgr, video_stream
from deskpod.video.store import Store, TrackRow

MARGIN = 0.1
"""Context kept around a box, as a fraction of its width and height on each side (clipped at the frame's edge)."""
JPEG_QUALITY = 95
"""Quality of the crops written, and of the crops the classifier is shown (`track_crops`), so both see the same."""
MANIFEST = "crops.json"
"""The manifest in the output folder: ``{"db": ..., "crops": {file name: {track, stream, label, t, box}}}``."""
PER_TRACK = 4
"""Crops per track by default."""
TIME_SLACK = 1e-3
"""A box belongs to the first decoded frame at or after its time, less this (the times are the same floats)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CropConfig:
    """What `write_crops` cuts."""

    label: str | None = None
    """Only tracks of this label (``person``, ``face``); None: every track."""
    min_size: int = 0
    """Only boxes whose shorter side is at least this many pixels (a track with none is skipped)."""
    per_track: int = PER_TRACK
    """Crops per track, at boxes spread evenly along it (fewer when it has fewer boxes)."""
    classes: tuple[str, ...] = ()
    """Empty class folders to make beside ``unsorted/``."""

    def __post_init__(self) -> None:
        if self.min_size < 0:
            raise UsageError(f"--min-size {self.min_size}: give a size in pixels >= 0, e.g. 48")
        if self.per_track < 1:
            raise UsageError(f"--per-track {self.per_track}: give a positive number of crops, e.g. {PER_TRACK}")
        for c in self.classes:
            if not c or c.startswith(".") or "/" in c or "\\" in c or c == UNSORTED:
                raise UsageError(
                    f"--classes: {c!r} is not a class folder name (a plain name, not hidden, not {UNSORTED!r}), "
                    "e.g. --classes courier,other"
                )
        if len(set(self.classes)) != len(self.classes):
            raise UsageError(f"--classes {','.join(self.classes)}: a class is named twice")


@dataclasses.dataclass(frozen=True, slots=True)
class Crop:
    """One picture of a track."""

    track: int
    t: float
    """The time of the frame it was cut from (as the track's boxes)."""
    box: tuple[float, float, float, float]
    """The track's box in that frame (x1, y1, x2, y2; the crop has `MARGIN` around it)."""
    image: np.ndarray
    """BGR uint8 pixels."""


@dataclasses.dataclass(slots=True)
class CropReport:
    """What `write_crops` did."""

    tracks: int = 0
    """Tracks that got at least one crop (new or already there)."""
    written: int = 0
    """Crop files written by this run."""
    existing: int = 0
    """Crops already under the output folder (sorted or not) and left as they were."""
    too_small: int = 0
    """Tracks with no box of at least ``min_size`` pixels."""
    from_thumbnail: int = 0
    """Tracks of a live stream, or of a file no longer there: their one crop is their thumbnail."""
    unsorted: Path = Path()
    """Where the new crops are."""


def pick(boxes: Sequence[list[float]], n: int, min_size: int = 0) -> list[list[float]]:
    """Up to ``n`` of a track's boxes (``[t, x1, y1, x2, y2, score]``), spread evenly along it: the first, the
    last and between; only those whose shorter side is at least ``min_size``."""
    ok = [b for b in boxes if min(b[3] - b[1], b[4] - b[2]) >= min_size]
    if len(ok) <= n:
        return ok
    return [ok[i] for i in sorted({round(float(i)) for i in np.linspace(0, len(ok) - 1, n)})]


def cut(image: np.ndarray, box: Sequence[float], margin: float = MARGIN) -> np.ndarray | None:
    """The box with ``margin`` around it, clipped to the image (a copy); None when nothing of it is inside."""
    x1, y1, x2, y2 = box
    mx, my = (x2 - x1) * margin, (y2 - y1) * margin
    h, w = image.shape[:2]
    top, bottom = max(0, int(y1 - my)), min(h, round(y2 + my))
    left, right = max(0, int(x1 - mx)), min(w, round(x2 + mx))
    if bottom <= top or right <= left:
        return None
    return image[top:bottom, left:right].copy()


def file_crops(source: Source, wanted: dict[int, list[list[float]]]) -> Iterator[tuple[int, list[Crop]]]:
    """(track id, its crops) for every track of ``wanted`` (id -> the boxes to cut), decoding ``source`` once;
    each track as soon as the decoder has passed its last box. Raises `StreamError` for an unreadable file."""
    events = sorted((b[0], tid, i) for tid, boxes in wanted.items() for i, b in enumerate(boxes))
    remaining = {tid: len(boxes) for tid, boxes in wanted.items()}
    got: dict[int, list[Crop]] = {tid: [] for tid in wanted}
    container = open_container(source, 30.0)
    try:
        stream = video_stream(container, source, 0)
        base = stream.time_base or Fraction(1, 90000)
        start = float(stream.start_time * base) if stream.start_time is not None else 0.0
        if events and events[0][0] > 1.0:  # to the keyframe before the first box: the same frames, less decoding
            container.seek(int((events[0][0] + start - 1.0) / base), stream=stream, backward=True, any_frame=False)
        j = 0
        for frame in decode(container, stream, source):
            if j >= len(events):
                break
            if frame.pts is None:
                continue
            t = float(frame.pts * base) - start
            image: np.ndarray | None = None
            while j < len(events) and t + TIME_SLACK >= events[j][0]:
                _, tid, i = events[j]
                j += 1
                box = wanted[tid][i]
                image = to_bgr(frame) if image is None else image
                piece = cut(image, box[1:5])
                if piece is not None:
                    got[tid].append(Crop(tid, float(box[0]), (box[1], box[2], box[3], box[4]), piece))
                remaining[tid] -= 1
                if remaining[tid] == 0:
                    yield tid, got.pop(tid)
    finally:
        container.close()
    yield from got.items()  # boxes past the file's end (it changed since it was indexed): what was found


def _thumbnail(store: Store, row: TrackRow) -> list[Crop]:
    image = cv2.imread(str(store.thumbnails / row.thumbnail)) if row.thumbnail else None
    if image is None or not row.boxes:
        return []
    best = max(row.boxes, key=lambda b: (b[3] - b[1]) * (b[4] - b[2]))
    return [Crop(row.id, float(best[0]), (best[1], best[2], best[3], best[4]), image)]


def track_crops(
    store: Store, rows: Iterable[TrackRow], per_track: int = PER_TRACK, min_size: int = 0
) -> Iterator[tuple[TrackRow, list[Crop], bool]]:
    """(track, its crops, whether they are its thumbnail) for each of ``rows``, stream by stream; a track with no
    box of ``min_size`` gets no crops."""
    streams = {s.name: s for s in store.streams()}
    by_stream: dict[str, list[TrackRow]] = {}
    for row in rows:
        by_stream.setdefault(row.stream, []).append(row)
    for name, tracks in by_stream.items():
        info = streams.get(name)
        if info is None or info.live or not Path(info.location).is_file():
            for row in tracks:
                ok = pick(row.boxes, 1, min_size)
                yield row, (_thumbnail(store, row) if ok else []), True
            continue
        wanted = {row.id: pick(row.boxes, per_track, min_size) for row in tracks}
        by_id = {row.id: row for row in tracks}
        for tid, crops in file_crops(Source(name, info.location, live=False), wanted):
            yield by_id[tid], crops, False


def encode(image: np.ndarray) -> bytes:
    """A crop as the JPEG file `write_crops` writes (and the classifier is shown)."""
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise UsageError(f"cannot encode a {image.shape} crop as JPEG")
    return data.tobytes()


def crop_name(track: int, n: int) -> str:
    return f"t{track:06d}-{n}.jpg"


def track_of(name: str) -> int | None:
    """The track id in a crop's file name (None: not a crop's name)."""
    stem = Path(name).stem
    if not stem.startswith("t") or "-" not in stem:
        return None
    head = stem[1:].split("-", 1)[0]
    return int(head) if head.isascii() and head.isdigit() else None


def write_crops(db: Path, out: Path, config: CropConfig = CropConfig()) -> CropReport:
    """Cut the tracks of ``db`` into ``out`` as an imagefolder to sort (see the module docstring)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: not a folder")
    with Store(Path(db), create=False) as store:
        labels = sorted({r[0] for r in store.db.execute("SELECT DISTINCT label FROM tracks")})
        if config.label is not None and config.label not in labels:
            raise UsageError(
                f"--label {config.label}: {db} has no tracks of it (its labels: {', '.join(labels) or 'none'})"
            )
        unsorted = out / UNSORTED
        unsorted.mkdir(parents=True, exist_ok=True)
        for c in config.classes:
            (out / c).mkdir(exist_ok=True)
        have = {p.name for p in out.rglob("*.jpg")}
        manifest_path = out / MANIFEST
        manifest = _read_manifest(manifest_path)
        report = CropReport(unsorted=unsorted)
        rows = store.tracks(label=config.label)
        for row, crops, thumb in track_crops(store, rows, config.per_track, config.min_size):
            if not crops:
                report.too_small += 1
                continue
            report.tracks += 1
            report.from_thumbnail += thumb
            for n, crop in enumerate(crops):
                name = crop_name(row.id, n)
                manifest[name] = {"track": row.id, "stream": row.stream, "label": row.label, "t": crop.t,
                                  "box": [round(v, 1) for v in crop.box]}  # fmt: skip
                if name in have:
                    report.existing += 1
                    continue
                write_bytes(unsorted / name, encode(crop.image))
                report.written += 1
        write_json(manifest_path, {"db": str(Path(db).resolve()), "crops": manifest}, indent=1)
    return report


def _read_manifest(path: Path) -> dict[str, dict[str, object]]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a crops manifest ({e}); move it away and run again") from None
    crops = doc.get("crops") if isinstance(doc, dict) else None
    if not isinstance(crops, dict):
        raise UsageError(f"{path}: not a crops manifest (no 'crops' table); move it away and run again")
    return crops
