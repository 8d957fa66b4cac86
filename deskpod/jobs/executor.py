"""Who runs the pod's jobs: the protocol every executor implements, and what it is given of the pod.

`deskpod.jobs.local.LocalExecutor` runs them on this box; ``deskpod up --backend slurm`` hands the pod
`deskpod.cluster.backend.SlurmExecutor` instead. Either moves each job through the states of `deskpod.jobs.states`,
writing every move to the pod's store (a job another scheduler holds keeps that scheduler's id in ``external``);
the pod calls `Executor.tick` from its one loop thread and never asks which executor it has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, Protocol, TypedDict

if TYPE_CHECKING:
    from deskpod.jobs.forecast import Forecast
    from deskpod.jobs.scheduler import Waiting
    from deskpod.jobs.spec import JobSpec
    from deskpod.jobs.store import JobRecord, Store, User


class DeviceStatus(TypedDict):
    """One device of this box in ``GET /v1/status``, and who holds it."""

    index: int
    kind: str
    job: str | None
    user: str | None
    name: str | None


class PartitionStatus(TypedDict):
    name: str
    nodes: int
    gpus_per_node: int
    default: bool


class BackendStatus(TypedDict):
    """The scheduler jobs are handed to, when it is not this box's."""

    name: str
    slurm_version: NotRequired[str]
    partitions: NotRequired[list[PartitionStatus]]
    members: NotRequired[int]
    """A fleet's: how many member pods it hands jobs to."""
    scratch: NotRequired[str]
    """A cluster's default scratch folder for staged datasets (``slurm.scratch``)."""
    staged: NotRequired[list[str]]
    """The datasets (source paths) staged there already (`deskpod.cluster.staging.StagedSources`)."""


class ExecutorStatus(TypedDict):
    devices: list[DeviceStatus]
    """This box's devices the executor runs jobs on (none where the jobs run elsewhere)."""
    backend: NotRequired[BackendStatus]


class PodSide(Protocol):
    """What an executor is given of the pod: the store it writes every move to, the clock, the job folders."""

    @property
    def store(self) -> Store: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def job_folder(self, job: JobRecord) -> Path:
        """The job's own folder (``<home>/jobs/<id>``): its log, exit codes, run folder."""
        ...

    def wake(self) -> None:
        """Run the executor's next tick now (``woken``), not at the loop's next pass: something it waits for came."""
        ...


class Executor(Protocol):
    name: str
    """Shown in the pod's status: ``local``, ``slurm``."""

    @property
    def device_count(self) -> int | None:
        """What ``devices = "all"`` means for a job spec; None: the executor's nodes decide."""
        ...

    def check(self, spec: JobSpec, user: User) -> int:
        """Refuse a spec this executor can never run (nothing is stored then); else the devices it holds."""
        ...

    def tick(self, pod: PodSide, *, woken: bool) -> None:
        """Start or hand over queued jobs, follow the active ones, carry out stop and requeue requests
        (``woken``: the pod's queue changed since the last tick)."""

    def cancel(self, pod: PodSide, job: JobRecord) -> None:
        """A job was cancelled while still queued in the pod's store: withdraw what the executor holds of it."""

    def forecast(self, pod: PodSide, waiting: Sequence[Waiting], now: float) -> Forecast:
        """Every queued job's position and, where the executor can tell, its estimated start."""
        ...

    def recover(self, pod: PodSide) -> None:
        """Once, before the first tick: take up the jobs a previous daemon left active."""

    def close(self, pod: PodSide, *, stop_jobs: bool) -> None:
        """The pod service stops; with ``stop_jobs`` (``deskpod down --stop-jobs``) its jobs are stopped and
        requeued where the executor owns their processes."""

    def log(self, pod: PodSide, job: JobRecord, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of the job's output from ``offset`` (its folder's log, or another pod's)."""
        ...

    def status(self, pod: PodSide) -> ExecutorStatus:
        """What the executor has (devices and their holders, or nodes and partitions) for ``GET /v1/status``."""
        ...
