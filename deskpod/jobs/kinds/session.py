"""What every session kind shares (notebook, shell, tensorboard): where its server listens and under which path.

A session's process serves HTTP (and WebSocket) on the Unix socket `SOCKET` in its job folder, every URL under
``/sessions/<job id>/``; the pod forwards that path to it for the job's owner only (`deskpod.web.sessions`). The
folder is the owner's, mode 0700, so the socket is closed to everyone else on the box: a session never listens on a
TCP port, which every local account could reach (jobs share the box's network).
"""

from __future__ import annotations

import socket
from pathlib import Path

SOCKET = "session.sock"
"""The session's server socket, in its job folder."""
PREFIX = "/sessions"
"""Where the pod serves sessions: ``/sessions/<id>/``."""
SOCKET_PATH_MAX = 107
"""Bytes of a Unix socket's path (``sun_path`` is 108, with its NUL)."""


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


def check_socket_path(folder: Path) -> None:
    """Refuse a job folder whose socket path the kernel cannot bind (`SOCKET_PATH_MAX`): one line naming it."""
    from deskpod.errors import ConflictError

    path = socket_path(folder)
    if len(str(path).encode()) > SOCKET_PATH_MAX:
        raise ConflictError(
            f"a session's socket {str(path)!r} is longer than the {SOCKET_PATH_MAX} bytes a Unix socket allows; "
            "start the pod with a shorter --home"
        )


def socket_too_long(folder: Path, command: str) -> str | None:
    """What a session's process says, and exits 2 on, when its socket's path is too long to bind; else None."""
    if len(str(socket_path(folder)).encode()) <= SOCKET_PATH_MAX:
        return None
    return (f"{command}: the session socket {socket_path(folder)} is longer than a Unix socket allows "
            f"({SOCKET_PATH_MAX} bytes); start the pod with a shorter --home")  # fmt: skip
