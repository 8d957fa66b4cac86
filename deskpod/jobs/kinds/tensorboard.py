"""A TensorBoard job: ``[tensorboard]``, TensorBoard over runs its user can read, reached through the pod at
``/sessions/<id>/``::

    [tensorboard]
    runs = ["/abs/runs/a", "/abs/runs/b"]   # run folders (their events are in tb/), or folders of event files

It holds no devices (``devices = 0``: the spec's default for this kind, and the only value it takes). Each run is
opened as the job's account at submission and at each start and shown to its sandbox read-only
(`deskpod.jobs.isolation`): a run the account cannot open is refused at submission, naming the path.

The job's process is this module (``python -m deskpod.jobs.kinds.tensorboard FOLDER RUN...``), run as the account
in its sandbox: TensorBoard's own WSGI application (`tensorboard.program.TensorBoard`, the field's library, with
its plugins and assets), served by werkzeug on the job folder's Unix socket (`deskpod.jobs.kinds.session`) under
the path prefix ``/sessions/<id>``. It never listens on TCP: not for the application, and not for TensorBoard's
Rust data server either (``--load_fast=false``: that one listens on a loopback port every account could reach).
Each run is one group of TensorBoard's ``--logdir_spec``, labelled by its folder's name; its ``tb/`` is read when it
has one (`deskpod.train.runs.RunPaths.tensorboard`), else the folder itself.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deskpod.errors import ConflictError
from deskpod.jobs.kinds.fields import absolute_path, bad, table
from deskpod.jobs.kinds.session import base_path, socket_path, socket_too_long
from deskpod.train.runs import NAME_MAX, RunPaths

ENVIRONMENT = False
SESSION = True
EXTRA: str | None = None
DEVICES = 0
"""The devices a TensorBoard job holds: none (it reads files)."""
FIELDS = ("runs",)
MAX_RUNS = 64
RUN = "^/[^\\u0000,]*$"
"""A run: an absolute path without NUL or ',' (the separator of TensorBoard's ``--logdir_spec``)."""
RELOAD_S = 5
"""How often TensorBoard looks for new events (its ``--reload_interval``)."""
EXAMPLE = 'runs = ["/home/me/runs/resnet-a", "/home/me/runs/resnet-b"]'

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["runs"],
    "properties": {
        "runs": {
            "type": "array", "minItems": 1, "maxItems": MAX_RUNS, "uniqueItems": True,
            "items": {"type": "string", "pattern": RUN, "maxLength": 4096},
            "description": "absolute paths of run folders (events in their tb/) or folders of TensorBoard event files",
        },
    },
}  # fmt: skip


def parse(t: object) -> dict[str, Any]:
    """The ``[tensorboard]`` table, checked."""
    t = table(t, "tensorboard", FIELDS, f"expected a table with {EXAMPLE}")
    runs = t.get("runs")
    if not isinstance(runs, list) or not 1 <= len(runs) <= MAX_RUNS:
        raise bad("tensorboard.runs", runs, f"expected a list of 1 to {MAX_RUNS} absolute paths, e.g. {EXAMPLE}")
    for r in runs:
        if not absolute_path(r):
            raise bad("tensorboard.runs", r, 'each run is an absolute path, e.g. "/home/me/runs/resnet-a"')
        if "," in r:
            raise bad("tensorboard.runs", r, "TensorBoard separates runs with ',' (--logdir_spec): rename the folder")
    if len(set(runs)) != len(runs):
        raise bad("tensorboard.runs", next(r for r in runs if runs.count(r) > 1), "name each run once")
    return {"runs": list(runs)}


def default_name(tb: Mapping[str, Any], fallback: str) -> str:
    """``tb-`` and the first run's name: ``tb-resnet-a``."""
    stem = label(tb["runs"][0])
    return f"tb-{stem}"[:NAME_MAX].rstrip(".-_") if stem != "run" else "tensorboard"


def check(tb: Mapping[str, Any]) -> None:
    """Every run is a folder of this box (a pod with isolation opens them as the user instead)."""
    for r in tb["runs"]:
        if not Path(r).is_dir():
            raise ConflictError(f"job spec: tensorboard.runs {r!r} is not a run folder or a folder of TensorBoard "
                                "events on this box")  # fmt: skip


def argv(tb: Mapping[str, Any], name: str, folder: Path) -> list[str]:
    return [sys.executable, "-m", "deskpod.jobs.kinds.tensorboard", str(folder), *tb["runs"]]


def label(run: str) -> str:
    """A run's group name in TensorBoard: its folder's name, as letters, digits and ``._-`` (``run`` if none)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", run.rstrip("/").rsplit("/", 1)[-1]).strip(".-_")
    return name[:NAME_MAX] or "run"


def logdir_spec(runs: Sequence[str]) -> str:
    """TensorBoard's ``--logdir_spec``: ``label:events`` for each run, the labels made unique (``a``, ``a-2``),
    the events its ``tb/`` when it has one, else the folder."""
    seen: dict[str, int] = {}
    parts = []
    for r in runs:
        base = label(r)
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}-{seen[base]}"
        tb = RunPaths(Path(r)).tensorboard
        parts.append(f"{name}:{tb if tb.is_dir() else Path(r)}")
    return ",".join(parts)


def tensorboard_argv(folder: Path, runs: Sequence[str]) -> list[str]:
    """TensorBoard's flags for the job in ``folder`` (the first is its program name, which it ignores)."""
    return ["tensorboard", "--logdir_spec", logdir_spec(runs), "--path_prefix", base_path(folder).rstrip("/"),
            "--load_fast", "false", "--reload_interval", str(RELOAD_S)]  # fmt: skip


def serve(folder: Path, runs: Sequence[str]) -> int:
    """TensorBoard on the job's socket until SIGTERM (or SIGINT); 0 then."""
    from tensorboard import program
    from werkzeug.serving import BaseWSGIServer, make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a log line per request in the job's log
    path = socket_path(folder)
    servers: list[BaseWSGIServer] = []

    class UnixServer(program.TensorBoardServer):
        """TensorBoard's application served by werkzeug on the job's Unix socket, mode 0600."""

        def __init__(self, wsgi_app: Any, flags: Any) -> None:
            self.server = make_server(f"unix://{path}", 0, wsgi_app, threaded=True)
            path.chmod(0o600)
            servers.append(self.server)

        def serve_forever(self) -> None:
            self.server.serve_forever()

        def get_url(self) -> str:
            return f"unix:{path} at {base_path(folder)}"

    board = program.TensorBoard(server_class=UnixServer)
    board.configure(argv=tensorboard_argv(folder, runs))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    where = board.launch()
    print(f"deskpod: TensorBoard {where} (through the pod), runs: {', '.join(runs)}", flush=True)
    stop.wait()
    for s in servers:
        s.shutdown()
    path.unlink(missing_ok=True)
    return 0


def main(args: Sequence[str]) -> int:
    """In the job, as its account: ``FOLDER RUN...``."""
    if len(args) < 2:
        print("usage: python -m deskpod.jobs.kinds.tensorboard JOB_FOLDER RUN...", file=sys.stderr)
        return 2
    folder = Path(args[0])
    if socket_too_long(folder, "deskpod tensorboard"):
        return 2
    missing = [r for r in args[1:] if not Path(r).is_dir()]
    if missing:
        print(f"deskpod tensorboard: run {missing[0]!r} is not a folder this job can read", file=sys.stderr)
        return 2
    return serve(folder, args[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
