"""The pod's doctor: this box's ``deskpod doctor`` (``--cluster`` on a Slurm login node) run when asked, its report
kept a while, for ``GET /v1/doctor`` (an admin's, or a trusted fleet's, which asks each member on a schedule).

The doctor runs as a child process of its own session (``python -m deskpod doctor --json``): its device workers
import torch, which the pod service never does, and a run that hangs is stopped, group and all, at `TIMEOUT_S`. It
runs with the service's own environment, so a setting that breaks the box's jobs breaks its checks too (a
``GLOO_SOCKET_IFNAME`` naming no interface of the box fails the all-reduce). One run at a time: callers who come
while one runs wait for it and share its report.

The checks measure every device, held by a job or not: a busy device measures lower, which the doctor's thresholds
(fail below a quarter of the spec, or a CPU slot only warns against the median) mostly absorb; a wrong result fails
whatever the load.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from deskpod.errors import ConfigError

TIMEOUT_S = 180.0
"""A doctor run that has not ended by then is stopped and reported as a failed check."""
MAX_AGE_S = 60.0
"""How old a kept report may be when the caller does not say (``max_age``)."""
MIN_AGE_S = 10.0
"""A report younger than this is kept whatever the caller says: a run loads every device of the box for seconds,
and no caller may keep them busy with runs back to back."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DoctorAnswer:
    """One doctor run, as ``GET /v1/doctor`` answers it."""

    ok: bool
    """No check failed (warnings and skips pass)."""
    checked_at: float
    """When the run ended (this box's clock)."""
    elapsed_s: float
    failing: tuple[str, ...] = ()
    """Each failed check in one line: ``all all-reduce: RuntimeError ...`` (the run's own failure, when it did not
    report: ``doctor: ...``)."""
    report: dict[str, Any] = field(default_factory=dict)
    """The doctor's JSON report (``deskpod.doctor/1``, or ``deskpod.doctor.cluster/1`` on a cluster)."""

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checked_at": self.checked_at, "elapsed_s": round(self.elapsed_s, 3),
                "failing": list(self.failing), "report": self.report}  # fmt: skip


def failing_lines(report: dict[str, Any]) -> tuple[str, ...]:
    """The failed checks of a doctor report, one line each (device and check, then its note or detail)."""
    out = []
    for c in report.get("checks", []):
        if c.get("status") == "fail":
            where = " ".join(str(c[k]) for k in ("device", "name") if c.get(k))
            why = str(c.get("note") or c.get("detail") or "failed")
            out.append(f"{where}: {why}")
    return tuple(out)


class Doctor:
    """This box's doctor, run on request and kept (see the module docstring)."""

    def __init__(self, *, cluster: bool = False, seconds: float = 0.2, timeout_s: float = TIMEOUT_S) -> None:
        self.argv = [sys.executable, "-m", "deskpod", "doctor", "--json",
                     *(["--cluster"] if cluster else ["--seconds", str(seconds)])]  # fmt: skip
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._last: DoctorAnswer | None = None

    def latest(self, max_age: float = MAX_AGE_S) -> DoctorAnswer:
        """The kept report if it is younger than ``max_age`` seconds (or `MIN_AGE_S`), else a new run's (waiting for
        one under way)."""
        if not 0 <= max_age <= 86400:
            raise ConfigError(f"max_age = {max_age!r}: expected seconds from 0 to 86400")
        asked = time.time()
        with self._lock:
            last = self._last
            # a run that ended after this call came is as new as one started for it
            young = max(max_age, MIN_AGE_S)
            if last is not None and (last.checked_at >= asked or time.time() - last.checked_at <= young):
                return last
            self._last = self._run()
            return self._last

    def _run(self) -> DoctorAnswer:
        start = time.monotonic()
        proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, text=True)  # fmt: skip
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return self._failed(start, f"doctor: did not finish in {self.timeout_s:.0f} s (stopped)")
        finally:
            _kill_group(proc)  # its device workers, should any outlive it
        try:
            report = json.loads(out)
            ok = bool(report["ok"])
        except (ValueError, KeyError, TypeError):
            said = (err.strip().splitlines() or ["no output"])[-1]
            return self._failed(start, f"doctor: exited with code {proc.returncode} without a report ({said[:300]})")
        return DoctorAnswer(ok=ok, checked_at=time.time(), elapsed_s=time.monotonic() - start,
                            failing=failing_lines(report), report=report)  # fmt: skip

    @staticmethod
    def _failed(start: float, why: str) -> DoctorAnswer:
        return DoctorAnswer(ok=False, checked_at=time.time(), elapsed_s=time.monotonic() - start, failing=(why,))


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL what is left of the doctor's session (its leader's pid is the group's id), then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
