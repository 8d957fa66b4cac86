"""The fleet's executor: the pod's jobs, handed to member pods (a `deskpod.jobs.executor.Executor`).

``deskpod fleet up`` is a pod service — queue, store, users, tokens, REST API, dashboard — whose jobs run on other
pods. Each tick:

- **route** every queued job not yet on a member (`deskpod.fleet.routing`, over the members' snapshots) and forward
  it, as its own user (an assertion, `deskpod.fleet.keys`), with a lease and an idempotency key, written ahead
  (`deskpod.fleet.forwards`): the member may start it at once; ``external`` becomes ``member:job_id``, and the
  routing's reasons go to the job's history;
- **resolve** the forwards whose answer never came (lost, or the fleet died meanwhile) by asking their member for
  their keys (``POST /v1/leases/lookup``): found, the job is adopted; not found, it never arrived (and never will:
  the member refuses the key from then on) and is routed again with a new key;
- **follow** the forwarded jobs with one request per member (``POST /v1/leases``): it renews the leases of those
  not yet started and says every job's state, which the fleet's copy is moved to (`deskpod.jobs.states`: the same
  table, step by step);
- **watch** a member while a job sent there has not started: a request that waits there for the start (``POST
  /v1/leases/watch``, renewing nothing) and wakes the fleet's loop when it answers, so the fleet's copy runs when the
  member's does, not at the next renewal;
- carry out **stop requests** (a cancel, a requeue) by forwarding them; logs are read from the member;
- start the **health checks** that are due (`deskpod.fleet.health`: each member's doctor, every ``health_s``
  seconds, in the background); a member whose last one failed gets no new jobs.

**A job never runs twice.** A member starts a forwarded job only while its lease holds, and cancels it unstarted
once the lease ran out (`deskpod.jobs.pod.Pod.expire_leases`). A job is sent elsewhere only when its member cannot
start it any more:

- *The member said so*: it cancelled the job unstarted, or no longer has it, or a look-up of the forward's key found
  nothing there. The look-up closes the key on the member in the same transaction, so a forward still on its way
  (a slow member) is refused when it arrives: "not found" stays true.
- *Its lease surely ran out.* When a member stops answering, its jobs that had not started stay where they are until
  the last lease the fleet may have given them has surely run out, and are then sent elsewhere: the last answered
  renewal plus the lease; or the last unanswered one plus its assertion's life, the lease and `SKEW`; or, for a
  forward whose answer never came and whose key could not be looked up, the moment the fleet gave up waiting for the
  answer (at a restart: the restart) plus the forward's assertion life (`FORWARD_S`: the member takes the forward
  only before its ``exp``), `SKEW` and the lease — nothing renews a lease on a job the fleet has no id for.

A forward is written ahead (`deskpod.fleet.forwards`) before it is sent, so a fleet that dies with its answer
unread resolves it at the next start like a lost answer. Jobs that had started keep their state, and are shown as
the member reports them when it answers again. What no lease can tell is a job a member started shortly before it
stopped answering while the fleet still saw it queued, which that member would go on running: the same for a
forward it took and started before it fell silent as for a job it had had queued for a while.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx

from deskpod.errors import ConflictError, DeskpodError, ServiceError, UsageError
from deskpod.fleet.client import FORWARD_S, RENEW_S, MemberClient, health
from deskpod.fleet.forwards import Forward, Forwards
from deskpod.fleet.health import HealthCheck, HealthChecks, from_doctor
from deskpod.fleet.keys import FleetKey
from deskpod.fleet.members import Member, Members
from deskpod.fleet.routing import Route, Wanted, after, route
from deskpod.fleet.snapshot import MemberSnapshot, Survey, from_status, unreachable
from deskpod.fleet.stacks import StackStore, member_spec
from deskpod.jobs.executor import ExecutorStatus, PodSide
from deskpod.jobs.forecast import Forecast
from deskpod.jobs.scheduler import Waiting, order_key
from deskpod.jobs.spec import JobSpec
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord, User

S = JobState
FOLLOWED = (S.QUEUED, S.STARTING, S.BUILDING, S.RUNNING)
SKEW = 2.0
"""Seconds the member's clock may be behind the fleet's: it accepts an assertion until its ``exp`` by its own clock."""
HURRY_S = 5.0
"""After a job is sent, its member is watched for this long (`FleetExecutor._watch`): the start comes within it,
and the fleet's copy runs when the member's does, not at the next renewal."""
WATCH_S = 2.0
"""The longest one watch of a member waits for a start there (then the next tick may start another)."""
STAGES = {S.QUEUED: 0, S.STARTING: 1, S.BUILDING: 2, S.RUNNING: 3}
"""How far along a job is (a final state: past them all): a watch's answer moves the fleet's copy only forward."""
MANY = 1_000_000
"""No limit on the jobs a tick reads from the store."""
HEALTH_S = 300.0
"""Seconds between two health checks of a member (``deskpod fleet up --health-every``)."""


def wanted(spec: JobSpec) -> Wanted:
    """What routing needs of a spec."""
    count = int(spec.devices) if str(spec.devices).isdigit() else None
    data, scratch = staged_data(spec)
    return Wanted(count, spec.placement, spec.max_runtime, spec.nodes, spec.device_kind, spec.stack, data, scratch)


def staged_data(spec: JobSpec) -> tuple[str | None, str | None]:
    """The dataset a train job with ``slurm.stage_data`` copies to scratch (its source path) and the scratch folder
    it copies to; (None, None) for a job that stages nothing (synthetic data, no ``stage_data``, not a train job).

    The path is resolved as the job's node would resolve it with only the job's own ``env`` (`resolve_data_path`:
    ``fashion-mnist`` is ``DESKPOD_FASHION_MNIST`` there, else the default folder), without following symlinks.
    """
    from deskpod.cluster.batch import slurm_options
    from deskpod.cluster.staging import resolve_data_path

    options = slurm_options(spec)
    if spec.train is None or not options["stage_data"]:
        return None, None
    source = resolve_data_path(str(spec.train.get("data", "fashion-mnist")), spec.env)
    return (None, None) if source is None else (str(source), str(options["scratch"]))


def split(external: str) -> tuple[str, str]:
    """``member:job_id`` -> (member, its job id)."""
    member, _, job_id = external.partition(":")
    return member, job_id


class FleetExecutor:
    """Jobs of the fleet pod, run by its members (see the module docstring)."""

    name = "fleet"
    device_count = None  # devices = "all" is a whole member's, whichever it is

    def __init__(
        self, members: Members, key: FleetKey, forwards: Forwards, *, lease_s: float = 15.0, poll_s: float = 1.0,
        ttl: float = 2.0, health_s: float = HEALTH_S, stacks: StackStore | None = None,
    ) -> None:  # fmt: skip
        self.members, self.key, self.lease_s, self.poll_s = members, key, lease_s, poll_s
        self.forwards = forwards
        """The forwards under way, written ahead (`deskpod.fleet.forwards`)."""
        self._unanswered: dict[int, float] = {}
        """Fleet job -> when its forward's answer was given up on (or this process started): the member took that
        forward, if at all, before the forward's assertion expired after it."""
        self._last_resolve = 0.0
        self.survey = Survey(self._ask, ttl=ttl)
        self.health_checks = HealthChecks(self._doctor, health_s)
        """Each member's last health check, asked every ``health_s`` seconds (0: never)."""
        self.stacks = stacks
        """The fleet's stacks, whose records say which versions each member has (None: no stacks)."""
        self._last_health = 0.0
        self._clients: dict[str, MemberClient] = {}
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="deskpod-fleet")
        self._held: dict[int, float] = {}
        """Fleet job -> until when (this clock) its member may still start it: past that, it may go elsewhere."""
        self._silent: dict[str, float] = {}
        """Member -> since when it does not answer."""
        self._last_follow = 0.0
        self._last_route = 0.0
        self._hurry_until = 0.0
        self._lock = threading.Lock()
        self._watching: set[str] = set()
        """Members with a watch under way."""
        self._watched: list[tuple[str, float, dict[str, dict[str, Any]]]] = []
        """Watches' answers, for the loop to mirror: (member, when answered, its jobs by id)."""

    # members ---------------------------------------------------------------------------------------
    def client(self, member: Member) -> MemberClient:
        c = self._clients.get(member.name)
        if c is None or c.member != member:
            c = self._clients[member.name] = MemberClient(member, self.key)
        return c

    def _ask(self, name: str) -> MemberSnapshot:
        m = self.members.get(name)
        now = time.time()
        if m is None:
            return unreachable(name, "", "no such member", now, False)
        try:
            return from_status(m.name, m.url, self.client(m).status(), now, m.draining)
        except DeskpodError as e:
            return unreachable(m.name, m.url, str(e), now, m.draining)

    def _doctor(self, name: str, max_age: float) -> HealthCheck:
        m = self.members.get(name)
        if m is None:
            return HealthCheck(state="unknown", at=time.time(), error="no such member")
        return from_doctor(self.client(m).doctor(max_age), time.time())

    def snapshots(self, *, fresh: bool = False) -> list[MemberSnapshot]:
        """Every member's snapshot (asked at once, cached `Survey.ttl` seconds)."""
        return self._known(self.survey.snapshots([m.name for m in self.members.all()], fresh=fresh))

    def _known(self, snaps: list[MemberSnapshot]) -> list[MemberSnapshot]:
        """The snapshots with what the fleet itself knows of each member: its last health check, its stacks."""
        built = self.stacks.built() if self.stacks is not None else {}
        return [replace(s, health=self.health_checks.get(s.name), stacks=tuple(built.get(s.name, ()))) for s in snaps]

    # Executor ------------------------------------------------------------------------------------
    def check(self, spec: JobSpec, user: User) -> int:
        """Refuse a job no member can ever run (when every member answered); a member that does not answer now
        may return, and one whose health check failed may pass the next, so such a member may still take it."""
        members = [m for m in self.members.all() if not m.draining]
        if not members:
            raise ConflictError(
                "this fleet has no members to run jobs on: its admin adds one with deskpod fleet add NAME URL"
            )
        snaps = [replace(s, health=None) for s in self.survey.snapshots([m.name for m in members])]
        if all(s.reachable for s in snaps):
            r = route(wanted(spec), snaps, time.time())
            if r.member is None:
                raise ConflictError(f"job spec: no member of this fleet can run it: {r.text()}")
        return int(spec.devices) if str(spec.devices).isdigit() else 0

    def status(self, pod: PodSide) -> ExecutorStatus:
        return {"devices": [], "backend": {"name": self.name, "members": len(self.members.all())}}

    def forecast(self, pod: PodSide, waiting: Sequence[Waiting], now: float) -> Forecast:
        """Positions only: each member's own queue decides when (the job's reason says where it waits)."""
        return Forecast({w.id: i + 1 for i, w in enumerate(waiting)}, {})

    def recover(self, pod: PodSide) -> None:
        """A previous fleet process may have renewed leases until now: none of its jobs moves before they ran out.
        Its forwards still written ahead are resolved by key (`_resolve`), as answers that never came."""
        now = time.time()
        until = now + RENEW_S + 1 + self.lease_s + SKEW
        for job in pod.store.jobs(states=[S.QUEUED], limit=MANY):
            if job.external:
                self._held[job.id] = until
        for f in self.forwards.pending():
            self._unanswered[f.job] = now

    def close(self, pod: PodSide, *, stop_jobs: bool) -> None:
        """Nothing to stop: the jobs are the members'; the next fleet process follows them again."""
        self.survey.close()
        self.health_checks.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for c in self._clients.values():
            c.close()

    def cancel(self, pod: PodSide, job: JobRecord) -> None:
        """A queued job was cancelled here: cancel its member's copy (if that fails, its lease runs out there); a
        copy whose forward is unanswered is cancelled when its look-up finds it (`_adopt`)."""
        self._held.pop(job.id, None)
        if job.external:
            member, job_id = split(job.external)
            m = self.members.get(member)
            if m is not None:
                try:
                    self.client(m).cancel(job.user, job_id)
                except DeskpodError as e:
                    pod.store.note(job.id, f"cancel on {member} failed ({e}); its lease there runs out unrenewed")

    def log(self, pod: PodSide, job: JobRecord, offset: int, limit: int) -> bytes:
        """The job's output, read from its member as its user (nothing while it waits here or the member is silent)."""
        if not job.external:
            return b""
        member, job_id = split(job.external)
        m = self.members.get(member)
        if m is None:
            return b""
        try:
            return self.client(m).log(job.user, job_id, offset, limit)
        except (ServiceError, UsageError):
            return b""

    def tick(self, pod: PodSide, *, woken: bool) -> None:
        now = time.time()
        sent = False
        self._mirror_watched(pod)
        if now - self._last_health >= 1.0:  # whose health check is due: asked in the background
            self._last_health = now
            self.health_checks.start_due([m.name for m in self.members.all() if not m.draining], now)
        if self._unanswered and now - self._last_resolve >= self.poll_s:
            self._last_resolve = now
            self._resolve(pod)
        if woken or now - self._last_route >= self.poll_s:  # the queue is read at most once a poll, or when it changed
            self._last_route = now
            queued = [j for j in pod.store.jobs(states=[S.QUEUED], limit=MANY)
                      if not j.external and j.id not in self._unanswered]  # fmt: skip
            sent = bool(queued) and self._route(pod, queued)
            if sent:
                self._hurry_until = now + HURRY_S
        if now < self._hurry_until:  # first: a keyed forward may start at once, and the watch sees it start
            self._watch(pod, min(WATCH_S, self._hurry_until - now))
        if woken or now - self._last_follow >= self.poll_s:
            self._last_follow = now
            self._follow(pod)

    # routing -------------------------------------------------------------------------------------
    def _route(self, pod: PodSide, queued: list[JobRecord]) -> bool:
        """Send each queued job to its member, best first; returns whether any was sent."""
        snaps = {s.name: s for s in self.snapshots()}
        sent = False
        for job in sorted(queued, key=lambda j: order_key(Waiting(j.id, j.priority, j.devices))):
            want = wanted(job.spec)
            refused: dict[str, str] = {}
            while True:
                r = route(want, [s for n, s in snaps.items() if n not in refused], time.time())
                if r.member is None:
                    why = "; ".join([*(f"{n}: refused it ({e})" for n, e in refused.items()), r.text()])
                    text = f"no member can take it now: {why}" if why else "no member can take it now"
                    if job.reason != text:
                        pod.store.update(job.id, expect=[S.QUEUED], reason=text)
                    break
                error = self._send(pod, job, r)
                if error is None:
                    snaps[r.member] = after(want, snaps[r.member], time.time())
                    self.survey.keep(r.member, snaps[r.member])
                    sent = True
                    break
                refused[r.member] = error
        return sent

    def _send(self, pod: PodSide, job: JobRecord, r: Route) -> str | None:
        """Forward a job to the member ``r`` chose, written ahead with a key; None when sent (answered, or its answer
        lost: then `_resolve` asks the member), else why the member did not take it."""
        assert r.member is not None
        m = self.members.get(r.member)
        if m is None:
            return "removed"
        forward = self.forwards.begin(job.id, m.name, time.time())
        try:
            got = self.client(m).submit(job.user, member_spec(job.spec), self.lease_s, forward.key)
        except ServiceError as e:
            self.survey.forget(m.name)
            if isinstance(e.__cause__, httpx.ConnectError | httpx.ConnectTimeout):  # nothing was sent
                self.forwards.settle(job.id)
                return str(e)
            self._unanswered[job.id] = time.time()  # sent, maybe taken there: asked by its key, never assumed
            why = f"forwarded to {m.name}, whose answer did not come ({e}); asking it whether the job arrived"
            pod.store.update(job.id, expect=[S.QUEUED], reason=why)
            pod.store.note(job.id, why)
            return None
        except UsageError as e:  # refused: the user has no account there, the box cannot take it
            self.forwards.settle(job.id)
            return str(e)
        self._adopt(pod, job, m, forward, got, f"routed to {m.name} as its job {got['id']}: {r.text()}",
                    f"on {m.name} (its job {got['id']}): {r.reasons[m.name]}")  # fmt: skip
        return None

    def _adopt(self, pod: PodSide, job: JobRecord, m: Member, f: Forward, got: dict[str, Any], note: str,
               reason: str) -> None:  # fmt: skip
        """The member has the forwarded job ``got``: the fleet's copy follows it (``external``), and the forward is
        settled. A copy cancelled here meanwhile has the member's cancelled too."""
        answered = time.time()
        if pod.store.update(job.id, expect=[S.QUEUED], external=f"{m.name}:{got['id']}", reason=reason):
            self._held[job.id] = answered + self.lease_s
            pod.store.note(job.id, note)
        else:
            with contextlib.suppress(DeskpodError):  # if it fails, its lease there runs out unrenewed
                self.client(m).cancel(job.user, str(got["id"]))
        self.forwards.settle(f.job)
        self._unanswered.pop(f.job, None)

    def _resolve(self, pod: PodSide) -> None:
        """Ask each member, by key, which of the forwards whose answer never came arrived (one request per member):
        found, the job is adopted; not found, it never arrived and never will (the key is closed there), so it is
        routed again; a member that does not answer keeps its forwards until the lease it may have granted them has
        surely run out (see the module docstring)."""
        by_member: dict[str, list[Forward]] = defaultdict(list)
        for f in self.forwards.pending():
            if f.job in self._unanswered:
                by_member[f.member].append(f)
        members = {m.name: m for m in self.members.all()}
        asked = [(members.get(name), fs) for name, fs in by_member.items()]
        answers = self._pool.map(lambda mf: self._lookup(mf[0], [f.key for f in mf[1]]), asked)
        for (m, fs), (found, error) in zip(asked, answers, strict=True):
            for f in fs:
                try:
                    self._resolve_one(pod, m, f, found, error)
                except Exception:  # one job's surprise must not stop the others being resolved
                    traceback.print_exc(file=sys.stderr)

    def _lookup(self, m: Member | None, keys: list[str]) -> tuple[dict[str, dict[str, Any]], str | None]:
        if m is None:
            return {}, "removed from the fleet"
        try:
            return self.client(m).lookup(keys), None
        except DeskpodError as e:
            return {}, str(e)

    def _resolve_one(
        self, pod: PodSide, m: Member | None, f: Forward, found: dict[str, dict[str, Any]], error: str | None
    ) -> None:
        store = pod.store
        job = store.job(f.job)
        if job is None:
            self.forwards.settle(f.job)
            self._unanswered.pop(f.job, None)
            return
        got = found.get(f.key)
        if m is not None and got is not None:
            self._adopt(pod, job, m, f, got, f"{m.name} has the forward whose answer was lost (key {f.key}), as its "
                        f"job {got['id']}", f"on {m.name} (its job {got['id']})")  # fmt: skip
            return
        if error is None or m is None:
            why = f"the forward to {f.member} never arrived there (looked up by its key); it is routed again"
            if m is None:
                why = f"{f.member} was removed from the fleet while a forward to it was unanswered; it is routed again"
        else:
            until = self._unanswered[f.job] + FORWARD_S + 1 + SKEW + self.lease_s
            if time.time() < until:
                stamp = time.strftime("%H:%M:%S", time.localtime(until))
                why = (
                    f"forwarded to {f.member}, which does not answer ({error}); routed again at {stamp} unless it does"
                )
                if job.reason != why:
                    store.update(job.id, expect=[S.QUEUED], reason=why)
                return
            why = f"{f.member} does not answer ({error}); a forward it may have taken ran out its lease unstarted there"
        self.forwards.settle(f.job)
        self._unanswered.pop(f.job, None)
        if store.update(job.id, expect=[S.QUEUED], reason=why):
            store.note(job.id, why)

    # following -----------------------------------------------------------------------------------
    def _follow(self, pod: PodSide) -> None:
        """One renewal per member for its followed jobs; each job's copy moves as its member says."""
        by_member: dict[str, list[JobRecord]] = defaultdict(list)
        for job in pod.store.jobs(states=FOLLOWED, limit=MANY):
            if job.external:
                by_member[split(job.external)[0]].append(job)
        members = {m.name: m for m in self.members.all()}
        for name, jobs in by_member.items():
            if name not in members:  # removed with --force
                for job in jobs:
                    self._lost(pod, job, f"member {name} was removed (--force) while it held the job")
        asked = [(members[n], jobs) for n, jobs in by_member.items() if n in members]
        answers = self._pool.map(lambda mj: self._renew(*mj), asked)
        for (m, jobs), (sent, answered, seen, error) in zip(asked, answers, strict=True):
            for job in jobs:
                try:
                    if error is not None:
                        self._silent_member(pod, job, m.name, sent, error)
                    else:
                        self._mirror(pod, job, m.name, seen.get(split(job.external or "")[1]), answered)
                except Exception:  # one job's surprise must not stop the others being followed
                    traceback.print_exc(file=sys.stderr)
            if error is None:
                self._silent.pop(m.name, None)
        for m in members.values():
            if m.draining and m.name not in by_member:
                self.members.remove(m.name)

    def _watch(self, pod: PodSide, wait: float) -> None:
        """Watch each member (one watch at a time) that answers and has fleet jobs not yet running: the watch's
        answer comes when one of them runs or ends there, and wakes the loop, which mirrors it."""
        pending: dict[str, list[str]] = defaultdict(list)
        for job in pod.store.jobs(states=[S.QUEUED, S.STARTING, S.BUILDING], limit=MANY):
            if job.external:
                member, job_id = split(job.external)
                pending[member].append(job_id)
        for name, ids in pending.items():
            m = self.members.get(name)
            with self._lock:
                if m is None or name in self._silent or name in self._watching:
                    continue
                self._watching.add(name)
            self._pool.submit(self._watch_one, pod, m, ids, wait)

    def _watch_one(self, pod: PodSide, m: Member, ids: list[str], wait: float) -> None:
        try:
            seen = self.client(m).watch(ids, wait)
        except DeskpodError:  # the renewals say whether the member answers; a watch only hurries them
            seen = None
        finally:
            with self._lock:
                self._watching.discard(m.name)
        if seen is not None:
            with self._lock:
                self._watched.append((m.name, time.time(), {str(j["id"]): j for j in seen}))
            pod.wake()

    def _mirror_watched(self, pod: PodSide) -> None:
        """Move the fleet's copies as the watches' answers say, forward only: an answer may be older than the last
        renewal's."""
        with self._lock:
            answers, self._watched = self._watched, []
        for name, answered, seen in answers:
            for job in pod.store.jobs(states=[S.QUEUED, S.STARTING, S.BUILDING], limit=MANY):
                member, job_id = split(job.external or "")
                got = seen.get(job_id) if member == name else None
                if got is None:
                    continue
                new = S(got["state"])
                if STAGES.get(new, len(STAGES)) > STAGES[job.state] and new is not S.PREEMPTED:
                    try:
                        self._mirror(pod, job, name, got, answered)
                    except Exception:  # one job's surprise must not stop the others being followed
                        traceback.print_exc(file=sys.stderr)

    def _renew(self, m: Member, jobs: list[JobRecord]) -> tuple[float, float, dict[str, dict[str, Any]], str | None]:
        """(sent, answered, the member's jobs by id, error or None). A member that went silent is only probed until
        it answers (``GET /health`` grants nothing): a renewal sent meanwhile could reach it and move the time from
        which its jobs may go elsewhere."""
        sent = time.time()
        ids = [split(j.external or "")[1] for j in jobs]
        if m.name in self._silent:
            try:
                health(m.url, timeout=RENEW_S)
            except DeskpodError as e:
                return sent, time.time(), {}, str(e)
        for job in jobs:
            with contextlib.suppress(DeskpodError):  # the next tick asks again (the renewal says if the member answers)
                self._carry_out_stop(m, job)
        try:
            seen = self.client(m).renew(ids, self.lease_s)
        except DeskpodError as e:
            return sent, time.time(), {}, str(e)
        return sent, time.time(), {str(j["id"]): j for j in seen}, None

    def _carry_out_stop(self, m: Member, job: JobRecord) -> None:
        """Forward a stop request of the job's user or of the pod (cancel, requeue) to the member, once."""
        if job.stop_reason is None or job.stop_deadline is not None:
            return
        _, job_id = split(job.external or "")
        if job.stop_reason == "requeue":
            self.client(m).requeue(job.user, job_id)
        else:
            self.client(m).cancel(job.user, job_id)

    def _silent_member(self, pod: PodSide, job: JobRecord, member: str, sent: float, error: str) -> None:
        """The member did not answer: a job not started there goes elsewhere once its lease surely ran out."""
        store, now = pod.store, time.time()
        since = self._silent.setdefault(member, sent)  # the last renewal it may have had was sent then
        if job.state is S.QUEUED:
            until = max(self._held.get(job.id, 0.0), since + RENEW_S + 1 + self.lease_s + SKEW)
            self._held[job.id] = until
            if now >= until:
                why = f"{member} stopped answering ({error}); its lease there ran out unstarted, so it goes elsewhere"
                if store.update(job.id, expect=[S.QUEUED], external=None, reason=why):
                    store.note(job.id, why)
                    self._held.pop(job.id, None)
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(until))
                why = f"on {member}, which stopped answering ({error}); sent elsewhere at {stamp} unless it answers"
                if job.reason != why:
                    store.update(job.id, expect=[S.QUEUED], reason=why)
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(since))
            why = f"on {member}, which does not answer since {stamp}; shown as it reports when it answers again"
            if job.reason != why:
                store.update(job.id, reason=why)

    def _lost(self, pod: PodSide, job: JobRecord, why: str) -> None:
        store = pod.store
        if job.state is S.QUEUED:
            store.transition(job.id, S.STARTING, why, expect=[S.QUEUED])
        store.transition(job.id, S.LOST, why, reason=why, finished_at=time.time(), stop_reason=None,
                         stop_deadline=None)  # fmt: skip
        self._held.pop(job.id, None)

    def _mirror(self, pod: PodSide, job: JobRecord, member: str, seen: dict[str, Any] | None, answered: float) -> None:
        """Move the fleet's copy of a job to the state its member reports, through the moves the table allows."""
        store = pod.store
        if job.stop_reason is not None and job.stop_deadline is None:
            store.update(job.id, stop_deadline=answered)
            job = store.job(job.id) or job
        if seen is None:  # the member does not know it (any more): it never started there, or its store is gone
            if job.state is S.QUEUED:
                why = f"{member} no longer has it; it goes elsewhere"
                store.update(job.id, expect=[S.QUEUED], external=None, reason=why)
                store.note(job.id, why)
            else:
                self._lost(pod, job, f"{member} no longer knows the job")
            return
        self._held[job.id] = answered + self.lease_s
        new, said = S(seen["state"]), str(seen.get("reason") or "")
        where = f"on {member}: {said or new.value}"
        if new is S.PREEMPTED:  # a moment's state there: queued again at once
            return
        if new is S.QUEUED:
            if job.state.active:  # the member ran it and queued it again: a retry, a preemption, a requeue
                failed = int(seen.get("failures", 0)) > job.failures
                store.transition(job.id, S.FAILED if failed else S.PREEMPTED, f"{member}: {said or 'queued again'}",
                                 failures=int(seen.get("failures", 0)), exit_code=seen.get("exit_code"),
                                 stop_reason=None, stop_deadline=None)  # fmt: skip
                store.transition(job.id, S.QUEUED, f"queued again on {member}", reason=where)
            elif job.reason != where:
                store.update(job.id, expect=[S.QUEUED], reason=where)
            return
        if new.active:
            if job.state is S.QUEUED:
                store.transition(job.id, S.STARTING, f"starting on {member}", expect=[S.QUEUED],
                                 attempt=int(seen.get("attempt", 1)), reason=where)  # fmt: skip
                job = store.job(job.id) or job
            if new is S.BUILDING and job.state is S.STARTING:
                store.transition(job.id, S.BUILDING, f"building its environment on {member}", reason=where)
            elif new is S.RUNNING and job.state in (S.STARTING, S.BUILDING):
                store.transition(job.id, S.RUNNING, f"running on {member}", reason=where,
                                 started_at=seen.get("started_at") or time.time())  # fmt: skip
            elif job.reason != where:
                store.update(job.id, reason=where)
            return
        if job.state is S.QUEUED and new is S.CANCELLED and job.stop_reason is None and not seen.get("started_at"):
            why = f"{member} cancelled it unstarted ({said}); it goes elsewhere"
            store.update(job.id, expect=[S.QUEUED], external=None, reason=why)
            store.note(job.id, why)
            return
        self._end(pod, job, new, member, seen)

    def _end(self, pod: PodSide, job: JobRecord, new: JobState, member: str, seen: dict[str, Any]) -> None:
        """The member's job ended (succeeded, failed, cancelled, lost): so does the fleet's copy."""
        store = pod.store
        said = str(seen.get("reason") or "")
        if job.state is S.QUEUED:
            store.transition(job.id, S.STARTING, f"ended on {member} before the fleet saw it run", expect=[S.QUEUED])
            job = store.job(job.id) or job
        if new is S.SUCCEEDED and job.state is not S.RUNNING:
            store.transition(job.id, S.RUNNING, f"ran on {member}", started_at=seen.get("started_at") or time.time())
        code = seen.get("exit_code")
        note = (
            f"{new.value} on {member}"
            + (f" ({said})" if said else "")
            + ("" if code is None else f", exit code {code}")
        )
        store.transition(job.id, new, note, reason="" if new is S.SUCCEEDED else f"on {member}: {said or new.value}",
                         exit_code=code, finished_at=seen.get("finished_at") or time.time(),
                         failures=int(seen.get("failures", job.failures)), stop_reason=None,
                         stop_deadline=None)  # fmt: skip
        self._held.pop(job.id, None)
