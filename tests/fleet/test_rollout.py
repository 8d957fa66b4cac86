"""A stack rolled out to real pods (started by root, default sandbox), as the fleet does it: a smoke job per member
that builds the stack's environment there and runs torch in it (import, matmul, a gloo all-reduce over the job's
two CPU slots, through ``torch.distributed.run``); a version whose smoke fails stops the rollout at that member,
and a job running on the old version is untouched.

The stack is ``torch==2.13.0``, installed offline from the box's wheel folder (pip's find-links, as in
tests/jobs/test_isolation.py); the two pods share one environment cache, as two pods on one box may, so the
environment is built once and the second member finds it cached (the content addressing at work)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskpod.fleet.rollout import PodLink, roll_out
from deskpod.fleet.stacks import StackStore, member_spec, stack_definition
from deskpod.jobs.spec import parse_spec
from tests.jobs.pods import Pod, Pods, wait_state

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
