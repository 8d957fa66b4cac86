"""The life of a job: its states and every transition between them, written down once.

::

    queued ──> starting ──> running ──> succeeded
      │  ^        │  ^         │ ├────> failed ────┐
      │  │        v  │         │ │                 │
      │  │      building ──────┼─┤ (failed, cancelled, preempted, lost: as from running)
      │  │                     │ ├────> failed ────┤
      │  │        │            │ ├────> cancelled ─┤ requeued by a user (cancelled, failed, lost)
      │  │        │            │ ├────> preempted ─┤ always back to queued (resumes)
      │  │        │            │ └────> lost ──────┤ retries left, or requeued (daemon found its process gone)
      │  └────────┴────────────┴───────────────────┘
      └──> cancelled

- ``queued``: waiting for devices; ``reason`` says why (the placement's why-not, or the job ahead).
- ``starting``: devices chosen, the process is being spawned. A daemon that dies here leaves the job in
  ``starting``; recovery adopts the process if it lives, else sends the job back to ``queued``.
- ``building``: the job's process is building its environment (``[environment]``: an interpreter and
  packages, once per definition; `deskpod.envs`); it moves to ``running`` when the job's own command
  starts. A job whose environment is cached goes from ``starting`` to ``running`` directly.
- ``running``: the process lives (tracked by pid and process start time).
- ``succeeded``: final. ``cancelled``: final unless a user requeues it. ``failed``/``lost``: final once
  the job's retries are used up, unless a user requeues it (with its retries counted afresh).
- ``preempted``: stopped to run again — for a higher-priority job, by ``deskpod down --stop-jobs``, or
  by a user's requeue of a running job; it goes back to ``queued`` at once (without using a retry),
  and a ``train`` job resumes from its checkpoint.
- ``lost``: the daemon restarted and the job's process was gone without leaving an exit code.

`check` is the only gate: the store refuses any transition not listed in `TRANSITIONS`.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    BUILDING = "building"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    LOST = "lost"

    @property
    def active(self) -> bool:
        """Holds (or is about to hold) devices and a process."""
        return self in (JobState.STARTING, JobState.BUILDING, JobState.RUNNING)


S = JobState

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED}),
    S.STARTING: frozenset({S.BUILDING, S.RUNNING, S.FAILED, S.CANCELLED, S.QUEUED, S.LOST}),
    S.BUILDING: frozenset({S.RUNNING, S.FAILED, S.CANCELLED, S.PREEMPTED, S.LOST}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTED, S.LOST}),
    S.PREEMPTED: frozenset({S.QUEUED}),
    S.FAILED: frozenset({S.QUEUED}),
    S.LOST: frozenset({S.QUEUED}),
    S.SUCCEEDED: frozenset(),
    S.CANCELLED: frozenset({S.QUEUED}),
}
"""Every allowed move; a state missing from a set cannot follow the key."""

FINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.LOST})
"""States a job may end in (failed and lost only once no retry is left); all but succeeded may be requeued."""

REQUEUABLE = frozenset({S.CANCELLED, S.FAILED, S.LOST})
"""Ended states a user may send back to the queue (a running job is stopped and requeued instead)."""


class TransitionError(RuntimeError):
    """A transition the table above does not allow: a bug in deskpod, never bad user input."""


def check(old: JobState, new: JobState) -> None:
    """Raise `TransitionError` unless ``old -> new`` is in `TRANSITIONS`."""
    if new not in TRANSITIONS[old]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[old])) or "nothing (final)"
        raise TransitionError(f"job state {old.value} -> {new.value} is not allowed; from {old.value}: {allowed}")
