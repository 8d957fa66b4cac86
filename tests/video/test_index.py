"""The indexer on the real clips: many streams at once (files and a live RTSP stream), a SIGKILL mid-stream and a
restart that goes on from the last commit without duplicates, a broken source beside good ones."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deskpod.video.indexer import IndexConfig, index
from deskpod.video.sources import Backoff, expand_sources
from deskpod.video.store import Store
from tests.video.clips import clip
from tests.video.rtsp import RtspStream

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_three_clips_and_a_live_stream_at_once(tmp_path: Path) -> None:
    live = RtspStream(clip("carphone"), tmp_path / "rtsp.log").start()
    try:
        sources = expand_sources([str(clip("vtest")), str(clip("carphone")), str(clip("cockatoo")), live.url])
        report = index(sources, tmp_path / "v.db", IndexConfig(live_for_s=20.0, backoff=Backoff(give_up_s=20)))
    finally:
        live.stop()
    stats = {s.name: s for s in report.streams}
    assert not report.failed, [s.error for s in report.failed]
    assert stats["vtest.avi"].frames == 398 and stats["carphone_pristine.mp4"].frames == 20
    assert stats["cockatoo.mp4"].frames == 70 and stats[live.url].frames >= 20
    assert 0 < stats[live.url].max_lag < 60  # behind live by what this box could not keep up with
    with Store(tmp_path / "v.db") as store:
        people = store.tracks(stream="vtest.avi", label="person")
        faces = store.tracks(stream="carphone_pristine.mp4", label="face")
        live_faces = store.tracks(stream=live.url, label="face")
        assert len(people) >= 10 and faces and live_faces
        assert not store.tracks(stream="cockatoo.mp4", label="face")
        assert all(t.embedding is not None and abs(float((t.embedding**2).sum()) - 1) < 1e-4 for t in faces)
        assert all((store.thumbnails / t.thumbnail).is_file() for t in people + faces)
        assert live_faces[0].start > 1.6e9  # wall-clock times
        assert {s.state for s in store.streams()} == {"done"}


def test_a_broken_source_fails_alone(tmp_path: Path) -> None:
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00" * 4096)
    lines: list[str] = []
    sources = expand_sources([str(bad), str(clip("carphone"))])
    report = index(sources, tmp_path / "v.db", IndexConfig(detect=("dlib-hog-face",)), on_event=lines.append)
    assert [s.name for s in report.failed] == ["broken.mp4"]
    assert "broken.mp4: cannot open" in report.failed[0].error
    with Store(tmp_path / "v.db") as store:
        states = {s.name: (s.state, s.error) for s in store.streams()}
        assert states["carphone_pristine.mp4"] == ("done", "")
        assert states["broken.mp4"][0] == "failed"
        assert store.tracks(stream="carphone_pristine.mp4")


def boxes(db: Path) -> list[tuple[str, str, float]]:
    with sqlite3.connect(db) as c:
        return [(s, lab, b[0]) for s, lab, bx in c.execute("SELECT stream, label, boxes FROM tracks")
                for b in json.loads(bx)]  # fmt: skip


@pytest.mark.slow
def test_sigkill_mid_stream_then_restart_goes_on_from_the_last_commit_without_duplicates(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    argv = [sys.executable, "-m", "deskpod", "video", "index", str(clip("vtest")), "--db", str(db),
            "--detect", "hog-people", "--batch", "4"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    killed_at = None
    while time.monotonic() < deadline:
        if db.exists():
            with sqlite3.connect(db) as c:
                row = c.execute("SELECT last_pts FROM streams").fetchone()
            if row and row[0] is not None and row[0] > 20:
                proc.send_signal(signal.SIGKILL)
                break
        time.sleep(0.2)
    proc.wait()
    with sqlite3.connect(db) as c:
        killed_at = c.execute("SELECT last_pts FROM streams").fetchone()[0]
        open_before = c.execute("SELECT count(*) FROM tracks WHERE open=1").fetchone()[0]
    assert proc.returncode == -signal.SIGKILL and 20 < killed_at < 79
    first = boxes(db)
    assert first and max(t for _, _, t in first) <= killed_at + 1e-6
    assert open_before >= 0
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"resuming after {killed_at:.2f} s" in done.stderr
    second = boxes(db)
    times = [t for _, _, t in second]
    assert max(times) > 75
    assert second[: len(first)] == first  # the first run's committed tracks are as they were
    later = second[len(first) :]
    assert all(t > killed_at for _, _, t in later)
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT id, boxes FROM tracks").fetchall()
    seen = set()
    for _, bx in rows:
        for b in json.loads(bx):
            key = (b[0], *b[1:5])
            assert key not in seen  # one box at one time in one track only
            seen.add(key)
