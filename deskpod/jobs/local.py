"""The pod's default executor: jobs run on this box's devices, under the pod's own supervisor.

Every process action (start, signal, reap) happens in `LocalExecutor.tick`, on the pod's one loop thread, and so
does every transition out of ``starting``/``building``/``running``; a cancel racing a start is settled by the store
(`Store.transition` with ``expect``). A pass places queued jobs (`deskpod.jobs.scheduler.schedule`, preempting
lower-priority ones where the pod's policy allows), starts each under its shim (`deskpod.jobs.supervisor`) in its
sandbox (`deskpod.jobs.isolation`) and cgroup (`deskpod.jobs.confinement`), and ends it by its exit code and what
was asked of it: cancelled, requeued, preempted, timed out, over its disk limit.

`LocalExecutor.recover` runs once before the loop: jobs the previous daemon left ``starting``/``running`` are
re-adopted when their process (same pid, same start time) lives, finished with the exit code their shim recorded
when it ended meanwhile, and marked ``lost`` (and retried per their spec) otherwise.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from deskpod.environment import Environment
from deskpod.environment.network import free_port
from deskpod.errors import ConfigError, ConflictError, UsageError, require_extra
from deskpod.hardware.placement import Placement, Unplaceable
from deskpod.jobs import supervisor as sv
from deskpod.jobs.confinement import Confinement
from deskpod.jobs.executor import DeviceStatus, ExecutorStatus, PodSide
from deskpod.jobs.forecast import Forecast, forecast
from deskpod.jobs.isolation import Isolation, Prepared, box_environment
from deskpod.jobs.joblog import read_log
from deskpod.jobs.kinds import KINDS
from deskpod.jobs.pod import ACTIVE, PodConfig, build_error
from deskpod.jobs.scheduler import Running, Waiting, WaitingCache, schedule
from deskpod.jobs.spec import JobSpec
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord, User
from deskpod.processes import alive, start_time

S = JobState


class LocalExecutor:
    """Jobs of the pod, run on this box (see the module docstring)."""

    name = "local"

    def __init__(
        self,
        config: PodConfig,
        *,
        device_count: int,
        device_kind: str,
        place: Callable[[Sequence[int], int, str], Placement | Unplaceable],
        isolation: Isolation | None = None,
        confinement: Confinement | None = None,
    ) -> None:
        self.config, self.device_count, self.device_kind, self.place = config, device_count, device_kind, place
        self.isolation = isolation
        """Accounts, environments and sandboxes of job processes (`deskpod.jobs.isolation`); None: the
        daemon's own account and Python, no walls (a pod in a unit test)."""
        self.confinement = confinement
        """Each job's cgroup and disk limit (`deskpod.jobs.confinement`); None: jobs run without limits."""
        self.sup = sv.Supervisor()
        # The daemon's own CUDA_VISIBLE_DEVICES: device i of its topology is entry i of that list.
        self._visible = Environment.read().cuda_visible_devices
        self._waiting = WaitingCache()
        self._dirty = True
        self._last_pass = 0.0

    # Executor ------------------------------------------------------------------------------------
    def check(self, spec: JobSpec, user: User) -> int:
        """Refuse valid specs that this box cannot take: a conflict with its state (409), not bad input."""
        extra = KINDS[spec.kind].EXTRA
        if extra is not None:
            require_extra(extra, f"job spec: a {spec.kind} job", ConflictError)
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
            spec.check()
        what = "GPU" if self.device_kind == "cuda" else "CPU worker slot"
        if spec.device_kind is not None and spec.device_kind != self.device_kind:
            raise ConflictError(
                f"job spec: device_kind = {spec.device_kind!r}: this box's devices are {what}s "
                f"(device_kind = {self.device_kind!r})"
            )
        if k == 0:  # a kind that holds no devices (TensorBoard): nothing to place
            return k
        if k > self.device_count:
            raise ConflictError(f"job can never fit: it needs {k} devices and this box has {self.device_count} {what}s")
        try:
            got = self.place(range(self.device_count), k, spec.placement)
        except UsageError as e:  # a placement naming what this machine lacks (a partition of another box)
            raise ConflictError(f"job spec: placement {spec.placement!r}: {e}") from None
        if isinstance(got, Unplaceable) and not got.ever:
            raise ConflictError(f"job can never fit this box: {got.reason}")
        return k

    def tick(self, pod: PodSide, *, woken: bool) -> None:
        now = pod.clock()
        for job in pod.store.jobs(states=ACTIVE):
            self._watch(pod, job, now)
        self._give_back(pod, now)
        if woken or self._dirty or now - self._last_pass > 1.0:
            self._dirty = False
            self._last_pass = now
            self._schedule(pod, now)

    def cancel(self, pod: PodSide, job: JobRecord) -> None:
        """A queued job holds nothing here yet."""

    def forecast(self, pod: PodSide, waiting: Sequence[Waiting], now: float) -> Forecast:
        return forecast(waiting, self._running(pod, now), self.device_count, now)

    def log(self, pod: PodSide, job: JobRecord, offset: int, limit: int) -> bytes:
        return read_log(pod.job_folder(job), offset, limit)

    def status(self, pod: PodSide) -> ExecutorStatus:
        holders = {d: j for j in pod.store.jobs(states=ACTIVE) for d in j.assigned}
        devices: list[DeviceStatus] = []
        for d in range(self.device_count):
            h = holders.get(d)
            devices.append({"index": d, "kind": self.device_kind, "job": None if h is None else str(h.id),
                            "user": None if h is None else h.user, "name": None if h is None else h.name})  # fmt: skip
        return {"devices": devices}

    def recover(self, pod: PodSide) -> None:
        """Re-adopt, finish or requeue what a previous daemon left active (see module docstring)."""
        store, now = pod.store, pod.clock()
        for job in store.jobs(states=ACTIVE):
            files = self._files(pod, job)
            pid, started = job.pid, job.pid_start
            if pid is None:
                pid = sv.shim_of(files.pid_file(job.attempt), files.exit_file(job.attempt))
                started = start_time(pid) if pid is not None else None
            if job.state is S.STARTING and pid is not None:
                new = S.BUILDING if files.phase(job.attempt) in ("building", "build-failed") else S.RUNNING
                store.transition(job.id, new, f"pid {pid} (started before the daemon stopped)",
                                 pid=pid, pid_start=started, started_at=now)  # fmt: skip
                job = store.job(job.id) or job
            code = sv.read_exit(files.exit_file(job.attempt))
            if code is not None:
                self._finish(pod, job, code, now)
            elif pid is not None and alive(pid, started):
                store.note(job.id, f"re-adopted pid {pid} after a daemon restart")
            elif job.state is S.STARTING and pid is None:
                store.transition(job.id, S.QUEUED, "daemon stopped before the job started", assigned="", reason="")
            else:
                self._finish(pod, job, None, now)
        if self.confinement is not None:  # the cgroups of jobs that ended meanwhile go; the re-adopted keep theirs
            self.confinement.recover({j.id for j in store.jobs(states=ACTIVE)})

    def close(self, pod: PodSide, *, stop_jobs: bool) -> None:
        """Jobs keep running (the next daemon adopts them) unless ``stop_jobs``: then SIGTERM every job, wait the
        grace, SIGKILL, requeue them (``deskpod down --stop-jobs``)."""
        if stop_jobs:
            for job in pod.store.jobs(states=ACTIVE):
                if job.stop_reason is None:
                    pod.store.update(job.id, stop_reason="shutdown")
            deadline = pod.clock() + self.config.grace_s + 5.0
            while pod.store.jobs(states=ACTIVE) and pod.clock() < deadline:
                for job in pod.store.jobs(states=ACTIVE):
                    self._watch(pod, job, pod.clock())
                time.sleep(0.05)
        self.sup.release()
        if self.confinement is not None:
            self.confinement.close()

    # the steps --------------------------------------------------------------------------------------
    def _files(self, pod: PodSide, job: JobRecord) -> sv.Attempt:
        return sv.Attempt(pod.job_folder(job))

    def _watch(self, pod: PodSide, job: JobRecord, now: float) -> None:
        pid = job.pid
        if pid is None:
            return
        store = pod.store
        files = self._files(pod, job)
        done, code = self.sup.finished(pid, job.pid_start, files.exit_file(job.attempt))
        if job.state is S.BUILDING and files.phase(job.attempt) == "running":
            self._built(pod, job, now)
            job = store.job(job.id) or job
        if done:
            self._finish(pod, job, code, now)
            return
        limit = job.max_runtime
        late = limit is not None and job.started_at is not None and now > job.started_at + limit
        if job.stop_reason is None and late:
            store.update(job.id, expect=ACTIVE, stop_reason="timeout", reason=f"exceeded max_runtime {limit:g} s")
            job = store.job(job.id) or job
        if job.stop_reason is None and self.confinement is not None:
            over = self.confinement.over_disk(job.id, files.folder, now)
            if over is not None:
                store.update(job.id, expect=ACTIVE, stop_reason="limit", reason=over)
                job = store.job(job.id) or job
        if job.stop_reason is not None:
            if job.stop_deadline is None:
                sv.signal_group(pid, job.pid_start, signal.SIGTERM)
                store.update(job.id, stop_deadline=now + self.config.grace_s)
            elif now >= job.stop_deadline:
                sv.signal_group(pid, job.pid_start, signal.SIGKILL)

    def _built(self, pod: PodSide, job: JobRecord, now: float) -> None:
        """A job's environment is ready and its own command started: ``building`` -> ``running``."""
        took = now - (job.started_at or now)
        moved = pod.store.transition(job.id, S.RUNNING, f"environment ready after {took:.1f} s; running",
                                     expect=[S.BUILDING], started_at=now)  # fmt: skip
        if moved and self.isolation is not None and self.config.env_cache_limit is not None:
            self.isolation.prune_soon(self.config.env_cache_limit)

    def _finish(self, pod: PodSide, job: JobRecord, code: int | None, now: float) -> None:
        """Record how a job's process ended and decide: done, requeued, or retried."""
        store = pod.store
        if job.pid is not None:
            sv.kill_leftovers(job.pid, job.pid_start)  # nothing of a job outlives it
        problems = self.confinement.finish(job.id) if self.confinement is not None else []  # its cgroup too
        if problems:
            self._tell(pod, job, problems)
        also = "".join(f"; {p}" for p in problems)  # what its limits did, in every ending's note
        if job.state is S.BUILDING and code == 0:  # its command ran and ended before the loop saw it start
            self._built(pod, job, now)
            job = store.job(job.id) or job
        base: dict[str, Any] = {"exit_code": code, "finished_at": now, "stop_reason": None, "stop_deadline": None,
                                "assigned": "", "released": "", "wanted_at": None}  # fmt: skip
        why = job.stop_reason
        # A job asked to stop ends as the request said, whatever its exit code: a server that exits 0 on
        # SIGTERM was still cancelled (or preempted), not done.
        if code == 0 and why is None:
            store.transition(job.id, S.SUCCEEDED, f"exit code 0{also}", reason="", **base)
        elif why == "cancel":
            store.transition(job.id, S.CANCELLED, f"cancelled (exit code {code}){also}", reason="cancelled", **base)
        elif why in ("preempt", "shutdown", "requeue"):
            note = {"preempt": "preempted", "shutdown": "stopped with the daemon"}.get(why, "stopped to be requeued")
            store.transition(job.id, S.PREEMPTED, f"{note} (exit code {code}){also}", **base)
            store.transition(job.id, S.QUEUED, "requeued", reason=f"{note}; requeued", pid=None)
        else:
            if why == "timeout":
                new, note = S.FAILED, f"exceeded max_runtime {job.max_runtime:g} s (exit code {code})"
            elif why == "limit":
                new, note = S.FAILED, f"stopped: {job.reason} (exit code {code})"
            elif code is None:
                new, note = S.LOST, "process gone without an exit code"
            elif self._files(pod, job).phase(job.attempt) == "build-failed":
                new, note = S.FAILED, f"environment build failed: {build_error(self._files(pod, job).log)}"
            else:
                new, note = S.FAILED, f"exit code {code}"
            note += also
            store.transition(job.id, new, note, reason=note, failures=job.failures + 1, **base)
            if job.failures < job.retries:
                store.transition(job.id, S.QUEUED, f"retry {job.failures + 1} of {job.retries}",
                                 reason=f"retrying after {note}", pid=None)  # fmt: skip
        self._dirty = True

    def _tell(self, pod: PodSide, job: JobRecord, lines: Sequence[str]) -> None:
        """Add the pod's own lines to the end of a job's log (what its limits did to it)."""
        files = self._files(pod, job)
        try:
            folder = os.lstat(files.folder)  # the log is its account's: opened as no one else's
            with sv.open_log(files.log, (folder.st_uid, folder.st_gid)) as log:
                log.write("".join(f"deskpod: {line}\n" for line in lines).encode())
        except OSError:
            pass

    def _give_back(self, pod: PodSide, now: float) -> None:
        """A released session that asked for its devices again gets them once none is held: the same devices, which
        its sandbox was made for (`deskpod.jobs.culler`)."""
        active = pod.store.jobs(states=ACTIVE)
        held = {d for j in active for d in j.assigned}
        for j in active:
            if not j.released or j.wanted_at is None or held & set(j.released):
                continue
            off = j.released_s + (now - j.released_at if j.released_at is not None else 0.0)
            if pod.store.update(j.id, expect=[S.RUNNING], assigned=",".join(map(str, j.released)), released="",
                                released_at=None, released_s=off, wanted_at=None, reason=""):  # fmt: skip
                held |= set(j.released)
                pod.store.note(j.id, f"devices {','.join(map(str, j.released))} given back after "
                                     f"{now - j.wanted_at:.1f} s waiting")  # fmt: skip
                self._dirty = True

    def _running(self, pod: PodSide, now: float) -> list[Running]:
        """The active jobs as the scheduler sees them (a stopping job frees its devices by its deadline; a released
        session that wants its devices back holds them for the scheduler, so no queued job takes them)."""
        return [
            Running(
                j.id, j.priority, j.assigned or (j.released if j.wanted_at is not None else ()), j.started_at or now,
                j.max_runtime,
                (j.stop_deadline or now + self.config.grace_s) if j.stop_reason else None,
            )
            for j in pod.store.jobs(states=ACTIVE)
        ]  # fmt: skip

    def _schedule(self, pod: PodSide, now: float) -> None:
        store = pod.store
        running = self._running(pod, now)
        queued, changed = store.queue_delta()
        waiting = self._waiting.apply(queued, changed)
        if not waiting:
            return
        plan = schedule(waiting, running, self.device_count, self.place, now, preemption=self.config.preemption,
                        ordered=True)  # fmt: skip
        store.set_reasons({i: r for i, r in plan.waits.items() if (q := queued.get(i)) is None or q[5] != r})
        for victim in plan.preempt:
            store.update(victim, expect=ACTIVE, stop_reason="preempt", reason=f"preempted for job {plan.reserved}")
            store.note(victim, f"preemption requested for job {plan.reserved}")
            self._dirty = True
        for st in plan.starts:
            self.launch(pod, st.job, st.devices, st.reason)

    def launch(self, pod: PodSide, job_id: int, devices: tuple[int, ...], why: str) -> None:
        """Start a queued job on ``devices``; whatever stops the start fails the job (it never stays starting)."""
        store = pod.store
        job = store.job(job_id)
        if job is None:
            return
        port, attempt = free_port(), job.attempt + 1
        shown = ",".join(map(str, devices))
        if not store.transition(
            job.id, S.STARTING, f"devices {shown or 'none'}: {why}", expect=[S.QUEUED],
            attempt=attempt, assigned=shown, port=port, reason="", exit_code=None, stop_reason=None, stop_deadline=None,
            released="", released_at=None, released_s=0.0, wanted_at=None, busy_s=0.0,
        ):  # fmt: skip
            return  # cancelled meanwhile
        files = self._files(pod, job)
        prep: Prepared | None = None
        try:
            if job.spec.refused is not None:
                raise ConfigError(f"its spec is no longer accepted ({job.spec.refused}); submit it again")
            argv = job.spec.argv(files.folder)
            limits = self.confinement.limits(devices) if self.confinement is not None else None
            env = self._env(pod, job, devices, port, pinned=limits is not None and limits.cpus is not None)
            if self.isolation is not None:
                prep = self.isolation.prepare(
                    job.spec, store.user(job.user), files.folder, argv, env, devices=devices,
                    gpus=self.device_kind == "cuda", phase_file=files.phase_file(attempt),
                )  # fmt: skip
            else:
                files.folder.mkdir(parents=True, exist_ok=True)
                cwd = job.spec.workdir or str(files.folder)
                plan = {"env": env, "cwd": cwd, "phase": str(files.phase_file(attempt))}
                prep = Prepared(argv, plan, [], None, False)
            with sv.open_log(files.log, prep.owner) as log:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(pod.clock()))
                log.write(
                    f"--- deskpod: job {job.id} attempt {attempt} on devices {shown or 'none'} at {stamp} ---\n".encode()
                )
            confine, limit_notes = self.confinement.start(job.id, limits) if self.confinement is not None else ([], [])
            pid, started = self.sup.spawn(
                prep.argv, plan=prep.plan, files=files, attempt=attempt, options=[*confine, *prep.options],
                owner=prep.owner, pass_fds=prep.fds,
            )  # fmt: skip
        except Exception as e:  # whatever stops the start, the job must not stay "starting"
            if prep is not None:
                prep.close()
            store.transition(job.id, S.FAILED, f"cannot start: {e}", reason=f"cannot start: {e}",
                             finished_at=pod.clock(), assigned="")  # fmt: skip
            return
        prep.close()
        for note in [*prep.notes, *limit_notes]:
            store.note(job.id, note)
        new = S.BUILDING if prep.building else S.RUNNING
        store.transition(job.id, new, f"pid {pid}", expect=[S.STARTING], pid=pid, pid_start=started,
                         started_at=pod.clock())  # fmt: skip

    def _env(
        self, pod: PodSide, job: JobRecord, devices: tuple[int, ...], port: int, *, pinned: bool = False
    ) -> dict[str, str]:
        """The job's environment variables: the box's (`box_environment`, never the rest of the admin's), the
        spec's ``[env]``, then the pod's own (devices, rendezvous, the job's id and folder). A job ``pinned`` to
        its slots' cores sees only those, and counts its slots from 0."""
        env = box_environment(os.environ)
        env.update(job.spec.env)
        listed = ",".join(map(str, devices))
        env.update({"DESKPOD_JOB_ID": str(job.id), "DESKPOD_JOB_DIR": str(pod.job_folder(job)),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # fmt: skip
        if self.device_kind == "cuda":
            vis = self._visible
            env["CUDA_VISIBLE_DEVICES"] = listed if vis is None else ",".join(vis[d] for d in devices if d < len(vis))
            env.pop("DESKPOD_CPU_SLOTS", None)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["DESKPOD_CPU_SLOTS"] = ",".join(map(str, range(len(devices)))) if pinned else listed
        return env
