"""The fleet's side of a member's REST API: each request carries a fresh assertion (`deskpod.fleet.keys`), for the
fleet user it acts for or for the fleet itself; a member's error answers become `deskpod.errors` classes (through
`deskpod.jobs.client.PodClient`)."""

from __future__ import annotations

from typing import Any

import httpx

from deskpod.fleet.keys import FleetKey
from deskpod.fleet.members import Member
from deskpod.jobs.client import PodClient
from deskpod.jobs.doctor import TIMEOUT_S

RENEW_S = 5.0
"""Timeout, and assertion lifetime, of a lease renewal: a renewal is void once its assertion expired, so the fleet
knows by when at the latest one that got no answer could still have reached the member (`FleetExecutor`)."""

FORWARD_S = 10.0
"""Timeout, and assertion lifetime, of a keyed forward: the member takes it only while its assertion holds, so a
forward that got no answer arrived, if at all, by then (`FleetExecutor`)."""

DOCTOR_S = TIMEOUT_S + 20
"""Timeout of a doctor request: the member stops its doctor at `deskpod.jobs.doctor.TIMEOUT_S`."""


class MemberClient:
    """One member, as the fleet calls it."""

    def __init__(self, member: Member, key: FleetKey, *, timeout: float = 10.0) -> None:
        self.member, self.key = member, key
        self._pod = PodClient(member.url, None, timeout=timeout)

    def close(self) -> None:
        self._pod.close()

    def _call(self, method: str, path: str, subject: str | None, lifetime: float | None = None, **kw: Any) -> Any:
        signed = self.key.assertion(subject, self.member.audience, **({"lifetime": lifetime} if lifetime else {}))
        return self._pod.request(method, path, headers={"Authorization": f"Bearer {signed}"}, **kw)

    def whoami(self, subject: str | None = None) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/whoami", subject).json())

    def status(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/status", None).json())

    def doctor(self, max_age: float) -> dict[str, Any]:
        """Its doctor's answer (`deskpod.jobs.doctor`), no older than ``max_age`` seconds: a run takes seconds."""
        return dict(self._call("GET", "/v1/doctor", None, params={"max_age": max_age}, timeout=DOCTOR_S).json())

    def submit(self, user: str, spec: dict[str, Any], lease_s: float | None, key: str | None = None) -> dict[str, Any]:
        """Forward a job as ``user``; held by a lease the fleet renews, or (``lease_s`` None: the fleet's own jobs,
        a stack's smoke job) not held: the member starts it as any job. ``key``: the forward's idempotency key (the
        member may start the job at once; `lookup` finds it). A keyed forward's assertion, and the wait for its
        answer, last `FORWARD_S`."""
        params: dict[str, Any] = {} if lease_s is None else {"lease": lease_s}
        if key is None:
            return dict(self._call("POST", "/v1/jobs", user, json=spec, params=params).json())
        params["key"] = key
        r = self._call("POST", "/v1/jobs", user, FORWARD_S, json=spec, params=params, timeout=FORWARD_S)
        return dict(r.json())

    def lookup(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """Which forwards with these keys arrived: their jobs, by key. A key not found is closed there: a forward
        with it arriving later is refused (`deskpod.jobs.pod.Pod.lookup`)."""
        r = self._call("POST", "/v1/leases/lookup", None, RENEW_S, json={"keys": keys}, timeout=RENEW_S)
        return {str(k): dict(j) for k, j in r.json()["jobs"].items()}

    def job(self, user: str, job_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/jobs/{job_id}", user).json())

    def renew(self, ids: list[str], seconds: float) -> list[dict[str, Any]]:
        """Renew the leases of these forwarded jobs and read the state of each (one request)."""
        body = {"jobs": ids, "seconds": seconds}
        return list(self._call("POST", "/v1/leases", None, RENEW_S, json=body, timeout=RENEW_S).json()["jobs"])

    def watch(self, ids: list[str], wait: float) -> list[dict[str, Any]]:
        """Wait up to ``wait`` seconds for one of these forwarded jobs that has not started yet to run or end there,
        and read the state of each (renews nothing; `deskpod.jobs.pod.Pod.watch`)."""
        body = {"jobs": ids, "wait": wait}
        return list(
            self._call("POST", "/v1/leases/watch", None, RENEW_S, json=body, timeout=wait + RENEW_S).json()["jobs"]
        )

    def cancel(self, user: str, job_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/jobs/{job_id}/cancel", user).json())

    def requeue(self, user: str, job_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/jobs/{job_id}/requeue", user).json())

    def log(self, user: str, job_id: str, offset: int, limit: int) -> bytes:
        r: httpx.Response = self._call("GET", f"/v1/jobs/{job_id}/log", user, params={"offset": offset, "limit": limit})
        return r.content


def health(url: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """A pod's ``GET /health`` (no token): its version and name."""
    with PodClient(url, None, timeout=timeout) as c:
        return c.health()
