"""Reading files in a folder someone else controls: no link followed, no FIFO waited on, nobody else's file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from deskpod.envs.userfiles import (
    RefusedFile,
    folder_bytes,
    open_beneath,
    read_beneath,
    read_path,
    scandir_beneath,
    scandir_path,
    stat_beneath,
    stat_path,
)

OTHER = 54321
"""A uid no test process runs as."""


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    (job / "runs" / "r1").mkdir(parents=True)
    (job / "output.log").write_bytes(b"line 1\nline 2\n")
    (job / "runs" / "r1" / "metrics.jsonl").write_bytes(b'{"step": 1}\n')
    return job


def test_reads_plain_files_with_offset_and_limit(tmp_path: Path) -> None:
    job = _job(tmp_path)
    assert read_beneath(job, "output.log") == b"line 1\nline 2\n"
    assert read_beneath(job, "output.log", offset=5, limit=4) == b"1\nli"
    assert read_beneath(job, "runs/r1/metrics.jsonl") == b'{"step": 1}\n'
    assert [e.name for e in scandir_beneath(job, "runs")] == ["r1"]


@pytest.mark.parametrize("where", ["output.log", "runs", "runs/r1"])
def test_a_link_anywhere_on_the_way_is_refused_not_followed(tmp_path: Path, where: str) -> None:
    job = _job(tmp_path)
    secret = tmp_path / "secret"
    (secret / "r1").mkdir(parents=True)
    (secret / "output.log").write_text("root only")
    (secret / "r1" / "metrics.jsonl").write_text("root only")
    target = job / where
    if target.is_dir():
        os.rename(target, tmp_path / "moved")
    else:
        target.unlink()
    target.symlink_to(secret / Path(where).name if where != "runs" else secret)
    rel = "output.log" if where == "output.log" else "runs/r1/metrics.jsonl"
    with pytest.raises(RefusedFile, match="symbolic link"):
        read_beneath(job, rel)


def test_the_folder_itself_may_not_be_a_link(tmp_path: Path) -> None:
    job = _job(tmp_path)
    (tmp_path / "link").symlink_to(job)
    with pytest.raises(RefusedFile, match="symbolic link"):
        read_beneath(tmp_path / "link", "output.log")


def test_a_fifo_is_refused_at_once_instead_of_blocking(tmp_path: Path) -> None:
    job = _job(tmp_path)
    (job / "output.log").unlink()
    os.mkfifo(job / "output.log")
    result: list[BaseException] = []

    def attempt() -> None:
        try:
            read_beneath(job, "output.log")
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(30)  # a blocking open would never return; the refusal comes at once
    assert not t.is_alive(), "reading a FIFO blocked"
    assert isinstance(result[0], RefusedFile) and "FIFO" in str(result[0])


def test_another_accounts_file_and_a_hard_link_to_the_daemons_own_are_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("handing files to another uid needs root (the suite runs as root in CI)")
    job = _job(tmp_path)
    os.chown(job / "output.log", OTHER, OTHER)
    assert read_beneath(job, "output.log", owner=OTHER) == b"line 1\nline 2\n"  # the folder's account's own file
    with pytest.raises(RefusedFile, match=f"uid {OTHER}"):
        read_beneath(job, "output.log", owner=OTHER + 1)
    token = tmp_path / "token"
    token.write_text("admin")
    os.link(token, job / "planted")  # what a user could do where protected_hardlinks is off
    with pytest.raises(RefusedFile, match="2 hard links"):
        read_beneath(job, "planted", owner=OTHER)
    assert read_beneath(job, "runs/r1/metrics.jsonl", owner=OTHER) == b'{"step": 1}\n'  # the daemon's, one link


@pytest.mark.parametrize("rel", ["../job/output.log", "/etc/passwd", "runs/../output.log"])
def test_paths_out_of_the_folder_are_refused(tmp_path: Path, rel: str) -> None:
    job = _job(tmp_path)
    with pytest.raises(RefusedFile, match="not a path inside"):
        read_beneath(job, rel)


def test_folders_and_files_are_told_apart(tmp_path: Path) -> None:
    job = _job(tmp_path)
    with pytest.raises(RefusedFile, match="a folder, not a regular file"):
        read_beneath(job, "runs")
    with pytest.raises(RefusedFile, match="not a folder"):
        scandir_beneath(job, "output.log")
    fd = open_beneath(job, "runs/r1", directory=True)
    os.close(fd)
    assert stat_beneath(job, "output.log").st_size == 14
    with pytest.raises(FileNotFoundError):
        read_beneath(job, "missing.log")


def test_folder_bytes_counts_blocks_once_and_follows_no_link(tmp_path: Path) -> None:
    job = _job(tmp_path)
    (job / "big.bin").write_bytes(os.urandom(1 << 20))
    os.link(job / "big.bin", job / "runs" / "same.bin")  # one inode, counted once
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "huge.bin").write_bytes(os.urandom(4 << 20))
    (job / "runs" / "elsewhere").symlink_to(outside)  # not followed: not the job's bytes
    got = folder_bytes(job)
    assert (1 << 20) <= got < (2 << 20)
    assert folder_bytes(tmp_path / "missing") == 0


def test_open_path_follows_the_pods_own_links_and_none_of_another_accounts(tmp_path: Path) -> None:
    """A path to a job's file: the pod's own link on the way (its home under a link) is followed; below the job's
    folder, which another account owns, no link is, and only that account's files (or the pod's own) open."""
    if os.geteuid() != 0:
        pytest.skip("another account's folder needs root to make (the suite runs as root in CI)")
    home = tmp_path / "real-home"
    job = home / "jobs" / "7"
    (job / "runs" / "r").mkdir(parents=True)
    (tmp_path / "home").symlink_to(home)  # the pod's own link: followed
    (job / "output.log").write_text("mine")
    (job / "exit.1").write_text("0")  # written by the pod itself (root), single-linked
    (tmp_path / "token").write_text("admin token")
    for p in (job, job / "runs", job / "runs" / "r", job / "output.log"):
        os.chown(p, OTHER, OTHER)
    via = tmp_path / "home" / "jobs" / "7"
    assert read_path(via / "output.log") == b"mine"
    assert read_path(via / "exit.1") == b"0"
    assert stat_path(via / "output.log") is not None and [e.name for e in scandir_path(via / "runs")] == ["r"]
    (job / "link.log").symlink_to(tmp_path / "token")
    os.lchown(job / "link.log", OTHER, OTHER)
    (job / "runs" / "r" / "up").symlink_to(tmp_path)
    os.lchown(job / "runs" / "r" / "up", OTHER, OTHER)
    for bad in (via / "link.log", via / "runs" / "r" / "up" / "token"):
        with pytest.raises(RefusedFile, match="symbolic link"):
            read_path(bad)
        assert stat_path(bad) is None
    os.mkfifo(job / "fifo.log")
    with pytest.raises(RefusedFile, match="FIFO"):
        read_path(via / "fifo.log")
