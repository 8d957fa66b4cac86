"""The fleet's own routes, added to its pod service's app (an extension for `deskpod.jobs.api.create_app`)::

GET  /v1/fleet/members                every member: reachable, devices and who holds them, use, queue, software,
                                      stacks it has, its last health check
POST /v1/fleet/members                {"name", "url"}: add a member (admin); checked first, else nothing stored
POST /v1/fleet/members/{name}/remove  {"force": false}: drain it (admin); gone once the fleet's jobs there ended
GET  /v1/fleet/key                    the fleet's id and public key (what a member trusts: --trust-fleet)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from deskpod.errors import ConfigError, ConflictError, DeskpodError, NotFoundError
from deskpod.fleet.client import MemberClient, health
from deskpod.fleet.executor import FOLLOWED, FleetExecutor, split
from deskpod.fleet.members import Member, check_name, check_url
from deskpod.jobs import auth
from deskpod.jobs.api import Caller, body_object, errors, json_body
from deskpod.jobs.pod import Pod


def routes(executor: FleetExecutor) -> Callable[[FastAPI, Pod], None]:
    """The extension that adds the fleet's routes over ``executor``'s members."""

    def extend(app: FastAPI, pod: Pod) -> None:
        members = executor.members

        @app.get("/v1/fleet/members", tags=["fleet"], responses=errors(403))
        def list_members(user: Caller, fresh: bool = False) -> dict[str, Any]:
            """Every member as it answered (asked at once, answers kept two seconds; ``fresh`` asks again), with the
            fleet's own knowledge of it: its last health check, the stacks it has."""
            return {"fleet": executor.key.id, "members": [s.to_json() for s in executor.snapshots(fresh=fresh)]}

        @app.get("/v1/fleet/key", tags=["fleet"], responses=errors(403))
        def key(user: Caller) -> dict[str, Any]:
            return {"fleet": executor.key.id, "public_key": executor.key.public_pem.decode()}

        @app.post("/v1/fleet/members", status_code=201, tags=["fleet"], responses=errors(400, 403, 409, 413))
        async def add(request: Request, user: Caller) -> dict[str, Any]:
            """Add a member (admin): it must answer and trust this fleet (a signed ``GET /v1/whoami``)."""
            auth.require_admin(user)
            data = body_object(await json_body(request), ("name", "url"), required=("name", "url"))
            name, url = check_name(str(data["name"])), check_url(str(data["url"]))
            return await run_in_threadpool(_add, name, url)

        def _add(name: str, url: str) -> dict[str, Any]:
            if members.get(name) is not None:
                raise ConflictError(f"member {name!r} exists already; remove it first: deskpod fleet remove {name}")
            try:
                audience = str(health(url)["name"])
            except (DeskpodError, KeyError) as e:
                raise ConflictError(f"member {name}: no pod service answers at {url} ({e})") from None
            probe = MemberClient(Member(name, url, audience, 0.0), executor.key)
            try:
                me = probe.whoami()
            except DeskpodError as e:
                raise ConflictError(
                    f"member {name} at {url} does not trust this fleet ({e}); on it: deskpod up --trust-fleet "
                    f"fleet.pub.pem (this fleet is {executor.key.id})"
                ) from None
            finally:
                probe.close()
            if me.get("fleet") != executor.key.id:
                raise ConflictError(f"member {name} at {url} answered as {me.get('name')!r}, not as this fleet's")
            if not members.add(name, url, audience):
                raise ConflictError(f"member {name!r} exists already")
            executor.survey.forget(name)
            executor.health_checks.forget(name)
            return {"name": name, "url": url, "audience": audience}

        @app.post("/v1/fleet/members/{name}/remove", tags=["fleet"], responses=errors(400, 403, 404, 413))
        async def remove(name: str, request: Request, user: Caller) -> dict[str, Any]:
            """Drain a member (admin): no new jobs; gone once the fleet's jobs there ended. ``force``: at once
            (its jobs that had not ended are lost to the fleet)."""
            auth.require_admin(user)
            data = body_object(await json_body(request, empty={}), ("force",))
            force = data.get("force", False)
            if not isinstance(force, bool):
                raise ConfigError(f"force = {force!r}: expected true or false")
            if members.get(name) is None:
                raise NotFoundError(f"no member {name!r} (deskpod fleet members lists them)")
            held = [j for j in pod.store.jobs(states=FOLLOWED, limit=1_000_000)
                    if j.external and split(j.external)[0] == name]  # fmt: skip
            if force or not held:
                members.remove(name)
                executor.survey.forget(name)
                executor.health_checks.forget(name)
                return {"name": name, "removed": True, "jobs": len(held)}
            members.drain(name)
            executor.survey.forget(name)
            return {"name": name, "removed": False, "jobs": len(held)}

    return extend
