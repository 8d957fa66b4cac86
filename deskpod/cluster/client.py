"""``deskpod submit|jobs|show|logs|cancel --cluster slurm``: the pod client's answers, from Slurm directly.

From a login node, without a pod service: a job goes to Slurm from a folder under
``DESKPOD_HOME/cluster/`` (`deskpod.cluster.batch`), and ``by-id/<slurm id>`` links to it. The answers
have the pod API's shapes (same keys, same states), so the CLI prints cluster jobs as it prints pod
jobs; the job id is Slurm's. A job the controller has forgotten (``MinJobAge`` after it ended) is
still shown from its folder: its attempts and the last state seen, which is kept in ``final.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from deskpod.cluster import slurm
from deskpod.cluster.batch import JobFiles, read_attempts, submit
from deskpod.environment import Environment
from deskpod.environment.files import write_json
from deskpod.errors import ConfigError, NotFoundError
from deskpod.jobs.joblog import read_log
from deskpod.jobs.spec import parse_spec
from deskpod.jobs.states import FINAL, JobState
from deskpod.jobs.store import job_number

MAX_LOG_CHUNK = 1 << 20


class SlurmClient:
    """The subset of `deskpod.jobs.client.PodClient` the CLI uses, answered by Slurm."""

    def __init__(self, home: Path | None = None) -> None:
        self.root = (home or Environment.read().home) / "cluster"

    def __enter__(self) -> SlurmClient:
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        return None

    def _by_id(self) -> Path:
        return self.root / "by-id"

    def submit(self, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        spec = parse_spec(data)
        done = submit(spec, self.root, dry_run=dry_run)
        if done.job_id is None or done.folder is None:
            return {"id": None, "script": done.script, "spec": spec.to_json()}
        link = self._by_id() / done.job_id
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(done.folder)
        return self.job(done.job_id)

    def folder(self, job_id: str) -> JobFiles:
        if job_number(job_id) is None or not (link := self._by_id() / job_id).exists():  # ASCII digits only
            raise NotFoundError(
                f"no cluster job {job_id!r} submitted from here (deskpod jobs --cluster slurm lists them; "
                f"jobs live in {self.root})"
            )
        return JobFiles(link.resolve())

    def _rows(self, ids: list[str]) -> list[dict[str, Any]]:
        live = {j.job_id: j for j in slurm.jobs(ids)} if ids else {}
        return [self._row(i, live.get(i)) for i in ids]

    def _row(self, job_id: str, seen: slurm.SlurmJob | None) -> dict[str, Any]:
        files = self.folder(job_id)
        spec = files.read_spec()
        final = files.folder / "final.json"
        if seen is None and final.exists():
            snap: dict[str, Any] = json.loads(final.read_text())
        elif seen is None:
            snap = {"state": JobState.LOST.value, "reason": "the Slurm controller no longer knows this job",
                    "exit_code": None, "nodes": "", "restarts": 0, "slurm_state": "UNKNOWN"}  # fmt: skip
        else:
            snap = {"state": seen.deskpod_state.value, "reason": seen.describe(), "exit_code": seen.exit_code,
                    "nodes": seen.nodes, "restarts": seen.restarts, "slurm_state": seen.state}  # fmt: skip
            if seen.deskpod_state in FINAL:
                write_json(final, snap)
        attempts = read_attempts(files)
        return {
            "id": job_id, "user": seen.user if seen else os.environ.get("USER", ""), "name": spec.name,
            "kind": spec.kind, "state": snap["state"], "reason": snap["reason"], "priority": spec.priority,
            "devices": spec.devices, "nodes": spec.nodes, "assigned": [snap["nodes"]] if snap["nodes"] else [],
            "placement": spec.placement, "attempt": len(attempts), "failures": sum(
                1 for a in attempts if a.get("cause") == "failure"), "retries": spec.retries,
            "exit_code": snap["exit_code"], "pid": None, "port": None, "slurm_state": snap["slurm_state"],
            "folder": str(files.folder), "submitted_at": files.spec.stat().st_mtime,
            "started_at": attempts[0].get("started") if attempts else None,
            "finished_at": attempts[-1].get("ended") if attempts and snap["state"] in {s.value for s in FINAL} else None,
            "spec": spec.to_json(),
        }  # fmt: skip

    def jobs(self, *, state: str | None = None, limit: int = 1000, user: str | None = None,
             name: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
        if state is not None and state not in {s.value for s in JobState}:
            raise ConfigError(f"--state {state!r}: valid states are {', '.join(s.value for s in JobState)}")
        by_id = self._by_id()
        ids = (
            sorted((p.name for p in by_id.iterdir() if p.name.isdigit()), key=int, reverse=True)
            if by_id.is_dir()
            else []
        )
        rows = self._rows(ids[: max(limit * 4, limit)])
        rows = [r for r in rows if (state is None or r["state"] == state) and (name is None or name in r["name"])
                and (user is None or r["user"] == user)]  # fmt: skip
        return rows[:limit]

    def job(self, job_id: str) -> dict[str, Any]:
        row = self._rows([job_id])[0]
        events = []
        for a in read_attempts(self.folder(job_id)):
            events.append({"at": a.get("started"), "from": None, "to": f"attempt {a.get('attempt')}",
                           "note": f"on {a.get('nodes')} (Slurm restart {a.get('restart_count')})"})  # fmt: skip
            if "ended" in a:
                events.append({"at": a["ended"], "from": f"attempt {a.get('attempt')}", "to": a.get("cause") or "done",
                               "note": a.get("note", f"exit code {a.get('code')}")})  # fmt: skip
        row["events"] = events
        return row

    def log(self, job_id: str, offset: int = 0) -> tuple[bytes, int, str]:
        files = self.folder(job_id)
        data = read_log(files.folder, offset, MAX_LOG_CHUNK)
        state = self._rows([job_id])[0]["state"] if not data else "running"
        return data, offset + len(data), state

    def cancel(self, job_id: str) -> dict[str, Any]:
        self.folder(job_id)  # only jobs submitted from here
        slurm.cancel(job_id)
        deadline = time.monotonic() + 5
        row = self.job(job_id)
        while row["state"] not in {s.value for s in FINAL} and time.monotonic() < deadline:
            time.sleep(0.2)
            row = self.job(job_id)
        return row
