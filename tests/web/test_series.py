"""`deskpod.web.series`: metrics.jsonl read incrementally, torn lines, rewrites, and downsampling."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from deskpod.web.series import Series, SeriesCache, downsample


def rows(path: Path, recs: list[dict[str, object]], mode: str = "a") -> None:
    with open(path, mode) as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def train(step: int, loss: float, **more: object) -> dict[str, object]:
    return {"kind": "train", "step": step, "loss": loss, **more}


def test_reads_only_what_was_appended(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows(path, [train(1, 2.0), train(2, 1.5), {"kind": "val", "step": 2, "val_accuracy": 0.5}])
    s = Series(path)
    assert s.refresh() is True
    assert s.rows("train") == 2 and s.rows("val") == 1
    assert s.refresh() is False  # nothing new: no read
    rows(path, [train(3, 1.25, lr=0.1)])
    assert s.refresh() is True
    assert s.points("train", "loss") == [[1.0, 2.0], [2.0, 1.5], [3.0, 1.25]]
    assert s.points("train", "lr") == [[3.0, 0.1]]  # a key that appears late: earlier rows lack it
    assert s.points("train", "loss", start=2) == [[3.0, 1.25]]
    assert s.points("train", "loss", start=1, end=2) == [[2.0, 1.5]]
    assert s.points("val", "val_accuracy") == [[2.0, 0.5]]
    assert s.last("train", "loss") == 1.25
    assert s.generation == 0


def test_a_torn_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows(path, [train(1, 2.0)])
    whole = json.dumps(train(2, 1.0)) + "\n"
    with open(path, "a") as f:
        f.write(whole[:15])
    s = Series(path)
    s.refresh()
    assert s.rows("train") == 1
    with open(path, "a") as f:
        f.write(whole[15:])
    assert s.refresh() is True
    assert s.points("train", "loss") == [[1.0, 2.0], [2.0, 1.0]]


def test_a_bad_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(train(1, 2.0)) + "\nnot json\n" + json.dumps(train(2, 1.0)) + "\n")
    s = Series(path)
    s.refresh()
    assert s.points("train", "loss") == [[1.0, 2.0], [2.0, 1.0]]


def test_a_line_python_cannot_read_is_skipped_not_fatal(tmp_path: Path) -> None:
    """The job writes the file: a number of 5,000 digits (json refuses it), one of 4,000 (no float holds it) and a
    kind nested 1,000 deep (str() of it recurses) raised out of the reader and made the Job page answer 500."""
    path = tmp_path / "metrics.jsonl"
    rows(path, [train(1, 2.0)])
    with open(path, "a") as f:
        f.write('{"kind": "train", "step": 2, "loss": ' + "1" * 5000 + "}\n")
        f.write('{"kind": "train", "step": 3, "loss": ' + "9" * 4000 + "}\n")
        f.write('{"kind": ' + "[" * 1000 + "]" * 1000 + ', "step": 4, "loss": 0.5}\n')
    rows(path, [train(5, 1.0)])
    s = Series(path)
    assert s.refresh() is True
    assert s.points("train", "loss") == [[1.0, 2.0], [5.0, 1.0]]  # the 4,000 digits are no loss
    assert s.rows("train") == 3


def test_rewrite_is_noticed_and_read_afresh(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows(path, [train(i, 1.0 / i) for i in range(1, 11)])
    s = Series(path)
    s.refresh()
    assert s.rows("train") == 10
    # A resumed run drops the records past its checkpoint and replaces the file (a new inode).
    tmp = tmp_path / "metrics.tmp"
    rows(tmp, [train(i, 1.0 / i) for i in range(1, 6)] + [train(6, 9.0)], mode="w")
    os.replace(tmp, path)
    assert s.refresh() is True
    assert s.generation == 1
    assert s.rows("train") == 6
    assert s.last("train", "loss") == 9.0
    # Truncated in place to something shorter than what was read: read afresh too.
    rows(path, [train(1, 5.0)], mode="w")
    s.refresh()
    assert s.generation == 2
    assert s.points("train", "loss") == [[1.0, 5.0]]
    # Deleted: empty, and a new file starts over.
    path.unlink()
    s.refresh()
    assert s.rows("train") == 0


def test_only_numbers_are_series(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows(
        path,
        [
            train(1, 2.0, note="1.5", flag=True, lst=[1, 2]),
            train(2, float("inf")),  # json.dumps writes Infinity; JSON has no such number for a chart
            train(3, 1.0, note=None),
        ],
    )
    s = Series(path)
    s.refresh()
    assert "note" not in s.keys("train")  # a numeric-looking string is not a number
    assert "lst" not in s.keys("train") and "tag" not in s.keys("train")
    assert s.points("train", "flag") == [[1.0, 1.0]]  # a bool is 0 or 1
    assert s.points("train", "loss") == [[1.0, 2.0], [3.0, 1.0]]
    assert s.at("train", "loss", 2) == (1.0, 2.0)  # the latest finite value at or before step 2


def test_value_at_a_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows(path, [train(i, 10.0 - i) for i in range(1, 11)] + [{"kind": "val", "step": 4, "val_accuracy": 0.4}])
    s = Series(path)
    s.refresh()
    assert s.at("train", "loss", 5) == (5.0, 5.0)
    assert s.at("train", "loss", 5.5) == (5.0, 5.0)
    assert s.at("train", "loss", 0) is None
    assert s.at("val", "val_accuracy", 7) == (4.0, 0.4)
    assert s.at("val", "val_accuracy", 3) is None
    assert s.at("val", "missing", 7) is None


def test_downsample_keeps_extremes_and_endpoints() -> None:
    rng = np.random.default_rng(0)
    n = 100_000
    x = np.arange(n, dtype=np.float64)
    y = rng.normal(1.0, 0.01, n)
    y[54_321] = 50.0  # a spike
    y[777] = -50.0  # a dip
    y[0], y[-1] = 3.0, 4.0
    dx, dy = downsample(x, y, 200)
    assert len(dx) <= 200
    assert dx[0] == 0 and dx[-1] == n - 1 and dy[0] == 3.0 and dy[-1] == 4.0
    assert 54_321 in dx and 777 in dx
    assert np.all(np.diff(dx) > 0)  # in order, no duplicates
    same_x, same_y = downsample(x[:100], y[:100], 200)
    assert len(same_x) == 100 and np.array_equal(same_y, y[:100])


def test_points_are_downsampled_on_request(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows(path, [train(i, float(i % 97)) for i in range(1, 5001)])
    s = Series(path)
    s.refresh()
    pts = s.points("train", "loss", max_points=500)
    assert len(pts) <= 500
    assert pts[0] == [1.0, 1.0] and pts[-1] == [5000.0, float(5000 % 97)]
    assert max(p[1] for p in pts) == 96.0 and min(p[1] for p in pts) == 0.0


def test_cache_shares_one_series_per_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows(path, [train(1, 1.0)])
    cache = SeriesCache(max_files=2)
    a = cache.get(path)
    rows(path, [train(2, 0.5)])
    b = cache.get(path)
    assert a is b and b.rows("train") == 2  # get() refreshes
    cache.get(tmp_path / "other1.jsonl")
    cache.get(tmp_path / "other2.jsonl")
    assert cache.get(path) is not a  # evicted (oldest first), read again from scratch
