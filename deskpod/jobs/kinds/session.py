"""What every session kind shares (notebook, shell, tensorboard): where its server listens and under which path.

A session's process serves HTTP (and WebSocket) on the Unix socket `SOCKET` in its job folder, every URL under
``/sessions/<job id>/``; the pod forwards that path to it for the job's owner only (`deskpod.web.sessions`). The
folder is the owner's, mode 0700, so the socket is closed to everyone else on the box: a session never listens on a
TCP port, which every local account could reach (jobs share the box's network).

On a cluster (the pod's Slurm backend) the session runs on a compute node the pod reaches over the network, not on a
socket in a shared folder. There it listens on the node's address (`LISTEN_ENV`, which the node's launcher sets) on a
free port, behind a per-session secret the pod wrote at submission (`SECRET`, mode 0600 in the job's folder, given to
the server by file, never on its command line), and says where in `ENDPOINT`; the pod forwards to that address adding
the secret in `SECRET_HEADER`, which the browser never sees. (Not Jupyter's own token: JupyterLab writes that into
every page it serves, so the browser would hold it; see `deskpod.jobs.kinds.notebook_auth`.)
"""

from __future__ import annotations

import json
import secrets
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

SOCKET = "session.sock"
"""The session's server socket, in its job folder."""
PREFIX = "/sessions"
"""Where the pod serves sessions: ``/sessions/<id>/``."""
SOCKET_PATH_MAX = 107
"""Bytes of a Unix socket's path (``sun_path`` is 108, with its NUL)."""
SECRET = "session.secret"
"""A session on a cluster node: the secret its server asks of every request, written by the pod (0600)."""
SECRET_HEADER = "X-Deskpod-Session-Secret"
"""The header the pod sends the secret in (and drops from what browsers send)."""
SECRET_ENV = "DESKPOD_SESSION_SECRET_FILE"
"""Where the session's server reads its secret (a file, so it is on no command line)."""
ENDPOINT = "session.json"
"""A session on a cluster node: ``{"host": ..., "port": ...}``, written by the session before it listens."""
LISTEN_ENV = "DESKPOD_SESSION_HOST"
"""Set (to the node's address) where the pod reaches the session over the network: it listens there, not on
`SOCKET`."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a session on a cluster node listens, and the secret it asks for."""

    host: str
    """The node's address, as Slurm reaches it (``NodeAddr``)."""
    port: int
    secret: str
    """Sent by the pod in `SECRET_HEADER`; never to the browser."""


def base_path(folder: Path) -> str:
    """``/sessions/<id>/``: the job's id is its folder's name (``<home>/jobs/<id>``)."""
    return f"{PREFIX}/{folder.name}/"


def socket_path(folder: Path) -> Path:
    return folder / SOCKET


def listener_uid(sock: socket.socket) -> int:
    """The uid of the process listening on a connected Unix socket, as the kernel says (``SO_PEERCRED``): who a
    session's socket really leads to, whatever link was put in its place."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(raw[4:8], "little", signed=True)


def write_secret(folder: Path) -> str:
    """A new secret for the session of the job in ``folder`` (readable by the pod's account alone)."""
    from deskpod.environment.files import write_text

    secret = secrets.token_urlsafe(32)
    write_text(folder / SECRET, secret, mode=0o600)
    return secret


def write_endpoint(folder: Path, host: str, port: int) -> None:
    from deskpod.environment.files import write_json

    write_json(folder / ENDPOINT, {"host": host, "port": port}, mode=0o644)


def read_endpoint(folder: Path) -> Endpoint | None:
    """The network address of the session in ``folder`` with its secret; None for a session on the pod's own box
    (a Unix socket) or one that has not said where yet."""
    try:
        where = json.loads((folder / ENDPOINT).read_text())
        secret = (folder / SECRET).read_text().strip()
        host, port = where["host"], where["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536 or not secret:
        return None
    return Endpoint(host, port, secret)


def socket_too_long(folder: Path, command: str) -> bool:
    """Whether the socket's path of the session in ``folder`` is too long to bind; if so, ``command`` says so on
    stderr (the session's process then exits 2)."""
    if len(str(socket_path(folder)).encode()) <= SOCKET_PATH_MAX:
        return False
    print(f"{command}: the session socket {socket_path(folder)} is longer than a Unix socket allows "
          f"({SOCKET_PATH_MAX} bytes); start the pod with a shorter --home", file=sys.stderr)  # fmt: skip
    return True
