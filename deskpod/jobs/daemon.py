"""``deskpod up``: one process holding the API (uvicorn), the scheduler loop and the supervisor.

Files under the home (``DESKPOD_HOME``, default ``~/.deskpod``)::

    pod.db            SQLite (WAL): users, token hashes, jobs, history
    daemon.lock       held (flock) while a daemon runs: a second one on the same home is refused
    daemon.json       {"url", "pid"}: how the CLI on this box finds the service
    token             the admin token written on first start (mode 0600), unless DESKPOD_TOKEN_FILE says elsewhere
    jobs/<id>/        output.log, exit.<attempt>, pid.<attempt>, and for train jobs train.toml and runs/

The daemon may be SIGKILLed at any instant: the lock dies with it, the store is transactional, and
the next ``deskpod up`` re-adopts the jobs that still run (see `deskpod.jobs.pod`). SIGTERM/SIGINT
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
from deskpod.jobs.pod import Pod, PodConfig


def _lock(home: Path) -> IO[str]:
    f = open(home / "daemon.lock", "a+")  # noqa: SIM115 - held for the daemon's whole life
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
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}; pick another --port") from e
    sock.listen(512)
    sock.set_inheritable(False)
    return sock


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
) -> int:
    """Run the pod service until SIGTERM/SIGINT or ``POST /v1/shutdown``; returns the exit code.

    ``extensions`` add routes to the service's app (``deskpod up`` hands in the dashboard's); see
    `deskpod.jobs.api.create_app`. ``executor`` runs the jobs elsewhere (``--backend slurm``); see
    `deskpod.jobs.executor`.
    """
    import uvicorn

    from deskpod.hardware.devices import discover
    from deskpod.hardware.placement import local_topology, place
    from deskpod.jobs import auth
    from deskpod.jobs.api import create_app
    from deskpod.jobs.store import Store

    env = env or Environment.read()
    home = config.home
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = _lock(home)
    sock = _bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    store = Store(home / "pod.db")
    token = auth.bootstrap(store)
    if token is not None:
        path = env.token_file or home / "token"
        auth.write_token_file(path, token)
        print(f"deskpod: created the admin user; its token is in {path} (mode 0600)", flush=True)

    topo = local_topology() if config.machine is None else _catalog_topology(config.machine)
    kind = discover(env).kind
    pod = Pod(
        config,
        store,
        device_count=topo.device_count,
        device_kind=kind,
        place=lambda f, k, p: place(topo, f, k, policy=p),
        topology=topo,
        executor=executor,
    )
    pod.start()

    stop_jobs = [False]
    servers: list[uvicorn.Server] = []

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # SIGTERM/SIGINT: live streams end too
            pod.stopping.set()
            super().handle_exit(sig, frame)

    def on_shutdown(also_jobs: bool) -> None:
        stop_jobs[0] = also_jobs
        pod.stopping.set()
        servers[0].should_exit = True

    app = create_app(pod, on_shutdown=on_shutdown, extensions=extensions)
    # Live streams watch pod.stopping and end within a second; the timeout is the backstop.
    server = Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5)
    )
    servers.append(server)
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    info = home / "daemon.json"
    info.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    what = "GPUs" if kind == "cuda" else "CPU worker slots"
    print(f"deskpod: pod service on {url} (home {home}, {topo.device_count} {what})", flush=True)
    if extensions:
        print(f"deskpod: dashboard on {url}/ui/ (sign in with a user's token)", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        pod.close(stop_jobs=stop_jobs[0])
        store.close()
        with contextlib.suppress(OSError, ValueError):
            if json.loads(info.read_text()).get("pid") == os.getpid():
                info.unlink()
        sock.close()
        lock.close()
    print("deskpod: pod service stopped", file=sys.stderr, flush=True)
    return 0
