"""The index: one SQLite database (WAL) of streams and tracks, with the tracks' thumbnails beside it.

Tables:

- ``streams``: one row per source (name, location, live), its progress (``last_pts``: the time of the last frame
  whose detections are committed), state (``indexing``, ``done``, ``failed``) and the error that stopped it.
- ``tracks``: one row per track: stream, label, ``start``/``end`` (seconds, as `sources.Frame.pts`), ``boxes``
  (JSON ``[[t, x1, y1, x2, y2, score], ...]``), the best thumbnail's file, the face embedding (128 float32,
  unit length), ``open`` (1 while the indexer may still extend it) and ``indexed`` (1 once its face is in the
  face index beside the database, `search.sync_index`).

A batch is committed in one transaction: the tracks it created or extended, and each stream's ``last_pts``. An
indexer killed at any point therefore leaves the database as of its last commit; a restart (`Store.resume`)
closes the tracks that were open (they end at their last committed box) and reads each file from just after
its ``last_pts``, so no frame is counted twice and no track is written twice. Thumbnails are written (atomically)
before the commit that names them; one left by a batch that never committed is overwritten by the next.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deskpod.errors import DataError
from deskpod.video.faces import DIM

SCHEMA = """
CREATE TABLE IF NOT EXISTS streams (
    name TEXT PRIMARY KEY,
    location TEXT NOT NULL,
    live INTEGER NOT NULL,
    last_pts REAL,
    state TEXT NOT NULL DEFAULT 'indexing',
    error TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS tracks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL REFERENCES streams(name),
    label TEXT NOT NULL,
    start REAL NOT NULL,
    end REAL NOT NULL,
    boxes TEXT NOT NULL,
    thumbnail TEXT NOT NULL DEFAULT '',
    embedding BLOB,
    open INTEGER NOT NULL DEFAULT 1,
    indexed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tracks_stream_time ON tracks(stream, start, end);
"""


@dataclasses.dataclass(slots=True)
class TrackRow:
    """A track as stored."""

    id: int
    """Its id in the database (also its id in the face index)."""
    stream: str
    label: str
    start: float
    """Time of its first box (seconds: within the file, or Unix time for a live stream)."""
    end: float
    """Time of its last box."""
    boxes: list[list[float]]
    """``[t, x1, y1, x2, y2, score]`` per sampled frame it was seen in."""
    thumbnail: str
    """File name of its best crop, in `Store.thumbnails` ("" when none)."""
    embedding: np.ndarray | None
    """Its face vector (unit length, 128 float32), for face tracks."""


@dataclasses.dataclass(slots=True)
class StreamRow:
    name: str
    location: str
    live: bool
    last_pts: float | None
    state: str
    error: str


class Store:
    """The database at ``path`` (created with its folder when missing) and its thumbnail folder beside it."""

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise DataError(f"{self.path}: no such index database (make one with: deskpod video index SOURCE --db DB)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.thumbnails = self.path.with_name(self.path.name + ".thumbs")
        try:
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
        except sqlite3.DatabaseError as e:
            raise DataError(f"{self.path}: not a deskpod video index ({e})") from e

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- indexing

    def resume(self, name: str, location: str, live: bool) -> float | None:
        """Register a stream (or find it again): close its open tracks, and return its ``last_pts``."""
        with self.transaction():
            self.db.execute(
                "INSERT INTO streams(name, location, live) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                "location=excluded.location, live=excluded.live, state='indexing', error=''",
                (name, location, int(live)),
            )
            self.db.execute("UPDATE tracks SET open=0 WHERE stream=? AND open=1", (name,))
            row = self.db.execute("SELECT last_pts FROM streams WHERE name=?", (name,)).fetchone()
        return None if row[0] is None else float(row[0])

    @staticmethod
    def _blob(v: np.ndarray | None) -> bytes | None:
        return None if v is None else np.asarray(v, dtype=np.float32).reshape(DIM).tobytes()

    def new_track(self, row: TrackRow) -> int:
        """Insert a track (inside the batch's transaction) and return its id."""
        cur = self.db.execute(
            "INSERT INTO tracks(stream, label, start, end, boxes, thumbnail, embedding) VALUES (?,?,?,?,?,?,?)",
            (
                row.stream,
                row.label,
                row.start,
                row.end,
                json.dumps(row.boxes),
                row.thumbnail,
                self._blob(row.embedding),
            ),
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def update_track(self, row: TrackRow, *, closed: bool = False) -> None:
        self.db.execute(
            "UPDATE tracks SET end=?, boxes=?, thumbnail=?, embedding=?, open=? WHERE id=?",
            (row.end, json.dumps(row.boxes), row.thumbnail, self._blob(row.embedding), 0 if closed else 1, row.id),
        )

    def set_progress(self, stream: str, last_pts: float) -> None:
        self.db.execute("UPDATE streams SET last_pts=? WHERE name=?", (last_pts, stream))

    def finish(self, stream: str, error: str = "") -> None:
        """Mark a stream done (or failed, with its error) and close its tracks."""
        with self.transaction():
            self.db.execute(
                "UPDATE streams SET state=?, error=? WHERE name=?", ("failed" if error else "done", error, stream)
            )
            self.db.execute("UPDATE tracks SET open=0 WHERE stream=? AND open=1", (stream,))

    class _Tx:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self) -> None:
            self.db.execute("BEGIN IMMEDIATE")

        def __exit__(self, kind: object, *rest: object) -> None:
            self.db.execute("ROLLBACK" if kind else "COMMIT")

    def transaction(self) -> Store._Tx:
        """One transaction (``with store.transaction(): ...``): all its writes or none."""
        return Store._Tx(self.db)

    # --- reading

    def streams(self) -> list[StreamRow]:
        rows = self.db.execute("SELECT name, location, live, last_pts, state, error FROM streams ORDER BY name")
        return [StreamRow(r[0], r[1], bool(r[2]), r[3], r[4], r[5]) for r in rows]

    def tracks(
        self,
        *,
        ids: Sequence[int] | None = None,
        stream: str | None = None,
        label: str | None = None,
        since: float | None = None,
        until: float | None = None,
        with_embedding: bool = False,
    ) -> list[TrackRow]:
        """Tracks, oldest first, filtered: of ``stream``, of ``label``, overlapping [since, until]."""
        where: list[str] = []
        args: list[object] = []
        if ids is not None:
            where.append(f"id IN ({','.join('?' * len(ids))})")
            args += list(ids)
        if stream is not None:
            where.append("stream=?")
            args.append(stream)
        if label is not None:
            where.append("label=?")
            args.append(label)
        if since is not None:
            where.append("end>=?")
            args.append(since)
        if until is not None:
            where.append("start<=?")
            args.append(until)
        if with_embedding:
            where.append("embedding IS NOT NULL")
        sql = "SELECT id, stream, label, start, end, boxes, thumbnail, embedding FROM tracks"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [self._row(r) for r in self.db.execute(sql + " ORDER BY id", args)]

    def embeddings(self) -> Iterator[tuple[int, np.ndarray]]:
        """(track id, vector) of every face track, in id order."""
        for tid, blob in self.db.execute("SELECT id, embedding FROM tracks WHERE embedding IS NOT NULL ORDER BY id"):
            yield int(tid), np.frombuffer(blob, dtype=np.float32)

    @staticmethod
    def _row(r: tuple[Any, ...]) -> TrackRow:
        blob = r[7]
        emb = np.frombuffer(blob, dtype=np.float32) if isinstance(blob, bytes) else None
        return TrackRow(int(r[0]), str(r[1]), str(r[2]), float(r[3]), float(r[4]), json.loads(r[5]), str(r[6]), emb)
