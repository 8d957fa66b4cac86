"""Search the index: the tracks whose face matches a photo, best first, and their contact sheets.

The face vectors of closed tracks live in a `vectors.FaceIndex` saved beside the database (``DB.faces``), brought
up to date at each search with the tracks closed since (the ``indexed`` mark in the store says which are in it;
a lost or damaged index file is rebuilt from the database, which stays the truth). Tracks still open (a live
indexer is extending them) are compared directly: there are few of them.

A match is a track whose cosine similarity to the photo is at least ``threshold``. dlib's descriptor puts two
photos of one person within Euclidean distance 0.6; its raw vectors have norm ~1.43 (measured on carphone and
messi5.jpg), so 0.6 is cosine ~0.91 between unit vectors. Measured on the real clips (tests/video/test_search.py):
the carphone face against a photo from another part of the clip scores 0.96-0.98, Messi's face against it
0.90-0.91 (raw distance 0.60-0.65, at dlib's own threshold); the default, 0.93 (raw ~0.53), lies between.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from deskpod.environment.files import write_bytes
from deskpod.errors import DataError, UsageError
from deskpod.video.crops import file_crops
from deskpod.video.faces import embed_photo
from deskpod.video.sources import Source
from deskpod.video.store import Store, TrackRow
from deskpod.video.vectors import FaceIndex

THRESHOLD = 0.93
"""Least cosine similarity of a match (measured on the real clips; see the module docstring)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Match:
    """One track that matches."""

    track: int
    stream: str
    start: float
    end: float
    similarity: float
    """Cosine similarity of the track's face to the photo's (1 = the same vector)."""
    thumbnail: Path | None
    """Its best crop, beside the database."""


def index_path(db: Path) -> Path:
    return db.with_name(db.name + ".faces")


def sync_index(store: Store) -> FaceIndex:
    """The face index of ``store``'s closed tracks, loaded and brought up to date (saved when it changed)."""
    path = index_path(store.path)
    index: FaceIndex | None = None
    if path.is_file():
        try:
            index = FaceIndex.load(path)
        except DataError:
            index = None
    if index is None:
        store.db.execute("UPDATE tracks SET indexed=0")
        index = FaceIndex()
    rows = store.db.execute(
        "SELECT id, embedding FROM tracks WHERE open=0 AND indexed=0 AND embedding IS NOT NULL ORDER BY id"
    ).fetchall()
    if rows:
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        vectors = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])
        try:
            index.add(ids, vectors)
        except UsageError:  # ids already in it: the file is ahead of the marks (a crash between the two); rebuild
            store.db.execute("UPDATE tracks SET indexed=0")
            path.unlink(missing_ok=True)
            return sync_index(store)
        index.save(path)
        with store.transaction():
            store.db.executemany("UPDATE tracks SET indexed=1 WHERE id=?", [(int(i),) for i in ids])
    return index


def search_face(
    db: Path,
    photo: Path,
    *,
    top: int = 10,
    since: float | None = None,
    until: float | None = None,
    stream: str | None = None,
    threshold: float = THRESHOLD,
) -> list[Match]:
    """The tracks whose face matches the one face in ``photo``, best first (at most ``top``)."""
    if top < 1:
        raise UsageError(f"--top {top}: give a positive number of results, e.g. 10")
    if since is not None and until is not None and until < since:
        raise UsageError(f"--since {since} --until {until}: the end is before the start")
    query = embed_photo(Path(photo))
    with Store(Path(db), create=False) as store:
        if stream is not None and stream not in {s.name for s in store.streams()}:
            names = ", ".join(s.name for s in store.streams()) or "none"
            raise UsageError(f"--stream {stream}: no such stream in {db} (its streams: {names})")
        index = sync_index(store)
        scored: dict[int, float] = {}
        k = top * 8
        while True:
            found = index.search(query, k)
            ids = [i for i, s in found if s >= threshold]
            rows = {r.id: r for r in store.tracks(ids=ids, stream=stream, since=since, until=until)} if ids else {}
            scored = {i: s for i, s in found if i in rows}
            if len(scored) >= top or len(found) < k or (found and found[-1][1] < threshold):
                break
            k *= 4
        for r in store.db.execute("SELECT id, embedding FROM tracks WHERE open=1 AND embedding IS NOT NULL"):
            s = float(np.frombuffer(r[1], dtype=np.float32) @ query)
            if s >= threshold:
                scored[int(r[0])] = s
        rows = (
            {r.id: r for r in store.tracks(ids=list(scored), stream=stream, since=since, until=until)} if scored else {}
        )
        best = sorted(((s, i) for i, s in scored.items() if i in rows), reverse=True)[:top]
        return [_match(rows[i], s, store) for s, i in best]


def _match(row: TrackRow, similarity: float, store: Store) -> Match:
    thumb = store.thumbnails / row.thumbnail if row.thumbnail else None
    return Match(row.id, row.stream, row.start, row.end, similarity, thumb)


def export_sheets(db: Path, matches: Sequence[Match], out: Path, *, tiles: int = 12, columns: int = 4) -> list[Path]:
    """One contact sheet (JPEG) per match in ``out``: crops of the track at up to ``tiles`` times along it, read
    again from its file (a live stream's past is gone: its sheet is its thumbnail)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with Store(Path(db), create=False) as store:
        locations = {s.name: (s.location, s.live) for s in store.streams()}
        for m in matches:
            row = store.tracks(ids=[m.track])[0]
            location, live = locations[row.stream]
            crops: list[np.ndarray] = []
            if not live and Path(location).is_file():
                step = max(1, len(row.boxes) // tiles)
                crops = _tiles(Source(row.stream, location, live=False), row.id, row.boxes[::step][:tiles])
            if not crops and m.thumbnail is not None and m.thumbnail.is_file():
                thumb = cv2.imread(str(m.thumbnail))
                crops = [thumb] if thumb is not None else []
            if not crops:
                continue
            path = out / f"track-{m.track}-{_safe(row.stream)}.jpg"
            ok, jpg = cv2.imencode(".jpg", _sheet(crops, columns))
            if ok:
                write_bytes(path, jpg.tobytes())
                written.append(path)
    return written


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:60]


def _tiles(source: Source, track: int, boxes: list[list[float]]) -> list[np.ndarray]:
    """Crops of ``track`` at ``boxes`` (`crops.file_crops`: the file decoded once), each stamped with its time."""
    tiles = []
    for _, crops in file_crops(source, {track: boxes}):
        for c in crops:
            tile = c.image.copy()
            cv2.putText(tile, f"{c.t:.1f}s", (2, 12), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 255, 255), 1)
            tiles.append(tile)
    return tiles


def _sheet(crops: list[np.ndarray], columns: int, height: int = 128) -> np.ndarray:
    tiles = [cv2.resize(c, (max(1, round(c.shape[1] * height / c.shape[0])), height)) for c in crops]
    width = max(t.shape[1] for t in tiles)
    tiles = [cv2.copyMakeBorder(t, 0, 0, 0, width - t.shape[1], cv2.BORDER_CONSTANT) for t in tiles]
    rows = []
    for r in range(0, len(tiles), columns):
        row = tiles[r : r + columns]
        row += [np.zeros_like(tiles[0])] * (columns - len(row)) if len(tiles) > columns else []
        rows.append(np.hstack(row))
    return np.vstack(rows)
