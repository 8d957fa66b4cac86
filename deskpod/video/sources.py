"""Video sources: files, folders of files and live URLs, decoded by PyAV and sampled at a steady rate.

A SOURCE, as the user gives it, is a video file (anything FFmpeg reads), a folder of them (its video files, by
name, not recursing), or a live URL (``rtsp://``, ``rtsp+tcp://``-style options aside, ``http://``, ``https://``:
HLS, MJPEG, MPEG-TS over HTTP). Each becomes one `Source`, named by its file name or URL, which is the stream's
name in the store.

Decoding uses FFmpeg's frame threads (``thread_type = "AUTO"``: slice and frame threads, as ``ffmpeg -threads N``);
every frame is decoded (a P-frame needs the ones before it), but only the sampled ones are converted to BGR
pixels (`to_bgr`: OpenCV's SIMD converter for 4:2:0 video, 2-3x swscale's bgr24 path here), which is where most
of the time beyond decoding would otherwise go. With more than one thread, a file is decoded on a thread of its
own a few frames ahead (`_ahead`), so converting one frame overlaps decoding the next (PyAV decodes without the
GIL): a codec FFmpeg cannot thread (MPEG-4 part 2, MS-MPEG4) still uses two cores. Frames are sampled at ``fps`` by
presentation time: the first frame at or after each multiple of ``1/fps`` seconds, so the same file sampled twice
gives the same frames, and a restart after ``after`` seconds gives exactly the frames a run that never stopped
would have given after that point.

A live source has no fixed start: its frames are stamped with wall-clock time (Unix seconds) anchored when the
connection opens, and its lag is how far that stamp trails the clock when the frame is handed on. When the
connection drops it reconnects with exponential backoff (``Backoff``) until ``give_up_s`` passes without a frame;
a file that cannot be opened or decoded, or a URL that never answers, raises `StreamError` for that source only.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np

from deskpod.errors import ConfigError, StreamError

LIVE_SCHEMES = ("rtsp://", "rtsps://", "http://", "https://", "rtmp://", "srt://", "udp://", "tcp://")
"""URL prefixes taken as live streams."""

VIDEO_SUFFIXES = frozenset(
    [
        ".avi",
        ".mp4",
        ".m4v",
        ".mkv",
        ".mov",
        ".webm",
        ".ts",
        ".mts",
        ".m2ts",
        ".mpg",
        ".mpeg",
        ".flv",
        ".wmv",
        ".3gp",
        ".ogv",
        ".h264",
        ".h265",
        ".hevc",
        ".y4m",
    ]
)
"""What a folder's files must end with to be taken as videos (a single file given by name is tried whatever it is)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """One stream to index."""

    name: str
    """The stream's name: the file's name, or the URL as given (the store keys streams by it)."""
    location: str
    """What FFmpeg opens: a file path or a URL."""
    live: bool
    """True for a URL: frames are stamped with wall-clock time, and a dropped connection is reopened."""


@dataclasses.dataclass(slots=True)
class Frame:
    """One sampled frame."""

    stream: str
    """`Source.name` of the stream it came from."""
    pts: float
    """Its time in seconds: the presentation time within a file; wall-clock Unix seconds for a live source."""
    index: int
    """Its number among the sampled frames of this stream in this run (0, 1, ...)."""
    image: np.ndarray
    """Pixels, BGR, uint8, height x width x 3 (what OpenCV and the detectors take)."""
    lag: float = 0.0
    """Seconds by which this frame trails live when handed on (0 for a file)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff:
    """How a live source reconnects: waits of ``first_s``, doubled each failure up to ``max_s``."""

    first_s: float = 0.5
    """The first wait after a drop."""
    max_s: float = 8.0
    """The longest wait between tries."""
    give_up_s: float = 60.0
    """Stop with `StreamError` when no frame has come for this long (also the open and read time-out)."""

    def waits(self) -> Iterator[float]:
        wait = self.first_s
        while True:
            yield wait
            wait = min(wait * 2, self.max_s)


def expand_sources(specs: Sequence[str]) -> list[Source]:
    """The sources the user named: each file, each video file of each folder, each URL; names must be unique."""
    sources: list[Source] = []
    for spec in specs:
        if spec.startswith(LIVE_SCHEMES):
            sources.append(Source(name=spec, location=spec, live=True))
            continue
        path = Path(spec)
        if path.is_dir():
            videos = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES)
            if not videos:
                raise ConfigError(
                    f"{spec}: a folder with no video files (looked for {', '.join(sorted(VIDEO_SUFFIXES))})"
                )
            sources.extend(Source(name=p.name, location=str(p), live=False) for p in videos)
        elif path.is_file():
            sources.append(Source(name=path.name, location=str(path), live=False))
        elif "://" in spec:
            raise ConfigError(f"{spec}: not a stream URL deskpod reads (valid: {', '.join(LIVE_SCHEMES)})")
        else:
            raise ConfigError(
                f"{spec}: no such file or folder (give a video file, a folder of them, or an rtsp:// URL)"
            )
    seen: dict[str, str] = {}
    for s in sources:
        if s.name in seen:
            raise ConfigError(f"two sources named {s.name!r} ({seen[s.name]} and {s.location}): rename one")
        seen[s.name] = s.location
    return sources


def open_container(source: Source, timeout_s: float) -> Any:
    """``source`` opened with PyAV (``timeout_s`` for opening and for each read); `StreamError` when it cannot be."""
    # RTSP: FFmpeg's default transport (UDP, then TCP when UDP gets nothing): some servers speak only one.
    try:
        return av.open(source.location, timeout=(timeout_s, timeout_s))
    except (av.FFmpegError, OSError) as e:
        raise StreamError(f"{source.name}: cannot open {source.location}: {e}", source.name) from e


def video_stream(container: Any, source: Source, threads: int) -> Any:
    """The container's first video stream, set to decode on ``threads`` threads; `StreamError` when it has none."""
    if not container.streams.video:
        container.close()
        raise StreamError(f"{source.name}: {source.location} has no video stream", source.name)
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    stream.thread_count = threads  # 0: FFmpeg picks one thread per core
    return stream


_BT601 = frozenset({2, 5, 6})
"""FFmpeg's colour spaces that swscale converts with BT.601 coefficients, as OpenCV does: unspecified,
BT470BG, SMPTE170M (AVColorSpace numbers)."""


def to_bgr(frame: Any) -> np.ndarray:
    """A decoded video frame as BGR uint8 pixels (height x width x 3). 4:2:0 video in limited range with BT.601
    colours (most cameras and files) goes through OpenCV's I420 converter, which gives swscale's pixels to a
    rounding step (mean difference about 1 level) in a third of the time; anything else through swscale."""
    if (
        frame.format.name == "yuv420p"
        and frame.color_range != 2  # AVCOL_RANGE_JPEG: full range, which OpenCV's converter does not take
        and frame.colorspace in _BT601
        and not (frame.width | frame.height) & 1
    ):
        bgr: np.ndarray = cv2.cvtColor(frame.to_ndarray(format="yuv420p"), cv2.COLOR_YUV2BGR_I420)
        return bgr
    pixels: np.ndarray = frame.to_ndarray(format="bgr24")
    return pixels


class Sampler:
    """Which decoded frames to keep: the first at or after each multiple of ``1/fps`` past ``after``."""

    def __init__(self, fps: float, after: float | None = None) -> None:
        if fps <= 0:
            raise ConfigError(f"--fps {fps}: give a positive rate, e.g. 5")
        self.step = 1.0 / fps
        self.after = after
        self.next_k = 0 if after is None else int(after / self.step + 1e-9) + 1

    def take(self, t: float) -> bool:
        if self.after is not None and t <= self.after + 1e-9:
            return False
        k = int(t / self.step + 1e-9)
        if t + 1e-9 >= self.next_k * self.step:
            self.next_k = k + 1
            return True
        return False


def read_file(source: Source, fps: float, *, after: float | None = None, threads: int = 0) -> Iterator[Frame]:
    """The sampled frames of a file, from the start or from just after ``after`` seconds (a restart)."""
    container = open_container(source, 30.0)
    try:
        stream = video_stream(container, source, threads)
        base = stream.time_base or Fraction(1, 90000)
        start = float(stream.start_time * base) if stream.start_time is not None else 0.0
        if after is not None and after > 1.0:
            container.seek(int((after + start - 1.0) / base), stream=stream, backward=True, any_frame=False)
        sampler = Sampler(fps, after)
        index = 0
        frames = decode(container, stream, source)
        if threads != 1 and (threads > 1 or (os.cpu_count() or 1) > 1):
            frames = _ahead(frames)
        try:
            for frame in frames:
                if frame.pts is None:
                    continue
                t = float(frame.pts * base) - start
                if sampler.take(t):
                    yield Frame(source.name, t, index, to_bgr(frame))
                    index += 1
        finally:
            frames.close()  # the decoding thread stops before the container closes
    finally:
        container.close()


def decode(container: Any, stream: Any, source: Source) -> Generator[Any]:
    """Every frame of ``stream``, in order; a decoding error becomes `StreamError` naming the source."""
    try:
        yield from container.decode(stream)
    except av.FFmpegError as e:
        raise StreamError(f"{source.name}: {source.location} is corrupt or unreadable: {e}", source.name) from e


_END = object()


def _ahead(frames: Iterator[Any], depth: int = 4) -> Generator[Any]:
    """``frames``, taken from them on a thread of their own up to ``depth`` ahead; their error is raised here.
    The thread has stopped when this generator ends or is closed (so the container can then be closed)."""
    box: queue.Queue[Any] = queue.Queue(depth)
    done = threading.Event()

    def put(item: Any) -> bool:
        while not done.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for f in frames:
                if not put(f):
                    return
            put(_END)
        except BaseException as e:  # handed to the reader, who raises it
            put(e)

    thread = threading.Thread(target=run, name="deskpod-decode", daemon=True)
    thread.start()
    try:
        while (item := box.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        done.set()
        thread.join()


def read_live(
    source: Source,
    fps: float,
    *,
    backoff: Backoff = Backoff(),
    threads: int = 0,
    stop: threading.Event | None = None,
    on_event: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.time,
) -> Iterator[Frame]:
    """The sampled frames of a live URL, reconnecting after a drop; `StreamError` after ``backoff.give_up_s``
    without a frame. ``on_event`` hears each drop and reconnect as one line (for the indexer's log)."""
    stop = stop or threading.Event()
    index = 0
    last_frame_at = clock()
    sampler: Sampler | None = None
    last_t = 0.0
    waits = backoff.waits()
    connects = 0
    while not stop.is_set():
        try:
            container = open_container(source, min(backoff.give_up_s, 10.0))
        except StreamError as e:
            if clock() - last_frame_at > backoff.give_up_s:
                raise StreamError(f"{e} (no frame for {backoff.give_up_s:g} s; gave up)", source.name) from e
            wait = next(waits)
            if on_event:
                on_event(f"{source.name}: cannot connect ({e}); retrying in {wait:g} s")
            stop.wait(wait)
            continue
        connects += 1
        if connects > 1 and on_event:
            on_event(f"{source.name}: reconnected")
        try:
            stream = video_stream(container, source, threads)
            base = stream.time_base or Fraction(1, 90000)
            anchor_wall: float | None = None
            anchor_pts = 0.0
            for frame in decode(container, stream, source):
                if stop.is_set():
                    return
                if frame.pts is None:
                    continue
                p = float(frame.pts * base)
                now = clock()
                if anchor_wall is None:
                    anchor_wall, anchor_pts = now, p
                    sampler = Sampler(fps, last_t)  # after a reconnect: nothing at or before the last frame handed on
                t = anchor_wall + (p - anchor_pts)
                last_frame_at = now
                waits = backoff.waits()
                assert sampler is not None
                if sampler.take(t):
                    yield Frame(source.name, t, index, to_bgr(frame), lag=max(0.0, now - t))
                    index += 1
                    last_t = t
        except StreamError as e:
            if on_event:
                on_event(f"{source.name}: stream dropped ({e})")
        finally:
            container.close()
        if stop.is_set():
            return
        if clock() - last_frame_at > backoff.give_up_s:
            raise StreamError(
                f"{source.name}: no frame from {source.location} for {backoff.give_up_s:g} s; gave up", source.name
            )
        wait = next(waits)
        if on_event:
            on_event(f"{source.name}: stream ended; reconnecting in {wait:g} s")
        stop.wait(wait)


def read(
    source: Source,
    fps: float,
    *,
    after: float | None = None,
    threads: int = 0,
    backoff: Backoff = Backoff(),
    stop: threading.Event | None = None,
    on_event: Callable[[str], None] | None = None,
) -> Iterator[Frame]:
    """The sampled frames of any source (`read_file` or `read_live`)."""
    if source.live:
        return read_live(source, fps, backoff=backoff, threads=threads, stop=stop, on_event=on_event)
    return read_file(source, fps, after=after, threads=threads)


def decode_all(location: str, threads: int = 0) -> int:
    """Decode every frame of a file and return how many (what the decode benchmark times against ffmpeg)."""
    source = Source(Path(location).name, location, live=False)
    container = open_container(source, 30.0)
    try:
        stream = video_stream(container, source, threads)
        return sum(1 for _ in decode(container, stream, source))
    finally:
        container.close()
