"""Per-job accounts, environments and walls on a real root pod, with real Unix users and real sandboxes.

The users reach the pod over its Unix socket from processes that really are them (forked by the
test and switched to their uid before they connect): the pod tells them apart by ``SO_PEERCRED``,
with no token. Their jobs run as their uid in bubblewrap sandboxes; the GPUs are stand-in device
nodes (plain files named ``nvidia0``... in ``DESKPOD_DEV_DIR``) on a pod scheduling as a DGX-1.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deskpod.envs.accounts import Account
from deskpod.errors import AccessError, AuthError, ConfigError, ConflictError
from tests.jobs.pods import Pod, Pods, as_user, on_socket, wait_for, wait_state
from tests.unix_users import make_users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other users only on a pod started by root")


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Account, Account]]:
    with make_users("ann", "ben") as (ann, ben):
        yield ann, ben


@pytest.fixture(scope="module")
def dev_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("dev")
    for name in [*(f"nvidia{i}" for i in range(8)), "nvidiactl", "nvidia-uvm"]:
        (d / name).write_text(name)
        (d / name).chmod(0o666)
    return d


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, dev_dir: Path) -> Iterator[Pod]:
    pods = Pods(tmp_path_factory.mktemp("iso"))
    os.environ["DESKPOD_DEV_DIR"] = str(dev_dir)  # the daemon inherits it: GPUs are these stand-ins
    run = Path(tempfile.mkdtemp(prefix="deskpod-run-"))  # where every account can reach the socket, as /run
    run.chmod(0o755)
    try:
        yield pods("--machine", "dgx1-v100", "--priority-limit", "10", "--socket", str(run / "pod.sock"), sandbox=True)
    finally:
        os.environ.pop("DESKPOD_DEV_DIR", None)
        pods.stop_all()
        shutil.rmtree(run, ignore_errors=True)


PROBE = """
import errno, json, os, signal, sys
out = {"uid": os.getuid(), "pid": os.getpid(), "devices": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))}
for key, path in json.loads(sys.argv[1]).items():
    try:
        open(path).read()
        out[key] = "read"
    except OSError as e:
        out[key] = errno.errorcode[e.errno]
try:
    os.kill(int(sys.argv[2]), signal.SIGTERM)
    out["kill"] = "sent"
except OSError as e:
    out["kill"] = errno.errorcode[e.errno]
print("PROBE " + json.dumps(out), flush=True)
"""


def probe_result(pod: Pod, job_id: str) -> dict[str, Any]:
    log = (pod.home / "jobs" / job_id / "output.log").read_text()
    line = next(x for x in log.splitlines() if x.startswith("PROBE "))
    return dict(json.loads(line[len("PROBE ") :]))


def test_local_users_are_told_apart_by_the_kernel_and_their_jobs_walled_off(
    pod: Pod, users: tuple[Account, Account]
) -> None:
    ann, ben = users
    assert as_user(ann, on_socket(pod, lambda c: c.whoami())) == {
        "name": ann.name,
        "admin": False,
        "runs_as": ann.name,
        "fleet": None,
    }
    assert as_user(ben, on_socket(pod, lambda c: c.whoami()))["name"] == ben.name

    secret = "open('secret.txt', 'w').write('ann only'); import time; time.sleep(600)"
    a_id = as_user(ann, on_socket(pod, lambda c: c.submit({"command": [sys.executable, "-c", secret], "devices": 2})))[
        "id"
    ]
    admin = pod.client()
    wait_state(admin, a_id, "running")
    a_folder = pod.home / "jobs" / a_id
    wait_for(lambda: (a_folder / "secret.txt").exists(), 30, "ann's job to write its secret")
    assert (a_folder.stat().st_uid, a_folder.stat().st_mode & 0o777) == (ann.uid, 0o700)
    assert (a_folder / "secret.txt").stat().st_uid == ann.uid  # written by ann's uid, not root's
    a_pid = int(wait_for(lambda: _job_process(a_folder, ann.uid), 30, "ann's job process"))  # type: ignore[arg-type]

    targets = {
        "other_job": str(a_folder / "secret.txt"),
        "db": str(pod.home / "pod.db"),
        "token": str(pod.home / "token"),
    }
    b_spec = {"command": [sys.executable, "-c", PROBE, json.dumps(targets), str(a_pid)], "devices": 1}
    b_id = as_user(ben, on_socket(pod, lambda c: c.submit(b_spec)))["id"]
    done = wait_state(admin, b_id, "succeeded", "failed")
    assert done["state"] == "succeeded", (pod.home / "jobs" / b_id / "output.log").read_text()
    got = probe_result(pod, b_id)
    assert got["uid"] == ben.uid
    assert got["other_job"] in ("ENOENT", "EACCES") and got["db"] in ("ENOENT", "EACCES")
    assert got["token"] in ("ENOENT", "EACCES", "ENXIO")
    assert got["kill"] in ("ESRCH", "EPERM")
    assert os.kill(a_pid, 0) is None  # ann's job is untouched
    start = next(e["note"] for e in done["events"] if e["to"] == "starting")  # "devices 5: ..."
    held = start.split(":")[0].removeprefix("devices ")
    assert got["devices"] == sorted([f"nvidia{held}", "nvidia-uvm", "nvidiactl"]), (start, got)
    assert got["pid"] < 10  # its own PID namespace

    # Outside any sandbox too, the walls are the kernel's: ben's uid cannot read ann's job folder.
    def peek() -> str:
        try:
            return open(a_folder / "secret.txt").read()
        except OSError as e:
            return type(e).__name__

    assert as_user(ben, peek) == "PermissionError"
    events = " | ".join(e["note"] for e in admin.job(b_id)["events"])
    assert "sandboxed (bubblewrap)" in events and f"as {ben.name} (uid {ben.uid})" in events
    admin.cancel(a_id)
    wait_state(admin, a_id, "cancelled")


def _job_process(folder: Path, uid: int) -> int | None:
    """The pid (as the host sees it) of the job's python, a descendant of its shim, running as ``uid``."""
    shim = int((folder / "pid.1").read_text())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if int(fields["Uid"].split()[0]) == uid and b"secret.txt" in cmd and os.getpgid(int(entry)) == shim:
            return int(entry)
    return None


def test_users_may_not_raise_priority_past_the_limit_and_revoked_tokens_stop_working(
    pod: Pod, users: tuple[Account, Account]
) -> None:
    ann, _ = users
    with pytest.raises(AccessError, match=r"priority = 50 is above this pod's limit for users \(10\)"):
        as_user(ann, on_socket(pod, lambda c: c.submit({"command": ["true"], "priority": 50})))
    assert as_user(ann, on_socket(pod, lambda c: c.submit({"command": ["true"], "priority": 10})))["priority"] == 10
    admin = pod.client()
    made = admin.add_user("tokenuser")
    user = pod.client(made["token"])
    assert user.whoami()["name"] == "tokenuser"
    assert admin.revoke("tokenuser") == {"name": "tokenuser", "revoked": 1}
    with pytest.raises(AuthError, match="unknown token"):
        user.whoami()


def test_a_user_without_an_os_account_runs_as_the_unmapped_account_never_root(pod: Pod) -> None:
    admin = pod.client()
    made = admin.add_user("noaccount")
    assert made["runs_as"] == "nobody"
    c = pod.client(made["token"])
    job = c.submit({"command": [sys.executable, "-c", "import os; print('uid', os.getuid())"]})
    wait_state(admin, job["id"], "succeeded")
    assert f"uid {pwd.getpwnam('nobody').pw_uid}" in c.log(job["id"])[0].decode()


def test_bad_environments_are_refused_at_submission(pod: Pod) -> None:
    admin = pod.client()
    with pytest.raises(
        ConflictError, match=r"environment.python '3.99' is not available on this box; available: .*3\.11"
    ):
        admin.submit({"command": ["true"], "environment": {"python": "3.99", "packages": ["tabulate"]}})
    with pytest.raises(ConflictError, match="needs a container runtime"):
        admin.submit({"command": ["true"], "environment": {"image": "docker.io/library/python:3.11"}})
    with pytest.raises(ConfigError, match="environment applies to command, notebook and shell jobs"):
        admin.submit({"train": {"epochs": 1}, "environment": {"packages": ["tabulate"]}})


TAB = "import tabulate, sys, time; print('TAB', tabulate.__version__, flush=True); time.sleep(float(sys.argv[1]))"


def test_conflicting_environments_run_side_by_side_and_a_cached_one_installs_nothing(pod: Pod) -> None:
    admin = pod.client()
    old = {"command": ["python", "-c", TAB, "4"], "environment": {"packages": ["tabulate==0.8.10"]}, "name": "tab-old"}
    new = {"command": ["python", "-c", TAB, "4"], "environment": {"packages": ["tabulate==0.10.0"]}, "name": "tab-new"}
    ids = [admin.submit(old)["id"], admin.submit(new)["id"]]
    jobs = [wait_state(admin, i, "succeeded", "failed", timeout=300) for i in ids]
    logs = [admin.log(i)[0].decode() for i in ids]
    assert [j["state"] for j in jobs] == ["succeeded", "succeeded"], logs
    assert "TAB 0.8.10" in logs[0] and "TAB 0.10.0" in logs[1]
    runs = [_interval(j, "running") for j in jobs]
    assert runs[0][0] < runs[1][1] and runs[1][0] < runs[0][1], runs  # both ran at once
    assert all(any(e["to"] == "building" for e in j["events"]) for j in jobs)
    assert (pod.home / "jobs" / ids[0] / "environment" / "freeze.txt").read_text().count("tabulate==0.8.10") == 1

    again = admin.submit({**old, "command": ["python", "-c", TAB, "0"]})["id"]
    job = wait_state(admin, again, "succeeded", "failed", timeout=120)
    assert job["state"] == "succeeded"
    assert not any(e["to"] == "building" for e in job["events"])  # straight from starting to running
    assert any("cached" in e["note"] for e in job["events"])
    assert not (pod.home / "jobs" / again / "env-build.log").exists()


def test_an_environment_that_cannot_be_built_fails_its_job_with_the_cause_and_the_next_job_runs(pod: Pod) -> None:
    admin = pod.client()
    bad = admin.submit(
        {"command": ["python", "-c", "print(1)"], "environment": {"packages": ["nosuchpkg-deskpod==1.0"]}}
    )
    job = wait_state(admin, bad["id"], "failed", "succeeded", timeout=120)
    assert job["state"] == "failed"
    assert job["reason"].startswith("environment build failed: ") and "nosuchpkg-deskpod" in job["reason"]
    assert "\n" not in job["reason"]
    ok = admin.submit({"command": ["true"]})
    assert wait_state(admin, ok["id"], "succeeded", "failed")["state"] == "succeeded"


def _interval(job: dict[str, Any], state: str) -> tuple[float, float]:
    start = next(e["at"] for e in job["events"] if e["to"] == state)
    end = next(e["at"] for e in job["events"] if e["from"] == state)
    return start, end


def test_a_sandboxed_job_still_gets_sigterm_when_stopped(pod: Pod) -> None:
    admin = pod.client()
    code = textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (print("checkpointed on SIGTERM", flush=True), sys.exit(0)))
        print("up", flush=True)
        time.sleep(600)
    """)
    job = admin.submit({"command": [sys.executable, "-c", code]})
    wait_state(admin, job["id"], "running")
    wait_for(lambda: b"up" in admin.log(job["id"])[0], 30, "the job to start")
    admin.cancel(job["id"])
    wait_state(admin, job["id"], "cancelled")
    assert "checkpointed on SIGTERM" in admin.log(job["id"])[0].decode()  # the sandbox passed SIGTERM on


def test_without_a_sandbox_jobs_still_run_as_their_account(tmp_path: Path, users: tuple[Account, Account]) -> None:
    pods = Pods(tmp_path)
    try:
        pod = pods()  # --no-sandbox: the admin's opt-out; the shim itself switches to the account
        admin = pod.client()
        ann, _ = users
        c = pod.client(admin.add_user("annie", os_user=ann.name)["token"])
        job = c.submit({"command": ["/bin/sh", "-c", "id -u; touch made-here"]})
        done = wait_state(admin, job["id"], "succeeded", "failed")
        assert done["state"] == "succeeded", c.log(job["id"])[0]
        assert str(ann.uid) in c.log(job["id"])[0].decode().split()
        assert (pod.home / "jobs" / job["id"] / "made-here").stat().st_uid == ann.uid
        assert "sandboxed" not in " ".join(e["note"] for e in done["events"])
    finally:
        pods.stop_all()


def test_the_cli_refuses_a_lock_file_that_does_not_parse_in_one_line(pod: Pod, tmp_path: Path) -> None:
    (tmp_path / "uv.lock").write_text("this is [not toml")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\n')
    (tmp_path / "job.toml").write_text('command = ["python", "x.py"]\n[environment]\nlock = "uv.lock"\n')
    before = len(pod.client().jobs())
    done = pod.cli("submit", str(tmp_path / "job.toml"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "environment.lock 'uv.lock' does not parse" in done.stderr
    assert len(pod.client().jobs()) == before  # nothing was queued


def test_a_users_training_runs_in_the_sandbox_on_two_workers(tmp_path: Path, users: tuple[Account, Account]) -> None:
    ann, _ = users
    run_dir = Path(tempfile.mkdtemp(prefix="deskpod-run-"))
    run_dir.chmod(0o755)
    pods = Pods(tmp_path)
    try:
        pod = pods("--socket", str(run_dir / "pod.sock"), sandbox=True)  # this box's own CPU slots, not a DGX-1's
        train = {"model": "mlp", "data": "synthetic:1x16x16", "synthetic_samples": 256, "steps": 4,
                 "global_batch_size": 16, "cpu_workers": 2}  # fmt: skip
        spec = {"train": train, "devices": 2, "name": "sandboxed-run"}
        job = as_user(ann, on_socket(pod, lambda c: c.submit(spec)))
        admin = pod.client()
        done = wait_state(admin, job["id"], "succeeded", "failed", timeout=240)
        assert done["state"] == "succeeded", admin.log(job["id"])[0].decode()[-3000:]
        run = pod.home / "jobs" / job["id"] / "runs" / "sandboxed-run"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 4 and summary["world_size"] == 2, summary
        assert (run / "summary.json").stat().st_uid == ann.uid
    finally:
        pods.stop_all()
        shutil.rmtree(run_dir, ignore_errors=True)


TORCH = "import sys, time, torch; print('TORCH', torch.__version__, flush=True); time.sleep(float(sys.argv[1]))"


@pytest.mark.slow
def test_torch_2_13_in_its_environment_beside_the_pods_torch_2_14(pod: Pod) -> None:
    admin = pod.client()
    old = admin.submit({"command": ["python", "-c", TORCH, "15"], "environment": {"packages": ["torch==2.13.0"]}})
    wait_state(admin, old["id"], "running", timeout=600)  # its environment is built (once) and it runs
    new = admin.submit({"command": [sys.executable, "-c", TORCH, "0"]})
    jobs = [wait_state(admin, j["id"], "succeeded", "failed", timeout=600) for j in (old, new)]
    logs = [admin.log(j["id"])[0].decode() for j in (old, new)]
    assert [j["state"] for j in jobs] == ["succeeded", "succeeded"], logs
    assert "TORCH 2.13.0" in logs[0] and "TORCH 2.14.1" in logs[1], logs
    runs = [_interval(j, "running") for j in jobs]
    assert runs[0][0] < runs[1][1] and runs[1][0] < runs[0][1], runs  # side by side
