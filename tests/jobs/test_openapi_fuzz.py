"""Schemathesis fuzzes the pod service from its own OpenAPI document, with every check and every phase it has,
as the admin and as an ordinary user, on a pod started by root with its default sandbox.

It runs as its command line does (``st run --checks all``): its examples, then the coverage phase (each field
at its boundaries, null, empty, every method a path does not take), then fuzzing, then stateful sequences
along the document's links (a new job to its log, cancel, requeue and extend; a new user to its tokens and revoke).
The checks: no 5xx, every status code, content type, header and body as documented, ``Allow`` on a 405 naming
the path's methods, schema-valid requests accepted (2xx, or a state-dependent 401/403/404/409), schema-invalid
ones refused, a missing or made-up token refused, nothing used after it was deleted. Generated specs can be
valid, so the pod is kept full: a job holding every device at the top priority, with preemption off, so
nothing generated ever runs. ``/v1/shutdown`` is left out.

One part of the document is narrowed for generation: an environment given as a file (requirements, lock,
pyproject) is valid only if the file's *text* is, which no schema can say (the document says so); the fuzzer
generates the environments whose validity the document does state (packages, image). The file names' own
rules are tested in tests/jobs/test_requests.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.jobs.states import JobState
from tests.jobs.pods import Pod, Pods, job_schema, wait_for
from tests.unix_users import make_users

schemathesis = pytest.importorskip("schemathesis")
jsonschema_rs = pytest.importorskip("jsonschema_rs")

EXAMPLES = 15
"""Cases per operation and phase; about 1,000 requests in all for each caller."""
USER = "fuzzer"


@pytest.fixture(scope="module")
def full_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pod, str]]:
    """The pod, full, and the token of an ordinary user whose jobs run as an OS account of their own."""
    pods = Pods(tmp_path_factory.mktemp("fuzz"))
    with make_users("fuzz") as (account,):
        try:
            pod = pods("--no-preemption", sandbox=True)
            c = pod.client()
            n = len(c.status()["devices"])
            blocker = c.submit({"name": "blocker", "command": ["sleep", "600"], "devices": n, "priority": 1000})
            wait_for(lambda: c.job(blocker["id"])["state"] == "running", 60, "the blocker to run")
            token = str(c.add_user(USER, os_user=account.name)["token"])
            yield pod, token
        finally:
            pods.stop_all()


@pytest.fixture(scope="module")
def document(full_pod: tuple[Pod, str]) -> dict[str, Any]:
    raw = httpx.get(f"{full_pod[0].url}/openapi.json", timeout=30).json()
    assert isinstance(raw, dict)
    return raw


def for_generation(document: dict[str, Any]) -> dict[str, Any]:
    """The document with file-valued environments left out of generation (see the module's docstring)."""
    doc = copy.deepcopy(document)
    env = job_schema(doc)["properties"].get("environment")
    if env is not None:
        env["oneOf"] = [k for k in env["oneOf"] if k["required"][0] in ("packages", "image")]
    return doc


def slowest_answer_s(pod: Pod) -> float:
    """The time the pod's slowest operation takes on this box now: ``GET /v1/doctor`` when it must check the box again
    (a benchmark of every device, longer on a busy box). Schemathesis' response-time limit is scaled to it (3 times,
    10 s at the least: its own default), so a busy machine makes the run slower, not red."""
    started = time.monotonic()
    r = httpx.get(f"{pod.url}/v1/doctor", params={"max_age": 0}, headers={"Authorization": f"Bearer {pod.token}"},
                  timeout=600)  # fmt: skip
    assert r.status_code == 200, r.text
    return max(10.0, 3 * (time.monotonic() - started))


def schemathesis_run(pod: Pod, token: str, document: dict[str, Any], folder: Path) -> tuple[dict[str, Any], str]:
    """``st run --checks all`` with every phase against ``pod`` as ``token``'s user: its JSON report and its output."""
    folder.mkdir()
    limit = slowest_answer_s(pod)
    (folder / "openapi.json").write_text(json.dumps(for_generation(document)))
    argv = [sys.executable, "-m", "schemathesis.cli", "run", "openapi.json", "--url", pod.url,
            "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", str(EXAMPLES),
            "--seed", "30", "--workers", "1", "--exclude-path", "/v1/shutdown", "--header",
            f"Authorization: Bearer {token}", "--continue-on-failure", "--generation-database", "none",
            "--request-timeout", str(max(60.0, 2 * limit)), "--max-response-time", f"{limit:.1f}", "--report", "json", "--report-json-path", "report.json", "--no-color"]  # fmt: skip
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=1500)
    output = done.stdout + done.stderr
    report = json.loads((folder / "report.json").read_text())
    assert isinstance(report, dict), output[-4000:]
    return report, output


@pytest.mark.parametrize("caller", ["admin", "user"])
def test_every_check_passes_on_every_operation(
    full_pod: tuple[Pod, str], document: dict[str, Any], caller: str, tmp_path: Path
) -> None:
    pod, user_token = full_pod
    report, output = schemathesis_run(pod, pod.token if caller == "admin" else user_token, document, tmp_path / "st")
    assert report["exit_code"] == 0 and report["failures"] == [] and report["errors"] == [], output[-6000:]
    assert report["complete"] and report["operations"]["tested"] == report["operations"]["selected"] >= 13
    assert {name: p["status"] for name, p in report["phases"].items()} == dict.fromkeys(
        ("examples", "coverage", "fuzzing", "stateful"), "success"
    )
    assert report["test_cases"]["generated"] >= 40 * report["operations"]["tested"]
    submitted = report["valid_rates"]["POST /v1/jobs"]
    assert sum(phase["accepted"] for phase in submitted.values()) > 0  # generated specs reached the queue
    made = report["valid_rates"].get("POST /v1/users", {})
    accepted_users = sum(phase["accepted"] for phase in made.values())
    assert accepted_users > 0 if caller == "admin" else accepted_users == 0  # only an admin adds users


def test_nothing_generated_ever_ran(full_pod: tuple[Pod, str]) -> None:
    jobs = full_pod[0].client().jobs(limit=100000)
    ran = [j for j in jobs if j["name"] != "blocker" and j["state"] not in ("queued", "cancelled")]
    assert ran == [], ran[:3]
    assert {j["user"] for j in jobs} >= {"admin", USER}  # both callers' specs were queued
    assert Path(full_pod[0].home / "jobs").is_dir()


def test_the_document_lists_what_the_fuzzer_found(document: dict[str, Any]) -> None:
    """What schemathesis once found: undocumented 400/404/409, `state` without its enum, `{}` documented valid."""
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
    valid = jsonschema_rs.validator_for(job_schema(document)).is_valid
    assert not valid({}) and not valid({"name": "x"}) and not valid({"command": ["x"], "train": {}})
    assert valid({"command": ["x"]}) and valid({"train": {}}) and valid({"serve": {"run": "/r"}})
    assert set(paths) <= {p for p in paths if p.startswith(("/v1/", "/health", "/metrics"))}  # no dashboard pages
    assert "HTTPBearer" in document["components"]["securitySchemes"]
    env = job_schema(document)["properties"]["environment"]["properties"]
    assert all(env[k]["properties"]["file"]["minLength"] == 1 for k in ("requirements", "lock", "pyproject"))
    follow = paths["/v1/jobs"]["post"]["responses"]["201"]["links"]  # what the stateful phase follows
    assert {link["parameters"]["job_id"] for link in follow.values()} == {"$response.body#/id"} and len(follow) == 5


def test_duplicate_user_is_a_conflict_and_empty_state_is_refused_as_documented(full_pod: tuple[Pod, str]) -> None:
    pod = full_pod[0]
    with httpx.Client(base_url=pod.url, headers={"Authorization": f"Bearer {pod.token}"}, timeout=30) as c:
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
