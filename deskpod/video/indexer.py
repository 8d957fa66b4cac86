"""The indexer: many streams at once, their frames batched together through the detectors, committed per batch.

One decoding thread per source (PyAV decodes outside the GIL, on FFmpeg's own threads too) feeds one bounded
queue; the main loop takes up to ``batch`` frames from it, whatever their streams, waiting at most ``max_wait_s``
for a batch to fill, runs each detector once on the batch (`detectors` spread a batch over the cores), tracks
each frame's boxes in its stream's `tracking.StreamTracker`, embeds the faces of face tracks, and commits the
batch in one transaction (`store`). A source that fails (`StreamError`) is marked failed with its one-line error
and the others go on; the run's `IndexReport` lists each stream's frames, fps, lag and error.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import cv2
import numpy as np

from deskpod.environment.files import write_bytes
from deskpod.errors import StreamError
from deskpod.video.detectors import DEFAULT_DETECTORS, Detection, Detector, make_detectors
from deskpod.video.faces import FaceEmbedder, normalise
from deskpod.video.sources import Backoff, Frame, Source, read
from deskpod.video.store import Store, TrackRow
from deskpod.video.tracking import StreamTracker


@dataclasses.dataclass(frozen=True, slots=True)
class IndexConfig:
    """How to index."""

    fps: float = 5.0
    """Frames analysed per second of video, per stream."""
    detect: tuple[str, ...] = DEFAULT_DETECTORS
    """Detectors by name (`detectors.DETECTORS`), or models of a repository (``repo:PATH/MODEL[:VERSION]``)."""
    batch: int = 16
    """Frames per batch through the detectors (taken across streams)."""
    max_wait_s: float = 0.2
    """Longest wait for a batch to fill before running a partial one (keeps live lag low)."""
    threads: int = 0
    """Decode threads per stream (0: FFmpeg's choice)."""
    embeddings_per_track: int = 8
    """Face vectors averaged into a track's embedding (its first N sightings with the largest box kept best)."""
    lost_after_s: float = 2.0
    """A track unseen this long is closed."""
    live_for_s: float | None = None
    """Stop live sources after this many seconds (None: run until interrupted or until the files are done
    and ``stop`` is set)."""
    backoff: Backoff = dataclasses.field(default_factory=Backoff)
    """Reconnection of live sources."""


@dataclasses.dataclass(slots=True)
class StreamStats:
    """What one stream did in this run."""

    name: str
    frames: int = 0
    """Frames analysed."""
    seconds: float = 0.0
    """Wall time from its first frame to its last."""
    lag: float = 0.0
    """The last frame's lag behind live (0 for files)."""
    max_lag: float = 0.0
    tracks: int = 0
    """Tracks started."""
    resumed_from: float | None = None
    """Committed progress it restarted from."""
    error: str = ""
    """Why it stopped early ("" when it did not)."""
    state: str = "indexing"
    """``indexing``, then ``done``, ``failed`` (with its `error`) or ``stopped`` (the run ended before it did)."""
    first_at: float = 0.0

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


@dataclasses.dataclass(slots=True)
class IndexReport:
    streams: list[StreamStats]
    batches: int
    seconds: float
    stage_seconds: dict[str, float]
    """Time in each stage of the main loop: detect, track, embed, commit."""

    @property
    def failed(self) -> list[StreamStats]:
        return [s for s in self.streams if s.error]


@dataclasses.dataclass(slots=True)
class _Track:
    row: TrackRow
    stored: bool = False
    best_area: float = 0.0
    crop: np.ndarray | None = None
    vectors: list[np.ndarray] = dataclasses.field(default_factory=list)
    dirty: bool = True


_DONE = "done"


def index(
    sources: Sequence[Source],
    db: Path,
    config: IndexConfig = IndexConfig(),
    *,
    stop: threading.Event | None = None,
    on_event: Callable[[str], None] | None = None,
    on_progress: Callable[[Sequence[StreamStats], Store, bool], None] | None = None,
) -> IndexReport:
    """Index ``sources`` into the database at ``db``, resuming where an earlier run committed. ``on_progress``
    is called (on this thread) after each committed batch with every stream's figures and the store, and with
    ``True`` when a stream ends and when the run does (`deskpod.video.progress` writes them to a file)."""
    detectors = make_detectors(config.detect)
    try:
        return _index(sources, db, config, detectors, stop=stop or threading.Event(), say=on_event or (lambda _: None),
                      on_progress=on_progress)  # fmt: skip
    finally:
        for d in detectors:
            d.close()


def _index(
    sources: Sequence[Source],
    db: Path,
    config: IndexConfig,
    detectors: Sequence[Detector],
    *,
    stop: threading.Event,
    say: Callable[[str], None],
    on_progress: Callable[[Sequence[StreamStats], Store, bool], None] | None,
) -> IndexReport:
    labels = sorted({label for d in detectors for label in d.labels})
    embedder = FaceEmbedder() if "face" in labels else None
    store = Store(db)
    stats = {s.name: StreamStats(s.name) for s in sources}
    trackers = {s.name: StreamTracker(config.fps, config.lost_after_s) for s in sources}
    active: dict[tuple[str, str, int], _Track] = {}
    inbox: queue.Queue[Frame | tuple[str, str, str]] = queue.Queue(maxsize=max(4, config.batch * 2))
    stages = dict.fromkeys(("detect", "track", "embed", "commit"), 0.0)
    started = time.monotonic()

    live_stop = threading.Event()  # set at live_for_s, or with stop: the live sources' end (files run to theirs)

    def feed(source: Source, after: float | None) -> None:
        error = ""
        halt = live_stop if source.live else stop
        try:
            for frame in read(source, config.fps, after=after, threads=config.threads, backoff=config.backoff,
                              stop=halt, on_event=say):  # fmt: skip
                while not halt.is_set():
                    try:
                        inbox.put(frame, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if halt.is_set():
                    break
        except StreamError as e:
            error = str(e)
        except Exception as e:  # a decoder's own failure: that stream's error, not the run's
            error = f"{source.name}: {type(e).__name__}: {e}"
        inbox.put((_DONE, source.name, error))

    feeders = []
    for s in sources:
        after = store.resume(s.name, s.location, s.live)
        stats[s.name].resumed_from = after
        if after is not None and not s.live:
            say(f"{s.name}: resuming after {after:.2f} s")
        t = threading.Thread(
            target=feed, args=(s, None if s.live else after), name=f"deskpod-read-{s.name}", daemon=True
        )
        feeders.append(t)
    for t in feeders:
        t.start()
    if config.live_for_s is not None and any(s.live for s in sources):
        timer = threading.Timer(config.live_for_s, live_stop.set)
        timer.daemon = True
        timer.start()

    running = {s.name for s in sources}
    batches = 0

    def end_live_with_stop() -> None:
        stop.wait()
        live_stop.set()

    threading.Thread(target=end_live_with_stop, daemon=True).start()
    try:
        while running:
            batch: list[Frame] = []
            finished: list[tuple[str, str]] = []
            deadline: float | None = None
            while len(batch) < config.batch and running:
                timeout = 0.5 if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    item = inbox.get(timeout=timeout)
                except queue.Empty:
                    if deadline is not None:
                        break
                    continue
                if isinstance(item, tuple):  # closed after this batch, which may hold its last frames
                    _, name, error = item
                    running.discard(name)
                    finished.append((name, error))
                    continue
                batch.append(item)
                if deadline is None:
                    deadline = time.monotonic() + config.max_wait_s
            if batch:
                _run_batch(batch, detectors, labels, embedder, trackers, active, store, stats, config, stages)
                batches += 1
                if on_progress is not None:
                    on_progress(list(stats.values()), store, False)
            for name, error in finished:
                _close_stream(store, active, name, error, stats[name], say)
            if finished and on_progress is not None:
                on_progress(list(stats.values()), store, True)
    finally:
        stop.set()
        live_stop.set()
        for st in stats.values():
            if st.state == "indexing":  # stopped (a signal, --live-for) or interrupted before its end
                st.state = "stopped"
        if on_progress is not None:
            on_progress(list(stats.values()), store, True)
        store.close()
    return IndexReport(list(stats.values()), batches, time.monotonic() - started, stages)


def _close_stream(
    store: Store, active: dict[tuple[str, str, int], _Track], name: str, error: str, st: StreamStats,
    say: Callable[[str], None],
) -> None:  # fmt: skip
    with store.transaction():
        for key in [k for k in active if k[0] == name]:
            tr = active.pop(key)
            if tr.stored:
                store.update_track(tr.row, closed=True)
    store.finish(name, error)
    st.error = error
    st.state = "failed" if error else "done"
    say(f"{error}" if error else f"{name}: done, {st.frames} frames at {st.fps:.1f} fps")


def _run_batch(
    batch: list[Frame],
    detectors: Sequence[Detector],
    labels: list[str],
    embedder: FaceEmbedder | None,
    trackers: dict[str, StreamTracker],
    active: dict[tuple[str, str, int], _Track],
    store: Store,
    stats: dict[str, StreamStats],
    config: IndexConfig,
    stages: dict[str, float],
) -> None:
    t0 = time.monotonic()
    images = [f.image for f in batch]
    found: list[list[Detection]] = [[] for _ in batch]
    for d in detectors:
        for i, dets in enumerate(d.detect(images)):
            found[i].extend(dets)
    t1 = time.monotonic()
    stages["detect"] += t1 - t0
    to_embed: list[tuple[Frame, _Track, Detection]] = []
    for frame, dets in zip(batch, found, strict=True):
        st = stats[frame.stream]
        now = time.monotonic()
        if st.frames == 0:
            st.first_at = now
        st.frames += 1
        st.seconds = now - st.first_at
        st.lag = frame.lag
        st.max_lag = max(st.max_lag, frame.lag)
        for tid, det in trackers[frame.stream].update(dets, frame.pts, labels):
            key = (frame.stream, det.label, tid)
            tr = active.get(key)
            x1, y1, x2, y2 = det.box
            entry = [round(frame.pts, 4), round(x1, 1), round(y1, 1), round(x2, 1), round(y2, 1), round(det.score, 3)]
            if tr is None:
                tr = active[key] = _Track(TrackRow(0, frame.stream, det.label, frame.pts, frame.pts, [], "", None))
                st.tracks += 1
            tr.row.end = frame.pts
            tr.row.boxes.append(entry)
            tr.dirty = True
            area = (x2 - x1) * (y2 - y1)
            if area > tr.best_area:
                tr.best_area = area
                tr.crop = _crop(frame.image, det.box)
            if det.label == "face" and embedder is not None and len(tr.vectors) < config.embeddings_per_track:
                to_embed.append((frame, tr, det))
    t2 = time.monotonic()
    stages["track"] += t2 - t1
    if embedder is not None:
        by_frame: dict[int, list[tuple[_Track, Detection]]] = {}
        frames: dict[int, Frame] = {}
        for frame, tr, det in to_embed:
            by_frame.setdefault(id(frame), []).append((tr, det))
            frames[id(frame)] = frame
        for fid, items in by_frame.items():
            vectors = embedder.embed(frames[fid].image, [d.box for _, d in items])
            for (tr, _), v in zip(items, vectors, strict=True):
                tr.vectors.append(v)
                tr.row.embedding = normalise(np.mean(tr.vectors, axis=0))
    t3 = time.monotonic()
    stages["embed"] += t3 - t2
    last = {f.stream: f.pts for f in batch}
    with store.transaction():
        for key, tr in list(active.items()):
            closed = last.get(key[0], tr.row.end) - tr.row.end > config.lost_after_s
            if tr.dirty or closed:
                if not tr.stored:
                    tr.row.id = store.new_track(tr.row)
                    tr.stored = True
                if tr.crop is not None and tr.dirty:
                    name = f"{tr.row.id}.jpg"
                    store.thumbnails.mkdir(exist_ok=True)
                    ok, jpg = cv2.imencode(".jpg", tr.crop)
                    if ok:
                        write_bytes(store.thumbnails / name, jpg.tobytes())
                        tr.row.thumbnail = name
                store.update_track(tr.row, closed=closed)
                tr.dirty = False
            if closed:
                del active[key]
        for stream, pts in last.items():
            store.set_progress(stream, pts)
    stages["commit"] += time.monotonic() - t3


def _crop(image: np.ndarray, box: tuple[float, float, float, float], margin: float = 0.15) -> np.ndarray:
    h, w = image.shape[:2]
    x1, y1, x2, y2 = box
    mx, my = (x2 - x1) * margin, (y2 - y1) * margin
    a, b = max(0, int(x1 - mx)), max(0, int(y1 - my))
    c, d = min(w, int(x2 + mx) + 1), min(h, int(y2 + my) + 1)
    return image[b:d, a:c].copy()
