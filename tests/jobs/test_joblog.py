"""A job's log as one stream: one output.log (the pod's own jobs) or one file per attempt (cluster jobs)."""

from __future__ import annotations

from pathlib import Path

from deskpod.jobs.joblog import log_files, read_log


def follow(folder: Path, chunk: int) -> bytes:
    got, offset = b"", 0
    while True:
        data = read_log(folder, offset, chunk)
        if not data:
            return got
        got, offset = got + data, offset + len(data)


def test_attempts_read_as_one_stream_in_attempt_order(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for n, text in [(1, "first\n"), (10, "tenth\n"), (2, "second attempt\n")]:
        (logs / f"attempt-{n}.log").write_text(text)
    (logs / "attempt-x.log").write_text("not an attempt")
    assert [p.name for p in log_files(tmp_path)] == ["attempt-1.log", "attempt-2.log", "attempt-10.log"]
    whole = b"first\nsecond attempt\ntenth\n"
    for chunk in (1, 3, 7, 1 << 20):  # chunk edges inside and across files
        assert follow(tmp_path, chunk) == whole
    assert read_log(tmp_path, 6, 6) == b"second"
    # an attempt that grows is read on from where the reader stopped, the files after it shift
    (logs / "attempt-10.log").write_text("tenth\nmore\n")
    assert read_log(tmp_path, len(whole), 100) == b"more\n"


def test_a_single_output_log_wins(tmp_path: Path) -> None:
    (tmp_path / "output.log").write_text("pod job\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "attempt-1.log").write_text("ignored\n")
    assert read_log(tmp_path, 0, 100) == b"pod job\n"
    assert read_log(tmp_path / "missing", 0, 100) == b""
