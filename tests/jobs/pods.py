"""Helpers for the tests: a real pod service on 127.0.0.1: ``python -m deskpod up --port P --home TMP``.

Every daemon and every job process a test starts is stopped at teardown: the daemon by
``POST /v1/shutdown`` with ``stop_jobs`` (or SIGKILL), leftover job process groups by SIGKILL after
checking their pid and start time in the daemon's store.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deskpod.environment.network import free_port
from deskpod.envs.accounts import Account, drop_privileges
from deskpod.errors import AccessError, AuthError, ConfigError, ConflictError, NotFoundError
from deskpod.jobs.client import PodClient


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class Pod:
    home: Path
    port: int
    env: dict[str, str]
    args: tuple[str, ...]
    proc: subprocess.Popen[bytes] | None = None
    command: tuple[str, ...] = ("up",)
    """What starts it: ``deskpod up``, or ``deskpod fleet up``."""
    token: str = ""
    clients: list[PodClient] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Pod:
        out = open(self.home / "daemon.out", "ab")  # noqa: SIM115 - the daemon writes it for its life
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deskpod",
                *self.command,
                "--port",
                str(self.port),
                "--home",
                str(self.home),
                *self.args,
            ],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        probe = PodClient(self.url, None, timeout=2)

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited: {(self.home / 'daemon.out').read_text()}")
            try:
                probe.health()
                return True
            except Exception:
                return False

        try:
            wait_for(healthy, 60, "the daemon to answer /health")
        finally:
            probe.close()
        self.token = (self.home / "token").read_text().strip()
        return self

    def client(self, token: str | None = None) -> PodClient:
        c = PodClient(self.url, token or self.token)
        self.clients.append(c)
        return c

    def kill(self) -> None:
        """SIGKILL the daemon (not its jobs)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def cli(self, *argv: str, token_file: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
        env = dict(self.env, DESKPOD_URL=self.url, DESKPOD_TOKEN_FILE=str(token_file or self.home / "token"))
        return subprocess.run(
            [sys.executable, "-m", "deskpod", *argv], env=env, capture_output=True, text=True, input=stdin, timeout=60
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception), PodClient(self.url, self.token, timeout=5) as c:
                c.shutdown(stop_jobs=True)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for c in self.clients:
            c.close()
        kill_leftover_jobs(self.home)


def kill_leftover_jobs(home: Path) -> None:
    """SIGKILL what remains of every job process group the store knows (see `kill_leftovers`)."""
    from deskpod.jobs.supervisor import kill_leftovers

    db = home / "pod.db"
    if not db.exists():
        return
    con = sqlite3.connect(str(db))
    try:
        rows = con.execute("SELECT pid, pid_start FROM jobs WHERE pid IS NOT NULL").fetchall()
    finally:
        con.close()
    for pid, started in rows:
        kill_leftovers(pid, started)
    from deskpod.envs.cgroups import detect
    from deskpod.jobs.confinement import pod_name

    cgroups = detect(pod_name(home.resolve())).cgroups  # a daemon killed in a test leaves its jobs' cgroups
    if cgroups is not None:
        for job_id in cgroups.job_ids():
            group = cgroups.group(job_id)
            group.kill()
            group.remove()
        cgroups.remove()


class Pods:
    """Starts pods under one folder and stops them all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: list[Pod] = []

    def __call__(
        self, *args: str, home: Path | None = None, port: int | None = None, sandbox: bool = False, fleet: bool = False,
        env: dict[str, str] | None = None,
    ) -> Pod:  # fmt: skip
        """A pod started with ``deskpod up ARGS`` (with ``fleet``: ``deskpod fleet up ARGS``, which runs no job
        itself). Its jobs run without walls unless ``sandbox``: most tests watch what a job does from outside (files
        under the test's /tmp, which a sandbox makes private); tests/jobs/test_isolation.py is where the walls are
        tested. ``env`` is set in the daemon's environment, beside this process's."""
        if not sandbox and not fleet:
            args = ("--no-sandbox", *args)
        h = home or self.root / f"home{len(self.made)}"
        h.mkdir(exist_ok=True)
        environ = dict(os.environ, DESKPOD_TOKEN_FILE=str(h / "token"), **(env or {}))
        environ.pop("DESKPOD_URL", None)
        pod = Pod(h, port or free_port(), environ, args if fleet else ("--grace", "2", *args),
                  command=("fleet", "up") if fleet else ("up",))  # fmt: skip
        self.made.append(pod)
        return pod.start()

    def stop_all(self) -> None:
        for pod in self.made:
            pod.stop()


def job_schema(document: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of ``POST /v1/jobs``' body in the pod's OpenAPI ``document``."""
    schema = document["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert isinstance(schema, dict)
    return schema


def python_job(code: str) -> list[str]:
    return [sys.executable, "-c", code]


# A job that ignores nothing: it prints, then sleeps until SIGTERM, which it handles by writing a marker.
SLEEPER = """
import os, signal, sys, time
def bye(*_):
    print("got SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, bye)
print("started", os.environ.get("DESKPOD_CPU_SLOTS"), os.environ.get("MASTER_PORT"), flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 600)
print("finished", flush=True)
"""


def wait_state(client: PodClient, job_id: str, *states: str, timeout: float = 30) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = client.job(job_id)
        return job if job["state"] in states else None

    got = wait_for(check, timeout, f"job {job_id} to reach {states}")
    assert isinstance(got, dict)
    return got


def as_user(account: Account, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a child process that has become ``account`` (its return value comes back as JSON).

    Everything ``fn`` needs is imported before the fork: the child may not be able to read this
    interpreter's files once it is the account.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            drop_privileges(account)
            out: Any = {"ok": fn()}
        except Exception as e:
            out = {"error": type(e).__name__, "message": str(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    got = json.loads(data)
    if "error" in got:
        known = {"AccessError": AccessError, "ConfigError": ConfigError, "AuthError": AuthError,
                 "ConflictError": ConflictError, "NotFoundError": NotFoundError}  # fmt: skip
        raise known.get(got["error"], RuntimeError)(got["message"])
    return got["ok"]


def socket_of(pod: Pod) -> Path:
    return Path(json.loads((pod.home / "daemon.json").read_text())["socket"])


def on_socket(pod: Pod, call: Callable[[PodClient], Any]) -> Callable[[], Any]:
    path = socket_of(pod)

    def run() -> Any:
        with PodClient.over_socket(path) as c:
            return call(c)

    return run
