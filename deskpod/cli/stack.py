"""``deskpod fleet stack``: a fleet's stacks, the environments its members keep the same (deskpod/fleet/stacks.py).

deskpod fleet stack publish NAME FILE [--python X.Y]   a new version: FILE is a uv.lock (its pyproject.toml beside
                                                       it), a pyproject.toml or a requirements file; it must resolve
deskpod fleet stack rollout NAME [--no-wait]           build and smoke-test the current version on every member, one
                                                       at a time; stops at the first that fails, saying where and why
deskpod fleet stack status [NAME] [--json]             per member: the version it has, the versions it passed and
                                                       failed; the current version

The fleet is reached as ``deskpod fleet members`` reaches it: ``--fleet URL``, else ``DESKPOD_URL``, else the local
fleet (its token: ``DESKPOD_TOKEN_FILE``, or the fleet's home's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLL_S = 1.0


def register_stack(fleet: argparse._SubParsersAction, client: Callable[[argparse.Namespace], Any]) -> None:  # type: ignore[type-arg]
    """Add ``stack`` and its commands under ``deskpod fleet``; ``client(args)`` is the fleet's pod client."""
    p = fleet.add_parser("stack", help="the fleet's stacks: publish, rollout, status")
    stack = p.add_subparsers(dest="stack_command", metavar="WHAT", required=True)
    q = stack.add_parser("publish", help="publish a stack's next version (it must parse and resolve)")
    q.add_argument("name", metavar="NAME", help="the stack, e.g. pytorch-2.14")
    q.add_argument("file", type=Path, metavar="FILE", help="a uv.lock (with pyproject.toml beside it), a"
                   " pyproject.toml or a requirements file")  # fmt: skip
    q.add_argument("--python", metavar="X.Y", help="its Python (default: the fleet's own)")
    q.set_defaults(func=run_publish)
    r = stack.add_parser("rollout", help="build and smoke-test the current version on every member, one at a time")
    r.add_argument("name", metavar="NAME")
    r.add_argument("--no-wait", action="store_true", help="start it and return; `status` follows it")
    r.set_defaults(func=run_rollout)
    s = stack.add_parser("status", help="which version each member has")
    s.add_argument("name", nargs="?", metavar="NAME", help="one stack (default: all)")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(func=run_status)
    for command in (q, r, s):
        command.add_argument(
            "--fleet", metavar="URL", help="the fleet's URL (default: DESKPOD_URL, or the local fleet)"
        )
        command.set_defaults(client=client)


def environment_table(file: Path) -> dict[str, Any]:
    """FILE as the ``environment`` a publish sends (files by their contents, named as they are in their folder)."""
    from deskpod.envs.definition import parse_environment

    key = "lock" if file.suffix == ".lock" else "pyproject" if file.name == "pyproject.toml" else "requirements"
    return parse_environment({key: file.name}, base_dir=file.parent).to_json()


def _client(args: argparse.Namespace) -> Any:
    from deskpod.fleet.stack_api import StackClient

    return StackClient(args.client(args))


def run_publish(args: argparse.Namespace) -> int:
    got = _client(args).publish(args.name, environment_table(args.file.expanduser()), args.python)
    what = (
        f"{got['name']} v{got['version']} ({got['summary']}, Python {got['python']}, {len(got['resolved'])} packages)"
    )
    if got["published"]:
        print(f"published {what}; roll it out: deskpod fleet stack rollout {got['name']}")
    else:
        print(f"unchanged: {what} has these contents already; nothing published")
    return 0


def run_rollout(args: argparse.Namespace) -> int:
    from deskpod.errors import RunError

    client = _client(args)
    state = client.rollout(args.name)
    print(f"rolling {state['name']} v{state['version']} out to {', '.join(state['members'])}", flush=True)
    if args.no_wait:
        return 0
    shown = 0
    while True:
        for member in state["skipped"][shown:]:
            print(f"  {member}: already passed v{state['version']}", flush=True)
        for result in state["results"][max(0, shown - len(state["skipped"])) :]:
            print(f"  {_result_line(result)}", flush=True)
        shown = len(state["skipped"]) + len(state["results"])
        if state["state"] != "running":
            break
        time.sleep(POLL_S)
        state = client.progress(args.name)
    if state["state"] == "passed":
        print(state["message"])
        return 0
    failed = state["results"][-1] if state["results"] else None
    if failed is not None and failed["log_tail"]:
        print(f"--- the end of the smoke job's log on {failed['member']} (job {failed['job']}) ---")
        print(failed["log_tail"].rstrip())
    raise RunError(state["message"])


def _result_line(r: dict[str, Any]) -> str:
    if r["outcome"] == "passed":
        return f"{r['member']}: passed v{r['version']} in {r['seconds']:.1f} s ({r['reason']})"
    return f"{r['member']}: FAILED v{r['version']} at step {r['step']}: {r['reason']}"


def run_status(args: argparse.Namespace) -> int:
    client = _client(args)
    stacks = [client.stack(args.name)] if args.name else client.stacks()
    if args.json:
        json.dump(stacks, sys.stdout, indent=2)
        print()
        return 0
    if not stacks:
        print("no stacks yet: deskpod fleet stack publish NAME FILE")
    for stack in stacks:
        current = stack["current"]
        print(f"{stack['name']}: current v{current['version']} ({current['summary']}, Python {current['python']},"
              f" {stack['versions']} version{'s' * (stack['versions'] != 1)})")  # fmt: skip
        for row in stack["members"]:
            has = "nothing yet" if row["has"] is None else f"v{row['has']}" + (" (current)" if row["current"] else "")
            passed = ",".join(f"v{v}" for v in row["passed"]) or "-"
            failed = ",".join(f"v{v}" for v in row["failed"]) or "-"
            last = row["last"]
            note = "" if last is None or last["outcome"] == "passed" else f"; last: {_result_line(last)}"
            print(f"  {row['member']:<16} has {has:<16} passed {passed:<12} failed {failed}{note}")
    return 0
