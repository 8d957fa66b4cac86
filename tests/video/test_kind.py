"""The ``[video]`` job kind on its own: its table checked with one-line messages, its defaults, its name and the
command line it runs (`deskpod.jobs.kinds.video`); the dashboard's form makes the same spec."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

from deskpod.errors import ConfigError, ConflictError
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
    with pytest.raises(
        ConfigError, match="environment applies to command, notebook and shell jobs; a train, serve or video job"
    ):
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


DOOR = [[440, 280], [560, 280], [560, 340], [440, 340]]


def test_rules_and_a_webhook_go_on_the_command_line(tmp_path: Path) -> None:
    rules = [{"name": "door", "kind": "enter", "region": DOOR},
             {"kind": "face", "photos": ["/home/me/suspect.jpg"], "threshold": 0.9},
             {"kind": "loiter", "region": DOOR, "seconds": 30, "streams": ["door.mp4"]}]  # fmt: skip
    spec = parse_spec({"video": {"sources": ["/cams/door.mp4"], "rules": rules, "webhook": "http://127.0.0.1:9/a"}})
    assert spec.video is not None and spec.video["rules"] == rules and parse_spec(spec.to_json()) == spec
    argv = spec.argv(tmp_path)
    at = argv.index("--rules-json")
    assert json.loads(argv[at + 1]) == rules and argv[at + 2 :] == ["--webhook", "http://127.0.0.1:9/a"]
    assert video.local_photos(spec.video) == [Path("/home/me/suspect.jpg")]
    assert "--rules-json" not in parse_spec({"video": {"sources": ["/a"]}}).argv(tmp_path)
    toml = parse_spec(
        tomllib.loads(f"""
[video]
sources = ["/cams/door.mp4"]
[[video.rules]]
kind = "enter"
region = {DOOR}
""")
    )  # fmt: skip  (the TOML shape of a rules file, as [[video.rules]] tables)
    assert toml.video is not None and toml.video["rules"] == [{"kind": "enter", "region": DOOR}]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"rules": []}, r"video.rules = \[\] is not valid; expected a list of 1 to 64 rule tables, e\.g\. rules = "),
        ({"rules": {"kind": "enter"}}, r"video.rules = \{'kind': 'enter'\} is not valid; expected a list of 1 to 64"),
        ({"rules": ["door"]}, r"job spec: video.rules: rule 1: a rule is a \[\[rule\]\] table, got str"),
        ({"rules": [{"kind": "run"}]}, r"video.rules: rule 1: kind = \"run\" is not valid; give one of face, enter"),
        ({"rules": [{"kind": "enter"}]}, r"video.rules: rule 1 \(enter\): region is missing; give a polygon of 3"),
        (
            {"rules": [{"kind": "enter", "region": DOOR, "colour": "red"}]},
            r"rule 1 \(enter\): unknown key 'colour'; a enter rule takes name, kind, streams, region, label, anchor",
        ),
        ({"rules": [{"kind": "loiter", "region": DOOR}]}, r"rule 1 \(loiter\): seconds is missing; give a positive"),
        (
            {"rules": [{"kind": "face", "photos": ["suspect.jpg"]}]},
            r"rule 1 \(face\): photos = \"suspect.jpg\" is not valid; give a list of absolute paths of photos",
        ),
        (
            {"rules": [{"kind": "face", "photos": ["/a.jpg"], "threshold": 2}]},
            r"threshold = 2.0 is not valid; give a cosine similarity above 0",
        ),
        (
            {"rules": [{"kind": "enter", "region": DOOR}], "webhook": "ftp://x/y"},
            r"video.webhook = 'ftp://x/y' is not valid; expected an http:// or https:// URL",
        ),
        ({"rules": [{"kind": "enter", "region": DOOR}], "webhook": "http://a b/"}, r"video.webhook = 'http://a b/'"),
        (
            {"webhook": "http://127.0.0.1:9/a"},
            r"video.webhook = .* is not valid; a webhook receives the alerts of rules",
        ),
    ],
)
def test_bad_rules_and_webhooks_are_one_line(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        parse_spec({"video": {"sources": ["/a"], **extra}})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (
            [{"kind": "enter", "region": [[0, 0], [5, 5], [9, 9]]}],
            r"rule 1 \(enter\): region = .* its corners enclose no area",
        ),
        (
            [{"name": "x", "kind": "enter", "region": DOOR}, {"name": "x", "kind": "enter", "region": DOOR}],
            r"video.rules: rule 2: name = 'x' is taken by rule 1; names are unique",
        ),
    ],
)
def test_what_the_schema_cannot_say_is_a_conflict(rules: list[dict[str, object]], message: str) -> None:
    """The API's schema accepts these rules (a region of no area, two rules of one name): the pod answers 409."""
    import jsonschema_rs  # what schemathesis validates with

    from deskpod.jobs.kinds.video import SCHEMA

    spec = {"sources": ["/a"], "rules": rules}
    assert jsonschema_rs.is_valid(SCHEMA, spec)
    with pytest.raises(ConflictError, match=message) as e:
        parse_spec({"video": spec})
    assert "\n" not in str(e.value)


def test_a_webhook_without_rules_is_outside_the_schema() -> None:
    import jsonschema_rs

    from deskpod.jobs.kinds.video import SCHEMA

    spec: dict[str, object] = {"sources": ["/a"], "webhook": "http://127.0.0.1:9/x"}
    assert not jsonschema_rs.is_valid(SCHEMA, spec)
    assert jsonschema_rs.is_valid(SCHEMA, {**spec, "rules": [{"kind": "enter", "region": DOOR}]})


def test_the_job_checks_its_photos_and_the_application_reads_its_rules(tmp_path: Path) -> None:
    spec = {"sources": [str(tmp_path)], "rules": [{"kind": "face", "photos": [str(tmp_path / "no.jpg")]}]}
    with pytest.raises(ConflictError, match=r"video.rules photo '.*no.jpg' is not a file on this box"):
        video.check(video.parse(spec))
    pytest.importorskip("cv2")
    from deskpod.video.rules import EnterRule, parse_rules

    (rule,) = parse_rules({"rule": [{"name": "door", "kind": "enter", "region": DOOR}]}, base_dir=None)
    assert isinstance(rule, EnterRule) and rule.region.points[2] == (560.0, 340.0)


def test_a_repository_detector_is_checked_at_submission(tmp_path: Path) -> None:
    """``detect = ["repo:/abs/MODEL"]``: an absolute model folder in the spec; at submission (`video.check`, a 409
    from the pod) a folder that is no model, or a model without a layout that fits, is one line."""
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    spec = parse_spec({"video": {"sources": [str(tmp_path)], "detect": ["hog-people", f"repo:{model}:1"]}})
    argv = spec.argv(tmp_path)
    assert argv[argv.index("--detect") : argv.index("--batch")] == ["--detect", "hog-people", f"repo:{model}:1"]
    with pytest.raises(ConfigError, match=r"video.detect = 'repo:models/m' is not valid; use one of hog-people, "):
        parse_spec({"video": {"sources": ["/a"], "detect": ["repo:models/m"]}})
    with pytest.raises(ConflictError, match=f"video.detect 'repo:{model}:1': .*no model folder"):
        video.check(spec.video or {})
    (model / "config.toml").write_text(
        'platform = "onnxruntime"\nmax_batch_size = 0\nlabels = ["person"]\n'
        '[[input]]\nname = "image"\ndatatype = "FP32"\ndims = [3, -1, -1]\n'
        '[[output]]\nname = "boxes"\ndatatype = "FP32"\ndims = [-1, 4]\n'
    )
    with pytest.raises(ConflictError, match="declares no detection layout: add \\[detection\\] layout = one of") as e:
        video.check(spec.video or {})
    assert "\n" not in str(e.value)
    with (model / "config.toml").open("a") as f:
        f.write('[detection]\nlayout = "torchvision"\n')
    with pytest.raises(ConflictError, match="layout torchvision needs an output 'scores'"):
        video.check(spec.video or {})
