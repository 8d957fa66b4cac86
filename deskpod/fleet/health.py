"""Each member's health, as its own doctor says on a schedule: the fleet asks every member's ``GET /v1/doctor``
(`deskpod.jobs.doctor`: ``deskpod doctor`` run on that box) every `HealthChecks.every_s` seconds, all members at
once, and keeps the last answer of each as a `HealthCheck`.

A member whose doctor failed a check is ``failed``: routing sends it no new jobs (`deskpod.fleet.routing`) and the
members view shows the failing check; its next passing check makes it ``passed`` again, and it gets jobs again. A
member whose doctor could not be asked (it does not answer, or runs a deskpod without the endpoint) is ``unknown``:
its reachability is the survey's business, and a box is not taken off for a question it could not be asked. A
verdict stands until the doctor answers again: a failed member that restarts gets no jobs before its first passing
check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from deskpod.errors import DeskpodError

STATES = ("passed", "failed", "unknown")


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthCheck:
    """A member's last health check."""

    state: str
    """``passed``, ``failed`` (a check failed: no new jobs) or ``unknown`` (the doctor could not be asked)."""
    at: float
    """When the fleet got the answer (its clock)."""
    checked_at: float | None = None
    """When the member's doctor ran (the member's clock); its report may be kept a while there."""
    failing: tuple[str, ...] = ()
    """The failed checks, one line each (``all all-reduce: RuntimeError: ...``)."""
    error: str = ""
    """Why the doctor could not be asked (``unknown``); beside an earlier verdict, why it was not renewed."""

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    def text(self) -> str:
        """In words: ``passed``, ``FAILED: all all-reduce: ...``, ``unknown (...)``."""
        if self.state == "unknown":
            return f"unknown ({self.error})"
        said = "FAILED: " + "; ".join(self.failing or ("a check failed",)) if self.state == "failed" else "passed"
        return said + (f" (not answered since: {self.error})" if self.error else "")

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "at": self.at, "checked_at": self.checked_at, "failing": list(self.failing),
                "error": self.error, "text": self.text()}  # fmt: skip


def from_doctor(answer: dict[str, Any], at: float) -> HealthCheck:
    """A health check from a member's ``GET /v1/doctor`` answer."""
    ok = bool(answer.get("ok"))
    return HealthCheck(state="passed" if ok else "failed", at=at, checked_at=answer.get("checked_at"),
                       failing=tuple(str(x) for x in answer.get("failing", [])))  # fmt: skip


Ask = Callable[[str, float], HealthCheck]
"""Ask one member (by name) for its doctor's answer no older than the given seconds."""


class HealthChecks:
    """Every member's last health check, asked every ``every_s`` seconds (0: never) on threads of its own."""

    def __init__(self, ask: Ask, every_s: float, *, workers: int = 32) -> None:
        self.ask, self.every_s = ask, every_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="deskpod-health")
        self._checks: dict[str, HealthCheck] = {}
        self._asking: set[str] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def get(self, name: str) -> HealthCheck | None:
        with self._lock:
            return self._checks.get(name)

    def forget(self, name: str) -> None:
        """A member removed, or added again: its next check is due at once."""
        with self._lock:
            self._checks.pop(name, None)

    def start_due(self, names: Sequence[str], now: float | None = None) -> list[str]:
        """Ask, in the background, each of ``names`` whose last check is older than ``every_s`` (or that has none)
        and is not being asked already; returns those asked."""
        if self.every_s <= 0:
            return []
        now = time.time() if now is None else now
        with self._lock:
            due = [n for n in names if n not in self._asking and
                   (n not in self._checks or now - self._checks[n].at >= self.every_s)]  # fmt: skip
            self._asking.update(due)
        for name in due:
            self._pool.submit(self._check, name)
        return due

    def _check(self, name: str) -> None:
        try:
            # the member may keep a report for half the period: each check sees a run newer than the last check
            got = self.ask(name, self.every_s / 2)
        except DeskpodError as e:
            got = HealthCheck(state="unknown", at=time.time(), error=str(e))
        except Exception as e:  # a bug must not stop the member being asked again next time
            got = HealthCheck(state="unknown", at=time.time(), error=f"{type(e).__name__}: {e}")
        with self._lock:
            self._asking.discard(name)
            last = self._checks.get(name)
            if got.state == "unknown" and last is not None and last.state != "unknown":
                got = replace(last, at=got.at, error=got.error)  # a verdict stands until the doctor answers again
            self._checks[name] = got
