"""The hand-made ground truth of tests/data/video/ (see its README), and precision/recall at IoU 0.5 against it.

`load` reads a clip's boxes; `frames` decodes the annotated frames of the clip (PyAV, BGR as the detectors take
them); `score` matches a detector's boxes to the truth the way PASCAL VOC does: detections best score first, each
taking the unmatched true box it overlaps most if the IoU is at least 0.5 (a true positive); one that overlaps only
an ``ignore`` box (IoU >= 0.5) is not counted; every other one is a false positive, and every true box left unmatched
is a miss.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from tests.video.clips import clip

DATA = Path(__file__).resolve().parents[1] / "data" / "video"
TRUTH = {"carphone": "carphone_faces.json", "vtest": "vtest_people.json"}
"""Clip name (tests.video.clips) -> its ground-truth file."""

Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class Frame:
    """One annotated frame."""

    index: int
    """The frame's number in decode order, from 0."""
    boxes: list[Box]
    """The objects that count (x1, y1, x2, y2 pixels)."""
    ignore: list[Box]
    """Objects too small or too hidden to count either way."""


def load(name: str) -> list[Frame]:
    data = json.loads((DATA / TRUTH[name]).read_text())
    return [Frame(f["index"], [tuple(b) for b in f["boxes"]], [tuple(b) for b in f["ignore"]]) for f in data["frames"]]


def frames(name: str, truth: Sequence[Frame]) -> list[np.ndarray]:
    """The annotated frames of clip ``name``, decoded (BGR uint8), in the order of ``truth``."""
    wanted = {f.index for f in truth}
    got: dict[int, np.ndarray] = {}
    with av.open(str(clip(name))) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i in wanted:
                got[i] = frame.to_ndarray(format="bgr24")
            if len(got) == len(wanted):
                break
    return [got[f.index] for f in truth]


def iou(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@dataclass(frozen=True, slots=True)
class Score:
    """Counts over all frames, and what follows from them."""

    true_positives: int
    false_positives: int
    misses: int
    mean_iou: float
    """Mean IoU of the true positives with their true boxes (how tight the boxes are, on the rule's convention)."""

    @property
    def precision(self) -> float:
        found = self.true_positives + self.false_positives
        return self.true_positives / found if found else 1.0

    @property
    def recall(self) -> float:
        total = self.true_positives + self.misses
        return self.true_positives / total if total else 1.0


def score(truth: Sequence[Frame], found: Sequence[Sequence[tuple[Box, float]]], threshold: float = 0.5) -> Score:
    """Match ``found`` (per frame: (box, score) pairs) against ``truth`` at IoU >= ``threshold``."""
    tp = fp = miss = 0
    ious: list[float] = []
    for frame, dets in zip(truth, found, strict=True):
        free = list(frame.boxes)
        for box, _ in sorted(dets, key=lambda d: -d[1]):
            best = max(free, key=lambda t: iou(box, t), default=None)
            if best is not None and iou(box, best) >= threshold:
                tp += 1
                ious.append(iou(box, best))
                free.remove(best)
            elif not any(iou(box, t) >= threshold for t in frame.ignore):
                fp += 1
        miss += len(free)
    return Score(tp, fp, miss, float(np.mean(ious)) if ious else 0.0)
