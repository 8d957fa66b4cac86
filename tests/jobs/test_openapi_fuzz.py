"""Schemathesis fuzzes the pod service from its own OpenAPI document, with every check it has.

``case.call_and_validate`` runs all of schemathesis' checks: no 5xx, every status code and content type
documented, bodies and headers as documented, schema-valid requests accepted (2xx, or a state-dependent
401/403/404/409), schema-invalid ones refused (negative cases, fewer), and the auth the document declares
enforced. Generated specs can be valid, so the pod is
kept full: a job holding every device at the top priority, with preemption off, so nothing generated ever
runs. ``/v1/shutdown`` is left out.

One part of the document is narrowed for generation: an environment given as a file (requirements, lock,
pyproject) is valid only if the file's *text* is, which no schema can say (the document says so); the fuzzer
generates the environments whose validity the document does state (packages, image).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.jobs.states import JobState
from tests.jobs.pods import Pod, Pods, wait_for

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")
jsonschema_rs = pytest.importorskip("jsonschema_rs")


@pytest.fixture(scope="module")
def full_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    pods = Pods(tmp_path_factory.mktemp("fuzz"))
    pod = pods("--no-preemption", sandbox=True)  # as the box's users meet it: a root pod with its sandbox
    c = pod.client()
    n = len(c.status()["devices"])
    blocker = c.submit({"name": "blocker", "command": ["sleep", "600"], "devices": n, "priority": 1000})
    wait_for(lambda: c.job(blocker["id"])["state"] == "running", 30, "the blocker to run")
    yield pod
    pods.stop_all()


@pytest.fixture(scope="module")
def document(full_pod: Pod) -> dict[str, Any]:
    raw = httpx.get(f"{full_pod.url}/openapi.json", timeout=30).json()
    assert isinstance(raw, dict)
    return raw


def spec_schema(document: dict[str, Any]) -> dict[str, Any]:
    body = document["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert isinstance(body, dict)
    return body


def for_generation(document: dict[str, Any]) -> dict[str, Any]:
    """The document with file-valued environments left out of generation (see the module's docstring)."""
    doc = copy.deepcopy(document)
    env = spec_schema(doc)["properties"].get("environment")
    if env is not None:
        env["oneOf"] = [k for k in env["oneOf"] if k["required"][0] in ("packages", "image")]
    return doc


def fuzz(op: Any, mode: Any, examples: int, pod: Pod, statuses: list[int], token: str) -> None:
    """Run ``examples`` cases of ``op`` in generation ``mode`` with every check, as ``token``'s user; each status
    goes to ``statuses``."""
    headers = {"Authorization": f"Bearer {token}"}

    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
        database=None,
    )
    @hypothesis.given(case=op.as_strategy(generation_mode=mode))
    def call(case: Any) -> None:
        response = case.call_and_validate(base_url=pod.url, headers=headers)
        statuses.append(response.status_code)
        if response.status_code >= 400:
            assert isinstance(response.json().get("error"), str), response.text

    call()


@pytest.mark.parametrize("who", ["admin", "user"])
def test_every_check_passes_on_every_operation(full_pod: Pod, document: dict[str, Any], who: str) -> None:
    """With the admin's token, and with an ordinary user's (whose admin-only calls must be refused as documented)."""
    token = full_pod.token if who == "admin" else str(full_pod.client().add_user(f"fuzzer-{os.getpid()}")["token"])
    schema = schemathesis.openapi.from_dict(for_generation(document)).exclude(path="/v1/shutdown")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    positive: list[int] = []
    negative: list[int] = []
    for op in operations:
        fuzz(op, schemathesis.GenerationMode.POSITIVE, 15, full_pod, positive, token)
        if op.path != "/health":  # no parameter, body or token to make invalid: Hypothesis finds no negative case
            fuzz(op, schemathesis.GenerationMode.NEGATIVE, 6, full_pod, negative, token)

    assert len(positive) >= 5 * len(operations)
    assert any(s < 300 for s in positive) and any(400 <= s < 500 for s in positive)
    assert sum(400 <= s < 500 for s in negative) >= 2 * len(operations)  # invalid requests were refused


def test_nothing_generated_ever_ran(full_pod: Pod) -> None:
    jobs = full_pod.client().jobs(limit=100000)
    ran = [j for j in jobs if j["name"] != "blocker" and j["state"] not in ("queued", "cancelled")]
    assert ran == [], ran[:3]
    assert Path(full_pod.home / "jobs").is_dir()


def test_the_document_lists_what_the_fuzzer_found(document: dict[str, Any]) -> None:
    """The findings of issue 14: undocumented 400/404/409, `state` without its enum, `{}` documented valid."""
    paths = document["paths"]
    assert {"400", "401", "403", "409", "413"} <= set(paths["/v1/users"]["post"]["responses"])
    assert {"401", "403", "404"} <= set(paths["/v1/jobs/{job_id}"]["get"]["responses"])
    assert {"404", "409"} <= set(paths["/v1/jobs/{job_id}/requeue"]["post"]["responses"])
    assert {"400", "409", "413"} <= set(paths["/v1/jobs"]["post"]["responses"])
    for path, ops in paths.items():
        for method, op in ops.items():
            for code, answer in op["responses"].items():
                if code.startswith(("4", "5")):
                    body = answer["content"]["application/json"]["schema"]
                    assert body.get("required") == ["error"], (method, path, code, body)
    (state,) = [p for p in paths["/v1/jobs"]["get"]["parameters"] if p["name"] == "state"]
    assert set(state["schema"]["enum"]) == {s.value for s in JobState}  # so `state=` is documented as invalid
    valid = jsonschema_rs.validator_for(spec_schema(document)).is_valid
    assert not valid({}) and not valid({"name": "x"}) and not valid({"command": ["x"], "train": {}})
    assert valid({"command": ["x"]}) and valid({"train": {}}) and valid({"serve": {"run": "/r"}})
    assert set(paths) <= {p for p in paths if p.startswith(("/v1/", "/health", "/metrics"))}  # no dashboard pages
    assert "HTTPBearer" in document["components"]["securitySchemes"]


def test_duplicate_user_is_a_conflict_and_empty_state_is_refused_as_documented(full_pod: Pod) -> None:
    headers = {"Authorization": f"Bearer {full_pod.token}"}
    with httpx.Client(base_url=full_pod.url, headers=headers, timeout=30) as c:
        assert c.post("/v1/users", json={"name": "dup"}).status_code == 201
        again = c.post("/v1/users", json={"name": "dup"})
        assert again.status_code == 409 and "exists already" in again.json()["error"]
        empty = c.get("/v1/jobs", params={"state": ""})
        assert empty.status_code == 400 and "not a job state" in empty.json()["error"]
        nothing = c.post("/v1/jobs", json={})
        assert nothing.status_code == 400 and "exactly one of" in nothing.json()["error"]
        never_fits = c.post("/v1/jobs", json={"command": ["true"], "devices": 1024})
        assert never_fits.status_code == 409 and "never fit" in never_fits.json()["error"]
        whole = c.post("/v1/jobs", json={"command": ["true"], "retries": 2.0, "name": "whole-float"})
        assert whole.status_code == 201 and whole.json()["retries"] == 2


def test_bad_bodies_and_ids_are_refused_not_failed(full_pod: Pod) -> None:
    """What schemathesis and the outside checks found answering 500 or against the document."""
    headers = {"Authorization": f"Bearer {full_pod.token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=full_pod.url, headers=headers, timeout=30) as c:
        deep = c.post("/v1/jobs", content=b"[" * 1000 + b"]" * 1000)
        assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]
        huge = c.post("/v1/jobs", content=b'{"command": ["x"], "priority": ' + b"9" * 5000 + b"}")
        assert huge.status_code == 400 and "not valid JSON" in huge.json()["error"]
        for path in ("/v1/jobs/\u00b9", "/v1/jobs/\u0661\u0662", "/v1/jobs/\u00b9/log", "/ui/jobs/\u00b9"):
            got = c.get(path)
            assert got.status_code == 404, (path, got.status_code, got.text[:200])
        wrong = c.delete("/v1/jobs")
        assert wrong.status_code == 405 and set(wrong.headers["allow"].split(", ")) >= {"GET", "POST"}
        null = c.post("/v1/users", json={"name": "nulluser", "os_user": None})
        assert null.status_code == 400 and "os_user = null" in null.json()["error"]
        cache = c.post("/v1/jobs", json={"command": ["true"], "slurm": {"env_cache": None}})
        assert cache.status_code == 400 and "slurm.env_cache = null" in cache.json()["error"]
        empty = c.post("/v1/jobs", json={"command": ["true"], "environment": {
            "requirements": {"file": "", "text": "six\n"}}})  # fmt: skip
        assert empty.status_code == 400 and "requirements.file" in empty.json()["error"]
