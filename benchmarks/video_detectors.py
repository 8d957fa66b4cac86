"""Candidate face and people detectors on the hand-made ground truth: precision and recall at IoU 0.5, time per frame.

    .venv/bin/python benchmarks/video_detectors.py              # table + JSON, rewrites the table in docs/video-models.md
    .venv/bin/python benchmarks/video_detectors.py --no-docs

Faces: 30 frames of carphone_pristine.mp4 (176x144), 30 faces. People: 20 frames of vtest.avi (768x576), 116 people
(6 more too small or hidden, ignored). Both boxed by hand (tests/data/video/README.md), matched PASCAL-style
(tests/video/groundtruth.py). Each detector runs at its own default operating point; nothing is tuned on these frames.

The candidates. deskpod's own detectors (`deskpod.video.detectors`, by their names) and, beside them, what the
issue lists that installs offline, called directly with cv2/dlib: OpenCV's other frontal cascades (Haar alt2 from
cv2.data; LBP from Debian's opencv-data, when installed), and OpenCV's HOG people detector at a finer stride, on a
1.5x enlarged frame (for people under its 128 px window), and its Daimler model (a 48x96 window).

Time: milliseconds per frame, one frame at a time on one thread (the floor a stream pays), median of the frames after
one untimed frame; the box is shared, so compare the rows, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import dlib
import numpy as np
from docs_section import cpu_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deskpod.video.detectors import DETECTORS, person_in_window  # noqa: E402
from tests.video.groundtruth import Box, frames, load, score  # noqa: E402

DOCS = ROOT / "docs" / "video-models.md"
BEGIN, END = "<!-- video_detectors.py: begin -->", "<!-- video_detectors.py: end -->"
LBP = Path("/usr/share/opencv4/lbpcascades")

Found = list[tuple[Box, float]]


def deskpod_detector(name: str) -> Callable[[np.ndarray], Found]:
    det = DETECTORS[name]()
    return lambda frame: [(d.box, d.score) for d in det.detect([frame])[0]]


def cascade(path: Path, min_neighbors: int = 5, min_size: int = 24) -> Callable[[np.ndarray], Found]:
    """An OpenCV cascade with the same settings as deskpod's haar-face (scale 1.1, 5 neighbours, 24 px)."""
    c = cv2.CascadeClassifier(str(path))
    if c.empty():
        raise SystemExit(f"cascade {path} did not load")

    def run(frame: np.ndarray) -> Found:
        gray = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
        rects, _, weights = c.detectMultiScale3(
            gray, scaleFactor=1.1, minNeighbors=min_neighbors, minSize=(min_size, min_size), outputRejectLevels=True
        )
        return [((x, y, x + w, y + h), float(s)) for (x, y, w, h), s in zip(rects, np.ravel(weights), strict=True)]

    return run


def hog(
    stride: int = 8, enlarge: float = 1.0, daimler: bool = False, min_score: float = 0.5
) -> Callable[[np.ndarray], Found]:
    """OpenCV's HOG people detector (default 64x128 or Daimler 48x96), the frame optionally enlarged first; boxes
    around the person (`person_in_window`: the Daimler windows have the same proportions of margin)."""
    if daimler:
        h = cv2.HOGDescriptor((48, 96), (16, 16), (8, 8), (8, 8), 9)
        h.setSVMDetector(cv2.HOGDescriptor_getDaimlerPeopleDetector())
    else:
        h = cv2.HOGDescriptor()
        h.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())

    def run(frame: np.ndarray) -> Found:
        img = cv2.resize(frame, None, fx=enlarge, fy=enlarge) if enlarge != 1.0 else frame
        rects, weights = h.detectMultiScale(img, winStride=(stride, stride), padding=(8, 8), scale=1.05)
        return [
            (person_in_window(x / enlarge, y / enlarge, w / enlarge, hh / enlarge), float(s))
            for (x, y, w, hh), s in zip(rects, np.ravel(weights), strict=True)
            if s >= min_score
        ]

    return run


def candidates() -> dict[str, list[tuple[str, str, Callable[[np.ndarray], Found]]]]:
    """Per clip: (name, how, detector) of each candidate."""
    haar = Path(cv2.data.haarcascades)
    faces = [
        ("dlib-hog-face", "deskpod: dlib HOG, upsampled once below 400 px", deskpod_detector("dlib-hog-face")),
        ("dlib-cnn-face", "deskpod: dlib MMOD CNN, upsampled once below 400 px", deskpod_detector("dlib-cnn-face")),
        ("haar-face", "deskpod: Haar frontalface_default, scale 1.1, 5 neighbours", deskpod_detector("haar-face")),
        (
            "haar alt2",
            "cv2.data haarcascade_frontalface_alt2, same settings",
            cascade(haar / "haarcascade_frontalface_alt2.xml"),
        ),
    ]
    for name in ("lbpcascade_frontalface.xml", "lbpcascade_frontalface_improved.xml"):
        if (LBP / name).is_file():
            faces.append(
                (
                    f"lbp {name[len('lbpcascade_') : -4]}",
                    f"Debian opencv-data {name}, same settings",
                    cascade(LBP / name),
                )
            )
    people = [
        (
            "hog-people",
            "deskpod: HOG 64x128, stride 8, scale 1.05, score >= 0.5; the person in the window (`person_in_window`)",
            deskpod_detector("hog-people"),
        ),
        ("hog x2", "HOG 64x128, stride 8, frame enlarged 2x, person box", hog(enlarge=2.0)),
        ("hog all scores", "HOG 64x128, stride 8, every box (score >= 0), person box", hog(min_score=0.0)),
        ("hog x1.5", "HOG 64x128, stride 8, frame enlarged 1.5x, person box", hog(enlarge=1.5)),
        ("hog daimler", "HOG Daimler 48x96, stride 8, score >= 0.5, person box", hog(daimler=True)),
    ]
    return {"carphone": faces, "vtest": people}


def measure(name: str, detect: Callable[[np.ndarray], Found], imgs: Sequence[np.ndarray], truth: Any) -> dict[str, Any]:
    detect(imgs[0])  # untimed: first-call set-up
    found, times = [], []
    for img in imgs:
        t0 = time.perf_counter()
        found.append(detect(img))
        times.append((time.perf_counter() - t0) * 1000)
    s = score(truth, found)
    return {
        "name": name,
        "precision": s.precision,
        "recall": s.recall,
        "true_positives": s.true_positives,
        "false_positives": s.false_positives,
        "misses": s.misses,
        "mean_iou": s.mean_iou,
        "ms_per_frame": statistics.median(times),
    }


def table(rows: list[dict[str, Any]], hows: dict[str, str]) -> str:
    lines = [
        "| detector | settings | precision | recall | TP / FP / missed | mean IoU of hits | ms per frame |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {hows[r['name']]} | {r['precision']:.3f} | {r['recall']:.3f} | "
            f"{r['true_positives']} / {r['false_positives']} / {r['misses']} | {r['mean_iou']:.2f} | {r['ms_per_frame']:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--only", choices=["carphone", "vtest"], help="one clip (prints, writes no docs)")
    args = parser.parse_args()
    cv2.setNumThreads(1)  # one frame on one thread: the per-stream cost (deskpod spreads a batch over threads)
    results: dict[str, Any] = {"benchmark": "video_detectors", "opencv": cv2.__version__, "dlib": dlib.__version__}
    text = []
    for clip, cands in candidates().items():
        if args.only and clip != args.only:
            continue
        truth = load(clip)
        imgs = frames(clip, truth)
        rows = [measure(n, d, imgs, truth) for n, _, d in cands]
        results[clip] = rows
        boxes = sum(len(f.boxes) for f in truth)
        what = "faces" if clip == "carphone" else "people"
        text.append(
            f"**{what.capitalize()}**: {clip}, {len(truth)} frames, {boxes} {what} boxed by hand.\n\n"
            + table(rows, {n: h for n, h, _ in cands})
        )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    block = (
        f"{BEGIN}\nCommand: `.venv/bin/python benchmarks/video_detectors.py` ({when}; {cpu_model()}, {os.cpu_count()} cores, one thread per "
        f"frame; OpenCV {cv2.__version__}, dlib {dlib.__version__}; load average {os.getloadavg()[0]:.1f}).\n\n"
        + "\n\n".join(text)
        + f"\n{END}"
    )
    print(block)
    print(json.dumps(results))
    if not args.no_docs and not args.only:
        doc = DOCS.read_text()
        if BEGIN not in doc:
            raise SystemExit(f"{DOCS} has no {BEGIN} ... {END} block to replace")
        DOCS.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, doc, flags=re.S))
    return 0


if __name__ == "__main__":
    sys.exit(main())
