"""Which member a job goes to, and why: a pure function over member snapshots (`deskpod.fleet.snapshot`).

In order:

1. **Who may take it.** A member that does not answer, is being removed (draining), or whose last health check
   failed (its ``deskpod doctor``, asked on a schedule: `deskpod.fleet.health`) gets nothing.
2. **Fit.** Its devices: the kind the job names, if it names one (``device_kind = "cuda"``: ``box-c: has CPU
   slots, the job wants GPUs``), enough of them (``box-c: has 2 GPUs, the job needs 4``), and a set the job's placement
   policy accepts on the member's own topology — ``best`` wants NVLink-connected GPUs wherever the machine has
   such a set (`deskpod.hardware.placement.place`, the member's own placement). A cluster member fits a job one of
   its partitions has the nodes, GPUs per node and device kind for (a partition without GPUs is ``cpu``).
3. **Soonest start.** Now, when the member's queue is empty and the placement takes its free devices now;
   else the earliest time its own forecast (`deskpod.jobs.forecast`, sent in its status as devices free over time)
   has the job's devices free for its ``max_runtime``. A start no forecast can promise (devices held by jobs
   without a time limit, a cluster's scheduler) comes after every promised one; among those, the shortest queue.
   Ties: the member that has the job's stack built (``pytorch@v3 built there``: its environment is ready, no
   build before the start; `deskpod.fleet.stacks.StackStore.built`), then the cluster that has the job's dataset
   staged (a train job with ``slurm.stage_data``: ``imagenet staged there``, its source listed in the member's
   status, `deskpod.cluster.staging.StagedSources`; the first epoch reads local SSD, no copy before it), then the
   shorter queue, then more devices free now, then the name. A built stack ranks before staged data: without it the
   job cannot start at all until the environment is built, while an unstaged dataset is copied inside the job.

`route` returns the choice and one reason per member, the chosen one first ("box-b: 4 GPUs free now; box-a:
about 2 h in queue; box-c: has 2 GPUs, the job needs 4"); the fleet records it in the job's history.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePath

from deskpod.errors import UsageError
from deskpod.fleet.snapshot import MemberSnapshot
from deskpod.hardware.placement import Unplaceable, place
from deskpod.jobs.forecast import earliest


@dataclass(frozen=True, slots=True)
class Wanted:
    """What routing needs of a job."""

    devices: int | None
    """A count, or None for ``devices = "all"``: a whole member, whichever it is."""
    placement: str = "best"
    max_runtime: float | None = None
    nodes: int = 1
    kind: str | None = None
    """The device kind the job names (``cuda``, ``cpu``); None: any."""
    stack: str | None = None
    """The stack version the job runs in (``NAME@vN``, pinned by the fleet); None: none."""
    data: str | None = None
    """The dataset a train job with ``slurm.stage_data`` copies to node-local scratch (its source path); None: the
    job stages nothing."""
    scratch: str | None = None
    """The scratch folder the job stages into (``slurm.scratch``); None: any (the member's default)."""


@dataclass(frozen=True, slots=True)
class Route:
    member: str | None
    """The chosen member; None when none can take the job now."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Each member's reason, the chosen one first."""

    def text(self) -> str:
        return "; ".join(f"{name}: {why}" for name, why in self.reasons.items())


@dataclass(frozen=True, slots=True)
class _Option:
    wait: float
    """Seconds until the job could start there; infinity when unknown."""
    queued: int
    free: int
    built: bool = False
    """The member has the job's stack built."""
    staged: bool = False
    """The member has the job's dataset staged in the job's scratch folder."""


def route(job: Wanted, members: Sequence[MemberSnapshot], now: float) -> Route:
    """The member that fits the job and can start it soonest, and why each member was or was not chosen."""
    reasons: dict[str, str] = {}
    options: dict[str, _Option] = {}
    for m in members:
        why, option = _judge(job, m, now)
        reasons[m.name] = why
        if option is not None:
            options[m.name] = option
    if not options:
        return Route(None, reasons)
    best = min(options, key=lambda n: (options[n].wait, not options[n].built, not options[n].staged, options[n].queued,
                                       -options[n].free, n))  # fmt: skip
    return Route(best, {best: reasons[best], **{n: r for n, r in reasons.items() if n != best}})


def _judge(job: Wanted, m: MemberSnapshot, now: float) -> tuple[str, _Option | None]:
    """A member's reason, and its option when it can take the job (with whether it has the job's stack built and
    its data staged)."""
    why, option = _fit(job, m, now)
    if option is None:
        return why, option
    if job.stack is not None:
        built = job.stack in m.stacks
        why += f"; {job.stack} built there" if built else f"; {job.stack} not built there yet"
        option = replace(option, built=built)
    if job.data is not None and m.backend == "slurm":  # only a cluster's jobs stage (`deskpod.cluster.launch`)
        staged = (job.scratch is None or job.scratch == m.scratch) and _same_path(job.data, m.staged)
        name = PurePath(job.data).name or job.data
        why += f"; {name} staged there" if staged else f"; {name} not staged there yet"
        option = replace(option, staged=staged)
    return why, option


def _same_path(path: str, among: Sequence[str]) -> bool:
    """Whether ``path`` is one of ``among``, spelled alike up to ``..``, ``.`` and repeated slashes."""
    return os.path.normpath(path) in {os.path.normpath(p) for p in among}


def _fit(job: Wanted, m: MemberSnapshot, now: float) -> tuple[str, _Option | None]:
    """A member's reason, and its option when it can take the job."""
    if not m.reachable:
        return f"unreachable ({m.error})", None
    if m.draining:
        return "draining (being removed): no new jobs", None
    if m.health is not None and m.health.failed:
        return f"failed its health check ({'; '.join(m.health.failing) or 'a check failed'}): no new jobs", None
    if m.backend == "slurm":
        return _cluster(job, m)
    topo = m.topology
    if topo is None:
        return "shows no devices", None
    n = topo.device_count
    noun = NOUNS.get(m.kind, "device")
    if job.kind is not None and job.kind != m.kind:
        return f"has {noun}s, the job wants {NOUNS[job.kind]}s (device_kind = {job.kind!r})", None
    if job.nodes > 1:
        return f"one box; the job needs {job.nodes} nodes", None
    k = n if job.devices is None else job.devices
    if k > n:
        return f"has {n} {noun}{'s' * (n != 1)}, the job needs {k}", None
    try:
        ever = place(topo, range(n), k, policy=job.placement)
    except UsageError as e:  # a partition this machine does not have
        return str(e), None
    if isinstance(ever, Unplaceable):
        return f"can never fit it: {ever.reason}", None
    free_now = m.free_now
    devices = f"{k} {noun}{'s' * (k != 1)}"
    if (
        m.queued == 0
        and len(free_now) >= k
        and not isinstance(place(topo, free_now, k, policy=job.placement), Unplaceable)
    ):
        return f"{devices} free now", _Option(0.0, m.queued, len(free_now))
    profile = list(m.free)
    at = earliest(profile, k, job.max_runtime)
    if at is not None and at <= 0 and len(free_now) >= k:  # enough free now, but not a set the placement takes
        at = earliest([(t, f) for t, f in profile if t > 0], k, job.max_runtime)
    queue = f"{m.queued} queued there" if m.queued else "none queued there"
    if at is None:
        cause = "its queue is longer than its forecast looks ahead" if not profile else \
            "its devices are held by jobs without a max_runtime"  # fmt: skip
        return f"start unknown ({cause}; {queue})", _Option(math.inf, m.queued, len(free_now))
    wait = max(0.0, m.asked_at + at - now)
    return f"{about(wait)} in queue ({queue})", _Option(wait, m.queued, len(free_now))


def _cluster(job: Wanted, m: MemberSnapshot) -> tuple[str, _Option | None]:
    """A cluster member: it fits when a partition has the nodes and GPUs; Slurm decides when."""
    k = job.devices or 0
    kinds = ("cuda", "cpu") if job.kind is None else (job.kind,)
    # a partition without GPUs gives a job CPUs (--cpus-per-task), as many as it asks: no GPU count to fit
    fits = [p for p in m.partitions
            if p[1] >= job.nodes and (p[2] >= k or not p[2]) and ("cuda" if p[2] else "cpu") in kinds]  # fmt: skip
    if not fits:
        shown = ", ".join(f"{p[0]}: {p[1]} nodes x {p[2]} GPUs" for p in m.partitions) or "no partitions"
        what = f"{k} GPUs" if job.kind != "cpu" else "CPUs (no GPUs)"
        return f"no partition has {job.nodes} node(s) of {what} ({shown})", None
    return f"a Slurm cluster, which decides when ({m.queued} queued there)", _Option(math.inf, m.queued, 0)


NOUNS = {"cuda": "GPU", "cpu": "CPU slot"}
"""A member's devices in words, by their kind."""


def about(seconds: float) -> str:
    """A wait in words: ``about 40 s``, ``about 12 min``, ``about 2 h``."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.0f} h" if seconds >= 5 * 3600 else f"about {seconds / 3600:.1f} h"


def after(job: Wanted, m: MemberSnapshot, now: float) -> MemberSnapshot:
    """The member as it will be once the job is sent to it (its devices or its place in the queue taken), so that
    the next job routed before the member is asked again does not count on the same devices."""
    if m.backend == "slurm" or m.topology is None:
        return replace(m, queued=m.queued + 1)
    k = m.topology.device_count if job.devices is None else job.devices
    free_now = m.free_now
    end = math.inf if job.max_runtime is None else job.max_runtime
    if m.queued == 0 and len(free_now) >= k:
        got = place(m.topology, free_now, k, policy=job.placement)
        if not isinstance(got, Unplaceable):
            held = set(got.devices)
            devices = tuple(replace(d, job="routed") if d.index in held else d for d in m.devices)
            return replace(m, devices=devices, free=_take(m.free, now - m.asked_at, end, k))
    at = earliest(list(m.free), k, job.max_runtime)
    free = m.free if at is None else _take(m.free, at, at + end, k)
    return replace(m, queued=m.queued + 1, free=free)


def _take(profile: Sequence[tuple[float, int]], begin: float, end: float, k: int) -> tuple[tuple[float, int], ...]:
    """A free-devices profile with ``k`` fewer over [begin, end) (seconds after the snapshot was asked)."""
    if not profile:
        return ()
    steps = dict(profile)
    for t in (max(begin, profile[0][0]), end):
        if t < math.inf and t not in steps:
            steps[t] = next(f for s, f in reversed(profile) if s <= t) if t >= profile[0][0] else profile[0][1]
    return tuple((t, f - k if begin <= t < end else f) for t, f in sorted(steps.items()))
