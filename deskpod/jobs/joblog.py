"""A job's output as one byte stream, whoever ran it.

A job the pod runs itself appends every attempt to ``output.log`` (each attempt starts with a
``--- deskpod: ... attempt N ...`` line). A job run on a cluster writes one file per attempt,
``logs/attempt-N.log`` (a requeue never overwrites the attempt before it). Readers see both as one stream
with stable offsets: the attempts in order, each file's bytes after the previous one's, so ``deskpod logs
-f`` follows a job across requeues without noticing them.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from deskpod.envs.userfiles import read_path, scandir_path, stat_path


def log_files(folder: Path) -> list[Path]:
    """The job's log files in the order they were written. Every file of a job's folder is reached as
    `deskpod.envs.userfiles.open_path` reaches it: no link its user planted is followed, no FIFO waited on."""
    single = folder / "output.log"
    if stat_path(single) is not None:
        return [single]
    numbered = []
    for entry in scandir_path(folder / "logs"):
        m = re.fullmatch(r"attempt-(\d+)\.log", entry.name)
        if m and entry.is_file(follow_symlinks=False):
            numbered.append((int(m.group(1)), folder / "logs" / entry.name))
    return [p for _, p in sorted(numbered)]


def read_log(folder: Path, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of the job's output from ``offset`` of the stream."""
    out = bytearray()
    start = 0
    for path in log_files(folder):
        st = stat_path(path)
        if st is None:
            continue
        end = start + st.st_size
        if offset < end and len(out) < limit:
            with contextlib.suppress(OSError):
                out += read_path(
                    path, offset=max(0, offset - start), limit=min(limit - len(out), end - max(offset, start))
                )
        start = end
    return bytes(out)
