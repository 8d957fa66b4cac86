"""Watch rules as written (``[[rule]]`` tables: a ``deskpod video watch --rules`` file, or a video job's ``rules``),
checked without the video application: plain Python, no OpenCV, so that the pod can check a job's rules at
submission and `deskpod.video.rules` turns the same checked tables into rules it judges tracks by.

Every message is one line naming where (the file and rule, or the job spec's field), the bad key and value, and
what is valid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deskpod.errors import ConfigError, DeskpodError

KINDS = ("face", "enter", "loiter")
LABELS = ("person", "face")
"""What the detectors label tracks (`deskpod.video.detectors.Detection.label`)."""
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


_NAME = {"type": "string", "pattern": NAME_RE.pattern}
_STREAMS = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
_REGION = {
    "type": "array",
    "minItems": 3,
    "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number", "minimum": 0}},
}
_IN_REGION = {"region": _REGION, "label": {"enum": list(LABELS)}, "anchor": {"enum": list(ANCHORS)}}
RULE_SCHEMA: dict[str, Any] = {"oneOf": [
    {"type": "object", "additionalProperties": False, "required": ["kind", "photos"],
     "properties": {"kind": {"const": "face"}, "name": _NAME, "streams": _STREAMS,
                    "photos": {"type": "array", "minItems": 1,
                               "items": {"type": "string", "pattern": "^/[^\\u0000]*$", "maxLength": 4096}},
                    "threshold": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}},
    {"type": "object", "additionalProperties": False, "required": ["kind", "region"],
     "properties": {"kind": {"const": "enter"}, "name": _NAME, "streams": _STREAMS, **_IN_REGION}},
    {"type": "object", "additionalProperties": False, "required": ["kind", "region", "seconds"],
     "properties": {"kind": {"const": "loiter"}, "name": _NAME, "streams": _STREAMS, **_IN_REGION,
                    "seconds": {"type": "number", "exclusiveMinimum": 0}}},
]}  # fmt: skip
"""One rule of a video job's ``rules``, as the pod's API schema says it (photos as absolute paths)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RuleTable:
    """One rule table, checked, with its defaults filled in."""

    name: str
    """Its ``name``, or its kind and a hash of what it says (stable across restarts and moves in the file)."""
    kind: str
    streams: tuple[str, ...] = ()
    photos: tuple[Path, ...] = ()
    """face: the watch list (resolved against the rules file's folder)."""
    threshold: float | None = None
    """face: the least similarity (None: the caller's default)."""
    region: tuple[tuple[float, float], ...] = ()
    """enter, loiter: the polygon's corners, pixels."""
    label: str = "person"
    anchor: str = "bottom"
    seconds: float = 0.0
    """loiter: how long inside."""


def check_rules(
    tables: object,
    source: str,
    *,
    base_dir: Path | None,
    threshold: float | None,
    example: str,
    beyond_schema: type[DeskpodError] = ConfigError,
) -> list[RuleTable]:
    """The rule ``tables`` (a list of mappings), checked; `ConfigError` naming ``source`` and the rule otherwise.
    ``base_dir`` is what relative photo paths are relative to (None: photos must be absolute paths);
    ``threshold`` the face rules' default (None: left out); ``example`` ends the message for no rules.
    ``beyond_schema`` is raised for what `RULE_SCHEMA` cannot say (a region of no area, two rules of one name):
    the pod answers a spec its schema accepts with 409, not 400."""
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{source}: no rules; {example}")
    rules = [_check_rule(t, f"{source}: rule {i}", base_dir, threshold, beyond_schema) for i, t in enumerate(tables, 1)]
    seen: dict[str, int] = {}
    for i, r in enumerate(rules, 1):
        if r.name in seen:
            raise beyond_schema(
                f"{source}: rule {i}: name = {r.name!r} is taken by rule {seen[r.name]}; names are unique"
            )
        seen[r.name] = i
    return rules


def _check_rule(
    t: object, where: str, base_dir: Path | None, default_threshold: float | None, beyond_schema: type[DeskpodError]
) -> RuleTable:
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
        threshold = _threshold(t, where, default_threshold)
        name = _name(t, where, kind, [str(p) for p in photos], threshold, streams)
        return RuleTable(name, kind, streams, photos=photos, threshold=threshold)
    region = _region(t, where, beyond_schema)
    label = _choice(t, where, "label", LABELS, "person")
    anchor = _choice(t, where, "anchor", ANCHORS, "bottom")
    if kind == "enter":
        name = _name(t, where, kind, region, label, anchor, streams)
        return RuleTable(name, kind, streams, region=region, label=label, anchor=anchor)
    seconds = _number(t, where, "seconds", "give a positive number of seconds, e.g. seconds = 30")
    if seconds <= 0:
        raise _bad(where, "seconds", seconds, "give a positive number of seconds, e.g. seconds = 30")
    name = _name(t, where, kind, region, label, anchor, seconds, streams)
    return RuleTable(name, kind, streams, region=region, label=label, anchor=anchor, seconds=seconds)


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
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
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


def _region(t: Mapping[str, Any], where: str, beyond_schema: type[DeskpodError]) -> tuple[tuple[float, float], ...]:
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
    points = tuple((float(p[0]), float(p[1])) for p in v)  # type: ignore[union-attr]
    area = sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(points, points[1:] + points[:1], strict=True)) / 2
    if area == 0:  # the shoelace formula, as OpenCV's contourArea
        raise beyond_schema(_bad(where, "region", v, f"its corners enclose no area (all on one line); {valid}").args[0])
    return points


def _photos(t: Mapping[str, Any], where: str, base_dir: Path | None) -> tuple[Path, ...]:
    v = t.get("photos")
    if base_dir is None:
        valid = 'give a list of absolute paths of photos of one face each, e.g. photos = ["/home/me/suspect.jpg"]'
    else:
        valid = f"give a list of photos of one face each, e.g. {EXAMPLE['face']} (paths relative to the rules file)"
    if "photos" not in t:
        raise ConfigError(f"{where}: photos is missing; {valid}")
    if not isinstance(v, list) or not v or not all(isinstance(p, str) and p and "\0" not in p for p in v):
        raise _bad(where, "photos", v, valid)
    if base_dir is None:
        for p in v:
            if not p.startswith("/") or len(p) > 4096:
                raise _bad(where, "photos", p, valid)
        return tuple(Path(p) for p in v)
    return tuple(base_dir / p for p in v)


def _threshold(t: Mapping[str, Any], where: str, default: float | None) -> float | None:
    shown = f"{default} (the default)" if default is not None else "0.93"
    valid = f"give a cosine similarity above 0 and at most 1, e.g. threshold = {shown}"
    if "threshold" not in t:
        return default
    v = _number(t, where, "threshold", valid)
    if not 0 < v <= 1:
        raise _bad(where, "threshold", v, valid)
    return v
