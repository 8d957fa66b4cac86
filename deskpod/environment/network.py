"""This box's network as deskpod's processes meet it: every server binds loopback unless told otherwise."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` now (the kernel's choice), for a server or a rendezvous started next.
    Another program may take it before that server binds it: callers that can should bind port 0 themselves."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
