"""The pod service end to end on one shared daemon: jobs, logs, users, metrics and every bad input."""

from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.errors import AuthError, ConflictError, NotFoundError, UsageError
from deskpod.fleet.keys import FleetKey
from deskpod.jobs.client import PodClient, read_token
from tests.jobs.pods import SLEEPER, Pod, Pods, python_job, wait_for, wait_state


def test_a_job_runs_with_its_devices_port_and_log(shared_pod: Pod, tmp_path: Path) -> None:
    c = shared_pod.client()
    code = "import os; e = os.environ.get; print('slots', e('DESKPOD_CPU_SLOTS'), 'cvd', repr(e('CUDA_VISIBLE_DEVICES')), 'port', e('MASTER_PORT'), 'cwd', os.getcwd())"
    job = c.submit({"name": "env-probe", "command": python_job(code), "workdir": str(tmp_path)})
    assert job["state"] in ("queued", "starting", "running", "succeeded")
    done = wait_state(c, job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded" and done["exit_code"] == 0
    text = c.log(job["id"])[0].decode()
    line = next(x for x in text.splitlines() if x.startswith("slots"))
    _, slots, _, cvd, _, port, _, cwd = line.split()
    assert int(port) > 0 and cwd == str(tmp_path)
    if c.status()["devices"][0]["kind"] == "cpu":
        assert len(slots.split(",")) == 1 and int(slots) >= 0 and cvd == "''"  # CPU slots, and no GPU
    else:
        assert slots == "None" and cvd.strip("'").isdigit()  # one GPU
    steps = [(e["from"], e["to"]) for e in done["events"] if e["from"] != e["to"]]  # transitions, not notes
    assert steps == [(None, "queued"), ("queued", "starting"), ("starting", "running"), ("running", "succeeded")]
    assert done["started_at"] >= done["submitted_at"] and done["finished_at"] >= done["started_at"]


def test_failures_timeouts_retries_and_cancel(shared_pod: Pod) -> None:
    c = shared_pod.client()
    failing = c.submit({"command": python_job("import sys; sys.exit(3)"), "retries": 1})
    slow = c.submit({"command": ["sleep", "30"], "max_runtime": 0.5})
    done = wait_state(c, failing["id"], "failed")
    assert done["exit_code"] == 3 and done["attempt"] == 2 and done["failures"] == 2
    done = wait_state(c, slow["id"], "failed")
    assert "max_runtime" in done["reason"]
    running = c.submit({"command": python_job(SLEEPER)})
    wait_state(c, running["id"], "running")
    wait_for(lambda: b"started" in c.log(running["id"])[0], 20, "the sleeper to start")
    c.cancel(running["id"])
    done = wait_state(c, running["id"], "cancelled")
    assert done["exit_code"] == 143
    assert b"got SIGTERM" in c.log(running["id"])[0]


def test_a_job_that_can_never_fit_is_refused_with_its_reason(shared_pod: Pod) -> None:
    c = shared_pod.client()
    before = len(c.jobs())
    with pytest.raises(UsageError, match="never fit"):
        c.submit({"command": ["true"], "devices": 64})
    with pytest.raises(UsageError, match="nonesuch"):
        c.submit({"command": ["true"], "placement": "partition:nonesuch"})
    with pytest.raises(UsageError, match=r"nodes = 2 needs a cluster: .* deskpod up --backend slurm"):
        c.submit({"command": ["true"], "nodes": 2})
    assert len(c.jobs()) == before
    r = shared_pod.cli("submit", "--devices", "64", "--", "true")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "never fit" in r.stderr
    kind = c.status()["devices"][0]["kind"]
    other = "cpu" if kind == "cuda" else "cuda"
    r = shared_pod.cli("submit", "--device-kind", other, "--", "true")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"device_kind = '{other}': this box's devices are" in r.stderr and f"(device_kind = '{kind}')" in r.stderr
    assert shared_pod.cli("submit", "--device-kind", kind, "--", "true").returncode == 0


def raw(pod: Pod, method: str, path: str, token: str | None = "", **kw: Any) -> httpx.Response:
    headers = dict(kw.pop("headers", {}))
    tok = pod.token if token == "" else token
    if tok is not None:
        headers["Authorization"] = f"Bearer {tok}"
    with httpx.Client(base_url=pod.url, timeout=30, trust_env=False) as h:
        return h.request(method, path, headers=headers, **kw)


BAD_REQUESTS: list[tuple[str, str, dict[str, Any], int, str]] = [
    (
        "POST",
        "/v1/jobs",
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        400,
        "not valid JSON",
    ),
    ("POST", "/v1/jobs", {"json": {"command": ["true"], "gpus": 1}}, 400, "unknown field 'gpus'"),
    ("POST", "/v1/jobs", {"json": {"command": ["true"], "devices": -1}}, 400, "devices"),
    ("POST", "/v1/jobs", {"json": {"command": ["true"], "devices": 10**12}}, 400, "devices"),
    ("POST", "/v1/jobs", {"json": {"command": ["true"], "max_runtime": -5}}, 400, "max_runtime"),
    ("POST", "/v1/jobs", {"json": {"command": ["true"], "name": "x; rm -rf ~"}}, 400, "name"),
    ("POST", "/v1/jobs", {"json": {"command": ["true"], "name": "../../etc/passwd"}}, 400, "name"),
    ("POST", "/v1/jobs", {"json": {"command": ["true"], "workdir": "/no/such/dir"}}, 409, "workdir"),
    ("POST", "/v1/jobs", {"json": {"command": "rm -rf /"}}, 400, "command"),
    ("POST", "/v1/jobs", {"json": [1, 2]}, 400, "expected an object"),
    ("POST", "/v1/jobs", {"content": b"x" * 5_000_000}, 413, "limit"),
    ("GET", "/v1/jobs/999999", {}, 404, "no job"),
    ("GET", "/v1/jobs/abc", {}, 404, "no job"),
    ("GET", "/v1/jobs/99999999999999999999999", {}, 404, "no job"),
    ("POST", "/v1/jobs/999999/cancel", {}, 404, "no job"),
    ("GET", "/v1/jobs/1/log?offset=-1", {}, 422, "offset"),
    ("GET", "/v1/jobs?state=bogus", {}, 400, "not a job state"),
    ("GET", "/v1/nonesuch", {}, 404, "Not Found"),
    ("DELETE", "/v1/jobs", {}, 405, "Method Not Allowed"),
    ("POST", "/v1/users", {"json": {"name": "Bad Name!"}}, 400, "user name"),
    ("POST", "/v1/users", {"json": {"name": "ok", "role": "root"}}, 400, "unknown field"),
]


@pytest.mark.parametrize(("method", "path", "kw", "status", "needle"), BAD_REQUESTS)
def test_bad_requests_answer_4xx_with_an_error(
    shared_pod: Pod, method: str, path: str, kw: dict[str, Any], status: int, needle: str
) -> None:
    r = raw(shared_pod, method, path, **kw)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_tokens_are_required_and_checked(shared_pod: Pod) -> None:
    assert raw(shared_pod, "GET", "/health", token=None).status_code == 200
    for path in ("/v1/jobs", "/v1/status", "/metrics", "/v1/whoami"):
        r = raw(shared_pod, "GET", path, token=None)
        assert r.status_code == 401 and "token" in r.json()["error"]
        r = raw(shared_pod, "GET", path, token="dp_wrong")
        assert r.status_code == 401 and "unknown token" in r.json()["error"]


def test_users_see_and_act_on_their_own_jobs_only(shared_pod: Pod, tmp_path: Path) -> None:
    admin = shared_pod.client()
    alice = shared_pod.client(admin.add_user("alice")["token"])
    bob = shared_pod.client(admin.add_user("bob")["token"])
    with pytest.raises(ConflictError, match="exists already"):
        admin.add_user("alice")
    assert alice.whoami() == {
        "name": "alice",
        "admin": False,
        "runs_as": "nobody",
        "fleet": None,
    }  # no OS account alice here
    job = alice.submit({"command": ["sleep", "30"], "name": "alices"})
    with pytest.raises(NotFoundError):
        bob.job(job["id"])
    with pytest.raises(NotFoundError):
        bob.cancel(job["id"])
    with pytest.raises(NotFoundError):
        bob.log(job["id"])
    assert all(j["user"] == "bob" for j in bob.jobs())
    assert job["id"] in {j["id"] for j in admin.jobs()}
    r = raw(shared_pod, "POST", "/v1/users", token=bob_token(bob), json={"name": "mallory", "admin": True})
    assert r.status_code == 403 and "not an admin" in r.json()["error"]
    r = raw(shared_pod, "POST", "/v1/users/alice/tokens", token=bob_token(bob))
    assert r.status_code == 403
    assert bob.new_token("bob").startswith("dp_")
    assert admin.cancel(job["id"])["id"] == job["id"]  # an admin may act on anyone's job
    wait_state(admin, job["id"], "cancelled")

    # The CLI: a token saved by `user login` is 0600; a token file others can read is refused.
    token_file = tmp_path / "alice.token"
    r = shared_pod.cli("user", "login", token_file=token_file, stdin=bob_token(alice) + "\n")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    r = shared_pod.cli("user", "whoami", token_file=token_file)
    assert r.returncode == 0 and r.stdout.strip() == "alice"
    r = shared_pod.cli("show", job["id"], token_file=token_file)
    assert r.returncode == 0 and "alices" in r.stdout
    os.chmod(token_file, 0o644)
    with pytest.raises(AuthError, match="readable by others"):
        read_token(token_file)
    r = shared_pod.cli("jobs", token_file=token_file)
    assert r.returncode == 2 and "chmod 600" in r.stderr


def bob_token(c: PodClient) -> str:
    return str(c._http.headers["Authorization"]).split()[1]


def test_cli_round_trip_and_logs_follow(shared_pod: Pod, tmp_path: Path) -> None:
    code = "import time\nfor i in range(5):\n    print('line', i, flush=True)\n    time.sleep(0.3)\n"
    script = tmp_path / "count.py"
    script.write_text(code)
    r = shared_pod.cli("submit", "--name", "counter", "--env", "X=1", "--", sys.executable, str(script))
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    r = shared_pod.cli("logs", "-f", job_id)
    assert r.returncode == 0, r.stderr
    assert [x for x in r.stdout.splitlines() if x.startswith("line")] == [f"line {i}" for i in range(5)]
    r = shared_pod.cli("jobs")
    assert r.returncode == 0 and "counter" in r.stdout and "succeeded" in r.stdout
    r = shared_pod.cli("status")
    assert r.returncode == 0 and "free" in r.stdout
    r = shared_pod.cli("show", "nonesuch")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("deskpod: no job")
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"command": ["true"], "bogus": 1}))
    r = shared_pod.cli("submit", str(spec))
    assert r.returncode == 2 and "unknown field 'bogus'" in r.stderr


def test_metrics_and_openapi(shared_pod: Pod) -> None:
    c = shared_pod.client()
    text = c.metrics()
    for family in ("deskpod_queue_length", "deskpod_jobs_running", "deskpod_devices_allocated",
                   'deskpod_jobs{state="succeeded"}', "deskpod_job_duration_seconds_count"):  # fmt: skip
        assert family in text
    schema = raw(shared_pod, "GET", "/openapi.json").json()
    assert "/v1/jobs" in schema["paths"] and "post" in schema["paths"]["/v1/jobs"]


def test_fuzz_every_operation_of_the_openapi_schema_finds_no_5xx(shared_pod: Pod) -> None:
    """Garbage path parameters, query values and bodies for every operation: 4xx with an error, never 5xx.

    A small deterministic fuzzer driven by the service's own OpenAPI document (schemathesis is not
    installed here). It runs as a non-admin user, so it cannot shut the service down.
    """
    admin = shared_pod.client()
    user_token = admin.add_user("fuzzer")["token"]
    schema = raw(shared_pod, "GET", "/openapi.json").json()
    words = ["0", "-1", "x" * 300, "%00", "..%2F..%2Fetc", "1e9", "null", "ü", "18446744073709551616"]
    bodies: list[Any] = [None, 0, -1, "x", [], [None], {}, {"": ""}, {"devices": "x"}, {"command": [1]},
                         {"name": None}, {"stop_jobs": "yes"}, {"train": []}, "\u0000"]  # fmt: skip
    checked = 0
    with httpx.Client(base_url=shared_pod.url, timeout=30, trust_env=False) as h:
        h.headers["Authorization"] = f"Bearer {user_token}"
        for path, ops in schema["paths"].items():
            for method, op in ops.items():
                params = [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]
                for k, word in enumerate(words):
                    url = path
                    for p in op.get("parameters", []):
                        if p["in"] == "path":
                            url = url.replace("{" + p["name"] + "}", word)
                    kw: dict[str, Any] = {"params": {q: word for q in params}}
                    if method == "post":
                        kw["content"] = json.dumps(bodies[k % len(bodies)]).encode()
                        kw["headers"] = {"content-type": "application/json"}
                    r = h.request(method.upper(), url, **kw)
                    checked += 1
                    assert r.status_code < 500, (method, url, kw, r.text)
                    if r.status_code >= 400:
                        assert "error" in r.json(), (method, url, r.text)
            for body in bodies if "post" in ops and "{" not in path else []:
                r = h.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
                checked += 1
                assert r.status_code < 500 and "error" in r.json(), (path, body, r.text)
    assert checked > 80
    assert raw(shared_pod, "GET", "/health", token=None).status_code == 200


def test_submit_train_and_waiting_reasons(shared_pod: Pod, monkeypatch: pytest.MonkeyPatch) -> None:
    """`deskpod train --submit` goes through `submit_train`; a job that cannot start now says why."""
    from deskpod.jobs.client import submit_train

    c = shared_pod.client()
    n = len(c.status()["devices"])
    hog = c.submit({"name": "hog", "command": ["sleep", "60"], "devices": n, "priority": 1000})
    wait_state(c, hog["id"], "running")
    monkeypatch.setenv("DESKPOD_URL", shared_pod.url)
    monkeypatch.setenv("DESKPOD_TOKEN_FILE", str(shared_pod.home / "token"))
    job_id = submit_train({"model": "mlp", "steps": 10}, devices=1, name="via-client")
    job = wait_for(lambda: (j := c.job(job_id))["reason"] and j, 20, "a wait reason")
    assert isinstance(job, dict) and job["kind"] == "train" and job["state"] == "queued"
    assert "free" in job["reason"], job["reason"]  # e.g. "needs 1 CPU slot; only 0 free (none)"
    with pytest.raises(UsageError, match="train"):
        submit_train({"model": None}, devices=1, name=None)  # type: ignore[dict-item]
    assert c.cancel(job_id)["state"] == "cancelled"
    c.cancel(hog["id"])
    wait_state(c, hog["id"], "cancelled")


def test_a_second_daemon_on_the_same_home_is_refused(shared_pod: Pod) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "deskpod", "up", "--port", "0", "--home", str(shared_pod.home)],
        env=shared_pod.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "already runs" in r.stderr
    assert raw(shared_pod, "GET", "/health", token=None).status_code == 200


def test_nothing_of_an_ended_job_outlives_it(shared_pod: Pod) -> None:
    """A background child left behind by a job that exited is killed with the job's process group."""
    from deskpod.processes import start_time

    c = shared_pod.client()
    job = c.submit({"name": "leaver", "command": ["sh", "-c", "sleep 300 & echo bg $!"]})
    assert wait_state(c, job["id"], "succeeded")["exit_code"] == 0
    line = next(x for x in c.log(job["id"])[0].decode().splitlines() if x.startswith("bg "))
    wait_for(lambda: start_time(int(line.split()[1])) is None, 10, "the background child to be gone")


def test_placement_on_a_modelled_dgx1(pod_factory: Pods) -> None:
    """`deskpod up --machine dgx1-v100`: the hardware model's placement chooses and explains."""
    pod = pod_factory("--machine", "dgx1-v100")
    c = pod.client()
    assert len(c.status()["devices"]) == 8
    with pytest.raises(UsageError, match="never fit"):
        c.submit({"command": ["true"], "devices": 9})
    with pytest.raises(UsageError, match="halves"):
        c.submit({"command": ["true"], "devices": 5, "placement": "partition:halves"})
    job = c.submit(
        {
            "name": "quad",
            "command": [sys.executable, "-c", "import os; print(os.environ['DESKPOD_CPU_SLOTS'])"],
            "devices": 4,
        }
    )
    done = wait_state(c, job["id"], "succeeded")
    quad = sorted(int(x) for x in c.log(job["id"])[0].decode().split()[-1].split(","))
    assert quad in ([0, 1, 2, 3], [4, 5, 6, 7])  # a fully NVLink-connected quad of the hybrid cube-mesh
    assert "NVLink" in next(e["note"] for e in done["events"] if e["to"] == "starting")


def up_flags() -> set[str]:
    """Every flag of ``deskpod up --help``."""
    from deskpod.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {o for a in sub.choices["up"]._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def test_detach_starts_the_daemon_with_every_flag_given(tmp_path: Path) -> None:
    """`deskpod up --detach` with every flag runs itself again in the background, with exactly those arguments, and
    each flag's effect shows in `/v1/status` (a new flag once was dropped in detached mode)."""
    home = tmp_path / "home"
    sock, cache = tmp_path / "pod.sock", tmp_path / "envs"
    fleet = FleetKey.in_home(tmp_path / "fleet")
    args = ["up", "--detach", "--host", "127.0.0.2", "--port", "0", "--home", str(home), "--grace", "3",
            "--name", "box-x", "--trust-fleet", str(tmp_path / "fleet" / "fleet.pub.pem"),
            "--no-preemption", "--machine", "dgx1-v100", "--no-dashboard", "--backend", "local", "--socket", str(sock),
            "--priority-limit", "5", "--unmapped-user", "daemon", "--no-sandbox", "--allow-unsandboxed",
            "--env-cache", str(cache), "--env-cache-limit", "5G", "--job-memory", "2G", "--job-tasks", "77",
            "--no-pin-cpus", "--job-disk", "1G", "--session-max-time", "6h", "--session-time", "90m",
            "--idle-timeout", "20m"]  # fmt: skip
    assert up_flags() == {a for a in args if a.startswith("--")}  # a new flag is added here, with its effect below
    env = dict(os.environ, DESKPOD_TOKEN_FILE=str(home / "token"))
    done = subprocess.run(
        [sys.executable, "-m", "deskpod", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    info = json.loads((home / "daemon.json").read_text())
    try:
        argv = Path(f"/proc/{info['pid']}/cmdline").read_bytes().decode().split("\0")
        given = [a for a in args if a != "--detach"]
        assert argv[argv.index("up") : argv.index("up") + len(given)] == given, argv
        assert "--detach" not in argv
        assert (home / "daemon.log").stat().st_mode & 0o777 == 0o600
        assert info["url"].startswith("http://127.0.0.2:") and not info["url"].endswith(":0")
        with PodClient(info["url"], (home / "token").read_text().strip()) as c:
            status = c.status()
            assert httpx.get(info["url"] + "/ui/", timeout=10).status_code == 404  # --no-dashboard
        assert status["preemption"] is False and status["grace_s"] == 3.0 and "backend" not in status
        assert len(status["devices"]) == 8  # --machine dgx1-v100: its eight GPUs (this box has fewer CPU slots)
        assert status["settings"] == {
            "home": str(home.resolve()), "name": "box-x", "host": "127.0.0.2", "port": 0, "preemption": False, "grace_s": 3.0,
            "tick_s": 0.1, "machine": "dgx1-v100", "priority_limit": 5, "socket": str(sock.resolve()),
            "sandbox": False, "allow_unsandboxed": True, "unmapped_user": "daemon", "env_cache": str(cache.resolve()),
            "env_cache_limit": 5 << 30, "limits": {"job_memory": 2 << 30, "job_tasks": 77, "pin_cpus": False},
            "job_disk": 1 << 30, "session_max_time": 6 * 3600.0, "session_time": 90 * 60.0, "idle_timeout": 1200.0,
        }  # fmt: skip
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert status["name"] == "box-x" and (home / "trusted-fleets" / f"{fleet.id}.pem").exists()
    finally:
        os.kill(info["pid"], signal.SIGTERM)
        for _ in range(400):
            if not Path(f"/proc/{info['pid']}").exists():
                break
            time.sleep(0.05)
