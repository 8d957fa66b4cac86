"""Health checks without servers: a verdict stands while the member's doctor cannot be asked."""

from __future__ import annotations

from deskpod.errors import ServiceError
from deskpod.fleet.health import HealthCheck, HealthChecks

NOW = 1_000_000.0


def test_a_health_verdict_stands_while_the_doctor_cannot_be_asked() -> None:
    answers: list[HealthCheck | Exception] = [
        HealthCheck(state="failed", at=NOW, failing=("all all-reduce: boom",)),
        ServiceError("connection refused"),
    ]

    def ask(name: str, max_age: float) -> HealthCheck:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    checks = HealthChecks(ask, 0.01, workers=1)
    try:
        for _ in range(2):
            checks.start_due(["box"])
            checks._pool.submit(lambda: None).result()  # the one worker ran the check before this
        got = checks.get("box")
        assert got is not None and got.failed and got.failing == ("all all-reduce: boom",)
        assert got.text() == "FAILED: all all-reduce: boom (not answered since: connection refused)"
    finally:
        checks.close()
