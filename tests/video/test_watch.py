"""``deskpod video watch``: rules files and their one-line errors, rules judged on tracks, the follower over a live
database (a restart sends nothing twice), webhook delivery to a real HTTP server on 127.0.0.1 (retries, a dead
webhook), and the whole loop on real clips: vtest and carphone indexed by one process while watch runs in another.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import av
import cv2
import pytest

from deskpod.errors import ConfigError, DataError
from deskpod.video.alerts import Alert, Webhook, recent_alerts
from deskpod.video.rules import EnterRule, LoiterRule, Region, load_rules
from deskpod.video.store import Store, TrackRow
from deskpod.video.watch import Watcher, watch
from tests.video.clips import clip
from tests.video.rtsp import free_port

REPO = Path(__file__).resolve().parents[2]
SQUARE = [[100, 100], [200, 100], [200, 200], [100, 200]]


# --- a real webhook


class Receiver:
    """An HTTP server on 127.0.0.1 that records each JSON POST (with when it came) and answers ``codes`` in turn,
    then 200."""

    def __init__(self, codes: tuple[int, ...] = ()) -> None:
        self.posts: list[tuple[float, dict[str, object]]] = []
        self.codes = list(codes)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                code = receiver.codes.pop(0) if receiver.codes else 200
                if code == 200:
                    receiver.posts.append((time.time(), json.loads(body)))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- rules files


def write_rules(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return path


def test_a_rules_file_is_typed_with_defaults(tmp_path: Path) -> None:
    rules = load_rules(write_rules(tmp_path, f"""
[[rule]]
name = "door"
kind = "enter"
region = {SQUARE}
streams = ["cam1"]

[[rule]]
kind = "loiter"
region = {SQUARE}
seconds = 2.5
label = "face"
anchor = "center"
"""))  # fmt: skip
    door, loiter = rules
    assert isinstance(door, EnterRule) and door.name == "door" and door.label == "person" and door.anchor == "bottom"
    assert door.streams == ("cam1",) and door.region.points[2] == (200.0, 200.0)
    assert isinstance(loiter, LoiterRule) and loiter.seconds == 2.5 and loiter.anchor == "center"
    assert loiter.name.startswith("loiter-")  # kind and a hash of what it says: the same after a restart
    assert load_rules(tmp_path / "rules.toml")[1].name == loiter.name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[rule]\nkind = 1", r"rules\.toml: not valid TOML: .*line 1"),
        ("[watch]\npoll = 1", r"unknown key 'watch' at the top; a rules file holds only \[\[rule\]\] tables"),
        ("rule = []", r"no rules; add one or more \[\[rule\]\] tables"),
        ('[[rule]]\nkind = "enters"', r'rule 1: kind = "enters" is not valid; give one of face, enter, loiter'),
        (f'[[rule]]\nkind = "enter"\nregion = {SQUARE}\nsecond = 3',
         r"rule 1 \(enter\): unknown key 'second'; a enter rule takes name, kind, streams, region, label, anchor"),
        ('[[rule]]\nkind = "enter"', r"rule 1 \(enter\): region is missing; give a polygon of 3 or more \[x, y\]"),
        ('[[rule]]\nkind = "enter"\nregion = [[1, 2], [3, 4]]', r"region = \[\[1, 2\], \[3, 4\]\] is not valid"),
        ('[[rule]]\nkind = "enter"\nregion = [[0, 0], [5, 5], [9, 9]]', r"its corners enclose no area"),
        ('[[rule]]\nkind = "enter"\nregion = [[0, 0], [5, -5], [9, 9]]', r"region = .* is not valid"),
        (f'[[rule]]\nkind = "enter"\nregion = {SQUARE}\nlabel = "car"',
         r'label = "car" is not valid; give one of person, face \(default person\)'),
        (f'[[rule]]\nkind = "loiter"\nregion = {SQUARE}', r"rule 1 \(loiter\): seconds is missing; give a positive"),
        (f'[[rule]]\nkind = "loiter"\nregion = {SQUARE}\nseconds = 0', r"seconds = 0.0 is not valid; give a positive"),
        (f'[[rule]]\nkind = "loiter"\nregion = {SQUARE}\nseconds = "30"', r'seconds = "30" is not valid'),
        (f'[[rule]]\nkind = "enter"\nregion = {SQUARE}\nstreams = []', r"streams = \[\] is not valid; give a list"),
        (f'[[rule]]\nname = "a b"\nkind = "enter"\nregion = {SQUARE}', r'name = "a b" is not valid; give 1-64'),
        (f'[[rule]]\nname = "x"\nkind = "enter"\nregion = {SQUARE}\n[[rule]]\nname = "x"\nkind = "loiter"\n'
         f"region = {SQUARE}\nseconds = 1", r"rule 2: name = 'x' is taken by rule 1; names are unique"),
        ('[[rule]]\nkind = "face"', r"rule 1 \(face\): photos is missing; give a list of photos of one face each"),
        ('[[rule]]\nkind = "face"\nphotos = "a.jpg"', r'photos = "a.jpg" is not valid; give a list of photos'),
        ('[[rule]]\nkind = "face"\nphotos = ["a.jpg"]\nthreshold = 1.5',
         r"threshold = 1.5 is not valid; give a cosine similarity above 0 and at most 1, e.g. threshold = 0.93"),
    ],
)  # fmt: skip
def test_a_bad_rules_file_is_one_line_naming_the_key_and_what_is_valid(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_rules(write_rules(tmp_path, text))
    assert "\n" not in str(err.value) and str(err.value).startswith(str(tmp_path / "rules.toml"))


def test_a_watch_list_photo_must_be_an_image_of_one_face(tmp_path: Path) -> None:
    (tmp_path / "notes.jpg").write_text("not a picture")
    with av.open(str(clip("cockatoo"))) as video:
        frame = next(iter(video.decode(video=0))).to_ndarray(format="bgr24")
    cv2.imwrite(str(tmp_path / "bird.png"), frame)  # a real picture with no face in it
    for photo, why in [("missing.jpg", "no such photo"), ("notes.jpg", "not an image"), ("bird.png", "no face found")]:
        with pytest.raises(DataError, match=rf"rules\.toml: rule 1 \(face\): photos: .*{photo}: {why}"):
            load_rules(write_rules(tmp_path, f'[[rule]]\nkind = "face"\nphotos = ["{photo}"]'))


def deskpod(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "deskpod", "video", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_the_command_refuses_a_bad_rules_file_or_webhook_with_one_line(tmp_path: Path) -> None:
    rules = write_rules(tmp_path, f'[[rule]]\nkind = "loiter"\nregion = {SQUARE}\nseconds = -3')
    done = deskpod("watch", "--db", str(tmp_path / "x.db"), "--rules", str(rules))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"deskpod: {rules}: rule 1 (loiter): seconds = -3.0 is not valid; give a positive number " \
                          "of seconds, e.g. seconds = 30\n"  # fmt: skip
    rules.write_text(f'[[rule]]\nkind = "enter"\nregion = {SQUARE}')
    done = deskpod("watch", "--db", str(tmp_path / "x.db"), "--rules", str(rules), "--webhook", "ftp://h/x")
    assert (
        done.returncode == 2 and done.stderr.count("\n") == 1 and "--webhook ftp://h/x: give an http://" in done.stderr
    )
    assert not (tmp_path / "x.db").exists()


# --- rules on tracks


def track(boxes: list[list[float]], *, label: str = "person", stream: str = "cam1", tid: int = 1) -> TrackRow:
    return TrackRow(tid, stream, label, boxes[0][0], boxes[-1][0], boxes, "", None)


def feet(t: float, x: float, y: float) -> list[float]:
    """A 40x100 box standing at (x, y)."""
    return [t, x - 20, y - 100, x + 20, y, 1.0]


def test_enter_fires_at_the_first_box_inside_and_loiter_when_it_has_stayed_long_enough() -> None:
    region = Region(((100.0, 100.0), (200.0, 100.0), (200.0, 200.0), (100.0, 200.0)))
    enter = EnterRule(name="door", region=region)
    loiter = LoiterRule(name="wait", region=region, seconds=3)
    walk = track([feet(0, 50, 150), feet(1, 120, 150), feet(2, 150, 150), feet(3, 250, 150)])
    hit = enter.judge(walk)
    assert hit is not None and hit.t == 1 and hit.detail == {"x": 120.0, "y": 150.0}
    assert loiter.judge(walk) is None  # 1 s inside
    assert enter.judge(track([feet(0, 150, 250)])) is None  # its feet are below the region
    assert EnterRule(name="c", region=region, anchor="center").judge(track([feet(0, 150, 250)])) is not None
    assert enter.judge(track([feet(0, 150, 150)], label="face")) is None
    assert EnterRule(name="s", region=region, streams=("cam2",)).judge(walk) is None
    stay = track(
        [feet(t, 150, 150) for t in (0, 1, 2)] + [feet(3, 250, 150)] + [feet(t, 150, 150) for t in range(4, 9)]
    )
    hit = loiter.judge(stay)
    assert hit is not None and hit.t == 7 and hit.detail == {"entered": 4, "seconds": 3}  # stepping out restarts it


# --- the follower, over a store written as the indexer writes it


class Indexer:
    """Writes tracks the way `deskpod.video.indexer` does: each batch in one transaction, tracks open until closed."""

    def __init__(self, db: Path) -> None:
        self.store = Store(db)
        self.store.resume("cam1", "/cams/1", live=True)

    def new(self, boxes: list[list[float]]) -> TrackRow:
        row = track(boxes)
        with self.store.transaction():
            row.id = self.store.new_track(row)
        return row

    def extend(self, row: TrackRow, boxes: list[list[float]], *, closed: bool = False) -> None:
        row.boxes += boxes
        row.end = row.boxes[-1][0]
        with self.store.transaction():
            self.store.update_track(row, closed=closed)


@pytest.fixture
def indexer(tmp_path: Path) -> Iterator[Indexer]:
    writer = Indexer(tmp_path / "index.db")
    yield writer
    writer.store.close()


RULES = [EnterRule(name="door", region=Region(((100, 100), (200, 100), (200, 200), (100, 200)))),
         LoiterRule(name="wait", region=Region(((100, 100), (200, 100), (200, 200), (100, 200))), seconds=3)]  # fmt: skip


def test_the_follower_judges_tracks_as_they_grow_and_a_restart_sends_nothing_twice(indexer: Indexer) -> None:
    db = indexer.store.path
    before = indexer.new([feet(0, 150, 150)])  # there before the watcher: not judged (live, not an audit)
    events: list[str] = []
    with Receiver() as hook:
        watcher = Watcher(db, RULES, webhook=Webhook(hook.url), on_event=events.append)
        assert [a.rule for a in watcher.poll()] == ["door"] and events[0].endswith("from track 2 and the 1 open")
        indexer.extend(before, [feet(4, 150, 150)], closed=True)
        assert [(a.rule, a.track) for a in watcher.poll()] == [("wait", before.id)]  # open when it started: followed
        walker = indexer.new([feet(10, 50, 150), feet(11, 60, 150)])
        assert watcher.poll() == []
        indexer.extend(walker, [feet(12, 150, 150)])
        (entered,) = watcher.poll()
        assert (entered.rule, entered.track, entered.t, entered.state) == ("door", walker.id, 12, "pending")
        indexer.extend(walker, [feet(13, 150, 150), feet(14, 160, 150)])
        assert watcher.poll() == []  # 2 s inside
        watcher.close()  # stops after delivering what is queued
        assert [p["rule"] for _, p in hook.posts] == ["door", "wait", "door"]
        assert hook.posts[2][1] == entered.to_json() | {"state": "pending"}  # what the webhook gets: the alert

        indexer.extend(walker, [feet(15, 150, 150)])  # while no watcher runs: 3 s inside
        again = Watcher(db, RULES, webhook=Webhook(hook.url))
        assert [(a.rule, a.track, a.t) for a in again.poll()] == [("wait", walker.id, 15)]
        indexer.extend(walker, [feet(16, 150, 150)], closed=True)
        assert again.poll() == []
        again.close()
        assert len(hook.posts) == 4
        alerts = recent_alerts(db, 0, 10)
        assert [a.id for a in alerts] == [4, 3, 2, 1] and {a.state for a in alerts} == {"sent"}
        assert [a.id for a in recent_alerts(db, since_id=2, limit=1)] == [4]
        assert all(isinstance(a, Alert) and json.dumps(a.to_json()) for a in alerts)

        history = Watcher(db, [*RULES, EnterRule(name="late", region=RULES[0].region)], history=True)
        assert [(a.rule, a.track) for a in history.poll()] == [("late", before.id), ("late", walker.id)]
        history.close()
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT rule || track) FROM alerts").fetchone() == (6, 6)
        conn.close()


def test_a_webhook_is_retried_with_backoff_and_a_dead_one_is_one_line_and_a_failed_alert(indexer: Indexer) -> None:
    db = indexer.store.path
    events: list[str] = []
    with Receiver(codes=(500, 503)) as hook:
        report = watch(db, RULES, webhook=Webhook(hook.url, backoff_s=0.05), once=True, history=True)
        indexer.new([feet(0, 150, 150)])
        report = watch(db, RULES, webhook=Webhook(hook.url, backoff_s=0.05), once=True)
        assert (report.alerts, report.sent, report.failed) == (1, 1, 0) and len(hook.posts) == 1
        (alert,) = recent_alerts(db)
        assert (alert.state, alert.attempts, alert.error) == ("sent", 3, "")

        hook.codes = [404]
        indexer.new([feet(1, 150, 150)])
        report = watch(db, RULES, webhook=Webhook(hook.url), once=True, on_event=events.append)
        refused = recent_alerts(db)[0]
        assert (report.failed, refused.attempts, refused.error) == (1, 1, "HTTP 404 Not Found")

    dead = f"http://127.0.0.1:{free_port()}/alerts"
    indexer.new([feet(2, 150, 150)])
    started = time.monotonic()
    report = watch(db, RULES, webhook=Webhook(dead, attempts=3, backoff_s=0.1), once=True, on_event=events.append)
    assert report.failed == 1 and time.monotonic() - started >= 0.3  # waited 0.1 s, then 0.2 s
    newest = recent_alerts(db)[0]
    assert (newest.state, newest.attempts, newest.error) == ("failed", 3, "Connection refused")
    assert (
        events[-1]
        == f"webhook {dead}: alert 3 not delivered after 3 attempts (Connection refused); kept in {db} as failed"
    )
    listing = deskpod("alerts", "--db", str(db))
    assert listing.returncode == 0 and "failed (Connection refused)" in listing.stdout.splitlines()[1]
    assert [a["id"] for a in json.loads(deskpod("alerts", "--db", str(db), "--json").stdout)] == [3, 2, 1]


# --- the whole loop on real clips


def cut(source: Path, out: Path, *args: str) -> Path:
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args[:2], "-i", str(source), *args[2:], str(out)], check=True)
    return out


@pytest.mark.slow
def test_alerts_come_live_while_real_clips_are_indexed_in_another_process(tmp_path: Path) -> None:
    # vtest.avi from 48 s to 63 s (768x576): a man stands at about (655, 430) from 54 s on; others walk up through
    # x 440-560, y 280-340 (read off the tracks of a full index of the clip, and checked on its frames).
    street = cut(clip("vtest"), tmp_path / "street.avi", "-ss", "48", "-t", "15", "-c:v", "mpeg4", "-q:v", "2")
    phone = cut(clip("carphone"), tmp_path / "phone.mp4", "-ss", "0", "-t", "2", "-c", "copy")  # frames 0-61
    with av.open(str(clip("carphone"))) as video:  # the watch-list photo: frame 105, 1.4 s after the part indexed
        frame = next(f for i, f in enumerate(video.decode(video=0)) if i == 105).to_ndarray(format="bgr24")
    cv2.imwrite(str(tmp_path / "suspect.jpg"), frame[5:125, 5:125])
    rules = write_rules(tmp_path, """
[[rule]]
name = "suspect"
kind = "face"
photos = ["suspect.jpg"]

[[rule]]
name = "messi"
kind = "face"
photos = ["messi5.jpg"]

[[rule]]
name = "crossing"
kind = "enter"
region = [[440, 280], [560, 280], [560, 340], [440, 340]]

[[rule]]
name = "bench"
kind = "loiter"
region = [[615, 405], [705, 405], [705, 465], [615, 465]]
seconds = 5

[[rule]]
name = "elsewhere"
kind = "enter"
region = [[0, 0], [768, 0], [768, 576], [0, 576]]
streams = ["other.avi"]
""")  # fmt: skip
    (tmp_path / "messi5.jpg").symlink_to(clip("messi"))
    db = tmp_path / "index.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with Receiver() as hook:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "deskpod", "video", "watch", "--db", str(db), "--rules", str(rules),
             "--webhook", hook.url, "--poll", "0.5"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            while not db.exists() and watcher.poll() is None:
                time.sleep(0.2)
            indexed = deskpod("index", str(street), str(phone), "--db", str(db), timeout=600)
            assert indexed.returncode == 0, indexed.stderr
            done_at = time.time()
            deadline = time.monotonic() + 30
            while not caught_up(db) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert caught_up(db)
        finally:
            watcher.send_signal(signal.SIGTERM)
            out, err = watcher.communicate(timeout=60)
        assert watcher.returncode == 0, err
        alerts = recent_alerts(db, 0, 100)[::-1]
        by_rule: dict[str, list[Alert]] = {}
        for a in alerts:
            by_rule.setdefault(a.rule, []).append(a)
        assert set(by_rule) == {"suspect", "crossing", "bench"}  # not Messi's face, not another stream
        assert all(a.stream == "phone.mp4" and a.label == "face" for a in by_rule["suspect"])
        assert all(float(a.detail["similarity"]) >= 0.93 for a in by_rule["suspect"])
        (bench,) = by_rule["bench"]
        with Store(db, create=False) as store:
            man = store.tracks(ids=[bench.track])[0]
        assert man.end - man.start >= 10 and bench.t - float(bench.detail["entered"]) >= 5
        assert len(by_rule["crossing"]) >= 2 and all(a.stream == "street.avi" for a in by_rule["crossing"])
        assert out.splitlines() == [a.line() for a in alerts]  # printed as raised
        assert [p["id"] for _, p in hook.posts] == [a.id for a in alerts] and {a.state for a in alerts} == {"sent"}
        assert hook.posts[0][0] < done_at  # live: the first came while the indexer still ran

        again = deskpod("watch", "--db", str(db), "--rules", str(rules), "--webhook", hook.url, "--once")
        assert again.returncode == 0 and again.stdout == "" and "0 alerts" in again.stderr
        conn = sqlite3.connect(db)
        conn.execute("DELETE FROM watch_cursors")  # even with its position lost, a watcher sends nothing twice
        conn.commit()
        conn.close()
        again = deskpod("watch", "--db", str(db), "--rules", str(rules), "--webhook", hook.url, "--once", "--history")
        assert again.returncode == 0 and again.stdout == ""
        assert len(hook.posts) == len(alerts) and len(recent_alerts(db, 0, 100)) == len(alerts)


def caught_up(db: Path) -> bool:
    """Whether the watcher has seen every track closed and delivered every alert."""
    conn = sqlite3.connect(db)
    try:
        top = conn.execute("SELECT MAX(id) FROM tracks").fetchone()[0]
        cursors = conn.execute("SELECT last_track, open_tracks FROM watch_cursors").fetchall()
        pending = conn.execute("SELECT COUNT(*) FROM alerts WHERE state='pending'").fetchone()[0]
    finally:
        conn.close()
    return bool(cursors) and all(last == top and json.loads(o) == [] for last, o in cursors) and pending == 0
