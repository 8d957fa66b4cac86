"""The pod: queue, store, users and API of one pod service; its executor runs the jobs.

API threads only insert jobs, cancel queued ones, and mark active ones for stopping, each as one store
transaction; one loop thread calls the executor's `deskpod.jobs.executor.Executor.tick`, which starts, follows
and ends the jobs (`deskpod.jobs.local` on this box, `deskpod.cluster.backend` on Slurm). So a job is moved by
one thread at a time, and a cancel racing a start is settled by the store (`Store.transition` with ``expect``).
Before the loop, the executor takes up what a previous daemon left active (`Executor.recover`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from deskpod import __version__
from deskpod.environment.sizes import duration_text
from deskpod.envs.limits import LimitSettings
from deskpod.envs.userfiles import read_path, stat_path
from deskpod.errors import AccessError, ConfigError, ConflictError, NotFoundError
from deskpod.hardware.placement import Placement, Unplaceable
from deskpod.hardware.topology import Topology
from deskpod.hardware.usage import UsageSampler
from deskpod.jobs.confinement import Confinement
from deskpod.jobs.culler import Culler, open_gpu_work
from deskpod.jobs.doctor import Doctor
from deskpod.jobs.executor import Executor
from deskpod.jobs.forecast import Forecast
from deskpod.jobs.isolation import Isolation
from deskpod.jobs.kinds import KINDS
from deskpod.jobs.scheduler import Waiting
from deskpod.jobs.spec import MAX_RUNTIME_S, JobSpec, parse_spec
from deskpod.jobs.states import FINAL, REQUEUABLE, JobState
from deskpod.jobs.store import JobRecord, Store, User, job_number
from deskpod.jobs.trust import Trust

S = JobState
ACTIVE = (S.STARTING, S.BUILDING, S.RUNNING)
WATCH_MAX_S = 10.0
"""The longest a fleet's watch (`Pod.watch`, ``POST /v1/leases/watch``) waits for a start."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodConfig:
    """How one pod service runs; ``deskpod up`` flags map onto it."""

    home: Path
    """State, logs and job folders (``DESKPOD_HOME``)."""
    name: str = field(default_factory=socket.gethostname)
    """The pod's name (``deskpod up --name``, default the host's): what a fleet's assertions for it name as their
    audience (`deskpod.jobs.trust`)."""
    host: str = "127.0.0.1"
    port: int = 8420
    preemption: bool = True
    """Whether a higher-priority job may stop lower-priority ones (the per-pod policy)."""
    grace_s: float = 10.0
    """Seconds between SIGTERM and SIGKILL when a job is stopped."""
    tick_s: float = 0.1
    """How often the loop looks at running processes when nothing wakes it."""
    machine: str | None = None
    """Schedule as if this box were this catalog machine (``deskpod up --machine dgx1-v100``); the jobs
    still run here and get the simulated device indices. For trying policies and for tests."""
    priority_limit: int = 0
    """The highest priority a user who is not an admin may give a job, so that nobody can preempt
    others at will (``deskpod up --priority-limit``)."""
    socket: Path | None = None
    """The Unix socket local users reach the pod on, identified by the kernel (default ``<home>/pod.sock``)."""
    sandbox: bool = True
    """Run each job in a bubblewrap sandbox (``deskpod up --no-sandbox`` is the admin's opt-out)."""
    allow_unsandboxed: bool = False
    """Where bubblewrap cannot run, start anyway and run jobs without walls (after a warning)."""
    unmapped_user: str | None = "nobody"
    """A root pod runs the jobs of users without an OS account of their own as this account."""
    env_cache: Path | None = None
    """Where job environments are built and kept (default ``<home>/envs``)."""
    env_cache_limit: int | None = None
    """Bytes the environment cache may hold; the least recently used are pruned after each build."""
    limits: LimitSettings = field(default_factory=LimitSettings)
    """Each job's cgroup: its cores, memory and tasks (`deskpod.envs.limits`; ``deskpod up --job-memory`` ...)."""
    job_disk: int | Literal["default"] | None = "default"
    """Bytes one job's folder may hold, and the largest file it may write (`deskpod.jobs.confinement`);
    ``default``: a quarter of the file system holding the home; None: no limit."""
    session_max_time: float = 12 * 3600.0
    """The longest a session (notebook, shell, TensorBoard) may run, extensions included, in seconds
    (``deskpod up --session-max-time``): a session asking for more is refused, and none is extended past it."""
    session_time: float = 4 * 3600.0
    """A session's time when it asks for none (``deskpod up --session-time``; at most `session_max_time`)."""
    idle_timeout: float | None = None
    """Seconds a notebook's devices and kernels may sit idle before its kernels are stopped and its devices go
    back to the queue (``deskpod up --idle-timeout``; `deskpod.jobs.culler`); None: never."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", self.name):
            raise ConfigError(f"--name {self.name!r:.80}: expected 1-64 letters, digits, '.', '_' or '-', e.g. box-a")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port}: expected 0-65535")
        if not 0 <= self.grace_s <= 3600:
            raise ConfigError(f"--grace {self.grace_s}: expected seconds from 0 to 3600")
        if not -1000 <= self.priority_limit <= 1000:
            raise ConfigError(f"--priority-limit {self.priority_limit}: expected -1000 to 1000")
        if not (self.job_disk in ("default", None) or (isinstance(self.job_disk, int) and self.job_disk > 0)):
            raise ConfigError(f"--job-disk {self.job_disk!r}: expected 'default', 'none' or a size like 200G")
        if not 0 < self.session_max_time <= MAX_RUNTIME_S:
            raise ConfigError(f"--session-max-time {self.session_max_time:g}: expected seconds above 0 and at most "
                              f"{MAX_RUNTIME_S:.0f}, e.g. 12h")  # fmt: skip
        if not 0 < self.session_time <= self.session_max_time:
            raise ConfigError(f"--session-time {duration_text(self.session_time)}: expected a time above 0 and at "
                              f"most --session-max-time ({duration_text(self.session_max_time)}), e.g. 4h")  # fmt: skip
        if self.idle_timeout is not None and not 0 < self.idle_timeout <= MAX_RUNTIME_S:
            raise ConfigError(f"--idle-timeout {self.idle_timeout:g}: expected seconds above 0, e.g. 1h, or 'off'")

    def to_json(self) -> dict[str, Any]:
        """Every setting, as ``GET /v1/status`` shows them (``settings``): what each ``deskpod up`` flag made of this
        pod (paths as strings, sizes in bytes, None where unset or unlimited)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


STACKS_ARE_A_FLEETS = (
    "stacks are a fleet's: submit to the fleet (deskpod submit --fleet), or give the job its own [environment]"
)


class StackResolver(Protocol):
    """What a pod that takes ``stack = NAME`` is handed (a fleet's stacks, `deskpod.fleet.stacks`)."""

    def resolve(self, spec: JobSpec) -> JobSpec:
        """The spec with its stack pinned to a version (``NAME@vN``) and that version's environment, as it is stored:
        a queued or running job keeps the version it was given. Raises `ConfigError` for an unknown stack."""
        ...


class Pod:
    """Queue, store, users and API of one pod; its executor runs the jobs (`deskpod.jobs.executor`)."""

    def __init__(
        self,
        config: PodConfig,
        store: Store,
        executor: Executor,
        *,
        device_count: int,
        device_kind: str,
        place: Callable[[Sequence[int], int, str], Placement | Unplaceable],
        clock: Callable[[], float] = time.time,
        topology: Topology | None = None,
        isolation: Isolation | None = None,
        confinement: Confinement | None = None,
        stacks: StackResolver | None = None,
        trust: Trust | None = None,
    ) -> None:
        self.config, self.store, self.executor, self.clock = config, store, executor, clock
        self.stacks = stacks
        """Resolves a spec's ``stack`` (a fleet); None: a spec naming a stack is refused."""
        self.trust = trust
        """The fleets whose assertions this pod accepts (`deskpod.jobs.trust`); None: none."""
        # This box as the API and the dashboard show it (its devices, placement, the walls of its jobs' processes);
        # the executor decides where jobs run.
        self.device_count, self.device_kind, self.place = device_count, device_kind, place
        self.topology = topology
        """The box's topology as the scheduler sees it (the dashboard draws it); None in unit tests."""
        self.isolation = isolation
        self.accounts = isolation.accounts if isolation is not None else None
        self.confinement = confinement
        self.doctor = Doctor(cluster=executor.name == "slurm")
        """This box's doctor (a cluster's, behind a Slurm login node), for ``GET /v1/doctor``."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.stopping = threading.Event()
        """Set when the service begins to shut down: long-lived answers (live page streams) end then."""
        self._thread: threading.Thread | None = None
        self._culler: Culler | None = None
        self._culler_thread: threading.Thread | None = None
        self._usage: UsageSampler | None = None

    # API side --------------------------------------------------------------------------------
    def submit(self, user: User, data: object, *, lease_s: float | None = None, key: str | None = None) -> JobRecord:
        """Validate, refuse what the executor can never run, record as queued, wake the loop. ``lease_s``: a job
        forwarded by a fleet starts here only while the fleet renews its lease (`renew`), first for these seconds.
        ``key``: the forward's idempotency key; such a job may start at once, and a second forward with the same key
        gets the same job (`deskpod.jobs.store.Store.forwarded`); without one it starts only once the fleet renewed
        its lease."""
        if user.fleet is not None and self.store.user(user.name) is None:
            raise AccessError(f"fleet {user.fleet} acting as itself submits no jobs; it forwards those of its users")
        if lease_s is not None and user.fleet is None:
            raise AccessError(
                "lease: only a fleet's forwarded jobs are held by a lease (this request has no assertion)"
            )
        if key is not None and (lease_s is None or user.fleet is None):
            raise AccessError(f"key {key!r:.40}: only a fleet's forward held by a lease (?lease=S) carries a key")
        spec = parse_spec(data, device_count=self.executor.device_count)
        if spec.stack is not None:
            if self.stacks is None:
                raise ConfigError(f"job spec: stack = {spec.stack!r}: {STACKS_ARE_A_FLEETS}")
            spec = self.stacks.resolve(spec)
        self._check_priority(user, spec)
        spec = self.session_time(spec)
        now = self.clock()
        lease = None if lease_s is None or user.fleet is None else (user.fleet, now + lease_s)
        devices = self.executor.check(spec, user)
        if key is None or lease is None:
            job = self.store.submit(user.name, spec, devices, now, lease)
        else:
            got = self.store.forwarded(user.name, spec, devices, now, lease, key)
            if got is None:
                raise ConflictError(
                    f"key {key!r:.40}: fleet {user.fleet} looked this forward up before it arrived and may have sent "
                    "the job elsewhere; it is not taken"
                )
            job, new = got
            if job.user != user.name:
                raise ConflictError(f"key {key!r:.40}: fleet {user.fleet} forwarded another user's job with it")
            if not new:
                return job
        self.wake()
        return job

    def lookup(self, user: User, keys: Sequence[str]) -> dict[str, JobRecord]:
        """A fleet that got no answer to forwards asks which of them arrived: the jobs it forwarded with these keys,
        by key. A key not found is closed here: a forward with it that arrives later is refused, so the fleet may
        send the job elsewhere at once (`deskpod.jobs.store.Store.lookup`)."""
        if user.fleet is None:
            raise AccessError(f"user {user.name!r}: only a fleet looks up the jobs it forwarded")
        return self.store.lookup(user.fleet, keys, self.clock())

    def renew(self, user: User, ids: Sequence[str], seconds: float) -> list[JobRecord]:
        """A fleet renews, for ``seconds`` from now, the leases it holds on these of its forwarded jobs (those still
        queued), and is told the state of each it holds (the others are left out: unknown here, or not its)."""
        if user.fleet is None:
            raise AccessError(f"user {user.name!r}: only a fleet renews leases (it holds the jobs it forwarded)")
        numbers = [n for n in (job_number(i) for i in ids) if n is not None]
        held = self.store.renew(user.fleet, numbers, self.clock() + seconds)
        if any(j.state is S.QUEUED for j in held):  # a first renewal confirms a forward: it may start now, not at the
            self.wake()  # executor's next pass (a second later)
        return held

    def watch(self, user: User, ids: Sequence[str], wait: float) -> list[JobRecord]:
        """A fleet waits, at most ``wait`` seconds, for one of these of its forwarded jobs that has not started yet
        (queued with its lease confirmed, starting, building) to run or end here, and is told the state of each it
        holds; nothing is renewed. So the fleet learns of a start when it happens, not at its next renewal."""
        if user.fleet is None:
            raise AccessError(f"user {user.name!r}: only a fleet watches the jobs it forwarded")
        numbers = [n for n in (job_number(i) for i in ids) if n is not None]
        deadline = time.monotonic() + wait
        first: set[int] | None = None
        """The jobs not started yet when the fleet asked: the answer comes once one of them moved on."""
        while True:
            version = self.store.version
            held = self.store.held(user.fleet, numbers)
            pending = {j.id for j in held if j.state in (S.STARTING, S.BUILDING) or (j.state is S.QUEUED
                                                                                     and j.lease_confirmed)}  # fmt: skip
            first = pending if first is None else first
            left = deadline - time.monotonic()
            if not first or first - pending or left <= 0:
                return held
            self.store.wait_written(first, version, left)

    def expire_leases(self) -> None:
        """Cancel, unstarted, every queued job whose fleet stopped renewing its lease: the fleet may have sent it
        elsewhere, and a job never runs twice."""
        now = self.clock()
        for job in self.store.expired_leases(now):
            why = (f"lease of {job.lease_holder} ran out unrenewed at "
                   f"{time.strftime('%H:%M:%S', time.localtime(job.lease_until))}: the fleet may run it elsewhere")  # fmt: skip
            if self.store.transition(job.id, S.CANCELLED, why, expect=[S.QUEUED], finished_at=now, reason=why):
                self.executor.cancel(self, job)

    def session_time(self, spec: JobSpec) -> JobSpec:
        """A session's spec with its time: the pod's default when it gives none; refused (`ConflictError`) beyond
        the pod's longest. Any other spec as it is."""
        if not KINDS[spec.kind].SESSION:
            return spec
        longest = self.config.session_max_time
        if spec.max_runtime is None:
            return dataclasses.replace(spec, max_runtime=self.config.session_time)
        if spec.max_runtime > longest:
            raise ConflictError(
                f"job spec: max_runtime = {duration_text(spec.max_runtime)} is beyond this pod's longest session, "
                f"{duration_text(longest)} (deskpod up --session-max-time); ask for at most {duration_text(longest)}"
            )
        return spec

    def extend(self, user: User, job_id: str, seconds: float) -> JobRecord:
        """Give the owner's queued or running session ``seconds`` more, never past the pod's longest session
        (`ConflictError` naming both); the time warning comes again before the new end."""
        job = self.visible_job(user, job_id)
        if job.user != user.name and not user.admin:
            raise NotFoundError(f"no job {job_id!r:.40} (job ids are numbers; `deskpod jobs` lists yours)")
        if not KINDS[job.spec.kind].SESSION:
            raise ConflictError(f"job {job.id} is a {job.spec.kind} job: only sessions are extended (notebook, "
                                "shell, tensorboard); a batch job's max_runtime is fixed when it is submitted")  # fmt: skip
        if not (seconds > 0 and seconds <= MAX_RUNTIME_S):
            raise ConfigError(f"--time {seconds:g}: expected seconds above 0, e.g. 2h")
        if not (job.state is S.QUEUED or job.state.active) or job.stop_reason is not None:
            raise ConflictError(f"session {job.id} is {'stopping' if job.stop_reason else job.state.value}: only a "
                                "queued or running session is extended")  # fmt: skip
        longest = self.config.session_max_time
        current = job.max_runtime if job.max_runtime is not None else self.config.session_time
        new = current + seconds
        if new > longest:
            room = max(0.0, longest - current)
            raise ConflictError(
                f"extend session {job.id} by {duration_text(seconds)}: it would run {duration_text(new)} in all, beyond "
                f"this pod's longest session, {duration_text(longest)} (deskpod up --session-max-time); "
                + (f"at most {duration_text(room)} more" if room >= 1 else "it has all the time it may have")
            )
        if not self.store.update(job.id, expect=[S.QUEUED, *ACTIVE], max_runtime=new):
            raise ConflictError(f"session {job.id} ended meanwhile; nothing was extended")
        end = (
            ""
            if job.started_at is None
            else f"; it now ends at {time.strftime('%H:%M:%S', time.localtime(job.started_at + new))}"
        )
        self.store.note(job.id, f"extended by {duration_text(seconds)} by {user.name}, to {duration_text(new)}{end}")
        self.wake()
        return self.store.job(job.id) or job

    def want_devices(self, job: JobRecord) -> JobRecord:
        """A released session asks for its devices again (a kernel is starting): the executor gives it the same
        devices once they are free, before any queued job (`deskpod.jobs.culler`). Returns the job as it is now."""
        if job.released and job.wanted_at is None:
            if self.store.update(job.id, expect=[S.RUNNING], wanted_at=self.clock()):
                self.store.note(job.id, f"asks for devices {','.join(map(str, job.released))} again (a kernel starts)")
            self.wake()
        return self.store.job(job.id) or job

    def _check_priority(self, user: User, spec: JobSpec) -> None:
        limit = self.config.priority_limit
        if spec.priority > limit and not user.admin:
            raise AccessError(
                f"job spec: priority = {spec.priority} is above this pod's limit for users ({limit}); only an admin "
                "may submit above it (the admin sets the limit: deskpod up --priority-limit N)"
            )

    def visible_job(self, user: User, job_id: str) -> JobRecord:
        """The job, if ``user`` may see it; another user's job looks like no job at all."""
        number = job_number(job_id)
        job = self.store.job(number) if number is not None else None
        if job is None or (job.user != user.name and not user.admin):
            raise NotFoundError(f"no job {job_id!r:.40} (job ids are numbers; `deskpod jobs` lists yours)")
        return job

    def cancel(self, user: User, job_id: str) -> JobRecord:
        """Cancel a queued job now, or ask the loop to stop an active one; a finished job is left as it is."""
        job = self.visible_job(user, job_id)
        for _ in range(5):  # the loop may move the job between our read and our write; read again
            if job.state is S.QUEUED and self.store.transition(
                job.id, S.CANCELLED, f"cancelled by {user.name}", expect=[S.QUEUED],
                finished_at=self.clock(), reason="cancelled",
            ):  # fmt: skip
                self.executor.cancel(self, job)
                break
            # A cancel outranks a preemption or a timeout: the job is not requeued.
            if job.state.active and self.store.update(
                job.id, expect=ACTIVE, stop_reason="cancel", reason=f"cancelling (asked by {user.name})"
            ):
                self.wake()
                break
            if job.state in (S.SUCCEEDED, S.CANCELLED) or (job.state in FINAL and job.failures > job.retries):
                break
            job = self.store.job(job.id) or job
        return self.store.job(job.id) or job

    def requeue(self, user: User, job_id: str) -> JobRecord:
        """Send a job back to the queue: an ended one (cancelled, failed, lost) at once, with its retries
        counted afresh; an active one is stopped first (SIGTERM, grace, SIGKILL). A ``train`` job resumes
        from its checkpoint. A job that succeeded is not run again (`ConflictError`): submit it anew.
        Returns the job as the requeue left it (read before the scheduler is woken, so that the answer does not
        depend on how fast the next pass starts it)."""
        job = self.visible_job(user, job_id)
        for _ in range(5):  # the loop may move the job between our read and our write; read again
            if job.state is S.QUEUED:
                return job
            if job.state in REQUEUABLE and self.store.transition(
                job.id, S.QUEUED, f"requeued by {user.name}", expect=[job.state],
                reason=f"requeued by {user.name}", failures=0, pid=None, external=None,
            ):  # fmt: skip
                break
            if job.state.active and self.store.update(
                job.id, expect=ACTIVE, stop_reason="requeue", reason=f"stopping to requeue (asked by {user.name})"
            ):
                break
            if job.state is S.SUCCEEDED:
                raise ConflictError(
                    f"job {job.id} succeeded; a finished job is not run again: submit its spec as a new job"
                )
            job = self.store.job(job.id) or job
        else:
            return self.store.job(job.id) or job
        after = self.store.job(job.id) or job
        self.wake()
        return after

    def wake(self) -> None:
        self._wake.set()

    # loop ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.executor.recover(self)
        self._thread = threading.Thread(target=self._run, name="deskpod-pod", daemon=True)
        self._thread.start()
        if self.executor.name == "local":  # sessions on this box: their time warnings and idle release
            self._culler = Culler(self, idle_timeout=self.config.idle_timeout, device_kind=self.device_kind,
                                  clock=self.clock, gpus=open_gpu_work() if self.device_kind == "cuda" else None)  # fmt: skip
            self._culler_thread = threading.Thread(target=self._culler.run, name="deskpod-culler", daemon=True)
            self._culler_thread.start()

    def close(self, *, stop_jobs: bool = False) -> None:
        """Stop the loop. Jobs keep running (the next daemon adopts them) unless ``stop_jobs``."""
        self.stopping.set()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if self._culler is not None and self._culler_thread is not None:
            self._culler.stop()
            self._culler_thread.join()
        self.executor.close(self, stop_jobs=stop_jobs)

    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self.config.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.expire_leases()
                self.executor.tick(self, woken=woken)
            except Exception:  # one bad tick must not end the service; the traceback goes to the daemon log
                traceback.print_exc(file=sys.stderr)

    def job_folder(self, job: JobRecord) -> Path:
        """The job's own folder: its output log, exit codes, and for train jobs its run folder."""
        return self.config.home / "jobs" / str(job.id)

    def run_dir(self, job: JobRecord) -> Path | None:
        """The run folder a train job writes (``runs/<name>/`` in its job folder), or a command job that made
        one there (``deskpod run`` does, from ``DESKPOD_JOB_DIR``); None otherwise."""
        folder = self.job_folder(job) / "runs" / job.spec.name
        if job.spec.train is not None or (job.spec.kind == "command" and stat_path(folder / "run.json") is not None):
            return folder
        return None

    def forecast(self, now: float | None = None) -> Forecast:
        """Every queued job's position and, where the executor can tell, its estimated start."""
        now = self.clock() if now is None else now
        return self.executor.forecast(self, [Waiting(q[0], q[1], q[2], q[3], q[4]) for q in self.store.queue()], now)

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``: the executor's devices (and backend), the queue, the policy."""
        n = self.store.counts()
        running = n.get("running", 0) + n.get("starting", 0) + n.get("building", 0)
        return {**self.executor.status(self), "queued": n.get("queued", 0), "running": running,
                "preemption": self.config.preemption, "grace_s": self.config.grace_s}  # fmt: skip

    def outlook(self) -> dict[str, Any]:
        """What a fleet routes by (``GET /v1/status`` has it beside `status`): this pod's name, its software, its
        topology (``nvidia-smi topo -m`` text) and what a job submitted now would find, as (seconds from now,
        devices free from then on) steps after the queue was played forward (`deskpod.jobs.forecast`)."""
        now = self.clock()
        profile = self.forecast(now).free
        topology = None
        if self.topology is not None:
            from deskpod.hardware.topo_matrix import format_topo_matrix

            t = self.topology
            uniform = t.kind != "cuda"
            topology = {"name": t.name, "devices": t.device_count, "matrix": None if uniform else
                        format_topo_matrix(t, legend=False), "partitions": [[p, [list(b) for b in bs]] for p, bs in
                        t.partitions]}  # fmt: skip
        return {"name": self.config.name, "software": software(), "topology": topology,
                "free": [[max(0.0, t - now), k] for t, k in profile], "usage": self.usage()}  # fmt: skip

    def usage(self) -> dict[str, float | None]:
        """This box's use now, in brief (`deskpod.hardware.usage`): mean GPU utilization and the share of GPU
        memory used (None without NVML), all cores' CPU utilization, the share of host memory used (percents), and
        the 1-minute load average."""
        if self._usage is None:
            self._usage = UsageSampler()
        u = self._usage.latest()
        utils = [g.utilization for g in u.gpus if g.utilization is not None]
        used = sum(g.memory_used or 0 for g in u.gpus)
        total = sum(g.memory_total or 0 for g in u.gpus if g.memory_used is not None)
        return {
            "gpu": round(sum(utils) / len(utils), 1) if utils else None,
            "gpu_memory": round(100 * used / total, 1) if total else None,
            "cpu": u.cpu,
            "memory": round(100 * u.memory_used / u.memory_total, 1) if u.memory_used and u.memory_total else None,
            "load": None if u.load is None else u.load[0],
        }


_SOFTWARE: dict[str, str | None] = {}


def software() -> dict[str, str | None]:
    """This box's stack, read once: deskpod, torch and the CUDA it was built for, the NVIDIA driver (None: none)."""
    if not _SOFTWARE:
        from deskpod.hardware.devices import driver_version

        try:
            torch = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            torch = None
        _SOFTWARE.update(deskpod=__version__, torch=torch, cuda=_torch_cuda(), driver=driver_version())
    return dict(_SOFTWARE)


def _torch_cuda() -> str | None:
    """The CUDA torch was built for, from its generated ``torch/version.py`` (importing torch takes seconds)."""
    found = importlib.util.find_spec("torch")
    for folder in (found.submodule_search_locations or []) if found is not None else []:
        try:
            text = (Path(folder) / "version.py").read_text()
        except OSError:
            continue
        m = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        return m.group(1) if m else None
    return None


def build_error(log: Path) -> str:
    """The one line ``deskpod env build`` printed on failing (``deskpod: ...``), from the end of the job's log."""
    size = getattr(stat_path(log), "st_size", 0)
    try:  # the job's user may have put a link or a FIFO there
        tail = read_path(log, offset=max(0, size - 65536)).decode(errors="replace").splitlines()
    except OSError:
        tail = []
    said = [line[len("deskpod: ") :] for line in tail if line.startswith("deskpod: ")]
    return said[-1] if said else "see env-build.log in the job's folder"
