"""`deskpod.environment.network.free_port`: a port a server can bind next."""

from __future__ import annotations

import socket

from deskpod.environment.network import LOOPBACK, free_port


def test_the_free_port_binds() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind((LOOPBACK, port))  # raises OSError (address in use) if the port was not free
        assert s.getsockname()[1] == port
