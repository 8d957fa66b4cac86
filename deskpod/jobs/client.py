"""The pod service's HTTP client, used by the CLI and by ``deskpod train --submit``.

Where it connects, first found: the Unix socket ``DESKPOD_SOCKET``; the URL ``DESKPOD_URL``; the
socket, else the URL, in ``<DESKPOD_HOME>/daemon.json`` that a local ``deskpod up`` wrote; the
system pod's socket `SYSTEM_SOCKET`. On a socket the kernel tells the pod who you are: no token.
Over HTTP its token is the file ``DESKPOD_TOKEN_FILE`` (default ``<DESKPOD_HOME>/token``), which
must be readable by its owner only. An answer ``{"error": ...}`` becomes the matching
`deskpod.errors` class, so the CLI prints one line and exits 2 for bad input, 1 for failures.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import httpx

from deskpod.environment import Environment
from deskpod.errors import (
    AccessError,
    AuthError,
    ConfigError,
    ConflictError,
    NotFoundError,
    ServiceError,
    TooLargeError,
    UsageError,
)

_BY_STATUS: dict[int, type[UsageError]] = {
    401: AuthError, 403: AccessError, 404: NotFoundError, 409: ConflictError, 413: TooLargeError,
}  # fmt: skip


def token_path(env: Environment) -> Path:
    return env.token_file or env.home / "token"


def read_token(path: Path) -> str:
    """The token in ``path``; refused when others may read the file (it is a password)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        raise AuthError(
            f"no token file at {path}: the admin's is written by `deskpod up`; others save theirs with `deskpod user login`"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthError(f"token file {path} is readable by others (mode {mode & 0o777:o}); run: chmod 600 {path}")
    token = path.read_text().strip()
    if not token:
        raise AuthError(f"token file {path} is empty")
    return token


SYSTEM_SOCKET = Path("/run/deskpod/pod.sock")
"""Where a box-wide pod listens when its admin starts it with ``deskpod up --socket /run/deskpod/pod.sock``."""


def find_socket(env: Environment) -> Path | None:
    """The pod's Unix socket to use, or None to go over HTTP (see the module docstring for the order)."""
    if env.pod_socket is not None:
        return env.pod_socket
    if env.pod_url:
        return None
    try:
        given = json.loads((env.home / "daemon.json").read_text()).get("socket")
    except (OSError, ValueError, AttributeError):
        given = None
    if given and Path(given).is_socket():
        return Path(given)
    if given is None and not (env.home / "daemon.json").exists() and SYSTEM_SOCKET.is_socket():
        return SYSTEM_SOCKET
    return None


def find_url(env: Environment) -> str:
    if env.pod_url:
        return env.pod_url.rstrip("/")
    info = env.home / "daemon.json"
    try:
        return str(json.loads(info.read_text())["url"]).rstrip("/")
    except (OSError, ValueError, KeyError, TypeError):
        raise ServiceError(
            f"no pod service found: {info} is missing (start one with `deskpod up`, or set DESKPOD_URL)"
        ) from None


class PodClient:
    """One method per endpoint; raises `deskpod.errors` classes, never returns an error body."""

    def __init__(
        self, url: str, token: str | None, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None
    ):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout, transport=transport, trust_env=False)

    @classmethod
    def from_environment(cls, env: Environment | None = None) -> PodClient:
        env = env or Environment.read()
        sock = find_socket(env)
        if sock is not None:
            return cls.over_socket(sock)
        return cls(find_url(env), read_token(token_path(env)))

    @classmethod
    def over_socket(cls, path: Path, *, timeout: float = 30.0) -> PodClient:
        """A client on the pod's Unix socket: the kernel identifies the caller, no token is sent."""
        client = cls("http://pod", None, timeout=timeout, transport=httpx.HTTPTransport(uds=str(path)))
        client.url = str(path)
        return client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PodClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise ServiceError(f"cannot reach the pod service at {self.url} ({e}); is `deskpod up` running?") from e
        if r.status_code < 400:
            return r
        try:
            message = str(r.json()["error"])
        except (ValueError, KeyError, TypeError):
            message = r.text[:200] or r.reason_phrase
        if r.status_code >= 500:
            raise ServiceError(f"pod service failed ({r.status_code}): {message}")
        raise _BY_STATUS.get(r.status_code, ConfigError)(message)

    def probe(self, path: str) -> int | None:
        """The HTTP status of ``GET path`` (redirects not followed); None when the pod cannot be reached."""
        try:
            return self._http.get(path).status_code
        except httpx.TransportError:
            return None

    def health(self) -> dict[str, Any]:
        return dict(self.request("GET", "/health").json())

    def whoami(self) -> dict[str, Any]:
        return dict(self.request("GET", "/v1/whoami").json())

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", "/v1/jobs", json=spec).json())

    def jobs(
        self, state: str | None = None, limit: int = 1000, *, user: str | None = None, name: str | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("state", state), ("user", user), ("name", name)):
            if value:
                params[key] = value
        return list(self.request("GET", "/v1/jobs", params=params).json()["jobs"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/jobs/{_quoted(job_id)}").json())

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("POST", f"/v1/jobs/{_quoted(job_id)}/cancel").json())

    def requeue(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("POST", f"/v1/jobs/{_quoted(job_id)}/requeue").json())

    def extend(self, job_id: str, seconds: float) -> dict[str, Any]:
        return dict(self.request("POST", f"/v1/jobs/{_quoted(job_id)}/extend", json={"seconds": seconds}).json())

    def log(self, job_id: str, offset: int = 0) -> tuple[bytes, int, str]:
        """(bytes from ``offset``, the next offset, the job's state)."""
        r = self.request("GET", f"/v1/jobs/{_quoted(job_id)}/log", params={"offset": offset})
        return r.content, int(r.headers["X-Deskpod-Offset"]), r.headers["X-Deskpod-State"]

    def status(self) -> dict[str, Any]:
        return dict(self.request("GET", "/v1/status").json())

    def metrics(self) -> str:
        return self.request("GET", "/metrics").text

    def add_user(self, name: str, admin: bool = False, os_user: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "admin": admin}
        if os_user is not None:
            body["os_user"] = os_user
        return dict(self.request("POST", "/v1/users", json=body).json())

    def revoke(self, name: str) -> dict[str, Any]:
        return dict(self.request("POST", f"/v1/users/{_quoted(name)}/revoke").json())

    def users(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/v1/users").json()["users"])

    def new_token(self, name: str) -> str:
        return str(self.request("POST", f"/v1/users/{_quoted(name)}/tokens").json()["token"])

    def shutdown(self, stop_jobs: bool = False) -> None:
        self.request("POST", "/v1/shutdown", json={"stop_jobs": stop_jobs})


def _quoted(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


def submit_train(train_config: dict[str, object], *, devices: int | str, name: str | None) -> str:
    """Queue a `deskpod train` job on the local pod service; returns its id (``deskpod train --submit``)."""
    from deskpod.jobs.kinds import train

    with PodClient.from_environment() as client:
        return str(client.submit(train.spec(train_config, devices=devices, name=name))["id"])
