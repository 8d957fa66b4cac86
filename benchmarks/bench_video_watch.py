"""What following an index costs: one `deskpod.video.watch` poll against a large database while tracks grow.

A database of ``--tracks`` closed person tracks (20 boxes each, written through `Store` as the indexer writes)
and ``--open`` open ones; then, per round, every open track gains a box (one indexer batch) and the watcher polls
with an enter and a loiter rule. Reported: the poll with nothing new (the idle cost, paid every ``--poll`` second),
the poll after a batch (p50/p95 over the rounds), and the first poll of a rule judging the whole history
(``--history``). Checked outside the timings: every open track that stepped into the region has exactly one enter
alert. Prints a table and JSON.

    PYTHONPATH=. python benchmarks/bench_video_watch.py [--tracks 100000] [--open 200] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from deskpod.video.rules import EnterRule, LoiterRule, Region
from deskpod.video.store import Store, TrackRow
from deskpod.video.watch import Watcher

REGION = Region(((100.0, 100.0), (200.0, 100.0), (200.0, 200.0), (100.0, 200.0)))
RULES = [EnterRule(name="door", region=REGION), LoiterRule(name="wait", region=REGION, seconds=30)]


def box(t: float, x: float) -> list[float]:
    return [t, x - 20, 50, x + 20, 150, 1.0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracks", type=int, default=100_000)
    ap.add_argument("--open", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "index.db"
        store = Store(db)
        store.resume("cam", "/cam", live=True)
        with store.transaction():
            for i in range(args.tracks):
                row = TrackRow(0, "cam", "person", i, i + 4, [box(i + k * 0.2, 300) for k in range(20)], "", None)
                row.id = store.new_track(row)
            store.db.execute("UPDATE tracks SET open=0")
        opened = []
        with store.transaction():
            for _ in range(args.open):
                row = TrackRow(0, "cam", "person", 0, 0, [box(0, 20)], "", None)
                row.id = store.new_track(row)
                opened.append(row)
        watcher = Watcher(db, RULES)
        watcher.poll()  # judges the open ones once
        t0 = time.perf_counter()
        watcher.poll()
        idle = time.perf_counter() - t0
        grown = []
        for r in range(1, args.rounds + 1):
            with store.transaction():
                for row in opened:
                    row.boxes.append(box(r, 20 + 10 * r))  # walks right: into the region at x >= 100
                    row.end = r
                    store.update_track(row)
            t0 = time.perf_counter()
            watcher.poll()
            grown.append(time.perf_counter() - t0)
        watcher.close()
        conn = sqlite3.connect(db)
        entered = conn.execute("SELECT COUNT(*), COUNT(DISTINCT track) FROM alerts WHERE rule='door'").fetchone()
        conn.close()
        if tuple(entered) != (args.open, args.open):
            raise SystemExit(
                f"wrong: {entered[0]} enter alerts on {entered[1]} tracks, expected {args.open} on {args.open}"
            )
        history = Watcher(db, [EnterRule(name="audit", region=REGION)], history=True)
        t0 = time.perf_counter()
        history.poll()
        audit = time.perf_counter() - t0
        history.close()
        store.close()
    grown.sort()
    result = {
        "tracks": args.tracks,
        "open": args.open,
        "idle_poll_ms": round(idle * 1000, 2),
        "grown_poll_p50_ms": round(statistics.median(grown) * 1000, 2),
        "grown_poll_p95_ms": round(grown[int(0.95 * (len(grown) - 1))] * 1000, 2),
        "history_poll_s": round(audit, 2),
        "history_tracks_per_s": round((args.tracks + args.open) / audit),
    }
    print(f"{'measure':<28} {'value':>12}")
    for k, v in result.items():
        print(f"{k:<28} {v:>12}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
