"""The commands the pages show, as lines to paste in a shell on the pod's box, and that work when pasted.

A ``deskpod`` command finds its pod through its environment (`deskpod.jobs.client`: ``DESKPOD_SOCKET``,
``DESKPOD_URL``, ``<DESKPOD_HOME>/daemon.json``, the system socket); a shell on the box has none of these for a
pod started with its own ``--home`` or ``--port``, and the dashboard's own address is the browser's, which behind
an SSH tunnel is not the box's. So every line names the pod's Unix socket: on it the kernel tells the pod who is
asking, so the line needs no token either, and it reaches this pod whatever the shell's environment says.

A run's TensorBoard events (``runs/<name>/tb/``) are opened the same way: the line runs ``tensorboard`` on the
box, on 127.0.0.1 like every deskpod server (tunnel its port as the dashboard's). The dashboard serves no
TensorBoard of its own: a live one behind the pod's sign-in is a session of its own kind, not a page.
"""

from __future__ import annotations

import shlex
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from deskpod.envs.userfiles import stat_beneath
from deskpod.jobs.store import JobRecord
from deskpod.train.runs import RunPaths
from deskpod.web.app import Web

TENSORBOARD_PORT = 6006
"""TensorBoard's default port, which the line keeps (``--port`` changes it)."""


def pod_socket(web: Web) -> Path:
    """The pod's Unix socket: ``deskpod up --socket``, else ``<home>/pod.sock`` (as `deskpod.jobs.daemon` binds it)."""
    return Path(web.pod.config.socket or Path(web.home) / "pod.sock")


def deskpod_line(web: Web, argv: Sequence[str]) -> str:
    """``DESKPOD_SOCKET=<the pod's socket> deskpod ...``: ``argv`` (``deskpod`` first) as a line for the box."""
    return f"DESKPOD_SOCKET={shlex.quote(str(pod_socket(web)))} {shlex.join(argv)}"


def tensorboard_line(runs: Mapping[str, Path]) -> str | None:
    """``tensorboard`` on the event folders of ``runs`` (label -> the run's ``tb/``), on 127.0.0.1; None when there
    are none, or when several must be named and a path holds a ``,`` or ``:`` (``--logdir_spec``'s separators)."""
    if not runs:
        return None
    base = ["tensorboard", "--host", "127.0.0.1", "--port", str(TENSORBOARD_PORT)]
    if len(runs) == 1:
        return shlex.join([*base[:1], "--logdir", str(next(iter(runs.values()))), *base[1:]])
    if any(c in f"{label}{path}" for label, path in runs.items() for c in ",:"):
        return None
    spec = ",".join(f"{label}:{path}" for label, path in runs.items())
    return shlex.join([*base[:1], "--logdir_spec", spec, *base[1:]])


def event_folder(web: Web, job: JobRecord) -> Path | None:
    """The run's TensorBoard folder (``tb/``) if the trainer made one: a folder, reached with no link followed in
    the job's folder (which its user controls)."""
    run = web.run_dir(job)
    if run is None:
        return None
    folder = Path(web.pod.job_folder(job))
    tb = RunPaths(run).tensorboard
    try:
        st = stat_beneath(folder, str(tb.relative_to(folder)))
    except (OSError, ValueError):
        return None
    return tb if stat.S_ISDIR(st.st_mode) else None
