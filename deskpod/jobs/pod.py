"""The pod: the daemon's engine that turns the store's queue into running processes and back.

One loop thread owns every process action (start, signal, reap) and every transition out of
``starting``/``running``; API threads only insert jobs, cancel queued ones, and mark running ones
for stopping, each as one store transaction. So a job is started by one thread at a time, and a
cancel racing a start is settled by the store (`Store.transition` with ``expect``).

``recover`` runs once before the loop: jobs the previous daemon left ``starting``/``running`` are
re-adopted when their process (same pid, same start time) lives, finished with the exit code their
shim recorded when it ended meanwhile, and marked ``lost`` (and retried per their spec) otherwise.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deskpod.environment import Environment
from deskpod.envs.limits import LimitSettings
from deskpod.envs.userfiles import read_path, scandir_path, stat_path
from deskpod.errors import AccessError, ConfigError, ConflictError, NotFoundError, UsageError, require_extra
from deskpod.hardware.placement import Placement, Unplaceable
from deskpod.hardware.topology import Topology
from deskpod.jobs import supervisor as sv
from deskpod.jobs.confinement import Confinement
from deskpod.jobs.executor import Executor
from deskpod.jobs.forecast import Forecast, forecast
from deskpod.jobs.isolation import Isolation, Prepared, box_environment
from deskpod.jobs.scheduler import Running, Waiting, WaitingCache, schedule
from deskpod.jobs.spec import JobSpec, parse_spec
from deskpod.jobs.states import FINAL, REQUEUABLE, JobState
from deskpod.jobs.store import JobRecord, Store, User, job_number

S = JobState
ACTIVE = (S.STARTING, S.BUILDING, S.RUNNING)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodConfig:
    """How one pod service runs; ``deskpod up`` flags map onto it."""

    home: Path
    """State, logs and job folders (``DESKPOD_HOME``)."""
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

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port}: expected 0-65535")
        if not 0 <= self.grace_s <= 3600:
            raise ConfigError(f"--grace {self.grace_s}: expected seconds from 0 to 3600")
        if not -1000 <= self.priority_limit <= 1000:
            raise ConfigError(f"--priority-limit {self.priority_limit}: expected -1000 to 1000")
        if not (self.job_disk in ("default", None) or (isinstance(self.job_disk, int) and self.job_disk > 0)):
            raise ConfigError(f"--job-disk {self.job_disk!r}: expected 'default', 'none' or a size like 200G")


class Pod:
    """Queue, scheduler and supervisor of one box."""

    def __init__(
        self,
        config: PodConfig,
        store: Store,
        *,
        device_count: int,
        device_kind: str,
        place: Callable[[Sequence[int], int, str], Placement | Unplaceable],
        clock: Callable[[], float] = time.time,
        topology: Topology | None = None,
        executor: Executor | None = None,
        isolation: Isolation | None = None,
        confinement: Confinement | None = None,
    ) -> None:
        self.config, self.store, self.device_count, self.device_kind = config, store, device_count, device_kind
        self.place, self.clock = place, clock
        self.topology = topology
        """The box's topology as the scheduler sees it (the dashboard draws it); None in unit tests."""
        self.executor = executor
        """Who runs the jobs when not this box (see `deskpod.jobs.executor`); None: this box does."""
        self.isolation = isolation
        """Accounts, environments and sandboxes of job processes (`deskpod.jobs.isolation`); None: the
        daemon's own account and Python, no walls (a pod in a unit test)."""
        self.accounts = isolation.accounts if isolation is not None else None
        self.confinement = confinement
        """Each job's cgroup and disk limit (`deskpod.jobs.confinement`); None: jobs run without limits."""
        self.sup = sv.Supervisor()
        # The daemon's own CUDA_VISIBLE_DEVICES: device i of its topology is entry i of that list.
        self._visible = Environment.read().cuda_visible_devices
        self._wake = threading.Event()
        self._waiting = WaitingCache()
        self._stop = threading.Event()
        self.stopping = threading.Event()
        """Set when the service begins to shut down: long-lived answers (live page streams) end then."""
        self._dirty = True
        self._last_pass = 0.0
        self._thread: threading.Thread | None = None

    # API side --------------------------------------------------------------------------------
    def submit(self, user: User, data: object) -> JobRecord:
        """Validate, refuse what can never fit this box, record as queued, wake the loop."""
        if self.executor is not None:
            spec = parse_spec(data)
            self._check_priority(user, spec)
            self.executor.check(spec)
            job = self.store.submit(user.name, spec, int(spec.devices) if str(spec.devices).isdigit() else 0,
                                    self.clock())  # fmt: skip
            self.wake()
            return job
        spec = parse_spec(data, device_count=self.device_count)
        self._check_priority(user, spec)
        # What follows refuses valid specs that this box cannot take: a conflict with its state (409), not bad input
        if spec.serve is not None:
            require_extra("serve", "job spec: a serve job", ConflictError)
        if spec.nodes > 1:
            raise ConflictError(
                f"job spec: nodes = {spec.nodes} needs a cluster: this pod runs jobs on one box; start it with "
                "deskpod up --backend slurm, or submit with deskpod submit --cluster slurm"
            )
        k = int(spec.devices)
        if self.isolation is not None:
            try:  # paths in the spec are opened with the user's own rights there
                self.isolation.check(spec, user)  # a user without an account to run as is refused now, not at start
            except ConfigError as e:  # the interpreter, container runtime or account this box lacks
                raise ConflictError(str(e)) from None
        else:
            if spec.environment is not None:
                raise ConflictError("job spec: environment: this pod runs jobs in its own Python only")
            if spec.workdir is not None and not Path(spec.workdir).is_dir():
                raise ConflictError(f"job spec: workdir {spec.workdir!r} is not a directory on this box")
            if spec.serve is not None:
                _check_servable(Path(spec.serve["run"]))
        what = "GPU" if self.device_kind == "cuda" else "CPU worker slot"
        if k > self.device_count:
            raise ConflictError(f"job can never fit: it needs {k} devices and this box has {self.device_count} {what}s")
        try:
            got = self.place(range(self.device_count), k, spec.placement)
        except UsageError as e:  # a placement naming what this machine lacks (a partition of another box)
            raise ConflictError(f"job spec: placement {spec.placement!r}: {e}") from None
        if isinstance(got, Unplaceable) and not got.ever:
            raise ConflictError(f"job can never fit this box: {got.reason}")
        job = self.store.submit(user.name, spec, k, self.clock())
        self.wake()
        return job

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
                if self.executor is not None and job.external:
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
        self._dirty = True
        self._wake.set()

    # loop ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.recover()
        self._thread = threading.Thread(target=self._run, name="deskpod-pod", daemon=True)
        self._thread.start()

    def close(self, *, stop_jobs: bool = False) -> None:
        """Stop the loop. Jobs keep running (the next daemon adopts them) unless ``stop_jobs``."""
        self.stopping.set()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if stop_jobs:
            self._stop_everything()
        self.sup.release()
        if self.confinement is not None:
            self.confinement.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception:  # one bad tick must not end the service; the traceback goes to the daemon log
                traceback.print_exc(file=sys.stderr)

    def tick(self) -> None:
        if self.executor is not None:
            self.executor.tick(self)
            return
        now = self.clock()
        for job in self.store.jobs(states=ACTIVE):
            self._watch(job, now)
        if not self._stop.is_set() and (self._dirty or now - self._last_pass > 1.0):
            self._dirty = False
            self._last_pass = now
            self._schedule(now)

    def _files(self, job: JobRecord) -> sv.Attempt:
        return sv.Attempt(self.job_folder(job))

    def job_folder(self, job: JobRecord) -> Path:
        """The job's own folder: its output log, exit codes, and for train jobs its run folder."""
        return self.config.home / "jobs" / str(job.id)

    def run_dir(self, job: JobRecord) -> Path | None:
        """The run folder a train job writes (``runs/<name>/`` in its job folder), or a command job that made
        one there (``deskpod run`` does, from ``DESKPOD_JOB_DIR``); None otherwise."""
        folder = self.job_folder(job) / "runs" / job.spec.name
        if job.spec.train is not None or (job.spec.serve is None and stat_path(folder / "run.json") is not None):
            return folder
        return None

    def _watch(self, job: JobRecord, now: float) -> None:
        pid = job.pid
        if pid is None:
            return
        files = self._files(job)
        done, code = self.sup.finished(pid, job.pid_start, files.exit_file(job.attempt))
        if job.state is S.BUILDING and files.phase(job.attempt) == "running":
            self._built(job, now)
            job = self.store.job(job.id) or job
        if done:
            self._finish(job, code, now)
            return
        limit = job.max_runtime
        if (
            job.stop_reason is None
            and limit is not None
            and job.started_at is not None
            and now > job.started_at + limit
        ):
            self.store.update(job.id, expect=ACTIVE, stop_reason="timeout", reason=f"exceeded max_runtime {limit:g} s")
            job = self.store.job(job.id) or job
        if job.stop_reason is None and self.confinement is not None:
            over = self.confinement.over_disk(job.id, files.folder, now)
            if over is not None:
                self.store.update(job.id, expect=ACTIVE, stop_reason="limit", reason=over)
                job = self.store.job(job.id) or job
        if job.stop_reason is not None:
            if job.stop_deadline is None:
                sv.signal_group(pid, job.pid_start, signal.SIGTERM)
                self.store.update(job.id, stop_deadline=now + self.config.grace_s)
            elif now >= job.stop_deadline:
                sv.signal_group(pid, job.pid_start, signal.SIGKILL)

    def _built(self, job: JobRecord, now: float) -> None:
        """A job's environment is ready and its own command started: ``building`` -> ``running``."""
        took = now - (job.started_at or now)
        moved = self.store.transition(job.id, S.RUNNING, f"environment ready after {took:.1f} s; running",
                                      expect=[S.BUILDING], started_at=now)  # fmt: skip
        if moved and self.isolation is not None and self.config.env_cache_limit is not None:
            self.isolation.prune_soon(self.config.env_cache_limit)

    def _finish(self, job: JobRecord, code: int | None, now: float) -> None:
        """Record how a job's process ended and decide: done, requeued, or retried."""
        if job.pid is not None:
            sv.kill_leftovers(job.pid, job.pid_start)  # nothing of a job outlives it
        problems = self.confinement.finish(job.id) if self.confinement is not None else []  # its cgroup too
        if problems:
            self._tell(job, problems)
        also = "".join(f"; {p}" for p in problems)  # what its limits did, in every ending's note
        if job.state is S.BUILDING and code == 0:  # its command ran and ended before the loop saw it start
            self._built(job, now)
            job = self.store.job(job.id) or job
        base: dict[str, Any] = {
            "exit_code": code,
            "finished_at": now,
            "stop_reason": None,
            "stop_deadline": None,
            "assigned": "",
        }
        why = job.stop_reason
        # A job asked to stop ends as the request said, whatever its exit code: a server that exits 0 on
        # SIGTERM was still cancelled (or preempted), not done.
        if code == 0 and why is None:
            self.store.transition(job.id, S.SUCCEEDED, f"exit code 0{also}", reason="", **base)
        elif why == "cancel":
            self.store.transition(
                job.id, S.CANCELLED, f"cancelled (exit code {code}){also}", reason="cancelled", **base
            )
        elif why in ("preempt", "shutdown", "requeue"):
            note = {"preempt": "preempted", "shutdown": "stopped with the daemon", "requeue": "stopped to be requeued"}[
                why
            ]
            self.store.transition(job.id, S.PREEMPTED, f"{note} (exit code {code}){also}", **base)
            self.store.transition(job.id, S.QUEUED, "requeued", reason=f"{note}; requeued", pid=None)
        else:
            if why == "timeout":
                new, note = S.FAILED, f"exceeded max_runtime {job.max_runtime:g} s (exit code {code})"
            elif why == "limit":
                new, note = S.FAILED, f"stopped: {job.reason} (exit code {code})"
            elif code is None:
                new, note = S.LOST, "process gone without an exit code"
            elif self._files(job).phase(job.attempt) == "build-failed":
                new, note = S.FAILED, f"environment build failed: {build_error(self._files(job).log)}"
            else:
                new, note = S.FAILED, f"exit code {code}"
            note += also
            self.store.transition(job.id, new, note, reason=note, failures=job.failures + 1, **base)
            if job.failures < job.retries:
                self.store.transition(
                    job.id,
                    S.QUEUED,
                    f"retry {job.failures + 1} of {job.retries}",
                    reason=f"retrying after {note}",
                    pid=None,
                )
        self._dirty = True

    def _tell(self, job: JobRecord, lines: Sequence[str]) -> None:
        """Add the pod's own lines to the end of a job's log (what its limits did to it)."""
        try:
            folder = os.lstat(self._files(job).folder)  # the log is its account's: opened as no one else's
            with sv.open_log(self._files(job).log, (folder.st_uid, folder.st_gid)) as log:
                log.write("".join(f"deskpod: {line}\n" for line in lines).encode())
        except OSError:
            pass

    def _running(self, now: float) -> list[Running]:
        """The active jobs as the scheduler sees them (a stopping job frees its devices by its deadline)."""
        return [
            Running(
                j.id, j.priority, j.assigned, j.started_at or now, j.max_runtime,
                (j.stop_deadline or now + self.config.grace_s) if j.stop_reason else None,
            )
            for j in self.store.jobs(states=ACTIVE)
        ]  # fmt: skip

    def forecast(self, now: float | None = None) -> Forecast:
        """Every queued job's position and, for the front of the queue, its estimated start."""
        now = self.clock() if now is None else now
        waiting = [Waiting(q[0], q[1], q[2], q[3], q[4]) for q in self.store.queue()]
        if self.executor is not None:  # the executor's scheduler decides when; its reason says why not yet
            return Forecast({w.id: i + 1 for i, w in enumerate(waiting)}, {})
        return forecast(waiting, self._running(now), self.device_count, now)

    def _schedule(self, now: float) -> None:
        running = self._running(now)
        queued, changed = self.store.queue_delta()
        waiting = self._waiting.apply(queued, changed)
        if not waiting:
            return
        plan = schedule(waiting, running, self.device_count, self.place, now, preemption=self.config.preemption,
                        ordered=True)  # fmt: skip
        self.store.set_reasons({i: r for i, r in plan.waits.items() if (q := queued.get(i)) is None or q[5] != r})
        for victim in plan.preempt:
            self.store.update(victim, expect=ACTIVE, stop_reason="preempt", reason=f"preempted for job {plan.reserved}")
            self.store.note(victim, f"preemption requested for job {plan.reserved}")
            self._dirty = True
        for st in plan.starts:
            self._launch(st.job, st.devices, st.reason)

    def _launch(self, job_id: int, devices: tuple[int, ...], why: str) -> None:
        job = self.store.job(job_id)
        if job is None:
            return
        port, attempt = free_port(), job.attempt + 1
        shown = ",".join(map(str, devices))
        if not self.store.transition(
            job.id, S.STARTING, f"devices {shown}: {why}", expect=[S.QUEUED],
            attempt=attempt, assigned=shown, port=port, reason="", exit_code=None, stop_reason=None, stop_deadline=None,
        ):  # fmt: skip
            return  # cancelled meanwhile
        files = self._files(job)
        prep: Prepared | None = None
        try:
            if job.spec.refused is not None:
                raise ConfigError(f"its spec is no longer accepted ({job.spec.refused}); submit it again")
            argv = self._argv(job, files.folder)
            limits = self.confinement.limits(devices) if self.confinement is not None else None
            env = self._env(job, devices, port, pinned=limits is not None and limits.cpus is not None)
            if self.isolation is not None:
                prep = self.isolation.prepare(
                    job.spec, self.store.user(job.user), files.folder, argv, env, devices=devices,
                    gpus=self.device_kind == "cuda", phase_file=files.phase_file(attempt),
                )  # fmt: skip
            else:
                files.folder.mkdir(parents=True, exist_ok=True)
                cwd = job.spec.workdir or str(files.folder)
                prep = Prepared(
                    argv, {"env": env, "cwd": cwd, "phase": str(files.phase_file(attempt))}, [], None, False
                )
            with sv.open_log(files.log, prep.owner) as log:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.clock()))
                log.write(f"--- deskpod: job {job.id} attempt {attempt} on devices {shown} at {stamp} ---\n".encode())
            confine, limit_notes = self.confinement.start(job.id, limits) if self.confinement is not None else ([], [])
            pid, started = self.sup.spawn(
                prep.argv, plan=prep.plan, files=files, attempt=attempt, options=[*confine, *prep.options],
                owner=prep.owner, pass_fds=prep.fds,
            )  # fmt: skip
        except Exception as e:  # whatever stops the start, the job must not stay "starting"
            if prep is not None:
                prep.close()
            self.store.transition(
                job.id,
                S.FAILED,
                f"cannot start: {e}",
                reason=f"cannot start: {e}",
                finished_at=self.clock(),
                assigned="",
            )
            return
        prep.close()
        for note in [*prep.notes, *limit_notes]:
            self.store.note(job.id, note)
        new = S.BUILDING if prep.building else S.RUNNING
        self.store.transition(
            job.id, new, f"pid {pid}", expect=[S.STARTING], pid=pid, pid_start=started, started_at=self.clock()
        )

    def _argv(self, job: JobRecord, folder: Path) -> list[str]:
        spec: JobSpec = job.spec
        if spec.serve is not None:
            return serve_argv(spec.serve, folder)
        if spec.train is None:
            return list(spec.command)
        import tomli_w

        from deskpod.envs.userfiles import write_no_follow

        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "train.toml"
        write_no_follow(config, tomli_w.dumps(dict(spec.train)).encode())  # the folder may be the job user's
        out = folder / "runs"  # run_dir() names the same folder
        argv = [
            sys.executable,
            "-m",
            "deskpod",
            "train",
            "--config",
            str(config),
            "--out",
            str(out),
            "--name",
            spec.name,
        ]
        argv += ["--devices", "all"]
        if any(e.name.endswith(".pt") for e in scandir_path(out / spec.name / "checkpoints")):  # no link followed
            argv.append("--resume")
        return argv

    def _env(self, job: JobRecord, devices: tuple[int, ...], port: int, *, pinned: bool = False) -> dict[str, str]:
        """The job's environment variables: the box's (`box_environment`, never the rest of the admin's), the
        spec's ``[env]``, then the pod's own (devices, rendezvous, the job's id and folder). A job ``pinned`` to
        its slots' cores sees only those, and counts its slots from 0."""
        env = box_environment(os.environ)
        env.update(job.spec.env)
        listed = ",".join(map(str, devices))
        env.update({"DESKPOD_JOB_ID": str(job.id), "DESKPOD_JOB_DIR": str(self.job_folder(job)),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # fmt: skip
        if self.device_kind == "cuda":
            vis = self._visible
            env["CUDA_VISIBLE_DEVICES"] = listed if vis is None else ",".join(vis[d] for d in devices if d < len(vis))
            env.pop("DESKPOD_CPU_SLOTS", None)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["DESKPOD_CPU_SLOTS"] = ",".join(map(str, range(len(devices)))) if pinned else listed
        return env

    # recovery and shutdown ------------------------------------------------------------------
    def recover(self) -> None:
        """Re-adopt, finish or requeue what a previous daemon left active (see module docstring)."""
        if self.executor is not None:  # its jobs live on in its scheduler; the next tick follows them again
            return
        now = self.clock()
        for job in self.store.jobs(states=ACTIVE):
            files = self._files(job)
            pid, started = job.pid, job.pid_start
            if pid is None:
                pid = sv.shim_of(files.pid_file(job.attempt), files.exit_file(job.attempt))
                started = sv.start_time(pid) if pid is not None else None
            if job.state is S.STARTING and pid is not None:
                new = S.BUILDING if files.phase(job.attempt) in ("building", "build-failed") else S.RUNNING
                self.store.transition(job.id, new, f"pid {pid} (started before the daemon stopped)",
                                      pid=pid, pid_start=started, started_at=now)  # fmt: skip
                job = self.store.job(job.id) or job
            code = sv.read_exit(files.exit_file(job.attempt))
            if code is not None:
                self._finish(job, code, now)
            elif pid is not None and sv.alive(pid, started):
                self.store.note(job.id, f"re-adopted pid {pid} after a daemon restart")
            elif job.state is S.STARTING and pid is None:
                self.store.transition(job.id, S.QUEUED, "daemon stopped before the job started", assigned="", reason="")
            else:
                self._finish(job, None, now)
        if self.confinement is not None:  # the cgroups of jobs that ended meanwhile go; the re-adopted keep theirs
            self.confinement.recover({j.id for j in self.store.jobs(states=ACTIVE)})

    def _stop_everything(self) -> None:
        """For ``deskpod down --stop-jobs``: SIGTERM every job, wait the grace, SIGKILL, requeue them."""
        if self.executor is not None:
            return  # a cluster's jobs are the cluster's: they run on without the pod service
        for job in self.store.jobs(states=ACTIVE):
            if job.stop_reason is None:
                self.store.update(job.id, stop_reason="shutdown")
        deadline = self.clock() + self.config.grace_s + 5.0
        while self.store.jobs(states=ACTIVE) and self.clock() < deadline:
            self.tick()
            time.sleep(0.05)

    def status(self) -> dict[str, Any]:
        holders: dict[int, JobRecord] = {}
        for j in self.store.jobs(states=ACTIVE):
            for d in j.assigned:
                holders[d] = j
        devices = []
        # A pod whose jobs run elsewhere (Slurm) holds no devices of this box.
        for d in range(0 if self.executor is not None else self.device_count):
            h = holders.get(d)
            devices.append({"index": d, "kind": self.device_kind, "job": None if h is None else str(h.id),
                            "user": None if h is None else h.user, "name": None if h is None else h.name})  # fmt: skip
        counts = self.store.counts()
        out = {
            "devices": devices,
            "queued": counts.get("queued", 0),
            "running": counts.get("running", 0) + counts.get("starting", 0) + counts.get("building", 0),
            "preemption": self.config.preemption,
            "grace_s": self.config.grace_s,
        }
        if self.executor is not None:
            out["backend"] = {"name": self.executor.name, **self.executor.status()}
        return out


def serve_argv(serve: dict[str, Any] | Any, folder: Path) -> list[str]:
    """``deskpod serve`` for a ``[serve]`` job: export the run into the job's own repository, serve it on a
    free loopback port (and gRPC on another, with ``grpc``), and write where it listens to ``serve.json`` in the
    job's folder."""
    s = serve
    return [
        sys.executable, "-m", "deskpod", "serve", str(folder / "models"),
        "--export", str(s["run"]), "--name", str(s["model"]), "--format", str(s["format"]),
        "--max-batch-size", str(s["max_batch_size"]), "--max-queue-delay-us", str(s["max_queue_delay_us"]),
        "--instances", str(s["instances"]), "--port", "0", "--port-file", str(folder / "serve.json"),
        *(["--image-input"] if s.get("image_input") else []), *(["--grpc-port", "0"] if s.get("grpc") else []),
    ]  # fmt: skip


def _check_servable(run: Path) -> None:
    from deskpod.train.runs import has_checkpoint

    if not run.is_dir():
        raise ConflictError(f"job spec: serve.run {str(run)!r} is not a run folder on this box")
    if not has_checkpoint(run):
        raise ConflictError(f"job spec: serve.run {str(run)!r} has no checkpoint yet; train it first (or wait for one)")


def build_error(log: Path) -> str:
    """The one line ``deskpod env build`` printed on failing (``deskpod: ...``), from the end of the job's log."""
    size = getattr(stat_path(log), "st_size", 0)
    try:  # the job's user may have put a link or a FIFO there
        tail = read_path(log, offset=max(0, size - 65536)).decode(errors="replace").splitlines()
    except OSError:
        tail = []
    said = [line[len("deskpod: ") :] for line in tail if line.startswith("deskpod: ")]
    return said[-1] if said else "see env-build.log in the job's folder"


def free_port() -> int:
    """A free TCP port on loopback for the job's rendezvous (``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
