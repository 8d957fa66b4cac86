"""Rolling a stack's version out to the fleet: on each member in turn, build it and prove it works there.

``deskpod fleet stack rollout NAME`` takes the stack's current version (`deskpod.fleet.stacks`) to every member,
one at a time. On a member it submits a *smoke job*: a command job whose ``[environment]`` is the version's (the
member builds it once, keyed by its contents, as the job's own account in its sandbox) and whose command checks
it on the devices the member gives the job::

    build       the environment is built (or found cached): the job reaches ``running``
    import      ``import torch`` in the stack's Python
    matmul      a 256x256 float32 matmul on the job's device, checked against float64 on the CPU
    allreduce   ``torch.distributed.run`` starts one worker per allocated device (CUDA_VISIBLE_DEVICES, or the
                pod's DESKPOD_CPU_SLOTS) and they all-reduce a tensor: nccl on GPUs, gloo on CPU slots; the sum
                must be 1 + 2 + ... + world

The script goes inline (``python -c``): the stack need not contain deskpod. Each step prints ``SMOKE ok STEP ...``
or ``SMOKE FAIL STEP: why``; `judge` reads the job's end and log into one `MemberBuild`. The rollout goes on to the
next member only when a member passed; at the first failure it stops and says where and why (the member, the
step, the cause, the log's tail). Every outcome is recorded, so ``deskpod fleet stack status`` shows what each
member has. A member that already passed this very version is not asked again (a stopped rollout, run again,
resumes where it stopped). Jobs already queued or running on a member keep the version they were given: a
rollout only adds a job of its own.

The members are reached through `MemberLink` — submit a job spec as the fleet's admin and wait for its end — so
the engine runs against any pod; `PodLink` is that link over a pod's own client and admin token.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from deskpod.errors import ConflictError, DeskpodError
from deskpod.fleet.client import MemberClient
from deskpod.fleet.stacks import MemberBuild, StackStore, StackVersion
from deskpod.jobs.client import PodClient

STEPS = ("build", "import", "matmul", "allreduce")
"""The smoke test's steps, in order (``start``: the member could not start the job; ``wait``: it did not end in
time)."""
SMOKE_DEVICES = 2
"""Devices a smoke job asks for (fewer on a member that has fewer): two, so that the all-reduce crosses devices
without waiting for a whole busy box."""
SMOKE_TIMEOUT_S = 1800.0
"""How long a member may take to build and smoke-test a version (a large stack's first build included)."""
SMOKE_MAX_RUNTIME_S = 600.0
"""The smoke job's own ``max_runtime``, from when its environment is ready (its command runs in seconds)."""
TAIL_CHARS = 2000
POLL_S = 0.25
MARK_RE = re.compile(r"^SMOKE (ok|FAIL) (\w+)[: ]?(.*)$")

WORKER = """
import datetime, os, sys
import torch
import torch.distributed as dist
rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
gpu = torch.cuda.is_available() and bool(os.environ.get("CUDA_VISIBLE_DEVICES"))
device = torch.device("cuda", local) if gpu else torch.device("cpu")
def fail(step, why):
    print(f"SMOKE FAIL {step}: rank {rank}: {why}", flush=True)
    sys.exit(4)
try:
    if gpu:
        torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(rank)
    a, b = (torch.randn(256, 256, generator=g, dtype=torch.float64) for _ in range(2))
    want = a @ b
    got = (a.float().to(device) @ b.float().to(device)).double().cpu()
    err = ((got - want).abs().max() / want.abs().max()).item()
except Exception as e:
    fail("matmul", f"{type(e).__name__}: {e}")
if not err < 1e-3:
    fail("matmul", f"relative error {err:.2e} against float64 (at most 1e-3 expected)")
if rank == 0:
    print(f"SMOKE ok matmul 256x256 float32 on {device.type} (relative error {err:.1e})", flush=True)
backend = "nccl" if gpu else "gloo"
try:
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    t = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(t)
    total = t.cpu()
    dist.destroy_process_group()
except Exception as e:
    fail("allreduce", f"{type(e).__name__}: {e}")
want = world * (world + 1) / 2
if not bool((total == want).all()):
    fail("allreduce", f"sum {total[0].item()} where {want} was expected over {world} workers")
if rank == 0:
    what = "GPUs" if gpu else "CPU slots"
    print(f"SMOKE ok allreduce over {world} {what} ({backend})", flush=True)
"""

LAUNCHER = """
import os, subprocess, sys
print("SMOKE start", sys.version.split()[0], flush=True)
try:
    import torch
except Exception as e:
    print(f"SMOKE FAIL import: {type(e).__name__}: {e}", flush=True)
    sys.exit(3)
print(f"SMOKE ok import torch {torch.__version__}", flush=True)
listed = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
listed = listed or [d for d in os.environ.get("DESKPOD_CPU_SLOTS", "").split(",") if d]
argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={max(1, len(listed))}",
        "--no-python", sys.executable, "-c", sys.argv[1]]
sys.exit(subprocess.call(argv))
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEnd:
    """How a job on a member ended, as its link saw it."""

    job: str
    state: str
    """The member's final state (``succeeded``, ``failed``, ``cancelled``, ``lost``), or ``timeout``."""
    reason: str
    """The member's reason (``exit code 3``, ``environment build failed: ...``)."""
    log: str
    """The end of its log."""
    notes: tuple[str, ...] = ()
    """Its events' notes, in order (``environment ... cached``, ``environment ready after 12.3 s; running``)."""


class MemberLink(Protocol):
    """A member as the rollout reaches it: as the fleet's admin, through the member's own API."""

    @property
    def name(self) -> str: ...

    def device_count(self) -> int:
        """The devices the member schedules (GPUs, or CPU worker slots); a cluster's: a node's of its default
        partition."""
        ...

    def run(self, spec: Mapping[str, Any], *, timeout_s: float) -> JobEnd:
        """Submit ``spec`` and wait for the job's end (cancelling it past ``timeout_s``)."""
        ...


class JobLink:
    """A `MemberLink` made of five requests to the member (`PodLink`, `FleetLink`): status, submit, job, cancel, log."""

    def __init__(self, name: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._name, self.clock = name, clock

    @property
    def name(self) -> str:
        return self._name

    def _status(self) -> dict[str, Any]:
        raise NotImplementedError

    def _submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _job(self, job_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def _cancel(self, job_id: str) -> None:
        raise NotImplementedError

    def _log(self, job_id: str, offset: int) -> bytes:
        raise NotImplementedError

    def device_count(self) -> int:
        return devices_of(self._status())

    def run(self, spec: Mapping[str, Any], *, timeout_s: float) -> JobEnd:
        job_id = str(self._submit(dict(spec))["id"])
        deadline = self.clock() + timeout_s
        while True:
            job = self._job(job_id)
            final = job["state"] in ("succeeded", "failed", "cancelled", "lost")
            if final or self.clock() > deadline:
                break
            time.sleep(POLL_S)
        state = job["state"]
        if not final:
            self._cancel(job_id)
            state = "timeout"
        notes = tuple(str(e["note"]) for e in job.get("events", []))
        return JobEnd(job=job_id, state=state, reason=str(job.get("reason") or ""), log=self._tail(job_id),
                      notes=notes)  # fmt: skip

    def _tail(self, job_id: str) -> str:
        data, offset = b"", 0
        while chunk := self._log(job_id, offset):
            offset += len(chunk)
            data = (data + chunk)[-4 * TAIL_CHARS :]
        return data.decode(errors="replace")


class PodLink(JobLink):
    """`MemberLink` over a pod's client (`deskpod.jobs.client.PodClient`) holding a token of the pod's own."""

    def __init__(self, name: str, client: PodClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name, clock=clock)
        self.client = client

    def _status(self) -> dict[str, Any]:
        return self.client.status()

    def _submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.client.submit(spec)

    def _job(self, job_id: str) -> dict[str, Any]:
        return self.client.job(job_id)

    def _cancel(self, job_id: str) -> None:
        self.client.cancel(job_id)

    def _log(self, job_id: str, offset: int) -> bytes:
        return self.client.log(job_id, offset)[0]


class FleetLink(JobLink):
    """`MemberLink` over the fleet's own link to a member (`deskpod.fleet.client.MemberClient`): each request signed
    for ``user`` (the fleet admin who asked for the rollout, whom the member maps to its user of that name)."""

    def __init__(self, member: MemberClient, user: str) -> None:
        super().__init__(member.member.name)
        self.member, self.user = member, user

    def _status(self) -> dict[str, Any]:
        return self.member.status()

    def _submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.member.submit(self.user, spec, None)  # the fleet's own job: no lease, nothing to route

    def _job(self, job_id: str) -> dict[str, Any]:
        return self.member.job(self.user, job_id)

    def _cancel(self, job_id: str) -> None:
        self.member.cancel(self.user, job_id)

    def _log(self, job_id: str, offset: int) -> bytes:
        return self.member.log(self.user, job_id, offset, 1 << 20)


def devices_of(status: Mapping[str, Any]) -> int:
    """The devices a member's ``GET /v1/status`` shows: its own, or (a Slurm login node's pod, which has none of
    its own) the GPUs of one node of its default partition, where Slurm places a one-node job."""
    if status.get("devices"):
        return len(status["devices"])
    parts = (status.get("backend") or {}).get("partitions") or []
    default = next((p for p in parts if p.get("default")), parts[0] if parts else None)
    return int(default["gpus_per_node"]) if default else 0


def smoke_spec(version: StackVersion, devices: int) -> dict[str, Any]:
    """The smoke job of ``version`` on ``devices`` devices, as a member's pod takes it (an ``[environment]``, never
    ``stack``: members are plain pods)."""
    return {
        "name": f"smoke-{version.name}-v{version.version}"[:64],
        "command": ["python", "-c", LAUNCHER, WORKER],
        "devices": devices,
        "environment": version.definition.to_json(),
        "max_runtime": SMOKE_MAX_RUNTIME_S,
    }


def judge(version: StackVersion, member: str, end: JobEnd, seconds: float, at: float) -> MemberBuild:
    """A member's smoke job, read into an outcome: passed only if it succeeded with every step's ``ok``; else the
    first step that failed and why (the step's own ``FAIL`` line, the member's reason, or the step that never
    said ``ok``)."""
    said: dict[str, str] = {}
    failed: tuple[str, str] | None = None
    for line in end.log.splitlines():
        m = MARK_RE.match(line.strip())
        if m is None:
            continue
        if m.group(1) == "ok":
            said[m.group(2)] = m.group(3).strip()
        elif failed is None:
            failed = (m.group(2), m.group(3).strip())
    started = "SMOKE start" in end.log
    tail = end.log[-TAIL_CHARS:]

    def made(outcome: str, step: str, reason: str) -> MemberBuild:
        return MemberBuild(name=version.name, version=version.version, hash=version.hash, member=member,
                           outcome=outcome, step=step, reason=reason, log_tail=tail, job=end.job, seconds=seconds,
                           at=at)  # fmt: skip

    if end.state == "timeout":
        step = next((s for s in STEPS[1:] if s not in said), "build") if started else "build"
        why = f"no end within {SMOKE_TIMEOUT_S:.0f} s (cancelled at step {step})"
        return made("failed", "wait", why)
    if end.reason.startswith("environment build failed"):
        return made("failed", "build", end.reason)
    if end.reason.startswith("cannot start") or (end.state != "succeeded" and not started):
        return made("failed", "start", end.reason or end.state)
    if failed is not None:
        return made("failed", failed[0], failed[1])
    missing = next((s for s in STEPS[1:] if s not in said), None)
    if end.state != "succeeded" or missing is not None:
        step = missing or "allreduce"
        why = f"{end.state} ({end.reason or 'no reason given'}) before step {step} said ok"
        return made("failed", step, why)
    built = next((n for n in end.notes if "environment ready after" in n or ", cached" in n), "")
    how = "built" if "ready after" in built else "cached"
    return made("passed", "", f"{said['import']}; all-reduce {said['allreduce']}; environment {how}")


@dataclass(slots=True)
class Rollout:
    """One rollout of a version: where it is, what each member did."""

    name: str
    version: int
    members: list[str]
    state: str = "running"
    """``running``, ``passed`` (every member), ``failed`` (stopped at a member) or ``error`` (could not go on)."""
    at: str | None = None
    """The member it is on, or stopped at."""
    results: list[MemberBuild] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Members that had passed this version already."""
    error: str = ""
    started: float = field(default_factory=time.time)
    finished: float | None = None

    @property
    def message(self) -> str:
        """One line: how it went."""
        ref = f"{self.name} v{self.version}"
        if self.state == "running":
            return f"rollout of {ref}: on {self.at} ({len(self.results)} of {len(self.members)} members done)"
        if self.state == "passed":
            return f"rollout of {ref} passed on every member ({len(self.members)})"
        if self.state == "error":
            return f"rollout of {ref} stopped at {self.at}: {self.error}"
        last = self.results[-1]
        return f"rollout of {ref} stopped at {last.member}: step {last.step} failed: {last.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "members": self.members, "state": self.state,
                "at": self.at, "message": self.message, "results": [r.to_json() for r in self.results],
                "skipped": self.skipped, "error": self.error, "started": self.started,
                "finished": self.finished}  # fmt: skip


def roll_out(store: StackStore, name: str, members: Sequence[MemberLink], *, devices: int = SMOKE_DEVICES,
             timeout_s: float = SMOKE_TIMEOUT_S, progress: Rollout | None = None) -> Rollout:  # fmt: skip
    """Roll stack ``name``'s current version out to ``members``, in their order (see the module docstring).
    ``progress``: the `Rollout` to fill in as it goes (another thread reads it)."""
    version = store.current(name)
    assert version is not None
    out = progress or Rollout(name, version.version, [m.name for m in members])
    passed = {b.member for b in store.builds(name) if b.outcome == "passed" and b.version == version.version}
    for member in members:
        out.at = member.name
        if member.name in passed:
            out.skipped.append(member.name)
            continue
        t0, at = time.monotonic(), time.time()
        try:
            n = max(1, min(devices, member.device_count()))
            end = member.run(smoke_spec(version, n), timeout_s=timeout_s)
        except DeskpodError as e:  # the member refused the job, or stopped answering
            build = MemberBuild(name=name, version=version.version, hash=version.hash, member=member.name,
                                outcome="failed", step="start", reason=str(e), log_tail="", job=None,
                                seconds=time.monotonic() - t0, at=at)  # fmt: skip
        else:
            build = judge(version, member.name, end, time.monotonic() - t0, at)
        store.record(build)
        out.results.append(build)
        if build.outcome != "passed":
            out.state, out.finished = "failed", time.time()
            return out
    out.state, out.at, out.finished = "passed", None, time.time()
    return out


class Rollouts:
    """The fleet's rollouts, each on a thread of its own (a rollout takes minutes; the API answers at once):
    at most one per stack at a time."""

    def __init__(self, store: StackStore, members: Callable[[str], Sequence[MemberLink]]) -> None:
        """``members(user)``: the fleet's members, in rollout order, reached as fleet user ``user``."""
        self.store, self.members = store, members
        self._lock = threading.Lock()
        self._by_name: dict[str, Rollout] = {}
        self._threads: list[threading.Thread] = []

    def start(self, name: str, user: str, *, devices: int = SMOKE_DEVICES,
              timeout_s: float = SMOKE_TIMEOUT_S) -> Rollout:  # fmt: skip
        """Start rolling ``name``'s current version out, as fleet user ``user`` (an admin); `ConflictError` while one
        of ``name`` runs, `NotFoundError` for an unknown stack."""
        version = self.store.current(name)
        assert version is not None
        with self._lock:
            running = self._by_name.get(name)
            if running is not None and running.state == "running":
                raise ConflictError(f"a rollout of {name} v{running.version} is under way ({running.message});"
                                    " wait for it: deskpod fleet stack status")  # fmt: skip
            links = list(self.members(user))
            if not links:
                raise ConflictError("the fleet has no members to roll out to; add one: deskpod fleet add NAME URL")
            rollout = Rollout(name, version.version, [m.name for m in links])
            self._by_name[name] = rollout
        thread = threading.Thread(target=self._run, args=(rollout, links, devices, timeout_s),
                                  name=f"deskpod-rollout-{name}", daemon=True)  # fmt: skip
        self._threads.append(thread)
        thread.start()
        return rollout

    def _run(self, rollout: Rollout, links: list[MemberLink], devices: int, timeout_s: float) -> None:
        try:
            roll_out(self.store, rollout.name, links, devices=devices, timeout_s=timeout_s, progress=rollout)
        except Exception as e:  # whatever stops it is shown as its end, never as a thread's traceback
            rollout.state, rollout.error, rollout.finished = "error", f"{type(e).__name__}: {e}", time.time()

    def get(self, name: str) -> Rollout | None:
        """The latest rollout of ``name`` since the fleet started."""
        with self._lock:
            return self._by_name.get(name)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the rollouts under way (the fleet's shutdown, tests)."""
        for thread in list(self._threads):
            thread.join(timeout)
