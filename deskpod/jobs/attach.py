"""A local terminal attached to a shell session (`deskpod.jobs.kinds.shell`) through the pod: ``deskpod shell``.

The WebSocket goes where the pod's client goes (`deskpod.jobs.client`): on the pod's Unix socket the kernel says
who is asking; over its URL the token file's bearer token signs the caller in. The pod forwards it to the session's
socket for the job's owner only (`deskpod.web.sessions`).

The terminal is put in raw mode (every key, ^C and ^D too, goes to the remote shell), its size is sent at the start
and on every SIGWINCH, and it is restored however the attach ends. Input that is not a terminal (a pipe, a file) is
sent as it comes; its end is not the shell's: the session ends when its shell does (``exit``), and the remote side
says so with terminado's ``["disconnect", 1]``.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import signal
import termios
import tty
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from deskpod.environment import Environment
from deskpod.errors import ServiceError

CHUNK = 65536
"""Bytes read from the local terminal at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """Where a session's WebSocket is reached through the pod."""

    uri: str
    """``ws://.../sessions/<id>/terminal``: on a Unix socket its host part is not used."""
    socket: str | None = None
    """The pod's Unix socket, or None to go over ``uri`` itself."""
    token: str | None = None
    """The bearer token sent over ``uri`` (None on the Unix socket: the kernel says who is asking)."""

    @classmethod
    def of(cls, path: str, env: Environment | None = None) -> Endpoint:
        """The pod's ``path`` (``/sessions/<id>/terminal``), reached as `deskpod.jobs.client.PodClient` would."""
        from deskpod.jobs.client import find_socket, find_url, read_token, token_path

        env = env or Environment.read()
        sock = find_socket(env)
        if sock is not None:
            return cls(uri=f"ws://pod{path}", socket=str(sock))
        url = find_url(env)
        scheme, rest = url.split("://", 1)
        return cls(uri=f"{'wss' if scheme == 'https' else 'ws'}://{rest}{path}", token=read_token(token_path(env)))

    def connect(self) -> Any:
        """An ``async with`` WebSocket connection (websockets' client)."""
        from websockets.asyncio.client import connect, unix_connect

        if self.socket is not None:
            return unix_connect(self.socket, self.uri, max_size=None)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return connect(self.uri, additional_headers=headers, max_size=None)


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[bool]:
    """``fd`` in raw mode while inside, restored after, when it is a terminal (True); otherwise left as it is."""
    if not os.isatty(fd):
        yield False
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_input(loop: asyncio.AbstractEventLoop, fd: int, typed: Any, outbox: asyncio.Queue[list[Any]]) -> None:
    """Call ``typed`` whenever ``fd`` has input; a regular file (which cannot be watched) is sent whole now."""
    try:
        loop.add_reader(fd, typed)
    except PermissionError:  # epoll refuses regular files: they are all there already
        data = b"".join(iter(lambda: os.read(fd, CHUNK), b""))
        if data:
            outbox.put_nowait(["stdin", data.decode(errors="replace")])


async def attach(endpoint: Endpoint, stdin: int = 0, stdout: int = 1) -> None:
    """Join ``stdin`` and ``stdout`` to the session's terminal until the remote shell ends (or the pod closes the
    connection); `ServiceError` when the pod refuses it."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    loop = asyncio.get_running_loop()
    outbox: asyncio.Queue[list[Any]] = asyncio.Queue()
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def size() -> None:
        cols, rows = os.get_terminal_size(stdin)
        outbox.put_nowait(["set_size", rows, cols])

    def typed() -> None:
        data = os.read(stdin, CHUNK)
        if not data:  # a pipe's end; the shell goes on until it exits
            loop.remove_reader(stdin)
            return
        text = decoder.decode(data)
        if text:
            outbox.put_nowait(["stdin", text])

    try:
        connection = await endpoint.connect()
    except InvalidStatus as e:
        status = e.response.status_code
        body = e.response.body.decode(errors="replace").strip() if e.response.body else ""
        raise ServiceError(
            f"the pod refused the shell's terminal ({status}): {body[:300] or 'no reason given'}"
        ) from None
    async with connection as ws:

        async def send() -> None:
            while True:
                await ws.send(json.dumps(await outbox.get()))

        sender = loop.create_task(send())
        with raw_mode(stdin) as is_tty:
            try:
                if is_tty:
                    size()
                    loop.add_signal_handler(signal.SIGWINCH, size)
                read_input(loop, stdin, typed, outbox)
                with contextlib.suppress(ConnectionClosed):  # the pod or the session went away: the attach ends
                    async for message in ws:
                        msg = json.loads(message)
                        if msg[0] == "stdout":
                            write_all(stdout, str(msg[1]).encode())
                        elif msg[0] == "disconnect":
                            break
            finally:
                loop.remove_reader(stdin)
                if is_tty:
                    loop.remove_signal_handler(signal.SIGWINCH)
                sender.cancel()
