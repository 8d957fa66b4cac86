"""Files written whole or not at all: a temporary file beside the target, flushed to disk, renamed over it.

A reader (another process, or this one after a crash or a power cut) finds the old content or the new, never a
torn file: the data is fsync'ed before the rename, the folder after it, so the new name survives a power cut
too. A write that fails, or is killed, leaves the target as it was.

The temporary file lies in the target's own folder (a rename is atomic only within one file system), is created
with ``O_EXCL`` (a link planted at its name is never followed) and named ``.<name>.<pid>-<start>.<random>.tmp``:
its writer's pid and start time let `leftovers` tell the file of a writer that died from one being written now,
even after that pid was given to another process.

A link at the target itself is replaced, never written through; links on the way to its folder are followed, as
``open(2)`` follows them. So the pod's daemon writes into a folder another user controls with
`deskpod.envs.userfiles.write_no_follow` instead, which follows none.

Also `Under`: the fixed files of a folder object (a run's ``config.toml``, a cluster job's ``job.json``) as
attributes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from deskpod.processes import alive, start_time

_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)-(?P<start>\d+)\.[0-9a-f]{8}\.tmp")


@functools.cache
def _writer(pid: int) -> str:
    """``<pid>-<start>`` of this process (a forked child has another pid, so it is asked again)."""
    return f"{pid}-{start_time(pid, zombies=True) or 0}"


@contextlib.contextmanager
def replacing(path: Path, *, mode: int = 0o666) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; it replaces ``path`` when the block ends without an
    exception, and is removed when one is raised (``path`` keeps its old content). ``mode`` is the new file's,
    as ``open(2)`` takes it: less the umask (``0o600`` for a file only its owner may read)."""
    tmp = path.with_name(f".{path.name}.{_writer(os.getpid())}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # the file is in place; some file systems cannot sync a folder
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def write_bytes(path: Path, data: bytes, *, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data``, whole or not at all (see `replacing`)."""
    with replacing(path, mode=mode) as f:
        f.write(data)


def write_text(path: Path, text: str, *, mode: int = 0o666) -> None:
    """Replace ``path`` with ``text`` in UTF-8, whole or not at all."""
    write_bytes(path, text.encode(), mode=mode)


def write_json(path: Path, obj: object, *, indent: int | None = None, mode: int = 0o666) -> None:
    """Replace ``path`` with ``obj`` as JSON and a newline, whole or not at all."""
    write_bytes(path, json.dumps(obj, indent=indent).encode() + b"\n", mode=mode)


def leftovers(folder: Path, name: str = "*") -> list[Path]:
    """The temporary files in ``folder`` (of targets matching the glob ``name``) whose writer no longer runs:
    what a crash or a SIGKILL left behind, safe to delete. A file being written now is not among them."""
    found = []
    for p in sorted(folder.glob(f".{name}.*.tmp")):
        m = _LEFTOVER.fullmatch(p.name)
        if m and not alive(int(m["pid"]), int(m["start"])):
            found.append(p)
    return found


class Under:
    """A path under a folder object's ``base`` attribute, as a read-only attribute: ``config = Under("config.toml")``."""

    def __init__(self, name: str, base: str = "root") -> None:
        self.name, self.base = name, base

    def __get__(self, obj: object, owner: type | None = None) -> Path:
        folder: Path = getattr(obj, self.base)
        return folder / self.name
