"""A stack rolled out to real pods (started by root, default sandbox), as the fleet does it: a smoke job per member
that builds the stack's environment there and runs torch in it (import, matmul, a gloo all-reduce over the job's
two CPU slots, through ``torch.distributed.run``); a version whose smoke fails stops the rollout at that member,
and a job running on the old version is untouched.

The stack is ``torch==2.13.0``, installed offline from the box's wheel folder (pip's find-links, as in
tests/jobs/test_isolation.py); the two pods share one environment cache, as two pods on one box may, so the
environment is built once and the second member finds it cached (the content addressing at work)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskpod.environment.network import free_port
from deskpod.fleet.rollout import PodLink, roll_out
from deskpod.fleet.stacks import StackStore, member_spec, stack_definition
from deskpod.jobs.client import PodClient
from deskpod.jobs.spec import parse_spec
from tests.jobs.pods import Pod, Pods, wait_for, wait_state

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="jobs build environments in their sandbox on a pod started by root"),
    pytest.mark.slow,
]

TORCH = "import sys, time, torch; print('TORCH', torch.__version__, flush=True); time.sleep(float(sys.argv[1]))"


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pod, Pod]]:
    root = tmp_path_factory.mktemp("rollout")
    made = Pods(root)
    cache = root / "envs"
    try:
        args = ("--machine", "dgx1-v100", "--env-cache", str(cache))
        yield made(*args, sandbox=True), made(*args, sandbox=True)
    finally:
        made.stop_all()


def publish(store: StackStore, text: str, cache: Path) -> int:
    defn = stack_definition({"requirements": {"file": "requirements.txt", "text": text}}, "3.11")
    return store.publish("pytorch", defn, by="admin", cache_dir=cache)[0].version


def test_a_rollout_smoke_tests_each_member_and_stops_where_a_version_fails(
    pods: tuple[Pod, Pod], tmp_path: Path
) -> None:
    a, b = pods
    store = StackStore(tmp_path / "stacks.db")
    links = [PodLink("box-a", a.client()), PodLink("box-b", b.client())]
    assert publish(store, "torch==2.13.0\n", tmp_path / "uv") == 1

    done = roll_out(store, "pytorch", links, timeout_s=600)
    assert done.state == "passed", done.message + "\n" + "\n".join(r.log_tail for r in done.results)
    first, second = done.results
    assert (first.member, first.outcome, second.member, second.outcome) == ("box-a", "passed", "box-b", "passed")
    assert first.reason.startswith("torch 2.13.0") and "all-reduce over 2 CPU slots (gloo)" in first.reason
    assert first.reason.endswith("environment built") and second.reason.endswith("environment cached")
    rows = {r["member"]: r for r in store.status(["box-a", "box-b"])[0]["members"]}
    assert [(rows[m]["has"], rows[m]["current"]) for m in ("box-a", "box-b")] == [(1, True), (1, True)]

    # A job on v1, pinned by the fleet, runs on box-a through the next rollout.
    pinned = store.resolve(parse_spec({"command": ["python", "-c", TORCH, "20"], "stack": "pytorch"}))
    admin = a.client()
    old = admin.submit(member_spec(pinned))["id"]
    wait_state(admin, old, "running", timeout=120)

    assert publish(store, "six==1.17.0\n", tmp_path / "uv") == 2  # a version without torch
    failed = roll_out(store, "pytorch", links, timeout_s=600)
    assert failed.state == "failed" and [r.member for r in failed.results] == ["box-a"]
    assert (failed.results[0].step, failed.results[0].reason) == (
        "import",
        "ModuleNotFoundError: No module named 'torch'",
    )
    assert failed.message.startswith("rollout of pytorch v2 stopped at box-a: step import failed: ModuleNotFoundError")
    assert "No module named 'torch'" in failed.results[0].log_tail
    assert not [j for j in b.client().jobs() if j["name"] == "smoke-pytorch-v2"]  # box-b was never asked
    assert admin.job(old)["state"] == "running"  # untouched
    ended = wait_state(admin, old, "succeeded", "failed", timeout=120)
    assert ended["state"] == "succeeded" and "TORCH 2.13.0" in admin.log(old)[0].decode()
    rows = {r["member"]: r for r in store.status(["box-a", "box-b"])[0]["members"]}
    assert (rows["box-a"]["has"], rows["box-a"]["current"], rows["box-a"]["failed"]) == (1, False, [2])

    # Rolling back is publishing v1's contents again: every member has it already (it passed those contents).
    assert publish(store, "torch==2.13.0\n", tmp_path / "uv") == 3
    assert all(r["has"] == 3 and r["current"] for r in store.status(["box-a", "box-b"])[0]["members"])
    store.close()


def test_a_plain_pod_refuses_a_spec_naming_a_stack_in_one_line(pods: tuple[Pod, Pod], tmp_path: Path) -> None:
    a, _ = pods
    (tmp_path / "job.toml").write_text(f'command = ["{sys.executable}", "-c", "print(1)"]\nstack = "pytorch"\n')
    before = len(a.client().jobs())
    done = a.cli("submit", str(tmp_path / "job.toml"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "job spec: stack = 'pytorch': stacks are a fleet's: submit to the fleet" in done.stderr
    assert len(a.client().jobs()) == before


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pod, Pod, Pod]]:
    """A fleet (``deskpod fleet up``) and two root members (default sandbox) that trust it, added with the CLI."""
    root = tmp_path_factory.mktemp("fleet")
    made = Pods(root)
    try:
        home = root / "fleet-home"
        home.mkdir()
        hub = Pod(home, free_port(), dict(os.environ, DESKPOD_TOKEN_FILE=str(home / "token")), ())
        made.made.append(hub)
        start_fleet(hub)
        members = []
        for name in ("box-a", "box-b"):
            pem = str(home / "fleet.pub.pem")
            pod = made("--machine", "dgx1-v100", "--env-cache", str(root / "envs"), "--name", name, "--trust-fleet", pem,
                       sandbox=True)  # fmt: skip
            added = hub.cli("fleet", "add", name, pod.url)
            assert added.returncode == 0, added.stderr
            members.append(pod)
        yield hub, members[0], members[1]
    finally:
        made.stop_all()


def start_fleet(hub: Pod) -> None:
    """``deskpod fleet up`` on the hub's home and port, as `Pod.start` starts ``deskpod up``."""
    out = open(hub.home / "daemon.out", "ab")  # noqa: SIM115 - the daemon writes it for its life
    hub.proc = subprocess.Popen([sys.executable, "-m", "deskpod", "fleet", "up", "--port", str(hub.port), "--home",
                                 str(hub.home), "--no-dashboard"], env=hub.env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    out.close()
    probe = PodClient(hub.url, None, timeout=2)
    try:
        wait_for(lambda: _answers(probe), 60, "the fleet to answer /health")
    finally:
        probe.close()
    hub.token = (hub.home / "token").read_text().strip()


def _answers(probe: PodClient) -> bool:
    try:
        probe.health()
        return True
    except Exception:
        return False


def test_the_fleet_publishes_rolls_out_and_pins_jobs_to_a_stack_version(
    fleet: tuple[Pod, Pod, Pod], tmp_path: Path
) -> None:
    hub, _, _ = fleet
    (tmp_path / "requirements.txt").write_text("torch==2.13.0\n")
    (tmp_path / "bad.txt").write_text("nosuchpkg-deskpod==1.0\n")
    published = hub.cli(
        "fleet", "stack", "publish", "pytorch-2.13", str(tmp_path / "requirements.txt"), "--python", "3.11"
    )
    assert published.returncode == 0 and "published pytorch-2.13 v1" in published.stdout, published.stderr
    same = hub.cli("fleet", "stack", "publish", "pytorch-2.13", str(tmp_path / "requirements.txt"), "--python", "3.11")
    assert same.returncode == 0 and same.stdout.startswith("unchanged: pytorch-2.13 v1"), same.stdout
    bad = hub.cli("fleet", "stack", "publish", "pytorch-2.13", str(tmp_path / "bad.txt"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "does not resolve" in bad.stderr
    unknown = hub.cli("fleet", "stack", "rollout", "nope")
    assert unknown.returncode == 2 and "no stack 'nope' at this fleet; its stacks: pytorch-2.13" in unknown.stderr

    rolled = subprocess.run([sys.executable, "-m", "deskpod", "fleet", "stack", "rollout", "pytorch-2.13"],
                            env=dict(hub.env, DESKPOD_URL=hub.url), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "box-a: passed v1" in rolled.stdout and "box-b: passed v1" in rolled.stdout
    assert "rollout of pytorch-2.13 v1 passed on every member (2)" in rolled.stdout
    status = hub.cli("fleet", "stack", "status")
    assert status.returncode == 0 and status.stdout.count("has v1 (current)") == 2, status.stdout
    members = hub.client().request("GET", "/v1/fleet/members").json()["members"]
    assert [m["stacks"] for m in members] == [["pytorch-2.13@v1"]] * 2, members  # the one view says so too

    # A job through the fleet names the stack; it is pinned to v1 and runs in v1's environment on a member.
    admin = hub.client()
    job = admin.submit({"command": ["python", "-c", TORCH, "0"], "stack": "pytorch-2.13"})
    assert job["spec"]["stack"] == "pytorch-2.13@v1" and job["spec"]["environment"]["python"] == "3.11"
    done = wait_state(admin, job["id"], "succeeded", "failed", timeout=300)
    assert done["state"] == "succeeded", admin.log(job["id"])[0]
    assert "TORCH 2.13.0" in admin.log(job["id"])[0].decode()
