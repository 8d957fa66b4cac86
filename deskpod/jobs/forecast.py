"""When will each queued job start? An estimate from what the running and queued jobs declared.

The scheduler (`deskpod.jobs.scheduler`) decides only the present; the Jobs page also says *when*.
This plays the queue forward on a profile of free devices over time (conservative backfill):

1. The profile starts with the devices free now; each running job gives its devices back at its end
   (``started_at + max_runtime``, or its stop deadline once it is being stopped). A job without a
   ``max_runtime`` gives them back never, as far as anyone can promise.
2. Queued jobs are taken in the scheduler's order (-priority, id). Each gets the earliest time at
   which its device count is free for its whole ``max_runtime`` (forever when it has none), and that
   interval is taken from the profile, so a small short job may fit in a gap before a big one.
3. A job that never fits in the promised profile gets no estimate (None): the queue ahead of it
   holds devices without a promised end.

Like the scheduler's reservation it counts devices, not links: on a box with uneven links a job may
wait longer for the right set, and a job that ends early starts the rest sooner. Only the first
`HORIZON` jobs are played forward (each costs a pass over the profile); later ones get no estimate.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from deskpod.jobs.scheduler import Running, Waiting, expected_end, order_key

HORIZON = 256
"""Queued jobs given an estimate, from the front; the cost is quadratic in it."""


@dataclass(frozen=True, slots=True)
class Forecast:
    position: dict[int, int]
    """Every queued job's place in the queue, from 1 (the next to be considered)."""
    start: dict[int, float | None]
    """Estimated start time (epoch seconds) of the first `HORIZON` queued jobs; None when unknown."""
    horizon: int = 0
    """How many jobs from the queue's front were played forward (those behind have no entry in ``start``); 0 when
    none were (another scheduler, e.g. Slurm's, decides when)."""
    free: tuple[tuple[float, int], ...] = ()
    """What a job submitted now would find once the queue was played forward: (from when, devices free from then
    on) steps in time order; empty when unknown (more queued jobs than the horizon, or another scheduler's)."""


def queue_order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """The order the scheduler considers queued jobs in: higher priority first, then older first."""
    return sorted(waiting, key=order_key)


def forecast(
    waiting: Iterable[Waiting], running: Sequence[Running], device_count: int, now: float, *, horizon: int = HORIZON
) -> Forecast:
    """Positions of every queued job and estimated starts of the first ``horizon`` (module docstring)."""
    order = queue_order(waiting)
    position = {j.id: i + 1 for i, j in enumerate(order)}
    times = [now]
    free = [device_count - sum(len(r.devices) for r in running)]
    for r in running:
        end = expected_end(r)
        if end < math.inf:
            _add(times, free, max(now, end), math.inf, -len(r.devices))
    start: dict[int, float | None] = {}
    for job in order[:horizon]:
        length = job.max_runtime if job.max_runtime is not None else math.inf
        at = _earliest(times, free, job.devices, length)
        start[job.id] = at
        if at is not None:
            _add(times, free, at, at + length, job.devices)
    profile = tuple(zip(times, free, strict=True)) if len(order) <= horizon else ()
    return Forecast(position, start, horizon, profile)


def earliest(profile: Sequence[tuple[float, int]], k: int, length: float | None) -> float | None:
    """The first time in a `Forecast.free` profile from which ``k`` devices stay free for ``length`` seconds
    (None: for good); None when never."""
    times, free = [t for t, _ in profile], [n for _, n in profile]
    return _earliest(times, free, k, math.inf if length is None else length) if profile else None


def _split(times: list[float], free: list[int], t: float) -> int:
    """Index of the profile step that begins at ``t``, splitting the step that holds it."""
    i = bisect.bisect_right(times, t) - 1
    if times[i] != t:
        times.insert(i + 1, t)
        free.insert(i + 1, free[i])
        i += 1
    return i


def _add(times: list[float], free: list[int], begin: float, end: float, taken: int) -> None:
    """Take ``taken`` devices (negative: give them back) over [begin, end)."""
    i = _split(times, free, begin)
    j = len(times) if end == math.inf else _split(times, free, end)
    for k in range(i, j):
        free[k] -= taken


def _earliest(times: list[float], free: list[int], k: int, length: float) -> float | None:
    """The first step start from which ``k`` devices stay free for ``length`` seconds, or None."""
    n = len(times)
    i = 0
    while i < n:
        if free[i] < k:
            i += 1
            continue
        begin = times[i]
        j = i
        while j < n and times[j] < begin + length and free[j] >= k:
            j += 1
        if j == n or times[j] >= begin + length:
            return begin
        i = j + 1  # step j is too full: nothing starting at or before it fits
    return None
