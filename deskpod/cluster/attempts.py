"""The attempts of a cluster job, and the retry budget of each cause of a requeue.

Slurm restarts a requeued batch script from the top (``SLURM_RESTART_COUNT`` counts the restarts), so
the script asks here, first thing, whether this attempt may run: ``begin`` records it and answers its
number; ``end`` records how its step ended and decides, by cause:

| the step ended                         | cause       | budget (job spec)           | then                 |
|----------------------------------------|-------------|-----------------------------|----------------------|
| exit 0                                 | —           | —                           | done (COMPLETED)     |
| exit 140 (128 + SIGUSR2: checkpointed  | ``warning`` | ``slurm.max_requeues``      | ``scontrol requeue`` |
| after the time-limit/preemption signal)|             |                             |                      |
| killed by a signal (a node's launcher  | ``node``    | ``slurm.max_node_failures`` | ``scontrol requeue`` |
| or the node itself lost)               |             |                             |                      |
| any other exit code                    | ``failure`` | ``retries``                 | ``scontrol requeue`` |

An attempt that never reached ``end`` (Slurm itself requeued the job: a preemption with
``PreemptMode=REQUEUE``, or a failed batch node) is found by the next ``begin`` and counted as
``interrupted`` against ``slurm.max_requeues``. A budget spent ends the job with the step's exit code
(FAILED in Slurm). Every requeued train job resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from deskpod.cluster import slurm
from deskpod.cluster.batch import REQUEUE_EXIT_CODE, JobFiles, read_attempts, slurm_options
from deskpod.environment.files import write_json
from deskpod.jobs.spec import JobSpec
from deskpod.jobs.states import JobState


def budget(spec: JobSpec, cause: str) -> int:
    s = slurm_options(spec)
    return {
        "warning": int(s.get("max_requeues", 20)),
        "interrupted": int(s.get("max_requeues", 20)),
        "node": int(s.get("max_node_failures", 3)),
        "failure": spec.retries,
    }[cause]


def _write(files: JobFiles, attempts: list[dict[str, Any]]) -> None:
    write_json(files.attempts, attempts, indent=2)


def stopped_by_warning(files: JobFiles, spec: JobSpec, since: float) -> bool:
    """Whether this attempt's training checkpointed and stopped on a signal (its ``summary.json`` says so).

    srun's exit code cannot tell: when the first node's launcher exits with 140 after its checkpoint,
    ``--kill-on-bad-exit`` terminates the others while they finish, and srun reports their 143."""
    if spec.train is None:
        return False
    summary = files.run_dir / spec.name / "summary.json"
    try:
        if summary.stat().st_mtime < since:
            return False
        data = json.loads(summary.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return bool(data.get("state") == "stopped" and data.get("signal") == "SIGUSR2")


def cause_of(code: int, *, checkpointed: bool = False) -> str | None:
    """Why a step that exited with ``code`` should be requeued (None: it succeeded)."""
    if code == 0 and not checkpointed:
        return None
    if code == REQUEUE_EXIT_CODE or checkpointed:
        return "warning"
    if code > 128 or code < 0:
        return "node"
    return "failure"


def spent(attempts: list[dict[str, Any]], cause: str) -> int:
    return sum(1 for a in attempts if a.get("cause") == cause)


def begin(folder: Path, environ: dict[str, str] | None = None) -> int:
    """Record a new attempt; its number (1, 2, ...). Raises `BudgetSpent` when an interrupted attempt
    before it used up the job's requeues."""
    env = dict(os.environ if environ is None else environ)
    files = JobFiles(folder)
    spec = files.read_spec()
    attempts = read_attempts(files)
    if attempts and "ended" not in attempts[-1]:
        attempts[-1].update(ended=time.time(), cause="interrupted", code=None,
                            note="ended without reaching its end: requeued by Slurm (preemption, node failure)")  # fmt: skip
        if spent(attempts, "interrupted") + spent(attempts, "warning") > budget(spec, "interrupted"):
            _write(files, attempts)
            raise BudgetSpent(f"requeued {spent(attempts, 'interrupted')} times by Slurm; slurm.max_requeues is "
                              f"{budget(spec, 'interrupted')}")  # fmt: skip
    number = len(attempts) + 1
    attempts.append({
        "attempt": number,
        "slurm_job_id": env.get("SLURM_JOB_ID"),
        "restart_count": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "nodes": env.get("SLURM_JOB_NODELIST"),
        "batch_host": socket.gethostname(),
        "started": time.time(),
    })  # fmt: skip
    _write(files, attempts)
    files.log(number).parent.mkdir(parents=True, exist_ok=True)
    with open(files.log(number), "a") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"--- deskpod: attempt {number} (Slurm job {env.get('SLURM_JOB_ID')}, restart "
                  f"{env.get('SLURM_RESTART_COUNT', '0')}) on {env.get('SLURM_JOB_NODELIST')} at {stamp} ---\n")  # fmt: skip
    return number


class BudgetSpent(Exception):
    """This attempt may not run: its cause's budget is used up."""


def end(folder: Path, number: int, code: int, environ: dict[str, str] | None = None) -> int:
    """Record how attempt ``number`` ended; requeue the job when its cause's budget allows. The batch
    script's exit code: 0 when requeued or done, the step's code when the job fails for good."""
    env = dict(os.environ if environ is None else environ)
    files = JobFiles(folder)
    spec = files.read_spec()
    attempts = read_attempts(files)
    record = next((a for a in attempts if a.get("attempt") == number), None)
    if record is None:
        record = {"attempt": number}
        attempts.append(record)
    cause = cause_of(code, checkpointed=stopped_by_warning(files, spec, float(record.get("started", 0))))
    record.update(ended=time.time(), code=code, cause=cause)
    if cause is None:
        record["note"] = "completed"
        _write(files, attempts)
        return 0
    left = budget(spec, cause) - spent(attempts, cause) + 1
    if cause == "warning":  # the warning and Slurm's own requeues share slurm.max_requeues
        left -= spent(attempts, "interrupted")
    job_id = env.get("SLURM_JOB_ID")
    if job_id and _cancelled(job_id):  # scancel stops the training with SIGTERM too: never requeue that
        record.update(cause="cancelled", note=f"cancelled (exit code {code})")
        _write(files, attempts)
        return code if 0 < code < 256 else 1
    if left > 0 and job_id:
        record["note"] = f"requeued ({cause}: exit code {code}; {left - 1} more allowed)"
        _write(files, attempts)
        _say(
            files,
            number,
            f"deskpod: step ended with exit code {code} ({cause}); requeueing ({left - 1} more {cause} requeues allowed)",
        )
        # The requeue ends this batch script too (SIGTERM, then SIGKILL after KillWait): finish first.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # Slurm requeues the job once this script has exited, and holds it (Reason=BeginTime) for about two
        # minutes before it may start again, so that its nodes can finish their epilog.
        slurm.requeue(job_id)
        return 0
    record["note"] = f"failed for good ({cause}: exit code {code}; its budget is spent)"
    _write(files, attempts)
    _say(files, number, f"deskpod: step ended with exit code {code} ({cause}); no {cause} requeue left: the job fails")
    return code if 0 < code < 256 else 1


def _cancelled(job_id: str) -> bool:
    try:
        seen = slurm.jobs([job_id])
        return bool(seen) and seen[0].deskpod_state is JobState.CANCELLED
    except slurm.SlurmError:
        return False


def _say(files: JobFiles, number: int, text: str) -> None:
    with open(files.log(number), "a") as f:
        f.write(text + "\n")
