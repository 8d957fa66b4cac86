"""Alert rules (``deskpod video watch --rules rules.toml``): typed, validated where they enter, judged per track.

A rules file is a list of ``[[rule]]`` tables, each of one kind::

    [[rule]]
    name = "suspect"                 # optional: letters, digits, . _ - (default: kind and a hash of the rule)
    kind = "face"                    # a face from a watch list appears
    photos = ["suspect.jpg"]         # one face per photo; paths are relative to the rules file
    threshold = 0.93                 # least cosine similarity (default: `search.THRESHOLD`, as `video search`)

    [[rule]]
    kind = "enter"                   # a person enters a region
    region = [[440, 280], [560, 280], [560, 340], [440, 340]]   # polygon, pixels of the frame
    label = "person"                 # "person" (default) or "face"
    anchor = "bottom"                # the box's point that must be inside: "bottom" (its bottom-centre, where a
                                     # person stands; default) or "center"
    streams = ["door.mp4"]           # optional: only these streams (their names in the index)

    [[rule]]
    kind = "loiter"                  # stays in a region longer than `seconds`
    region = [[615, 405], [705, 405], [705, 465], [615, 465]]
    seconds = 30

Each rule judges one track at a time, from what the store holds of it (`store.TrackRow`): the same track gives the
same verdict however often it is judged, so the follower (`watch`) can judge a track again as it grows, or after
a restart, and the alerts table keeps one alert per (rule, track).

- face: the track's face vector (the mean of its first sightings, `indexer`) against each photo's; the alert
  comes when the best similarity reaches ``threshold``. Its time is the track's last box then.
- enter: the first box whose anchor is inside the region (a track first seen inside counts: it appeared there).
- loiter: the anchor stays inside for ``seconds`` of stream time, box after box (one box outside starts again);
  the alert's time is the box at which it had stayed that long.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from deskpod.errors import ConfigError, DataError
from deskpod.jobs.kinds.watch_rules import ANCHORS, EXAMPLE, FIELDS, KINDS, LABELS, RuleTable, check_rules
from deskpod.video.store import TrackRow

__all__ = ["ANCHORS", "FIELDS", "KINDS", "LABELS", "EnterRule", "FaceRule", "Hit", "LoiterRule", "Region", "Rule",
           "load_rules", "parse_rules"]  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Hit:
    """A rule's verdict on a track: it fires."""

    t: float
    """Stream time of the box at which it fired (seconds, as the track's boxes)."""
    detail: dict[str, Any]
    """What made it fire: the photo and similarity, or where and how long."""


@dataclasses.dataclass(frozen=True, slots=True)
class Region:
    """A polygon in the frame's pixels."""

    points: tuple[tuple[float, float], ...]
    """Its corners, in order (at least three; the last joins the first)."""
    _contour: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_contour", np.asarray(self.points, dtype=np.float32).reshape(-1, 1, 2))

    def contains(self, x: float, y: float) -> bool:
        """Whether (x, y) is inside or on the border (OpenCV's pointPolygonTest)."""
        return cv2.pointPolygonTest(self._contour, (float(x), float(y)), False) >= 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Rule:
    name: str
    """Its name: alerts and the watcher's position are stored by it."""
    streams: tuple[str, ...] = ()
    """Only these streams (empty: every stream)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FaceRule(_Rule):
    """A face from a watch list appears."""

    photos: tuple[Path, ...]
    """The watch list: one face per photo."""
    threshold: float
    """Least cosine similarity of a track's face to a photo's for an alert."""
    vectors: np.ndarray = dataclasses.field(repr=False, compare=False)
    """The photos' face vectors (``len(photos)`` x 128, unit length), embedded when the rules are loaded."""

    kind = "face"

    def judge(self, track: TrackRow) -> Hit | None:
        if track.embedding is None or (self.streams and track.stream not in self.streams):
            return None
        sims = self.vectors @ np.asarray(track.embedding, dtype=np.float32)
        best = int(np.argmax(sims))
        if sims[best] < self.threshold:
            return None
        return Hit(track.end, {"photo": self.photos[best].name, "similarity": round(float(sims[best]), 4)})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _RegionRule(_Rule):
    region: Region
    label: str = "person"
    """Tracks of this label only."""
    anchor: str = "bottom"
    """The box's point that must be inside: "bottom" (bottom-centre: a person's feet) or "center"."""

    def inside(self, track: TrackRow) -> list[tuple[float, float, float, bool]]:
        """(t, x, y, inside) of the anchor of each box, in time order; none for a track this rule does not watch."""
        if track.label != self.label or (self.streams and track.stream not in self.streams):
            return []
        out = []
        for t, x1, y1, x2, y2, _score in sorted(track.boxes, key=lambda b: b[0]):
            x, y = (x1 + x2) / 2, y2 if self.anchor == "bottom" else (y1 + y2) / 2
            out.append((t, x, y, self.region.contains(x, y)))
        return out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EnterRule(_RegionRule):
    """A track of ``label`` enters a region."""

    kind = "enter"

    def judge(self, track: TrackRow) -> Hit | None:
        first = next((p for p in self.inside(track) if p[3]), None)
        return None if first is None else Hit(first[0], {"x": round(first[1], 1), "y": round(first[2], 1)})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LoiterRule(_RegionRule):
    """A track of ``label`` stays inside a region at least ``seconds``."""

    seconds: float
    """Stream time it must stay inside, box after box."""

    kind = "loiter"

    def judge(self, track: TrackRow) -> Hit | None:
        since: float | None = None
        for t, _x, _y, inside in self.inside(track):
            since = (since if since is not None else t) if inside else None
            if since is not None and t - since >= self.seconds:
                return Hit(t, {"entered": since, "seconds": round(t - since, 3)})
        return None


Rule = FaceRule | EnterRule | LoiterRule


# --- parsing


def load_rules(path: Path) -> list[Rule]:
    """The rules of the TOML file at ``path``, validated, with the watch lists' photos embedded.

    Raises `ConfigError` (or `DataError` for a photo) with one line naming the file, the rule, the bad key and
    value, and what is valid."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such rules file (a TOML file of [[rule]] tables; docs/video.md)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    return parse_rules(data, source=str(path), base_dir=path.parent)


def parse_rules(
    data: Mapping[str, Any], *, source: str = "rules", base_dir: Path | None = Path(), key: str = "rule"
) -> list[Rule]:
    """`load_rules` for decoded TOML (``data[key]``, the list of rule tables); ``source`` names it in errors;
    photos are relative to ``base_dir`` (None: they must be absolute paths, as in a video job's spec)."""
    unknown = sorted(k for k in data if k != key)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} at the top; a rules file holds only [[rule]] tables")
    from deskpod.video.search import THRESHOLD

    tables = check_rules(data.get(key), source, base_dir=base_dir, threshold=THRESHOLD,
                         example=f'add one or more [[rule]] tables, e.g. [[rule]] kind = "enter" {EXAMPLE["enter"]}')  # fmt: skip
    return [_build(t, f"{source}: rule {i} ({t.kind})") for i, t in enumerate(tables, 1)]


def _build(t: RuleTable, where: str) -> Rule:
    if t.kind == "face":
        assert t.threshold is not None
        return FaceRule(name=t.name, streams=t.streams, photos=t.photos, threshold=t.threshold,
                        vectors=_embed(t.photos, where))  # fmt: skip
    region = Region(t.region)
    if t.kind == "enter":
        return EnterRule(name=t.name, streams=t.streams, region=region, label=t.label, anchor=t.anchor)
    return LoiterRule(name=t.name, streams=t.streams, region=region, label=t.label, anchor=t.anchor, seconds=t.seconds)


def _embed(photos: Sequence[Path], where: str) -> np.ndarray:
    from deskpod.video.faces import FaceEmbedder, embed_photo

    embedder = FaceEmbedder()
    vectors = []
    for p in photos:
        try:
            vectors.append(embed_photo(p, embedder))
        except DataError as e:
            raise DataError(f"{where}: photos: {e}") from e
    return np.stack(vectors).astype(np.float32)
