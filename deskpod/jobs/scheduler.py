"""One scheduling pass: which queued jobs start now, on which devices, and why the others wait.

Pure: it reads views of the queue and of the running jobs plus a clock value, asks a placement
function, and returns a `Plan`; the daemon carries the plan out. Tests and the benchmark call it
with a fake placement and a fixed ``now``.

The policy, in order:

1. **Priority, then submission order.** Jobs are taken by (-priority, id).
2. **Topology-aware placement.** Each job's devices come from ``place(free, k, policy)``; when it
   says no, its reason ("needs 4 NVLink-connected GPUs; the largest free clique has 2") becomes the
   job's visible wait reason.
3. **Backfill (EASY).** The first job that cannot start gets a reservation: the earliest time
   (``shadow``) at which enough devices will be free, judged from the running jobs' ``max_runtime``.
   A later job may start ahead of it only if it fits now and either ends before ``shadow`` or uses
   only devices the reserved job will not need then (``extra``). The reservation counts devices,
   not topology, so it is a good-faith estimate on boxes with uneven links. Jobs without a
   ``max_runtime`` end at infinity for this purpose.
4. **Preemption** (when the pod allows it): if the reserved job cannot start, running jobs of
   strictly lower priority are chosen — lowest priority first, newest first — until the placement
   succeeds on the devices they would free; the plan asks the daemon to stop them (SIGTERM, grace,
   SIGKILL). While victims are stopping, no more are chosen.

Speed: a placement refusal for (k, policy) on the free set stays a refusal as the free set shrinks
within a pass, so each (k, policy) is asked at most once per refusal; a pass over 10,000 queued
jobs asks the placement a handful of times.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deskpod.hardware.placement import Placement, Unplaceable

PlaceFn = Callable[[Sequence[int], int, str], Placement | Unplaceable]
"""``place(free_indices, k, policy)``: the hardware model's placement bound to this box's topology."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued job as the scheduler sees it."""

    id: int
    priority: int
    devices: int
    policy: str = "best"
    max_runtime: float | None = None


def order_key(job: Waiting) -> tuple[int, int]:
    """The order of the queue: higher priority first, then first come."""
    return (-job.priority, job.id)


class WaitingCache:
    """The queue as `Waiting` objects in `order_key` order, kept between passes from the store's changes
    (`deskpod.jobs.store.Store.queue_delta`): building 10,000 of them anew and sorting them cost a pass more
    than deciding it. A changed job is taken out of the order and put back in (bisection), so a pass after a
    submission touches one job, not the queue. One consumer: the pod's scheduling loop."""

    def __init__(self) -> None:
        self._by_id: dict[int, Waiting] = {}
        self._order: list[Waiting] = []

    def apply(self, queued: Mapping[int, tuple[Any, ...]], changed: Iterable[int] | None) -> list[Waiting]:
        """The order after ``changed`` (ids whose row came, went or changed; None: start again from ``queued``,
        rows as `deskpod.jobs.store.Store.queue` gives them)."""
        if changed is None:
            self._by_id = {i: Waiting(q[0], q[1], q[2], q[3], q[4]) for i, q in queued.items()}
            self._order = sorted(self._by_id.values(), key=order_key)
            return self._order
        order = self._order
        for i in changed:
            old = self._by_id.pop(i, None)
            if old is not None:
                at = bisect.bisect_left(order, order_key(old), key=order_key)
                if at < len(order) and order[at] is old:
                    del order[at]
                else:  # not where its key says: never expected, but the order must stay whole
                    order.remove(old)
            q = queued.get(i)
            if q is not None:
                w = self._by_id[i] = Waiting(q[0], q[1], q[2], q[3], q[4])
                bisect.insort(order, w, key=order_key)
        return order


@dataclass(frozen=True, slots=True)
class Running:
    """A job holding devices (starting or running)."""

    id: int
    priority: int
    devices: tuple[int, ...]
    started_at: float
    max_runtime: float | None = None
    stop_deadline: float | None = None
    """Set once the job was asked to stop: it frees its devices by then (SIGKILL at the deadline)."""


@dataclass(frozen=True, slots=True)
class Start:
    job: int
    devices: tuple[int, ...]
    reason: str
    """The placement's explanation of the choice."""


@dataclass(slots=True)
class Plan:
    starts: list[Start] = field(default_factory=list)
    preempt: list[int] = field(default_factory=list)
    """Running job ids to stop so that the reserved job can start."""
    waits: dict[int, str] = field(default_factory=dict)
    """Why each job that does not start waits."""
    reserved: int | None = None


def expected_end(r: Running) -> float:
    """When a running job frees its devices at the latest: its stop deadline, else its ``max_runtime`` from its
    start; infinity for a job without a limit."""
    if r.stop_deadline is not None:
        return r.stop_deadline
    return math.inf if r.max_runtime is None else r.started_at + r.max_runtime


def schedule(
    waiting: Iterable[Waiting],
    running: Sequence[Running],
    device_count: int,
    place: PlaceFn,
    now: float,
    *,
    preemption: bool = True,
    ordered: bool = False,
) -> Plan:
    """Decide one pass; see the module docstring for the policy. ``ordered``: ``waiting`` is already in
    `order_key` order (`WaitingCache.ordered`), so it is not sorted again."""
    plan = Plan()
    busy = {d for r in running for d in r.devices}
    free = [d for d in range(device_count) if d not in busy]
    refused: dict[tuple[int, str], str] = {}
    head: Waiting | None = None
    shadow = math.inf
    extra = 0
    head_note = ""

    for job in waiting if ordered else sorted(waiting, key=order_key):
        k, key = job.devices, (job.devices, job.policy)
        if k == 0:  # a job holding no devices (TensorBoard) takes nothing from anyone: it starts now
            plan.starts.append(Start(job.id, (), "holds no devices"))
            continue
        in_time = False
        if head is not None:
            in_time = job.max_runtime is not None and now + job.max_runtime <= shadow
            if not in_time and k > extra:
                plan.waits[job.id] = f"waiting behind {head_note}"
                continue
        why = refused.get(key)
        if why is None and head is not None and len(free) < k:
            why = f"needs {k} device{'s' if k != 1 else ''}; {len(free)} free"
        if why is None:
            got = place(free, k, job.policy)
            if isinstance(got, Unplaceable):
                why = refused[key] = got.reason
            else:
                plan.starts.append(Start(job.id, tuple(got.devices), got.reason))
                taken = set(got.devices)
                free = [d for d in free if d not in taken]
                if head is not None and not in_time:
                    extra -= k
                continue
        plan.waits[job.id] = why
        if head is None:
            head, shadow, extra, head_note = _reserve(job, free, running, plan)
            _maybe_preempt(job, free, running, place, plan, preemption)
    return plan


def _reserve(
    job: Waiting, free: Sequence[int], running: Sequence[Running], plan: Plan
) -> tuple[Waiting, float, int, str]:
    """The reservation for the first job that cannot start: (job, shadow time, extra devices, note)."""
    plan.reserved = job.id
    avail = len(free)
    shadow, extra = math.inf, max(0, avail - job.devices)
    for r in sorted(running, key=expected_end):
        avail += len(r.devices)
        if avail >= job.devices:
            shadow, extra = expected_end(r), avail - job.devices
            break
    else:
        extra = max(0, avail - job.devices)
    note = f"job {job.id} (priority {job.priority}), which needs {job.devices} device{'s' if job.devices != 1 else ''}"
    return job, shadow, min(extra, len(free)), note


def _maybe_preempt(
    job: Waiting, free: Sequence[int], running: Sequence[Running], place: PlaceFn, plan: Plan, enabled: bool
) -> None:
    """Choose lower-priority running jobs to stop so that ``job`` fits; record them in ``plan.preempt``."""
    if not enabled:
        return
    stopping = [r for r in running if r.stop_deadline is not None]
    if stopping:
        soon = [*free, *(d for r in stopping for d in r.devices)]
        if len(soon) >= job.devices and isinstance(place(soon, job.devices, job.policy), Placement):
            plan.waits[job.id] = "waiting for preempted jobs to stop"
            return
    candidates = sorted(
        (r for r in running if r.stop_deadline is None and r.priority < job.priority),
        key=lambda r: (r.priority, -r.started_at, -r.id),
    )
    if not candidates:
        return
    pool = [*free, *(d for r in stopping for d in r.devices)]
    victims: list[Running] = []
    for r in candidates:
        victims.append(r)
        pool.extend(r.devices)
        if len(pool) >= job.devices and isinstance(place(sorted(pool), job.devices, job.policy), Placement):
            break
    else:
        return  # even stopping every lower-priority job would not make room
    # Drop victims that turned out unnecessary, latest chosen first.
    for r in reversed(victims[:-1]):
        trial = sorted(d for d in pool if d not in r.devices)
        if len(trial) >= job.devices and isinstance(place(trial, job.devices, job.policy), Placement):
            victims.remove(r)
            pool = trial
    plan.preempt.extend(r.id for r in victims)
    plan.waits[job.id] = f"preempting job{'s' if len(victims) > 1 else ''} {', '.join(str(r.id) for r in victims)}"
