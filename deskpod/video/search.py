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

A sharded index (a Slurm video job's: one database per node, `shards`) is searched one shard at a time, each with
its own face index, filters and threshold, and the shards' matches merged best first (`merge`); a match names its
database (`Match.db`), since track ids are numbered per database.
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
from deskpod.video.shards import databases
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
    db: Path | None = None
    """The database the track is in (a shard's, when the index is sharded: track ids are per database)."""


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
    """The tracks whose face matches the one face in ``photo``, best first (at most ``top``). A sharded index (a
    Slurm job's, `shards`) is searched shard by shard, each with its own face index and the same filters, and the
    shards' matches merged by similarity."""
    if top < 1:
        raise UsageError(f"--top {top}: give a positive number of results, e.g. 10")
    if since is not None and until is not None and until < since:
        raise UsageError(f"--since {since} --until {until}: the end is before the start")
    query = embed_photo(Path(photo))
    paths = databases(Path(db)) or [Path(db)]  # none: Store says there is no such database
    found: list[list[Match]] = []
    streams: set[str] = set()
    for path in paths:
        with Store(path, create=False) as store:
            names = {s.name for s in store.streams()}
            streams |= names
            if stream is None or stream in names:
                found.append(_search_store(store, query, top, since, until, stream, threshold))
    if stream is not None and stream not in streams:
        where = f"{db}" if paths == [Path(db)] else f"{db} and its shards"
        raise UsageError(
            f"--stream {stream}: no such stream in {where} (its streams: {', '.join(sorted(streams)) or 'none'})"
        )
    return merge(found, top)


def merge(results: Sequence[Sequence[Match]], top: int) -> list[Match]:
    """The best ``top`` of several databases' matches, by similarity (ties: in the order the databases were given,
    then by track id)."""
    ranked = [(-m.similarity, i, m.track, m) for i, ms in enumerate(results) for m in ms]
    return [m for *_, m in sorted(ranked, key=lambda r: r[:3])[:top]]


def _search_store(
    store: Store, query: np.ndarray, top: int, since: float | None, until: float | None, stream: str | None,
    threshold: float,
) -> list[Match]:  # fmt: skip
    """One database's best ``top`` matches of ``query``."""
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
    rows = {r.id: r for r in store.tracks(ids=list(scored), stream=stream, since=since, until=until)} if scored else {}
    best = sorted(((s, i) for i, s in scored.items() if i in rows), reverse=True)[:top]
    return [_match(rows[i], s, store) for s, i in best]


def _match(row: TrackRow, similarity: float, store: Store) -> Match:
    thumb = store.thumbnails / row.thumbnail if row.thumbnail else None
    return Match(row.id, row.stream, row.start, row.end, similarity, thumb, store.path)


def export_sheets(db: Path, matches: Sequence[Match], out: Path, *, tiles: int = 12, columns: int = 4) -> list[Path]:
    """One contact sheet (JPEG) per match in ``out``, in the matches' order: crops of the track at up to ``tiles``
    times along it, read again from its file (a live stream's past is gone: its sheet is its thumbnail). A match is
    read from its own database (`Match.db`: a shard's, for a sharded index), else from ``db``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    stores: dict[Path, Store] = {}
    try:
        for m in matches:
            path = m.db or Path(db)
            if path not in stores:
                stores[path] = Store(path, create=False)
            sheet = _sheet_of(stores[path], m, out, tiles, columns)
            if sheet is not None:
                written.append(sheet)
    finally:
        for store in stores.values():
            store.close()
    return written


def _sheet_of(store: Store, m: Match, out: Path, tiles: int, columns: int) -> Path | None:
    row = store.tracks(ids=[m.track])[0]
    location, live = next((s.location, s.live) for s in store.streams() if s.name == row.stream)
    crops: list[np.ndarray] = []
    if not live and Path(location).is_file():
        step = max(1, len(row.boxes) // tiles)
        crops = _tiles(Source(row.stream, location, live=False), row.id, row.boxes[::step][:tiles])
    if not crops and m.thumbnail is not None and m.thumbnail.is_file():
        thumb = cv2.imread(str(m.thumbnail))
        crops = [thumb] if thumb is not None else []
    if not crops:
        return None
    path = out / f"track-{m.track}-{_safe(row.stream)}.jpg"
    ok, jpg = cv2.imencode(".jpg", _sheet(crops, columns))
    if not ok:
        return None
    write_bytes(path, jpg.tobytes())
    return path


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
