"""``deskpod up``: one process holding the API (uvicorn), the scheduler loop and the supervisor.

Files under the home (``DESKPOD_HOME``, default ``~/.deskpod``)::

    pod.db            SQLite (WAL): users, token hashes, jobs (their env: secrets), history; 0600, -wal/-shm too
    daemon.lock       held (flock) while a daemon runs: a second one on the same home is refused; 0600
    daemon.json       {"url", "socket", "pid"}: how the CLI on this box finds the service (0644: users read it)
    daemon.log        the output of a daemon started with --detach (0600)
    pod.sock          the Unix socket (0666): local users need no token, the kernel says who they are
    token             the admin token written on first start (mode 0600), unless DESKPOD_TOKEN_FILE says elsewhere
    jobs/<id>/        the job's folder, its user's (mode 0700): output.log, exit/pid/phase.<attempt>, for
                      train jobs train.toml and runs/, for jobs with an [environment] env-build.log and environment/
    envs/             the environments jobs asked for (`deskpod env list`), shared by all jobs
    plan/             the box's calibration (`deskpod.plan.local`), the pod's alone (0700)
    trusted-fleets/   the public keys of the fleets whose assertions the pod accepts (`deskpod.jobs.trust`; 0700)

The home is mode 0711 on a root pod (users reach their job folders and the socket, nothing else).

The daemon may be SIGKILLed at any instant: the lock dies with it, the store is transactional, and
the next ``deskpod up`` re-adopts the jobs that still run (see `deskpod.jobs.local`). SIGTERM/SIGINT
or ``deskpod down`` stop it gracefully; jobs keep running unless ``--stop-jobs`` was asked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from deskpod.environment import Environment
from deskpod.errors import UsageError
from deskpod.jobs.executor import Executor
from deskpod.jobs.pod import Pod, PodConfig, StackResolver
from deskpod.plan.local import calibration_path


def _lock(home: Path) -> IO[str]:
    """The home's lock, held for the daemon's whole life; 0600, so that no user can open it (and hold it)."""
    fd = os.open(home / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # one an older pod made 0644
    f = os.fdopen(fd, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise UsageError(f"a pod service already runs on home {str(home)!r} (see {home / 'daemon.json'})") from None
    return f


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this on Linux: without it a response written in two pieces
    # (headers, body) waits out the client's delayed ACK, about 40 ms per request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _listen(sock, (host, port), f"{host}:{port}", "--port")


def _bind_unix(path: Path) -> socket.socket:
    """The pod's Unix socket, connectable by every local user (the kernel tells who connected)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        if path.is_symlink() or not path.is_socket():
            raise UsageError(f"cannot listen on {path}: it exists and is not a socket; pick another --socket")
        path.unlink()  # a previous daemon's (the home's lock says none runs now)
    sock = _listen(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), str(path), str(path), "--socket")
    os.chmod(path, 0o666)
    return sock


def _listen(sock: socket.socket, address: str | tuple[str, int], shown: str, option: str) -> socket.socket:
    """``sock`` bound to ``address`` and listening (not inherited by children); `UsageError` naming the ``option``
    that picks another when it cannot bind."""
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {shown}: {e.strerror}; pick another {option}") from e
    sock.listen(512)
    sock.set_inheritable(False)
    return sock


def _protocol() -> type[Any]:
    """uvicorn's HTTP protocol, telling the app who is on the other end of a Unix-socket connection."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from deskpod.jobs.api import PEER
    from deskpod.jobs.identity import peer_of

    class PeerProtocol(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            self.deskpod_peer = peer_of(sock) if sock is not None else None

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self.deskpod_peer is not None:
                self.scope[PEER] = self.deskpod_peer  # type: ignore[literal-required]

        def handle_websocket_upgrade(self) -> None:
            """The WebSocket protocol that takes the connection over builds scopes of its own: its app is given
            the peer too (a session's WebSocket on the pod's socket: ``deskpod shell``)."""
            base, peer = self.ws_protocol_class, self.deskpod_peer
            if peer is None or base is None:
                return super().handle_websocket_upgrade()

            def build(**kwargs: Any) -> Any:
                protocol: Any = base(**kwargs)
                app = protocol.app

                async def with_peer(scope: Any, receive: Any, send: Any) -> None:
                    await app({**scope, PEER: peer}, receive, send)

                protocol.app = with_peer
                return protocol

            self.ws_protocol_class = build  # type: ignore[assignment]
            try:
                super().handle_websocket_upgrade()
            finally:
                self.ws_protocol_class = base

    return PeerProtocol


def _isolation(config: PodConfig, env: Environment, store: Any) -> Any:
    """Accounts, environments and walls of the pod's jobs; refuses a root pod without a sandbox unless allowed."""
    from deskpod.envs.cache import EnvCache
    from deskpod.envs.sandbox import check_sandbox
    from deskpod.jobs.identity import Accounts
    from deskpod.jobs.isolation import Isolation

    accounts = Accounts(store, unmapped=config.unmapped_user)
    print(f"deskpod: {accounts.describe()}", flush=True)
    sandbox = config.sandbox
    if sandbox:
        why = check_sandbox()
        if why is not None:
            if accounts.root and not config.allow_unsandboxed:
                raise UsageError(
                    f"cannot sandbox jobs: {why}; install bubblewrap (apt-get install bubblewrap), or start with "
                    "--allow-unsandboxed to run jobs without walls (each still as its own user)"
                )
            print(f"deskpod: WARNING: jobs run without a sandbox: {why}", file=sys.stderr, flush=True)
            sandbox = False
    elif accounts.root:
        print("deskpod: WARNING: --no-sandbox: jobs run without walls (each still as its own user)", flush=True)
    hidden = [config.home]
    if env.token_file is not None:
        hidden.append(env.token_file)
    envs = EnvCache(config.env_cache or env.env_cache or config.home / "envs")
    envs.root.mkdir(parents=True, exist_ok=True)
    os.chmod(envs.root, 0o755)  # every job's account runs the environments' interpreters
    return Isolation(
        envs=envs,
        accounts=accounts,
        sandbox=sandbox,
        hidden=tuple(hidden),
        dev_dir=env.dev_dir,
        jobs_root=config.home / "jobs",
    )


def _confinement(config: PodConfig, kind: str, topology: Any) -> Any:
    """Each job's cgroup (cores, memory, tasks) and disk limit; without cgroups here, jobs run without that part
    of them, after one line saying why."""
    from deskpod.envs.cgroups import detect
    from deskpod.envs.limits import Box
    from deskpod.jobs.confinement import Confinement, default_disk_limit, pod_name

    found = detect(pod_name(config.home))  # the same tree after a restart
    if found.cgroups is None:
        print(f"deskpod: WARNING: jobs run without cgroup limits: {found.reason}", file=sys.stderr, flush=True)
    else:
        print(f"deskpod: job limits: {found.reason}", flush=True)
    disk = default_disk_limit(config.home) if config.job_disk == "default" else config.job_disk
    box = Box.read("cuda" if kind == "cuda" else "cpu", topology.device_count, topology)
    return Confinement(config.limits, box, found.cgroups, disk)


def _catalog_topology(name: str) -> Any:
    """A catalog machine's topology, to try the scheduler on a box this one only pretends to be."""
    from deskpod.hardware.placement import machine

    return machine(name)


def serve(
    config: PodConfig,
    env: Environment | None = None,
    *,
    extensions: Sequence[Callable[[Any, Pod], None]] = (),
    executor: Executor | None = None,
    stacks: StackResolver | None = None,
) -> int:
    """Run the pod service until SIGTERM/SIGINT or ``POST /v1/shutdown``; returns the exit code.

    ``extensions`` add routes to the service's app (``deskpod up`` hands in the dashboard's); see
    `deskpod.jobs.api.create_app`. ``executor`` runs the jobs (`deskpod.jobs.executor`): by default this box's
    (`deskpod.jobs.local.LocalExecutor`), or Slurm's (``--backend slurm``), or a fleet's. ``stacks`` resolves the
    ``stack`` a spec names (a fleet's, `deskpod.fleet.stacks`); without it such a spec is refused.
    """
    import uvicorn

    from deskpod.hardware.devices import discover
    from deskpod.hardware.placement import Placement, Unplaceable, local_topology, place
    from deskpod.jobs import auth
    from deskpod.jobs.api import create_app
    from deskpod.jobs.local import LocalExecutor
    from deskpod.jobs.store import Store

    env = env or Environment.read()
    home = config.home
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.geteuid() == 0:  # users reach their own job folders and the socket through it, and list nothing
        os.chmod(home, 0o711)
        (home / "jobs").mkdir(exist_ok=True, mode=0o711)
        os.chmod(home / "jobs", 0o711)
        plan = calibration_path(home).parent  # the box's calibration: no user needs what the pod keeps there
        plan.mkdir(exist_ok=True, mode=0o700)
        os.chmod(plan, 0o700)
    lock = _lock(home)
    sock = _bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    unix_path = config.socket or home / "pod.sock"
    try:
        unix = _bind_unix(unix_path)
    except BaseException:
        sock.close()
        raise
    store = Store(home / "pod.db")
    isolation = _isolation(config, env, store) if executor is None else None
    token = auth.bootstrap(store, os_user=isolation.accounts.daemon.name if isolation is not None else None)
    if token is not None:
        path = env.token_file or home / "token"
        auth.write_token_file(path, token)
        print(f"deskpod: created the admin user; its token is in {path} (mode 0600)", flush=True)

    topo = local_topology() if config.machine is None else _catalog_topology(config.machine)
    kind = discover(env).kind
    confinement = _confinement(config, kind, topo) if executor is None else None

    def placer(free: Sequence[int], k: int, policy: str) -> Placement | Unplaceable:
        return place(topo, free, k, policy=policy)

    n = topo.device_count
    if executor is None:  # this box runs the jobs
        executor = LocalExecutor(config, device_count=n, device_kind=kind, place=placer, isolation=isolation,
                                 confinement=confinement)  # fmt: skip
    from deskpod.jobs.trust import Trust

    trust = Trust.load(home, config.name)
    if trust is not None:
        print(f"deskpod: pod {config.name!r} trusts fleet(s) {', '.join(sorted(trust.keys))}", flush=True)
    pod = Pod(config, store, executor, device_count=n, device_kind=kind, place=placer, topology=topo,
              isolation=isolation, confinement=confinement, trust=trust, stacks=stacks)  # fmt: skip
    pod.start()

    stop_jobs = [False]

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # SIGTERM/SIGINT: live streams end too
            pod.stopping.set()
            super().handle_exit(sig, frame)

    def on_shutdown(also_jobs: bool) -> None:
        stop_jobs[0] = also_jobs
        pod.stopping.set()
        server.should_exit = True

    app = create_app(pod, on_shutdown=on_shutdown, extensions=extensions)
    # Live streams watch pod.stopping and end within a second; the timeout is the backstop.
    server = Server(
        uvicorn.Config(
            app,
            http=_protocol(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            ws_per_message_deflate=False,  # a session's messages are relayed as they come (its server compresses none)
        )
    )
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    info = home / "daemon.json"
    info.write_text(json.dumps({"url": url, "socket": str(unix_path), "pid": os.getpid()}))
    os.chmod(info, 0o644)
    what = "GPUs" if kind == "cuda" else "CPU worker slots"
    print(f"deskpod: pod service on {url} and {unix_path} (home {home}, {topo.device_count} {what})", flush=True)
    if isolation is not None and isolation.accounts is not None and isolation.accounts.root:
        from deskpod.jobs.isolation import closed_ancestors

        closed = closed_ancestors([unix_path])
        if closed:
            print(f"deskpod: note: other accounts cannot reach {unix_path} ({closed[0]} is closed to them); "
                  "for the box's users start with --socket /run/deskpod/pod.sock", flush=True)  # fmt: skip
    if any(getattr(e, "__name__", "") == "dashboard" for e in extensions):  # beside it, others add routes (a fleet's)
        print(f"deskpod: dashboard on {url}/ui/ (sign in with a user's token)", flush=True)
    try:
        server.run(sockets=[sock, unix])
    finally:
        pod.close(stop_jobs=stop_jobs[0])
        store.close()
        with contextlib.suppress(OSError, ValueError):
            if json.loads(info.read_text()).get("pid") == os.getpid():
                info.unlink()
        sock.close()
        unix.close()
        with contextlib.suppress(OSError):
            unix_path.unlink()
        lock.close()
    print("deskpod: pod service stopped", file=sys.stderr, flush=True)
    return 0
