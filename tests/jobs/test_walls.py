"""The ways from an ordinary user to root that issue 30 found, replayed against a root pod with its default sandbox.

Each test plays the user (a real Unix account, on the pod's Unix socket) and checks the attack no longer works:
a job's variables never reach anything that runs as root (and the loader's are refused outright); an
environment's build runs the user's build backend as the user, not root; a work directory or a served run is
opened with the user's own rights, so a folder behind a parent the user cannot enter is refused (with the same
answer as a missing one) and swapping it for a link after submission gets nothing; and the admin's own
variables do not reach a user's job.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskpod.envs.accounts import Account
from deskpod.errors import ConfigError, ConflictError
from tests.jobs.pods import Pod, Pods, as_user, on_socket, wait_for, wait_state
from tests.unix_users import make_users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other users only on a pod started by root")

ADMIN_SECRET = "DESKPOD_TEST_ADMINS_OWN_SECRET"
MARK = "DESKPOD_TEST_JOB_MARK"

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


def _probe_sdist(folder: Path) -> None:
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "probe_backend"\nbackend-path = ["."]\n'
        '[project]\nname = "deskpod-probe"\nversion = "1.0"\n',
        "PKG-INFO": "Metadata-Version: 2.1\nName: deskpod-probe\nVersion: 1.0\n",
        "probe_backend.py": BACKEND,
    }
    with tarfile.open(folder / "deskpod_probe-1.0.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"deskpod_probe-1.0/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def box() -> Iterator[Path]:
    """A folder every account can reach (pytest's own is root's alone), outside /tmp (a sandbox has its own): the
    socket, the probe's package, the users' folders."""
    base = Path(tempfile.mkdtemp(prefix="deskpod-walls-", dir="/var/tmp"))
    base.chmod(0o755)
    (base / "wheels").mkdir(mode=0o755)
    _probe_sdist(base / "wheels")
    (base / "wheels" / "deskpod_probe-1.0.tar.gz").chmod(0o644)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[Account, Account]]:
    with make_users("ann", "ben") as (ann, ben):
        yield ann, ben


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, box: Path) -> Iterator[Pod]:
    pods = Pods(tmp_path_factory.mktemp("walls"))
    saved = {k: os.environ.get(k) for k in (ADMIN_SECRET, "PIP_FIND_LINKS")}
    os.environ[ADMIN_SECRET] = "the admin's cloud key"  # in the daemon's environment, as an admin's shell has it
    os.environ["PIP_FIND_LINKS"] = " ".join(p for p in (saved["PIP_FIND_LINKS"], str(box / "wheels")) if p)
    try:
        yield pods("--socket", str(box / "pod.sock"), sandbox=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        pods.stop_all()


def _submit(pod: Pod, who: Account, spec: dict[str, Any]) -> str:
    return str(as_user(who, on_socket(pod, lambda c: c.submit(spec)))["id"])


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(x.split("=", 1) for x in raw.decode(errors="replace").split("\0") if "=" in x)


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_the_loaders_variables_are_refused_and_no_root_process_sees_a_jobs_variables(
    pod: Pod, users: tuple[Account, Account], box: Path
) -> None:
    ann, _ = users
    for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES"):
        with pytest.raises(ConfigError, match=f"{name}.* is not valid; the C library loader's variables"):
            _submit(pod, ann, {"command": ["true"], "env": {name: str(box / "evil.so")}})
    code = f"import os, time; print('MARK', os.environ.get('{MARK}'), flush=True); time.sleep(600)"
    job = _submit(pod, ann, {"command": [sys.executable, "-c", code], "env": {MARK: "ann-only"}})
    admin = pod.client()
    wait_for(lambda: b"MARK ann-only" in admin.log(job)[0], 60, "the job to print its variable")
    folder = pod.home / "jobs" / job
    shim = int((folder / "pid.1").read_text())
    tree = _descendants(shim)
    roots = [p for p in tree if _uid(p) == 0]
    assert roots, "the shim and the sandbox run as root on a root pod"
    for p in tree:  # everything of the job that runs as root starts with a fixed environment
        seen = _environ(p)
        if _uid(p) == 0:
            assert MARK not in seen and "ann-only" not in seen.values(), (p, seen)
    assert any(_environ(p).get(MARK) == "ann-only" and _uid(p) == ann.uid for p in tree)
    assert not any(ADMIN_SECRET in _environ(p) for p in tree)  # nor the admin's own variables
    admin.cancel(job)
    wait_state(admin, job, "cancelled")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


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


@pytest.mark.parametrize("requirement", ["evil @ /home/ann/evil", "evil @ file:///home/ann/evil"])
def test_a_requirement_that_is_a_local_path_is_refused(
    pod: Pod, users: tuple[Account, Account], requirement: str
) -> None:
    ann, _ = users
    with pytest.raises(ConfigError, match="local"):
        _submit(pod, ann, {"command": ["true"], "environment": {"packages": [requirement]}})


def _private(box: Path, owner: Account, name: str) -> Path:
    """``owner``'s home (0700) with a readable folder inside holding a secret: only the home keeps others out."""
    home = box / name
    (home / "shared").mkdir(parents=True, exist_ok=True)
    (home / "shared" / "secret.txt").write_text(f"{owner.name}'s secret")
    for p in (home, home / "shared", home / "shared" / "secret.txt"):
        os.chown(p, owner.uid, owner.gid)
    (home / "shared").chmod(0o755)
    (home / "shared" / "secret.txt").chmod(0o644)
    home.chmod(0o700)
    return home / "shared"


def test_a_work_directory_behind_a_closed_parent_is_refused_like_a_missing_one(
    pod: Pod, users: tuple[Account, Account], box: Path
) -> None:
    ann, ben = users
    bens = _private(box, ben, "ben-home")
    answers = []
    for workdir in (str(bens), str(box / "no-such-folder"), "/root"):
        with pytest.raises(ConflictError) as refused:
            _submit(pod, ann, {"command": ["cat", "secret.txt"], "workdir": workdir})
        answers.append(str(refused.value).replace(workdir, "WORKDIR"))
    assert answers[0] == answers[1] == answers[2], answers  # no answer tells whether the folder is there
    assert "is not a folder you can open on this box" in answers[0]
    ok = _submit(pod, ben, {"command": ["cat", "secret.txt"], "workdir": str(bens)})
    assert f"{ben.name}'s secret" in _finished_log(pod, ok)


def _finished_log(pod: Pod, job: str) -> str:
    admin = pod.client()
    wait_state(admin, job, "succeeded", "failed", "cancelled")
    return admin.log(job)[0].decode()


def test_a_work_directory_swapped_for_a_link_after_submission_gets_nothing(
    pod: Pod, users: tuple[Account, Account], box: Path
) -> None:
    ann, ben = users
    bens = _private(box, ben, "ben-home2")
    work = box / "ann-work"
    work.mkdir()
    os.chown(work, ann.uid, ann.gid)
    admin = pod.client()
    n = len(admin.status()["devices"])
    blocker = admin.submit({"command": ["sleep", "600"], "devices": n, "priority": 1000})
    wait_state(admin, blocker["id"], "running")
    job = _submit(pod, ann, {"command": ["cat", "secret.txt"], "workdir": str(work)})
    work.rmdir()  # while it waits in the queue, its work directory becomes a link to ben's private folder
    work.symlink_to(bens)
    os.lchown(work, ann.uid, ann.gid)
    admin.cancel(blocker["id"])
    done = wait_state(admin, job, "succeeded", "failed")
    assert done["state"] == "failed" and "is not a folder you can open" in done["reason"], done["reason"]
    assert f"{ben.name}'s secret" not in admin.log(job)[0].decode()


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
