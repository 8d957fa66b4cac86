"""What a job is given on a root pod with its default sandbox, beside the red team's replays (`tests.redteam`):
an environment's build runs the user's build backend as the user and is the user's alone, a work directory of
the user's own is entered as the user, and a user serves their own training run from the sandbox.

Each test plays the user (a real Unix account, on the pod's Unix socket).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.envs.accounts import Account
from deskpod.errors import ConflictError
from tests.jobs.pods import Pod, Pods, as_user, on_socket, wait_state
from tests.redteam import probe_sdist
from tests.unix_users import make_users, shared_folder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other users only on a pod started by root")

BACKEND = """
import base64, hashlib, io, os, sys, zipfile

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    try:
        open("/etc/deskpod-probe-owned", "w").write("root was here")
        wrote = "WROTE /etc"
    except OSError as e:
        wrote = f"could not write /etc ({e.strerror})"
    print(f"PROBE-BUILD uid={os.getuid()} {wrote}", file=sys.stderr, flush=True)
    name = "deskpod_probe-1.0-py3-none-any.whl"
    files = {"deskpod_probe/__init__.py": b"BUILT_AS = %d\\n" % os.getuid(),
             "deskpod_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: deskpod-probe\\nVersion: 1.0\\n",
             "deskpod_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: probe\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append("deskpod_probe-1.0.dist-info/RECORD,,")
        z.writestr("deskpod_probe-1.0.dist-info/RECORD", "\\n".join(record) + "\\n")
    return name
"""
"""The build backend of an sdist that records who built it and tries to write where only root may."""


@pytest.fixture(scope="module")
def box() -> Iterator[Path]:
    """A folder every account can reach: the socket, the probe's package, the users' folders."""
    with shared_folder("deskpod-walls-") as base:
        (base / "wheels").mkdir(mode=0o755)
        probe_sdist(base / "wheels", "deskpod-probe", BACKEND)
        yield base


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Account, Account]]:
    with make_users("ann", "ben") as (ann, ben):
        yield ann, ben


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, box: Path) -> Iterator[Pod]:
    pods = Pods(tmp_path_factory.mktemp("walls"))
    saved = os.environ.get("PIP_FIND_LINKS")
    os.environ["PIP_FIND_LINKS"] = " ".join(p for p in (saved, str(box / "wheels")) if p)  # the probe's package
    try:
        yield pods("--socket", str(box / "pod.sock"), sandbox=True)
    finally:
        if saved is None:
            os.environ.pop("PIP_FIND_LINKS", None)
        else:
            os.environ["PIP_FIND_LINKS"] = saved
        pods.stop_all()


def _submit(pod: Pod, who: Account, spec: dict[str, Any]) -> str:
    return str(as_user(who, on_socket(pod, lambda c: c.submit(spec)))["id"])


def test_a_build_backend_runs_as_the_user_not_root(pod: Pod, users: tuple[Account, Account]) -> None:
    ann, ben = users
    probe = "import deskpod_probe, os; print('IMPORTED', deskpod_probe.BUILT_AS, os.getuid(), flush=True)"
    spec = {"command": ["python", "-c", probe], "environment": {"packages": ["deskpod-probe==1.0"]}}
    job = _submit(pod, ann, spec)
    admin = pod.client()
    done = wait_state(admin, job, "succeeded", "failed", timeout=300)
    log = admin.log(job)[0].decode()
    assert done["state"] == "succeeded", log[-3000:]
    assert f"IMPORTED {ann.uid} {ann.uid}" in log  # the backend that built it ran as ann (uv hides its output)
    assert not Path("/etc/deskpod-probe-owned").exists()
    notes = " | ".join(e["note"] for e in done["events"])
    assert f"as {ann.name}; log: env-build.log" in notes
    assert (pod.home / "jobs" / job / "environment" / "freeze.txt").read_text().startswith("deskpod-probe==1.0")
    envs = pod.home / "envs" / "users"
    assert (envs / ann.name).stat().st_uid == ann.uid and (envs / ann.name).stat().st_mode & 0o777 == 0o700
    # ben's job with the same definition builds his own: nothing ann's build made is ever his
    again = _submit(pod, ben, spec)
    done = wait_state(admin, again, "succeeded", "failed", timeout=300)
    assert done["state"] == "succeeded" and any(e["to"] == "building" for e in done["events"])
    assert f"IMPORTED {ben.uid} {ben.uid}" in admin.log(again)[0].decode()


def _finished_log(pod: Pod, job: str) -> str:
    admin = pod.client()
    wait_state(admin, job, "succeeded", "failed", "cancelled")
    return admin.log(job)[0].decode()


def test_a_work_directory_of_the_users_own_is_entered_as_the_user(
    pod: Pod, users: tuple[Account, Account], box: Path
) -> None:
    """The job step enters its work directory as the user: a job of ann's in her own folder runs and writes there."""
    ann, _ = users
    mine = box / "ann-own"
    mine.mkdir()
    os.chown(mine, ann.uid, ann.gid)
    job = _submit(pod, ann, {"command": ["/bin/sh", "-c", "pwd; id -u; touch made-here"], "workdir": str(mine)})
    log = _finished_log(pod, job)
    assert f"{mine}\n{ann.uid}\n" in log, log
    assert (mine / "made-here").stat().st_uid == ann.uid


SERVE_WAIT_S = 240


def test_a_user_serves_their_own_training_run_from_the_sandbox(pod: Pod, users: tuple[Account, Account]) -> None:
    """Deploy, as the dashboard does it: a serve job of the user's own run. The sandbox hides the pod's home, so
    the run is shown to the serve job, read-only, after it was opened with the user's rights."""
    ann, ben = users
    train = {"model": "mlp", "data": "synthetic:1x8x8", "synthetic_samples": 64, "steps": 2,
             "global_batch_size": 16, "cpu_workers": 1}  # fmt: skip
    job = _submit(pod, ann, {"train": train, "devices": 1, "name": "tiny"})
    admin = pod.client()
    done = wait_state(admin, job, "succeeded", "failed", timeout=SERVE_WAIT_S)
    assert done["state"] == "succeeded", admin.log(job)[0].decode()[-2000:]
    run = pod.home / "jobs" / job / "runs" / "tiny"
    with pytest.raises(ConflictError, match="is not a run folder you can open"):  # ann's run is closed to ben
        _submit(pod, ben, {"serve": {"run": str(run)}})
    served = _submit(pod, ann, {"serve": {"run": str(run)}})
    port_file = pod.home / "jobs" / served / "serve.json"
    deadline = time.monotonic() + SERVE_WAIT_S
    while time.monotonic() < deadline and not (port_file.exists() and json.loads(port_file.read_text())["ready"]):
        state = admin.job(served)["state"]
        assert state in ("queued", "starting", "running"), admin.log(served)[0].decode()[-2000:]
        time.sleep(0.2)
    url = json.loads(port_file.read_text())["url"]
    assert httpx.get(f"{url}/v2/models/tiny/ready", timeout=30).status_code == 200
    admin.cancel(served)
    wait_state(admin, served, "cancelled")
