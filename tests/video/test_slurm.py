"""A video job on a real Slurm cluster (slurmctld + two slurmd on 127.0.0.1, the session's `slurm` fixture): two
nodes, one indexer each over its share of real clips into its own shard database, and a face search over the
shards that finds the carphone man from a photo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deskpod.video.search import search_face
from deskpod.video.shards import databases, deal, shard_path
from deskpod.video.sources import expand_sources
from deskpod.video.store import Store
from tests.cluster.slurm import SlurmCluster
from tests.cluster.test_slurm_jobs import deskpod, submit, wait_final
from tests.video.clips import clip
from tests.video.man import clip_and_photo

pytestmark = [pytest.mark.slow, pytest.mark.server]


def test_a_two_node_video_job_shards_the_streams_and_search_reads_every_shard(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    import tomli_w

    cut, photo = clip_and_photo(tmp_path)
    given = [str(cut), str(clip("cockatoo")), str(clip("bikes"))]
    (tmp_path / "idx").mkdir()
    db = tmp_path / "idx" / "v.db"
    spec = {"name": "cams", "nodes": 2, "devices": 1, "max_runtime": 900,
            "video": {"sources": given, "db": str(db), "detect": ["dlib-hog-face"], "batch": 8}}  # fmt: skip
    (tmp_path / "cams.toml").write_text(tomli_w.dumps(spec))
    home = tmp_path / "home"
    job_id, folder = submit(home, tmp_path / "cams.toml")
    row = wait_final(home, job_id, timeout=600)
    log = (folder / "logs" / "attempt-1.log").read_text()
    assert row["state"] == "succeeded", log
    # one indexer per node, each told its shard; each clip in exactly one shard, as `deal` assigns it
    for k in range(2):
        assert f"--shard {k}/2" in log and f"shard {k}/2 into {shard_path(db, k)}" in log, log
    assert {line.split(":")[1].strip() for line in log.splitlines() if "video index" in line} == {"node1", "node2"}
    assert not db.exists() and databases(db) == [shard_path(db, 0), shard_path(db, 1)]
    held: dict[int, list[str]] = {}
    for k, path in enumerate(databases(db)):
        with Store(path, create=False) as store:
            streams = store.streams()
        assert all(s.state == "done" and not s.error for s in streams), streams
        held[k] = sorted(s.name for s in streams)
    assert held == {k: sorted(s.name for s in deal(expand_sources(given), k, 2)) for k in range(2)}
    assert sorted(n for names in held.values() for n in names) == sorted(Path(g).name for g in given)
    for k in range(2):  # each node's figures in its own file of the job's folder
        stats = json.loads((folder / f"video-stats.shard{k}.json").read_text())
        assert stats, k
    # the search reads every shard and finds the man from a photo of another part of his clip
    matches = search_face(db, photo)
    assert matches and {m.stream for m in matches} == {"carphone-start.mp4"}
    assert matches[0].similarity >= 0.95 and matches[0].db is not None
    assert "carphone-start.mp4" in held[databases(db).index(matches[0].db)]
    done = deskpod("video", "search", "--face", str(photo), "--db", str(db), "--json", home=home)
    assert done.returncode == 0, done.stderr
    assert [(r["track"], r["db"]) for r in json.loads(done.stdout)] == [(m.track, str(m.db)) for m in matches]
    script = (folder / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "deskpod video index (3 sources, one shard a node)" in script
