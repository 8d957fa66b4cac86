"""Face search on the real clips: the carphone face found from a photo taken from another part of the clip, other
people's faces (Messi, the astronaut) below the threshold, bad photos as one clear line, contact sheets."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from deskpod.errors import DataError, UsageError
from deskpod.video.faces import embed_photo
from deskpod.video.indexer import IndexConfig, index
from deskpod.video.search import THRESHOLD, export_sheets, search_face, sync_index
from deskpod.video.sources import expand_sources
from deskpod.video.store import Store
from tests.video.clips import clip
from tests.video.man import clip_and_photo


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """carphone's first 2.5 s indexed with cockatoo; a photo of the man from 3.3 s (a frame never analysed)."""
    folder = tmp_path_factory.mktemp("search")
    cut, photo = clip_and_photo(folder)
    db = folder / "v.db"
    report = index(expand_sources([str(cut), str(clip("cockatoo"))]), db, IndexConfig(detect=("dlib-hog-face",)))
    assert not report.failed
    return db, photo


def test_the_face_is_found_from_a_photo_of_another_part_of_the_clip(indexed: tuple[Path, Path]) -> None:
    db, photo = indexed
    matches = search_face(db, photo)
    assert matches and {m.stream for m in matches} == {"carphone-start.mp4"}
    assert matches[0].similarity >= 0.95 and matches[0].thumbnail is not None and matches[0].thumbnail.is_file()
    assert matches[0].end < 2.5
    assert [m.similarity for m in matches] == sorted((m.similarity for m in matches), reverse=True)


@pytest.mark.parametrize("other", ["messi", "astronaut"])
def test_other_faces_score_below_the_threshold(indexed: tuple[Path, Path], other: str) -> None:
    db, _ = indexed
    assert search_face(db, clip(other)) == []
    scores = [m.similarity for m in search_face(db, clip(other), threshold=-1.0)]
    assert scores and max(scores) < THRESHOLD


def test_filters_by_stream_and_time(indexed: tuple[Path, Path]) -> None:
    db, photo = indexed
    assert search_face(db, photo, stream="cockatoo.mp4") == []
    assert search_face(db, photo, since=100.0) == []
    assert len(search_face(db, photo, top=1)) == 1
    with pytest.raises(UsageError, match="--stream nope: no such stream"):
        search_face(db, photo, stream="nope")
    with pytest.raises(UsageError, match="--top 0"):
        search_face(db, photo, top=0)


def test_the_face_index_beside_the_db_is_kept_in_step_and_rebuilt_when_lost(indexed: tuple[Path, Path]) -> None:
    db, photo = indexed
    with Store(db) as store:
        n = len(sync_index(store))
        assert n == sum(1 for _ in store.embeddings())
        db.with_name(db.name + ".faces").write_bytes(b"damaged")
        assert len(sync_index(store)) == n
    assert search_face(db, photo)


def test_contact_sheets(indexed: tuple[Path, Path], tmp_path: Path) -> None:
    db, photo = indexed
    matches = search_face(db, photo)
    sheets = export_sheets(db, matches, tmp_path / "out")
    assert len(sheets) == len(matches)
    image = cv2.imread(str(sheets[0]))
    assert image is not None and image.shape[0] >= 128


def test_bad_photos_are_one_clear_line(tmp_path: Path) -> None:
    text = tmp_path / "notes.jpg"
    text.write_text("not a picture")
    with pytest.raises(DataError, match=r"notes\.jpg: not an image"):
        embed_photo(text)
    blank = tmp_path / "wall.png"
    cv2.imwrite(str(blank), np.full((200, 200, 3), 128, np.uint8))
    with pytest.raises(DataError, match=r"wall\.png: no face found"):
        embed_photo(blank)
    two = tmp_path / "two.png"
    face = cv2.imread(str(clip("astronaut")))
    cv2.imwrite(str(two), np.hstack([face, face]))
    with pytest.raises(DataError, match=r"two\.png: 2 faces found at"):
        embed_photo(two)
    with pytest.raises(DataError, match="no such photo"):
        embed_photo(tmp_path / "missing.jpg")
