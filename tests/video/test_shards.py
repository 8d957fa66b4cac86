"""A sharded index (a Slurm video job's: one database per node): the assignment of streams to shards, the shard
databases' names, and a face search over real shards merged best first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deskpod.errors import UsageError
from deskpod.jobs.kinds.video import node_argv, parse
from deskpod.video.indexer import IndexConfig, index
from deskpod.video.search import Match, export_sheets, merge, search_face
from deskpod.video.shards import databases, deal, parse_shard, shard_path, shard_paths
from deskpod.video.sources import Source, expand_sources
from deskpod.video.store import Store
from tests.video.clips import clip
from tests.video.man import clip_and_photo


def sources(*names: str) -> list[Source]:
    return [Source(n, f"/cams/{n}", live=False) for n in names]


def test_sorted_sources_are_dealt_round_robin_each_to_one_shard() -> None:
    given = sources("e.mp4", "a.mp4", "d.mp4", "b.mp4", "c.mp4")
    shares = [deal(given, k, 2) for k in range(2)]
    assert [[s.name for s in share] for share in shares] == [["a.mp4", "c.mp4", "e.mp4"], ["b.mp4", "d.mp4"]]
    for n in (1, 2, 3, 4, 7):
        dealt = [s for k in range(n) for s in deal(given, k, n)]
        assert sorted(s.name for s in dealt) == sorted(s.name for s in given)  # each in exactly one shard
        assert [deal(list(reversed(given)), k, n) for k in range(n)] == [deal(given, k, n) for k in range(n)]
    assert deal(given, 6, 7) == []  # more nodes than streams: an empty shard


def test_shard_arguments_and_names() -> None:
    assert parse_shard("1/2") == (1, 2) and parse_shard(" 0 / 1 ") == (0, 1)
    for bad, says in (("2/2", "0 to 1"), ("1", "K/N"), ("-1/2", "K/N"), ("0/0", "1 to"), ("a/b", "K/N")):
        with pytest.raises(UsageError, match=says):
            parse_shard(bad)
    assert shard_path(Path("/x/video.db"), 3) == Path("/x/video.shard3.db")
    assert shard_path(Path("/x/site"), 0) == Path("/x/site.shard0")


def test_databases_of_a_sharded_index(tmp_path: Path) -> None:
    db = tmp_path / "video.db"
    assert databases(db) == []
    for name in ("video.shard10.db", "video.shard2.db", "video.shard0.db", "video.shardX.db", "other.shard1.db"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "video.shard1.db.thumbs").mkdir()
    assert [p.name for p in shard_paths(db)] == ["video.shard0.db", "video.shard2.db", "video.shard10.db"]
    db.write_bytes(b"")
    assert databases(db)[0] == db and len(databases(db)) == 4


def test_merge_is_best_first_across_shards() -> None:
    def m(track: int, s: float, shard: int) -> Match:
        return Match(track, f"cam{shard}", 0.0, 1.0, s, None, Path(f"v.shard{shard}.db"))

    a = [m(1, 0.99, 0), m(2, 0.94, 0)]
    b = [m(1, 0.97, 1), m(5, 0.94, 1), m(6, 0.93, 1)]
    merged = merge([a, b], 4)
    assert [(x.db.name, x.track, x.similarity) for x in merged if x.db] == [
        ("v.shard0.db", 1, 0.99), ("v.shard1.db", 1, 0.97), ("v.shard0.db", 2, 0.94), ("v.shard1.db", 5, 0.94),
    ]  # fmt: skip
    assert merge([a, b], 1) == [a[0]] and merge([[], []], 3) == []


def test_a_node_indexes_its_share_into_its_own_shard(tmp_path: Path) -> None:
    video = parse({"sources": ["/cams/b.mp4", "/cams/a.mp4", "rtsp://127.0.0.1:8554/gate"], "db": "/idx/v.db"})
    argv = node_argv(video, "cams", tmp_path, 1, 2)
    assert argv[-2:] == ["--shard", "1/2"] and argv[argv.index("--db") + 1] == "/idx/v.db"
    assert argv[argv.index("--stats") + 1] == str(tmp_path / "video-stats.shard1.json")


@pytest.mark.slow
def test_a_face_is_found_across_shards_of_real_clips(tmp_path: Path) -> None:
    """carphone's first 2.5 s, cockatoo and bikes dealt over two shards by ``deskpod video index --shard``; the man
    found from a photo of another part of carphone through the base name, the filters applied in each shard."""
    cut, photo = clip_and_photo(tmp_path)
    given = [str(cut), str(clip("cockatoo")), str(clip("bikes"))]
    db = tmp_path / "v.db"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for k in range(2):
        cmd = [sys.executable, "-m", "deskpod", "video", "index", *given, "--db", str(db), "--detect", "dlib-hog-face",
               "--shard", f"{k}/2"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        assert f"shard {k}/2 into {shard_path(db, k)}" in done.stderr
    assert not db.exists() and databases(db) == [shard_path(db, 0), shard_path(db, 1)]
    held: dict[str, list[str]] = {}
    for path in databases(db):
        with Store(path, create=False) as store:
            held[path.name] = sorted(s.name for s in store.streams())
    expected = {p.name: sorted(s.name for s in deal(expand_sources(given), k, 2)) for k, p in enumerate(databases(db))}
    assert held == expected and sorted(n for names in held.values() for n in names) == sorted(
        Path(g).name for g in given
    )
    matches = search_face(db, photo)
    assert matches and {m.stream for m in matches} == {"carphone-start.mp4"}
    assert matches[0].similarity >= 0.95 and matches[0].db is not None
    assert "carphone-start.mp4" in held[matches[0].db.name]
    assert matches[0].thumbnail is not None and matches[0].thumbnail.parent.name == matches[0].db.name + ".thumbs"
    assert search_face(db, photo, since=100.0) == [] and search_face(db, photo, stream="cockatoo.mp4") == []
    with pytest.raises(UsageError, match=r"no such stream in .* and its shards .*bikes\.mp4"):
        search_face(db, photo, stream="nope")
    sheets = export_sheets(db, matches[:1], tmp_path / "sheets")
    assert [p.name for p in sheets] == [f"track-{matches[0].track}-carphone-start.mp4.jpg"]
    # the command line, as the dashboard runs it: one list over the shards, each result naming its database
    done = subprocess.run([sys.executable, "-m", "deskpod", "video", "search", "--face", str(photo), "--db", str(db),
                           "--json"], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["track"], r["db"]) for r in rows] == [(m.track, str(m.db)) for m in matches]
    # a plain run of the command is unchanged: DB itself, no shard
    lone = tmp_path / "lone.db"
    report = index(expand_sources([str(cut)]), lone, IndexConfig(detect=("dlib-hog-face",)))
    assert not report.failed and databases(lone) == [lone]
    assert search_face(lone, photo)[0].db == lone
