"""``deskpod notebook``: a session on the pod (`deskpod.jobs.kinds.notebook`), queued like any job, and its URL
once it answers (``/sessions/<id>/`` on the pod's own address, behind its sign-in)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from deskpod.environment.sizes import parse_duration
from deskpod.errors import ServiceError

START_WAIT_S = 600.0
"""How long the command waits for the session to answer before it gives its id and returns (it keeps running)."""


def add_session_options(p: argparse.ArgumentParser, *, devices: bool = True) -> None:
    """The options every session command has."""
    if devices:
        p.add_argument("--devices", help="GPUs (CPU worker slots on a CPU box) the session holds: a count (default 1)")
    p.add_argument(
        "--time",
        help="how long it may run, e.g. 4h or 90m (default: the pod's --session-time; at most its --session-max-time)",
    )
    p.add_argument("--name", help="its name in the queue (letters, digits, . _ -)")
    p.add_argument("--no-wait", action="store_true", help="queue it and print its id; do not wait for it to answer")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("notebook", help="JupyterLab as a pod job, on the devices it holds, through the pod's URL")
    add_session_options(p)
    p.add_argument("--workdir", type=Path, help="the folder JupyterLab opens (default: this one)")
    add_environment_options(p, " (with ipykernel among its packages)", "; add ipykernel")
    p.set_defaults(func=notebook)


def add_environment_options(p: argparse.ArgumentParser, requirements_note: str = "", package_note: str = "") -> None:
    """``--env``, ``--package`` and ``--python``: the session's own environment (`environment_table`)."""
    p.add_argument("--env", type=Path, metavar="REQUIREMENTS",
                   help=f"its own environment: this requirements.txt{requirements_note}")  # fmt: skip
    p.add_argument("--package", action="append", default=[], metavar="REQ",
                   help=f"its own environment with this package (repeatable{package_note})")  # fmt: skip
    p.add_argument("--python", help="the environment's Python version, e.g. 3.11 (default: the pod's own)")


def add_environment(spec: dict[str, Any], args: argparse.Namespace) -> None:
    """The spec's ``[environment]`` from `add_environment_options`' flags, when any is given."""
    from deskpod.cli.pod import environment_from_flags

    environment_from_flags(spec, args.env, args.package, args.python)


def session_spec(args: argparse.Namespace, kind: str, table: dict[str, Any]) -> dict[str, Any]:
    """The job spec of a session command: its kind's table, and the common options."""
    spec: dict[str, Any] = {kind: table}
    if getattr(args, "devices", None) is not None:
        spec["devices"] = args.devices
    if args.time is not None:
        spec["max_runtime"] = parse_duration(args.time)
    if args.name is not None:
        spec["name"] = args.name
    return spec


def notebook(args: argparse.Namespace) -> int:
    spec = session_spec(args, "notebook", {})
    spec["workdir"] = str((args.workdir or Path.cwd()).resolve())
    add_environment(spec, args)
    return open_session(spec, "lab", no_wait=args.no_wait)


def open_session(spec: dict[str, Any], page: str, *, no_wait: bool) -> int:
    """Submit ``spec``, wait until its server answers through the pod, and print its URL (``page`` under it)."""
    from deskpod.cli.pod import _client

    with _client() as c:
        job = c.submit(spec)
        job_id = str(job["id"])
        print(f"deskpod: session {job_id} queued", file=sys.stderr, flush=True)
        if no_wait:
            print(job_id)
            return 0
        if not wait_session(c, job_id):
            return 1
        print(f"{pod_url(c)}/sessions/{job_id}/{page}")
    return 0


def wait_session(c: Any, job_id: str) -> bool:
    """Wait until session ``job_id`` answers through the pod, saying on stderr how it goes; False (its id printed)
    when it does not answer within `START_WAIT_S`; `ServiceError` when it ends first."""
    base = f"/sessions/{job_id}/"
    deadline = time.monotonic() + START_WAIT_S
    said = ""
    while True:
        state = c.job(job_id)
        if state["state"] not in ("queued", "starting", "building", "running"):
            raise ServiceError(f"session {job_id} ended before it answered ({state['state']}: "
                               f"{state.get('reason') or 'see deskpod logs ' + job_id})")  # fmt: skip
        if state["state"] != said:
            said = state["state"]
            if said != "running":
                print(f"deskpod: session {job_id} {said}: {state.get('reason') or ''}".rstrip(": "),
                      file=sys.stderr, flush=True)  # fmt: skip
        if said == "running" and answers(c, base):
            return True
        if time.monotonic() > deadline:
            print(f"deskpod: session {job_id} does not answer yet; `deskpod show {job_id}` follows it",
                  file=sys.stderr)  # fmt: skip
            print(job_id)
            return False
        time.sleep(0.1)


def answers(client: Any, base: str) -> bool:
    """Whether the session's server answers through the pod (anything but 503, its 'not yet')."""
    status = client.probe(base)
    return status is not None and status != 503


def pod_url(client: Any) -> str:
    """The pod's HTTP address, for a browser: the client's, or (over the Unix socket) the one the daemon wrote."""
    if str(client.url).startswith("http"):
        return str(client.url).rstrip("/")
    from deskpod.environment import Environment
    from deskpod.jobs.client import find_url

    try:
        return find_url(Environment.read()).rstrip("/")
    except Exception:  # no daemon.json: the path alone still says where
        return ""
