"""`deskpod.environment.files`: a file is replaced whole or not at all, with the mode asked for from its first byte."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskpod.environment.files import leftovers, replacing, write_bytes, write_json, write_text
from deskpod.processes import start_time


@pytest.fixture(autouse=True)
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_write_replaces_the_content_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    write_text(path, "old")
    write_json(path, {"a": [1, 2]}, indent=2)
    assert path.read_text() == '{\n  "a": [\n    1,\n    2\n  ]\n}\n'
    write_bytes(path, b"\x00\xff")
    assert path.read_bytes() == b"\x00\xff"
    assert os.listdir(tmp_path) == ["doc.json"]


def test_a_failed_write_leaves_the_old_content_and_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_text(path, "old")
    with pytest.raises(RuntimeError, match="disk gone"), replacing(path) as f:
        f.write(b"half of the new")
        raise RuntimeError("disk gone")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["summary.json"]
    with pytest.raises(TypeError):
        write_json(path, {"not json": object()})
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["summary.json"]


def test_the_mode_is_the_one_asked_for_less_the_umask_from_the_first_byte(tmp_path: Path) -> None:
    write_text(tmp_path / "plain", "x")
    assert mode(tmp_path / "plain") == 0o644  # as open() makes it: 0666 less the umask
    token = tmp_path / "token"
    write_text(token, "old\n")
    os.chmod(token, 0o644)
    with replacing(token, mode=0o600) as f:
        [tmp] = [p for p in tmp_path.iterdir() if p.name.startswith(".token.")]
        assert mode(tmp) == 0o600, "the secret is never readable by others, even before it is written"
        f.write(b"secret\n")
    assert mode(token) == 0o600 and token.read_text() == "secret\n"


def test_a_link_at_the_target_is_replaced_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "state.json"
    path.symlink_to(victim)
    write_json(path, {"ok": True})
    assert victim.read_text() == "keep"
    assert not path.is_symlink() and json.loads(path.read_text()) == {"ok": True}


WRITER = """
import sys
from pathlib import Path
from deskpod.environment.files import replacing
with replacing(Path(sys.argv[1])) as f:
    f.write(b"partial")
    f.flush()
    print("writing", flush=True)
    sys.stdin.readline()
"""


def test_leftovers_are_the_temporary_files_of_writers_that_died(tmp_path: Path) -> None:
    target = tmp_path / "step-00000002.pt"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    [tmp] = list(tmp_path.glob(".step-00000002.pt.*.tmp"))
    assert leftovers(tmp_path) == [], "a file being written now is not a leftover"
    writer.send_signal(signal.SIGKILL)
    writer.communicate()
    assert leftovers(tmp_path, "step-*") == [tmp] and not target.exists()
    assert leftovers(tmp_path, "other-*") == []


def test_a_temporary_file_whose_pid_now_names_another_process_is_a_leftover(tmp_path: Path) -> None:
    """A pid is reused: the file names this pid with another start time, so its writer is gone."""
    me, started = os.getpid(), start_time(os.getpid())
    assert started is not None
    ours = tmp_path / f".a.json.{me}-{started}.0123abcd.tmp"
    reused = tmp_path / f".b.json.{me}-{started - 1}.0123abcd.tmp"
    for p in (ours, reused):
        p.write_text("{")
    assert leftovers(tmp_path) == [reused]
