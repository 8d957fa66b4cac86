"""A shell session's terminal in the dashboard: xterm.js over the session's WebSocket, through the pod's proxy.

::

    GET /ui/jobs/<id>/terminal     the owner's running shell job (`deskpod.jobs.kinds.shell`) in a terminal widget
    GET /ui/vendor/xterm/...       xterm.js and its fit add-on, from where npm installed them (`vendor_dir`)

The page's own script (``static/terminal.js``) speaks terminado's JSON messages to ``/sessions/<id>/terminal``; the
pod's proxy lets the owner alone through (`deskpod.web.sessions`). xterm.js is a dependency installed by npm (``make
webvendor``, part of ``make test``), never a copy in this repository: without it the page says how to install it, and names
``deskpod shell --attach ID``, which needs no browser.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from deskpod.errors import NotFoundError
from deskpod.jobs.kinds.session import PREFIX
from deskpod.jobs.kinds.shell import TERMINAL
from deskpod.jobs.states import JobState
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.session import Signed

VENDOR_ENV = "DESKPOD_WEB_VENDOR"
"""A folder holding npm's ``node_modules/@xterm`` (default: ``<prefix>/share/deskpod-web``, where make puts it)."""
PACKAGES = ("xterm", "addon-fit")


def vendor_dir() -> Path | None:
    """``node_modules/@xterm`` with both packages, or None when npm did not install them."""
    base = Path(os.environ.get(VENDOR_ENV) or Path(sys.prefix) / "share" / "deskpod-web")
    found = base / "node_modules" / "@xterm"
    return found if all((found / p / "lib").is_dir() for p in PACKAGES) else None


def register(app: FastAPI, web: Web) -> None:
    vendor = vendor_dir()
    if vendor is not None:
        app.mount("/vendor/xterm", StaticFiles(directory=vendor), name="xterm")

    @app.get("/jobs/{job_id}/terminal")
    def terminal(request: Request, job_id: str, who: Signed) -> Response:
        job = web.job(who, job_id)
        if job.spec.kind != "shell" or job.user != who.user.name:
            raise NotFoundError(f"no shell session {job_id!r:.40} of yours")
        data = {"job": job.id, "name": job.name, "state": job.state.value,
                "socket": f"{PREFIX}/{job.id}/{TERMINAL}", "running": job.state is JobState.RUNNING}  # fmt: skip
        return render.page(request, "terminal.html", data, who, title=f"Shell {job.id}",
                           extra={"xterm": vendor is not None})  # fmt: skip
