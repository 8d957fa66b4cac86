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
import hashlib
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from deskpod.errors import ConfigError, DataError
from deskpod.video.store import TrackRow

KINDS = ("face", "enter", "loiter")
LABELS = ("person", "face")
"""What the detectors label tracks (`detectors.Detection.label`)."""
ANCHORS = ("bottom", "center")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
COMMON = ("name", "kind", "streams")
FIELDS = {
    "face": (*COMMON, "photos", "threshold"),
    "enter": (*COMMON, "region", "label", "anchor"),
    "loiter": (*COMMON, "region", "label", "anchor", "seconds"),
}
"""The keys each kind takes."""
EXAMPLE = {
    "face": 'photos = ["suspect.jpg"]',
    "enter": "region = [[440, 280], [560, 280], [560, 340], [440, 340]]",
    "loiter": "region = [[615, 405], [705, 405], [705, 465], [615, 465]] and seconds = 30",
}


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


def parse_rules(data: Mapping[str, Any], *, source: str = "rules", base_dir: Path = Path()) -> list[Rule]:
    """`load_rules` for decoded TOML; ``source`` names it in errors, photos are relative to ``base_dir``."""
    unknown = sorted(k for k in data if k != "rule")
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} at the top; a rules file holds only [[rule]] tables")
    tables = data.get("rule")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f'{source}: no rules; add one or more [[rule]] tables, e.g. [[rule]] kind = "enter" '
                          f"{EXAMPLE['enter']}")  # fmt: skip
    rules = [_rule(t, f"{source}: rule {i}", base_dir) for i, t in enumerate(tables, 1)]
    seen: dict[str, int] = {}
    for i, r in enumerate(rules, 1):
        if r.name in seen:
            raise ConfigError(
                f"{source}: rule {i}: name = {r.name!r} is taken by rule {seen[r.name]}; names are unique"
            )
        seen[r.name] = i
    return rules


def _rule(t: object, where: str, base_dir: Path) -> Rule:
    if not isinstance(t, Mapping):
        raise ConfigError(f"{where}: a rule is a [[rule]] table, got {type(t).__name__}")
    kind = t.get("kind")
    if kind not in KINDS:
        raise _bad(where, "kind", kind, f'give one of {", ".join(KINDS)}, e.g. kind = "enter"')
    where = f"{where} ({kind})"
    unknown = sorted(str(k) for k in t if k not in FIELDS[kind])
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; a {kind} rule takes {', '.join(FIELDS[kind])}")
    streams = _streams(t, where)
    if kind == "face":
        photos = _photos(t, where, base_dir)
        threshold = _threshold(t, where)
        name = _name(t, where, kind, [str(p) for p in photos], threshold, streams)
        vectors = _embed(photos, where)
        return FaceRule(name=name, streams=streams, photos=photos, threshold=threshold, vectors=vectors)
    region = _region(t, where)
    label = _choice(t, where, "label", LABELS, "person")
    anchor = _choice(t, where, "anchor", ANCHORS, "bottom")
    if kind == "enter":
        name = _name(t, where, kind, region.points, label, anchor, streams)
        return EnterRule(name=name, streams=streams, region=region, label=label, anchor=anchor)
    seconds = _number(t, where, "seconds", "give a positive number of seconds, e.g. seconds = 30")
    if seconds <= 0:
        raise _bad(where, "seconds", seconds, "give a positive number of seconds, e.g. seconds = 30")
    name = _name(t, where, kind, region.points, label, anchor, seconds, streams)
    return LoiterRule(name=name, streams=streams, region=region, label=label, anchor=anchor, seconds=seconds)


def _bad(where: str, key: str, value: object, valid: str) -> ConfigError:
    shown = json.dumps(value) if isinstance(value, str | int | float | list) else repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ConfigError(f"{where}: {key} = {shown} is not valid; {valid}")


def _name(t: Mapping[str, Any], where: str, kind: str, *definition: object) -> str:
    """The rule's ``name``, or one made from its kind and a hash of what it says (stable across restarts, and
    across moving the rule in the file): the alerts table keys its alerts and position by it."""
    if "name" not in t:
        digest = hashlib.sha256(json.dumps([kind, *definition], default=str).encode()).hexdigest()[:8]
        return f"{kind}-{digest}"
    name = t["name"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _bad(where, "name", name, 'give 1-64 letters, digits, ".", "_" or "-", e.g. name = "front-door"')
    return name


def _number(t: Mapping[str, Any], where: str, key: str, valid: str) -> float:
    v = t.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _bad(where, key, v, valid) if key in t else ConfigError(f"{where}: {key} is missing; {valid}")
    return float(v)


def _choice(t: Mapping[str, Any], where: str, key: str, valid: Sequence[str], default: str) -> str:
    v = t.get(key, default)
    if v not in valid:
        raise _bad(where, key, v, f"give one of {', '.join(valid)} (default {default})")
    return str(v)


def _streams(t: Mapping[str, Any], where: str) -> tuple[str, ...]:
    v = t.get("streams", [])
    if "streams" in t and (not isinstance(v, list) or not v or not all(isinstance(s, str) and s for s in v)):
        raise _bad(where, "streams", v, 'give a list of stream names, e.g. streams = ["vtest.avi"], '
                   "or leave streams out for every stream")  # fmt: skip
    return tuple(v)


def _region(t: Mapping[str, Any], where: str) -> Region:
    v = t.get("region")
    valid = f"give a polygon of 3 or more [x, y] pixel corners, e.g. {EXAMPLE['enter']}"
    if "region" not in t:
        raise ConfigError(f"{where}: region is missing; {valid}")
    ok = isinstance(v, list) and len(v) >= 3 and all(
        isinstance(p, list) and len(p) == 2
        and all(isinstance(c, int | float) and not isinstance(c, bool) and math.isfinite(c) and c >= 0 for c in p)
        for p in v
    )  # fmt: skip
    if not ok:
        raise _bad(where, "region", v, valid)
    region = Region(tuple((float(p[0]), float(p[1])) for p in v))  # type: ignore[union-attr]
    if cv2.contourArea(np.asarray(region.points, dtype=np.float32)) <= 0:
        raise _bad(where, "region", v, f"its corners enclose no area (all on one line); {valid}")
    return region


def _photos(t: Mapping[str, Any], where: str, base_dir: Path) -> tuple[Path, ...]:
    v = t.get("photos")
    valid = f"give a list of photos of one face each, e.g. {EXAMPLE['face']} (paths relative to the rules file)"
    if "photos" not in t:
        raise ConfigError(f"{where}: photos is missing; {valid}")
    if not isinstance(v, list) or not v or not all(isinstance(p, str) and p for p in v):
        raise _bad(where, "photos", v, valid)
    return tuple(base_dir / p for p in v)


def _threshold(t: Mapping[str, Any], where: str) -> float:
    from deskpod.video.search import THRESHOLD

    valid = f"give a cosine similarity above 0 and at most 1, e.g. threshold = {THRESHOLD} (the default)"
    if "threshold" not in t:
        return THRESHOLD
    v = _number(t, where, "threshold", valid)
    if not 0 < v <= 1:
        raise _bad(where, "threshold", v, valid)
    return v


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
