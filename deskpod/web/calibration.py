"""This box's calibration, started from the dashboard: a pod job measures, the daemon keeps the fit.

The New training page predicts a job's time from this box's calibration (`deskpod.plan.local`); a fresh pod
has none, and ``deskpod plan calibrate`` in a terminal was the only way to make one. The page offers it instead,
in the background, the way anything runs on the pod: *Calibrate this box* queues a job
(``deskpod plan calibrate --out local.json`` on every device, so that nothing else runs while it measures and it
waits for running jobs instead of disturbing them), as the user who asked. Its measurements come back through
the job's folder; the daemon fits them to this box's topology itself (`fit_local`: nothing but the measured
figures is taken from the file, which the job's user could have written) and stores the fit in the pod's home,
where every prediction reads it. The pod's home remembers which job it is waiting for (`WAITING_FILE`), so only
that job's file is ever read, once.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from deskpod.environment.files import write_json
from deskpod.envs.userfiles import read_beneath
from deskpod.errors import DeskpodError
from deskpod.jobs.states import JobState
from deskpod.jobs.store import JobRecord
from deskpod.web.app import Web
from deskpod.web.failures import failure
from deskpod.web.session import Viewer

JOB_NAME = "calibrate"
OUTPUT = "local.json"
"""The file the calibration job writes in its folder (its working directory)."""
WAITING_FILE = Path("plan") / "calibrating.json"
"""In the pod's home: ``{"job": id}`` while a calibration job's result is awaited."""
MAX_BYTES = 1 << 20


def job_spec() -> dict[str, Any]:
    """The calibration job: ``deskpod plan calibrate`` on every device of the pod, its result in its own folder."""
    argv = [sys.executable, "-m", "deskpod", "plan", "calibrate", "--out", OUTPUT]
    return {"name": JOB_NAME, "command": argv, "devices": "all"}


def _waiting_path(web: Web) -> Path:
    return Path(web.home) / WAITING_FILE


def waiting_job(web: Web) -> JobRecord | None:
    """The calibration job the pod waits for, if any."""
    try:
        doc = json.loads(_waiting_path(web).read_text())
        job: JobRecord | None = web.store.job(int(doc["job"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return job


def _remember(web: Web, job: JobRecord | None) -> None:
    path = _waiting_path(web)
    if job is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"job": job.id})


def start(web: Web, who: Viewer) -> JobRecord:
    """Queue the calibration job as ``who`` (or return the one already queued or running: one at a time)."""
    current = waiting_job(web)
    if current is not None and (current.state is JobState.QUEUED or current.state.active):
        return current
    job: JobRecord = web.pod.submit(who.user, job_spec())
    _remember(web, job)
    return job


def collect(web: Web) -> dict[str, Any] | None:
    """Where the awaited calibration stands, as the page says it: None when no job is awaited (or its result was
    just stored: the caller then finds the calibration), else ``{"job", "state", "message"}``."""
    from deskpod.plan import local

    job = waiting_job(web)
    if job is None:
        return None
    out = {"job": str(job.id), "state": job.state.value}
    if job.state is JobState.QUEUED or job.state.active:
        where = "waits for the devices to be free" if job.state is JobState.QUEUED else "is measuring this box"
        out["message"] = f"Calibration job {job.id} {where}; the predicted time appears here when it is done."
        return out
    if job.state is not JobState.SUCCEEDED:
        why = failure(web, job) or job.reason or job.state.value
        out["message"] = f"Calibration job {job.id} did not finish ({why}); start it again."
        return out
    try:
        folder = Path(web.pod.job_folder(job))
        text = read_beneath(folder, OUTPUT, owner=os.lstat(folder).st_uid, limit=MAX_BYTES).decode()
        measured = local.Calibration.from_json(text).measurements
        from deskpod.hardware.placement import local_topology

        local.save(local.fit_local(measured, local_topology()), Path(web.home))  # fitted here, from figures only
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, DeskpodError) as e:
        out["state"] = "failed"
        out["message"] = f"Calibration job {job.id} left no calibration the pod can use ({e}); start it again."
        return out
    _remember(web, None)
    return None
