"""The pod service's second backend: ``deskpod up --backend slurm`` hands its jobs to Slurm.

The pod keeps what it has — queue, users, tokens, REST API, dashboard, the job's folder under
``DESKPOD_HOME/jobs/<id>/`` — and `SlurmExecutor` (a `deskpod.jobs.executor.Executor`) does the rest:

- a queued job is submitted at once (`deskpod.cluster.batch.submit_in`, from its own job folder) and its
  Slurm id kept in ``external``; Slurm's queue is then the queue, and the job's reason is Slurm's
  (``Slurm PENDING (Resources): waiting in Slurm's queue``);
- every tick reads all followed jobs with one ``scontrol show job`` and moves them through the pod's states
  by `deskpod.cluster.slurm.STATES`; a job Slurm requeued (after the time-limit warning, a lost step, a
  preemption) goes running → preempted → queued, and runs again as the next attempt;
- a cancel is ``scancel``; a requeue of a running job is ``scontrol requeue``; a requeue of an ended
  one submits it again from the same folder (its attempts numbering on);
- a session (a notebook) gets a secret in its folder before it is submitted; on its node it listens on the
  node's address with that secret and says where (`deskpod.jobs.kinds.session`), and the pod forwards to it;
- a controller that does not answer loses nothing: queued jobs stay queued with the reason, followed ones
  keep their last state, and the next tick tries again.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deskpod.cluster import slurm
from deskpod.cluster.batch import check_fits, submit_in
from deskpod.cluster.staging import StagedSources
from deskpod.errors import DeskpodError, UsageError
from deskpod.jobs.executor import BackendStatus, ExecutorStatus, PartitionStatus, PodSide
from deskpod.jobs.forecast import Forecast
from deskpod.jobs.joblog import read_log
from deskpod.jobs.kinds import KINDS
from deskpod.jobs.kinds.session import ENDPOINT, write_secret
from deskpod.jobs.scheduler import Waiting
from deskpod.jobs.spec import SLURM_DEFAULTS, JobSpec
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord, User

S = JobState
NODE_SESSIONS = ("notebook",)
"""The session kinds that listen on a cluster node's address (`deskpod.jobs.kinds.session.LISTEN_ENV`)."""
FOLLOWED = (S.QUEUED, S.STARTING, S.RUNNING)


class SlurmExecutor:
    """Jobs of the pod, run by Slurm."""

    name = "slurm"
    device_count = None  # devices = "all" is a whole node's, whichever Slurm picks

    def __init__(self, *, poll_s: float = 1.0, scratch: Path | None = None) -> None:
        self.poll_s = poll_s
        self.staged = StagedSources(Path(SLURM_DEFAULTS["scratch"]) if scratch is None else scratch)
        """The datasets staged in the default scratch folder (a job's ``slurm.scratch`` unless it names another),
        shown in the status so that a fleet sends a job to the cluster that already has its data."""
        self._last_poll = 0.0
        self._partitions: list[slurm.Partition] | None = None
        self.version = slurm.version()  # no Slurm, or no controller: `deskpod up` stops here with one line
        slurm.ping()

    def partitions(self) -> list[slurm.Partition]:
        if self._partitions is None:
            self._partitions = slurm.partitions()
        return self._partitions

    # Executor ------------------------------------------------------------------------------------
    def check(self, spec: JobSpec, user: User) -> int:
        if spec.serve is not None:
            raise UsageError("job spec: serve jobs run on the pod's own box; this pod hands its jobs to Slurm")
        if KINDS[spec.kind].SESSION and spec.kind not in NODE_SESSIONS:
            raise UsageError(f"job spec: {spec.kind} sessions run on the pod's own box; on this pod's Slurm backend: "
                             f"{', '.join(NODE_SESSIONS)}")  # fmt: skip
        check_fits(spec, self.partitions())
        return int(spec.devices) if str(spec.devices).isdigit() else 0

    def log(self, pod: PodSide, job: JobRecord, offset: int, limit: int) -> bytes:
        return read_log(pod.job_folder(job), offset, limit)

    def status(self, pod: PodSide) -> ExecutorStatus:
        parts: list[PartitionStatus] = [
            {"name": p.name, "nodes": p.nodes, "gpus_per_node": p.gpus_per_node, "default": p.default}
            for p in self.partitions()
        ]
        backend: BackendStatus = {"name": self.name, "slurm_version": str(self.version), "partitions": parts,
                                  "scratch": str(self.staged.scratch), "staged": self.staged.sources()}  # fmt: skip
        return {"devices": [], "backend": backend}

    def forecast(self, pod: PodSide, waiting: Sequence[Waiting], now: float) -> Forecast:
        """Positions only: Slurm's scheduler decides when; a job's reason says why not yet."""
        return Forecast({w.id: i + 1 for i, w in enumerate(waiting)}, {})

    def recover(self, pod: PodSide) -> None:
        """Nothing to take up: its jobs live on in Slurm's queue, and the next tick follows them again."""

    def close(self, pod: PodSide, *, stop_jobs: bool) -> None:
        """Nothing to stop: a cluster's jobs are the cluster's, and run on without the pod service."""

    def cancel(self, pod: PodSide, job: JobRecord) -> None:
        if job.external:
            try:
                slurm.cancel(job.external)
            except DeskpodError as e:
                pod.store.note(job.id, f"scancel {job.external} failed: {e}; the next tick tries again")

    def tick(self, pod: PodSide, *, woken: bool) -> None:
        now = time.time()
        store = pod.store
        for job in store.jobs(states=[S.QUEUED]):
            if job.external is None and (job.lease_holder is None or job.lease_confirmed):  # a fleet's: once confirmed
                self._hand_over(pod, job)
        if now - self._last_poll < self.poll_s:
            return
        self._last_poll = now
        followed = [j for j in store.jobs(states=FOLLOWED) if j.external]
        if not followed:
            return
        try:
            seen = {j.job_id: j for j in slurm.jobs([str(j.external) for j in followed])}
        except DeskpodError as e:
            for job in followed:
                if job.state is S.QUEUED and not job.reason.startswith("Slurm unreachable"):
                    store.update(job.id, reason=f"Slurm unreachable ({e}); retrying")
            return
        for job in followed:
            try:
                self._follow(pod, job, seen.get(str(job.external)))
            except Exception:  # one job's surprise must not stop the others being followed
                traceback.print_exc(file=sys.stderr)

    # the steps --------------------------------------------------------------------------------------
    def _hand_over(self, pod: PodSide, job: JobRecord) -> None:
        folder = pod.job_folder(job)
        try:
            if KINDS[job.spec.kind].SESSION:  # its server on the node asks for this; the pod adds it when forwarding
                folder.mkdir(parents=True, exist_ok=True)
                (folder / ENDPOINT).unlink(missing_ok=True)
                write_secret(folder)
            done = submit_in(job.spec, folder)
        except UsageError as e:  # refused by Slurm: the job can never run as it is
            pod.store.transition(job.id, S.STARTING, "handing over to Slurm", expect=[S.QUEUED])
            pod.store.transition(job.id, S.FAILED, f"Slurm refused it: {e}", reason=f"Slurm refused it: {e}",
                                 finished_at=time.time())  # fmt: skip
            return
        except DeskpodError as e:  # Slurm down: keep it queued and try again
            pod.store.update(job.id, expect=[S.QUEUED], reason=f"cannot reach Slurm ({e}); retrying")
            return
        if not pod.store.update(job.id, expect=[S.QUEUED], external=done.job_id,
                                reason=f"Slurm job {done.job_id}: submitted"):  # fmt: skip
            slurm.cancel(str(done.job_id))  # cancelled meanwhile
            return
        pod.store.note(job.id, f"submitted to Slurm as job {done.job_id}")
        self._last_poll = 0.0  # look at it on the next tick

    def _follow(self, pod: PodSide, job: JobRecord, seen: slurm.SlurmJob | None) -> None:
        store = pod.store
        ext = str(job.external)
        if job.stop_reason in ("cancel", "timeout", "shutdown") and job.stop_deadline is None:
            slurm.cancel(ext)
            store.update(job.id, stop_deadline=time.time())
        elif job.stop_reason in ("requeue", "preempt") and job.stop_deadline is None:
            slurm.requeue(ext)
            store.update(job.id, stop_deadline=time.time(), stop_reason=None)
            store.note(job.id, f"scontrol requeue {ext}")
        if seen is None:  # the controller forgot it (MinJobAge passed while the pod was down)
            self._end(pod, job, S.LOST, f"Slurm job {ext} is no longer known to the controller", None)
            return
        new = seen.deskpod_state
        text = f"Slurm job {ext}: {seen.describe()}"
        attempt = seen.restarts + 1
        if new is S.QUEUED:
            if job.state.active:  # Slurm requeued it
                store.transition(job.id, S.PREEMPTED, f"requeued by Slurm ({seen.reason or seen.state})",
                                 assigned="", stop_deadline=None)  # fmt: skip
                store.transition(job.id, S.QUEUED, f"waiting for attempt {attempt}", reason=text)
            elif job.reason != text:
                store.update(job.id, reason=text)
            return
        if new in (S.STARTING, S.RUNNING):
            if job.state is S.QUEUED:
                store.transition(job.id, S.STARTING, f"Slurm: {seen.state} on {seen.nodes}", expect=[S.QUEUED],
                                 attempt=attempt, reason="")  # fmt: skip
                job = store.job(job.id) or job
            if new is S.RUNNING and job.state is S.STARTING:
                store.transition(job.id, S.RUNNING, f"on {seen.nodes} (attempt {attempt})", reason=f"on {seen.nodes}",
                                 started_at=seen.start_time or time.time(), attempt=attempt)  # fmt: skip
            elif job.state is S.RUNNING and job.attempt != attempt:
                store.update(job.id, attempt=attempt)
            return
        code = seen.exit_code
        if new is S.CANCELLED and job.stop_reason not in (None, "cancel"):
            new = S.FAILED if job.stop_reason == "timeout" else new
        self._end(pod, job, new, f"{seen.describe()}{'' if code is None else f', exit code {code}'}", code)

    def _end(self, pod: PodSide, job: JobRecord, new: JobState, note: str, code: int | None) -> None:
        store = pod.store
        if job.state is S.QUEUED:
            store.transition(job.id, S.STARTING, "ended before the pod saw it run", expect=[S.QUEUED])
        fields: dict[str, Any] = {"exit_code": code, "finished_at": time.time(), "stop_reason": None,
                                  "stop_deadline": None, "assigned": ""}  # fmt: skip
        if new is S.SUCCEEDED:
            store.transition(job.id, new, note, reason="", **fields)
        elif new is S.PREEMPTED:  # preempted and not requeued by Slurm: the pod puts it back in the queue
            store.transition(job.id, new, note, **fields)
            store.transition(job.id, S.QUEUED, "resubmitting", reason=f"{note}; resubmitting", external=None)
        else:
            store.transition(job.id, new, note, reason=note, **fields)
