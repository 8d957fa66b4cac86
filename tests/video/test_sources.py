"""Sources on the real clips: sampling by time, resuming, corrupt files, dead URLs, a live RTSP stream that drops."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest

from deskpod.errors import ConfigError, StreamError
from deskpod.video.sources import Backoff, expand_sources, read
from tests.video.clips import clip
from tests.video.rtsp import RtspStream


def test_a_file_is_sampled_at_the_rate_by_its_times_and_resumes_with_the_same_frames() -> None:
    (source,) = expand_sources([str(clip("carphone"))])
    frames = list(read(source, 5))
    assert len(frames) == 20  # 120 frames at 29.97 fps: 4.0 s at 5 fps
    assert [f.index for f in frames] == list(range(20))
    assert all(abs(b.pts - a.pts - 0.2) < 0.04 for a, b in itertools.pairwise(frames))
    assert frames[0].image.shape == (144, 176, 3) and frames[0].stream == "carphone_pristine.mp4"
    again = list(read(source, 5, after=frames[7].pts))
    assert [f.pts for f in again] == [f.pts for f in frames[8:]]


def test_a_folder_is_its_videos_and_names_must_be_unique(tmp_path: Path) -> None:
    (tmp_path / "a.mp4").symlink_to(clip("carphone"))
    (tmp_path / "notes.txt").write_text("not a video")
    assert [s.name for s in expand_sources([str(tmp_path)])] == ["a.mp4"]
    with pytest.raises(ConfigError, match=r"two sources named 'a\.mp4'"):
        expand_sources([str(tmp_path), str(tmp_path / "a.mp4")])
    with pytest.raises(ConfigError, match="no such file or folder"):
        expand_sources([str(tmp_path / "missing.mp4")])
    with pytest.raises(ConfigError, match="not a stream URL"):
        expand_sources(["ftp://example/x"])


def test_a_corrupt_file_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(clip("carphone").read_bytes()[:2000])  # the header, cut before any picture
    (source,) = expand_sources([str(bad)])
    with pytest.raises(StreamError, match=r"broken\.mp4"):
        list(read(source, 5))
    junk = tmp_path / "junk.avi"
    junk.write_bytes(b"\x00" * 4096)
    with pytest.raises(StreamError, match=r"junk\.avi: cannot open"):
        list(read(expand_sources([str(junk)])[0], 5))


def test_a_dead_url_gives_up_after_its_time_with_one_error() -> None:
    from tests.video.rtsp import free_port

    (source,) = expand_sources([f"rtsp://127.0.0.1:{free_port()}/nothing"])
    events: list[str] = []
    with pytest.raises(StreamError, match=r"gave up"):
        list(read(source, 5, backoff=Backoff(first_s=0.1, max_s=0.4, give_up_s=2.0), on_event=events.append))
    assert events and all("cannot connect" in e for e in events)


@pytest.mark.slow
def test_a_live_rtsp_stream_reports_lag_and_reconnects_when_the_server_comes_back(tmp_path: Path) -> None:
    stream = RtspStream(clip("carphone"), tmp_path / "rtsp.log").start()
    events: list[str] = []
    stop = threading.Event()
    try:
        (source,) = expand_sources([stream.url])
        frames = read(source, 5, backoff=Backoff(first_s=0.2, max_s=1.0, give_up_s=30), stop=stop,
                      on_event=events.append)  # fmt: skip
        before = [next(frames) for _ in range(5)]
        assert all(f.lag < 5 for f in before)
        stream.stop()
        stream.start()
        after = [next(frames) for _ in range(5)]
        stop.set()
    finally:
        stream.stop()
    assert any("reconnected" in e for e in events), events
    times = [f.pts for f in before + after]
    assert times == sorted(times) and len(set(times)) == len(times)
