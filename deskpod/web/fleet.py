"""The Fleet page, on a fleet's dashboard (``deskpod fleet up``): every member in one view — its state (reachable,
draining, failing its health check and why), devices and who holds them, use, queue, software, the stacks it has and
its last health check —, each stack's versions per member, and the viewer's fleet jobs with the member that runs
each and why the fleet routed it there.

::

    GET /ui/fleet         the page (twin: /ui/fleet.json); ``fresh=1`` asks every member now

The dashboard never imports the fleet: whoever starts the fleet hands it a `FleetSource` (`deskpod.cli.fleet`), whose
members are the snapshots ``GET /v1/fleet/members`` answers (asked at once, kept two seconds) and whose stacks are
``GET /v1/fleet/stacks``'s. Any signed-in user sees the members and stacks, as through the API (a member's device
shows the member's job id and user holding it, as the Pod page does); jobs are the viewer's own (an admin's:
everyone's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from deskpod.jobs.api import visible_owner
from deskpod.jobs.store import JobRecord
from deskpod.web import render
from deskpod.web.app import Web
from deskpod.web.session import Signed, Viewer

JOBS_SHOWN = 50
ROUTED = "routed to "
"""How the fleet's note of a routing begins (`deskpod.fleet.executor`): ``routed to box-b as its job 12: ...``."""


@dataclass(frozen=True, slots=True)
class FleetSource:
    """What the Fleet page reads, handed in by whoever starts the fleet."""

    members: Callable[[bool], list[dict[str, Any]]]
    """Every member's snapshot as ``GET /v1/fleet/members`` has it; True: ask every member now."""
    stacks: Callable[[], list[dict[str, Any]]]
    """Every stack and what each member has of it, as ``GET /v1/fleet/stacks`` has it."""


@dataclass
class MemberRow:
    name: str
    url: str
    state: str
    """``ok``, ``unreachable``, ``unhealthy`` (its last health check failed: no new jobs) or ``draining``."""
    why: str
    """What the state means for jobs, in words (empty for ``ok``)."""
    snapshot: dict[str, Any]
    """The member as the fleet knows it (``GET /v1/fleet/members``), its devices' job names left out."""


@dataclass
class FleetJob:
    id: str
    name: str
    user: str
    state: str
    member: str | None
    """The member that runs it (None: not sent yet)."""
    member_job: str | None
    """Its id on that member."""
    routed: str
    """Why the fleet sent it there: the routing's reasons, each member's (empty before it is sent)."""
    reason: str


@dataclass
class FleetPage:
    members: list[MemberRow]
    stacks: list[dict[str, Any]]
    jobs: list[FleetJob]


def member_row(m: dict[str, Any]) -> MemberRow:
    health = m.get("health") or {}
    if not m["reachable"]:
        state, why = "unreachable", f"does not answer ({m['error']}): no new jobs"
    elif m["draining"]:
        state, why = "draining", "being removed: no new jobs"
    elif health.get("state") == "failed":
        state, why = "unhealthy", f"failed its health check: {'; '.join(health.get('failing') or [])}; no new jobs"
    else:
        state, why = "ok", ""
    return MemberRow(m["name"], m["url"], state, why, m)


def fleet_job(web: Web, job: JobRecord) -> FleetJob:
    member, _, member_job = (job.external or "").partition(":")
    routed = ""
    if member:
        notes = [str(e["note"]) for e in web.store.events(job.id) if str(e["note"]).startswith(ROUTED)]
        if notes:  # the latest routing: a job re-routed after its member went silent says where it went last
            routed = notes[-1].split(": ", 1)[1] if ": " in notes[-1] else notes[-1]
    return FleetJob(str(job.id), job.spec.name, job.user, job.state.value, member or None, member_job or None, routed,
                    job.reason or "")  # fmt: skip


def fleet_page(web: Web, source: FleetSource, who: Viewer, fresh: bool) -> FleetPage:
    members = [member_row(m) for m in source.members(fresh)]
    jobs = web.store.jobs(user=visible_owner(who.user, None), limit=JOBS_SHOWN)
    return FleetPage(members, source.stacks(), [fleet_job(web, j) for j in jobs])


def register(app: FastAPI, web: Web, source: FleetSource) -> None:
    app.state.fleet = True  # base.html shows the Fleet link

    @app.get("/fleet.json")
    @app.get("/fleet")
    async def show(request: Request, who: Signed, fresh: bool = False) -> Response:
        data = await run_in_threadpool(fleet_page, web, source, who, fresh)
        return render.page(request, "fleet.html", data, who, title="Fleet")
