"""Detectors of people and faces, each taking a batch of frames (from any streams) at a time.

Every detector here runs on weights that install with a package, nothing downloaded at run time:

| name | what | weights |
|---|---|---|
| ``hog-people`` | people, upright, >= ~100 px tall at the detector's scale | OpenCV's HOG + linear SVM (Dalal-Triggs), compiled into cv2 |
| ``haar-face`` | frontal faces | OpenCV's Haar cascade ``haarcascade_frontalface_default.xml`` (cv2.data) |
| ``dlib-hog-face`` | frontal and slightly turned faces | dlib's HOG face detector, compiled into dlib |
| ``dlib-cnn-face`` | faces at any pose, slower on a CPU | dlib's MMOD CNN, ``mmod_human_face_detector.dat`` (face_recognition_models) |
| ``repo:PATH/MODEL[:VERSION]`` | what the model's labels name | a model of a repository that declares its output layout (`deskpod.video.model_detector`) |

A batch is a list of BGR uint8 frames; OpenCV and dlib release the GIL while they work, so a batch is spread over
a pool of threads (one per core), and dlib's CNN takes same-sized frames as one tensor batch. Which detector is the
default for what is measured on hand-made ground truth (docs/video-models.md).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import cv2
import dlib
import numpy as np

from deskpod.errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class Detection:
    """One object found in one frame."""

    box: tuple[float, float, float, float]
    """x1, y1, x2, y2 in pixels of the frame."""
    score: float
    """The detector's confidence: its own scale (an SVM margin for HOG, a CNN score, Haar's level weight)."""
    label: str
    """"person" or "face"."""


class Detector(Protocol):
    name: str
    labels: tuple[str, ...]
    """Every label its detections carry (the indexer tracks each apart)."""

    def detect(self, frames: Sequence[np.ndarray]) -> list[list[Detection]]: ...

    def close(self) -> None: ...


class _Builtin:
    """What the built-in detectors share: nothing to release."""

    def close(self) -> None:
        pass


def models_dir() -> Path:
    """The folder of dlib's weights in the face_recognition_models package (found, not imported: its
    ``__init__`` needs pkg_resources, which new setuptools no longer has)."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("dlib's face weights are missing: pip install face_recognition_models")
    return Path(next(iter(spec.submodule_search_locations))) / "models"


_POOL: ThreadPoolExecutor | None = None


def _map(fn: Callable[[np.ndarray], list[Detection]], frames: Sequence[np.ndarray]) -> list[list[Detection]]:
    global _POOL
    if len(frames) <= 1:
        return [fn(f) for f in frames]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="deskpod-detect")
    return list(_POOL.map(fn, frames))


def person_in_window(x: float, y: float, w: float, h: float) -> tuple[float, float, float, float]:
    """The person inside a HOG detection window, as ``(x1, y1, x2, y2)``: Dalal and Triggs trained on 64x128 windows
    holding a person 96 px tall with a 16 px margin on all four sides (CVPR 2005, section 2), so the person is the
    window less 1/4 of its width and 1/8 of its height on each side. The window itself is twice as wide as the
    person: against a box drawn around the person its IoU is ~0.35, a miss at 0.5."""
    return (x + w / 4, y + h / 8, x + w - w / 4, y + h - h / 8)


class HogPeople(_Builtin):
    """OpenCV's HOG people detector. Frames wider than ``max_width`` are scaled down first (speed), boxes back up;
    each box is the person inside the detection window (`person_in_window`), not the window."""

    name = "hog-people"
    labels: tuple[str, ...] = ("person",)

    def __init__(self, max_width: int = 1024, min_score: float = 0.5) -> None:
        self.max_width = max_width
        self.min_score = min_score
        self._hog = cv2.HOGDescriptor()
        self._hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())  # type: ignore[attr-defined]

    def _one(self, frame: np.ndarray) -> list[Detection]:
        scale = min(1.0, self.max_width / frame.shape[1])
        img = cv2.resize(frame, None, fx=scale, fy=scale) if scale < 1.0 else frame
        rects, weights = self._hog.detectMultiScale(img, winStride=(8, 8), padding=(8, 8), scale=1.05)
        out = []
        for (x, y, w, h), s in zip(rects, np.asarray(weights).reshape(-1), strict=True):
            if s >= self.min_score:
                box = person_in_window(x / scale, y / scale, w / scale, h / scale)
                out.append(Detection(box, float(s), "person"))
        return out

    def detect(self, frames: Sequence[np.ndarray]) -> list[list[Detection]]:
        return _map(self._one, frames)


class HaarFace(_Builtin):
    """OpenCV's frontal-face Haar cascade; the score is the last stage's level weight."""

    name = "haar-face"
    labels: tuple[str, ...] = ("face",)

    def __init__(self, min_size: int = 24) -> None:
        folder: str = cv2.data.haarcascades  # type: ignore[attr-defined]
        path = Path(folder) / "haarcascade_frontalface_default.xml"
        self._cascade = cv2.CascadeClassifier(str(path))
        if self._cascade.empty():
            raise ConfigError(f"OpenCV's face cascade did not load from {path}")
        self.min_size = min_size

    def _one(self, frame: np.ndarray) -> list[Detection]:
        gray = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
        rects, _, weights = self._cascade.detectMultiScale3(
            gray, scaleFactor=1.1, minNeighbors=5, minSize=(self.min_size, self.min_size), outputRejectLevels=True
        )
        return [
            Detection((float(x), float(y), float(x + w), float(y + h)), float(s), "face")
            for (x, y, w, h), s in zip(rects, np.asarray(weights).reshape(-1), strict=True)
        ]

    def detect(self, frames: Sequence[np.ndarray]) -> list[list[Detection]]:
        return _map(self._one, frames)


def _rect_box(r: Any, shape: tuple[int, ...]) -> tuple[float, float, float, float]:
    h, w = shape[:2]
    return (float(max(0, r.left())), float(max(0, r.top())), float(min(w, r.right())), float(min(h, r.bottom())))


class DlibHogFace(_Builtin):
    """dlib's HOG face detector; frames smaller than ``upsample_below`` px wide are upsampled once (small faces)."""

    name = "dlib-hog-face"
    labels: tuple[str, ...] = ("face",)

    def __init__(self, upsample_below: int = 400, min_score: float = 0.0) -> None:
        self._local = threading.local()  # dlib's detector keeps scratch state: one per thread (shared, it crashes)
        self.upsample_below = upsample_below
        self.min_score = min_score

    def _one(self, frame: np.ndarray) -> list[Detection]:
        rgb = np.ascontiguousarray(frame[:, :, ::-1])
        detector = getattr(self._local, "detector", None)
        if detector is None:
            detector = self._local.detector = dlib.get_frontal_face_detector()
        rects, scores, _ = detector.run(rgb, 1 if frame.shape[1] < self.upsample_below else 0, self.min_score)
        return [Detection(_rect_box(r, frame.shape), float(s), "face") for r, s in zip(rects, scores, strict=True)]

    def detect(self, frames: Sequence[np.ndarray]) -> list[list[Detection]]:
        return _map(self._one, frames)


class DlibCnnFace(_Builtin):
    """dlib's MMOD CNN face detector; same-sized frames go through it as one batch."""

    name = "dlib-cnn-face"
    labels: tuple[str, ...] = ("face",)

    def __init__(self, upsample_below: int = 400, batch_size: int = 8) -> None:
        self._cnn = dlib.cnn_face_detection_model_v1(str(models_dir() / "mmod_human_face_detector.dat"))
        self.upsample_below = upsample_below
        self.batch_size = batch_size

    def detect(self, frames: Sequence[np.ndarray]) -> list[list[Detection]]:
        out: list[list[Detection]] = [[] for _ in frames]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, f in enumerate(frames):
            groups.setdefault(f.shape, []).append(i)
        for shape, idx in groups.items():
            up = 1 if shape[1] < self.upsample_below else 0
            rgbs = [np.ascontiguousarray(frames[i][:, :, ::-1]) for i in idx]
            for i, dets in zip(idx, self._cnn(rgbs, up, batch_size=self.batch_size), strict=True):
                out[i] = [Detection(_rect_box(d.rect, shape), float(d.confidence), "face") for d in dets]
        return out


DETECTORS: dict[str, Callable[[], Detector]] = {
    "hog-people": HogPeople,
    "dlib-hog-face": DlibHogFace,
    "haar-face": HaarFace,
    "dlib-cnn-face": DlibCnnFace,
}
"""Each detector by its name (``--detect NAME``)."""

DEFAULT_DETECTORS = ("hog-people", "dlib-hog-face")
"""What ``deskpod video index`` runs unless told: people by HOG, faces by dlib's HOG (see docs/video-models.md)."""


def make_detectors(names: Sequence[str]) -> list[Detector]:
    """The detectors named, in order: a built-in by its name, or a model of a repository by ``repo:PATH/MODEL`` or
    ``repo:PATH/MODEL:VERSION`` (`deskpod.video.model_detector`); an unknown name lists the valid ones."""
    from deskpod.serve.detection import PREFIX

    out: list[Detector] = []
    try:
        for n in names:
            if n.startswith(PREFIX):
                from deskpod.video.model_detector import ModelDetector

                out.append(ModelDetector(n))
            elif n in DETECTORS:
                out.append(DETECTORS[n]())
            else:
                raise ConfigError(
                    f"--detect {n}: no such detector (valid: {', '.join(DETECTORS)}, or a model of a repository: "
                    f"{PREFIX}PATH/MODEL[:VERSION])"
                )
    except BaseException:
        for d in out:
            d.close()
        raise
    return out
