"""A shell job: ``[shell]``, an interactive shell in a pty inside the job — its devices, its environment, its
sandbox, as its user — reached through the pod at ``/sessions/<id>/terminal`` (a WebSocket)::

    [shell]                     # no fields: the job's devices, environment, workdir and max_runtime say the rest

The job's process is this module (``python -m deskpod.jobs.kinds.shell FOLDER``), run as the job's account in its
sandbox: it starts the account's shell in a pty (terminado, the library Jupyter's terminals use) in the job's working
folder, and serves terminado's WebSocket on the job folder's Unix socket (`deskpod.jobs.kinds.session`), never on
TCP. The protocol is terminado's JSON messages: the client sends ``["stdin", text]`` and ``["set_size", rows,
cols]``, the server ``["setup", {}]``, ``["stdout", text]`` and, when the shell has ended, ``["disconnect", 1]``.

There is one shell per job: every connection shares it, and a client that reconnects is sent what the shell wrote
meanwhile (terminado keeps the last output). A dropped connection leaves the shell running; the shell exiting ends
the job, with the shell's exit status (128 + the signal that killed it), so ``exit`` in it succeeds and ``exit 3``
fails. SIGTERM (the pod stopping the job) hangs the shell up.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deskpod.jobs.kinds.fields import table
from deskpod.jobs.kinds.session import base_path, socket_path, socket_too_long

ENVIRONMENT = True
SESSION = True
EXTRA: str | None = "sessions"
FIELDS: tuple[str, ...] = ()
TERMINAL = "terminal"
"""The WebSocket's path under the session's base path."""
SHELLS = ("/bin/bash", "/bin/sh")
"""What runs when the account's login shell is not one (``nologin``, ``false``, missing)."""
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {},
    "description": f"an interactive shell in the job, a WebSocket at /sessions/<id>/{TERMINAL} (no fields yet)",
}


def parse(t: object) -> dict[str, Any]:
    table(t, "shell", FIELDS, "expected a table, e.g. shell = {} ([shell] in TOML)")
    return {}


def default_name(shell: Mapping[str, Any], fallback: str) -> str:
    return "shell"


def check(shell: Mapping[str, Any]) -> None:
    """Nothing beyond the extra, which the executor checks: the shell starts in the job."""


def argv(shell: Mapping[str, Any], name: str, folder: Path) -> list[str]:
    return [sys.executable, "-m", "deskpod.jobs.kinds.shell", str(folder)]


def terminal_path(folder: Path) -> str:
    """``/sessions/<id>/terminal``: where the job's WebSocket is."""
    return f"{base_path(folder)}{TERMINAL}"


def login_shell() -> str:
    """The account's shell from the password database when it is an interactive one, else `SHELLS`' first."""
    try:
        mine = pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        mine = ""
    if mine and not mine.endswith(("nologin", "false")) and os.access(mine, os.X_OK):
        return mine
    return next((s for s in SHELLS if os.access(s, os.X_OK)), SHELLS[-1])


def exit_status(code: int | None, sig: int | None) -> int:
    """A process's status as a shell reports it: its exit code, or 128 + the signal that ended it."""
    if code is not None:
        return code
    return 128 + sig if sig is not None else 1


async def serve(folder: Path, program: str) -> int:
    """The shell in a pty, served on the job's socket until it ends; its exit status."""
    import tornado.web
    from terminado.management import PtyWithClients, SingleTermManager
    from terminado.websocket import TermSocket
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_unix_socket

    loop = asyncio.get_running_loop()
    ended: asyncio.Future[int] = loop.create_future()

    class OneShell(SingleTermManager):
        """terminado's one shared terminal, whose end ends the job."""

        def on_eof(self, ptywclients: PtyWithClients) -> None:
            super().on_eof(ptywclients)  # closes the pty: the shell is reaped (or ended) there
            proc = ptywclients.ptyproc
            status = exit_status(proc.exitstatus, proc.signalstatus)
            loop.call_later(0.2, finish, status)  # the clients are told ["disconnect", 1] next: let that go out

    def finish(status: int) -> None:
        if not ended.done():
            ended.set_result(status)

    class About(tornado.web.RequestHandler):
        """The base path: what the session is (the pod's "does it answer yet" probe lands here)."""

        def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"kind": "shell", "shell": program, "terminal": terminal_path(folder)}))

    manager = OneShell(shell_command=[program])
    shell = manager.get_terminal()  # the shell starts with the job, not with the first connection
    base = base_path(folder)
    app = tornado.web.Application([(f"{base}{TERMINAL}", TermSocket, {"term_manager": manager}), (base, About)])
    path = socket_path(folder)
    path.unlink(missing_ok=True)  # a restarted job's stale socket
    server = HTTPServer(app)
    server.add_socket(bind_unix_socket(str(path), mode=0o600))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: shell.killpg(signal.SIGHUP))  # the shell's end follows
    print(f"deskpod: shell {program} (pid {shell.ptyproc.pid}) at {terminal_path(folder)} (through the pod)",
          flush=True)  # fmt: skip
    try:
        return await ended
    finally:
        server.stop()
        path.unlink(missing_ok=True)
        manager.blocking_io_executor.shutdown(wait=False)


def main(args: Sequence[str]) -> int:
    """In the job, as its account: ``FOLDER``."""
    if len(args) != 1:
        print("usage: python -m deskpod.jobs.kinds.shell JOB_FOLDER", file=sys.stderr)
        return 2
    folder = Path(args[0])
    if socket_too_long(folder, "deskpod shell"):
        return 2
    return asyncio.run(serve(folder, login_shell()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
