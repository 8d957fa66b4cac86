"""The fleet's stack routes (an extension for `deskpod.jobs.api.create_app`) and their client::

    POST /v1/fleet/stacks                  {"name", "environment", "python"}: publish (admin); 201 a new version,
                                           200 with "published": false when the current one has these contents
    GET  /v1/fleet/stacks                  every stack: its current version and what each member has
    GET  /v1/fleet/stacks/{name}           one stack: its versions, what each member has, its latest rollout
    POST /v1/fleet/stacks/{name}/rollout   roll its current version out (admin); 202, the rollout under way
    GET  /v1/fleet/stacks/{name}/rollout   the latest rollout: where it is, each member's outcome

``environment`` is an ``[environment]`` table as a job spec sends it (files as ``{"file", "text"}``): ``deskpod
fleet stack publish NAME FILE`` reads the file (a ``uv.lock`` with the ``pyproject.toml`` beside it, or a
requirements file) and sends it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from deskpod.errors import ConfigError, NotFoundError
from deskpod.fleet.rollout import Rollouts
from deskpod.fleet.stacks import StackStore, check_name, stack_definition
from deskpod.jobs import auth
from deskpod.jobs.api import Caller, body_object, errors, json_body
from deskpod.jobs.client import PodClient
from deskpod.jobs.pod import Pod


def stack_routes(stacks: StackStore, rollouts: Rollouts, members: Callable[[], list[str]],
                 cache_dir: Path) -> Callable[[FastAPI, Pod], None]:  # fmt: skip
    """The extension adding the stack routes: ``members()`` names the fleet's members, ``cache_dir`` is uv's cache
    for resolving what is published."""

    def extend(app: FastAPI, pod: Pod) -> None:
        @app.post("/v1/fleet/stacks", status_code=201, tags=["stacks"], responses=errors(400, 403, 413))
        async def publish(request: Request, user: Caller) -> JSONResponse:
            """Publish a stack's next version (admin) once it parses and resolves; nothing is stored otherwise."""
            auth.require_admin(user)
            data = body_object(await json_body(request), ("name", "environment", "python"))
            name, python = check_name(data.get("name")), data.get("python")
            if python is not None and not isinstance(python, str):
                raise ConfigError(f'python = {python!r}: expected a Python version as a string, e.g. "3.11"')
            defn = stack_definition(data.get("environment"), python)
            version, new = await run_in_threadpool(stacks.publish, name, defn, by=user.name, cache_dir=cache_dir)
            body = {**version.to_json(), "published": new}
            return JSONResponse(body, status_code=201 if new else 200)

        @app.get("/v1/fleet/stacks", tags=["stacks"], responses=errors(403))
        def list_stacks(user: Caller) -> dict[str, Any]:
            return {"stacks": stacks.status(members())}

        @app.get("/v1/fleet/stacks/{name}", tags=["stacks"], responses=errors(403, 404))
        def show(name: str, user: Caller) -> dict[str, Any]:
            versions = stacks.versions(name)
            [row] = [s for s in stacks.status(members()) if s["name"] == name]
            rollout = rollouts.get(name)
            return {**row, "versions": [v.to_json() for v in versions],
                    "rollout": None if rollout is None else rollout.to_json()}  # fmt: skip

        @app.post("/v1/fleet/stacks/{name}/rollout", status_code=202, tags=["stacks"], responses=errors(403, 404, 409))
        def rollout(name: str, user: Caller) -> dict[str, Any]:
            """Roll the stack's current version out to every member, one at a time (admin); 409 while one runs."""
            auth.require_admin(user)
            return rollouts.start(name, user.name).to_json()

        @app.get("/v1/fleet/stacks/{name}/rollout", tags=["stacks"], responses=errors(403, 404))
        def progress(name: str, user: Caller) -> dict[str, Any]:
            stacks.versions(name)  # NotFoundError for an unknown stack
            got = rollouts.get(name)
            if got is None:
                raise NotFoundError(
                    f"no rollout of {name!r} since the fleet started: deskpod fleet stack rollout {name}"
                )
            return got.to_json()

    return extend


class StackClient:
    """The stack routes of a fleet, over its pod client."""

    def __init__(self, client: PodClient) -> None:
        self.client = client

    def publish(self, name: str, environment: dict[str, Any], python: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "environment": environment}
        if python is not None:
            body["python"] = python
        return dict(self.client.request("POST", "/v1/fleet/stacks", json=body).json())

    def stacks(self) -> list[dict[str, Any]]:
        return list(self.client.request("GET", "/v1/fleet/stacks").json()["stacks"])

    def stack(self, name: str) -> dict[str, Any]:
        return dict(self.client.request("GET", f"/v1/fleet/stacks/{quote(name, safe='')}").json())

    def rollout(self, name: str) -> dict[str, Any]:
        return dict(self.client.request("POST", f"/v1/fleet/stacks/{quote(name, safe='')}/rollout").json())

    def progress(self, name: str) -> dict[str, Any]:
        return dict(self.client.request("GET", f"/v1/fleet/stacks/{quote(name, safe='')}/rollout").json())
