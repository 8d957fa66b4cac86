"""The pod service commands: ``up``, ``down``, ``submit``, ``jobs``, ``show``, ``logs``, ``cancel``, ``requeue``,
``extend``, ``status``, ``user``.

``deskpod up`` runs the service (in the foreground, or ``--detach``); every other command is a thin
call through `deskpod.jobs.client`. A refused request prints the service's one-line reason and
exits 2; an unreachable service exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("up", help="start the pod service: a shared job queue for this box")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this box only)")
    p.add_argument("--port", type=int, default=8420, help="TCP port (default 8420; 0 picks a free one)")
    p.add_argument("--home", type=Path, help="state folder (default $DESKPOD_HOME or ~/.deskpod)")
    p.add_argument("--name", help="this pod's name, as fleets know it (default: the host name)")
    p.add_argument("--trust-fleet", type=Path, action="append", default=[], metavar="PUBKEY.pem",
                   help="accept the requests this fleet forwards (its fleet.pub.pem; kept in HOME; repeatable)")  # fmt: skip
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)")
    p.add_argument("--no-preemption", action="store_true", help="never stop lower-priority jobs for higher ones")
    p.add_argument("--machine", help="schedule as if this box were a catalog machine (see `deskpod topo --list`)")
    p.add_argument("--detach", action="store_true", help="run in the background; its output goes to HOME/daemon.log")
    p.add_argument("--no-dashboard", action="store_true", help="serve only the REST API, not the web dashboard (/ui/)")
    p.add_argument(
        "--backend",
        choices=("local", "slurm"),
        default="local",
        help="who runs the jobs: this box (local, default) or the Slurm cluster this is a login node of",
    )
    p.add_argument("--socket", type=Path, help="the Unix socket local users reach the pod on (default HOME/pod.sock)")
    p.add_argument("--priority-limit", type=int, default=0,
                   help="the highest job priority a user who is not an admin may ask for (default 0)")  # fmt: skip
    p.add_argument("--unmapped-user", default="nobody",
                   help="a root pod runs jobs of users without an OS account as this account (default nobody)")  # fmt: skip
    p.add_argument("--no-sandbox", action="store_true", help="run jobs without a bubblewrap sandbox")
    p.add_argument("--allow-unsandboxed", action="store_true",
                   help="where bubblewrap cannot run, start anyway and run jobs without walls")  # fmt: skip
    p.add_argument("--env-cache", type=Path, help="where job environments are kept (default HOME/envs)")
    p.add_argument("--env-cache-limit", help="prune the environment cache to this size after builds, e.g. 50G")
    p.add_argument(
        "--job-memory",
        default="share",
        metavar="share|SIZE|none",
        help="memory each job may hold: its share of the box by devices held (default), a size, or none",
    )
    p.add_argument(
        "--job-tasks",
        default="default",
        metavar="default|N|none",
        help="processes and threads each job may have at once (default: max(1024, 256 x its cores))",
    )
    p.add_argument("--no-pin-cpus", action="store_true", help="let jobs run on every core, not only their devices'")
    p.add_argument("--job-disk", default="default", metavar="default|SIZE|none",
                   help="what one job's folder may hold, and the largest file it may write (default: a quarter of"
                   " the file system holding the pod's home)")  # fmt: skip
    p.add_argument("--session-max-time", default="12h",
                   help="the longest a session (notebook, shell, TensorBoard) may run, extensions included (default 12h)")  # fmt: skip
    p.add_argument("--session-time", default="4h", help="a session's time when it asks for none (default 4h)")
    p.add_argument("--idle-timeout", default="off", metavar="DURATION|off",
                   help="stop an idle notebook's kernels and give its devices back to the queue after this long, e.g."
                   " 1h (default off)")  # fmt: skip
    p.set_defaults(func=up)

    p = sub.add_parser("down", help="stop the pod service (running jobs keep running unless --stop-jobs)")
    p.add_argument("--stop-jobs", action="store_true", help="also stop running jobs (they are requeued)")
    p.set_defaults(func=down)

    p = sub.add_parser("submit", help="queue a job: a spec file (TOML/JSON) or -- a command")
    p.add_argument("--fleet", metavar="URL", help="a fleet's URL (deskpod fleet up) instead of the pod's")
    p.add_argument("--devices", help="a count or 'all' (default 1)")
    p.add_argument("--device-kind", choices=("cuda", "cpu"), help="GPUs or CPU worker slots (default: the pod's)")
    p.add_argument("--name", help="job name (letters, digits, . _ -)")
    p.add_argument("--priority", type=int, help="higher runs first (default 0)")
    p.add_argument("--placement", help="best | pack | partition:<name>")
    p.add_argument("--max-runtime", type=float, help="seconds before the job is stopped and fails")
    p.add_argument("--retries", type=int, help="re-runs after a failure (default 0)")
    p.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable (repeatable)"
    )
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument("--cluster", choices=("slurm",), help="submit to the Slurm cluster directly (no pod service)")
    p.add_argument("--nodes", type=int, help="nodes, each with --devices GPUs (a cluster; default 1)")
    p.add_argument("--partition", help="the Slurm partition (default: the cluster's default)")
    p.add_argument("--dry-run", action="store_true", help="with --cluster: print the sbatch script, submit nothing")
    p.add_argument("--requirements", type=Path, help="run the command in its own environment: this requirements.txt")
    p.add_argument("--package", action="append", default=[], metavar="REQ",
                   help="run the command in its own environment with this package, e.g. torch==2.13.0 (repeatable)")  # fmt: skip
    p.add_argument("--python", help="the environment's Python version, e.g. 3.11 (default: the pod's own)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="FILE.toml|FILE.json, or -- ARGV...")
    p.set_defaults(func=submit)

    def on_jobs(name: str, help_text: str, func: Callable[[argparse.Namespace], int], *, cluster: bool = True,
                job: bool = True) -> argparse.ArgumentParser:  # fmt: skip
        """A command on the pod's jobs, or a fleet's (``--fleet``), or Slurm's (``--cluster``); ``job``: of one."""
        q: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        q.add_argument("--fleet", metavar="URL", help="a fleet's URL (deskpod fleet up) instead of the pod's")
        if cluster:
            q.add_argument("--cluster", choices=("slurm",), help="a job submitted with deskpod submit --cluster slurm")
        if job:
            q.add_argument("id")
        q.set_defaults(func=func)
        return q

    p = on_jobs("jobs", "list your jobs (every job for an admin)", jobs, job=False)
    p.add_argument("--state", help="only jobs in this state")
    p.add_argument("--user", help="only this user's jobs (admins)")
    p.add_argument("--name", help="only jobs whose name contains this")
    p.add_argument("--limit", type=int, default=1000, help="at most this many, newest first (default 1000)")
    p.add_argument("--json", action="store_true")
    on_jobs("show", "one job: its spec, state, devices and history", show).add_argument("--json", action="store_true")
    p = on_jobs("logs", "a job's output", logs)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    on_jobs("cancel", "cancel a queued job or stop a running one", cancel)
    on_jobs("requeue", "run a cancelled, failed or lost job again (a running one is stopped first)", requeue,
            cluster=False)  # fmt: skip

    p = sub.add_parser("extend", help="give a queued or running session more time (never past the pod's longest)")
    p.add_argument("id")
    p.add_argument("--time", required=True, help="how much more, e.g. 2h or 30m")
    p.set_defaults(func=extend)

    p = on_jobs("status", "each device: free, or which job and user holds it", status, cluster=False, job=False)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("user", help="pod service users and tokens")
    us = p.add_subparsers(dest="user_command", metavar="ACTION", required=True)
    q = us.add_parser("add", help="create a user and print its token (admin only)")
    q.add_argument("name")
    q.add_argument("--admin", action="store_true")
    q.add_argument("--os-user", help="the OS account their jobs run as (default: the account of the same name)")
    q.set_defaults(func=user_add)
    q = us.add_parser("revoke", help="revoke every token and dashboard session of a user (admin, or yourself)")
    q.add_argument("name")
    q.set_defaults(func=user_revoke)
    q = us.add_parser("list", help="list users (admin only)")
    q.set_defaults(func=user_list)
    q = us.add_parser("token", help="make another token for a user (admin, or yourself)")
    q.add_argument("name")
    q.set_defaults(func=user_token)
    q = us.add_parser("login", help="save a token (read from stdin) to your token file, mode 0600")
    q.set_defaults(func=user_login)
    q = us.add_parser("whoami", help="who your token says you are")
    q.set_defaults(func=user_whoami)


def _client(args: argparse.Namespace | None = None) -> Any:
    """The pod service's client, or with ``--cluster slurm`` one that asks Slurm (the same answers), or a fleet's
    (``--fleet URL``, and ``deskpod fleet`` commands)."""
    if args is not None and getattr(args, "cluster", None) == "slurm":
        from deskpod.cluster.client import SlurmClient

        return SlurmClient()
    if args is not None and (getattr(args, "fleet", None) or hasattr(args, "fleet_command")):
        return fleet_client(args)
    from deskpod.jobs.client import PodClient

    return PodClient.from_environment()


def fleet_client(args: argparse.Namespace) -> Any:
    """The fleet's client: ``--fleet URL`` (token: DESKPOD_TOKEN_FILE), else DESKPOD_URL, else the local fleet."""
    from deskpod.environment import Environment
    from deskpod.jobs.client import PodClient, find_url, read_token, token_path

    env = Environment.read()
    if args.fleet:
        return PodClient(args.fleet, read_token(token_path(env)))
    if env.pod_url:
        return PodClient.from_environment(env)
    home = env.home / "fleet"
    return PodClient(find_url(dataclasses.replace(env, home=home)), read_token(env.token_file or home / "token"))


def up(args: argparse.Namespace) -> int:
    from deskpod.environment import Environment
    from deskpod.environment.sizes import parse_duration, parse_size
    from deskpod.envs.limits import LimitSettings, parse_job_memory, parse_job_tasks
    from deskpod.jobs.pod import PodConfig

    env = Environment.read()
    home = (args.home or env.home).expanduser().resolve()
    named = {"name": args.name} if args.name else {}
    config = PodConfig(
        home=home,
        **named,
        host=args.host,
        port=args.port,
        preemption=not args.no_preemption,
        grace_s=args.grace,
        machine=args.machine,
        priority_limit=args.priority_limit,
        socket=args.socket.expanduser().resolve() if args.socket else None,
        sandbox=not args.no_sandbox,
        allow_unsandboxed=args.allow_unsandboxed,
        unmapped_user=args.unmapped_user or None,
        env_cache=args.env_cache.expanduser().resolve() if args.env_cache else None,
        env_cache_limit=None if args.env_cache_limit is None else parse_size(args.env_cache_limit),
        limits=LimitSettings(
            job_memory=parse_job_memory(args.job_memory),
            job_tasks=parse_job_tasks(args.job_tasks),
            pin_cpus=not args.no_pin_cpus,
        ),
        job_disk=_disk(args.job_disk),
        session_max_time=parse_duration(args.session_max_time, "--session-max-time"),
        session_time=parse_duration(args.session_time, "--session-time"),
        idle_timeout=None if args.idle_timeout == "off" else parse_duration(args.idle_timeout, "--idle-timeout"),
    )
    for pem in args.trust_fleet:
        from deskpod.jobs.trust import add_trusted

        print(f"deskpod: pod {config.name!r} trusts {add_trusted(home, pem.expanduser())} from now on", flush=True)
    if args.detach:
        return _detach(args, home)
    from deskpod.jobs.daemon import serve

    executor = None
    if args.backend == "slurm":
        from deskpod.cluster.backend import SlurmExecutor

        executor = SlurmExecutor()  # no Slurm or no controller: one line and exit 2/1, before anything starts

    extensions = []
    if not args.no_dashboard:
        from deskpod.web import dashboard

        extensions.append(dashboard)
    return serve(config, env, extensions=extensions, executor=executor)


def _detach(args: argparse.Namespace, home: Path) -> int:
    import subprocess

    from deskpod.errors import ServiceError

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    # itself again, with exactly the arguments it was given (and the home they resolved to), in the foreground
    argv = [sys.executable, "-m", "deskpod", *(a for a in args.argv if a != "--detach"), "--home", str(home)]
    info = home / "daemon.json"
    info.unlink(missing_ok=True)
    # the daemon's own output (tracebacks, what jobs did) is root's: 0600, as the rest of the pod's state
    fd = os.open(home / "daemon.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # one an older pod left readable
    with os.fdopen(fd, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"the pod service exited at start (code {proc.returncode}); see {home / 'daemon.log'}")
        if info.exists():
            print(
                f"deskpod: pod service on {json.loads(info.read_text())['url']} (pid {proc.pid}, log {home / 'daemon.log'})"
            )
            return 0
        time.sleep(0.1)
    raise ServiceError(f"the pod service did not come up in 60 s; see {home / 'daemon.log'}")


def _disk(text: str) -> int | Literal["default"] | None:
    """``--job-disk``: ``default`` (decided by the daemon), ``none``, or a size like ``200G``."""
    from deskpod.environment.sizes import parse_size

    word = text.strip().lower()
    if word in ("default", "none"):
        return "default" if word == "default" else None
    return parse_size(text, "--job-disk")


def down(args: argparse.Namespace) -> int:
    from deskpod.errors import ServiceError

    with _client() as c:
        running = c.status()["running"]
        c.shutdown(stop_jobs=args.stop_jobs)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                c.health()
            except ServiceError:
                if running and args.stop_jobs:
                    print(f"deskpod: pod service stopped; {running} running job(s) stopped and requeued")
                elif running:
                    print(
                        f"deskpod: pod service stopped; {running} job(s) keep running and the next `deskpod up` re-adopts them"
                    )
                else:
                    print("deskpod: pod service stopped")
                return 0
            time.sleep(0.1)
    raise ServiceError("the pod service did not stop within 120 s")


def _spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from deskpod.errors import ConfigError
    from deskpod.jobs.spec import load_spec_file

    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise ConfigError(
            "submit: give a spec file (job.toml) or a command after --, e.g. deskpod submit -- python x.py"
        )
    is_file = len(words) == 1 and Path(words[0]).suffix.lower() in (".toml", ".json") and args.command[0] != "--"
    spec: dict[str, Any] = load_spec_file(Path(words[0])) if is_file else {"command": words, "workdir": str(Path.cwd())}
    for key, value in (("devices", args.devices), ("name", args.name), ("priority", args.priority),
                       ("placement", args.placement), ("max_runtime", args.max_runtime), ("retries", args.retries),
                       ("nodes", getattr(args, "nodes", None)), ("device_kind", getattr(args, "device_kind", None))):  # fmt: skip
        if value is not None:
            spec[key] = value
    if getattr(args, "partition", None):
        spec.setdefault("slurm", {})["partition"] = args.partition
    for item in args.env:
        name, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--env {item!r}: expected NAME=VALUE")
        spec.setdefault("env", {})[name] = value
    environment_from_flags(spec, args.requirements, args.package, args.python)
    return spec


def environment_from_flags(spec: dict[str, Any], requirements: Path | None, packages: list[str],
                           python: str | None) -> None:  # fmt: skip
    """The spec's ``[environment]`` from ``--requirements`` (a file), ``--package`` and ``--python``, over the one
    a spec file has, when any is given; files are read from this folder."""
    if requirements or packages or python:
        from deskpod.envs.definition import parse_environment

        table: dict[str, Any] = dict(spec.get("environment") or {})
        if requirements:
            table["requirements"] = str(requirements.resolve())
        if packages:
            table["packages"] = list(packages)
        if python:
            table["python"] = python
        spec["environment"] = parse_environment(table, base_dir=Path.cwd()).to_json()


def submit(args: argparse.Namespace) -> int:
    from deskpod.errors import ConfigError

    spec = _spec_from_args(args)
    if args.dry_run and not args.cluster:
        raise ConfigError("--dry-run shows the sbatch script of a cluster job: use it with --cluster slurm")
    if args.dry_run:
        with _client(args) as c:
            print(c.submit(spec, dry_run=True)["script"], end="")
        return 0
    with _client(args) as c:
        job = c.submit(spec)
        if args.json:
            print(json.dumps(job, indent=2))
        else:
            print(job["id"], flush=True)
        if args.fleet:  # where the fleet sends it, and why
            said = wait_route(c, str(job["id"]))
            if said:
                print(f"deskpod: {said}", file=sys.stderr)
    return 0


def _age(t: float | None) -> str:
    if t is None:
        return "-"
    s = max(0.0, time.time() - t)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h"


def jobs(args: argparse.Namespace) -> int:
    with _client(args) as c:
        rows = c.jobs(state=args.state, limit=args.limit, user=args.user, name=args.name)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'ID':>6}  {'USER':<10} {'NAME':<20} {'STATE':<10} {'DEV':>3} {'ON':<8} {'PRIO':>4} {'AGE':>5}  REASON")
    for j in rows:
        on = ",".join(map(str, j["assigned"])) or "-"
        print(f"{j['id']:>6}  {j['user']:<10.10} {j['name']:<20.20} {j['state']:<10} {j['devices']:>3} {on:<8.8}"
              f" {j['priority']:>4} {_age(j['submitted_at']):>5}  {j['reason']}")  # fmt: skip
    print_device_hours(rows)
    return 0


def print_device_hours(rows: list[dict[str, Any]]) -> None:
    """The sessions among ``rows``: device-hours each held and used (its devices seen at work), and in total."""
    from deskpod.jobs.kinds import KINDS

    sessions = [j for j in rows if j["kind"] in KINDS and KINDS[j["kind"]].SESSION and j["started_at"] is not None]
    if not sessions:
        return
    print(f"\n{'SESSION':>7}  {'KIND':<11} {'HELD':>9} {'USED':>9}  (device-hours; used: its devices seen at work)")
    for j in sessions:
        dh = j["device_hours"]
        print(f"{j['id']:>7}  {j['kind']:<11} {dh['held']:>9.3f} {dh['used']:>9.3f}")
    held, used = (sum(j["device_hours"][k] for j in sessions) for k in ("held", "used"))
    share = f" ({100 * used / held:.0f}%)" if held else ""
    print(f"{'total':>7}  {'':<11} {held:>9.3f} {used:>9.3f}{share}")


def show(args: argparse.Namespace) -> int:
    with _client(args) as c:
        job = c.job(args.id)
    if args.json:
        print(json.dumps(job, indent=2))
        return 0
    for key in ("id", "name", "user", "kind", "state", "reason", "devices", "assigned", "priority", "attempt",
                "retries", "exit_code", "pid", "port"):  # fmt: skip
        print(f"{key:<10} {job[key]}")
    print(f"{'spec':<10} {json.dumps(job['spec'])}")
    print("history:")
    for e in job["events"]:
        stamp = time.strftime("%H:%M:%S", time.localtime(e["at"]))
        print(f"  {stamp}  {e['from'] or '-':>9} -> {e['to']:<9}  {e['note']}")
    return 0


def logs(args: argparse.Namespace) -> int:
    from deskpod.jobs.states import FINAL

    final = {s.value for s in FINAL}
    out = sys.stdout.buffer
    offset = 0
    with _client(args) as c:
        while True:
            data, offset, state = c.log(args.id, offset)
            out.write(data)
            out.flush()
            if not args.follow or (not data and state in final):
                return 0
            if not data:
                time.sleep(0.2)


def cancel(args: argparse.Namespace) -> int:
    with _client(args) as c:
        job = c.cancel(args.id)
    extra = f" ({job['reason']})" if job["state"] != "cancelled" and job["reason"] else ""
    print(f"job {job['id']}: {job['state']}{extra}")
    return 0


def extend(args: argparse.Namespace) -> int:
    from deskpod.environment.sizes import duration_text, parse_duration

    seconds = parse_duration(args.time)
    with _client(args) as c:
        job = c.extend(args.id, seconds)
    started = job["started_at"]
    end = (
        "" if started is None else f", until {time.strftime('%H:%M:%S', time.localtime(started + job['max_runtime']))}"
    )
    print(f"job {job['id']}: {duration_text(job['max_runtime'])} in all{end}")
    return 0


def requeue(args: argparse.Namespace) -> int:
    with _client(args) as c:
        job = c.requeue(args.id)
    extra = f" ({job['reason']})" if job["reason"] else ""
    print(f"job {job['id']}: {job['state']}{extra}")
    return 0


def status(args: argparse.Namespace) -> int:
    with _client(args) as c:
        st = c.status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    for d in st["devices"]:
        holder = "free" if d["job"] is None else f"job {d['job']} ({d['name']}) of {d['user']}"
        print(f"{d['kind']}:{d['index']:<4} {holder}")
    print(f"queued {st['queued']}, running {st['running']}, preemption {'on' if st['preemption'] else 'off'}")
    return 0


def user_add(args: argparse.Namespace) -> int:
    with _client() as c:
        made = c.add_user(args.name, args.admin, args.os_user)
    print(made["token"])
    if made.get("runs_as"):
        print(f"deskpod: {made['name']}'s jobs run as the OS account {made['runs_as']}", file=sys.stderr)
    print(f"deskpod: user {made['name']} created; give them this token (shown once): `deskpod user login` saves it",
          file=sys.stderr)  # fmt: skip
    return 0


def user_list(args: argparse.Namespace) -> int:
    with _client() as c:
        for u in c.users():
            runs = f"  (jobs run as {u['runs_as']})" if u.get("runs_as") else ""
            print(f"{u['name']}{'  (admin)' if u['admin'] else ''}{runs}")
    return 0


def user_revoke(args: argparse.Namespace) -> int:
    with _client() as c:
        done = c.revoke(args.name)
    print(f"deskpod: revoked {done['revoked']} token(s) of {done['name']} and ended their dashboard sessions")
    return 0


def user_token(args: argparse.Namespace) -> int:
    with _client() as c:
        print(c.new_token(args.name))
    return 0


def user_login(args: argparse.Namespace) -> int:
    from deskpod.environment import Environment
    from deskpod.errors import ConfigError
    from deskpod.jobs.auth import write_token_file
    from deskpod.jobs.client import token_path

    token = sys.stdin.readline().strip()
    if not token:
        raise ConfigError("user login: give the token on stdin, e.g. deskpod user login < token.txt")
    path = token_path(Environment.read())
    write_token_file(path, token)
    print(f"deskpod: token saved to {path} (mode 0600)")
    return 0


def user_whoami(args: argparse.Namespace) -> int:
    with _client() as c:
        me = c.whoami()
    print(f"{me['name']}{'  (admin)' if me['admin'] else ''}")
    return 0


def wait_route(client: Any, job_id: str, timeout: float = 10.0) -> str | None:
    """The fleet's routing note of a job just submitted (``routed to box-b ...: reasons``), once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.job(job_id)
        for e in job["events"]:
            if e["note"].startswith("routed to "):
                return str(e["note"])
        if job["state"] != "queued" or job["reason"].startswith("no member"):
            return str(job["reason"]) or None
        time.sleep(0.1)
    return None
