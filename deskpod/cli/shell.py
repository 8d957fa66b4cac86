"""``deskpod shell`` and ``deskpod tensorboard``: session jobs on the pod (`deskpod.jobs.kinds.shell`,
`deskpod.jobs.kinds.tensorboard`), queued like any job and reached through the pod's own address and sign-in."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from deskpod.cli.session import (
    add_environment,
    add_environment_options,
    add_session_options,
    open_session,
    session_spec,
    wait_session,
)

END_WAIT_S = 10.0
"""How long ``deskpod shell`` waits, once its terminal closed, for the job to say how the shell ended."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("shell", help="an interactive shell as a pod job: its devices, environment and sandbox, as you",
                       description="Queue a shell job, wait for it, and attach this terminal to it through the pod "
                       "(raw mode: every key goes to the shell; `exit` ends the job with the shell's status).")  # fmt: skip
    add_session_options(p)
    p.add_argument("--workdir", type=Path, help="the folder the shell starts in (default: this one)")
    add_environment_options(p)
    p.add_argument("--attach", metavar="ID", help="attach to your running shell job ID instead of starting one")
    p.set_defaults(func=shell)
    t = sub.add_parser("tensorboard", help="TensorBoard over runs as a pod job (no devices), through the pod's URL",
                       description="Queue TensorBoard over RUN folders (their tb/ events) or folders of event files, "
                       "wait until it answers, and print its URL on the pod.")  # fmt: skip
    t.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="a run folder, or a folder of TensorBoard events")
    add_session_options(t, devices=False)
    t.set_defaults(func=tensorboard)


def tensorboard(args: argparse.Namespace) -> int:
    spec = session_spec(args, "tensorboard", {"runs": [str(r.resolve()) for r in args.runs]})
    return open_session(spec, "", no_wait=args.no_wait)


def shell(args: argparse.Namespace) -> int:
    from deskpod.cli.pod import _client
    from deskpod.jobs.attach import Endpoint, attach
    from deskpod.jobs.kinds.shell import TERMINAL

    with _client() as c:
        if args.attach is not None:
            job_id = str(c.job(args.attach)["id"])
        else:
            spec = session_spec(args, "shell", {})
            spec["workdir"] = str((args.workdir or Path.cwd()).resolve())
            add_environment(spec, args)
            job_id = str(c.submit(spec)["id"])
            print(f"deskpod: shell {job_id} queued", file=sys.stderr, flush=True)
            if args.no_wait:
                print(job_id)
                return 0
        if not wait_session(c, job_id):
            return 1
        asyncio.run(attach(Endpoint.of(f"/sessions/{job_id}/{TERMINAL}")))
        return ended(c, job_id)


def ended(c: Any, job_id: str) -> int:
    """The shell's exit status once its job ended; 1, and how to come back, when it still runs."""
    deadline = time.monotonic() + END_WAIT_S
    while True:
        job = c.job(job_id)
        if job["state"] in ("succeeded", "failed", "cancelled", "lost"):
            code = job.get("exit_code")
            return int(code) if isinstance(code, int) else (0 if job["state"] == "succeeded" else 1)
        if time.monotonic() > deadline:
            print(f"deskpod: shell {job_id} goes on without this terminal; `deskpod shell --attach {job_id}` "
                  f"comes back, `deskpod cancel {job_id}` ends it", file=sys.stderr)  # fmt: skip
            return 1
        time.sleep(0.2)
