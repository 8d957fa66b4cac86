"""``deskpod video`` as a user runs it: index, search, bad input as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from deskpod import cli
from tests.video.clips import clip


def test_index_then_search_by_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "v.db"
    assert cli.main(["video", "index", str(clip("carphone")), "--db", str(db), "--detect", "dlib-hog-face"]) == 0
    out = capsys.readouterr().out
    assert "carphone_pristine.mp4" in out and "batches in" in out
    photo = db.with_name(db.name + ".thumbs") / "1.jpg"
    assert cli.main(["video", "search", "--face", str(photo), "--db", str(db), "--export", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert "carphone_pristine.mp4" in out and "wrote" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["video", "index", "/nonexistent.mp4", "--db", "DB"], "no such file or folder"),
        (["video", "index", "CLIP", "--db", "DB", "--detect", "yolo"], "--detect yolo: no such detector (valid: "),
        (["video", "index", "CLIP", "--db", "DB", "--fps", "0"], "--fps 0"),
        (["video", "search", "--face", "CLIP", "--db", "DB"], "not an image"),
        (["video", "search", "--face", "MESSI", "--db", "NODB"], "no such index database"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    subst = {"CLIP": str(clip("carphone")), "DB": str(tmp_path / "v.db"), "NODB": str(tmp_path / "none.db"),
             "MESSI": str(clip("messi"))}  # fmt: skip
    assert cli.main([subst.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("deskpod: ") and message in err[0], err


def test_a_broken_source_fails_the_run_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00" * 4096)
    argv = ["video", "index", str(bad), str(clip("carphone")), "--db", str(tmp_path / "v.db"), "--detect", "haar-face"]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert "deskpod: broken.mp4: cannot open" in captured.err
    assert "carphone_pristine.mp4" in captured.out
