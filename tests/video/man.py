"""The man in carphone, split in two: a clip of its first 2.5 s and a photo of him from 3.3 s (a frame the clip
does not hold), for the tests that find him by photo (tests/video/test_search.py, tests/video/test_pod.py)."""

from __future__ import annotations

from pathlib import Path

import cv2

from deskpod.video.sources import expand_sources, read
from tests.video.clips import clip

CUT_S = 2.5
PHOTO_S = 3.3


def clip_and_photo(folder: Path) -> tuple[Path, Path]:
    """``folder/carphone-start.mp4`` (carphone before `CUT_S`) and ``folder/man.png`` (its first frame after
    `PHOTO_S`), written; their paths."""
    cut = folder / "carphone-start.mp4"
    frames = list(read(expand_sources([str(clip("carphone"))])[0], 30))
    writer = cv2.VideoWriter(str(cut), cv2.VideoWriter_fourcc(*"mp4v"), 30, (176, 144))
    for f in frames:
        if f.pts < CUT_S:
            writer.write(f.image)
    writer.release()
    photo = folder / "man.png"
    cv2.imwrite(str(photo), next(f.image for f in frames if f.pts > PHOTO_S))
    return cut, photo
