"""Who runs the pod's jobs when it is not this box: the protocol a cluster backend implements.

By default the pod places jobs on this box's devices and runs them under its own supervisor. Given
an `Executor` (``deskpod up --backend slurm`` hands it the Slurm backend of `deskpod.cluster`), the
pod keeps its queue, users, API and dashboard, and the executor's scheduler decides where and when
jobs run: the pod's loop calls `Executor.tick` instead of placing jobs itself, and the executor moves
each job through the same states (queued → starting → running → succeeded/failed/cancelled/lost, and
preempted → queued when its scheduler requeues it), keeping its own id for the job in ``external``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from deskpod.jobs.spec import JobSpec
    from deskpod.jobs.store import JobRecord


class Executor(Protocol):
    name: str
    """Shown in the pod's status: ``slurm``."""

    def check(self, spec: JobSpec) -> None:
        """Refuse (a `deskpod.errors.UsageError`) a spec this executor can never run; nothing is stored then."""

    def tick(self, pod: Any) -> None:
        """Hand queued jobs over, follow the ones handed over, carry out stop and requeue requests."""

    def cancel(self, pod: Any, job: JobRecord) -> None:
        """A job handed over was cancelled while still queued in the pod's store: withdraw it."""

    def status(self) -> dict[str, Any]:
        """What the executor has (nodes, partitions) for ``GET /v1/status``."""
