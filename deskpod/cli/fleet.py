"""``deskpod fleet``: many pods run as one (`deskpod.fleet`).

``deskpod fleet up`` runs a pod service whose jobs go to member pods; ``add``, ``members``, ``remove`` and ``key``
manage them; ``stack`` publishes and rolls out its stacks (`deskpod.cli.stack`). Users submit, list, follow and cancel with the pod commands pointed at the fleet (``deskpod submit
--fleet URL``, or ``DESKPOD_URL``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from deskpod.cli.pod import _client
from deskpod.cli.stack import register_stack


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("fleet", help="many pods as one: a pod service whose jobs go to member pods")
    p.set_defaults(extra=("fleet", "deskpod fleet"))
    fs = p.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)

    q = fs.add_parser("up", help="start the fleet service (its own home, users, tokens, queue, API, dashboard)")
    q.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    q.add_argument("--port", type=int, default=8430, help="TCP port (default 8430; 0 picks a free one)")
    q.add_argument("--home", type=Path, help="state folder (default $DESKPOD_HOME/fleet)")
    q.add_argument("--socket", type=Path, help="its Unix socket (default HOME/pod.sock)")
    q.add_argument("--priority-limit", type=int, default=0, help="the highest job priority a non-admin may ask for")
    q.add_argument("--lease", type=float, default=15.0,
                   help="seconds a member may start a forwarded job without hearing from the fleet (default 15)")  # fmt: skip
    q.add_argument("--health-every", type=float, default=300.0, metavar="SECONDS",
                   help="ask each member's doctor this often (default 300; 0: never); a failing member gets no jobs")  # fmt: skip
    q.add_argument("--detach", action="store_true", help="run in the background; output to HOME/daemon.log")
    q.add_argument("--no-dashboard", action="store_true", help="serve only the REST API")
    q.set_defaults(func=up)

    for name, helptext in (("add", "add a member pod (admin): it must answer and trust this fleet"),
                           ("members", "every member: reachable, devices and holders, queue, software"),
                           ("remove", "remove a member (admin): drained first, gone once its fleet jobs ended"),
                           ("key", "print the fleet's public key (members trust it: deskpod up --trust-fleet FILE)")):  # fmt: skip
        q = fs.add_parser(name, help=helptext)
        q.add_argument("--fleet", metavar="URL", help="the fleet's URL (default: DESKPOD_URL, or the local fleet)")
        if name in ("add", "remove"):
            q.add_argument("name")
        if name == "add":
            q.add_argument("url", help="the member's pod service, e.g. http://box-b:8420")
        if name == "remove":
            q.add_argument("--force", action="store_true", help="remove at once; its unfinished fleet jobs are lost")
        if name == "members":
            q.add_argument("--json", action="store_true")
        q.set_defaults(func=globals()[f"fleet_{name}"])
    register_stack(fs, _client)


def _home(args: argparse.Namespace) -> Path:
    from deskpod.environment import Environment

    return (args.home or Environment.read().home / "fleet").expanduser().resolve()


def up(args: argparse.Namespace) -> int:
    from deskpod.cli.pod import _detach
    from deskpod.environment import Environment
    from deskpod.errors import ConfigError
    from deskpod.fleet.api import routes
    from deskpod.fleet.executor import FleetExecutor
    from deskpod.fleet.forwards import Forwards
    from deskpod.fleet.keys import FleetKey
    from deskpod.fleet.members import Members
    from deskpod.fleet.rollout import FleetLink, Rollouts
    from deskpod.fleet.stack_api import stack_routes
    from deskpod.fleet.stacks import StackStore
    from deskpod.jobs.daemon import serve
    from deskpod.jobs.pod import PodConfig
    from deskpod.jobs.store import private

    if not 1 <= args.lease <= 3600:
        raise ConfigError(f"--lease {args.lease:g}: expected seconds from 1 to 3600")
    if not (args.health_every == 0 or 1 <= args.health_every <= 86400):
        raise ConfigError(f"--health-every {args.health_every:g}: expected seconds from 1 to 86400, or 0 for never")
    home = _home(args)
    config = PodConfig(home=home, host=args.host, port=args.port, priority_limit=args.priority_limit,
                       socket=args.socket.expanduser().resolve() if args.socket else None)  # fmt: skip
    if args.detach:
        return _detach(args, home)
    key = FleetKey.in_home(home)
    private(home / "pod.db")
    stacks = StackStore(home / "stacks.db")
    executor = FleetExecutor(Members(home / "pod.db"), key, Forwards(home / "pod.db"), lease_s=args.lease,
                             health_s=args.health_every, stacks=stacks)  # fmt: skip
    print(f"deskpod: fleet {key.id}; members trust it with: deskpod up --trust-fleet {home / 'fleet.pub.pem'}",
          flush=True)  # fmt: skip
    rollouts = Rollouts(stacks, lambda user: [FleetLink(executor.client(m), user) for m in executor.members.all()
                                              if not m.draining])  # fmt: skip
    extensions: list[Any] = [routes(executor), stack_routes(stacks, rollouts, lambda: [m.name for m in
                                                            executor.members.all()], home / "uv-cache")]  # fmt: skip
    if not args.no_dashboard:
        from deskpod.web import fleet_dashboard
        from deskpod.web.fleet import FleetSource

        source = FleetSource(members=lambda fresh: [s.to_json() for s in executor.snapshots(fresh=fresh)],
                             stacks=lambda: stacks.status([m.name for m in executor.members.all()]))  # fmt: skip
        extensions.append(fleet_dashboard(source))
    env = dataclasses.replace(Environment.read(), token_file=None)  # the fleet's admin token goes to HOME/token
    return serve(config, env, extensions=extensions, executor=executor, stacks=stacks)


def fleet_add(args: argparse.Namespace) -> int:
    with _client(args) as c:
        made = c.request("POST", "/v1/fleet/members", json={"name": args.name, "url": args.url}).json()
    print(f"deskpod: member {made['name']} added ({made['url']}, its own name {made['audience']!r})")
    return 0


def fleet_remove(args: argparse.Namespace) -> int:
    with _client(args) as c:
        done = c.request("POST", f"/v1/fleet/members/{args.name}/remove", json={"force": args.force}).json()
    if done["removed"]:
        print(
            f"deskpod: member {done['name']} removed"
            + (f" ({done['jobs']} fleet job(s) on it lost)" if done["jobs"] else "")
        )
    else:
        print(
            f"deskpod: member {done['name']} is draining: no new jobs; removed once its {done['jobs']} fleet job(s) end"
        )
    return 0


def fleet_key(args: argparse.Namespace) -> int:
    with _client(args) as c:
        got = c.request("GET", "/v1/fleet/key").json()
    print(got["public_key"], end="")
    print(f"deskpod: fleet {got['fleet']}: save the key above to a file; on each member: deskpod up --trust-fleet FILE",
          file=sys.stderr)  # fmt: skip
    return 0


def fleet_members(args: argparse.Namespace) -> int:
    with _client(args) as c:
        got = c.request("GET", "/v1/fleet/members").json()
    if args.json:
        print(json.dumps(got, indent=2))
        return 0
    for m in got["members"]:
        print(f"{m['name']}  {m['url']}  " + describe(m))
    if not got["members"]:
        print("deskpod: no members yet: deskpod fleet add NAME URL", file=sys.stderr)
    return 0


def describe(m: dict[str, Any]) -> str:
    """One member of ``GET /v1/fleet/members`` in words."""
    if not m["reachable"]:
        return f"UNREACHABLE: {m['error']}" + ("  (draining)" if m["draining"] else "")
    parts = []
    if m["backend"] == "slurm":
        parts.append(
            "Slurm: " + ", ".join(f"{p['name']} {p['nodes']}x{p['gpus_per_node']} GPUs" for p in m["partitions"])
        )
    else:
        noun = "GPUs" if m["kind"] == "cuda" else "CPU slots"
        held = [d for d in m["devices"] if d["job"] is not None]
        who = ", ".join(f"{d['index']}: {d['user']} (job {d['job']})" for d in held)
        parts.append(
            f"{len(m['devices'])} {noun} ({m['machine']}), {len(m['devices']) - len(held)} free"
            + (f"; held {who}" if who else "")
        )
    parts.append(f"queued {m['queued']}, running {m['running']}")
    use = m.get("usage") or {}
    shown = [f"{label} {use[k]:g}%" for k, label in (("gpu", "GPU"), ("gpu_memory", "GPU memory"), ("cpu", "CPU"),
                                                     ("memory", "memory"), ("held", "devices held"))
             if use.get(k) is not None]  # fmt: skip
    if shown:
        parts.append("use: " + ", ".join(shown))
    sw = m["software"]
    parts.append(", ".join(f"{k} {sw.get(k) or '-'}" for k in ("deskpod", "torch", "cuda", "driver")))
    parts.append("stacks: " + (", ".join(m.get("stacks") or []) or "none"))
    health = m.get("health")
    when = "" if health is None else f" at {time.strftime('%H:%M:%S', time.localtime(health['at']))}"
    parts.append("health: " + ("not checked yet" if health is None else health["text"] + when))
    state = "DRAINING  " if m["draining"] else ""
    return state + ("UNHEALTHY  " if health is not None and health["state"] == "failed" else "") + " | ".join(parts)
