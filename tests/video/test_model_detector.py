"""``--detect repo:PATH/MODEL``: a detector from a model repository, its layout declared with it.

Two real exported networks (`tests.video.detection_models`): torchvision's SSDlite (layout ``torchvision``, a
``config.toml``) and Ultralytics' YOLOv8n (layout ``yolo``, a Triton ``config.pbtxt``). What the detector gives is
compared with each library's own postprocessing of the same network on the same frames: torchvision's eager model,
and Ultralytics' ``LetterBox``, ``non_max_suppression`` and ``scale_boxes``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deskpod import cli
from deskpod.errors import ConfigError, UsageError
from deskpod.serve.detection import ModelRef, layout_of
from deskpod.serve.repository import ModelConfig, read_config
from deskpod.video.detectors import make_detectors
from deskpod.video.sources import Source, read
from tests.video import detection_models as dm
from tests.video.clips import clip

SSD_THRESHOLD = 0.36
YOLO_THRESHOLD = 0.6
YOLO_IOU = 0.5


def _frames(name: str, n: int, fps: float = 2.0) -> list[np.ndarray]:
    path = clip(name)
    frames = [f.image for _, f in zip(range(n), read(Source(path.name, str(path), False), fps), strict=False)]
    assert len(frames) == n
    return frames


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    return _frames("vtest", 4)


@pytest.fixture(scope="module")
def ssd(tmp_path_factory: pytest.TempPathFactory, frames: list[np.ndarray]) -> tuple[Path, Any]:
    """SSDlite's folder and its eager model."""
    root = tmp_path_factory.mktemp("ssd")
    return root / "ssd", dm.torchvision_model(root, frames, score_threshold=SSD_THRESHOLD)


@pytest.fixture(scope="module")
def yolo(tmp_path_factory: pytest.TempPathFactory, frames: list[np.ndarray]) -> tuple[Path, Any]:
    """YOLOv8n's folder and its eager network."""
    root = tmp_path_factory.mktemp("yolo")
    net = dm.yolo_network(frames, root)
    return dm.yolo_model(root, net, score_threshold=YOLO_THRESHOLD, iou_threshold=YOLO_IOU), net


def _match(got: np.ndarray, want: np.ndarray, box_tol: float) -> None:
    """Rows of x1, y1, x2, y2, score, class: the same set (order among near-equal scores may differ)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    key = np.lexsort((want[:, 0], want[:, 5]))
    key_got = np.lexsort((got[:, 0], got[:, 5]))
    np.testing.assert_allclose(got[key_got, :4], want[key, :4], atol=box_tol)
    np.testing.assert_allclose(got[key_got, 4], want[key, 4], atol=1e-4)
    np.testing.assert_array_equal(got[key_got, 5], want[key, 5])


def _rows(dets: list[Any], labels: tuple[str, ...]) -> np.ndarray:
    return np.array([[*d.box, d.score, labels.index(d.label)] for d in dets], dtype=np.float64).reshape(-1, 6)


@pytest.mark.slow
def test_torchvision_layout_gives_what_torchvision_gives(ssd: tuple[Path, Any], frames: list[np.ndarray]) -> None:
    import torch

    frames = [*frames, _frames("carphone", 1)[0]]  # 768×576 and 176×144: each at its own size
    (detector,) = make_detectors([f"repo:{ssd[0]}"])
    try:
        assert detector.labels == ("person", "car")
        got = detector.detect(frames)
    finally:
        detector.close()
    with torch.no_grad():
        eager = ssd[1](dm.rgb_tensor(frames))
    assert sum(map(len, got)) > 0
    for frame, dets, want in zip(frames, got, eager, strict=True):
        h, w = frame.shape[:2]
        assert all(0 <= d.box[0] < d.box[2] <= w and 0 <= d.box[1] < d.box[3] <= h for d in dets)
        assert all(d.score >= SSD_THRESHOLD for d in dets)
        keep = want["scores"] >= SSD_THRESHOLD
        ref = torch.cat([want["boxes"][keep], want["scores"][keep, None], want["labels"][keep, None].float()], 1)
        _match(_rows(dets, dm.SSD_LABELS), ref.double().numpy(), box_tol=0.05)


@pytest.mark.slow
def test_yolo_layout_gives_what_ultralytics_gives(yolo: tuple[Path, Any], frames: list[np.ndarray]) -> None:
    import torch
    from ultralytics.data.augment import LetterBox
    from ultralytics.utils.nms import non_max_suppression
    from ultralytics.utils.ops import scale_boxes

    frames = [*frames, _frames("bikes", 2)[1]]  # 768×576 and 640×272: letterboxed both ways
    (detector,) = make_detectors([f"repo:{yolo[0]}:1"])
    try:
        assert detector.name.endswith("yolo:1") and detector.labels == dm.YOLO_LABELS
        got = detector.detect(frames)
    finally:
        detector.close()
    size = (dm.YOLO_SIZE, dm.YOLO_SIZE)
    boxed = [LetterBox(size, auto=False)(image=f) for f in frames]
    x = torch.stack(dm.rgb_tensor(boxed))
    with torch.no_grad():
        kept = non_max_suppression(yolo[1](x), YOLO_THRESHOLD, YOLO_IOU, max_det=300)
    assert sum(map(len, got)) > 0
    for frame, dets, want in zip(frames, got, kept, strict=True):
        h, w = frame.shape[:2]
        assert all(0 <= d.box[0] < d.box[2] <= w and 0 <= d.box[1] < d.box[3] <= h for d in dets)
        assert all(d.score >= YOLO_THRESHOLD for d in dets)
        want[:, :4] = scale_boxes(size, want[:, :4], frame.shape[:2])
        _match(_rows(dets, dm.YOLO_LABELS), want.double().numpy(), box_tol=0.5)


@pytest.mark.slow
def test_index_with_a_repository_detector_puts_its_tracks_in_the_db(
    yolo: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "v.db"
    argv = ["video", "index", str(clip("carphone")), "--db", str(db), "--fps", "5",
            "--detect", f"repo:{yolo[0]}"]  # fmt: skip
    assert cli.main(argv) == 0
    assert "carphone_pristine.mp4" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT label, boxes FROM tracks").fetchall()
    assert rows and {label for label, _ in rows} <= set(dm.YOLO_LABELS)
    import json

    boxes = [b for _, text in rows for b in json.loads(text)]
    assert all(0 <= b[1] < b[3] <= 176 and 0 <= b[2] < b[4] <= 144 and b[5] >= YOLO_THRESHOLD for b in boxes)


def _config(tmp_path: Path, name: str, text: str, file: str = "config.toml") -> Path:
    folder = tmp_path / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"")
    (folder / file).write_text(text)
    return folder


TV = """platform = "onnxruntime"
max_batch_size = 0
labels = ["__background__", "person"]
[[input]]
name = "image"
datatype = "FP32"
dims = [3, -1, -1]
[[output]]
name = "boxes"
datatype = "FP32"
dims = [-1, 4]
[[output]]
name = "scores"
datatype = "FP32"
dims = [-1]
"""


@pytest.mark.parametrize(
    ("detection", "message"),
    [
        ("", "declares no detection layout: add [detection] layout = one of torchvision, yolo"),
        ('[detection]\nlayout = "ssd"\n', "detection layout 'ssd' is not one of torchvision, yolo"),
        ('[detection]\nlayout = "torchvision"\n', "layout torchvision needs an output 'labels'; its outputs are "),
        ('[detection]\nlayout = "yolo"\n', "layout yolo needs a fixed input size"),
        ('[detection]\nlayout = "torchvision"\nscore = 1\n', "unknown [detection] keys ['score']; valid: layout"),
        ('[detection]\nlayout = "torchvision"\nresize = "crop"\n', "resize 'crop' is not one of letterbox, stretch"),
    ],
)
def test_a_layout_the_model_does_not_declare_or_fit_is_one_line(tmp_path: Path, detection: str, message: str) -> None:
    folder = _config(tmp_path, "m", TV + detection)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        layout_of(read_config(folder))
    assert "\n" not in str(e.value)


def test_yolo_outputs_must_hold_a_score_per_label() -> None:
    from deskpod.serve.repository import TensorSpec

    def cfg(dims: tuple[int, ...], labels: tuple[str, ...]) -> ModelConfig:
        return ModelConfig(name="y", platform="onnxruntime", max_batch_size=4, labels=labels,
                           inputs=(TensorSpec("images", "FP32", (3, 640, 640)),),
                           outputs=(TensorSpec("output0", "FP32", dims),), detection={"layout": "yolo"})  # fmt: skip

    assert layout_of(cfg((84, 8400), tuple(f"c{i}" for i in range(80)))).candidates_last
    assert not layout_of(cfg((8400, 6), ("a", "b"))).candidates_last
    with pytest.raises(ConfigError, match=r"dims \[84, 8400\] have no side of 4 \+ 2 labels = 6"):
        layout_of(cfg((84, 8400), ("a", "b")))
    with pytest.raises(ConfigError, match="a detector needs its class names"):
        layout_of(cfg((6, 8400), ()))


def test_triton_parameters_declare_the_layout(tmp_path: Path) -> None:
    pbtxt = """platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "images" data_type: TYPE_FP32 dims: [ 3, 320, 320 ] } ]
output [ { name: "output0" data_type: TYPE_FP32 dims: [ 6, 2100 ] } ]
parameters { key: "deskpod.detection.layout" value { string_value: "yolo" } }
parameters { key: "deskpod.detection.labels" value { string_value: "person, car" } }
parameters { key: "deskpod.detection.score_threshold" value { string_value: "0.4" } }
"""
    layout = layout_of(read_config(_config(tmp_path, "y", pbtxt, "config.pbtxt")))
    assert (layout.layout, layout.labels, layout.settings.score_threshold) == ("yolo", ("person", "car"), 0.4)
    bad = pbtxt.replace('"0.4"', '"high"')
    with pytest.raises(ConfigError, match="detection score_threshold 'high' is not a number"):
        layout_of(read_config(_config(tmp_path, "z", bad.replace('yolo"', 'yolo"'), "config.pbtxt")))


def test_model_refs() -> None:
    assert ModelRef.parse("repo:models/yolo") == ModelRef(Path("models"), "yolo", None)
    assert ModelRef.parse("repo:/srv/m/yolo:12") == ModelRef(Path("/srv/m"), "yolo", "12")
    assert str(ModelRef.parse("repo:/srv/m/yolo:12")) == "repo:/srv/m/yolo:12"
    for bad in ("repo:", "repo:/", "models/yolo"):
        with pytest.raises(UsageError):
            ModelRef.parse(bad)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("MISSING", "no model folder"),
        ("NOLAYOUT", "declares no detection layout: add [detection] layout = one of torchvision, yolo"),
        ("MISFIT", "layout torchvision needs an output 'labels'"),
    ],
)
def test_bad_models_from_the_command_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, message: str
) -> None:
    folders = {"MISSING": tmp_path / "none", "NOLAYOUT": _config(tmp_path, "plain", TV),
               "MISFIT": _config(tmp_path, "misfit", TV + '[detection]\nlayout = "torchvision"\n')}  # fmt: skip
    argv = ["video", "index", str(clip("carphone")), "--db", str(tmp_path / "v.db"), "--detect", "haar-face",
            f"repo:{folders[model]}"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("deskpod: ") and message in err[0], err
    assert not (tmp_path / "v.db").exists()
