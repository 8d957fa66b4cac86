"""``deskpod video``: index camera streams and video files; search them for a face.

deskpod video index SOURCE... --db DB [--fps 5] [--detect NAME ...] [--stats FILE] [--rules RULES [--webhook URL]]
                                                                    people and faces, into DB (and watched)
deskpod video index SOURCE... --db DB --shard K/N      shard K's share of the sources, into <stem>.shardK.db
deskpod video search --face PHOTO --db DB [--top K] [--since T] [--until T] [--stream S] [--export DIR]
deskpod video watch --db DB --rules RULES [--webhook URL]          live alerts while DB is indexed
deskpod video alerts --db DB                                        the alerts raised, with their delivery
deskpod video crops DB --out DIR [--label person|face] [--min-size PX] [--classes a,b]   pictures of tracks to sort
deskpod video search --classifier RUN_OR_MODEL --label NAME --db DB [--top K] [--min-score P]   tracks it recognises

A detector NAME is a built-in one or a model of a repository, repo:PATH/MODEL[:VERSION], whose config declares its
output layout. A SOURCE is a video file, a folder of them, or a live URL (rtsp://, http(s)://). Indexing resumes where an
earlier run into the same DB committed. A search of DB reads DB and its shards (a Slurm video job's: one per
node). docs/video.md is the guide.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deskpod.video.rules import Rule


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "video",
        help="video analytics: index camera streams and files (people, faces, tracks); search by a face photo",
        description="Index many video streams at once (people and faces, tracked) into an SQLite database, "
        "and search it for a face by photo.",
    )
    p.set_defaults(extra=("video", p.prog))
    video = p.add_subparsers(dest="video_command", metavar="WHAT", required=True)

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
        help="detectors: hog-people, dlib-hog-face, haar-face, dlib-cnn-face (default: hog-people dlib-hog-face), "
        "or a model of a repository that declares its output layout: repo:PATH/MODEL[:VERSION] (docs/video.md)",
    )
    i.add_argument("--batch", type=int, default=16, metavar="N", help="frames per batch across streams (default 16)")
    i.add_argument("--live-for", type=float, metavar="S", help="stop live streams after S seconds (default: never)")
    i.add_argument(
        "--stats",
        metavar="FILE",
        help="rewrite FILE (JSON) every few seconds with each stream's fps, lag, "
        "frames, tracks and state, and the newest tracks (what a video job's dashboard page shows)",
    )
    i.add_argument(
        "--shard",
        metavar="K/N",
        help="index only shard K's share of the sources (sorted, dealt round-robin over N shards) into "
        "DB's shard K, <stem>.shardK.db: what each node of a Slurm video job runs",
    )
    i.add_argument("--rules", metavar="RULES",
                   help="also watch DB by these rules while indexing, on a thread of this process (as deskpod "
                        "video watch: a rules file of [[rule]] tables)")  # fmt: skip
    i.add_argument("--rules-json", metavar="JSON", help=argparse.SUPPRESS)  # a video job's rules (absolute photos)
    i.add_argument("--webhook", metavar="URL", help="with --rules: POST each alert as JSON to this http(s) URL")
    i.set_defaults(func=run_index)

    s = video.add_parser(
        "search",
        help="the tracks whose face matches a photo, best first",
        description="Find the tracks in DB whose face matches the one face in PHOTO: stream, time span, cosine "
        "similarity and thumbnail, best first; --export writes a contact sheet per matching track. Or, with "
        "--classifier (a run trained on deskpod video crops, or a model folder) and --label, the tracks it "
        "recognises as that class, best first.",
    )
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--face", metavar="PHOTO", help="a photo of one face (JPEG, PNG, ...)")
    what.add_argument("--classifier", metavar="RUN_OR_MODEL", help="a training run or model folder (with --label)")
    s.add_argument("--label", metavar="NAME", help="with --classifier: the class to find (one of the model's labels)")
    s.add_argument(
        "--min-score", type=float, metavar="P", help="with --classifier: least mean probability (default 0.5)"
    )
    s.add_argument("--db", required=True, metavar="DB", help="the index database")
    s.add_argument("--top", type=int, default=10, metavar="K", help="at most K results (default 10)")
    s.add_argument("--since", type=float, metavar="T", help="tracks that end at or after T (seconds)")
    s.add_argument("--until", type=float, metavar="T", help="tracks that start at or before T (seconds)")
    s.add_argument("--stream", metavar="NAME", help="only this stream (its file name or URL)")
    s.add_argument("--threshold", type=float, metavar="S", help="least cosine similarity of a match (default 0.93)")
    s.add_argument("--export", metavar="DIR", help="write a contact sheet (JPEG) per matching track into DIR")
    s.add_argument("--json", action="store_true", help="print the results as JSON")
    s.set_defaults(func=run_search)

    w = video.add_parser(
        "watch",
        help="live alerts while DB is indexed: a watch-list face, a person entering or loitering in a region",
        description="Follow DB while an indexer writes it (this or another process), judge each new or grown track "
        "by the rules in RULES (TOML [[rule]] tables: kind = face, enter or loiter; docs/video.md), and raise each "
        "alert once: stored in DB, printed, and POSTed as JSON to --webhook. A restart goes on where it stopped.",
    )
    w.add_argument("--db", required=True, metavar="DB", help="the index database (made when missing)")
    w.add_argument("--rules", required=True, metavar="RULES", help="the rules file (TOML)")
    w.add_argument("--webhook", metavar="URL", help="POST each alert as JSON to this http(s) URL")
    w.add_argument("--poll", type=float, default=1.0, metavar="S", help="seconds between looks at DB (default 1)")
    w.add_argument("--history", action="store_true",
                   help="a rule new to DB judges the tracks already there too (default: from those open now on)")  # fmt: skip
    w.add_argument("--once", action="store_true", help="judge what is new once, deliver, and exit")
    w.set_defaults(func=run_watch)

    a = video.add_parser(
        "alerts",
        help="the alerts raised on DB, newest first, with their delivery",
        description="List the alerts `deskpod video watch` raised on DB, newest first: rule, kind, stream, track, "
        "stream time, what fired it, and its webhook delivery (none, pending, sent, failed and why).",
    )
    a.add_argument("--db", required=True, metavar="DB", help="the index database")
    a.add_argument("--limit", type=int, default=50, metavar="N", help="at most N alerts (default 50)")
    a.add_argument("--since-id", type=int, default=0, metavar="ID", help="only alerts after this id")
    a.add_argument("--json", action="store_true", help="print the alerts as JSON")
    a.set_defaults(func=run_alerts)
    c = video.add_parser(
        "crops",
        help="write crops of DB's tracks as an image folder to sort into classes (for deskpod train)",
        description="Cut a few crops of each track of DB out of its source video into DIR/unsorted/, with "
        "DIR/crops.json naming each crop's track. Move them into class folders (--classes makes empty ones), "
        "train with deskpod train --data imagefolder:DIR, then find tracks with deskpod video search --classifier.",
    )
    c.add_argument("db", metavar="DB", help="the index database")
    c.add_argument(
        "--out", required=True, metavar="DIR", help="the image folder (created; a rerun adds new crops only)"
    )
    c.add_argument("--label", metavar="LABEL", help="only tracks of this label: person or face (default: all)")
    c.add_argument("--min-size", type=int, default=0, metavar="PX", help="only boxes at least PX on their shorter side")
    c.add_argument("--per-track", type=int, default=4, metavar="N", help="crops per track (default 4)")
    c.add_argument("--classes", metavar="A,B", help="make these empty class folders beside unsorted/")
    c.set_defaults(func=run_crops)


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
    db = Path(args.db)
    if args.shard is not None:
        from deskpod.video.shards import deal, parse_shard, shard_path

        k, n = parse_shard(args.shard)
        sources, db = deal(sources, k, n), shard_path(db, k)
        names = ", ".join(s.name for s in sources) or "none (more shards than streams)"
        print(f"deskpod: shard {k}/{n} into {db}: {names}", file=sys.stderr, flush=True)
    rules = _index_rules(args)  # before indexing: a bad rule or photo is the run's one line
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

        stats = ProgressFile(Path(args.stats), db)
        progress = stats.write
        say = functools.partial(_say_and_note, stats.event)
    watcher = None
    if rules:
        from deskpod.video.alerts import Webhook
        from deskpod.video.watch import WatchThread

        watcher = WatchThread(db, rules, webhook=Webhook(args.webhook) if args.webhook else None,
                              on_alert=lambda a: print(a.line(), flush=True), on_event=say)  # fmt: skip
        say(f"watching with {_rules_line(rules)}")
        watcher.start()
    try:
        report = index(sources, db, config, stop=stop, on_event=say, on_progress=progress)
    except KeyboardInterrupt:
        stop.set()
        raise
    finally:
        if watcher is not None:
            watched = watcher.finish()
            delivered = f", {watched.sent} sent, {watched.failed} failed" if args.webhook else ""
            say(f"watch: {watched.alerts} alerts from {watched.tracks_judged} track versions{delivered}")
    print(f"{'stream':<40} {'frames':>7} {'fps':>7} {'lag s':>7} {'tracks':>7}  error")
    for st in report.streams:
        print(f"{st.name[:40]:<40} {st.frames:>7} {st.fps:>7.1f} {st.max_lag:>7.2f} {st.tracks:>7}  {st.error}")
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in report.stage_seconds.items())
    print(f"{report.batches} batches in {report.seconds:.1f} s ({stages})")
    return 1 if report.failed or (watcher is not None and watcher.error) else 0


def _rules_line(rules: Sequence[Rule]) -> str:
    """``2 rules: door (enter), suspect (face)``: what a watcher says it watches with."""
    return f"{len(rules)} rule{'s' if len(rules) > 1 else ''}: " + ", ".join(f"{r.name} ({r.kind})" for r in rules)


def _say_and_note(note: Callable[[str], None], line: str) -> None:
    print(f"deskpod: {line}", file=sys.stderr, flush=True)
    note(line)


def _index_rules(args: argparse.Namespace) -> list[Rule]:
    """``index``'s watch rules: from ``--rules`` (a file) or ``--rules-json`` (a video job's), or none."""
    import json
    from pathlib import Path

    from deskpod.errors import ConfigError, UsageError

    if args.rules and args.rules_json:
        raise UsageError("give --rules or --rules-json, not both")
    if not (args.rules or args.rules_json):
        if args.webhook:
            raise UsageError("--webhook goes with --rules: the webhook receives the rules' alerts")
        return []
    from deskpod.video.rules import load_rules, parse_rules

    if args.rules:
        return list(load_rules(Path(args.rules)))
    try:
        tables = json.loads(args.rules_json)
    except ValueError as e:
        raise ConfigError(f"--rules-json: not valid JSON ({e}); give a list of rule tables") from None
    return list(parse_rules({"rule": tables}, source="video.rules", base_dir=None))


def run_search(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from deskpod.video.search import THRESHOLD, export_sheets, search_face

    if args.classifier is not None:
        return run_classifier_search(args)
    if args.label is not None or args.min_score is not None:
        from deskpod.errors import UsageError

        raise UsageError("--label and --min-score go with --classifier, not --face")
    matches = search_face(Path(args.db), Path(args.face), top=args.top, since=args.since, until=args.until,
                          stream=args.stream,
                          threshold=THRESHOLD if args.threshold is None else args.threshold)  # fmt: skip
    sheets = export_sheets(Path(args.db), matches, Path(args.export)) if args.export else []
    if args.json:
        print(json.dumps([{"track": m.track, "stream": m.stream, "start": m.start, "end": m.end,
                           "similarity": round(m.similarity, 4),
                           "thumbnail": str(m.thumbnail) if m.thumbnail else None,
                           "db": str(m.db) if m.db else None} for m in matches], indent=2))  # fmt: skip
    elif not matches:
        print("no track matches that face")
    else:
        print(f"{'track':>6} {'similarity':>10} {'start s':>9} {'end s':>9}  stream / thumbnail")
        for m in matches:
            print(f"{m.track:>6} {m.similarity:>10.3f} {m.start:>9.2f} {m.end:>9.2f}  {m.stream}  {m.thumbnail or ''}")
    for path in sheets:
        print(f"wrote {path}")
    return 0


def run_watch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deskpod.errors import ConfigError
    from deskpod.video.alerts import Webhook
    from deskpod.video.rules import load_rules
    from deskpod.video.watch import watch

    if args.poll <= 0:
        raise ConfigError(f"--poll {args.poll}: give a positive number of seconds, e.g. 1")
    webhook = Webhook(args.webhook) if args.webhook else None
    rules = load_rules(Path(args.rules))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())  # stop after this poll, deliver, exit
    say = functools.partial(print, "deskpod:", file=sys.stderr, flush=True)
    say(f"watching {args.db} with {_rules_line(rules)}")
    report = watch(Path(args.db), rules, webhook=webhook, poll_s=args.poll, history=args.history, once=args.once,
                   stop=stop, on_alert=lambda a: print(a.line(), flush=True), on_event=say)  # fmt: skip
    delivered = f", {report.sent} sent, {report.failed} failed" if webhook else ""
    say(f"{report.alerts} alerts from {report.tracks_judged} track versions in {report.polls} polls{delivered}")
    return 1 if report.failed else 0


def run_alerts(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from deskpod.video.alerts import recent_alerts

    alerts = recent_alerts(Path(args.db), args.since_id, args.limit)
    if args.json:
        print(json.dumps([a.to_json() for a in alerts], indent=2))
    elif not alerts:
        print("no alerts")
    else:
        print(
            f"{'id':>5} {'raised':<19} {'rule':<20} {'kind':<6} {'track':>6} {'at s':>9}  {'delivery':<8} stream / why"
        )
        for a in alerts:
            raised = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.created))
            why = ", ".join(f"{k} {v}" for k, v in a.detail.items())
            state = a.state + (f" ({a.error})" if a.error else "")
            print(f"{a.id:>5} {raised:<19} {a.rule[:20]:<20} {a.kind:<6} {a.track:>6} {a.t:>9.2f}  {state:<8} "
                  f"{a.stream}: {why}")  # fmt: skip
    return 0


def run_crops(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deskpod.video.crops import CropConfig, write_crops

    classes = tuple(c.strip() for c in args.classes.split(",")) if args.classes else ()
    config = CropConfig(label=args.label, min_size=args.min_size, per_track=args.per_track, classes=classes)
    r = write_crops(Path(args.db), Path(args.out), config)
    notes = [f"{r.existing} already there"] if r.existing else []
    notes += [f"{r.too_small} tracks with no box of {args.min_size} px"] if r.too_small else []
    notes += [f"{r.from_thumbnail} tracks from their thumbnail (live stream or file gone)"] if r.from_thumbnail else []
    print(
        f"{r.written} crops of {r.tracks} tracks written to {r.unsorted}" + (f" ({', '.join(notes)})" if notes else "")
    )
    print(f"sort them into class folders of {Path(args.out)}, then: deskpod train --data imagefolder:{Path(args.out)}")
    return 0


def run_classifier_search(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from deskpod.errors import UsageError
    from deskpod.video.classify import MIN_SCORE, search_classifier

    if args.label is None:
        raise UsageError("--classifier needs --label NAME: the class to find")
    if args.threshold is not None or args.export:
        raise UsageError("--threshold and --export go with --face, not --classifier")
    found = search_classifier(Path(args.db), Path(args.classifier), args.label, top=args.top,
                              min_score=MIN_SCORE if args.min_score is None else args.min_score, stream=args.stream,
                              since=args.since, until=args.until)  # fmt: skip
    if args.json:
        print(json.dumps([{"track": f.track, "stream": f.stream, "label": f.kind, "start": f.start, "end": f.end,
                           "score": round(f.score, 4), "crops": f.crops,
                           "thumbnail": str(f.thumbnail) if f.thumbnail else None} for f in found], indent=2))  # fmt: skip
    elif not found:
        print(f"no track recognised as {args.label}")
    else:
        print(f"{'track':>6} {'score':>6} {'crops':>5} {'start s':>9} {'end s':>9}  stream / thumbnail")
        for f in found:
            print(
                f"{f.track:>6} {f.score:>6.3f} {f.crops:>5} {f.start:>9.2f} {f.end:>9.2f}  {f.stream}  {f.thumbnail or ''}"
            )
    return 0
