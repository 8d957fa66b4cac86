"""How many real-time streams the indexer holds against a plain per-stream loop, on the same cores (target: 2x).

    .venv/bin/python benchmarks/bench_video_streams.py             # table + JSON, updates docs/benchmarks.md
    .venv/bin/python benchmarks/bench_video_streams.py --seconds 10 --max-streams 2 --no-docs

Each stream is ``vtest.avi`` (768x576 street scene, 10 fps; `tests/video/clips.py`) *played at real time*: a
frame is handed on no sooner than its presentation time after the stream started, as a camera would deliver it,
for ``--seconds`` of video. Every stream is analysed at 5 fps for people (``hog-people``) and faces
(``dlib-hog-face``), faces embedded (dlib's 128-d ResNet, up to 8 sightings per track), boxes tracked (ByteTrack)
and the tracks stored (SQLite, thumbnails), by:

- **deskpod**: `deskpod.video.indexer.index` as ``deskpod video index --fps 5`` runs it: a decoding thread per
  stream, frames of all streams batched (16, at most 0.2 s of waiting) through each detector, whose batch is spread
  over the cores; the benchmark wraps `deskpod.video.sources.read` (the indexer's reader) to pace its frames;
- **plain loop**: the obvious program: one thread per stream, each opening its file with PyAV, decoding, pacing,
  taking a frame every 0.2 s (``frame.to_ndarray(format="bgr24")``), running the same detectors on that one frame,
  tracking with the same ByteTrack, embedding with the same dlib model, writing to its own SQLite file (the same
  `deskpod.video.store.Store`), one transaction per frame.

Both run in a child process pinned to the same cores (``os.sched_setaffinity``, ``--cores``; OpenCV sizes its
thread pool from them). A run *holds real time* when every stream's every sampled frame is analysed and the last
ones are done within ``--slack`` seconds of their presentation time (an overloaded run falls further behind with
each frame, so its lag at the end shows it); each system gets 1, 2, ... streams until it no longer holds. Then
the same ``--capacity-streams`` streams unpaced (read as fast as they decode) give each system's sustained rate, in
streams of 5 fps, a figure finer than the whole number of streams. The per-stage profile is each system's time in
decode, people, faces, embed, track and store, per analysed frame, from its largest run that held (from its
capacity run when none held).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_video_decode import INTRO, SECTION
from docs_section import cpu_model, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SUB = "### Real-time streams: the indexer against a plain per-stream loop (bench_video_streams.py)"
FPS = 5.0
DETECT = ("hog-people", "dlib-hog-face")
STAGES = ("decode", "people", "faces", "embed", "track", "store")
TARGET = 2.0


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Clock:
    """The streams' common start (set by the first frame of any stream) and what each trial records."""

    paced: bool
    seconds: float
    start: float | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    stages: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    max_lag: float = 0.0
    last_due: float = 0.0

    def begin(self) -> float:
        with self.lock:
            if self.start is None:
                self.start = time.monotonic()
            return self.start

    def add(self, stage: str, seconds: float) -> None:
        with self.lock:
            self.stages[stage] += seconds

    def wait_for(self, pts: float) -> None:
        """Sleep until ``pts`` after the start (when paced); note how late the frame is handed on."""
        due = self.begin() + pts
        now = time.monotonic()
        if self.paced and due > now:
            time.sleep(due - now)
        with self.lock:
            self.max_lag = max(self.max_lag, time.monotonic() - due) if self.paced else 0.0
            self.last_due = max(self.last_due, due)


class Timed:
    """A detector whose time goes to a stage of the clock."""

    def __init__(self, inner: Any, stage: str, clock: Clock) -> None:
        self.inner, self.stage, self.clock = inner, stage, clock
        self.name, self.labels = inner.name, inner.labels

    def close(self) -> None:
        self.inner.close()

    def detect(self, frames: Any) -> Any:
        t0 = time.monotonic()
        try:
            return self.inner.detect(frames)
        finally:
            self.clock.add(self.stage, time.monotonic() - t0)


def timed_detectors(clock: Clock) -> None:
    """Make `detectors.make_detectors` hand out timed detectors (people and faces apart)."""
    from deskpod.video import detectors

    for name, stage in zip(DETECT, ("people", "faces"), strict=True):
        cls = detectors.DETECTORS[name]
        detectors.DETECTORS[name] = lambda cls=cls, stage=stage: Timed(cls(), stage, clock)  # type: ignore[misc]


def run_indexer(path: Path, streams: int, clock: Clock, db: Path) -> dict[str, Any]:
    from deskpod.video import indexer, sources

    real_read = sources.read

    def paced_read(source: sources.Source, fps: float, **kw: Any) -> Iterator[sources.Frame]:
        frames = real_read(source, fps, **kw)
        try:
            while True:
                t0 = time.monotonic()
                frame = next(frames, None)
                clock.add("decode", time.monotonic() - t0)
                if frame is None or frame.pts >= clock.seconds:
                    return
                clock.wait_for(frame.pts)
                yield frame
        finally:
            frames.close()  # type: ignore[attr-defined]

    indexer.read = paced_read  # type: ignore[assignment]
    srcs = [sources.Source(f"cam{i}", str(path), live=False) for i in range(streams)]
    rep = indexer.index(srcs, db, indexer.IndexConfig(fps=FPS, detect=DETECT))
    end = time.monotonic()
    for ours, theirs in (("embed", "embed"), ("track", "track"), ("store", "commit")):
        clock.add(ours, rep.stage_seconds[theirs])
    return {"frames": [s.frames for s in rep.streams], "errors": [s.error for s in rep.streams if s.error],
            "end": end, "batches": rep.batches}  # fmt: skip


def run_plain(path: Path, streams: int, clock: Clock, folder: Path) -> dict[str, Any]:
    """One thread per stream, one frame at a time: the loop someone would write first."""
    import av
    import cv2

    from deskpod.video.detectors import make_detectors
    from deskpod.video.faces import FaceEmbedder, normalise
    from deskpod.video.store import Store, TrackRow
    from deskpod.video.tracking import StreamTracker

    frames = [0] * streams
    errors: list[str] = []
    ends = [0.0] * streams

    def one(i: int) -> None:
        people, faces = make_detectors(DETECT)
        embedder = FaceEmbedder()
        tracker = StreamTracker(FPS)
        store = Store(folder / f"cam{i}.db")
        store.resume(f"cam{i}", str(path), False)
        tracks: dict[tuple[str, int], tuple[TrackRow, list[Any], list[float]]] = {}
        next_t = 0.0
        try:
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                t0 = time.monotonic()
                for frame in container.decode(stream):
                    t = float(frame.pts * stream.time_base)
                    if t >= clock.seconds:
                        break
                    if t + 1e-9 < next_t:
                        clock.add("decode", time.monotonic() - t0)
                        t0 = time.monotonic()
                        continue
                    next_t += 1 / FPS
                    image = frame.to_ndarray(format="bgr24")
                    clock.add("decode", time.monotonic() - t0)
                    clock.wait_for(t)
                    found = people.detect([image])[0] + faces.detect([image])[0]
                    b = time.monotonic()
                    seen = tracker.update(found, t, ["person", "face"])
                    c = time.monotonic()
                    clock.add("track", c - b)
                    embed_s = 0.0
                    with store.transaction():
                        for tid, det in seen:
                            row, vectors, best = tracks.setdefault(
                                (det.label, tid), (TrackRow(0, f"cam{i}", det.label, t, t, [], "", None), [], [0.0])
                            )
                            row.end = t
                            row.boxes.append([t, *det.box, det.score])
                            if det.label == "face" and len(vectors) < 8:
                                e0 = time.monotonic()
                                vectors.append(embedder.embed(image, [det.box])[0])
                                row.embedding = normalise(sum(vectors))
                                embed_s += time.monotonic() - e0
                            x1, y1, x2, y2 = (int(v) for v in det.box)
                            if (x2 - x1) * (y2 - y1) > best[0]:
                                best[0] = (x2 - x1) * (y2 - y1)
                                row.id = row.id or store.new_track(row)
                                row.thumbnail = f"{row.id}.jpg"
                                store.thumbnails.mkdir(exist_ok=True)
                                cv2.imwrite(str(store.thumbnails / row.thumbnail), image[y1:y2, x1:x2])
                            row.id = row.id or store.new_track(row)
                            store.update_track(row, closed=False)
                        store.set_progress(f"cam{i}", t)
                    frames[i] += 1
                    ends[i] = time.monotonic()
                    clock.add("embed", embed_s)
                    clock.add("store", ends[i] - c - embed_s)
                    t0 = time.monotonic()
        except Exception as e:  # reported as the stream's error
            errors.append(f"cam{i}: {type(e).__name__}: {e}")
        finally:
            store.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"frames": frames, "errors": errors, "end": max(ends)}


def trial(spec: dict[str, Any]) -> dict[str, Any]:
    """One run, in this (child) process, pinned to ``spec["cores"]``."""
    os.sched_setaffinity(0, spec["cores"])
    import cv2

    cv2.setNumThreads(len(spec["cores"]))
    clock = Clock(paced=spec["paced"], seconds=spec["seconds"])
    timed_detectors(clock)
    path = Path(spec["clip"])
    load, cpu0, wall0 = os.getloadavg()[0], time.process_time(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="deskpod-bench-streams-") as tmp:
        if spec["system"] == "deskpod":
            out = run_indexer(path, spec["streams"], clock, Path(tmp) / "index.db")
        else:
            out = run_plain(path, spec["streams"], clock, Path(tmp))
    analysed = sum(out["frames"])
    expected = spec["streams"] * spec["expected"]
    assert clock.start is not None
    lateness = out["end"] - clock.last_due
    held = not out["errors"] and analysed == expected and lateness <= spec["slack"] and clock.max_lag <= spec["slack"]
    run_s = out["end"] - clock.start
    return {**{k: spec[k] for k in ("system", "streams", "paced")}, "held": held, "analysed": analysed,
            "expected": expected, "errors": out["errors"], "lateness_s": lateness, "max_lag_s": clock.max_lag,
            "run_s": run_s, "rate_streams": analysed / run_s / FPS, "stages": clock.stages,
            "cpu_s": time.process_time() - cpu0, "wall_s": time.monotonic() - wall0, "load": load}  # fmt: skip


def child(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--trial", json.dumps(spec)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"trial {spec['system']} x{spec['streams']} failed:\n{done.stderr[-3000:]}")
    res: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    log(f"{res['system']:8s} {res['streams']} stream(s) {'paced' if res['paced'] else 'unpaced'}: "
        f"{res['analysed']}/{res['expected']} frames, late {res['lateness_s']:+.2f} s, max lag {res['max_lag_s']:.2f} s, "
        f"{res['rate_streams']:.2f} streams' worth, {'held' if res['held'] else 'NOT held'} (load {res['load']:.1f})")  # fmt: skip
    return res


def profile_rows(res: dict[str, Any]) -> list[str]:
    rows = []
    for stage in STAGES:
        cells = []
        for system in ("deskpod", "plain"):
            run = res["profile"][system]
            cells.append(f"{1000 * run['stages'][stage] / max(1, run['analysed']):.1f}")
        rows.append(f"| {stage} | {' | '.join(cells)} |")
    totals = [sum(res["profile"][s]["stages"].values()) * 1000 / max(1, res["profile"][s]["analysed"])
              for s in ("deskpod", "plain")]  # fmt: skip
    rows.append(f"| **sum** | {totals[0]:.1f} | {totals[1]:.1f} |")
    return rows


def report(res: dict[str, Any], command: str) -> str:
    d, p = res["max_held"]["deskpod"], res["max_held"]["plain"]
    ratio = f"{d / p:.2f}x" if p else ("n/a (the plain loop held none)" if d else "n/a (neither held one)")
    cap = res["capacity"]
    trials = [
        f"| {t['system']} | {t['streams']} | {t['analysed']}/{t['expected']} | {t['lateness_s']:+.2f} "
        f"| {t['max_lag_s']:.2f} | {t['rate_streams']:.2f} | {'yes' if t['held'] else 'no'} | {t['load']:.1f} |"
        for t in res["trials"]
    ]
    prof = res["profile"]
    return "\n".join(
        [
            SUB,
            "",
            f"Command: `{command}` ({res['date']}, {res['seconds']:.0f} s in all; this {os.cpu_count()}-core VM, "
            f"{res['cpu']}, both systems pinned to cores {res['cores']}; load average {res['load_before']:.1f} before "
            f"and {res['load_after']:.1f} after, each run's in the table — other engineers' work shares the cores).",
            f"Streams: vtest.avi (768x576, 10 fps) played at real time, {res['args']['seconds']:g} s each, analysed at "
            f"5 fps ({res['expected']} frames per stream) for people and faces, faces embedded, tracked, stored. Held: "
            f"every frame analysed and the last done within {res['args']['slack']:g} s of its time.",
            "",
            f"Most streams held in real time: **deskpod {d}**, plain per-stream loop **{p}**: ratio **{ratio}** "
            f"(target >= {TARGET:g}x: {'**met**' if res['met'] else '**missed**'}). Unpaced, "
            f"{res['args']['capacity_streams']} streams at once: deskpod {cap['deskpod']['rate_streams']:.2f} streams' "
            f"worth of 5 fps, the plain loop {cap['plain']['rate_streams']:.2f} "
            f"({cap['deskpod']['rate_streams'] / cap['plain']['rate_streams']:.2f}x).",
            "",
            "| system | streams | frames analysed | last frame late (s) | max lag at hand-off (s) | rate (streams of 5 fps) | held | load |",
            "|---|---|---|---|---|---|---|---|",
            *trials,
            "",
            f"Per-stage time, ms per analysed frame (summed over threads; deskpod from its run of "
            f"{prof['deskpod']['streams']} stream(s) {'paced' if prof['deskpod']['paced'] else 'unpaced'}, the plain "
            f"loop from its run of {prof['plain']['streams']} {'paced' if prof['plain']['paced'] else 'unpaced'}; "
            "deskpod's decode is its reader threads' time, its people and faces the batch's wall time on the pool, "
            "its store the commit with the thumbnails):",
            "",
            "| stage | deskpod | plain loop |",
            "|---|---|---|",
            *profile_rows(res),
            "",
            res["why"],
        ]
    )


def why(res: dict[str, Any]) -> str:
    cores = len(res["cores"])
    cpu = {s: 1000 * r["cpu_s"] / max(1, r["analysed"]) for s, r in res["profile"].items()}
    faces = sum(r["stages"]["embed"] for r in res["profile"].values())
    return (
        f"Why: the detectors are CPU-bound and work one image at a time (OpenCV's HOG and dlib's HOG have no batched "
        f"kernel; a batch is spread over the cores frame by frame, which is what {cores} threads of a plain loop do "
        f"too). A frame costs {cpu['deskpod']:.0f} ms of CPU in deskpod's run and {cpu['plain']:.0f} ms in the "
        f"plain loop's (all threads, all stages; HOG people at 768x576 most of it), so {cores} cores hold at most "
        f"about {cores * 1000 / (min(cpu.values()) * FPS):.1f} streams at 5 fps whoever schedules the work, and "
        "less on a box other work shares. Batching across streams pays where a model runs a batch in one pass (a "
        "GPU, or dlib's CNN on same-sized frames), not with these detectors on this box."
        + ("" if faces else " (dlib's HOG finds no face in vtest.avi, whose faces are ~15 px: embed is 0.)")
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of each stream played")
    p.add_argument("--max-streams", type=int, default=6)
    p.add_argument("--capacity-streams", type=int, default=2)
    p.add_argument("--slack", type=float, default=1.0, help="seconds the last frame may be late and still count")
    p.add_argument("--cores", default=",".join(map(str, sorted(os.sched_getaffinity(0)))))
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--trial", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trial:
        print(json.dumps(trial(json.loads(args.trial))))
        return 0
    from deskpod.video.sources import Source, read_file
    from tests.video.clips import find

    clip = find("vtest")
    expected = sum(1 for f in read_file(Source(clip.name, str(clip), False), FPS) if f.pts < args.seconds)
    cores = [int(c) for c in args.cores.split(",")]
    started, load_before = time.time(), os.getloadavg()[0]
    base = {"clip": str(clip), "cores": cores, "seconds": args.seconds, "slack": args.slack, "expected": expected}
    trials: list[dict[str, Any]] = []
    max_held: dict[str, int] = {}
    profile: dict[str, dict[str, Any]] = {}
    for system in ("deskpod", "plain"):
        max_held[system] = 0
        for n in range(1, args.max_streams + 1):
            t = child({**base, "system": system, "streams": n, "paced": True})
            trials.append(t)
            if not t["held"]:
                break
            max_held[system], profile[system] = n, t
    capacity = {s: child({**base, "system": s, "streams": args.capacity_streams, "paced": False})
                for s in ("deskpod", "plain")}  # fmt: skip
    for s in ("deskpod", "plain"):
        profile.setdefault(s, capacity[s])
    res: dict[str, Any] = {
        "benchmark": "video_streams", "args": vars(args), "cpu": cpu_model(), "cores": cores, "expected": expected,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": load_before,
        "trials": trials, "capacity": capacity, "profile": profile, "max_held": max_held,
        "load_after": os.getloadavg()[0], "seconds": time.time() - started,
    }  # fmt: skip
    res["met"] = max_held["plain"] > 0 and max_held["deskpod"] >= TARGET * max_held["plain"]
    res["why"] = why(res)
    return publish(res, res["met"], only=False, docs=not args.no_docs, report=report, section=SECTION,
                   subsection=SUB, intro=INTRO)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
