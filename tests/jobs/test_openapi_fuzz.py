"""Schemathesis fuzzes the pod service from its own OpenAPI document: no request earns a 5xx.

Generated specs can be valid, so the pod is kept full: a job holding every device at the top
priority, with preemption off, so nothing generated ever runs. ``/v1/shutdown`` is left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.jobs.pods import Pod, Pods, wait_for

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")


@pytest.fixture(scope="module")
def full_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    pods = Pods(tmp_path_factory.mktemp("fuzz"))
    pod = pods("--no-preemption")
    c = pod.client()
    n = len(c.status()["devices"])
    blocker = c.submit({"name": "blocker", "command": ["sleep", "600"], "devices": n, "priority": 1000})
    wait_for(lambda: c.job(blocker["id"])["state"] == "running", 30, "the blocker to run")
    yield pod
    pods.stop_all()


def test_no_request_earns_a_server_error(full_pod: Pod) -> None:
    raw = httpx.get(f"{full_pod.url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(raw).exclude(path="/v1/shutdown")
    headers = {"Authorization": f"Bearer {full_pod.token}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    statuses: list[int] = []

    for op in operations:

        @hypothesis.settings(
            max_examples=12,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(hypothesis.HealthCheck),
            database=None,
        )
        @hypothesis.given(case=op.as_strategy())
        def call(case: Any) -> None:
            response = case.call(base_url=full_pod.url, headers=headers)
            statuses.append(response.status_code)
            assert response.status_code < 500, (case.method, case.formatted_path, response.text)
            if response.status_code >= 400:
                assert "error" in response.json(), response.text

        call()

    assert len(statuses) >= 5 * len(operations)
    assert any(s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses)


def test_nothing_generated_ever_ran(full_pod: Pod) -> None:
    jobs = full_pod.client().jobs(limit=100000)
    ran = [j for j in jobs if j["name"] != "blocker" and j["state"] not in ("queued", "cancelled")]
    assert ran == [], ran[:3]
    assert Path(full_pod.home / "jobs").is_dir()
