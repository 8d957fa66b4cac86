"""``deskpod video``: index camera streams and video files; search them for a face.

deskpod video index SOURCE... --db DB [--fps 5] [--detect NAME ...] [--stats FILE]   people and faces, into DB
deskpod video search --face PHOTO --db DB [--top K] [--since T] [--until T] [--stream S] [--export DIR]

A SOURCE is a video file, a folder of them, or a live URL (rtsp://, http(s)://). Indexing resumes where an
earlier run into the same DB committed. docs/video.md is the guide.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "video",
        help="video analytics: index camera streams and files (people, faces, tracks); search by a face photo",
        description="Index many video streams at once (people and faces, tracked) into an SQLite database, "
        "and search it for a face by photo.",
    )
    p.set_defaults(extra=("video", p.prog))
    video = p.add_subparsers(dest="video_command", metavar="WHAT")
    video.required = True

    i = video.add_parser(
        "index",
        help="index video files, folders and live streams into DB",
        description="Decode each SOURCE (a video file, a folder of them, an rtsp:// or http(s):// stream), sample "
        "frames at --fps, detect people and faces on batches of frames from all streams, track them, and write "
        "one row per track into DB (SQLite; thumbnails beside it). A rerun resumes each file where it stopped.",
    )
    i.add_argument("sources", nargs="+", metavar="SOURCE", help="video file, folder of videos, or live URL")
    i.add_argument("--db", required=True, metavar="DB", help="the index database (created when missing)")
    i.add_argument("--fps", type=float, default=5.0, help="frames analysed per second of video (default 5)")
    i.add_argument(
        "--detect",
        nargs="+",
        metavar="NAME",
        help="detectors: hog-people, dlib-hog-face, haar-face, dlib-cnn-face (default: hog-people dlib-hog-face)",
    )
    i.add_argument("--batch", type=int, default=16, metavar="N", help="frames per batch across streams (default 16)")
    i.add_argument("--live-for", type=float, metavar="S", help="stop live streams after S seconds (default: never)")
    i.add_argument(
        "--stats",
        metavar="FILE",
        help="rewrite FILE (JSON) every few seconds with each stream's fps, lag, "
        "frames, tracks and state, and the newest tracks (what a video job's dashboard page shows)",
    )
    i.set_defaults(func=run_index)

    s = video.add_parser(
        "search",
        help="the tracks whose face matches a photo, best first",
        description="Find the tracks in DB whose face matches the one face in PHOTO: stream, time span, cosine "
        "similarity and thumbnail, best first; --export writes a contact sheet per matching track.",
    )
    s.add_argument("--face", required=True, metavar="PHOTO", help="a photo of one face (JPEG, PNG, ...)")
    s.add_argument("--db", required=True, metavar="DB", help="the index database")
    s.add_argument("--top", type=int, default=10, metavar="K", help="at most K results (default 10)")
    s.add_argument("--since", type=float, metavar="T", help="tracks that end at or after T (seconds)")
    s.add_argument("--until", type=float, metavar="T", help="tracks that start at or before T (seconds)")
    s.add_argument("--stream", metavar="NAME", help="only this stream (its file name or URL)")
    s.add_argument("--threshold", type=float, metavar="S", help="least cosine similarity of a match (default 0.93)")
    s.add_argument("--export", metavar="DIR", help="write a contact sheet (JPEG) per matching track into DIR")
    s.add_argument("--json", action="store_true", help="print the results as JSON")
    s.set_defaults(func=run_search)


def run_index(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deskpod.errors import ConfigError
    from deskpod.video.detectors import DEFAULT_DETECTORS
    from deskpod.video.indexer import IndexConfig, index
    from deskpod.video.sources import expand_sources

    if args.batch < 1:
        raise ConfigError(f"--batch {args.batch}: give a positive number of frames, e.g. 16")
    if args.fps <= 0:
        raise ConfigError(f"--fps {args.fps}: give a positive rate, e.g. 5")
    sources = expand_sources(args.sources)
    config = IndexConfig(fps=args.fps, detect=tuple(args.detect or DEFAULT_DETECTORS), batch=args.batch,
                         live_for_s=args.live_for)  # fmt: skip
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)

    def say(line: str) -> None:
        print(f"deskpod: {line}", file=sys.stderr, flush=True)

    progress = None
    if args.stats:
        from deskpod.video.progress import ProgressFile

        progress = ProgressFile(Path(args.stats), Path(args.db)).write
    try:
        report = index(sources, Path(args.db), config, stop=stop, on_event=say, on_progress=progress)
    except KeyboardInterrupt:
        stop.set()
        raise
    print(f"{'stream':<40} {'frames':>7} {'fps':>7} {'lag s':>7} {'tracks':>7}  error")
    for st in report.streams:
        print(f"{st.name[:40]:<40} {st.frames:>7} {st.fps:>7.1f} {st.max_lag:>7.2f} {st.tracks:>7}  {st.error}")
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in report.stage_seconds.items())
    print(f"{report.batches} batches in {report.seconds:.1f} s ({stages})")
    return 1 if report.failed else 0


def run_search(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from deskpod.video.search import THRESHOLD, export_sheets, search_face

    matches = search_face(Path(args.db), Path(args.face), top=args.top, since=args.since, until=args.until,
                          stream=args.stream,
                          threshold=THRESHOLD if args.threshold is None else args.threshold)  # fmt: skip
    sheets = export_sheets(Path(args.db), matches, Path(args.export)) if args.export else []
    if args.json:
        print(json.dumps([{"track": m.track, "stream": m.stream, "start": m.start, "end": m.end,
                           "similarity": round(m.similarity, 4),
                           "thumbnail": str(m.thumbnail) if m.thumbnail else None} for m in matches], indent=2))  # fmt: skip
    elif not matches:
        print("no track matches that face")
    else:
        print(f"{'track':>6} {'similarity':>10} {'start s':>9} {'end s':>9}  stream / thumbnail")
        for m in matches:
            print(f"{m.track:>6} {m.similarity:>10.3f} {m.start:>9.2f} {m.end:>9.2f}  {m.stream}  {m.thumbnail or ''}")
    for path in sheets:
        print(f"wrote {path}")
    return 0
