"""Why a job failed, in its own words: the one line ``deskpod`` printed on failing.

Every ``deskpod`` command ends a failure with one line on stderr, ``deskpod: <what went wrong>``
(`deskpod.cli.main`), and a pod job's stderr goes to its ``output.log``. The pod records only the exit code
(``exit code 2``), which says nothing of *why* a deployment could not start (a run it cannot read, a damaged
checkpoint); the Models page and the Job page show that line instead, found as `deskpod.jobs.pod.build_error`
finds an environment build's.

The log is the job's, in a folder its user controls: it is read through `deskpod.envs.userfiles` (no link
followed, no FIFO waited on, only a file of the folder's account), and only its end.
"""

from __future__ import annotations

import os
from pathlib import Path

from deskpod.envs.userfiles import open_beneath
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord
from deskpod.web.app import Web

TAIL_BYTES = 64 << 10
"""How much of the log's end is read for the line: enough for a worker's traceback after it."""
MAX_CHARS = 2000
"""A longer line is cut (an exception's text can be long); the log keeps all of it."""
PREFIX = "deskpod: "


def last_said(text: str) -> str | None:
    """The last ``deskpod: ...`` line of ``text`` without its prefix (warnings are not the failure), or None."""
    said = [
        line[len(PREFIX) :].strip()
        for line in text.splitlines()
        if line.startswith(PREFIX) and not line.startswith(PREFIX + "warning:")
    ]
    said = [s for s in said if s]
    if not said:
        return None
    line = said[-1]
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 1] + "…"


def log_tail(folder: Path, name: str = "output.log", size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of the job folder's ``name`` as text, read as its account's file ('' when there is
    none, or it is not a plain file of that account's)."""
    try:
        owner = os.lstat(folder).st_uid  # the job's account owns its folder (the daemon made it so)
        fd = open_beneath(folder, name, owner=owner)
    except OSError:
        return ""
    try:
        end = os.fstat(fd).st_size
        data = os.pread(fd, size, max(0, end - size))
    except OSError:
        return ""
    finally:
        os.close(fd)
    return data.decode(errors="replace")


def failure(web: Web, job: JobRecord) -> str | None:
    """Why a failed job failed, as its ``deskpod`` command said it (None for a job that did not fail, or that
    said nothing: a command of the user's own, killed, or out of memory)."""
    if job.state is not JobState.FAILED:
        return None
    return last_said(log_tail(Path(web.pod.job_folder(job))))
