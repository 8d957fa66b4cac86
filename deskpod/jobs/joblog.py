"""A job's output as one byte stream, whoever ran it.

A job the pod runs itself appends every attempt to ``output.log`` (each attempt starts with a
``--- deskpod: ... attempt N ...`` line). A job run on a cluster writes one file per attempt,
``logs/attempt-N.log`` (a requeue never overwrites the attempt before it). Readers see both as one stream
with stable offsets: the attempts in order, each file's bytes after the previous one's, so ``deskpod logs
-f`` follows a job across requeues without noticing them.
"""

from __future__ import annotations

import re
from pathlib import Path


def log_files(folder: Path) -> list[Path]:
    """The job's log files in the order they were written."""
    single = folder / "output.log"
    if single.exists():
        return [single]
    numbered = []
    for p in (folder / "logs").glob("attempt-*.log"):
        m = re.fullmatch(r"attempt-(\d+)\.log", p.name)
        if m:
            numbered.append((int(m.group(1)), p))
    return [p for _, p in sorted(numbered)]


def read_log(folder: Path, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of the job's output from ``offset`` of the stream."""
    out = bytearray()
    start = 0
    for path in log_files(folder):
        try:
            size = path.stat().st_size
        except OSError:
            continue
        end = start + size
        if offset < end and len(out) < limit:
            with open(path, "rb") as f:
                f.seek(max(0, offset - start))
                out += f.read(min(limit - len(out), end - max(offset, start)))
        start = end
    return bytes(out)
