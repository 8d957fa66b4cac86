"""A video job: ``[video]``, ``deskpod video index`` over camera streams and video files, run for as long as the
streams last (a live one: until the job is stopped), writing its per-stream figures to the job folder's
``video-stats.json`` every few seconds for the dashboard's video page::

    [video]
    sources = ["/abs/cams/door.mp4", "rtsp://127.0.0.1:8554/gate"]   # files, folders of them, live URLs
    db = "/abs/path/video.db"        # the index (default: video.db in the job's folder)
    fps = 5                          # frames analysed per second of video, per stream
    detect = ["hog-people", "dlib-hog-face"]   # or a model of a repository: "repo:/abs/models/yolo[:VERSION]"
    batch = 16                       # frames per batch across streams
    webhook = "http://127.0.0.1:9000/alerts"   # optional: POST each alert here (JSON)

    [[video.rules]]                  # optional: watch rules, as in `deskpod video watch --rules` files
    name = "door"
    kind = "enter"
    region = [[440, 280], [560, 280], [560, 340], [440, 340]]

    [[video.rules]]
    kind = "face"
    photos = ["/abs/watchlist/suspect.jpg"]   # absolute paths, opened as the job's user like its sources

With ``rules``, the one process of the job both indexes and watches: ``deskpod video index ... --rules-json RULES
[--webhook URL]`` runs the watcher (`deskpod.video.watch`) on a thread beside the indexer, over the same database,
so the job has one command, one log and one exit status, and the alerts sit in the job's database for the
dashboard (`deskpod.web.video`). The rules travel on the command line as JSON (they are short; the kind builds a
command line and writes no files).

The kind only builds the command line: the pod never imports the video application (`deskpod.video`, a layer
above it). On a pod that runs jobs as their users' accounts, a local source and the database's folder are opened
as the account at submission and at each start, and shown to its sandbox as opened (`deskpod.jobs.isolation`);
a URL needs only the network, which a job has.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deskpod.errors import ConfigError, ConflictError
from deskpod.jobs.kinds.fields import bad, integer, table
from deskpod.jobs.kinds.watch_rules import RULE_SCHEMA, check_rules
from deskpod.serve.detection import ModelRef, check_model
from deskpod.train.runs import NAME_MAX

FIELDS = ("sources", "db", "fps", "detect", "batch", "rules", "webhook")
DETECTORS = ("hog-people", "dlib-hog-face", "haar-face", "dlib-cnn-face")
"""The detectors ``deskpod video index --detect`` knows (`deskpod.video.detectors.DETECTORS`; a test keeps the two
in step: the pod cannot import the application to ask it)."""
DEFAULT_DETECT = ("hog-people", "dlib-hog-face")
MODEL_DETECTOR = "^repo:/[^\\u0000]*[^/\\u0000]$"
"""A detector that is a model of a repository (`deskpod.serve.detection.ModelRef`): ``repo:`` and an absolute path
of its folder, optionally ``:VERSION``; checked at submission (`check`: the model declares a layout that fits)."""
MAX_SOURCES = 256
MAX_FPS = 120.0
BATCH = (16, 1, 1024)
"""``batch``: (default, lowest, highest)."""
DB_NAME = "video.db"
STATS_FILE = "video-stats.json"
"""In the job's folder: what ``deskpod video index --stats`` writes (`deskpod.video.progress`)."""
SOURCE = "^(/[^\\u0000]*|(rtsps?|https?)://[^\\u0000-\\u0020\\u007f]+)$"
"""A source: an absolute path, or a URL with no space or control character (the API's schema and `parse` alike)."""
DB = "^/[^\\u0000]*[^/\\u0000]$"
"""A database: an absolute path of a file (not ending in '/')."""
WEBHOOK = "^https?://[^\\u0000-\\u0020\\u007f/?#]+([/?#][^\\u0000-\\u0020\\u007f]*)?$"
"""A webhook: an http(s) URL with a host, no space or control character."""
MAX_RULES = 64
RULE_EXAMPLE = 'rules = [{kind = "enter", region = [[440, 280], [560, 280], [560, 340], [440, 340]]}]'

ENVIRONMENT = False
SESSION = False
EXTRA: str | None = "video"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["sources"],
    "dependentRequired": {"webhook": ["rules"]},
    "properties": {
        "sources": {
            "type": "array", "minItems": 1, "maxItems": MAX_SOURCES,
            "uniqueItems": True, "items": {"type": "string", "maxLength": 4096, "pattern": SOURCE},
            "description": "absolute paths of video files or folders of them, or live rtsp:// / http(s):// URLs",
        },
        "db": {"type": "string", "pattern": DB, "maxLength": 4096,
               "description": f"absolute path of the index database (default: {DB_NAME} in the job folder)"},
        "fps": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_FPS},
        "detect": {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "string", "enum": list(DETECTORS)},
            {"type": "string", "pattern": MODEL_DETECTOR, "maxLength": 4096}]},
            "description": "built-in detectors by name, or models of a repository: repo:/abs/models/NAME[:VERSION]"},
        "batch": {"type": "integer", "minimum": BATCH[1], "maximum": BATCH[2]},
        "rules": {"type": "array", "minItems": 1, "maxItems": MAX_RULES, "items": RULE_SCHEMA,
                  "description": "watch rules: tables of kind face (photos), enter (region) or loiter (region, "
                                 "seconds), as in a deskpod video watch rules file; photos are absolute paths"},
        "webhook": {"type": "string", "pattern": WEBHOOK, "maxLength": 4096,
                    "description": "with rules: POST each alert as JSON to this http(s) URL"},
    },
}  # fmt: skip


def parse(t: object) -> dict[str, Any]:
    """The ``[video]`` table, checked, with its defaults filled in (``db`` stays out when not given: the job's
    folder is known only when it starts)."""
    t = table(t, "video", FIELDS, 'expected a table with sources = ["/abs/path/clip.mp4", "rtsp://..."]')
    sources = t.get("sources")
    if not isinstance(sources, list) or not 1 <= len(sources) <= MAX_SOURCES:
        raise bad("video.sources", sources, f'expected a list of 1 to {MAX_SOURCES} paths or URLs, e.g. sources = '
                  '["/home/me/cams/door.mp4", "rtsp://127.0.0.1:8554/gate"]')  # fmt: skip
    for s in sources:
        if not isinstance(s, str) or len(s) > 4096 or not re.fullmatch(SOURCE, s):
            raise bad("video.sources", s, "each source is an absolute path (a file or a folder of videos) or an "
                      "rtsp://, rtsps://, http:// or https:// URL (no spaces)")  # fmt: skip
    if len(set(sources)) != len(sources):
        dup = next(s for s in sources if sources.count(s) > 1)
        raise bad("video.sources", dup, "name each source once")
    out: dict[str, Any] = {"sources": list(sources)}
    if "db" in t:
        db = t["db"]
        if not isinstance(db, str) or len(db) > 4096 or not re.fullmatch(DB, db):
            raise bad("video.db", db, 'expected the absolute path of a database file, e.g. db = "/home/me/video.db"')
        out["db"] = db
    fps = t.get("fps", 5)
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps <= MAX_FPS:
        raise bad("video.fps", fps, f"expected frames per second above 0 and at most {MAX_FPS:g}, e.g. fps = 5")
    out["fps"] = float(fps)
    detect = t.get("detect", list(DEFAULT_DETECT))
    if not isinstance(detect, list) or not detect or not all(isinstance(d, str) for d in detect):
        raise bad("video.detect", detect, f'expected a list of detector names, e.g. detect = ["{DEFAULT_DETECT[0]}"]')
    for d in detect:
        if d not in DETECTORS and not (len(d) <= 4096 and re.fullmatch(MODEL_DETECTOR, d)):
            raise bad("video.detect", d, f"use one of {', '.join(DETECTORS)}, or a model of a repository by its "
                      "absolute path: repo:/home/me/models/yolo (or repo:/home/me/models/yolo:2)")  # fmt: skip
    out["detect"] = list(dict.fromkeys(detect))
    out["batch"] = integer(t, "batch", BATCH[0], BATCH[1], BATCH[2], "video.")
    if "rules" in t:
        rules = t["rules"]
        if not isinstance(rules, list) or not 1 <= len(rules) <= MAX_RULES:
            raise bad("video.rules", rules, f"expected a list of 1 to {MAX_RULES} rule tables, e.g. {RULE_EXAMPLE}")
        check_rules(rules, "job spec: video.rules", base_dir=None, threshold=None, example=RULE_EXAMPLE,
                    beyond_schema=ConflictError)  # fmt: skip
        out["rules"] = [dict(r) for r in rules]
    if "webhook" in t:
        hook = t["webhook"]
        if not isinstance(hook, str) or len(hook) > 4096 or not re.fullmatch(WEBHOOK, hook):
            raise bad("video.webhook", hook, 'expected an http:// or https:// URL, e.g. webhook = '
                      '"http://127.0.0.1:9000/alerts"')  # fmt: skip
        if "rules" not in out:
            raise bad("video.webhook", hook, "a webhook receives the alerts of rules: add rules, or leave it out")
        out["webhook"] = hook
    return out


def default_name(video: Mapping[str, Any], fallback: str) -> str:
    """``video-`` and the first source's name: ``video-door.mp4``, ``video-gate`` (an RTSP path)."""
    first = str(video["sources"][0]).rstrip("/")
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", first.rsplit("/", 1)[-1]).strip(".-_")
    return f"video-{stem}"[:NAME_MAX].rstrip(".-_") if stem else "video"


def local_sources(video: Mapping[str, Any]) -> list[Path]:
    """The sources that are paths on this box (the others are URLs)."""
    return [Path(s) for s in video["sources"] if str(s).startswith("/")]


def model_detectors(video: Mapping[str, Any]) -> list[ModelRef]:
    """The detectors that are models of a repository."""
    return [ModelRef.parse(d, "video.detect") for d in video["detect"] if d not in DETECTORS]


def check_models(video: Mapping[str, Any]) -> None:
    """Each detector that is a model of a repository is a model folder whose config declares a detection layout
    that its outputs fit (`deskpod.serve.detection.check_model`); `ConflictError` naming it otherwise."""
    for ref in model_detectors(video):
        try:
            check_model(ref)
        except ConfigError as e:
            raise ConflictError(f"job spec: video.detect {str(ref)!r}: {e}") from None


def local_photos(video: Mapping[str, Any]) -> list[Path]:
    """The face rules' photos (absolute paths on this box), each once."""
    photos = [p for r in video.get("rules", []) if r.get("kind") == "face" for p in r.get("photos", [])]
    return [Path(p) for p in dict.fromkeys(photos)]


def db_path(video: Mapping[str, Any], folder: Path) -> Path:
    """The job's index database: ``db``, or ``video.db`` in its ``folder``."""
    return Path(video["db"]) if "db" in video else folder / DB_NAME


def check(video: Mapping[str, Any]) -> None:
    """Every local source is here (a pod with isolation opens them as the user instead, `deskpod.jobs.isolation`),
    and the database's folder is."""
    for path in local_sources(video):
        if not path.exists():
            raise ConflictError(f"job spec: video.sources {str(path)!r} is not a file or folder on this box")
    for path in local_photos(video):
        if not path.is_file():
            raise ConflictError(f"job spec: video.rules photo {str(path)!r} is not a file on this box")
    check_models(video)
    if "db" in video and not Path(video["db"]).parent.is_dir():
        raise ConflictError(f"job spec: video.db {video['db']!r}: its folder is not on this box; make it first")


def argv(video: Mapping[str, Any], name: str, folder: Path) -> list[str]:
    """``deskpod video index`` over the sources into the job's database, writing its figures to the job folder's
    `STATS_FILE`, and watching it by the job's rules; a restarted job resumes each file where the database says it
    stopped, and each rule where it had judged."""
    v = video
    return [
        sys.executable, "-m", "deskpod", "video", "index", *v["sources"], "--db", str(db_path(v, folder)),
        "--fps", f"{float(v['fps']):g}", "--detect", *v["detect"], "--batch", str(v["batch"]),
        "--stats", str(folder / STATS_FILE),
        *(["--rules-json", json.dumps(v["rules"], separators=(",", ":"))] if v.get("rules") else []),
        *(["--webhook", v["webhook"]] if v.get("webhook") else []),
    ]  # fmt: skip


def node_argv(video: Mapping[str, Any], name: str, folder: Path, node: int, nodes: int) -> list[str]:
    """What node ``node`` of a job on ``nodes`` nodes runs (a Slurm job, `deskpod.cluster.launch`): `argv` over
    its share of the sources into its own shard database, ``<db stem>.shard<node>.db`` (`deskpod.video.shards`:
    the sources sorted and dealt round-robin by node rank), its figures to ``video-stats.shard<node>.json``."""
    out = argv(video, name, folder)
    out[out.index("--stats") + 1] = str(folder / f"{Path(STATS_FILE).stem}.shard{node}.json")
    return [*out, "--shard", f"{node}/{nodes}"]
