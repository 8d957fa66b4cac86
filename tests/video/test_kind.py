"""The ``[video]`` job kind on its own: its table checked with one-line messages, its defaults, its name and the
command line it runs (`deskpod.jobs.kinds.video`); the dashboard's form makes the same spec."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from deskpod.errors import ConfigError
from deskpod.jobs.kinds import video
from deskpod.jobs.spec import SPEC_SCHEMA, parse_spec
from deskpod.web.video import form_spec


def test_defaults_and_the_command_line(tmp_path: Path) -> None:
    spec = parse_spec({"video": {"sources": ["/cams/door.mp4", "rtsp://127.0.0.1:8554/gate"]}})
    assert spec.kind == "video" and spec.name == "video-door.mp4"
    assert spec.video == {"sources": ["/cams/door.mp4", "rtsp://127.0.0.1:8554/gate"], "fps": 5.0,
                          "detect": ["hog-people", "dlib-hog-face"], "batch": 16}  # fmt: skip
    assert parse_spec(spec.to_json()) == spec
    assert spec.argv(tmp_path) == [
        sys.executable, "-m", "deskpod", "video", "index", "/cams/door.mp4", "rtsp://127.0.0.1:8554/gate",
        "--db", str(tmp_path / "video.db"), "--fps", "5", "--detect", "hog-people", "dlib-hog-face",
        "--batch", "16", "--stats", str(tmp_path / "video-stats.json"),
    ]  # fmt: skip
    own = parse_spec({"video": {"sources": ["rtsp://cam/live"], "db": "/srv/v/x.db", "fps": 2.5, "batch": 4,
                                "detect": ["haar-face"]}})  # fmt: skip
    assert own.name == "video-live"
    assert own.argv(tmp_path)[6:] == ["--db", "/srv/v/x.db", "--fps", "2.5", "--detect", "haar-face", "--batch", "4",
                                      "--stats", str(tmp_path / "video-stats.json")]  # fmt: skip


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({}, r"video.sources = None is not valid; expected a list of 1 to 256 paths or URLs"),
        ({"sources": []}, r"video.sources = \[\] is not valid"),
        ({"sources": ["cams/door.mp4"]}, r"video.sources = 'cams/door.mp4' is not valid; each source is an absolute"),
        ({"sources": ["ftp://x/y"]}, r"video.sources = 'ftp://x/y' is not valid"),
        ({"sources": ["/a", "/a"]}, r"video.sources = '/a' is not valid; name each source once"),
        ({"sources": ["/a"], "db": "x.db"}, r"video.db = 'x.db' is not valid; expected the absolute path"),
        ({"sources": ["/a"], "fps": 0}, r"video.fps = 0 is not valid; expected frames per second above 0"),
        ({"sources": ["/a"], "fps": True}, r"video.fps = True is not valid"),
        ({"sources": ["/a"], "detect": ["yolo"]}, r"video.detect = 'yolo' is not valid; use one of hog-people, "),
        ({"sources": ["/a"], "batch": 0}, r"video.batch = 0 is not valid; expected a whole number from 1 to 1024"),
        ({"sources": ["/a"], "devices": 2}, r"unknown field video.devices; valid: sources, db, fps, detect, batch"),
        ({"sources": ["/a"], "db": None}, r"video.db = null is not valid; leave video.db out for its default"),
    ],
)
def test_bad_tables_are_one_line(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        parse_spec({"video": table})
    assert "\n" not in str(e.value)


def test_one_kind_per_spec_and_no_environment() -> None:
    with pytest.raises(ConfigError, match=r"give exactly one of .* video .*; got command and video"):
        parse_spec({"command": ["true"], "video": {"sources": ["/a"]}})
    with pytest.raises(ConfigError, match="environment applies to command jobs; a train, serve or video job"):
        parse_spec({"video": {"sources": ["/a"]}, "environment": {"packages": ["numpy"]}})
    kinds = [set(o["required"]) for o in SPEC_SCHEMA["oneOf"]]
    assert {"video"} in kinds and SPEC_SCHEMA["properties"]["video"] is video.SCHEMA


def test_the_detector_names_are_the_applications() -> None:
    """The pod cannot import the video application to ask it; this keeps the two lists in step."""
    pytest.importorskip("cv2")
    from deskpod.video.detectors import DEFAULT_DETECTORS, DETECTORS

    assert set(video.DETECTORS) == set(DETECTORS) and video.DEFAULT_DETECT == DEFAULT_DETECTORS


def test_the_dashboard_form_makes_the_same_spec() -> None:
    fields = {"sources": "/cams/door.mp4\r\n\r\nrtsp://127.0.0.1:8554/gate\n", "db": "", "fps": "5",
              "detect": "hog-people dlib-hog-face", "batch": "16", "devices": "1", "name": ""}  # fmt: skip
    api = {"devices": 1, "video": {"sources": ["/cams/door.mp4", "rtsp://127.0.0.1:8554/gate"], "fps": 5}}
    assert parse_spec(form_spec(fields)) == parse_spec(api)
    with pytest.raises(ConfigError, match=r"video.fps = 'fast' is not a number"):
        form_spec({**fields, "fps": "fast"})
